"""import-store's JVM decoder (``rmqlake.jvm.StoreRecords``, built by ``make jars``) against the per-record reader.

The per-record reader is the reference. Every file here is read both ways: the JVM's run of clean records first,
then the Python reader from where the run ended (as an import task reads a piece), and must give the reference's
rows, column for column; on a clean file the JVM must take every record (a decoder that takes nothing would agree
trivially). One JVM answers every test's tasks, as a Spark task would (its ``main`` reads task lines).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqlake.formats.hosts import parse_host
from rmqlake.formats.record import encode_blank, encode_record
from rmqlake.store import read_segment_file
from rmqlake.store.imports import (
    DECODED,
    DecodedRun,
    FilePiece,
    WalkEnd,
    decode_task_line,
    decoded_run,
    plan_pieces,
)
from tests.java_oracle import _java_bin
from tests.unit.test_store_columnar import DAMAGED_FIELDS, V6, _odd_records, damaged_segment
from tests.unit.test_store_fuzz import FUZZ, mutated
from tests.unit.test_store_import import record

REPO = Path(__file__).resolve().parents[2]
JAR = REPO / ".jars" / "rmqlake-jvm.jar"
JAVA = _java_bin("java")
START = 1 << 30


class Decoder:
    """One JVM running ``StoreRecords.main``: a task line in, its answer line out."""

    def __init__(self):
        import pyspark

        assert JAR.exists() and JAVA, f"{JAR} or java is missing: `make jars` builds the jar with the JDK"
        jars = Path(pyspark.__file__).parent / "jars" / "*"
        self.process = subprocess.Popen(
            [JAVA, "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp", f"{JAR}:{jars}", "rmqlake.jvm.StoreRecords"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, piece: FilePiece, out: Path, *, check_crc: bool = True) -> DecodedRun | str:
        self.process.stdin.write(decode_task_line(piece, str(out), check_crc=check_crc) + "\n")
        self.process.stdin.flush()
        return decoded_run(self.process.stdout.readline().rstrip("\n"), file=str(out))

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def decoder():
    jvm = Decoder()
    yield jvm
    jvm.close()


def read_piece(decoder, piece: FilePiece, out: Path, *, check_crc: bool = True) -> tuple[list, DecodedRun, WalkEnd]:
    """A piece's rows as an import task reads it with the JVM's run, the run, and where the walk ended."""
    run = decoder.run(piece, out, check_crc=check_crc)
    assert isinstance(run, DecodedRun), run
    reached = WalkEnd()
    batches = read_segment_file(piece.path, start_offset=piece.start_offset, last=piece.last, check_crc=check_crc,
                                start=piece.start, stop=piece.stop, first_ordinal=piece.first_ordinal,
                                reached=reached, decoded=run)  # fmt: skip
    return [row for batch in batches for row in batch.to_pylist()], run, reached


def reference(path: Path, start_offset: int, *, last: bool, check_crc: bool = True, **piece) -> list[dict]:
    batches = read_segment_file(str(path), start_offset=start_offset, last=last, check_crc=check_crc, columnar=False,
                                **piece)  # fmt: skip
    return [row for batch in batches for row in batch.to_pylist()]


def whole(path: Path, start_offset: int, *, last: bool) -> FilePiece:
    return FilePiece(str(path), start_offset, last, 0, None, 1, 0)


def test_clean_records_are_the_jvms_and_read_as_the_reference_reads_them(decoder, tmp_path):
    data = _odd_records(START)  # odd properties, V2 topics, IPv6 hosts, empty bodies
    path = tmp_path / f"{START:020d}"
    path.write_bytes(data + encode_blank(8))
    rows, run, _ = read_piece(decoder, whole(path, START, last=False), tmp_path / "decoded.arrow")
    assert run == DecodedRun(len(data), 40, str(tmp_path / "decoded.arrow"))  # every message, up to the blank
    assert rows == reference(path, START, last=False)
    assert rows[-1]["blank_end"] and dict(rows[2]["properties"]) == {"KEYS": "b", "TAGS": "x"}
    assert pa.ipc.open_file(run.file).schema.equals(DECODED.arrow_schema)


def test_a_file_without_a_clean_record_writes_no_rows(decoder, tmp_path):
    path = tmp_path / f"{0:020d}"
    path.write_bytes(bytes(4096))
    out = tmp_path / "none.arrow"
    assert decoder.run(whole(path, 0, last=True), out) == DecodedRun(0, 0, None)
    assert not out.exists()


@pytest.mark.parametrize(
    ("at", "patch"),
    [
        *DAMAGED_FIELDS,
        (52, b"\x00\x01\x11\x70"),  # the born host's port, 70000
        (36, b"\x00\x00\x00\x30"),  # sysFlag: IPv6 hosts the fields do not hold
    ],
)
@pytest.mark.parametrize("record_number", [0, 7, 39])
@pytest.mark.parametrize("check_crc", [True, False])
def test_the_run_ends_before_a_damaged_record_and_python_reads_on(decoder, tmp_path, at, patch, record_number,
                                                                    check_crc):  # fmt: skip
    path, position = damaged_segment(tmp_path, START, record_number=record_number, at=at, patch=patch)
    rows, run, _ = read_piece(decoder, whole(path, START, last=False), tmp_path / "d.arrow", check_crc=check_crc)
    expected = reference(path, START, last=False, check_crc=check_crc)
    assert rows == expected
    if any(row["corrupt_reason"] for row in expected):  # the run ends right before the damaged record
        assert (run.position, run.rows) == (position, record_number)
    else:  # a change the reference keeps (the CRC unchecked, an IPv6 address byte): the JVM takes it too
        assert run.rows == 40


def test_text_and_hosts_the_reference_refuses_end_the_run(decoder, tmp_path):
    clean = _odd_records(0)
    first = int.from_bytes(clean[0:4], "big")
    second = int.from_bytes(clean[first : first + 4], "big")
    cases = {}
    topic = bytearray(clean)
    topic[topic.find(b"OrderEvents", 0, first)] = 0xFF  # not UTF-8
    cases["topic"] = (topic, 0)
    slash = bytearray(clean)
    slash[slash.find(b"OrderEvents", 0, first)] = ord("/")  # UTF-8, but not a topic character
    cases["slash"] = (slash, 0)
    properties = bytearray(clean)
    properties[properties.find(b"KEYS\x01a", first, first + second) + 1] = 0xC3  # a lone lead byte
    cases["properties"] = (properties, 1)
    surrogate = bytearray(clean)
    at = surrogate.find(b"KEYS\x01a", first, first + second)
    surrogate[at : at + 3] = b"\xed\xa0\x80"  # a UTF-16 surrogate in UTF-8: Python's codec refuses it
    cases["surrogate"] = (surrogate, 1)
    mapped = bytearray(clean)
    v6 = mapped.find(parse_host(V6.text).address)
    mapped[v6 : v6 + 16] = bytes(10) + b"\xff\xff" + bytes([1, 2, 3, 4])  # ::ffff:1.2.3.4 in an IPv6 field
    cases["mapped"] = (mapped, 1)
    for name, (content, records) in cases.items():
        path = tmp_path / name / f"{0:020d}"
        path.parent.mkdir()
        path.write_bytes(bytes(content) + bytes(100))
        rows, run, _ = read_piece(decoder, whole(path, 0, last=True), tmp_path / f"{name}.arrow")
        assert rows == reference(path, 0, last=True), name
        assert run.rows == records, name
        assert any(r["corrupt_reason"] for r in rows), name


def test_hosts_topics_and_keys_of_every_shape_read_as_the_reference_reads_them(decoder, tmp_path):
    hosts = ["0.0.0.0:0", "255.255.255.255:65535", "[::]:1", "[::1]:2", "[1::]:3", "[1:0:0:2:0:0:0:3]:4",
             "[0:0:1:0:0:1:0:0]:5", "[2001:db8:0:0:1:0:0:1]:6", "[fe80::abcd:1234]:7", "[::ffff:0:1]:8",
             "[0:0:0:0:0:0:1.2.3.4]:9"]  # fmt: skip
    topics = ["t", "%RETRY%" + "g" * 248, "a|b%c_d-E9", "x" * 127]
    keys = ["", " ", "a", " a  b ", "a\tb", "名 字"]
    data, offset = bytearray(), 0
    for number, text in enumerate(hosts * 3):
        host = parse_host(text)
        topic = topics[number % len(topics)]
        properties = f"KEYS\x01{keys[number % len(keys)]}\x02TAGS\x01t{number}\x02".encode()
        changes = {
            "born_host": host,
            "store_host": host,
            "sys_flag": (0x30 if host.is_ipv6 else 0),
            "topic": topic,
            "magic": -626843477 if len(topic) > 127 else -626843481,
            "properties": properties,
        }
        encoded = encode_record(record(offset, number, **changes))
        data += encoded
        offset += len(encoded)
    path = tmp_path / f"{0:020d}"
    path.write_bytes(bytes(data) + bytes(64))
    rows, run, _ = read_piece(decoder, whole(path, 0, last=True), tmp_path / "shapes.arrow")
    assert run.rows == 3 * len(hosts)
    assert rows == reference(path, 0, last=True)


def test_the_pieces_of_a_file_read_with_the_jvm_give_the_whole_files_rows(decoder, tmp_path):
    data = _odd_records(START)  # 40 records
    path = tmp_path / f"{START:020d}"
    path.write_bytes(data + encode_blank(8))
    pieces = list(plan_pieces(str(path), start_offset=START, last=False, piece_bytes=len(data) // 5))
    assert len(pieces) > 2
    rows, runs = [], []
    for number, piece in enumerate(pieces):
        piece_rows, run, reached = read_piece(decoder, piece, tmp_path / f"p{number}.arrow")
        assert piece.stop is None or (reached.position, reached.rows) == (piece.stop, piece.records)
        rows += piece_rows
        runs.append(run.rows)
    assert rows == reference(path, START, last=False)
    assert sum(runs) == 40  # each piece's records are the JVM's: the last one stops at the blank


def test_answers_are_runs_or_the_reason_the_jvm_gave_up():
    assert decoded_run("4096\t3", file="/x.arrow") == DecodedRun(4096, 3, "/x.arrow")
    assert decoded_run("0\t0", file="/x.arrow") == DecodedRun(0, 0, None)
    assert decoded_run("gave up\tjava.lang.IllegalStateException: too big", file="/x") == (
        "java.lang.IllegalStateException: too big"
    )
    piece = FilePiece("/store/commitlog/00000000000000000000", 0, True, 128, None, 3, 0)
    assert decode_task_line(piece, "/lake/d.arrow").split("\t") == [piece.path, "0", "128", "-1", "1", "/lake/d.arrow"]


def test_a_piece_whose_decoded_file_is_gone_is_read_in_python(tmp_path):
    from rmqlake.store.imports import ImportTarget, import_piece

    data = _odd_records(0)
    path = tmp_path / f"{0:020d}"
    path.write_bytes(data + bytes(64))
    target = ImportTarget(lake_root=str(tmp_path / "lake"), storage_options={}, commitlog_dir="cl",
                          corrupt_dir="cl/_corrupt", batch_id="b", decoded_dir="cl/_decoded")  # fmt: skip
    gone = DecodedRun(len(data), 40, str(tmp_path / "missing.arrow"))  # a task run again after its file went
    result = import_piece(whole(path, 0, last=True), number=0, target=target, decoded=gone)
    assert result["messages"] == 40 and result["decoded"] == 0


def test_a_numbered_answer_is_written_by_its_task_with_the_run_the_jvm_decoded(decoder, tmp_path):
    import pyarrow.parquet as pq

    from rmqlake.store.imports import ImportTarget, import_decoded, import_piece, numbered_decode_line

    data = _odd_records(START)
    path = tmp_path / f"{START:020d}"
    path.write_bytes(data + encode_blank(8))
    target = ImportTarget(lake_root=str(tmp_path / "lake"), storage_options={}, commitlog_dir="cl",
                          corrupt_dir="cl/_corrupt", batch_id="b", decoded_dir="cl/_decoded")  # fmt: skip
    tasks = {7: {"piece": whole(path, START, last=False), "number": 7}}
    line = numbered_decode_line(tasks[7], target)
    number, _, task_line = line.partition("\t")
    out = Path(task_line.split("\t")[-1])
    assert number == "7" and out == Path(target.lake_root) / "cl" / "_decoded" / "piece-00007.arrow"
    out.parent.mkdir(parents=True)
    run = decoder.run(tasks[7]["piece"], out)
    assert run == DecodedRun(len(data), 40, str(out))
    result = import_decoded(f"7\t{run.position}\t{run.rows}", tasks=tasks, target=target)
    assert result["number"] == 7 and result["decoded"] == 40 and result["messages"] == 40
    assert "jvm_gave_up" not in result and not out.exists()  # the decoded file goes once the piece is written
    decoded = pq.read_table(Path(target.lake_root) / result["message_file"])
    python = import_piece(tasks[7]["piece"], number=8, target=target)
    assert decoded.equals(pq.read_table(Path(target.lake_root) / python["message_file"]))
    # the JVM's bodies, pointing into the store file, and Python's, copied out of it, make the same file
    written = [(Path(target.lake_root) / r["message_file"]).read_bytes() for r in (result, python)]
    assert written[0] == written[1]
    assert decoded.schema.field("body").type == pa.binary()  # as every reader reads it back

    gave_up = import_decoded("7\tgave up\tjava.lang.IllegalStateException: too big", tasks=tasks, target=target)
    assert gave_up["jvm_gave_up"] == "java.lang.IllegalStateException: too big"
    assert gave_up["decoded"] == 0 and gave_up["messages"] == 40  # Python read the whole piece
    assert pq.read_table(Path(target.lake_root) / gave_up["message_file"]).equals(decoded)


@settings(FUZZ, max_examples=300)
@given(case=mutated(), check_crc=st.booleans())
def test_mutated_segments_read_as_the_reference_reads_them(decoder, tmp_path_factory, case, check_crc):
    start, data, last = case
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / f"{start:020d}"
    path.write_bytes(data)
    rows, _, _ = read_piece(decoder, whole(path, start, last=last), folder / "d.arrow", check_crc=check_crc)
    assert rows == reference(path, start, last=last, check_crc=check_crc)


@pytest.mark.parametrize(
    ("setting", "check"),
    [("import_store.reader", "use_jvm_reader"), ("ingest.parser", "use_jvm_parser")],
)
def test_without_the_jvm_classes_auto_reads_in_python_and_jvm_stops(tmp_path, caplog, setting, check):
    """A session whose JVM lacks rmqlake's classes (``None``: not even a JVM, as under Spark Connect)."""
    from rmqlake.errors import ConfigError
    from rmqlake.steps import ingest, store
    from tests.conftest import make_settings

    def use_jvm(settings):
        if check == "use_jvm_parser":
            return ingest.use_jvm_parser(None, settings, ingest.parse_options(settings))
        return store.use_jvm_reader(None, settings)

    assert use_jvm(make_settings(tmp_path / "lake", f"{setting}=python")) is False
    assert not caplog.records  # asked for Python: nothing to warn about
    assert use_jvm(make_settings(tmp_path / "lake", f"{setting}=auto")) is False
    assert any("JVM classes are not on the classpath" in r.getMessage() for r in caplog.records)
    name, jar = re.escape(setting), re.escape(str(make_settings(tmp_path / "lake").spark.jvm_jar))
    refused = rf"^{name} is jvm but the session does not have .* --jars {jar} .*set {name} to auto or python$"
    with pytest.raises(ConfigError, match=refused):
        use_jvm(make_settings(tmp_path / "lake", f"{setting}=jvm"))
