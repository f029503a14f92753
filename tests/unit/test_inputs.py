"""Reading inputs: exact line numbers across splits, gzip, CRLF, a last line without newline."""

from __future__ import annotations

import gzip

from rmqlake.inputs import InputFile, count_split_lines, fingerprint, iter_split_lines, plan_splits, resolve_inputs


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
