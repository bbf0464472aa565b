"""The formats' files in weight sets: ONNX external data belongs to its model file, locally and on the Hub;
GGUF split files are one set; what no reader handles stays CG006."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from hub_standin import StandinHub, standin_fixture  # noqa: E402
from scanning import codes, json_scan, sets_of  # noqa: E402
from test_hub_scan import finding_keys, local_and_remote  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch.onnx.export's own layout: model.onnx and its external data file model.onnx.data."""
    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x: Any) -> Any:
            return self.proj(x)

    folder = tmp_path_factory.mktemp("onnx-export") / "onnx"
    folder.mkdir()
    torch.onnx.export(Tiny().eval(), (torch.zeros(1, 64),), str(folder / "model.onnx"), dynamo=True,
                      external_data=True, verbose=False)
    return folder


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def _data_file(folder: Path) -> Path:
    data = [p for p in folder.iterdir() if p.name != "model.onnx"]
    assert len(data) == 1, data
    return data[0]


def test_external_data_is_part_of_the_onnx_set(exported: Path, tmp_path: Path, capsys) -> None:
    folder = shutil.copytree(exported, tmp_path / "onnx")
    code, report = json_scan(capsys, str(folder))
    assert code == 0 and report["findings"] == []
    sets = sets_of(report, "onnx")
    assert list(sets) == ["model.onnx"]
    assert [Path(f).name for f in sets["model.onnx"]["files"]] == ["model.onnx", _data_file(folder).name]
    assert sets["model.onnx"]["parameters"] == 64 * 64 + 64


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_missing_or_short_external_data_is_cg004(exported: Path, tmp_path: Path, capsys, damage: str) -> None:
    folder = shutil.copytree(exported, tmp_path / "onnx")
    data = _data_file(folder)
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:100])
    code, report = json_scan(capsys, str(folder))
    found = [f for f in report["findings"] if f["code"] == "CG004"]
    assert code == 1 and len(found) == 1 and found[0]["set"] == "model.onnx"
    assert ("missing" if damage == "missing" else "run past the end") in found[0]["message"]


def test_remote_external_data_gives_the_local_findings(exported: Path, standin: StandinHub, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = shutil.copytree(exported, tmp_path / "repo")
    data = _data_file(folder)
    data.write_bytes(data.read_bytes()[:100])
    rc_local, local, rc_remote, remote = local_and_remote(standin, folder, "org/repo", monkeypatch)
    assert rc_local == rc_remote == 1
    assert finding_keys(remote, "org/repo") == finding_keys(local, "repo")
    assert "CG004" in codes(remote)


def test_gguf_split_files_are_one_set(tmp_path: Path, capsys) -> None:
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    for part in (1, 2):
        writer = gguf.GGUFWriter(tmp_path / f"llama-f16-0000{part}-of-00002.gguf", "llama")
        writer.add_file_type(1)
        writer.add_tensor(f"blk.{part}.ffn_up.weight", np.ones((8, 8), np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    code, report = json_scan(capsys, str(tmp_path), "--expect", "fp16")
    assert code == 0 and report["findings"] == []
    assert list(sets_of(report, tmp_path.name)) == ["llama-f16-*-of-00002.gguf"]


def test_weights_renamed_are_found_by_their_magic_bytes_remotely_too(standin: StandinHub, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.torch import save_file

    repo = tmp_path / "repo"
    repo.mkdir()
    save_file({"w": torch.zeros(200, 200, dtype=torch.float16)}, repo / "weights.raw")  # no weight suffix
    (repo / "notes.pdf").write_bytes(b"%PDF" + b"\0" * 100_000)  # large, not weights: never sniffed
    rc_local, local, rc_remote, remote = local_and_remote(standin, repo, "org/repo", monkeypatch)
    assert rc_local == rc_remote == 1
    assert finding_keys(remote, "org/repo") == finding_keys(local, "repo") and "CG101" in codes(remote)
    files = {f["path"] for f in remote["extra"]["hub"]["repos"][0]["files"]}
    assert "weights.raw" in files and "notes.pdf" not in files


def test_a_graph_cannot_hide_a_pickle_by_naming_it_as_its_data(exported: Path, tmp_path: Path, capsys) -> None:
    """External data names are the file's to choose: a hostile graph that names pytorch_model.bin must not
    take that file out of the scan, and with it the file's own CG003."""
    import pickle
    import zipfile

    import onnx

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    folder = tmp_path / "m"
    folder.mkdir()
    model = onnx.load(str(exported / "model.onnx"), load_external_data=True)
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="pytorch_model.bin", size_threshold=0)
    data = (folder / "pytorch_model.bin").read_bytes()
    with zipfile.ZipFile(folder / "pytorch_model.bin", "w") as zf:  # a pickle now stands where the data was
        zf.writestr("pytorch_model/data.pkl", pickle.dumps({"w": Payload()}, protocol=2))
        zf.writestr("pytorch_model/padding", data)
    code, report = json_scan(capsys, str(folder))
    assert code == 1
    assert "CG003" in codes(report, severity="error")
    assert any(f["path"].endswith("pytorch_model.bin") and f["code"] == "CG003" for f in report["findings"])
