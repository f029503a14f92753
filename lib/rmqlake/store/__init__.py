"""A broker's store directory from the lake's tables and back: what one Spark task does to one broker file.

``export`` writes commitlog segments, CQ files, index files and compacted
queues from the tables' Parquet files; ``imports`` reads commitlog files
back into rows; ``rows`` says how a commitlog row and a record correspond.
The driver side (planning the tasks, committing the tables) is
``rmqlake.steps.store``.
"""

from rmqlake.store.export import write_compaction_queue, write_cq_file, write_index_file, write_segment
from rmqlake.store.imports import IMPORTED, IMPORTED_SCHEMA, read_segment_file
from rmqlake.store.rows import record_from_row

__all__ = [
    "IMPORTED",
    "IMPORTED_SCHEMA",
    "read_segment_file",
    "record_from_row",
    "write_compaction_queue",
    "write_cq_file",
    "write_index_file",
    "write_segment",
]
