"""HubFile: a ByteSource over HTTP ``Range`` reads, with a small read-ahead cache.

The readers ask for small pieces (8 bytes, then a header; a zip's end, then its
directory; msgpack tokens).  Each miss fetches the asked range extended to at
least ``readahead`` bytes, so a safetensors file costs one request when its
header fits in the first block and a second one only for a large header.
Requests and bytes are counted for the report and the benchmark; a per-file
budget turns a file that cannot be read this way into CG401 instead of a download.
"""

from __future__ import annotations

import bisect
import threading

from guard.errors import MalformedCheckpoint
from guard.hub.client import HubClient, hub_errors

READAHEAD = 64 * 1024
MAX_CACHED = 8 * 1024 * 1024  # per file; old spans are dropped past this
MAX_REQUESTS = 512  # per file, then CG401
MAX_BYTES = 64 * 1024 * 1024  # per file, then CG401


class RemoteBudgetExceeded(Exception):
    """A file needs more ranged reads than a remote scan allows (CG401, not CG001).

    Deliberately none of the types the reader dispatcher turns into CG001.
    """


class HubFile:
    """One file of one repository revision, read through ranged GETs."""

    def __init__(self, client: HubClient, *, repo_id: str, revision: str, filename: str, size: int,
                 name: str, readahead: int | None = None, max_requests: int | None = None,
                 max_bytes: int | None = None) -> None:
        self.client = client
        self.repo_id = repo_id
        self.revision = revision
        self.filename = filename
        self.name = name
        self.size = size
        self.url = client.file_url(repo_id, filename, revision)
        self.readahead = readahead or READAHEAD
        self.max_requests = max_requests or MAX_REQUESTS
        self.max_bytes = max_bytes or MAX_BYTES
        self.requests = 0
        self.bytes_read = 0  # bytes that came over the wire
        self._starts: list[int] = []  # sorted, non-overlapping cached spans
        self._spans: dict[int, bytes] = {}
        self._cached = 0
        self._lock = threading.Lock()

    def read_at(self, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0 or offset + size > self.size:
            raise MalformedCheckpoint(
                f"read of {size} bytes at offset {offset} runs past the end of the file ({self.size} bytes)"
            )
        if size == 0:
            return b""
        with self._lock:
            hit = self._lookup(offset, size)
            if hit is not None:
                return hit
            start = self._first_missing(offset)
            end = min(self.size, max(offset + size, start + self.readahead))
            if end == self.size:
                # A read at the tail (a zip's end record, then its central directory just
                # before it): take a whole block back from the end, not past what is cached.
                start = max(self._cached_end_before(start), min(start, self.size - self.readahead))
            self._fetch(start, end)
            hit = self._lookup(offset, size)
            if hit is None:  # the fetched span always covers the rest of the read
                raise AssertionError("range cache inconsistency")
            return hit

    def _lookup(self, offset: int, size: int) -> bytes | None:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        start = self._starts[i]
        span = self._spans[start]
        if offset + size <= start + len(span):
            return span[offset - start : offset - start + size]
        return None

    def _first_missing(self, offset: int) -> int:
        """Where a fetch for a read at ``offset`` must start (after a span covering it)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            start = self._starts[i]
            end = start + len(self._spans[start])
            if end > offset:
                return end
        return offset

    def _cached_end_before(self, offset: int) -> int:
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._starts[i] + len(self._spans[self._starts[i]]) if i >= 0 else 0

    def _fetch(self, start: int, end: int) -> None:
        if self.requests >= self.max_requests or self.bytes_read + (end - start) > self.max_bytes:
            raise RemoteBudgetExceeded(
                f"needs more than {self.max_requests} ranged reads or {self.max_bytes:,} bytes"
            )
        with hub_errors(self.repo_id, revision=self.revision, endpoint=self.client.endpoint):
            data = self.client.get_range(self.url, start, end)
        self.requests += 1
        self.bytes_read += len(data)
        self._insert(start, data)

    def _insert(self, start: int, data: bytes) -> None:
        # Merge with a span that ends exactly where this one starts, so that a
        # header read across two fetches can be served from one span.
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0:
            prev = self._starts[i]
            prev_data = self._spans[prev]
            if prev + len(prev_data) == start:
                del self._spans[prev]
                self._starts.pop(i)
                self._cached -= len(prev_data)
                start, data = prev, prev_data + data
        j = bisect.bisect_left(self._starts, start)
        # Drop any span now inside the new one (a re-fetch after eviction).
        while j < len(self._starts) and self._starts[j] < start + len(data):
            old = self._starts.pop(j)
            self._cached -= len(self._spans.pop(old))
        self._starts.insert(j, start)
        self._spans[start] = data
        self._cached += len(data)
        self._evict(keep=start)

    def _evict(self, *, keep: int) -> None:
        for start in list(self._starts):
            if self._cached <= MAX_CACHED:
                return
            if start != keep:
                self._starts.remove(start)
                self._cached -= len(self._spans.pop(start))
