"""torch.export ``.pt2`` archives: written by ``torch.export.save``, judged against ``torch.export.load``.

The reference inventory is ``torch.export.load(f).state_dict`` plus ``.constants``
(names, dtypes, shapes); the reader's byte ranges hold exactly the tensors' bytes.
Hostile archives are the real ones rewritten with zipfile: configs naming files
outside their folder, missing records, impossible sizes, and pickles that
``torch.export.load`` would unpickle with ``weights_only=False``.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fuzz_inputs import assert_refused, assert_well_behaved, bounded_scan, torch_code
from scanning import codes, json_scan

from guard.readers import scan_file
from guard.sources import LocalFile

torch = pytest.importorskip("torch")


class Block(torch.nn.Module):
    """Parameters, a buffer, a non-persistent buffer, a tied weight and a tensor constant."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.proj = torch.nn.Linear(4, 6, bias=False)
        self.proj.weight = self.embed.weight  # tied: one record, two names
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.register_buffer("hidden", torch.ones(2), persistent=False)
        self.offsets = torch.arange(3)  # a plain tensor attribute: a lifted constant

    def forward(self, ids: Any) -> Any:
        x = self.norm(self.embed(ids) * self.scale) + self.hidden.sum() + self.offsets.sum()
        return self.proj(x)


def export(path: Path, dtype: Any = None) -> Path:
    torch.manual_seed(0)
    model = Block() if dtype is None else Block().to(dtype)
    program = torch.export.export(model, (torch.tensor([[1, 2, 3]]),))
    torch.export.save(program, path)
    return path


def reference(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    program = torch.export.load(path)
    tensors = {**program.state_dict, **{k: v for k, v in program.constants.items() if isinstance(v, torch.Tensor)}}
    return {name: (torch_code(t), tuple(t.shape)) for name, t in tensors.items()}


def scan(path: Path):  # noqa: ANN201
    with LocalFile(path, name=path.name) as source:
        return scan_file(source)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pt2")
    out = {}
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        (root / name).mkdir()
        out[name] = export(root / name / "model.pt2", dtype)
    return out


@pytest.mark.parametrize("kind", ["fp32", "bf16", "fp16"])
def test_pt2_reads_back_what_torch_export_load_reports(archives: dict[str, Path], kind: str) -> None:
    path = archives[kind]
    result = scan(path)
    assert result.format == "torch-export" and not result.findings
    assert {t.name: (t.dtype, t.shape) for t in result.tensors} == reference(path)
    program = torch.export.load(path)
    values = {**program.state_dict, **program.constants}
    data = path.read_bytes()
    for info in result.tensors:  # each range holds the tensor's bytes, as the reference built it
        assert info.data_start is not None and info.data_end is not None
        expected = values[info.name].detach().contiguous().view(torch.uint8).numpy().tobytes()
        assert data[info.data_start : info.data_end] == expected, info.name
    tied = {t.storage for t in result.tensors if t.name in ("embed.weight", "proj.weight")}
    assert len(tied) == 1  # one record: the set counts its parameters once


@pytest.mark.parametrize(("kind", "exit_code", "expected"), [
    ("fp32", 0, set()), ("bf16", 1, {"CG101"}), ("fp16", 1, {"CG101"}),
])
def test_scan_of_an_export_folder(capsys: pytest.CaptureFixture[str], archives: dict[str, Path], kind: str,
                                  exit_code: int, expected: set[str]) -> None:
    code, report = json_scan(capsys, str(archives[kind].parent))
    assert code == exit_code
    assert expected <= codes(report, severity="error") and codes(report, severity="error") <= expected
    assert report["summary"]["files"] == 1 and len(report["models"]) == 1
    (weights,) = report["models"][0]["sets"]
    assert weights["format"] == "torch"


# ------------------------------------------------------------------ hostile archives

def rewrite(path: Path, *, drop: tuple[str, ...] = (), change: dict[str, Any] | None = None,
            add: dict[str, bytes] | None = None, method: int = zipfile.ZIP_STORED) -> bytes:
    """The archive again, with members dropped, replaced (a dict is dumped as JSON) or added."""
    change, add = change or {}, add or {}
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buffer, "w", method) as dst:
        prefix = src.namelist()[0].split("/", 1)[0]
        for info in src.infolist():
            member = info.filename.split("/", 1)[1]
            if member in drop:
                continue
            data = change.get(member, src.read(info))
            dst.writestr(info.filename, json.dumps(data) if isinstance(data, dict) else data)
        for member, data in add.items():
            dst.writestr(f"{prefix}/{member}", data)
    return buffer.getvalue()


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"


