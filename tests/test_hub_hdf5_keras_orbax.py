"""`hub scan` of HDF5, Keras and Orbax files through the stand-in Hub (real huggingface_hub client).

The remote findings and dtypes equal the local scan's; weight files are read with
ranged requests only; an Orbax checkpoint over the Hub is grouped into one model
and only its metadata and small OCDBT files are fetched.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("h5py")
pytest.importorskip("tensorstore")

from hub_standin import StandinHub, standin_fixture  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from real_writers import built  # noqa: E402
from test_hdf5_reader import write_tf_model_h5  # noqa: E402
from test_hub_scan import finding_keys, local_and_remote, run_json  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


def test_remote_hdf5_keras_and_orbax_give_the_local_findings(
        standin: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    keras_dir, _ = built("keras", tmp_path_factory)
    orbax_dir, _ = built("orbax", tmp_path_factory)
    model = tmp_path / "model"
    (model / "bert").mkdir(parents=True)
    write_tf_model_h5(model / "bert" / "tf_model.h5")
    (model / "bert" / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    (model / "keras").mkdir()
    shutil.copy(keras_dir / "fn_bfloat16.keras", model / "keras" / "model.keras")
    shutil.copy(keras_dir / "fn_mixed_float16.weights.h5", model / "keras" / "model.weights.h5")
    shutil.copytree(orbax_dir / "nnx_ocdbt", model / "orbax")
    shutil.copytree(orbax_dir / "manager", model / "manager")
    shutil.copytree(orbax_dir / "tree_zarr3", model / "zarr3")
    shutil.copytree(orbax_dir / "tree_ocdbt", model / "tree")
    rc_local, local, rc_remote, remote = local_and_remote(standin, model, "org/formats", monkeypatch)
    assert rc_remote == rc_local == 1
    assert finding_keys(remote, "org/formats") == finding_keys(local, "model")
    by_path = {m["path"].removeprefix("org/formats").lstrip("/"): m["dtypes"] for m in remote["models"]}
    assert by_path == {m["path"].removeprefix("model").lstrip("/"): m["dtypes"] for m in local["models"]}
    assert set(by_path) == {"bert", "keras", "orbax", "manager/3", "zarr3", "tree"}
    gets = standin.matching(method="GET", contains="/resolve/")
    weights = [r for r in gets if r.path.endswith((".h5", ".keras"))]
    assert weights and all(r.range is not None for r in weights)
    # The Orbax checkpoints: nothing above the reader's small-file bound (the array chunks) is read.
    big = {n for n, size in _sizes(model).items() if size > 64 * 1024 and posixpath.dirname(n).endswith("/d")}
    assert big and not {r.path for r in gets} & {f"/org/formats/resolve/{n}" for n in big}


def _sizes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_remote_orbax_whose_btree_is_out_of_reach_is_cg401(standin: StandinHub, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    from guard.readers import orbax

    orbax_dir, _ = built("orbax", tmp_path_factory)
    standin.add_repo("org/ck", orbax_dir / "nnx_ocdbt")
    monkeypatch.setattr(orbax, "SMALL_FILE", 16)
    rc, report = run_json(["hub", "scan", "org/ck", "--fail-on", "never"], tmp_path / "r.json")
    assert rc == 0 and [f["code"] for f in report["findings"]] == ["CG401"]


def test_an_orbax_checkpoint_at_the_repo_root_keeps_what_lies_beside_it(
        standin: StandinHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A repository that is itself a checkpoint, with config.json and a safetensors copy beside _METADATA:
    the remote scan judges the same files as the local one (it used to skip every file of the repo)."""
    from safetensors.numpy import save_file

    orbax_dir, _ = built("orbax", tmp_path_factory)
    model = shutil.copytree(orbax_dir / "nnx_ocdbt", tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    import numpy as np

    save_file({"w": np.zeros((4, 4), np.float32)}, str(model / "model.safetensors"))
    rc_local, local, rc_remote, remote = local_and_remote(standin, model, "org/root-ckpt", monkeypatch)
    assert rc_remote == rc_local
    assert finding_keys(remote, "org/root-ckpt") == finding_keys(local, "model")
    assert any(code == "CG103" for code, _, _ in finding_keys(remote, "org/root-ckpt"))  # the config was judged
    [remote_model] = remote["models"]
    [local_model] = local["models"]
    remote_files = sorted(f["path"].removeprefix("org/root-ckpt").lstrip("/") for f in remote_model["files"])
    assert remote_files == sorted(f["path"].removeprefix("model").lstrip("/") for f in local_model["files"])
    assert remote_files == ["", "model.safetensors"]  # the checkpoint itself, and the copy beside it
