"""``rmqlake generate``'s transactional sends: half messages and their end lines, and what the manifest counts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rmqlake import cli
from rmqlake.consumer_offsets import parse_snapshot
from rmqlake.formats.javahash import select_queue_by_hash
from rmqlake.formats.properties import KEY_SEPARATOR
from rmqlake.formats.transaction import HALF_TOPIC, OP_TOPIC, PGROUP, TRAN_MSG
from rmqlake.generate import BAD_END_KINDS, TRANSACTION_TIMEOUT_MS, TopicPlan, generate
from tests.conftest import CONF
from tests.unit.test_generate import lines

TOPICS = [TopicPlan("OrderEvents", 4, False), TopicPlan("Clickstream", 3, False), TopicPlan("UserProfile", 2, True)]
HALF_FIELDS = ("transaction", "uniqKey")
END_FIELDS = {"endTransaction", "uniqKey", "topic", "producerGroup", "storeTimestamp"}


def is_half(line) -> bool:
    return isinstance(line, dict) and line.get("transaction") == "PREPARED" and TRAN_MSG in line.get("properties", {})


def is_end(line) -> bool:
    return isinstance(line, dict) and "endTransaction" in line


def as_plain(line):
    """A half send as the message it was made from."""
    if not is_half(line):
        return line
    line = {k: v for k, v in line.items() if k not in HALF_FIELDS}
    properties = {k: v for k, v in line.pop("properties").items() if k not in (TRAN_MSG, PGROUP)}
    return line | ({"properties": properties} if properties else {})


def test_a_share_of_zero_writes_the_files_of_before(tmp_path):
    default = generate(tmp_path / "a", messages=600, topics=TOPICS, hours=2, bad_rate=0.02, seed=4, schedule_share=0.1)
    zero = generate(tmp_path / "b", messages=600, topics=TOPICS, hours=2, bad_rate=0.02, seed=4, schedule_share=0.1,
                    transaction_share=0)  # fmt: skip
    assert default["transactions"] == zero["transactions"] == dict.fromkeys(zero["transactions"], 0)
    assert zero["records"] == zero["messages"] and zero["lines"] == zero["messages"] + zero["bad_lines"]
    assert HALF_TOPIC not in zero["topics"] and OP_TOPIC not in zero["topics"]
    for name in default["files"] + default["offset_snapshots"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_half_sends_are_the_same_messages_and_the_end_lines_come_on_top(tmp_path):
    options = {"messages": 1500, "topics": TOPICS, "hours": 3, "bad_rate": 0.02, "seed": 9, "schedule_share": 0.1}
    plain = generate(tmp_path / "plain", **options)
    mixed = generate(tmp_path / "mixed", **options, transaction_share=0.3)
    again = generate(tmp_path / "again", **options, transaction_share=0.3)
    assert mixed == {**again, "files": mixed["files"], "offset_snapshots": mixed["offset_snapshots"]}
    for name in mixed["files"]:
        assert (tmp_path / "mixed" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    before, after = lines(tmp_path / "plain"), lines(tmp_path / "mixed")
    assert set(before) <= set(after)
    for name, rows in after.items():
        assert [as_plain(r) for r in rows if not is_end(r)] == before.get(name, []), name
    counts = mixed["transactions"]
    ends = counts["committed"] + counts["rolled_back"]
    bad_ends = {kind: mixed["bad_kinds"].pop(kind) for kind in BAD_END_KINDS}
    assert mixed["messages"] == plain["messages"] and mixed["scheduled"] == plain["scheduled"]
    refused = round(ends * 0.02)  # the bad rate of the end lines, alternating the kinds
    assert mixed["bad_kinds"] == plain["bad_kinds"] and bad_ends == {"end_without_half": 3, "end_twice": 2}
    assert mixed["bad_lines"] == plain["bad_lines"] + refused == plain["bad_lines"] + 5
    assert mixed["lines"] == plain["lines"] + ends + refused == sum(len(rows) for rows in after.values())
    assert mixed["records"] == mixed["messages"] + 2 * counts["committed"] + counts["rolled_back"]
    assert mixed["topics"][-2:] == [HALF_TOPIC, OP_TOPIC]


def test_each_end_follows_its_half_in_the_producers_file_of_its_hour(tmp_path):
    summary = generate(tmp_path, messages=3000, topics=TOPICS, hours=3, seed=2, transaction_share=0.3,
                       schedule_share=0.1, bad_rate=0.01)  # fmt: skip
    halves, ends, repeats = {}, {}, []
    for name, rows in lines(tmp_path).items():
        folder, producer = name.rsplit("/", 1)
        for row in rows:
            if is_half(row):
                assert row["topic"] != "UserProfile"  # never on a COMPACTION topic
                assert not {"delayLevel", "deliverTimeMs", "reconsumeTimes"} & row.keys()
                assert row["properties"][TRAN_MSG] == "true" and row["properties"][PGROUP].startswith("pg_")
                halves[row["uniqKey"]] = (folder, producer, row)
            elif is_end(row):
                if row["uniqKey"] in ends:
                    repeats.append((row, ends[row["uniqKey"]][2]))
                else:
                    ends[row["uniqKey"]] = (folder, producer, row)
    unknown = [ends.pop(key)[2] for key in ends.keys() - halves.keys()]
    assert len(halves) == summary["transactions"]["sent"]
    assert len(unknown) == summary["bad_kinds"]["end_without_half"] > 0
    assert len(repeats) == summary["bad_kinds"]["end_twice"] > 0
    for repeat, first in repeats:  # the same end again, a little later
        assert repeat == {**first, "storeTimestamp": repeat["storeTimestamp"]}
        assert first["storeTimestamp"] <= repeat["storeTimestamp"] <= first["storeTimestamp"] + 5000
    kinds = Counter(end["endTransaction"] for _, _, end in ends.values())
    counts = summary["transactions"]
    assert kinds == {"COMMIT": counts["committed"], "ROLLBACK": counts["rolled_back"]}
    assert len(halves) - len(ends) == counts["open"] > 0
    assert counts["committed"] > 4 * counts["rolled_back"] > 0
    later = checked = 0
    for key, (folder, producer, end) in ends.items():
        half_folder, half_producer, half = halves[key]
        assert end.keys() - {"fromTransactionCheck"} == END_FIELDS and end.get("fromTransactionCheck", True) is True
        assert (end["topic"], end["producerGroup"]) == (half["topic"], half["properties"][PGROUP])
        stored = half.get("storeTimestamp", half["bornTimestamp"])
        assert producer == half_producer and folder >= half_folder  # hour folders sort by time
        if end.get("fromTransactionCheck"):
            checked += 1
            assert end["storeTimestamp"] > stored + TRANSACTION_TIMEOUT_MS
        else:
            assert stored + 100 <= end["storeTimestamp"] <= stored + 3000
        later += folder > half_folder
    assert later == counts["ends_in_a_later_hour"] > 0 and checked == counts["from_transaction_check"] > 0


def broker_offsets(out: Path, *, topics: list[TopicPlan], hours: int) -> list[Counter]:
    """Each queue's max offset at every hour's end, as a broker stores the lines hour by hour.

    A message without queue or keys takes its topic's next round-robin turn; a half its real queue
    (its turn) and an offset on the half topic; a commit an offset on its half's queue; every end an
    op record. Queue order in a batch: store time, file, line.
    """
    queues = {t.name: t.queues for t in topics}
    files = lines(out)
    turns: Counter = Counter()
    offsets: Counter = Counter()
    half_queues: dict[str, tuple[str, int]] = {}
    at_hour_end = []
    for hour in sorted({name.rsplit("/", 1)[0] for name in files}):
        batch = [
            (row.get("storeTimestamp", row.get("bornTimestamp")), name, number, row)
            for name, rows in files.items()
            if name.startswith(hour + "/")
            for number, row in enumerate(rows)
        ]
        for _, _, _, row in sorted(batch, key=lambda item: item[:3]):
            if is_end(row):
                offsets[(OP_TOPIC, 0)] += 1
                if row["endTransaction"] == "COMMIT":
                    offsets[half_queues[row["uniqKey"]]] += 1
                continue
            if row["topic"] not in queues:
                continue  # the retry topic: no snapshot names it
            queue, keys = row.get("queueId"), row.get("keys")
            if queue is None and keys:
                queue = select_queue_by_hash(KEY_SEPARATOR.join(keys) if isinstance(keys, list) else keys,
                                             queues[row["topic"]])  # fmt: skip
            if queue is None:
                queue = turns[row["topic"]] % queues[row["topic"]]
                turns[row["topic"]] += 1
            if is_half(row):
                half_queues[row["uniqKey"]] = (row["topic"], queue)
                offsets[(HALF_TOPIC, 0)] += 1
            elif row.get("transaction") not in ("PREPARED", "ROLLBACK"):
                offsets[(row["topic"], queue)] += 1
        at_hour_end.append(offsets.copy())
    assert len(at_hour_end) == hours
    return at_hour_end


def test_offset_snapshots_stay_within_the_queues_committed_messages_included(tmp_path):
    """Halves take no offset on their topic until committed: no group's offset passes a queue's max."""
    summary = generate(tmp_path, messages=3000, topics=TOPICS, hours=3, seed=5, transaction_share=0.5)
    plain = generate(tmp_path / "plain", messages=3000, topics=TOPICS, hours=3, seed=5)
    stored = broker_offsets(tmp_path, topics=TOPICS, hours=3)
    counts = summary["transactions"]
    assert stored[-1][(HALF_TOPIC, 0)] == counts["sent"]  # every half, open ones included
    assert stored[-1][(OP_TOPIC, 0)] == counts["committed"] + counts["rolled_back"]
    lower = False
    for hour, name in enumerate(summary["offset_snapshots"]):
        committed = parse_snapshot((tmp_path / name).read_text(), path=name)
        before = {(r.topic, r.group, r.queue_id): r.offset for r in
                  parse_snapshot((tmp_path / "plain" / name).read_text(), path=name)}  # fmt: skip
        for row in committed:
            assert row.offset <= stored[hour][(row.topic, row.queue_id)], (name, row)
            assert row.offset <= before[(row.topic, row.group, row.queue_id)]
            lower |= row.offset < before[(row.topic, row.group, row.queue_id)]
    assert lower and plain["offset_snapshots"] == summary["offset_snapshots"]


def test_a_share_out_of_range_is_refused(tmp_path):
    with pytest.raises(ValueError, match="transaction_share"):
        generate(tmp_path, messages=10, topics=TOPICS, transaction_share=1.5)


def test_the_cli_sends_a_small_share_of_transactions_by_default(tmp_path, capsys):
    args = ["--conf", str(CONF), "--env", "test", "--json", "generate", "--messages", "3000", "--topics",
            "OrderEvents", "--hours", "1"]  # fmt: skip
    assert cli.main([*args, "--out", str(tmp_path / "default")]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["transactions"]
    assert 0 < counts["sent"] < 0.03 * 3000 and counts["committed"] > 0
    assert cli.main([*args, "--out", str(tmp_path / "none"), "--transaction-share", "0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["transactions"]["sent"] == 0
    assert cli.main([*args, "--out", str(tmp_path / "bad"), "--transaction-share", "1.5"]) == 2
    assert "--transaction-share: expected a fraction between 0 and 1" in capsys.readouterr().err