def config(path: Path, member: str = WEIGHTS_CONFIG) -> dict[str, Any]:
    with zipfile.ZipFile(path) as archive:
        prefix = archive.namelist()[0].split("/", 1)[0]
        return json.loads(archive.read(f"{prefix}/{member}"))


def with_first(path: Path, **changes: Any) -> bytes:
    cfg = config(path)
    first = next(iter(cfg["config"].values()))
    for key, value in changes.items():
        if key in ("dtype", "sizes", "strides", "storage_offset"):
            first["tensor_meta"][key] = value
        else:
            first[key] = value
    return rewrite(path, change={WEIGHTS_CONFIG: cfg})


@pytest.mark.parametrize(("path_name", "reason"), [
    ("../constants/tensor_0", "not a file of the archive's data/weights/ folder"),
    ("/etc/passwd", "not a file of the archive's data/weights/ folder"),
    ("..", "not a file of the archive's data/weights/ folder"),
    ("weight_99", "which the archive does not hold"),
])
def test_config_naming_a_file_outside_the_archive_is_cg001(archives: dict[str, Path], path_name: str,
                                                           reason: str) -> None:
    assert_refused(with_first(archives["fp32"], path_name=path_name), "model.pt2", reason)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"dtype": 99}, "not a ScalarType"),
    ({"dtype": 0}, "not a ScalarType"),
    ({"sizes": [{"as_int": 2**63}, {"as_int": 2**63}]}, "runs past its record"),
    ({"sizes": [{"as_expr": {"expr_str": "s0"}}, {"as_int": 4}]}, "non-negative integers"),
    ({"strides": [{"as_int": 1}]}, "do not fit its sizes"),
    ({"storage_offset": {"as_int": 10**6}}, "runs past its record"),
    ({"path_name": 7}, "has no path_name"),
])
def test_impossible_tensor_meta_is_cg001(archives: dict[str, Path], changes: dict[str, Any], reason: str) -> None:
    assert_refused(with_first(archives["fp32"], **changes), "model.pt2", reason)


@pytest.mark.parametrize(("drop", "reason"), [
    ((WEIGHTS_CONFIG,), "no data/weights/model_weights_config.json"),
    ((CONSTANTS_CONFIG,), "no data/constants/model_constants_config.json"),
    (("data/sample_inputs/model.pt",), "no data/sample_inputs/model.pt"),
    (("models/model.json",), "no models/<name>.json"),
])
def test_missing_records_are_cg001(archives: dict[str, Path], drop: tuple[str, ...], reason: str) -> None:
    assert_refused(rewrite(archives["fp32"], drop=drop), "model.pt2", reason)


def test_a_record_of_partial_elements_is_cg001(archives: dict[str, Path]) -> None:
    data = rewrite(archives["fp32"], change={"data/weights/weight_0": b"\0" * 7})
    assert_refused(data, "model.pt2", "is not whole float32 elements")


