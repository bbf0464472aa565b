"""convert: real transformers models built in tmp_path, converted both ways, loaded by transformers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax.serialization import msgpack_restore  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from legacy_env import here_has_flax_transformers, legacy_python  # noqa: E402
from safetensors import safe_open  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.samples import save_torch_bin  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("CI", "true")


def tiny_mistral(tmp: Path, *, dtype: torch.dtype = torch.bfloat16, **save: object) -> Path:
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    model = transformers.MistralForCausalLM(config).to(dtype)
    out = tmp / "mistral"
    if save.pop("safe_serialization", True):
        model.save_pretrained(out, **save)
    else:  # pytorch_model.bin as transformers 4 wrote it (5 writes safetensors only)
        save_torch_bin(model, out, **save)  # type: ignore[arg-type]
    return out


TINY = {
    "bert": lambda: transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2)),
    "vit": lambda: transformers.ViTModel(transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, image_size=8,
        patch_size=4)),
}


def tiny_bart(tmp: Path) -> Path:
    """The seed case: an fp16 decoder saved next to an fp32 encoder."""
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    model = transformers.BartForConditionalGeneration(config)
    model.model.decoder.half()
    out = tmp / "bart"
    model.save_pretrained(out)
    return out


def safetensors_bits(directory: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                t = fh.get_tensor(name)
                out[name] = (str(t.dtype), tuple(t.shape),
                             t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return out


def flax_params(directory: Path) -> dict[tuple[str, ...], np.ndarray]:
    params: dict[tuple[str, ...], np.ndarray] = {}
    for path in sorted(directory.glob("flax_model*.msgpack")):
        params.update(flatten_dict(msgpack_restore(path.read_bytes())))
    return params


# transformers 4's Flax loader on a converted folder: the keys it loads and its class's template keys
FLAX_LOAD = """
import json, sys
import transformers
from flax.traverse_util import flatten_dict
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
cls = getattr(transformers, sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else "Flax" + config.architectures[0])
init = len(sys.argv) > 3 and sys.argv[3] == "init"
params = cls.from_pretrained(sys.argv[1]).params if init else cls.from_pretrained(sys.argv[1], _do_init=False)[1]
template = (cls.from_config if cls.__name__.startswith("FlaxAuto") else cls)(config, _do_init=False).params_shape_tree
print(json.dumps([sorted(flatten_dict(params)), sorted(flatten_dict(template))]))
"""


def flax_load_keys(directory: Path, cls_name: str | None = None, *,
                   init: bool = False) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(loaded, template) as transformers 4's Flax class (``cls_name``, else the config's architecture's
    twin) sees ``directory`` (``init``: what it initializes for missing keys counts as loaded): in this
    process while its transformers has the Flax classes, else in the transformers-4 environment (.venv-tf4)."""
    if here_has_flax_transformers():
        config = transformers.AutoConfig.from_pretrained(directory)
        cls = getattr(transformers, cls_name or "Flax" + config.architectures[0])
        params = cls.from_pretrained(directory).params if init else cls.from_pretrained(directory, _do_init=False)[1]
        template = (cls.from_config if cls.__name__.startswith("FlaxAuto") else cls)(config, _do_init=False)
        return set(flatten_dict(params)), set(flatten_dict(template.params_shape_tree))
    args = [str(directory), cls_name or "", "init" if init else ""]
    done = subprocess.run([str(legacy_python()), "-c", FLAX_LOAD, *args], capture_output=True, text=True,
                          env={**os.environ, "USE_TF": "0"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, template = json.loads(done.stdout.strip().splitlines()[-1])
    return {tuple(k) for k in loaded}, {tuple(k) for k in template}


def flax_template_keys(directory: Path) -> set[tuple[str, ...]]:
    return flax_load_keys(directory)[1]


def assert_flax_loads(directory: Path) -> dict[tuple[str, ...], np.ndarray]:
    """transformers' own loader accepts it, and the file holds exactly the model's parameter tree."""
    loaded, template = flax_load_keys(directory)
    assert loaded == template
    file_params = flax_params(directory)
    assert set(file_params) == loaded
    return file_params


def assert_torch_loads(directory: Path) -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(directory)
    cls = getattr(transformers, config.architectures[0])
    model, info = cls.from_pretrained(directory, output_loading_info=True, dtype="auto")
    # lists under transformers 4, sets under 5
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
    return model


def convert(*args: object) -> int:
    return main(["convert", *map(str, args)])


def test_mistral_bf16_round_trip_is_bit_exact(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    flax_dir, back = tmp_path / "flax", tmp_path / "back"
    assert convert(src, "--to", "flax", "--out", flax_dir) == 0
    params = assert_flax_loads(flax_dir)
    assert {a.dtype.name for a in params.values()} == {"bfloat16"}
    original = safetensors_bits(src)
    q = original["model.layers.0.self_attn.q_proj.weight"]
    kernel = params[("model", "layers", "0", "self_attn", "q_proj", "kernel")]
    assert np.ascontiguousarray(kernel.T).view(np.uint8).tobytes() == q[2]  # Linear: transposed, same bits
    assert json.loads((flax_dir / "config.json").read_text())["torch_dtype" if "torch_dtype" in json.loads(
        (src / "config.json").read_text()) else "dtype"] == "bfloat16"
    assert (flax_dir / "generation_config.json").is_file()

    assert convert(flax_dir, "--to", "torch", "--out", back) == 0
    assert safetensors_bits(back) == original
    model = assert_torch_loads(back)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_nan_payloads_survive_both_ways(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path, dtype=torch.float32)
    path = src / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    w = tensors["model.norm.weight"].to(torch.bfloat16)
    w.view(torch.int16)[0] = 0x7F81  # a signalling-NaN payload an fp32 bridge would not keep
    w.view(torch.int16)[1] = -1  # 0xFFFF
    tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()} | {"model.norm.weight": w}
    save_file(tensors, path, metadata={"format": "pt"})
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert safetensors_bits(tmp_path / "b") == safetensors_bits(src)


@pytest.mark.parametrize("kind", sorted(TINY))
def test_round_trip_loads_in_transformers(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(0)
    TINY[kind]().save_pretrained(tmp_path / "src")
    report = tmp_path / "r.json"
    assert convert(tmp_path / "src", "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 0
    conversion = json.loads(report.read_text())["extra"]["conversion"]
    assert conversion["mapping"] == "rules"
    if kind == "t5":  # FlaxT5 calls jnp.clip(a_max=), gone from jax 0.10: its loader cannot run here
        params = flax_params(tmp_path / "f")  # test_convert_families.py loads it with the old keyword restored
        assert ("encoder", "final_layer_norm", "weight") in params  # FlaxT5LayerNorm's name, not `scale`
    else:
        params = assert_flax_loads(tmp_path / "f")
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert_torch_loads(tmp_path / "b")
    original, back = safetensors_bits(tmp_path / "src"), safetensors_bits(tmp_path / "b")
    assert back == original
    if kind == "vit":  # Conv2d [O, I, kH, kW] -> Flax [kH, kW, I, O]
        conv = params[("embeddings", "patch_embeddings", "projection", "kernel")]
        assert conv.shape == (4, 4, 3, 16)


def test_bart_mixed_fp16_fp32_to_uniform_fp32(tmp_path: Path) -> None:
    src = tiny_bart(tmp_path)
    out = tmp_path / "f"
    assert convert(src, "--to", "flax", "--out", out, "--dtype", "fp32", "--format", "json",
                   "-o", tmp_path / "r.json") == 0
    params = assert_flax_loads(out)
    assert {a.dtype.name for a in params.values()} == {"float32"}
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["extra"]["conversion"]["casts"].get("F16->F32", 0) > 0
    assert json.loads((out / "config.json").read_text()).get("torch_dtype", "float32") == "float32"


def test_bf16_with_fp32_norms(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path, dtype=torch.float32)
    out = tmp_path / "f"
    assert convert(src, "--to", "flax", "--out", out, "--dtype", "bf16", "--keep-fp32", "*norm*") == 0
    params = assert_flax_loads(out)
    for key, array in params.items():
        want = "float32" if "norm" in "/".join(key) else "bfloat16"
        assert array.dtype.name == want, key


def test_sharded_in_and_out(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path, max_shard_size="4KB")
    assert (src / "model.safetensors.index.json").is_file()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--max-shard-size", "4KB") == 0
    index = json.loads((tmp_path / "f" / "flax_model.msgpack.index.json").read_text())
    assert "model/embed_tokens/embedding" in index["weight_map"]
    assert len(set(index["weight_map"].values())) > 1
    assert_flax_loads(tmp_path / "f")
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b", "--max-shard-size", "4KB") == 0
    assert (tmp_path / "b" / "model.safetensors.index.json").is_file()
    assert safetensors_bits(tmp_path / "b") == safetensors_bits(src)
    assert_torch_loads(tmp_path / "b")


@pytest.mark.parametrize("layout", ["zip", "legacy", "sharded"])
def test_torch_bin_inputs(tmp_path: Path, layout: str) -> None:
    src = tiny_mistral(tmp_path, safe_serialization=False, **({"max_shard_size": "4KB"} if layout == "sharded" else {}))
    if layout == "legacy":
        state = torch.load(src / "pytorch_model.bin", weights_only=True)
        torch.save(state, src / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    reference = tiny_mistral(tmp_path / "ref")
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert_flax_loads(tmp_path / "f")
    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    assert safetensors_bits(tmp_path / "b") == safetensors_bits(reference)


def test_fp16_overflow_refused_unless_lossy(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path, dtype=torch.float32)
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    tensors["model.embed_tokens.weight"][0, 0] = 1.0e5
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--dtype", "fp16", "-f", "json", "-o", report) == 1
    assert not (tmp_path / "f").exists()
    found = json.loads(report.read_text())["findings"]
    assert [(f["code"], f["tensor"]) for f in found] == [("CG201", "model/embed_tokens/embedding")]
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "--dtype", "fp16", "--allow-lossy") == 0
    assert np.isinf(flax_params(tmp_path / "f")[("model", "embed_tokens", "embedding")][0, 0])


@pytest.mark.parametrize("case", ["bart-fp32", "mistral-bf16", "mistral-bf16-fp32-norms"])
def test_parity_after_convert(tmp_path: Path, case: str) -> None:
    """The seeds' cases end to end; run last, as parity belongs to its own module."""
    pytest.importorskip("guard.parity")
    if case == "bart-fp32":
        src, flags = tiny_bart(tmp_path), ["--dtype", "fp32"]
    elif case == "mistral-bf16":
        src, flags = tiny_mistral(tmp_path), []
    else:
        src, flags = tiny_mistral(tmp_path, dtype=torch.float32), ["--dtype", "bf16", "--keep-fp32", "*norm*"]
    report = tmp_path / "r.json"
    code = convert(src, "--to", "flax", "--out", tmp_path / "f", *flags, "--parity", "-f", "json", "-o", report)
    data = json.loads(report.read_text())
    assert "parity" in data["extra"]
    assert code == 0, data["findings"]
