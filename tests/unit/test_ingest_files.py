"""Reading inputs: exact line numbers across splits, gzip, CRLF, a last line without newline, and damage."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re

import pytest

from rmqlake.errors import InputError
from rmqlake.ingest.files import (
    UTF8_BOM,
    DamagedInput,
    InputFile,
    count_split_lines,
    fingerprint,
    iter_split_line_blocks,
    iter_split_lines,
    plan_splits,
    resolve_inputs,
)


def test_splits_own_the_lines_that_start_in_them(tmp_path):
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 13)}"}}'.encode() for i in range(300)]
    data = b"\r\n".join(lines[:150]) + b"\r\n" + b"\n".join(lines[150:])  # CRLF, then LF, no final newline
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    print_ = fingerprint(InputFile(str(path), len(data)))
    for split_bytes in (1024, 1500, 4096, 7, len(data)):
        splits = plan_splits([print_], split_bytes=split_bytes)
        read = [line for split in splits for line in iter_split_lines(split)]
        assert read == lines
        assert sum(count_split_lines(s) for s in splits) == 300


def test_gzip_files_are_read_whole_and_hashed_compressed(tmp_path):
    path = tmp_path / "b.jsonl.gz"
    raw = b'{"a": 1}\n{"a": 2}\n'
    path.write_bytes(gzip.compress(raw, mtime=0))
    found = resolve_inputs(str(tmp_path))
    assert [f.path for f in found] == [str(path)]
    print_ = fingerprint(found[0])
    splits = plan_splits([print_], split_bytes=4)
    assert len(splits) == 1 and list(iter_split_lines(splits[0])) == [b'{"a": 1}', b'{"a": 2}']


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 5 * (1 << 19) + 7])
def test_a_fingerprint_is_the_sha256_of_every_byte_of_the_file(tmp_path, size):
    data = random.Random(size).randbytes(size)
    path = tmp_path / "c.jsonl"
    path.write_bytes(data)
    print_ = fingerprint(InputFile(str(path), size))
    assert (print_.path, print_.size, print_.sha256) == (str(path), size, hashlib.sha256(data).hexdigest())


LINES = [json.dumps({"n": i, "pad": "x" * (i % 50)}).encode() for i in range(2000)]


def test_a_byte_order_mark_at_the_start_of_a_file_is_skipped(tmp_path):
    data = UTF8_BOM + b"\n".join(LINES[:3]) + b"\n" + UTF8_BOM + b"{}\n"  # only the first one is skipped
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data, mtime=0))
    for found in resolve_inputs(str(tmp_path)):
        for split_bytes in (2, 40, 4096):
            splits = plan_splits([fingerprint(found)], split_bytes=split_bytes)
            assert [line for s in splits for line in iter_split_lines(s)] == [*LINES[:3], UTF8_BOM + b"{}"]


@pytest.mark.parametrize("cut", [0.3, 0.999])  # inside the data; inside the 8-byte trailer (all lines are there)
def test_a_truncated_gzip_file_yields_its_complete_lines_then_names_the_damage(tmp_path, cut):
    packed = gzip.compress(b"\n".join(LINES) + b"\n", mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: int(len(packed) * cut)])
    split = plan_splits([fingerprint(InputFile(str(path), path.stat().st_size))], split_bytes=1 << 20)[0]
    read = []
    with pytest.raises(DamagedInput, match=r"cut\.jsonl\.gz: the gzip data ends early or is damaged") as info:
        for block in iter_split_line_blocks(split, block_bytes=4096):
            read.extend(block)
    assert read == LINES[: len(read)]  # every complete line before the cut
    if cut < 0.9:
        assert 0 < len(read) < len(LINES)
        assert LINES[len(read)].startswith(info.value.tail)  # the incomplete line where reading stopped
    else:
        assert len(read) == len(LINES) and info.value.tail == b""


def test_a_file_that_is_not_gzip_is_damaged_at_its_first_line(tmp_path):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(b'{"a": 1}\n')
    split = plan_splits([fingerprint(InputFile(str(path), 9))], split_bytes=1024)[0]
    with pytest.raises(DamagedInput, match="Not a gzipped file"):
        list(iter_split_line_blocks(split))


def test_a_dangling_link_in_an_input_folder_is_named(tmp_path):
    (tmp_path / "good.jsonl").write_bytes(LINES[0] + b"\n")
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "rotated-away.jsonl")
    message = f"input {tmp_path / 'gone.jsonl'} is a symbolic link to {tmp_path / 'rotated-away.jsonl'}, which does"
    for given in (tmp_path, tmp_path / "gone.jsonl", tmp_path / "*.jsonl"):
        with pytest.raises(InputError, match=re.escape(message)):
            resolve_inputs(str(given))
