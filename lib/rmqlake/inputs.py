"""Producer log files: discovery, fingerprints and line-numbered reading.

A batch is identified by its input files (path, size, SHA-256 of the
content). Reading runs in Spark tasks: plain ``.jsonl`` files are cut into
splits so a big file is read in parallel, ``.jsonl.gz`` files are read
whole. Line numbers stay exact across splits: a split owns the lines that
start inside it, and a first cheap pass counts each split's lines.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from rmqlake.errors import InputError

INPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
_READ_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class InputFile:
    """One input file as found: its path (as given or discovered) and size."""

    path: str
    size: int

    @property
    def compressed(self) -> bool:
        return self.path.endswith(".gz")


@dataclass(frozen=True)
class Fingerprint:
    """What identifies an input file: path, size and content hash."""

    path: str
    size: int
    sha256: str

    @property
    def hash32(self) -> int:
        """32 bits of the content hash (seeds generated UNIQ_KEYs)."""
        return int(self.sha256[:8], 16)


@dataclass(frozen=True)
class Split:
    """Bytes ``[start, end)`` of one file; the split owns lines starting inside it."""

    path: str
    start: int
    end: int
    compressed: bool
    sha256: str


def _is_local(path: str) -> bool:
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def _local_path(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def resolve_inputs(pattern: str) -> list[InputFile]:
    """Files named by ``pattern``: a file, a folder (searched recursively) or a glob.

    Raises:
        InputError: nothing matches, or a folder holds no ``.jsonl[.gz]`` file.
    """
    if _is_local(pattern):
        local = _local_path(pattern)
        if os.path.isdir(local):
            found = [
                os.path.join(root, name)
                for root, _dirs, names in os.walk(local)
                for name in names
                if name.endswith(INPUT_SUFFIXES) and not name.startswith((".", "_"))
            ]
            if not found:
                raise InputError(f"input folder {pattern} holds no {'/'.join(INPUT_SUFFIXES)} files")
        elif os.path.isfile(local):
            found = [local]
        else:
            found = [p for p in glob.glob(local, recursive=True) if os.path.isfile(p)]
            if not found:
                raise InputError(f"no input file matches {pattern}")
        return [InputFile(os.path.abspath(p), os.path.getsize(p)) for p in sorted(found)]
    filesystem, root = pafs.FileSystem.from_uri(
        pattern.split("*", 1)[0].rsplit("/", 1)[0] if "*" in pattern else pattern
    )
    scheme = urlparse(pattern).scheme
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File and "*" not in pattern:
        return [InputFile(pattern, info.size)]
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    wanted = urlparse(pattern).netloc + urlparse(pattern).path if "*" in pattern else None
    files = []
    for entry in filesystem.get_file_info(selector):
        if entry.type != pafs.FileType.File:
            continue
        if wanted is not None and not fnmatch.fnmatch(entry.path, wanted):
            continue
        if wanted is None and not entry.path.endswith(INPUT_SUFFIXES):
            continue
        files.append(InputFile(f"{scheme}://{entry.path}", entry.size))
    if not files:
        raise InputError(f"no input file matches {pattern}")
    return sorted(files, key=lambda f: f.path)


def open_binary(path: str, *, compressed: bool = False, offset: int = 0):
    """A buffered binary reader over a local or object-store file (gunzipped when ``compressed``)."""
    if _is_local(path):
        raw = open(_local_path(path), "rb", buffering=_READ_BLOCK)  # noqa: SIM115 - returned to the caller
    else:
        filesystem, inner = pafs.FileSystem.from_uri(path)
        raw = io.BufferedReader(filesystem.open_input_file(inner), buffer_size=_READ_BLOCK)
    if compressed:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if offset:
        raw.seek(offset)
    return raw


def fingerprint(file: InputFile) -> Fingerprint:
    """SHA-256 of the file's bytes as stored (compressed files are hashed compressed)."""
    digest = hashlib.sha256()
    with open_binary(file.path) as handle:
        for block in iter(lambda: handle.read(_READ_BLOCK), b""):
            digest.update(block)
    return Fingerprint(file.path, file.size, digest.hexdigest())


def plan_splits(files: list[Fingerprint], *, split_bytes: int) -> list[Split]:
    """Cut plain files into splits of about ``split_bytes``; gzip files stay whole."""
    splits = []
    for file in files:
        compressed = file.path.endswith(".gz")
        if compressed or file.size <= split_bytes:
            splits.append(Split(file.path, 0, file.size, compressed, file.sha256))
            continue
        for start in range(0, file.size, split_bytes):
            splits.append(Split(file.path, start, min(start + split_bytes, file.size), False, file.sha256))
    return splits


def iter_split_lines(split: Split) -> Iterator[bytes]:
    """Lines starting inside ``split`` (newline and a trailing CR removed).

    A split that does not start the file first skips to the end of the line
    that crosses its start (that line belongs to the previous split); the
    last line is read to its end even past ``split.end``.
    """
    with open_binary(split.path, compressed=split.compressed, offset=max(split.start - 1, 0)) as handle:
        position = max(split.start - 1, 0)
        if split.start > 0:
            skipped = handle.readline()  # ends at the first newline at or after start-1
            position += len(skipped)
        while split.compressed or position < split.end:
            line = handle.readline()
            if not line:
                break
            position += len(line)
            if line.endswith(b"\n"):
                line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line


def count_split_lines(split: Split) -> int:
    """How many lines ``split`` owns (the first pass of line numbering)."""
    return sum(1 for _ in iter_split_lines(split))


LINES_SCHEMA = pa.schema(
    [
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("file_hash32", pa.int64()),
        ("raw", pa.binary()),
    ]
)


def read_split_batches(
    split: Split, *, first_line: int, hash32: int, batch_rows: int = 8192
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of (source_file, source_line, file_hash32, raw) for one split."""
    lines: list[bytes] = []
    number = first_line
    for line in iter_split_lines(split):
        lines.append(line)
        if len(lines) >= batch_rows:
            yield _lines_batch(split.path, number, hash32, lines)
            number += len(lines)
            lines = []
    if lines:
        yield _lines_batch(split.path, number, hash32, lines)


def _lines_batch(path: str, first: int, hash32: int, lines: list[bytes]) -> pa.RecordBatch:
    count = len(lines)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([path] * count, pa.string()),
            pa.array(range(first, first + count), pa.int64()),
            pa.array([hash32] * count, pa.int64()),
            pa.array(lines, pa.binary()),
        ],
        schema=LINES_SCHEMA,
    )
