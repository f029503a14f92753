"""What a key lookup decodes from a record's fields, against the columns every writer stores."""

from __future__ import annotations

from rmqlake import query as Q
from rmqlake.lake import Lake


def assert_records_decode_to_their_stored_columns(lake: Lake) -> int:
    """Each commitlog row's ``properties``, ``keys``, ``tags``, ``uniq_key`` and ``msg_id`` are what a lookup
    decodes from the row's record fields (``query.view_from_record``); returns the rows checked."""
    table = lake.read_arrow("commitlog", columns=[*Q.MESSAGE_VIEW_COLUMNS, "properties_bytes"])
    checked = 0
    for batch in table.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            stored = {name: row[name] for name in Q.MESSAGE_VIEW_COLUMNS}
            decoded = Q.view_from_record({name: row[name] for name in Q.RECORD_VIEW_COLUMNS})
            assert decoded == stored, (row["physical_offset"], row["topic"])
            checked += 1
    return checked
