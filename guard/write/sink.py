"""An ordered output stream on one background thread, so that writing overlaps producing.

The producer (reading, transposing, casting) queues bytes, buffers and in-kernel
range copies; the writer thread issues the ``write`` / ``copy_file_range`` calls
(which release the GIL) in the same order, starts the disk writing every 64 MiB
(``sync_file_range``) so that the final fsyncs have little left, and ``finish``
fsyncs every file before the output may be published.  A buffer handed over with
``release`` is given back once written, so a small pool of band buffers bounds
memory.  The first error on the writer side is raised again in the producer at its
next call.
"""

from __future__ import annotations

import mmap
import os
import queue
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from guard.errors import GuardError
from guard.write.publish import fsync_paths

DEPTH = 3  # queued jobs: enough to keep the writer busy, few enough to bound memory
COPY_BLOCK = 64 * 2**20
WRITE_CALL = 256 * 2**10
WRITEBACK_EVERY = 64 * 2**20  # start the disk writing this often, so that the final fsync has little left
_STOP = ("stop",)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # prefault a mapped window in one call (Linux)


class OutputStream:
    """Files written in order; ``position`` is the offset the next queued byte will have."""

    def __init__(self, *, checksum: bool = False) -> None:
        self.position = 0
        self.checksum = checksum
        self.crcs: dict[str, int] = {}
        self.closed: list[Path] = []  # files written and closed, for finish() to fsync
        self._jobs: queue.Queue[tuple[Any, ...]] = queue.Queue(DEPTH)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ckpt-guard-writer", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- producer side
    def open(self, path: Path) -> None:
        self.position = 0
        self._put(("open", path))

    def write(self, data: Any, release: Callable[[], None] | None = None) -> None:
        """Queue bytes or a contiguous buffer (a numpy array is taken as its raw bytes)."""
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.position += len(view)
        self._put(("write", view, release))

    def copy_range(self, path: str, start: int, length: int) -> None:
        """Queue ``length`` bytes of ``path`` from ``start``, copied in the kernel where it can."""
        if length:
            self.position += length
            self._put(("copy", path, start, length))

    def begin(self, name: str) -> None:
        """Bytes queued until ``end`` belong to tensor ``name`` (its CRC32 carries on across segments)."""
        if self.checksum:
            self._put(("begin", name))

    def end(self) -> None:
        if self.checksum:
            self._put(("end",))

    def close(self) -> None:
        """Finish the current file: its writeback started and the file closed (fsynced by ``finish``)."""
        self._put(("close",))

    def finish(self) -> None:
        """Wait for every queued job, then fsync every file written; raise the writer's error if there was one.

        The fsyncs come last, together: the first commits the journal for all of them, so the rest only
        wait for their data (one commit per file instead, for Orbax's directory per tensor, costs seconds).
        """
        self._put(_STOP)
        self._thread.join()
        self._raise()
        try:
            fsync_paths(self.closed)
        except OSError as exc:
            self._error = exc
            self._raise()

    def abort(self) -> None:
        """Stop after the job in progress and drop the rest (the caller discards the output)."""
        self._error = self._error or _Aborted()
        while self._thread.is_alive():  # the writer drains what is queued once it sees the error
            try:
                self._jobs.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                continue
        self._thread.join()

    def _put(self, job: tuple[Any, ...]) -> None:
        self._raise()
        while True:
            try:
                self._jobs.put(job, timeout=0.5)
                return
            except queue.Full:
                self._raise()  # the writer died: never block on a queue no one drains

    def _raise(self) -> None:
        error = self._error
        if error is None or isinstance(error, _Aborted):
            return
        if isinstance(error, OSError):
            where = f"{error.filename}: " if error.filename else ""
            raise GuardError(f"{where}cannot write the converted output ({error.strerror}); nothing written") from None
        raise error

    # ---------------------------------------------------------------- writer side
    def _run(self) -> None:
        state = _WriterState()
        while True:
            job = self._jobs.get()
            if job[0] == "stop":
                break
            if self._error is not None:
                _release(job)  # keep draining so the producer never waits on a full queue
                continue
            try:
                state.handle(job, self)
            except BaseException as exc:  # noqa: BLE001  handed to the producer, which raises it
                self._error = exc
                _release(job)
        state.close_quietly()


class _Aborted(Exception):
    pass


def _release(job: tuple[Any, ...]) -> None:
    if job[0] == "write" and job[2] is not None:
        job[2]()


