"""The cast fixes: CG109 (a missing variant, a variant's missing index), CG108 (a variant holding another
dtype) and the set casts of CG101/CG102 (--cast) and CG103 (--to-config), on checkpoints written by
diffusers, transformers and safetensors; the new files loaded back by the library that reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

import layouts  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from scanning import codes, copy_tree, json_scan, tree_state  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.fixes import Fix  # noqa: E402
from guard.samples import save_torch_bin  # noqa: E402

pytestmark = pytest.mark.slow


# -- driving `ckpt-guard fix` ----------------------------------------------------------------------

def fix_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    """``ckpt-guard fix --format json ARGS``: the exit code, and the report (the re-scan's after --write)."""
    capsys.readouterr()
    code = main(["fix", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def outcome(report: dict, action: str) -> dict:
    """The one fix of ``action`` that was applied (or refused): fixes waiting for a flag are left out."""
    found = [o for o in report["extra"]["fix"]["outcomes"]
             if o["action"] == action and not (o["error"] or "").startswith("waits for")]
    assert len(found) == 1, report["extra"]["fix"]["outcomes"]
    return found[0]


def fix_of(report: dict, code: str) -> Fix:
    found = {Fix.from_json(f["fix"]) for f in report["findings"] if f["code"] == code}
    assert len(found) == 1 and None not in found, [f["fix"] for f in report["findings"] if f["code"] == code]
    return found.pop()  # type: ignore[return-value]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_half_of(variant: dict[str, torch.Tensor], default: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Every floating tensor is torch's own cast of the default one, bit for bit."""
    assert variant.keys() == default.keys()
    for name, tensor in default.items():
        want = tensor.to(dtype) if tensor.is_floating_point() else tensor
        assert variant[name].dtype == want.dtype, name
        assert torch.equal(bits(variant[name]), bits(want)) if want.is_floating_point() else \
            torch.equal(variant[name], want), name


# -- CG109: a diffusers component without the fp16 variant the others have --------------------

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sd") / "sd"
    layouts.diffusers_pipeline(root)
    return root


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sd-sharded") / "sd"
    layouts.diffusers_pipeline(root, max_shard_size="60KB")
    return root


def test_missing_vae_variant_is_written_and_loads_in_diffusers(pipeline: Path, tmp_path: Path, capsys) -> None:
    from diffusers import AutoencoderKL, DiffusionPipeline

    root = copy_tree(pipeline, tmp_path / "sd")
    (root / "vae" / "diffusion_pytorch_model.fp16.safetensors").unlink()
    before = tree_state(root)
    code, report = fix_json(capsys, str(root))  # a dry run: the plan, nothing written
    fix = fix_of(report, "CG109")
    assert code == 1 and tree_state(root) == before
    assert fix.action == "variant-add" and fix.safety == "safe" and fix.arguments["to"] == "F16"
    assert fix.writes == (f"{root}/vae/diffusion_pytorch_model.fp16.safetensors",)
    assert fix.arguments["dir"] == f"{root}/vae" and fix.arguments["reads"] == ["diffusion_pytorch_model.safetensors"]

    code, report = fix_json(capsys, "--write", "--select", "CG109", str(root))
    done = outcome(report, "variant-add")
    assert done["ok"] and "F32->F16" in done["summary"] and not done["backups"]
    assert done["written"] == [f"{root}/vae/diffusion_pytorch_model.fp16.safetensors"]
    assert code == 0 and not codes(report) & {"CG108", "CG109", "CG004", "CG101", "CG102"}

    variant = AutoencoderKL.from_pretrained(root / "vae", variant="fp16", torch_dtype=torch.float16)
    default = AutoencoderKL.from_pretrained(root / "vae")
    assert_half_of(variant.state_dict(), default.state_dict(), torch.float16)
    assert_half_of(load_file(root / "vae" / "diffusion_pytorch_model.fp16.safetensors"),
                   load_file(root / "vae" / "diffusion_pytorch_model.safetensors"), torch.float16)
    pipe = DiffusionPipeline.from_pretrained(root, variant="fp16", torch_dtype=torch.float16)
    assert {p.dtype for p in pipe.vae.parameters()} == {torch.float16}


def test_missing_sharded_variant_is_written_as_save_pretrained_names_it(sharded: Path, tmp_path: Path,
                                                                       capsys) -> None:
    from diffusers import UNet2DConditionModel

    root = copy_tree(sharded, tmp_path / "sd")
    unet = root / "unet"
    removed = sorted(p.name for p in unet.iterdir() if ".fp16" in p.name)
    assert "diffusion_pytorch_model.safetensors.index.fp16.json" in removed and len(removed) > 2
    for name in removed:
        (unet / name).unlink()
    _, report = json_scan(capsys, str(root))
    fix = fix_of(report, "CG109")
    assert fix.arguments["reads"][0] == "diffusion_pytorch_model.safetensors.index.json"
    planned = sorted(w.rpartition("/")[2] for w in fix.writes)
    assert "diffusion_pytorch_model.safetensors.index.fp16.json" in planned
    assert all(n.startswith("diffusion_pytorch_model.fp16-0000") for n in planned if not n.endswith(".json"))

    code, report = fix_json(capsys, "--write", "--select", "CG109", str(root))
    assert sorted(Path(w).name for w in outcome(report, "variant-add")["written"]) == planned
    assert code == 0 and not codes(report) & {"CG108", "CG109", "CG004"}
    variant = UNet2DConditionModel.from_pretrained(unet, variant="fp16", torch_dtype=torch.float16)
    default = UNet2DConditionModel.from_pretrained(unet)
    assert_half_of(variant.state_dict(), default.state_dict(), torch.float16)


def test_variant_is_cast_from_a_pickled_default(pipeline: Path, tmp_path: Path, capsys) -> None:
    from diffusers import AutoencoderKL

    root = copy_tree(pipeline, tmp_path / "sd")
    vae = root / "vae"
    model = AutoencoderKL.from_pretrained(vae)
    for name in ("diffusion_pytorch_model.fp16.safetensors", "diffusion_pytorch_model.safetensors"):
        (vae / name).unlink()
    model.save_pretrained(vae, safe_serialization=False)
    code, report = fix_json(capsys, "--write", "--select", "CG109", str(root))
    done = outcome(report, "variant-add")
    assert done["ok"] and done["details"]["read"] == ["diffusion_pytorch_model.bin"]
    assert "CG109" not in codes(report)
    loaded = AutoencoderKL.from_pretrained(vae, variant="fp16", torch_dtype=torch.float16)
    assert_half_of(loaded.state_dict(), model.state_dict(), torch.float16)


def test_variant_shards_without_their_index_get_it_back(sharded: Path, tmp_path: Path, capsys) -> None:
    from diffusers import UNet2DConditionModel

    root = copy_tree(sharded, tmp_path / "sd")
    index = root / "unet" / "diffusion_pytorch_model.safetensors.index.fp16.json"
    original = index.read_bytes()
    index.unlink()
    _, report = json_scan(capsys, str(root / "unet"))
    fix = fix_of(report, "CG109")
    assert fix.action == "index-rebuild" and fix.safety == "safe" and fix.writes == (str(index),)

    code, report = fix_json(capsys, "--write", "--select", "CG109", str(root))
    assert outcome(report, "index-rebuild")["ok"]
    assert json.loads(index.read_bytes()) == json.loads(original)  # what diffusers wrote, from the headers alone
    assert code == 0 and not codes(report) & {"CG109", "CG004"}
    UNet2DConditionModel.from_pretrained(root / "unet", variant="fp16", torch_dtype=torch.float16)


def test_an_index_for_incomplete_shards_is_no_fix(sharded: Path, tmp_path: Path, capsys) -> None:
    root = copy_tree(sharded, tmp_path / "sd")
    (root / "unet" / "diffusion_pytorch_model.safetensors.index.fp16.json").unlink()
    shards = sorted((root / "unet").glob("diffusion_pytorch_model.fp16-0000*-of-*.safetensors"))
    shards[0].unlink()
    _, report = json_scan(capsys, str(root / "unet"))
    found = [Fix.from_json(f["fix"]) for f in report["findings"] if f["code"] == "CG109"]
    assert found and all(f is not None and not f.available and "missing" in f.description for f in found)


# -- CG108: an fp16 variant holding fp32 ---------------------------------------------------------

def _tiny_bert(*, plant: float | None = None):  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=32))
    if plant is not None:
        with torch.no_grad():
            model.bert.encoder.layer[0].output.dense.bias[3] = plant
    return model


@pytest.mark.parametrize("max_shard_size", [None, "8KB"])
def test_fp16_variant_holding_fp32_is_recast(tmp_path: Path, capsys, max_shard_size: str | None) -> None:
    from transformers import BertForMaskedLM

    model = _tiny_bert()
    model.save_pretrained(tmp_path)
    shard = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(tmp_path, variant="fp16", **shard)  # fp32 weights under the fp16 name
    before = tree_state(tmp_path)
    code, report = fix_json(capsys, "--write", str(tmp_path))
    fix = fix_of(report, "CG108")
    assert fix.action == "variant-recast" and fix.safety == "needs-flag" and fix.flag == "--replace"
    assert [p["waiting_for"] for p in report["extra"]["fix"]["plan"]] == ["--replace"]
    assert code == 1 and tree_state(tmp_path) == before  # it replaces files: not without --replace

    code, report = fix_json(capsys, "--write", "--replace", str(tmp_path))
    done = outcome(report, "variant-recast")
    replaced = [Path(w).name for w in fix.writes]
    assert replaced == fix.arguments["reads"] == fix.arguments["files"] + ([fix.arguments["index"]] if max_shard_size
                                                                           else [])
    assert done["ok"] and sorted(Path(b).name for b in done["backups"]) == sorted(f"{n}.orig" for n in replaced)
    assert code == 0 and not codes(report) & {"CG108", "CG109", "CG004"}
    for name in replaced:
        assert (tmp_path / (name + ".orig")).read_bytes() == before[name][0]  # the replaced file kept
    variant = {k: v for n in fix.arguments["files"] for k, v in load_file(tmp_path / n).items()}
    assert_half_of(variant, load_file(tmp_path / "model.safetensors"), torch.float16)
    loaded = BertForMaskedLM.from_pretrained(tmp_path, variant="fp16", torch_dtype=torch.float16)
    assert {p.dtype for p in loaded.parameters()} == {torch.float16}
    assert_half_of(loaded.state_dict(), model.state_dict(), torch.float16)
    if max_shard_size:
        index = json.loads((tmp_path / "model.safetensors.index.fp16.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
        assert index["metadata"]["total_size"] == sum(v.numel() * 2 for v in variant.values())


def test_a_variant_cast_from_a_pickle_keeps_tied_names_once(tmp_path: Path, capsys) -> None:
    """``--add variant:fp16`` beside a pickle-only BERT: the decoder tied to the embeddings is written once,
    as save_pretrained writes it, and from_pretrained ties it back."""
    from transformers import BertForMaskedLM

    model = _tiny_bert()
    save_torch_bin(model, tmp_path)
    code, report = fix_json(capsys, "--add", "variant:fp16", "--select", "CG109", "--write", str(tmp_path))
    done = outcome(report, "add-copy")
    assert done["ok"] and {"kept": "bert.embeddings.word_embeddings.weight",
                           "dropped": ["cls.predictions.decoder.weight"]} in done["details"]["tied"]
    assert "cls.predictions.decoder.weight" not in load_file(tmp_path / "model.fp16.safetensors")
    loaded = BertForMaskedLM.from_pretrained(tmp_path, variant="fp16", torch_dtype=torch.float16)
    assert_half_of(loaded.state_dict(), model.state_dict(), torch.float16)


def test_recast_of_a_pickled_variant_is_no_fix(tmp_path: Path, capsys) -> None:
    model = _tiny_bert()
    model.save_pretrained(tmp_path)
    save_torch_bin(model, tmp_path, variant="fp16")
    _, report = json_scan(capsys, str(tmp_path))
    found = [Fix.from_json(f["fix"]) for f in report["findings"] if f["code"] == "CG108"]
    assert len(found) == 1 and found[0] is not None and not found[0].available


# -- CG101/CG102 under --cast, CG103 under --to-config ------------------------------------------

def test_cast_that_overflows_bf16_is_refused_then_written_with_allow_lossy(tmp_path: Path, capsys) -> None:
    from transformers import BertForMaskedLM

    _tiny_bert(plant=3.4e38).save_pretrained(tmp_path)  # fp32, but rounds to inf in bf16 (max 3.3895e38)
    before = tree_state(tmp_path)
    code, report = fix_json(capsys, "--expect", "bf16", "--cast", "--replace", "--write", str(tmp_path))
    refused = outcome(report, "set-cast")
    assert code == 1 and not refused["ok"] and "CG201" in refused["error"] and not refused["written"]
    overflow = [f for f in refused["findings"] if f["code"] == "CG201"]
    assert len(overflow) == 1 and overflow[0]["severity"] == "error"
    assert overflow[0]["tensor"] == "bert.encoder.layer.0.output.dense.bias"
    assert tree_state(tmp_path) == before  # nothing written, nothing left behind

    code, report = fix_json(capsys, "--expect", "bf16", "--cast", "--replace", "--allow-lossy", "--write",
                            str(tmp_path))
    written = outcome(report, "set-cast")
    assert written["ok"] and [f["severity"] for f in written["findings"] if f["code"] == "CG201"] == ["warning"]
    assert "CG204" in {f["code"] for f in written["findings"]}  # the rounding every bf16 cast does, reported
    assert code == 0 and not codes(report) & {"CG101", "CG102", "CG103"}
    tensors = load_file(tmp_path / "model.safetensors")
    assert torch.isinf(tensors["bert.encoder.layer.0.output.dense.bias"][3])
    assert {n for n, t in tensors.items() if t.dtype == torch.float32} == {
        n for n in tensors if "layernorm" in n.lower()}  # keep-fp32 (*norm*) held in fp32
    assert_half_of({n: t for n, t in tensors.items() if t.dtype != torch.float32},
                   {n: t for n, t in load_file(tmp_path / "model.safetensors.orig").items()
                    if "layernorm" not in n.lower()}, torch.bfloat16)
    BertForMaskedLM.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)


@pytest.mark.parametrize("value, expect, code, refused", [
    (7e4, "fp16", "CG201", True),  # beyond fp16's max (65504): inf
    (1e-30, "fp16", "CG202", True),  # below fp16's smallest subnormal: a weight lost to zero
    (1e-44, "bf16", "CG202", True),  # an fp32 subnormal below bf16's smallest (9.2e-41)
    (float("nan"), "bf16", "CG203", False),  # already not a number: carried as it is, and said so
])
def test_what_a_narrowing_cast_would_lose_refuses_it(tmp_path: Path, capsys, value: float, expect: str, code: str,
                                                      refused: bool) -> None:
    weights = torch.randn(8, 8)
    weights[2, 5] = value
    save_file({"w": weights}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    before = tree_state(tmp_path)
    rc, report = fix_json(capsys, "--expect", expect, "--cast", "--replace", "--write", str(tmp_path))
    done = outcome(report, "set-cast")
    found = [f for f in done["findings"] if f["code"] == code]
    assert len(found) == 1 and found[0]["tensor"] == "w"
    assert found[0]["severity"] == ("error" if refused else "warning") and done["ok"] is not refused
    assert (tree_state(tmp_path) == before) is refused


def test_integer_tensors_are_carried_and_widening_needs_no_checks(tmp_path: Path, capsys) -> None:
    save_file({"w": torch.randn(4, 4, dtype=torch.bfloat16), "ids": torch.arange(6), "mask": torch.ones(3) > 0},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    code, report = fix_json(capsys, "--cast", "--replace", "--write", str(tmp_path))  # expect fp32 (the default)
    done = outcome(report, "set-cast")
    assert code == 0 and done["ok"] and not done["findings"]  # widening is exact: nothing read, nothing to report
    out, old = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "model.safetensors.orig")
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"], old["w"].float())
    assert torch.equal(out["ids"], old["ids"]) and out["ids"].dtype == torch.int64
    assert torch.equal(out["mask"], old["mask"]) and out["mask"].dtype == torch.bool


def test_to_config_casts_the_weights_to_the_declared_dtype(tmp_path: Path, capsys) -> None:
    from transformers import BertForMaskedLM

    model = _tiny_bert()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    key = "torch_dtype" if "torch_dtype" in config else "dtype"
    config[key] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    code, report = fix_json(capsys, "--expect", "config", "--to-config", "--replace", "--write", str(tmp_path))
    assert outcome(report, "set-cast")["ok"]
    assert code == 0 and not codes(report) & {"CG101", "CG102", "CG103"}
    assert json.loads((tmp_path / "config.json").read_text())[key] == "bfloat16"  # the weights moved, not the config
    loaded = BertForMaskedLM.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    assert_half_of(loaded.state_dict(), model.state_dict(), torch.bfloat16)