def test_truncations_never_crash(archives: dict[str, Path]) -> None:
    data = archives["bf16"].read_bytes()
    for end in range(0, len(data), max(1, len(data) // 200)):
        assert_well_behaved(bounded_scan(data[:end], "model.pt2"), data[:end])


def test_an_opaque_constant_is_cg003_and_never_unpickled(archives: dict[str, Path]) -> None:
    cfg = config(archives["fp32"], CONSTANTS_CONFIG)
    cfg["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                             "tensor_meta": None}
    payload = b"cos\nsystem\n(S'echo pwned'\ntR."  # pickle.loads would run it: torch.export.load does
    data = rewrite(archives["fp32"], change={CONSTANTS_CONFIG: cfg}, add={"data/constants/opaque_obj_0": payload})
    result = bounded_scan(data, "model.pt2")
    assert_well_behaved(result, data)
    unsafe = [f for f in result.scan.findings if f.code == "CG003"]
    assert len(unsafe) == 1 and "os.system" in unsafe[0].message and "opaque_obj_0" in unsafe[0].message
    assert result.scan.metadata["pickle_globals"] == "os.system"


def test_unsafe_sample_inputs_are_cg003(archives: dict[str, Path], tmp_path: Path) -> None:
    class Sneaky:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    buffer = io.BytesIO()
    torch.save(((Sneaky(),), {}), buffer)  # torch.export.load retries with weights_only=False
    data = rewrite(archives["fp32"], change={"data/sample_inputs/model.pt": buffer.getvalue()})
    result = bounded_scan(data, "model.pt2")
    assert any(f.code == "CG003" and "builtins.print" in f.message and "sample_inputs" in f.message
               for f in result.scan.findings), result.scan.findings
    assert len(result.scan.tensors) == len(reference(archives["fp32"]))


def test_a_deflated_archive_reads_its_configs(archives: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(rewrite(archives["bf16"], method=zipfile.ZIP_DEFLATED))
    result = scan(path)
    assert result.format == "torch-export" and not result.findings
    assert {t.name: (t.dtype, t.shape) for t in result.tensors} == reference(archives["bf16"])


def test_an_archive_named_pt_is_read_the_same(archives: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "exported.pt"  # the dispatch is by archive_format, not by suffix
    path.write_bytes(archives["fp16"].read_bytes())
    assert {t.name: t.dtype for t in scan(path).tensors} == {t.name: t.dtype for t in scan(archives["fp16"]).tensors}


# ------------------------------------------------------------------ remote

def test_hub_scan_reads_a_pt2_tail_in_few_requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The configs, sample inputs and small records sit after the weights, next to the directory."""
    pytest.importorskip("huggingface_hub")
    from hub_standin import standin_fixture
    from test_hub_scan import run_json

    class Wide(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(8))  # 8 MiB

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                x = layer(x)
            return x

    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(Wide().to(torch.bfloat16), (torch.ones(1, 512, dtype=torch.bfloat16),)),
                      path)
    for standin in standin_fixture(monkeypatch, tmp_path):
        standin.add_repo("org/export", {"model.pt2": path.read_bytes()})
        rc, report = run_json(["hub", "scan", "org/export"], tmp_path / "r.json")
        assert rc == 1 and {f["code"] for f in report["findings"]} == {"CG101"}
        (stats,) = report["extra"]["hub"]["repos"][0]["files"]
        assert stats["requests"] <= 3, stats  # end record, directory, the tail
        assert stats["bytes"] <= 256 * 1024, stats  # whatever the size of the weights
        assert report["models"][0]["dtypes"]["BF16"]["tensors"] == 16


def test_torch_2_7_layout_reads_its_state_dict_files(tmp_path: Path) -> None:
    """Before pt2 archives: serialized_state_dict.pt and serialized_constants.pt are torch.save files
    at the zip's top level (torch.export.load still reads them through its zipfile fallback)."""
    def saved(obj: Any) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return buffer.getvalue()

    state = {"fc.weight": torch.ones(3, 2, dtype=torch.bfloat16), "fc.bias": torch.zeros(3, dtype=torch.bfloat16)}
    constants = {"table": torch.arange(4)}
    path = tmp_path / "old.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("version", "5.3")
        archive.writestr("serialized_exported_program.json", "{}")
        archive.writestr("serialized_state_dict.pt", saved(state))
        archive.writestr("serialized_constants.pt", saved(constants))
        archive.writestr("serialized_example_inputs.pt", saved(((torch.ones(1, 2),), {})))
    result = scan(path)
    assert result.format == "torch-export" and not result.findings
    assert {t.name: (t.dtype, t.shape) for t in result.tensors} == {
        "fc.weight": ("BF16", (3, 2)), "fc.bias": ("BF16", (3,)), "table": ("I64", (4,))}
    assert all(t.file == "old.pt2" and t.data_start is None for t in result.tensors)


def test_sample_inputs_that_are_an_export_archive_are_cg001(archives: dict[str, Path]) -> None:
    """An archive inside an archive, as deep as the file allows, is never walked down."""
    data = archives["fp32"].read_bytes()
    for _ in range(3):
        data = rewrite(archives["fp32"], change={"data/sample_inputs/model.pt": data})
    assert_refused(data, "model.pt2", "is a torch.export archive, not the torch.save file")
