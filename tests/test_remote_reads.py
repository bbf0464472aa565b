"""What a header scan costs in reads of its source: on the Hub each read that misses is one ranged request.

Targets (issue 16): at most 2 requests where a header fits in 1 MiB; where a format
interleaves its structure with payloads and has no index (ONNX Constants and
initializers here; MIL blob storage in tests/test_coreml_reader.py), one request after
each payload larger than a block, never the payloads.  The figures per format are
bench/hub.py's (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from guard.readers import scan_file
from guard.readers.binary.window import FIRST_BLOCK, Window
from guard.sources import BytesSource
from guard.tensors import FileScan

pytest.importorskip("huggingface_hub")  # HubFile's errors are huggingface_hub's
pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from guard.hub.remote import HubFile  # noqa: E402

LARGE = (256, 1024)  # 1 MiB of F32: far more than a block, so each payload is jumped


class Recording(BytesSource):
    """Counts the reads a reader asks of its source, and what they span."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, name="model.onnx")
        self.spans: list[tuple[int, int]] = []

    def read_at(self, offset: int, size: int) -> bytes:
        self.spans.append((offset, offset + size))
        return super().read_at(offset, size)


def constant_graph(count: int, *, shape: tuple[int, ...] = LARGE) -> bytes:
    """paddle2onnx's layout: every weight a Constant node's value, no initializer."""
    nodes = [helper.make_node("Constant", [], [f"w{i}"],
                              value=numpy_helper.from_array(np.ones(shape, np.float32), f"w{i}"))
             for i in range(count)]
    nodes += [helper.make_node("Identity", [f"w{i}"], [f"y{i}"]) for i in range(count)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, list(shape)) for i in range(count)]
    graph = helper.make_graph(nodes, "constants", [], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def initializer_graph(count: int) -> bytes:
    inits = [numpy_helper.from_array(np.ones(LARGE, np.float32), f"w{i}") for i in range(count)]
    nodes = [helper.make_node("Identity", [f"w{i}"], [f"y{i}"]) for i in range(count)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, list(LARGE)) for i in range(count)]
    graph = helper.make_graph(nodes, "inits", [], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


class InProcessHub:
    """The two calls HubFile makes of its client, served from memory: ranged requests, counted by HubFile."""

    endpoint = "http://127.0.0.1"

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.ranges: list[tuple[int, int]] = []

    def file_url(self, repo_id: str, filename: str, revision: str) -> str:
        return f"{self.endpoint}/{repo_id}/resolve/{revision}/{filename}"

    def get_range(self, url: str, start: int, end: int) -> bytes:
        self.ranges.append((start, end))
        return self.data[start:end]


def remote_scan(data: bytes) -> tuple[FileScan, HubFile, InProcessHub]:
    client = InProcessHub(data)
    source = HubFile(client, repo_id="org/model", revision="main", filename="model.onnx",  # type: ignore[arg-type]
                     size=len(data), name="org/model/model.onnx")
    return scan_file(source), source, client


def payload_bytes_fetched(client: InProcessHub, scan: FileScan) -> int:
    """Bytes of tensor data the requests covered beyond one block after the start of each payload."""
    return sum(max(0, min(end, t.data_end or 0) - max(start, (t.data_start or 0) + FIRST_BLOCK))
               for t in scan.tensors for start, end in client.ranges)


@pytest.mark.parametrize("build", [constant_graph, initializer_graph], ids=["constants", "initializers"])
def test_an_onnx_graph_costs_one_request_after_each_large_payload(build: Callable[[int], bytes]) -> None:
    data = build(8)
    scan, source, client = remote_scan(data)
    assert not scan.findings and [(t.dtype, t.shape) for t in scan.tensors] == [("F32", LARGE)] * 8
    assert [t.name for t in scan.tensors] == [t.name for t in scan_file(BytesSource(data, name="m.onnx")).tensors]
    # the graph's head (the sniff's read too), the model's fields after the graph (opset_import), one
    # block after each payload: a Constant's attribute ends after its tensor, and the walk's return to
    # the tensor is served from the block it left (that return cost a second request per Constant)
    assert source.requests <= 2 + 8, client.ranges
    assert source.bytes_read < len(data) / 10
    assert payload_bytes_fetched(client, scan) <= FIRST_BLOCK  # the model's tail: one block back from the end


def test_small_constants_are_read_through_in_few_requests() -> None:
    data = constant_graph(200, shape=(64, 64))  # 16 KiB each: 3.2 MB of small payloads
    scan, source, client = remote_scan(data)
    assert len(scan.tensors) == 200 and not scan.findings
    # read through in growing blocks, as a header that keeps going (payloads this dense leave nothing to skip)
    assert source.requests <= 4, client.ranges


def test_a_walk_that_returns_to_the_block_it_left_fetches_nothing() -> None:
    source = Recording(b"H" * 8 + b"\0" * 500_000 + b"T" * 8)
    window = Window(source)
    assert window.read(0, 8) == b"H" * 8
    assert window.read(500_008, 8) == b"T" * 8  # a jump past a payload
    assert window.read(0, 8) == b"H" * 8  # back to the record's head: the kept block
    assert window.read(500_008, 8) == b"T" * 8  # and forth again
    assert len(source.spans) == 2 and window.reads == 2

