"""Mistakes a command can see without Spark are reported before a session starts, with exit code 2 (1 for
missing input), and never as empty results of a lake that is not there."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rmqlake import cli
from rmqlake.lake import Lake
from rmqlake.lake.state import CommitlogState, LakeState
from rmqlake.lake.tables import SEGMENTS
from rmqlake.transforms.segments import segment_size_problem
from tests.conftest import CONF

LINE = {"topic": "OrderEvents", "body": "x", "bornTimestamp": 1_700_000_000_000}


class SparkStarted(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_spark(monkeypatch):
    """A command that reaches Spark fails the test at once (and no JVM starts)."""

    def refuse(*_args, **_kwargs):
        raise SparkStarted("the command started Spark before finding the mistake")

    monkeypatch.setattr("rmqlake.session.get_spark", refuse)


@pytest.fixture
def landing(tmp_path):
    path = tmp_path / "in" / "a.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(LINE) + "\n")
    return path


def run(*argv: str) -> int:
    return cli.main([*argv, "--conf", str(CONF), "--env", "test"])


def test_an_unreadable_now_exits_2_before_spark(tmp_path, landing, capsys):
    code = run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(landing), "--now", "yesterday")
    assert code == 2
    assert "--now: 'yesterday' is neither epoch milliseconds nor ISO-8601" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("now", "message"),
    [
        ("\u0661\u0667\u0660\u0660", "is neither epoch milliseconds nor ISO-8601"),  # Arabic-Indic digits
        ("9" * 5000, "is outside the years 1..9999"),
        ("99999999999999999", "is outside the years 1..9999"),
    ],
)
def test_timestamps_are_checked_for_every_command_that_takes_one(tmp_path, now, message, capsys):
    assert run("expire", "--lake", str(tmp_path / "lake"), "--now", now) == 2
    assert message in capsys.readouterr().err


def test_missing_input_exits_1_naming_it_before_spark(tmp_path, capsys):
    assert run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(tmp_path / "nope")) == 1
    assert f"no input file matches {tmp_path / 'nope'}" in capsys.readouterr().err


def test_a_dangling_link_in_the_input_exits_1_naming_it(tmp_path, landing, capsys):
    (landing.parent / "gone.jsonl").symlink_to(tmp_path / "rotated.jsonl")
    assert run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(landing.parent)) == 1
    assert f"{landing.parent / 'gone.jsonl'} is a symbolic link to {tmp_path / 'rotated.jsonl'}" in (
        capsys.readouterr().err
    )


def test_a_lake_root_that_is_a_file_exits_2(tmp_path, landing, capsys):
    lake = tmp_path / "lake.txt"
    lake.write_text("not a lake")
    assert run("ingest", "--lake", str(lake), "--input", str(landing)) == 2
    assert f"--lake {lake} is a file; the lake root must be a folder" in capsys.readouterr().err
    assert run("reput", "--lake", str(lake)) == 2


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["lag"],
        ["query", "key", "--topic", "OrderEvents", "--key", "k"],
        ["query", "msgid", "0A0000050000000000000000"],
        ["export-store", "--out", "store"],
    ],
    ids=lambda c: c[0] + (f"-{c[1]}" if c[0] == "query" else ""),
)
def test_a_read_only_command_on_a_folder_without_a_lake_exits_2(tmp_path, command, capsys):
    empty = tmp_path / "typo"
    empty.mkdir()
    assert run(*command, "--lake", str(empty)) == 2
    assert f"--lake {empty} holds no lake (no run has committed there)" in capsys.readouterr().err
    assert run(*command, "--lake", str(tmp_path / "missing")) == 2
    assert f"--lake {tmp_path / 'missing'} does not exist" in capsys.readouterr().err


def test_a_driver_memory_the_jvm_cannot_take_exits_2(tmp_path, landing, capsys):
    code = run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(landing), "--set", "spark.driver_memory=xyz")
    assert code == 2
    assert "spark.driver_memory = 'xyz': must be a JVM memory size" in capsys.readouterr().err


def test_the_jvm_parser_without_its_jar_exits_2_before_spark(tmp_path, landing, capsys):
    missing = tmp_path / "no.jar"
    code = run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(landing), "--set", "ingest.parser=jvm",
               "--set", f"spark.jvm_jar={missing}")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"ingest.parser is jvm but spark.jvm_jar ({missing}) is not there" in err and "make jars" in err


def test_an_unknown_parser_exits_2(tmp_path, landing, capsys):
    code = run("ingest", "--lake", str(tmp_path / "lake"), "--input", str(landing), "--set", "ingest.parser=rust")
    assert code == 2
    assert "ingest.parser" in capsys.readouterr().err


def _lake_with_segments(root, rows, *, next_offset: int, recorded: int | None = None) -> None:
    lake = Lake(str(root))
    run_ = lake.begin("ingest")
    defaults = {"message_count": 1, "padding_bytes": 0, "first_store_timestamp": 1, "last_store_timestamp": 2}
    table = pa.Table.from_pylist([{**defaults, **row} for row in rows], schema=SEGMENTS.arrow_schema)
    run_.stage_arrow("segments", table, mode="overwrite")
    run_.commit(state=LakeState(commitlog=CommitlogState(next_offset=next_offset, segment_size=recorded)))


def _segment(start: int, end: int, status: str) -> dict:
    return {
        "segment": f"{start:020d}",
        "start_offset": start,
        "end_offset": end,
        "size_bytes": end - start,
        "status": status,
    }


def test_ingest_with_another_segment_size_than_the_lake_exits_2_before_spark(tmp_path, landing, capsys):
    lake = tmp_path / "lake"
    # written with 4096-byte segments: one sealed, the next active
    _lake_with_segments(lake, [_segment(0, 4096, "sealed"), _segment(4096, 5000, "active")], next_offset=5000)
    argv = ["ingest", "--lake", str(lake), "--input", str(landing)]
    assert run(*argv, "--set", "store.commitlog_segment_size=8192") == 2
    assert (
        "store.commitlog_segment_size is 8192, but the lake's segment 00000000000000000000 spans 4096 bytes. "
        "Segment files cannot change size in a store"
    ) in capsys.readouterr().err
    with pytest.raises(SparkStarted):  # the lake's own size passes every check
        run(*argv, "--set", "store.commitlog_segment_size=4096")


def test_the_segment_size_a_lake_was_written_with_is_told_from_its_rows_or_its_record():
    def problem(rows, size, next_offset, recorded=None):
        return segment_size_problem(rows, segment_size=size, next_offset=next_offset, recorded=recorded)

    active_only = [_segment(0, 3000, "active")]
    assert problem(active_only, 4096, 3000) is None
    assert problem(active_only, 2048, 3000) == (
        "store.commitlog_segment_size is 2048, but the lake's write position 3000 lies past the end of its active "
        "segment. Segment files cannot change size in a store: run with the lake's segment size, or start a new lake"
    )
    assert "written with segments of 4096 bytes" in problem(active_only, 8192, 3000, recorded=4096)
    expired = [_segment(0, 4096, "deleted"), _segment(4096, 8192, "sealed"), _segment(8192, 9000, "active")]
    assert problem(expired, 4096, 9000) is None
    assert "segment 00000000000000000000 spans 4096 bytes" in problem(expired, 2048, 9000)
    assert "segment 00000000000000008192 starts at 8192, not a multiple of it" in problem(expired[2:], 3000, 9000)
    assert problem([], 1024, 0) is None  # a new lake takes any size


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"offsetTable":{"A@g":{0:\xff}}}', "c-1763697600000.json: byte 25 (line 1) is not valid UTF-8"),
        (b'{"offsetTable":{"A@g":{0:-5}}}', "offsetTable['A@g'][0]: offset -5 is not an integer 0.."),
    ],
)
def test_a_bad_offset_snapshot_exits_1_naming_it_and_loads_nothing(tmp_path, content, message, capsys):
    snapshot = tmp_path / "c-1763697600000.json"
    snapshot.write_bytes(content)
    assert run("offsets", "--lake", str(tmp_path / "lake"), "--input", str(snapshot)) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("queue", ["\u0668", "1_0", "9" * 5000])
def test_integer_options_take_ascii_digits_only(tmp_path, queue, capsys):
    code = run("query", "offset", "--topic", "T", "--queue", queue, "--offset", "0", "--lake", str(tmp_path))
    assert code == 2
    assert "--queue: expected an integer of ASCII digits" in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["nan", "inf", "-0.1", "1.5", "1e-3", "\u0660.1"])
def test_generate_takes_a_bad_rate_between_0_and_1_only(tmp_path, rate, capsys):
    assert run("generate", "--out", str(tmp_path / "out"), "--messages", "10", "--bad-rate", rate) == 2
    assert "--bad-rate: expected a fraction between 0 and 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_import_store_of_a_folder_that_is_no_store_exits_1_before_spark(tmp_path, capsys):
    not_a_store = tmp_path / "store"
    not_a_store.mkdir()
    assert run("import-store", str(not_a_store), "--lake", str(tmp_path / "lake")) == 1
    assert f"{not_a_store}: no commitlog/ folder; is this a broker store directory?" in capsys.readouterr().err
    (not_a_store / "commitlog").mkdir()
    (not_a_store / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 100)
    assert run("import-store", str(not_a_store), "--lake", str(tmp_path / "lake")) == 2
    assert "is 100 bytes but store.commitlog_segment_size is 65536" in capsys.readouterr().err


def test_export_store_checks_as_of_before_spark(tmp_path, capsys):
    from rmqlake.lake.ledger import LEDGER_TABLE

    (tmp_path / "lake" / LEDGER_TABLE / "_delta_log").mkdir(parents=True)
    code = run(
        "export-store", "--out", str(tmp_path / "out"), "--as-of", "last tuesday", "--lake", str(tmp_path / "lake")
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--as-of: 'last tuesday' is neither epoch milliseconds nor ISO-8601" in err
    assert "or a run number (its seq in rmqlake status)" in err


def test_import_store_with_a_bad_delay_offset_file_exits_1_naming_it_before_spark(tmp_path, capsys):
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 65536)
    (store / "config").mkdir()
    (store / "config" / "delayOffset.json").write_text('{"offsetTable":{"x":1}}')
    assert run("import-store", str(store), "--lake", str(tmp_path / "lake")) == 1
    err = capsys.readouterr().err
    assert f"{store / 'config' / 'delayOffset.json'}: not a delay offset table: offsetTable key 'x'" in err
    assert not (tmp_path / "lake").exists()


def test_the_jvm_decoder_without_its_jar_exits_2_before_spark(tmp_path, capsys):
    store = tmp_path / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").write_bytes(b"\0" * 65536)
    missing = tmp_path / "no.jar"
    code = run("import-store", str(store), "--lake", str(tmp_path / "lake"), "--set", "import_store.reader=jvm",
               "--set", f"spark.jvm_jar={missing}")  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"import_store.reader is jvm but spark.jvm_jar ({missing}) is not there" in err and "make jars" in err
    assert not (tmp_path / "lake").exists()
    assert run("import-store", str(store), "--lake", str(tmp_path / "lake"), "--set", "import_store.reader=c") == 2
    assert "import_store.reader" in capsys.readouterr().err
