"""ExecuTorch ``.pte``: programs written by ``to_edge(...).to_executorch()``, judged against executorch's
own deserializer (``deserialize_pte_binary``): every constant tensor's dtype and sizes.  Hostile flatbuffers
are hand-made: roots that point at themselves or past the end, and truncations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan
from scanning import codes, json_scan

from guard.readers import scan_file
from guard.readers.torch.executorch import SCALAR_TYPES
from guard.sources import LocalFile

torch = pytest.importorskip("torch")
pytest.importorskip("executorch.exir")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.full((2, 3), 0.5))

    def forward(self, x: Any) -> Any:
        return self.proj(x) * self.scale


def write_pte(path: Path, dtype: Any) -> Path:
    from executorch.exir import to_edge

    torch.manual_seed(0)
    program = torch.export.export(Tiny().to(dtype), (torch.ones(2, 4, dtype=dtype),))
    path.write_bytes(to_edge(program).to_executorch().buffer)
    return path


def reference(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(path.read_bytes())
    program = getattr(program, "program", program)
    out = {}
    for plan in program.execution_plan:
        for value in plan.values:
            t = value.val
            if type(t).__name__ == "Tensor" and t.data_buffer_idx > 0 and t.allocation_info is None:
                out[f"constant[{t.data_buffer_idx}]"] = (SCALAR_TYPES[int(t.scalar_type)], tuple(t.sizes))
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pte")
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        (root / name).mkdir()
        out[name] = write_pte(root / name / "model.pte", dtype)
    return out


@pytest.mark.parametrize("kind", ["fp32", "bf16", "fp16"])
def test_pte_reads_back_what_executorch_reports(programs: dict[str, Path], kind: str) -> None:
    with LocalFile(programs[kind], name="model.pte") as source:
        result = scan_file(source)
    assert result.format == "executorch" and not result.findings
    inventory = {t.name: (t.dtype, t.shape) for t in result.tensors}
    assert inventory == reference(programs[kind]) and len(inventory) == 3
    from executorch.exir._serialize._program import deserialize_pte_binary

    data = programs[kind].read_bytes()
    program = deserialize_pte_binary(data)
    buffers = getattr(program, "program", program).constant_buffer  # the constant segment, moved back
    for info in result.tensors:  # each range holds exactly the constant's bytes
        index = int(info.name.removeprefix("constant[").removesuffix("]"))
        assert info.data_start is not None and info.data_end is not None
        assert data[info.data_start : info.data_end] == bytes(buffers[index].storage)[: info.data_end - info.data_start]


@pytest.mark.parametrize(("kind", "exit_code"), [("fp32", 0), ("bf16", 1), ("fp16", 1)])
def test_scan_of_a_pte_folder(capsys: pytest.CaptureFixture[str], programs: dict[str, Path], kind: str,
                              exit_code: int) -> None:
    code, report = json_scan(capsys, str(programs[kind].parent))
    assert code == exit_code
    assert codes(report, severity="error") == (set() if kind == "fp32" else {"CG101"})
    assert report["summary"]["files"] == 1


@pytest.mark.parametrize(("root", "reason"), [
    (0, "no execution plan"),  # the root table is its own vtable: no fields
    (0xFFFFFFF0, "points past the end"),
    (8, "not 4-byte aligned"),
])
def test_hostile_roots_are_cg001(programs: dict[str, Path], root: int, reason: str) -> None:
    data = bytearray(programs["fp32"].read_bytes())
    data[0:4] = root.to_bytes(4, "little") if root != 8 else (9).to_bytes(4, "little")
    assert_refused(bytes(data), "model.pte", reason)


def test_a_table_offset_pointing_back_at_itself_is_cg001_quickly(programs: dict[str, Path]) -> None:
    data = bytearray(programs["fp32"].read_bytes())
    root = int.from_bytes(data[0:4], "little")
    data[root : root + 4] = (-0x7FFFFFF0).to_bytes(4, "little", signed=True)  # a vtable far past the end
    assert_refused(bytes(data), "model.pte", "past the end")


def test_values_scan_reads_the_constant_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from guard.cli import main

    class Broken(Tiny):
        def __init__(self) -> None:
            super().__init__()
            with torch.no_grad():
                self.proj.weight[0, 0] = float("nan")

    from executorch.exir import to_edge

    program = torch.export.export(Broken(), (torch.ones(2, 4),))
    (tmp_path / "model.pte").write_bytes(to_edge(program).to_executorch().buffer)
    assert main(["scan", "--values", str(tmp_path)]) == 1
    assert "CG203" in capsys.readouterr().out


def test_truncations_never_crash(programs: dict[str, Path]) -> None:
    data = programs["bf16"].read_bytes()
    for end in range(0, len(data), max(1, len(data) // 150)):
        result = bounded_scan(data[:end], "model.pte")
        assert_well_behaved(result, data[:end])
        assert result.scan.format is None or len(result.scan.tensors) <= 3


def test_another_identifier_is_named(programs: dict[str, Path]) -> None:
    data = bytearray(programs["fp32"].read_bytes())
    data[4:8] = b"ET99"
    assert_refused(bytes(data), "model.pte", "not b'ET12'")


def test_mutated_programs_never_crash(programs: dict[str, Path]) -> None:
    """Seeded byte mutations (flips, truncations, inserted lengths of 2^31 and 2^63, splices)."""
    import random

    from fuzz_inputs import apply_all, random_mutations

    rng = random.Random(0)
    bases = [programs["fp32"].read_bytes(), programs["bf16"].read_bytes()]
    for i in range(300):
        base = bases[i % 2]
        data = apply_all(base, random_mutations(rng, base, hot=len(base)))
        assert_well_behaved(bounded_scan(data, "model.pte"), data)


def test_hub_scan_of_a_pte(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, programs: dict[str, Path]) -> None:
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture
    from test_hub_scan import run_json

    for standin in standin_fixture(monkeypatch, tmp_path):
        standin.add_repo("org/pte", {"model.pte": programs["bf16"].read_bytes()})
        rc, report = run_json(["hub", "scan", "org/pte"], tmp_path / "r.json")
        assert rc == 1 and {f["code"] for f in report["findings"]} == {"CG101"}
        (stats,) = report["extra"]["hub"]["repos"][0]["files"]
        assert stats["requests"] <= 2, stats
