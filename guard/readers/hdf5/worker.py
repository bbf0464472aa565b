"""A child process that runs h5py, fed with bytes by the scanning process over pipes.

libhdf5 can spin forever or crash on a malformed file, and C code cannot be
interrupted from Python; a child can be killed.  The child asks for every byte
range it needs (``R offset size``); the parent answers from the file's
ByteSource (``K`` data, or ``E`` error), so a Hub file is still read with ranged
requests and the child never opens a file itself.  A child that sends nothing
for ``STALL_SECONDS`` is killed (CG001), as is one that dies (a crash is CG001);
the next file starts a fresh child.  One child serves a whole scan, one file at
a time, so h5py's import (~0.2 s) is paid once.  The child also caps its own
address space.

Frames are 17 bytes, ``kind`` + two little-endian u64, then a payload whose
length is the second number (for ``K``, ``E`` and ``D``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from guard.errors import MalformedCheckpoint
from guard.sources import ByteSource

STALL_SECONDS = 2.0  # between two frames of a working child; a loop in libhdf5 never sends one
START_SECONDS = 60.0  # interpreter, numpy and h5py imports on a loaded machine
MAX_READS = 200_000
MAX_READ_BYTES = 16 << 20  # one metadata read; libhdf5 reads object headers and nodes in KBs
MAX_TOTAL_BYTES = 256 << 20  # per file: a walk that reads this much is reading more than headers
CHILD_ADDRESS_SPACE = 4 << 30
_FRAME = struct.Struct("<cQQ")
_ROOT = str(Path(__file__).resolve().parents[3])


class WorkerDied(Exception):
    pass


class Hdf5Worker:
    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def walk(self, source: ByteSource) -> dict[str, Any]:
        """The child's walk of one file (see hdf5_walk.walk); MalformedCheckpoint if it hangs or dies."""
        with self._lock:
            proc = self._ensure()
            failure: BaseException | None = None
            reads = served = 0
            try:
                _send(proc, b"O", source.size)
                while True:
                    kind, first, second, payload = _receive(proc, STALL_SECONDS)
                    if kind == b"D":
                        break
                    reads, served = reads + 1, served + second
                    if reads > MAX_READS or served > MAX_TOTAL_BYTES:
                        raise MalformedCheckpoint(f"HDF5: more than {MAX_READS:,} reads or "
                                                  f"{MAX_TOTAL_BYTES >> 20} MiB read from the file for its headers")
                    if second > MAX_READ_BYTES:
                        _send(proc, b"E", 0, f"a read of {second:,} bytes at once".encode())
                        continue
                    try:
                        kind, payload = b"K", source.read_at(first, second)
                    except MalformedCheckpoint as exc:
                        kind, payload = b"E", str(exc).encode()[:500]
                    except Exception as exc:  # noqa: BLE001 - re-raised below, after the child is told
                        failure = failure or exc
                        kind, payload = b"E", b"read failed"
                    _send(proc, kind, 0, payload)
            except (TimeoutError, WorkerDied, BrokenPipeError) as exc:
                code = self._kill()
                if isinstance(exc, TimeoutError):
                    raise MalformedCheckpoint(
                        f"the HDF5 library made no progress for {STALL_SECONDS:g} s on this file") from None
                raise MalformedCheckpoint(f"the HDF5 library crashed on this file (exit status {code})") from None
            except BaseException:
                self._kill()  # an alarm or ^C mid-file: the child's state is unknown
                raise
            if failure is not None:
                raise failure  # e.g. the remote read budget: CG401, not CG001
            result: dict[str, Any] = json.loads(payload)
            return result

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            code = (f"import sys; sys.path.insert(0, {_ROOT!r}); "
                    "from guard.readers.hdf5.worker import child_main; child_main()")
            self._proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            try:
                if _receive(self._proc, START_SECONDS)[0] != b"Y":
                    raise WorkerDied
            except (TimeoutError, WorkerDied):
                self._kill()
                raise MalformedCheckpoint("the HDF5 worker (h5py) could not start") from None
        return self._proc

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a dead child's pipe: the unflushed frame has nowhere to go
                    pass
        return code

    def close(self) -> None:
        with self._lock:
            self._kill()


def _send(proc: subprocess.Popen[bytes], kind: bytes, first: int, payload: bytes = b"") -> None:
    assert proc.stdin is not None
    proc.stdin.write(_FRAME.pack(kind, first, len(payload)) + payload)
    proc.stdin.flush()


def _receive(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, int, int, bytes]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    kind, first, second = _FRAME.unpack(_read_exactly(proc.stdout, _FRAME.size, deadline))
    payload = _read_exactly(proc.stdout, second, deadline) if kind in (b"D", b"E") else b""
    return kind, first, second, payload


def _read_exactly(stream: IO[bytes], size: int, deadline: float) -> bytes:
    fd, chunks, left = stream.fileno(), [], size
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fd], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise WorkerDied
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_WORKER = Hdf5Worker()
atexit.register(_WORKER.close)


def walk_in_worker(source: ByteSource) -> dict[str, Any]:
    return _WORKER.walk(source)


# ------------------------------------------------------------------ the child


def child_main() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))
    except (ImportError, ValueError, OSError):
        pass
    out = os.fdopen(os.dup(1), "wb")
    sys.stdout = sys.stderr  # nothing but frames on the pipe
    inp = sys.stdin.buffer
    import h5py

    from guard.readers.hdf5.walk import CallbackFile, walk

    def send(kind: bytes, first: int, second: int, payload: bytes = b"") -> None:
        out.write(_FRAME.pack(kind, first, second) + payload)
        out.flush()

    def read_at(offset: int, size: int) -> bytes:
        send(b"R", offset, size)
        kind, _first, length = _FRAME.unpack(inp.read(_FRAME.size))
        data = inp.read(length)
        if kind != b"K":
            raise OSError(data.decode("utf-8", "replace"))
        return data

    send(b"Y", 0, 0)
    while head := inp.read(_FRAME.size):
        kind, size, _ = _FRAME.unpack(head)
        if kind != b"O":
            return
        result = json.dumps(walk(CallbackFile(read_at, size), h5py)).encode()
        send(b"D", 0, len(result), result)
