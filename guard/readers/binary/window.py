"""A forward-reading window over a ByteSource, for headers that must be walked to be sized.

The readers' one buffered reader.  GGUF, protobuf (ONNX) and msgpack headers have no
length up front, nor do the pickles of a legacy torch file: the reader learns where
the header ends by walking it.  ``Window`` serves small reads from one buffered span
and, on a miss, fetches the next span in one read; ``WindowStream`` is the same as a
file for the pickle walker.  Both count what they fetch through ``CountingSource``.

* A miss that continues where the buffer ends, or skips at most 4 KiB past it (a
  string the walker does not keep), grows the next fetch sixteenfold (64 KiB,
  1 MiB, 16 MiB): a header of up to about 1 MiB costs at most two reads of the
  source, local or ranged HTTP, and a long one a few more.  After small
  payloads (below), it stays at 64 KiB until the next jump.
* A skip of less than 64 KiB (a small payload) is read through in a 64 KiB block
  that does not grow, so a run of small tensors never pulls in 16 MiB blocks of
  their data.
* A longer skip is a jump: the next fetch starts at the asked offset, at 64 KiB.

Nothing past the asked range is fetched beyond the current block.  The block a fetch
replaces is kept when it is at most ``KEEP`` bytes: a walk that reads a record's tail
and then returns to its head (an ONNX Constant's attribute after its tensor's raw
data, then the tensor) costs no second fetch, where it cost one per record (on the
Hub, one ranged request).  The buffers never hold more than one block, one kept
block and one read.
"""

from __future__ import annotations

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource, CountingSource

FIRST_BLOCK = 64 * 1024
GROWTH = 16
MAX_BLOCK = 16 * 1024 * 1024
SMALL_SKIP = 4096  # skipping this little is still walking a header (a string value it does not keep)
KEEP = FIRST_BLOCK * GROWTH  # the largest replaced block kept for a walk that returns to it


class Window:
    def __init__(self, source: ByteSource, *, first_block: int = FIRST_BLOCK, end: int | None = None) -> None:
        self.source = CountingSource(source)  # what this reader asked for: its FileScan.bytes_read
        self.size = source.size if end is None else min(end, source.size)  # nothing past it is ever fetched
        self.first_block = first_block
        self.start = 0
        self.data = b""
        self._block = 0  # the size of the last fetch
        self._payloads = False  # walking records with payloads read through (see need)
        self._kept_start = 0  # the block the last fetch replaced (see the module's docstring)
        self._kept = b""

    @property
    def bytes_read(self) -> int:
        return self.source.bytes_read

    @property
    def reads(self) -> int:
        return self.source.reads

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def need(self, pos: int, n: int, what: str = "header") -> int:
        """Make ``[pos, pos + n)`` buffered; return its index into ``self.data``."""
        if pos < 0 or n < 0 or pos + n > self.size:
            raise MalformedCheckpoint(
                f"{what} at offset {pos:,} needs {n:,} bytes, past the end of the file ({self.size:,} bytes)")
        if self.start <= pos and pos + n <= self.end:
            return pos - self.start
        if self._kept and self._kept_start <= pos and pos + n <= self._kept_start + len(self._kept):
            # back in the block before the last fetch: swap them (the callers index self.data)
            leaving = self.data if len(self.data) <= KEEP else b""
            self.start, self.data, self._kept_start, self._kept = self._kept_start, self._kept, self.start, leaving
            return pos - self.start
        if self.data and self.start <= pos <= self.end + SMALL_SKIP:
            # continues the buffer (a header that keeps going, past a short string it skips): keep its tail, grow
            block = self.first_block if self._payloads else min(MAX_BLOCK, self._block * GROWTH)
            keep = self.data[pos - self.start :]
            fetch_at = self.end
        elif self.data and self.end < pos <= self.end + self.first_block:
            # a short skip (a small payload): read through it in one first-size block, never growing, so
            # that a run of small payloads costs few reads and never pulls in 16 MiB blocks of tensor data
            block = self.first_block
            keep = b""
            fetch_at = self.end
            self._payloads = True  # records with small payloads between them: no growth until a jump
        else:
            self._payloads = False
            block = self.first_block
            keep = b""
            fetch_at = pos
        fetch_end = min(self.size, max(pos + n, fetch_at + block))
        fetched = self.source.read_at(fetch_at, fetch_end - fetch_at)
        self._block = max(block, len(fetched))
        data = keep + fetched
        if fetch_at < pos:  # a short skip: drop the bytes between the old end and pos
            data = data[pos - fetch_at :]
        if self.data and len(self.data) <= KEEP and not keep:  # a tail kept in the new block is not kept twice
            self._kept_start, self._kept = self.start, self.data
        self.start, self.data = pos, data
        return 0

    def read(self, pos: int, n: int, what: str = "header") -> bytes:
        at = self.need(pos, n, what)
        return self.data[at : at + n]


class WindowStream:
    """A read-only file over a Window, for the pickle walker: ``read``, ``readline``, ``tell``.

    Reads never go past ``limit``: a 2^40 length field fails at once instead of fetching
    the rest of the file, and no block is fetched beyond it.
    """

    def __init__(self, source: ByteSource, offset: int, limit: int) -> None:
        self.win = Window(source, end=limit)
        self._pos = offset
        self._limit = self.win.size

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1, /) -> bytes:
        if size < 0 or self._pos + size > self._limit:
            raise MalformedCheckpoint(
                f"pickle asks for {size:,} bytes at byte {self._pos}, past the end of the pickle data"
            )
        at = self.win.need(self._pos, size, "pickle data")
        self._pos += size
        return self.win.data[at : at + size]

    def readline(self, size: int = -1, /) -> bytes:
        """Up to and including the next newline, within ``size`` bytes (64 KiB when not given)."""
        size = MAX_LINE if size < 0 else min(size, MAX_LINE)
        n = min(self._pos + size, self._limit) - self._pos
        win = self.win
        if win.start <= self._pos < win.end:  # a GLOBAL name in the buffer: no fetch of n bytes ahead
            at = self._pos - win.start
            newline = win.data.find(b"\n", at, at + n)
            if newline >= 0:
                self._pos += newline + 1 - at
                return win.data[at : newline + 1]
        at = self.win.need(self._pos, n, "pickle data")
        newline = self.win.data.find(b"\n", at, at + n)
        line = self.win.data[at : at + n if newline < 0 else newline + 1]
        self._pos += len(line)
        return line


MAX_LINE = 64 * 1024  # a protocol-0 text argument: the pickle walker's own limit
