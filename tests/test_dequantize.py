"""`convert --dequantize` (one family each): bitsandbytes, GPTQ, AWQ, HQQ, optimum-quanto, EETQ, BitNet.

Sources are written by the real libraries (``quant_writers``) or to the spec (``quant_spec_writers``);
every dequantized tensor is compared with the library's own dequantization of the same stored tensors
(bitsandbytes.functional, hqq's ``Quantizer.dequantize``, quanto's ``QTensor.dequantize``) or, where no
CPU library exists, with a reader someone else wrote: AutoGPTQ's torch unpacking (transcribed below from
``qlinear_cuda_old``: its ``wf`` shift tables, the 3-bit boundary fix-ups, ``zeros + 1``) and
compressed-tensors' AutoAWQ converter.  "Equal" is within one rounding step (ulp) of the reference's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("transformers")

import quant_writers as qw  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from guard.cli import main  # noqa: E402

# case -> (writer, options)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "bnb-nf4": ("write_bnb_4bit", {"quant_type": "nf4"}),
    "bnb-nf4-double": ("write_bnb_4bit", {"quant_type": "nf4", "double_quant": True}),
    "bnb-fp4-bf16-storage": ("write_bnb_4bit", {"quant_type": "fp4", "storage": "bfloat16"}),
    "bnb-nf4-fp32-storage-double": ("write_bnb_4bit", {"quant_type": "nf4", "storage": "float32",
                                                        "double_quant": True}),
    "bnb-8bit": ("write_bnb_8bit", {}),
    "hqq-4": ("write_hqq", {"nbits": 4}),
    "hqq-3": ("write_hqq", {"nbits": 3}),
    "hqq-2": ("write_hqq", {"nbits": 2}),
    "hqq-8": ("write_hqq", {"nbits": 8}),
    "quanto-qint4": ("write_quanto", {"weights": "qint4"}),
    "quanto-qint2": ("write_quanto", {"weights": "qint2"}),
    "quanto-qint8": ("write_quanto", {"weights": "qint8"}),
    "quanto-qfloat8": ("write_quanto", {"weights": "qfloat8"}),
    "gptq-v1": ("write_gptq", {"bits": 4}),
    "gptq-v2": ("write_gptq", {"bits": 4, "checkpoint_format": "gptq_v2"}),
    "gptq-desc-act": ("write_gptq", {"bits": 4, "desc_act": True, "group_size": 32}),
    "gptq-2bit": ("write_gptq", {"bits": 2, "group_size": 64}),
    "gptq-3bit": ("write_gptq_3bit", {}),
    "gptq-8bit": ("write_gptq", {"bits": 8}),
    "gptq-legacy-config": ("write_gptq", {"bits": 4, "legacy_config": True}),
    "awq-gemm": ("write_awq", {"group_size": 64}),
    "eetq": ("write_eetq", {}),
    "bitnet": ("write_bitnet", {}),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case's model, written once for the module (the writers load transformers and the quantizers)."""
    made: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in made:
            writer, options = CASES[case]
            write = globals()[writer] if writer in globals() else getattr(qw, writer)
            made[case] = write(tmp_path_factory.mktemp(case), **options)
        return made[case]

    return get  # type: ignore[return-value]


