"""diffusers pipelines saved the way every Stable Diffusion repository is: default, then variant="fp16".

The expert's verdict: a clean repository (three components, two copies each, counts of one copy);
then each planted defect gives its code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import layouts  # noqa: E402
from scanning import codes, copy_tree, errors, json_scan, model, sets_of  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("sd") / "sd"
    return root, layouts.diffusers_pipeline(root)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sd-sharded") / "sd"
    layouts.diffusers_pipeline(root, max_shard_size="60KB")
    return root


def test_pipeline_with_fp16_variant_is_clean(pipeline: tuple[Path, dict[str, int]], capsys) -> None:
    root, counts = pipeline
    code, report = json_scan(capsys, str(root))
    assert code == 0 and not errors(report)
    assert not codes(report) & {"CG101", "CG102", "CG107", "CG108", "CG109"}
    for component, params in counts.items():
        entry = model(report, f"sd/{component}")
        assert entry["parameters"] == params  # one copy, never the sum of both
        variants = sorted((s["variant"] or "") for s in entry["sets"])
        assert variants == ["", "fp16"]
        primary = [s for s in entry["sets"] if s["primary"]]
        assert len(primary) == 1 and primary[0]["variant"] is None and primary[0]["format"] == "safetensors"
        fp16 = next(s for s in entry["sets"] if s["variant"] == "fp16")
        assert set(fp16["dtypes"]) == {"F16"} and fp16["claimed_dtype"] == "F16"


def test_config_saved_by_the_variant_is_a_warning_that_says_so(pipeline, capsys) -> None:
    root, _ = pipeline
    _, report = json_scan(capsys, str(root / "text_encoder"))
    cg103 = [f for f in report["findings"] if f["code"] == "CG103"]
    assert cg103 and all(f["severity"] == "warning" for f in cg103)
    assert "fp16 variant holds" in cg103[0]["message"] and "saved last" in cg103[0]["message"]


def test_sharded_variant_current_naming_is_one_set(sharded: Path, capsys) -> None:
    names = {p.name for p in (sharded / "unet").iterdir()}
    assert "diffusion_pytorch_model.safetensors.index.fp16.json" in names
    assert any(n.startswith("diffusion_pytorch_model.fp16-00001-of-") for n in names)
    code, report = json_scan(capsys, str(sharded))
    assert code == 0 and not errors(report)
    unet = sets_of(report, "sd/unet")
    assert set(unet) == {"diffusion_pytorch_model.safetensors.index.json",
                         "diffusion_pytorch_model.safetensors.index.fp16.json"}


def test_fp16_variant_holding_fp32_is_cg108(pipeline, tmp_path: Path, capsys) -> None:
    root = copy_tree(pipeline[0], tmp_path / "sd")
    unet = root / "unet"
    shutil.copy(unet / "diffusion_pytorch_model.safetensors", unet / "diffusion_pytorch_model.fp16.safetensors")
    code, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG108"]
    assert code == 1 and len(found) == 1
    assert found[0]["path"].endswith("unet/diffusion_pytorch_model.fp16.safetensors")
    assert found[0]["set"] == "diffusion_pytorch_model.fp16.safetensors"
    assert "claims fp16" in found[0]["message"] and "fp32" in found[0]["message"]
    assert not codes(report) & {"CG101", "CG102"}


def test_variant_shard_deleted_is_cg004_on_its_index(sharded: Path, tmp_path: Path, capsys) -> None:
    root = copy_tree(sharded, tmp_path / "sd")
    shard = sorted((root / "unet").glob("diffusion_pytorch_model.fp16-0000*-of-*.safetensors"))[-1]
    shard.unlink()
    code, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG004"]
    assert code == 1 and found
    assert all(f["path"].endswith("diffusion_pytorch_model.safetensors.index.fp16.json") for f in found)
    assert any(shard.name in f["message"] and "missing" in f["message"] for f in found)


def test_component_without_the_variant_is_cg109(pipeline, tmp_path: Path, capsys) -> None:
    root = copy_tree(pipeline[0], tmp_path / "sd")
    (root / "text_encoder" / "model.fp16.safetensors").unlink()
    code, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG109"]
    assert code == 1 and len(found) == 1
    assert found[0]["path"].endswith("sd/text_encoder") and "fp16" in found[0]["message"]
    # a commit that touches only one component's variant still gets the pipeline's verdict
    code, report = json_scan(capsys, str(root / "unet" / "diffusion_pytorch_model.fp16.safetensors"))
    assert "CG109" in codes(report)


def test_variant_shards_without_their_index_are_cg109(sharded: Path, tmp_path: Path, capsys) -> None:
    root = copy_tree(sharded, tmp_path / "sd")
    (root / "unet" / "diffusion_pytorch_model.safetensors.index.fp16.json").unlink()
    code, report = json_scan(capsys, str(root / "unet"))
    found = [f for f in report["findings"] if f["code"] == "CG109"]
    assert code == 1 and found and "without their index" in found[0]["message"]


def test_lfs_pointer_for_one_variant_file_is_cg002(pipeline, tmp_path: Path, capsys) -> None:
    root = copy_tree(pipeline[0], tmp_path / "sd")
    (root / "vae" / "diffusion_pytorch_model.fp16.safetensors").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 20964\n")
    code, report = json_scan(capsys, str(root))
    found = [f for f in report["findings"] if f["code"] == "CG002"]
    assert code == 1 and len(found) == 1 and found[0]["set"] == "diffusion_pytorch_model.fp16.safetensors"
    assert not codes(report) & {"CG101", "CG102", "CG108"}


def test_deprecated_variant_shard_naming_is_recognised(sharded: Path, tmp_path: Path, capsys) -> None:
    """Older diffusers wrote `name-00001-of-00002.fp16.safetensors` + `name.safetensors.fp16.index.json`.

    No installable diffusers writes it any more, so the current files are renamed to it, as
    repositories on the Hub still carry them."""
    root = copy_tree(sharded, tmp_path / "sd")
    unet = root / "unet"
    index = json.loads((unet / "diffusion_pytorch_model.safetensors.index.fp16.json").read_text())
    renamed = {}
    for shard in sorted(unet.glob("diffusion_pytorch_model.fp16-*.safetensors")):
        numbers = shard.name.removeprefix("diffusion_pytorch_model.fp16-").removesuffix(".safetensors")
        old = f"diffusion_pytorch_model-{numbers}.fp16.safetensors"
        shard.rename(unet / old)
        renamed[shard.name] = old
    index["weight_map"] = {k: renamed[v] for k, v in index["weight_map"].items()}
    (unet / "diffusion_pytorch_model.safetensors.index.fp16.json").unlink()
    (unet / "diffusion_pytorch_model.safetensors.fp16.index.json").write_text(json.dumps(index))
    code, report = json_scan(capsys, str(root))
    assert code == 0 and not errors(report)
    assert "diffusion_pytorch_model.safetensors.fp16.index.json" in sets_of(report, "sd/unet")
