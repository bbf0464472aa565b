"""The forward-reading window of the GGUF and ONNX readers: header walks grow, payload skips do not."""

from __future__ import annotations

from guard.readers.window import FIRST_BLOCK, Window
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