def _pack_stream(values: Any, bits: int, axis: int) -> Any:
    """Unsigned values as int32 words, a little-endian bit stream along ``axis`` (GPTQ's packing, any bits)."""
    moved = np.moveaxis(values.astype(np.uint64), axis, 0)
    words = np.zeros((moved.shape[0] * bits // 32, *moved.shape[1:]), np.uint64)
    for k in range(moved.shape[0]):
        word, offset = divmod(k * bits, 32)
        words[word] |= (moved[k] << np.uint64(offset)) & np.uint64(0xFFFFFFFF)
        if offset + bits > 32:
            words[word + 1] |= moved[k] >> np.uint64(32 - offset)
    return np.ascontiguousarray(np.moveaxis(words.astype(np.uint32).view(np.int32), 0, axis))


def write_gptq_3bit(out: Path) -> Path:
    """3-bit GPTQ (no CPU writer packs it; the to-spec writer packs 2/4/8): the 4-bit model's scales and
    g_idx with random 3-bit codes and zero points, packed 32 values per three int32s."""
    from safetensors.torch import save_file

    qw.write_gptq(out, bits=4, group_size=32, sym=False)
    rng = np.random.default_rng(3)
    tensors = load_file(str(out / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".qweight")]:
        prefix = name[: -len(".qweight")]
        rows, cols = tensors[name].shape[0] * 8, tensors[name].shape[1]
        groups = tensors[prefix + ".scales"].shape[0]
        tensors[name] = torch.from_numpy(_pack_stream(rng.integers(0, 8, (rows, cols)), 3, axis=0))
        tensors[prefix + ".qzeros"] = torch.from_numpy(_pack_stream(rng.integers(0, 8, (groups, cols)), 3, axis=1))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (out / "config.json").write_text(json.dumps(config))
    return out


def convert(*args: object) -> int:
    return main(["convert", *map(str, args)])


def modules(folder: Path) -> tuple[Any, Any]:
    from guard.inventory import discover_models, load_local_model
    from guard.inventory.quantization import quantized_modules

    inventory = load_local_model(discover_models([folder])[0])
    return inventory.quantization(), quantized_modules(inventory, inventory.primary)


def assert_within_one_step(mine: Any, reference: Any) -> None:
    """``mine`` rounded once to the reference's dtype is at most one step (ulp) from the reference."""
    ref = reference.detach().cpu().contiguous()
    ours = mine.detach().cpu().to(ref.dtype).contiguous()
    assert tuple(ours.shape) == tuple(ref.shape)
    view = torch.int32 if ref.dtype == torch.float32 else torch.int16
    steps = (ours.view(view).long() - ref.view(view).long()).abs()
    agree = ((torch.signbit(ours) == torch.signbit(ref)) & (steps <= 1)) | ((ours == 0) & (ref == 0))
    assert bool(agree.all()), (f"{int((~agree).sum())} elements differ, "
                               f"max {float((ours.float() - ref.float()).abs().max())}")


# ---------------------------------------------------------------- references: the libraries' own code


def _bnb(stored: dict[str, Any], module: Any) -> Any:
    import bitsandbytes.functional as F

    if "SCB" in module.components:
        return F.int8_vectorwise_dequant(stored[module.payload], stored[module.components["SCB"]])
    prefix = module.payload + "."
    state = F.QuantState.from_dict({k[len(prefix):]: v for k, v in stored.items() if k.startswith(prefix)},
                                   device=torch.device("cpu"))
    return F.dequantize_4bit(stored[module.payload], state)


def _hqq(stored: dict[str, Any], module: Any) -> Any:
    from hqq.core.quantize import Quantizer

    meta = {k[len(module.prefix) + 1:]: v for k, v in stored.items() if k.startswith(module.prefix + ".")}

    def text(key: str) -> str:
        return bytes(meta[key].numpy()).decode()

    record = {"shape": tuple(meta["shape"].tolist()), "nbits": int(meta["nbits"]), "axis": int(meta["axis"]),
              "group_size": int(meta["group_size"]), "packing": text("packing"),
              "view_as_float": bool(meta["view_as_float"]), "zero": meta["zero"], "scale": meta["scale"],
              "unpack_view_dtype": getattr(torch, text("unpack_view_dtype").split(".")[1]),
              "compute_dtype": getattr(torch, text("compute_dtype").split(".")[1])}
    return Quantizer.dequantize(meta["W_q"], record)


_QUANTO: dict[Path, Any] = {}


def _quanto(stored: dict[str, Any], module: Any, folder: Path) -> Any:
    """quanto's ``dequantize`` of the serialized (kernel-agnostic) tensor: on CPU a bf16 qint4 weight loads
    as TinyGemm's repacked layout, whose scale/shift are re-derived, so the stored tensors are rebuilt as the
    plain ``WeightQBitsTensor`` quanto serializes."""
    from optimum.quanto import QuantizedModelForCausalLM, qint2, qint4
    from optimum.quanto.tensor.packed import PackedTensor
    from optimum.quanto.tensor.weights.qbits import WeightQBitsTensor

    if folder not in _QUANTO:
        _QUANTO[folder] = QuantizedModelForCausalLM.from_pretrained(str(folder))._wrapped
    weight = _QUANTO[folder].get_submodule(module.prefix).weight
    if module.payload.endswith("._data._data"):
        scale, shift = stored[module.components["scales"]], stored[module.components["zeros"]]
        packed = stored[module.payload]
        grouped = (scale.shape[0], packed.shape[1])
        qtype = qint4 if weight.qtype.bits == 4 else qint2
        data = PackedTensor(packed, qtype.bits, grouped, (grouped[1], 1))
        weight = WeightQBitsTensor(qtype, 0, weight._group_size, weight.size(), weight.stride(), data, scale, shift)
    return weight.dequantize().detach()


_WF = {3: torch.tensor([[0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0], [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
                        [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0]], dtype=torch.int32).reshape(1, 3, 12)}


def _autogptq(stored: dict[str, Any], module: Any, bits: int, v1: bool) -> Any:
    """AutoGPTQ ``qlinear_cuda_old`` (torch path), transcribed: returns the Linear weight ``[out, in]``."""
    qweight, qzeros = stored[module.payload], stored[module.components["zeros"]]
    scales = stored[module.components["scales"]]
    g_idx = stored[module.components["g_idx"]].long()
    if bits in (2, 4, 8):
        wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
        zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0))
        zeros = torch.bitwise_and(zeros.to(torch.int16 if bits == 8 else torch.int8), 2**bits - 1)
        zeros = zeros.reshape(scales.shape)
        weight = torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1))
        weight = torch.bitwise_and(weight.to(torch.int16 if bits == 8 else torch.int8), 2**bits - 1)
    else:
        wf = _WF[3]
        zeros = qzeros.reshape(qzeros.shape[0], qzeros.shape[1] // 3, 3, 1).expand(-1, -1, -1, 12)
        zeros = zeros >> wf.unsqueeze(0)
        zeros[:, :, 0, 10] = (zeros[:, :, 0, 10] & 0x3) | ((zeros[:, :, 1, 0] << 2) & 0x4)
        zeros[:, :, 1, 11] = (zeros[:, :, 1, 11] & 0x1) | ((zeros[:, :, 2, 0] << 1) & 0x6)
        zeros = zeros & 0x7
        zeros = torch.cat([zeros[:, :, 0, :11], zeros[:, :, 1, 1:12], zeros[:, :, 2, 1:11]], dim=2)
        zeros = zeros.reshape(scales.shape)
        weight = qweight.reshape(qweight.shape[0] // 3, 3, 1, qweight.shape[1]).expand(-1, -1, 12, -1)
        weight = (weight >> wf.unsqueeze(-1)) & 0x7
        weight[:, 0, 10] = (weight[:, 0, 10] & 0x3) | ((weight[:, 1, 0] << 2) & 0x4)
        weight[:, 1, 11] = (weight[:, 1, 11] & 0x1) | ((weight[:, 2, 0] << 1) & 0x6)
        weight = weight & 0x7
        weight = torch.cat([weight[:, 0, :11], weight[:, 1, 1:12], weight[:, 2, 1:11]], dim=1)
    if v1:
        zeros = zeros + 1
    weight = weight.reshape(-1, weight.shape[-1])
    return (scales[g_idx] * (weight - zeros[g_idx])).T


def _awq(stored: dict[str, Any], module: Any, group_size: int) -> Any:
    """compressed-tensors' AutoAWQ converter unpacks and reorders; AutoAWQ's ``(q - z) * s`` in fp16."""
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter

    q, z = AutoAWQConverter.unpack_awq(stored[module.payload], stored[module.components["zeros"]], 4)
    q, z = AutoAWQConverter.reverse_awq_order(q, z, 4)
    q, z = torch.bitwise_and(q, 15).int(), torch.bitwise_and(z, 15).int()
    scales = stored[module.components["scales"]]
    z = z.repeat_interleave(group_size, dim=0)
    s = scales.repeat_interleave(group_size, dim=0)
    return ((q - z).half() * s).T


def _bitnet(stored: dict[str, Any], module: Any) -> Any:
    from transformers.integrations.bitnet import unpack_weights

    return unpack_weights(stored[module.payload], torch.float32) / stored[module.components["scales"]].float()


def reference(case: str, folder: Path, module: Any, stored: dict[str, Any], quant: Any) -> Any:
    family = case.split("-")[0]
    if family == "bnb":
        return _bnb(stored, module)
    if family == "hqq":
        return _hqq(stored, module)
    if family == "quanto":
        return _quanto(stored, module, folder)
    if family == "gptq":
        return _autogptq(stored, module, quant.bits, quant.format != "gptq_v2")
    if family == "awq":
        return _awq(stored, module, quant.group_size)
    if family == "eetq":  # no CPU library: transformers' EetqLinear layout, weight [in, out] x per-row scale
        return (stored[module.payload].float().T * stored[module.components["scales"]].float()[:, None]).half()
    return _bitnet(stored, module)


def _stored(folder: Path) -> dict[str, Any]:
    tensors: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("case", list(CASES))
def test_dequantize_equals_the_library(sources: Any, tmp_path: Path, case: str) -> None:
    """fp32 output, tensor by tensor, against the reference; unquantized tensors come through bit-exactly."""
    src = sources(case)
    out = tmp_path / "out"
    assert convert(src, "--to", "torch", "--out", out, "--dequantize", "--dtype", "fp32") == 0
    quant, found = modules(src)
    stored, written = _stored(src), load_file(str(out / "model.safetensors"))
    assert found
    for module in found:
        assert_within_one_step(written[module.weight], reference(case, src, module, stored, quant))
    consumed = {n for m in found for n in (m.payload, *m.components.values())}
    for name, tensor in stored.items():
        if name not in consumed:
            assert torch.equal(written[name], tensor.float()), name  # a widening cast is exact
    assert set(written) == {m.weight for m in found} | (set(stored) - consumed)


@pytest.mark.parametrize("case", ["bnb-nf4-double", "bnb-8bit", "bnb-fp4-bf16-storage"])
def test_bnb_equals_transformers_dequantize(sources: Any, tmp_path: Path, case: str) -> None:
    """transformers' own ``model.dequantize()`` (bitsandbytes' CPU kernels), bf16: bit for bit."""
    from transformers import AutoModelForCausalLM

    src = sources(case)
    assert convert(src, "--to", "torch", "--out", tmp_path / "out", "--dequantize", "--dtype", "bf16") == 0
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.dequantize()
    expected = model.state_dict()
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    for name, tensor in written.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name


@pytest.mark.parametrize("case", ["bnb-nf4-double", pytest.param("hqq-4", marks=pytest.mark.transformers4),
                                  "quanto-qint4", "gptq-desc-act", "awq-gemm", "bitnet"])
def test_output_loads_in_transformers(sources: Any, tmp_path: Path, case: str) -> None:
    """bf16 safetensors: no quantization record left, the dtype says bf16, strict load of every key."""
    from transformers import AutoModelForCausalLM

    src = sources(case)
    out = tmp_path / "out"
    assert convert(src, "--to", "torch", "--out", out, "--dequantize", "--dtype", "bf16") == 0
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and "quantization" not in config
    assert config.get("torch_dtype", config.get("dtype")) == "bfloat16"
    assert not any((out / name).exists() for name in ("quanto_qmap.json", "quantize_config.json"))
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype="auto")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.dtype == torch.bfloat16


def test_flax_and_orbax_outputs_load(sources: Any, tmp_path: Path) -> None:
    """--to flax: FlaxLlamaForCausalLM loads it with nothing missing; Orbax restores the same tree."""
    from flax.traverse_util import flatten_dict
    from test_convert import flax_load_keys  # transformers 4's Flax loader, in .venv-tf4 under transformers 5

    src = sources("gptq-v1")
    flax_dir, orbax_dir = tmp_path / "flax", tmp_path / "orbax"
    assert convert(src, "--to", "flax", "--out", flax_dir, "--dequantize", "--dtype", "fp32") == 0
    assert "quantization_config" not in json.loads((flax_dir / "config.json").read_text())
    loaded, template = flax_load_keys(flax_dir, "FlaxAutoModelForCausalLM", init=True)  # as before the move
    assert loaded == template
    assert convert(src, "--to", "flax", "--layout", "orbax", "--out", orbax_dir, "--dequantize", "--dtype",
                   "fp32") == 0
    import orbax.checkpoint as ocp

    restored = flatten_dict(ocp.StandardCheckpointer().restore(orbax_dir.resolve()))
    from flax.serialization import msgpack_restore

    params = flatten_dict(msgpack_restore((flax_dir / "flax_model.msgpack").read_bytes()))
    assert set(restored) == set(params)
    for key, value in params.items():
        assert np.array_equal(np.asarray(restored[key]), np.asarray(value)), key


def test_parity_runs_on_the_result(sources: Any, tmp_path: Path) -> None:
    pytest.importorskip("guard.parity")
    src = sources("hqq-4")
    report = tmp_path / "report.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "out", "--dequantize", "--dtype", "fp32", "--parity",
                   "--format", "json", "-o", report) == 0
    extra = json.loads(report.read_text())["extra"]
    assert extra["conversion"]["dequantized"]["method"] == "hqq"
    assert "parity" in extra


