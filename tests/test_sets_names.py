"""The conventions table, row by row, and the names that pretend to be conventions.

Each row's example is a name the library writes; the test that builds it with that library is named
beside it (tests/test_sets_*.py).  A new row without an example fails here."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from scanning import codes, json_scan, sets_of

from guard.inventory import build_inventory
from guard.inventory.conventions import CONVENTIONS, NAME_DTYPES, name_claimed_dtype
from guard.inventory.names import classify, convention_of
from guard.readers import scan_file
from guard.sources import BytesSource

EXAMPLES: dict[str, tuple[str, str]] = {  # row pattern's example -> (expected role/kind/variant, built by)
    "model.safetensors.index.json": ("weights index -", "test_sets_transformers::mistral (save_pretrained, sharded)"),
    "model.safetensors.index.fp16.json": ("weights index fp16", "test_sets_transformers::sharded_fp16_variant"),
    "diffusion_pytorch_model.safetensors.fp16.index.json": ("weights index fp16",
                                                            "test_sets_diffusers::deprecated_variant_shard_naming"),
    "model.safetensors": ("weights file -", "test_sets_transformers::three_framework_copies"),
    "model-00001-of-00002.safetensors": ("weights shard -", "test_sets_transformers::mistral"),
    "model.fp16-00001-of-00003.safetensors": ("weights shard fp16", "test_sets_transformers::sharded_fp16_variant"),
    "diffusion_pytorch_model-00001-of-00002.fp16.safetensors": ("weights shard fp16",
                                                                "test_sets_diffusers::deprecated_variant_shard_naming"),
    "diffusion_pytorch_model.fp16.safetensors": ("weights file fp16", "test_sets_diffusers::pipeline_with_fp16"),
    "consolidated.safetensors.index.json": ("weights index -", "hand-written: mistral tooling"),
    "consolidated.safetensors": ("weights file -", "test_sets_transformers::mistral_original_layout"),
    "consolidated-00001-of-00002.safetensors": ("weights shard -", "hand-written: mistral tooling"),
    "consolidated.00.pth": ("weights part -", "test_consolidated_parts_are_one_set (torch.save, as Meta's)"),
    "adapter_model.safetensors": ("adapter file -", "test_sets_training::peft_adapter"),
    "optimizer.pt": ("training-state file -", "test_sets_training::trainer_checkpoints"),
    "scheduler.pt": ("training-state file -", "test_sets_training::trainer_checkpoints"),
    "scaler.pt": ("training-state file -", "Trainer with fp16 AMP (CUDA only): same row as optimizer.pt"),
    "rng_state_3.pth": ("training-state file -", "test_sets_training::trainer_checkpoints (rng_state.pth)"),
    "training_args.bin": ("training-state file -", "test_sets_training::trainer_checkpoints"),
    "pytorch_model_fsdp.bin": ("weights file -", "accelerate FSDP (multi-GPU only): torch.save of the state dict"),
    "last.ckpt": ("weights file -", "test_sets_training::lightning_checkpoint"),
    "openvino_model.xml": ("weights file -", "test_openvino_reader::optimum_intel_style_folder"),
}


@pytest.mark.parametrize("row", CONVENTIONS, ids=lambda c: f"{c.template} {c.layout} {c.source}"[:60])
def test_every_convention_has_an_example_it_classifies(row) -> None:
    matching = [name for name in EXAMPLES if convention_of(name) is row]
    assert matching, f"add an example (and a test built by {row.source}) for {row.template}"
    for name in matching:
        role = classify(name)
        expected = EXAMPLES[name][0].split()
        assert [role.role, role.kind, role.variant or "-"] == expected, name


@pytest.mark.parametrize("name,claims", [
    ("model_fp16.onnx", "F16"), ("llama-3-8b-bf16.gguf", "BF16"), ("x.f16.safetensors", "F16"),
    ("model.safetensors", None), ("half-cheetah.safetensors", None), ("fp16-and-bf16.bin", None),
])
def test_names_that_claim_a_dtype(name: str, claims: str | None) -> None:
    assert name_claimed_dtype(name) == claims


def test_a_variant_named_as_a_dtype_claims_what_a_loose_name_claims() -> None:
    for spelling, code in NAME_DTYPES.items():  # one table: no spelling claims in one place and not the other
        assert classify(f"model.{spelling}.safetensors").variant_dtype == code, spelling
        assert name_claimed_dtype(f"model_{spelling}.onnx") == code, spelling
    assert classify("model.half.safetensors").variant_dtype == "F16"  # a variant says it on purpose
    assert classify("model.ema.safetensors").variant_dtype is None


def _safetensors(dtype: str = "F32", n: int = 4) -> bytes:
    size = {"F32": 4, "F16": 2, "BF16": 2}[dtype] * n
    header = json.dumps({"w": {"dtype": dtype, "shape": [n], "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"\0" * size


def _inventory(names: dict[str, bytes], jsons: dict[str, bytes] | None = None):  # type: ignore[no-untyped-def]
    scans = [scan_file(BytesSource(data, name=f"m/{name}")) for name, data in names.items()]
    return build_inventory("m", scans, json_files={f"m/{k}": v for k, v in (jsons or {}).items()})


@pytest.mark.parametrize("name", ["model..safetensors", "model.fp16.fp16.safetensors", "model." + "v" * 10_000
                                  + ".safetensors", "model.fp\n16.safetensors", "model.-00001-of-00002.safetensors",
                                  "model.fp16-00000-of-00002.safetensors", ".safetensors",
                                  "model.safetensors.index.json"
                                  ".json", "model.\u202efp16.safetensors"])
def test_names_that_pretend_to_be_variants_stay_loose_files(name: str) -> None:
    inv = _inventory({name: _safetensors()})
    assert len(inv.sets) == 1 and inv.sets[0].variant is None and inv.primary is inv.sets[0]


def test_doubled_variant_name_claims_its_dtype(tmp_path: Path, capsys) -> None:
    (tmp_path / "model.fp16.fp16.safetensors").write_bytes(_safetensors("F32"))
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 1 and codes(report) == {"CG108"}


def test_two_sets_claiming_the_default_are_settled_by_the_directory_kind() -> None:
    both = {"model.safetensors": _safetensors(), "diffusion_pytorch_model.safetensors": _safetensors()}
    transformers = _inventory(both, {"config.json": b'{"model_type": "bert"}'})
    diffusers = _inventory(both, {"config.json": b'{"_class_name": "UNet2DModel", "_diffusers_version": "0.30"}'})
    assert transformers.primary is not None and transformers.primary.name == "model.safetensors"
    assert diffusers.primary is not None and diffusers.primary.name == "diffusion_pytorch_model.safetensors"


def test_an_index_that_points_into_another_sets_shards(tmp_path: Path, capsys) -> None:
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(_safetensors())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    (tmp_path / "model.safetensors.index.fp16.json").write_text(json.dumps(
        {"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    code, report = json_scan(capsys, str(tmp_path))
    found = [f for f in report["findings"] if f["code"] == "CG004"]
    assert code == 1 and len(found) == 1 and "another weight set" in found[0]["message"]
    assert found[0]["path"].endswith("model.safetensors.index.fp16.json")


def test_a_variant_index_with_no_default_makes_the_variant_primary(tmp_path: Path, capsys) -> None:
    (tmp_path / "model.fp16-00001-of-00001.safetensors").write_bytes(_safetensors("F16"))
    (tmp_path / "model.safetensors.index.fp16.json").write_text(json.dumps(
        {"weight_map": {"w": "model.fp16-00001-of-00001.safetensors"}}))
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 0 and report["findings"] == []
    sets = sets_of(report, tmp_path.name)
    assert sets["model.safetensors.index.fp16.json"]["primary"]


def test_consolidated_parts_are_one_set(tmp_path: Path, capsys) -> None:
    torch = pytest.importorskip("torch")
    for part in range(2):
        torch.save({"layers.0.attention.wq.weight": torch.ones(2, 4, dtype=torch.bfloat16)},
                   tmp_path / f"consolidated.0{part}.pth")
    (tmp_path / "params.json").write_text('{"dim": 4}')
    code, report = json_scan(capsys, str(tmp_path), "--expect", "bf16")
    assert code == 0 and list(sets_of(report, tmp_path.name)) == ["consolidated.*.pth"]


@pytest.mark.parametrize("name", ["model.ot", "model.caffemodel", "model.pdparams"])  # .tflite is read now
def test_weights_no_reader_handles_are_cg006_never_a_silent_pass(tmp_path: Path, capsys, name: str) -> None:
    (tmp_path / name).write_bytes(b"\x00" * 4096)
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 0 and codes(report) == {"CG006"}
    assert report["summary"]["models"] == 1 and report["summary"]["not_scanned"] == 1
    from guard.cli import main

    assert main(["scan", str(tmp_path)]) == 0
    assert "1 not scanned: unsupported format" in capsys.readouterr().out


def test_weights_renamed_are_found_by_their_magic_bytes(tmp_path: Path, capsys) -> None:
    data = _safetensors("F16", n=40_000)
    (tmp_path / "weights.raw").write_bytes(data)
    code, report = json_scan(capsys, str(tmp_path))
    assert code == 1 and "CG108" not in codes(report) and "CG101" in codes(report)


def test_a_hugging_face_cache_snapshot_keeps_the_names_of_its_symlinks(tmp_path: Path, capsys) -> None:
    """Every file of a cache snapshot is a symlink into blobs/: the link's name is what the conventions read."""
    blobs = tmp_path / "models--org--m" / "blobs"
    snapshot = tmp_path / "models--org--m" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name, data in (("model.safetensors", _safetensors()), ("model.fp16.safetensors", _safetensors("F16"))):
        blob = blobs / f"{len(data):x}{name.count('.')}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(blob)
    code, report = json_scan(capsys, str(snapshot))
    assert code == 0 and report["findings"] == []
    assert set(sets_of(report, "abc123")) == {"model.safetensors", "model.fp16.safetensors"}


@pytest.mark.parametrize("name, pattern", [
    ("model-00001-of-00002.safetensors", "model-*-of-00002.safetensors"),
    ("a00001-of-b-00001-of-00002.bin", "a00001-of-b-*-of-00002.bin"),  # the stem's own look-alike kept
    ("diffusion_pytorch_model-00002-of-00002.fp16.safetensors", "diffusion_pytorch_model-*-of-00002.fp16.safetensors"),
])
def test_a_shard_set_is_named_by_its_own_shard_number(name: str, pattern: str) -> None:
    from guard.inventory.sets import _shard_pattern

    assert _shard_pattern(name) == pattern
