"""The forward-reading window of the GGUF and ONNX readers: header walks grow, payload skips do not."""

from __future__ import annotations

from guard.readers.binary.window import FIRST_BLOCK, Window
from guard.sources import BytesSource


class Recording(BytesSource):
    def __init__(self, data: bytes) -> None:
        super().__init__(data, name="x")
        self.sizes: list[int] = []

    def read_at(self, offset: int, size: int) -> bytes:
        self.sizes.append(size)
        return super().read_at(offset, size)


def walk(payload: int, count: int = 200) -> tuple[Recording, Window]:
    """``count`` records of an 8-byte header and ``payload`` skipped bytes (inline tensors)."""
    source = Recording((b"H" * 8 + b"\0" * payload) * count)
    window = Window(source)
    pos = 0
    for _ in range(count):
        assert window.read(pos, 8) == b"H" * 8
        pos += 8 + payload
    return source, window


def test_a_header_that_keeps_going_grows_its_reads() -> None:
    source, _ = walk(16, count=40_000)  # ~1 MiB of small records: a vocabulary
    assert len(source.sizes) <= 2


def test_small_payload_skips_never_grow_the_block() -> None:
    source, _ = walk(30_000)
    assert max(source.sizes) <= FIRST_BLOCK + 8  # was 16 MiB blocks of tensor data


def test_large_payloads_are_jumped() -> None:
    source, window = walk(100_000)
    assert window.bytes_read < 0.7 * source.size  # each read is one block after a header, not the payloads
    assert len(source.sizes) == 200


def test_the_pickle_stream_never_fetches_past_its_limit() -> None:
    from guard.errors import MalformedCheckpoint
    from guard.readers.binary.window import WindowStream

    source = Recording(b"line one\nline two\n" + b"\0" * 200_000)
    stream = WindowStream(source, 0, 18)  # the pickle ends where the storages begin
    assert stream.readline(-1) == b"line one\n" and stream.tell() == 9
    assert stream.read(4) == b"line" and stream.readline(100) == b" two\n"
    try:
        stream.read(1)
    except MalformedCheckpoint as exc:
        assert "past the end of the pickle data" in str(exc)
    else:
        raise AssertionError("read past the limit")
    assert sum(source.sizes) == 18  # one fetch, up to the limit, none of the data after it


def test_readers_count_what_they_fetch_not_what_the_source_served_before() -> None:
    source = Recording(b"H" * 100_000)
    source.read_at(0, 512)  # the dispatcher's sniff
    window = Window(source)
    window.read(0, 8)
    assert window.bytes_read == FIRST_BLOCK and window.reads == 1 and source.bytes_read == FIRST_BLOCK + 512