@pytest.mark.parametrize("case", ["bnb-nf4", "bnb-8bit", "hqq-4", "quanto-qint4", "gptq-v1", "awq-gemm", "eetq",
                                  "bitnet"])
def test_plain_convert_refuses_in_one_line(sources: Any, tmp_path: Path, case: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = sources(case)
    quant, _ = modules(src)
    assert convert(src, "--to", "flax", "--out", tmp_path / "out") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-guard")]
    assert len(err) == 1 and "--dequantize" in err[0] and quant.method in err[0], err
    assert not (tmp_path / "out").exists()


def test_dequantize_of_a_full_precision_model_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "plain"
    qw.tiny_llama().save_pretrained(src)
    assert convert(src, "--to", "torch", "--out", tmp_path / "out", "--dequantize") == 2
    assert not (tmp_path / "out").exists()


def test_dtype_keep_takes_the_config_dtype(sources: Any, tmp_path: Path) -> None:
    """Without --dtype the copy is in the config's compute dtype, every floating tensor one cast."""
    src = sources("gptq-v2")  # fp16 config
    assert convert(src, "--to", "torch", "--out", tmp_path / "out", "--dequantize") == 0
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {t.dtype for t in written.values()} == {torch.float16}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config.get("torch_dtype", config.get("dtype")) == "float16"


# planted defect -> the finding's code; every one is refused before anything reaches --out (exit 1)
PLANTS = {
    ("bnb-nf4", "plant_missing_scale"): "CG110",
    ("bnb-nf4-double", "plant_nan_scales"): "CG205",
    ("bnb-nf4", "plant_corrupt_quant_state"): "CG110",
    ("bnb-nf4", "plant_truncated_payload"): "CG111",
    ("bnb-8bit", "plant_nan_scales"): "CG205",
    ("gptq-v1", "plant_missing_scale"): "CG110",
    ("gptq-v1", "plant_truncated_payload"): "CG111",
    ("gptq-v1", "plant_wrong_bits"): "CG111",
    ("gptq-v1", "plant_nan_scales"): "CG205",
    ("awq-gemm", "plant_nan_scales"): "CG205",
    ("awq-gemm", "plant_truncated_payload"): "CG111",
    ("hqq-4", "plant_nan_scales"): "CG205",
    ("hqq-4", "plant_truncated_payload"): "CG111",
    ("quanto-qint4", "plant_nan_scales"): "CG205",
    ("quanto-qint8", "plant_missing_scale"): "CG110",
    ("eetq", "plant_nan_scales"): "CG205",
    ("bitnet", "plant_nan_scales"): "CG205",
}


@pytest.mark.parametrize(("case", "plant"), list(PLANTS))
def test_planted_defects_are_refused(sources: Any, tmp_path: Path, case: str, plant: str) -> None:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(sources(case), src)
    broken = getattr(qw, plant)(src)
    report = tmp_path / "report.json"
    code = convert(src, "--to", "torch", "--out", tmp_path / "out", "--dequantize", "--format", "json", "-o", report)
    assert code == 1
    findings = json.loads(report.read_text())["findings"]
    errors = [f for f in findings if f["severity"] == "error"]
    assert PLANTS[(case, plant)] in {f["code"] for f in errors}, (broken, errors)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.partial-*"))


def test_sharded_source_and_output(tmp_path: Path) -> None:
    """A quantized model saved in shards (index + files) dequantizes into shards under --max-shard-size."""
    import torch as _torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    base = tmp_path / "base"
    qw.tiny_llama().save_pretrained(base)
    src = tmp_path / "sharded"
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    AutoModelForCausalLM.from_pretrained(base, quantization_config=config, dtype=_torch.bfloat16).save_pretrained(
        src, max_shard_size="200KB")
    assert (src / "model.safetensors.index.json").is_file()
    out = tmp_path / "out"
    assert convert(src, "--to", "torch", "--out", out, "--dequantize", "--dtype", "bf16", "--max-shard-size",
                   "300KB") == 0
    assert (out / "model.safetensors.index.json").is_file()
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, dtype="auto")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    reference = AutoModelForCausalLM.from_pretrained(src, dtype=_torch.bfloat16)
    reference.dequantize()
    expected = reference.state_dict()
    for name, tensor in model.state_dict().items():
        assert _torch.equal(tensor, expected[name].to(tensor.dtype)), name


