"""``rmqlake generate``'s scheduled messages: a share of delay-level and timer messages within the broker's limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rmqlake import cli
from rmqlake.consumer_offsets import parse_snapshot
from rmqlake.formats.properties import DELAY
from rmqlake.formats.schedule import TIMER_DELAY_SEC, TIMER_DELIVER_MS, ScheduleRules, route
from rmqlake.generate import TopicPlan, generate
from tests.conftest import CONF

TOPICS = [TopicPlan("OrderEvents", 4, False), TopicPlan("UserProfile", 2, True)]
SCHEDULED = ("delayLevel", "deliverTimeMs")


def lines(out: Path) -> dict[str, list]:
    """Every landing file's lines, parsed where they are JSON objects (bad lines kept as bytes)."""
    parsed = {}
    for path in sorted((out / "landing").rglob("*.jsonl")):
        rows = []
        for raw in path.read_bytes().split(b"\n")[:-1]:
            try:
                rows.append(json.loads(raw))
            except ValueError:
                rows.append(raw)
        parsed[str(path.relative_to(out))] = rows
    return parsed


def is_scheduled(line) -> bool:
    return isinstance(line, dict) and (
        any(name in line for name in SCHEDULED) or TIMER_DELAY_SEC in line.get("properties", {})
    )


def without_schedule(line):
    if not isinstance(line, dict):
        return line
    line = {k: v for k, v in line.items() if k not in SCHEDULED}
    properties = {k: v for k, v in line.pop("properties", {}).items() if k != TIMER_DELAY_SEC}
    return line | ({"properties": properties} if properties else {})


def test_a_share_of_zero_writes_the_files_of_before(tmp_path):
    default = generate(tmp_path / "a", messages=600, topics=TOPICS, hours=2, bad_rate=0.02, seed=4)
    zero = generate(tmp_path / "b", messages=600, topics=TOPICS, hours=2, bad_rate=0.02, seed=4, schedule_share=0)
    assert default["scheduled"] == zero["scheduled"] == {"delay": 0, "timer": 0}
    for name in default["files"] + default["offset_snapshots"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_scheduled_messages_are_the_same_messages_with_a_delay_or_timer_added(tmp_path):
    plain = generate(tmp_path / "plain", messages=800, topics=TOPICS, hours=2, bad_rate=0.02, seed=9)
    mixed = generate(tmp_path / "mixed", messages=800, topics=TOPICS, hours=2, bad_rate=0.02, seed=9,
                     schedule_share=0.2)  # fmt: skip
    assert mixed["files"] == plain["files"] and mixed["lines"] == plain["lines"]
    before, after = lines(tmp_path / "plain"), lines(tmp_path / "mixed")
    count = 0
    for name, rows in after.items():
        assert [without_schedule(r) for r in rows] == before[name], name
        for row in filter(is_scheduled, rows):
            count += 1
            assert "transaction" not in row and "reconsumeTimes" not in row  # neither transactional nor a retry
            assert row["topic"] == "OrderEvents"  # never the COMPACTION topic
    assert count == sum(mixed["scheduled"].values())
    assert 0.1 < count / 800 < 0.25 and min(mixed["scheduled"].values()) > 0


def test_delays_stay_within_the_configured_levels_and_max_timer_delay(tmp_path):
    rules = ScheduleRules.of(message_delay_level="1s 2s 3s", timer_precision_ms=1000, timer_max_delay_sec=600)
    summary = generate(tmp_path, messages=1500, topics=TOPICS, hours=1, seed=2, schedule_share=0.5,
                       delay_levels=3, timer_max_delay_sec=600)  # fmt: skip
    forms = {"delayLevel": set(), "deliverTimeMs": set(), TIMER_DELAY_SEC: set()}
    kinds = {"delay": 0, "timer": 0}
    for rows in lines(tmp_path).values():
        for row in filter(is_scheduled, rows):
            store = row.get("storeTimestamp", row["bornTimestamp"])
            if "delayLevel" in row:
                pairs, value = [(DELAY, str(row["delayLevel"]))], row["delayLevel"]
            elif "deliverTimeMs" in row:
                pairs, value = [(TIMER_DELIVER_MS, str(row["deliverTimeMs"]))], row["deliverTimeMs"] - store
            else:
                value = int(row["properties"][TIMER_DELAY_SEC])
                pairs = [(TIMER_DELAY_SEC, str(value))]
            name = next(n for n in forms if n in row or n in row.get("properties", {}))
            forms[name].add(value)
            routed = route(row["topic"], 0, pairs, sys_flag=0, now_ms=store, rules=rules)  # never refused
            kinds[routed.kind] += 1
    assert kinds == summary["scheduled"]
    assert forms["delayLevel"] == {1, 2, 3}  # every level, none above the configured ones
    assert min(forms["deliverTimeMs"]) > 0 and max(forms["deliverTimeMs"]) < 7000  # 1 % of 600 s, in the future
    assert forms[TIMER_DELAY_SEC] <= set(range(1, 7)) and len(forms[TIMER_DELAY_SEC]) > 1


@pytest.mark.parametrize("options", [{"schedule_share": 1.5}, {"delay_levels": 0}, {"timer_max_delay_sec": 0}])
def test_schedule_options_out_of_range_are_refused(tmp_path, options):
    with pytest.raises(ValueError, match="schedule_share"):
        generate(tmp_path, messages=10, topics=TOPICS, **options)


def test_the_cli_schedules_a_small_share_by_default_within_the_configured_levels(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--conf", str(CONF), "--env", "test", "--json", "generate", "--out", str(out), "--messages", "2000",
            "--topics", "OrderEvents", "--hours", "1", "--set", 'broker.message_delay_level=1s 2s']  # fmt: skip
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < sum(summary["scheduled"].values()) < 0.03 * 2000
    levels = {r["delayLevel"] for rows in lines(out).values() for r in rows if "delayLevel" in r}
    assert levels == {1, 2}
    assert cli.main([*args[:-2], "--schedule-share", "0", "--out", str(tmp_path / "none")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["scheduled"] == {"delay": 0, "timer": 0}


@pytest.mark.parametrize("share", ["nan", "1.5", "-0.1"])
def test_the_cli_takes_a_schedule_share_between_0_and_1_only(tmp_path, share, capsys):
    args = ["generate", "--out", str(tmp_path / "out"), "--messages", "10", "--schedule-share", share]
    assert cli.main([*args, "--conf", str(CONF), "--env", "test"]) == 2
    assert "--schedule-share: expected a fraction between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_offset_snapshots_count_no_scheduled_message_before_its_delivery(tmp_path):
    """A scheduled message takes its queue offset when delivered, maybe after the snapshot: never counted."""

    def offsets(out: Path, name: str) -> dict:
        rows = parse_snapshot((out / name).read_text(), path=name)
        return {(r.topic, r.group, r.queue_id): r.offset for r in rows}

    plain = generate(tmp_path / "plain", messages=600, topics=TOPICS, hours=2, seed=6)
    generate(tmp_path / "mixed", messages=600, topics=TOPICS, hours=2, seed=6, schedule_share=0.5)
    for name in plain["offset_snapshots"]:
        before, after = offsets(tmp_path / "plain", name), offsets(tmp_path / "mixed", name)
        assert before.keys() == after.keys()
        assert all(after[k] <= before[k] for k in before)
    assert any(after[k] < before[k] for k in before)
