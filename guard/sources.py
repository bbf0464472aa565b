"""ByteSource: the only way readers touch bytes, local or remote."""

from __future__ import annotations

import os

from guard.errors import MalformedCheckpoint

# The hook's path imports no ``typing`` (about a quarter of its start-up): ``Protocol`` is for the type
# checker alone, and ByteSource a plain class at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object


class ByteSource(Protocol):
    """The interface every reader takes (a protocol: nothing needs to inherit it)."""

    name: str  # display path, used in findings
    size: int

    def read_at(self, offset: int, size: int) -> bytes:
        """Return exactly ``size`` bytes at ``offset``, or raise MalformedCheckpoint."""
        ...


class CountingSource:
    """Counts what a reader asked of a source: the one way readers count ``FileScan.bytes_read``.

    Readers that fetch through ``guard.readers.binary.window.Window`` count through it; the others
    wrap their source in one.  A reader's count leaves out what the dispatcher read to
    sniff the format; a source's own counter (LocalFile, a Hub file) counts everything.
    """

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.name = source.name
        self.size = source.size
        self.bytes_read = 0
        self.reads = 0

    def read_at(self, offset: int, size: int) -> bytes:
        data = self.source.read_at(offset, size)
        self.bytes_read += len(data)
        self.reads += 1
        return data


_HEAD_HELD = 1 << 16  # the most a LocalFile keeps of its first bytes


class LocalFile:
    """A local file read with pread; counts the bytes it read (for the benchmarks)."""

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None, read_ahead: int = 0) -> None:
        """``read_ahead``: the first read at offset 0 takes at least this many bytes (a safetensors file's
        header, read with its format's sniff: one read, not three)."""
        self.path = os.fspath(path)
        self.name = name if name is not None else self.path
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        self.size = os.fstat(self._fd).st_size
        self.bytes_read = 0
        self.reads = 0
        self._ahead = min(read_ahead, _HEAD_HELD)
        self._head = b""  # the first read at offset 0, kept: the format sniff's bytes serve the reader's framing

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(
                f"read of {size} bytes at offset {offset} runs past the end of the file ({self.size} bytes)"
            )
        if offset + size <= len(self._head):
            return self._head[offset:offset + size]
        first = not offset and not self._head and size <= _HEAD_HELD
        want = max(size, min(self._ahead, self.size)) if first else size
        data = os.pread(self._fd, want, offset)
        self.bytes_read += len(data)
        self.reads += 1
        if len(data) != want:
            raise MalformedCheckpoint(f"short read at offset {offset}: file changed while reading?")
        if first:
            self._head = data
            return data[:size] if want != size else data
        return data

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BytesSource:
    """An in-memory source: tests, fuzzing, and small files fetched whole."""

    def __init__(self, data: bytes, *, name: str = "<bytes>") -> None:
        self._data = data
        self.name = name
        self.size = len(data)
        self.bytes_read = 0
        self.reads = 0

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(
                f"read of {size} bytes at offset {offset} runs past the end of the file ({self.size} bytes)"
            )
        self.bytes_read += size
        self.reads += 1
        return self._data[offset : offset + size]