@pytest.mark.parametrize("shape", [(7, 9), (5, 6), (6, 6), (300, 70)])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bnb_4bit_odd_sizes_and_partial_blocks(shape: tuple[int, int], quant_type: str) -> None:
    """Element counts that are odd, or end inside a byte pair or a block: bitsandbytes' own quantize_4bit."""
    from types import SimpleNamespace

    import bitsandbytes.functional as F

    from guard.convert.read.dequant import bnb

    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    packed, state = F.quantize_4bit(weight, blocksize=64, quant_type=quant_type)
    stored = {f"w.{k}": v for k, v in state.as_dict(packed=True).items()}
    stored["w"] = packed
    components = {"absmax": "w.absmax", "quant_map": "w.quant_map",
                  "quant_state": f"w.quant_state.bitsandbytes__{quant_type}"}
    module = SimpleNamespace(prefix="m", payload="w", weight="m.weight", components=components,
                             logical_shape=None, bits=4, group_size=None, format=quant_type)
    mine = bnb.dequantize(module, None, lambda name: stored[name].numpy())["m.weight"]
    assert_within_one_step(torch.from_numpy(mine), F.dequantize_4bit(packed, state))


@pytest.mark.parametrize("case", ["bnb-nf4", "bnb-nf4-double"])
def test_read_back_recomputes_only_the_sampled_elements(sources: Any, tmp_path: Path, case: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """bnb 4-bit's read-back check recomputes its samples from the source's bytes (bnb.elements), bit for bit
    what ``dequantize`` makes, and no module is dequantized twice; a value changed between the dequantizer
    and the file is still CG301, nothing written."""
    from types import SimpleNamespace

    from guard.convert.read.dequant import bnb, source

    src = sources(case)
    quant, found = modules(src)
    calls = [0]
    real_arrays, real_load = source._Modules.arrays, source._ModuleLoader.load

    def counting(self: Any, module: Any) -> Any:
        calls[0] += self.current[0] is not module
        return real_arrays(self, module)

    monkeypatch.setattr(source._Modules, "arrays", counting)
    assert convert(src, "--to", "torch", "--out", tmp_path / "out", "--dequantize", "--dtype", "bf16") == 0
    assert calls[0] == len(found)

    def tampered(self: Any, info: Any) -> Any:
        array = real_load(self, info).copy()
        array.reshape(-1)[0] += np.float32(1.0)
        return array

    monkeypatch.setattr(source._ModuleLoader, "load", tampered)
    report = tmp_path / "report.json"
    assert convert(src, "--to", "torch", "--out", tmp_path / "bad", "--dequantize", "--dtype", "bf16",
                   "--format", "json", "-o", report) == 1
    assert "CG301" in {f["code"] for f in json.loads(report.read_text())["findings"] if f["severity"] == "error"}
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad.partial-*"))
    # elements() against the whole module, every element
    stored = _stored(src)
    by_name = {n: SimpleNamespace(dtype="U8" if t.dtype == torch.uint8 else "X", shape=tuple(t.shape))
               for n, t in stored.items()}

    def read(name: str) -> Any:
        return stored[name].numpy() if stored[name].dtype != torch.bfloat16 else stored[name].float().numpy()

    read.info = by_name.__getitem__  # type: ignore[attr-defined]
    read.elements = lambda name, flat: read(name).reshape(-1)[flat]  # type: ignore[attr-defined]
    for module in found:
        whole = bnb.dequantize(module, quant, read)[module.weight].reshape(-1)
        got = bnb.elements(module, quant, read, module.weight, list(range(whole.size)))
        assert got is not None and np.array_equal(got.view(np.uint32), whole.view(np.uint32)), module.weight