def _sync_file_range() -> Callable[[int, int, int], object] | None:
    """Linux's asynchronous "start writing this range out" (no Python binding; ctypes is stdlib).

    Only a hint: its result is ignored, and the fsync at close is what makes the file durable.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    write = 2  # SYNC_FILE_RANGE_WRITE
    return lambda fd, offset, count: call(fd, offset, count, write)


class _WriterState:
    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: Path | None = None
        self.name: str | None = None
        self.offset = self.flushed = 0
        self.writeback = _sync_file_range()

    def handle(self, job: tuple[Any, ...], stream: OutputStream) -> None:
        kind = job[0]
        if kind == "open":
            self.path = job[1]
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask, as open() gives
            self.offset = self.flushed = 0
        elif kind == "write":
            view, release = job[1], job[2]
            try:
                self._write_all(view, stream)
            finally:
                if release is not None:
                    release()
        elif kind == "copy":
            self._copy(job[1], job[2], job[3], stream)
        elif kind == "begin":
            self.name = job[1]
            stream.crcs.setdefault(job[1], 0)
        elif kind == "end":
            self.name = None
        elif kind == "close":
            assert self.fd is not None and self.path is not None
            if self.writeback is not None and self.offset > self.flushed:
                self.writeback(self.fd, self.flushed, self.offset - self.flushed)
            os.close(self.fd)
            stream.closed.append(self.path)
            self.fd, self.name = None, None

    def _write_all(self, view: Any, stream: OutputStream) -> None:
        assert self.fd is not None
        if stream.checksum and self.name is not None:
            stream.crcs[self.name] = zlib.crc32(view, stream.crcs[self.name])
        done = 0
        while done < len(view):  # 256 KiB calls: from 1 MiB up they stall, now and then, in the page allocator
            done += os.write(self.fd, view[done:done + WRITE_CALL])
        self._advanced(done)

    def _advanced(self, count: int) -> None:
        assert self.fd is not None
        self.offset += count
        if self.writeback is not None and self.offset - self.flushed >= WRITEBACK_EVERY:
            self.writeback(self.fd, self.flushed, self.offset - self.flushed)
            self.flushed = self.offset

    def _copy(self, path: str, start: int, length: int, stream: OutputStream) -> None:
        assert self.fd is not None
        try:
            src = open(path, "rb", buffering=0)  # noqa: SIM115  closed below
        except OSError as exc:  # a source shard deleted or unmounted mid-conversion
            raise GuardError(f"{path}: cannot read it ({exc.strerror}); nothing written") from None
        with src:
            if not stream.checksum and (start - self.offset) % mmap.PAGESIZE:
                start, length = self._mapped_write(src, start, length, stream)
            if not stream.checksum and hasattr(os, "copy_file_range"):
                left, offset = length, start
                while left:
                    try:
                        n = os.copy_file_range(src.fileno(), self.fd, left, offset)
                    except OSError:
                        break  # EXDEV, ENOSYS, EINVAL on some file systems: plain reads below
                    if n == 0:
                        raise GuardError(f"{path}: the file ended early; nothing written")
                    left, offset = left - n, offset + n
                    self._advanced(n)
                start, length = offset, left
            src.seek(start)
            while length:
                block = src.read(min(length, COPY_BLOCK))
                if not block:
                    raise GuardError(f"{path}: the file ended early; nothing written")
                self._write_all(block, stream)
                length -= len(block)

    def _mapped_write(self, src: Any, start: int, length: int, stream: OutputStream) -> tuple[int, int]:
        """A range whose offsets in the two files differ modulo the page size, written from a read-only
        mapping of the source, 64 MiB at a time; returns what is left (all of it where mapping is refused).

        ``copy_file_range`` splices such a range in page fragments, each written separately: 1.3-1.5x
        slower than ``write()`` from a mapping on ext4 (bench/fix.py: torch zip storages are 64-byte
        aligned, so they never line up with a safetensors body).  Page-congruent ranges keep it (a
        reflink where the file system shares blocks)."""
        if os.fstat(src.fileno()).st_size < start + length:  # a mapping past the end would fault, not fail
            raise GuardError(f"{src.name}: the file ended early; nothing written")
        while length:
            skip = start % mmap.ALLOCATIONGRANULARITY
            count = min(length, COPY_BLOCK)
            try:
                window = mmap.mmap(src.fileno(), count + skip, flags=mmap.MAP_SHARED | _POPULATE,
                                   prot=mmap.PROT_READ, offset=start - skip)
            except (OSError, ValueError, TypeError):  # no mmap here (a pipe, Windows' signature, ...)
                break
            with window, memoryview(window) as view:
                self._write_all(view[skip:skip + count], stream)
            start, length = start + count, length - count
        return start, length

    def close_quietly(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
