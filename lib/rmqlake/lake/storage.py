"""File operations under the lake root, for local paths and object stores alike (pyarrow.fs)."""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs


def normalize_root(root: str) -> str:
    """An absolute local path or a URI, without a trailing slash."""
    scheme = urlparse(root).scheme
    if scheme in ("", "file"):
        path = urlparse(root).path if scheme == "file" else root
        return os.path.abspath(path)
    return root.rstrip("/")


def is_local(root: str) -> bool:
    return urlparse(root).scheme in ("", "file")


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the folder listed
    size: int
    mtime_ms: int


class Storage:
    """Thin wrapper over a pyarrow filesystem rooted at the lake."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root = normalize_root(root)
        if is_local(self.root):
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._base = self.root
        else:
            self.fs, self._base = pafs.FileSystem.from_uri(self.root)

    def uri(self, *parts: str) -> str:
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    def _path(self, relative: str) -> str:
        return "/".join([self._base, relative.strip("/")]) if relative else self._base

    def open_mapped(self, relative: str):
        """A file for random reads: memory-mapped on a local disk (reads cost no copy), else the filesystem's."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            return pa.memory_map(self._path(relative))
        return self.fs.open_input_file(self._path(relative))

    @contextlib.contextmanager
    def mapped_view(self, relative: str):
        """The file's bytes as a read-only memoryview of a memory map on a local disk (``None`` elsewhere).

        Not an Arrow memory map's buffer: Arrow advises the kernel to read ahead the whole range a buffer
        covers (~20 ms for an 18 MB file not in the page cache), where a page read wants a few pages of it.
        """
        if not isinstance(self.fs, pafs.LocalFileSystem):
            yield None
            return
        with open(self._path(relative), "rb") as file:
            if not os.fstat(file.fileno()).st_size:
                yield memoryview(b"")
                return
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            view = memoryview(mapped)
            try:
                yield view
            finally:
                # An array still holding a slice keeps the map open until it is collected (closing then
                # raises BufferError): the map closes itself when the last reference goes.
                with contextlib.suppress(BufferError):
                    view.release()
                    mapped.close()

    @contextlib.contextmanager
    def read_descriptor(self, relative: str):
        """A read-only OS file descriptor of the file on a local disk, for positional reads (``os.pread``) of
        scattered ranges; ``None`` elsewhere."""
        if not isinstance(self.fs, pafs.LocalFileSystem):
            yield None
            return
        descriptor = os.open(self._path(relative), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(self._path(relative)).type != pafs.FileType.NotFound

    def list_files(self, relative: str) -> list[FileEntry]:
        """Files below ``relative`` (recursive), paths relative to it."""
        base = self._path(relative)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        entries = []
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            mtime = info.mtime_ns // 1_000_000 if info.mtime_ns is not None else 0
            entries.append(FileEntry(info.path[len(base) + 1 :], info.size, mtime))
        return sorted(entries, key=lambda e: e.path)

    def list_dirs(self, relative: str) -> list[tuple[str, int]]:
        """Immediate sub-folders of ``relative`` with their mtime (ms)."""
        selector = pafs.FileSelector(self._path(relative), recursive=False, allow_not_found=True)
        return [
            (info.base_name, (info.mtime_ns or 0) // 1_000_000)
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory
        ]

    def move(self, source: str, destination: str) -> None:
        dest_dir = self._path(destination).rsplit("/", 1)[0]
        self.fs.create_dir(dest_dir, recursive=True)
        self.fs.move(self._path(source), self._path(destination))

    def delete_dir(self, relative: str) -> None:
        """Remove a folder and its files; gone already (e.g. removed by a concurrent roll-forward) is fine."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self._path(relative))

    def delete_file(self, relative: str) -> None:
        self.fs.delete_file(self._path(relative))

    def write_bytes(self, relative: str, data: bytes) -> None:
        self.fs.create_dir(self._path(relative).rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self._path(relative)) as out:
            out.write(data)

    def file_path(self, relative: str) -> str:
        """Path inside the filesystem (for pyarrow readers that take ``filesystem=``)."""
        return self._path(relative)
