"""``scan --values`` on quantized sets: CG205 (invalid scales) and CG206 (saturated FP8 payloads).

The sets are written by the libraries (compressed-tensors' own ModelCompressor on a tiny Llama) or,
where no CPU writer exists (gpt-oss MXFP4, DeepSeek-style block FP8), to the spec; the defects are
planted in the written files afterwards, byte for byte, as a broken upload would carry them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytest.importorskip("compressed_tensors")

from guard.config import Policy  # noqa: E402
from guard.inventory import discover_models, load_local_model  # noqa: E402
from guard.values.check import value_findings  # noqa: E402

DOWN = "model.layers.0.mlp.down_proj"


def write_compressed_fp8(out: Path, *, strategy: str = "channel") -> Path:
    """compressed-tensors float-quantized, through its own ModelCompressor (test_dequantize_formats' writer)."""
    from test_dequantize_formats import write_compressed_tensors

    return write_compressed_tensors(out, "fp8" if strategy == "channel" else "fp8-tensor")


def plant(path: Path, name: str, change: Callable[[Any], None]) -> None:
    """Rewrite one tensor's bytes in a safetensors file (``change`` edits a uint8/typed numpy view in place)."""
    data = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    start, end = header[name]["data_offsets"]
    base = 8 + size
    view = np.frombuffer(memoryview(data)[base + start:base + end], dtype=np.uint8)
    change(view)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(data))
    tmp.replace(path)


def findings(folder: Path) -> list[tuple[str, str | None, str]]:
    inv = load_local_model(discover_models([folder])[0])
    return sorted((f.code, f.tensor, f.message) for f in value_findings(inv, Policy()).findings
                  if f.code in ("CG205", "CG206"))


def bf16_bits(value: float) -> int:
    return int(torch.tensor([value], dtype=torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def set_bf16(index: int, value: float) -> Callable[[Any], None]:
    def change(view: Any) -> None:
        view.view(np.uint16)[index] = bf16_bits(value)
    return change


# ------------------------------------------------------------------------------------------- scales


def test_a_clean_compressed_tensors_fp8_model_has_no_finding(tmp_path: Path) -> None:
    assert findings(write_compressed_fp8(tmp_path / "fp8")) == []


@pytest.mark.parametrize("value,words", [(float("nan"), "1 NaN"), (float("inf"), "1 Inf"), (-0.01, "1 negative")])
def test_a_nan_inf_or_negative_scale_is_cg205_naming_the_tensor(tmp_path: Path, value: float, words: str) -> None:
    folder = write_compressed_fp8(tmp_path / "fp8")
    plant(folder / "model.safetensors", f"{DOWN}.weight_scale", set_bf16(7, value))
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG205", f"{DOWN}.weight_scale")]
    assert words in found[0][2] and f"'{DOWN}.weight_scale'" in found[0][2]


def test_a_zero_row_scale_is_legal_a_zero_tensor_scale_is_not(tmp_path: Path) -> None:
    """A zero group scale encodes an all-zero group (pruned rows); a zero per-tensor scale zeroes a whole layer."""
    folder = write_compressed_fp8(tmp_path / "rows")
    plant(folder / "model.safetensors", f"{DOWN}.weight_scale", set_bf16(3, 0.0))
    assert findings(folder) == []
    folder = write_compressed_fp8(tmp_path / "tensor", strategy="tensor")
    assert findings(folder) == []
    plant(folder / "model.safetensors", f"{DOWN}.weight_scale", set_bf16(0, 0.0))
    assert [(code, tensor) for code, tensor, _ in findings(folder)] == [("CG205", f"{DOWN}.weight_scale")]


def test_an_e8m0_scale_of_0xff_in_gpt_oss_is_cg205(tmp_path: Path) -> None:
    from quant_spec_writers import write_mxfp4

    folder = write_mxfp4(tmp_path / "gpt-oss")
    assert findings(folder) == []
    name = "model.layers.0.mlp.experts.down_proj_scales"

    def nan_scales(view: Any) -> None:
        view[[0, 5, 9]] = 0xFF

    plant(folder / "model.safetensors", name, nan_scales)
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG205", name)]
    assert "3 E8M0 scale byte(s)" in found[0][2] and "0xFF" in found[0][2]


# --------------------------------------------------------------------------------------- saturation


def write_deepseek_fp8(out: Path, *, bare_cast: bool = False) -> Path:
    """A tiny Llama in DeepSeek-V3's FP8 layout (``quant_method: fp8``, 128x128 block scales, ``weight_scale_inv``),
    quantized as DeepSeek's ``weight_quant`` does; ``bare_cast``: the weights (x 30000) clamped to E4M3 with no
    scale, scale_inv 1.0, which is what a cast with no scaling leaves."""
    from quant_writers import tiny_llama
    from safetensors.torch import save_file
    from test_dequantize_formats import _deepseek_fp8

    model = tiny_llama()
    tensors: dict[str, Any] = {}
    for name, value in model.state_dict().items():
        if name.endswith("_proj.weight"):
            if bare_cast:
                tensors[name] = (value.float() * 30000).clamp(-448, 448).to(torch.float8_e4m3fn)
                tensors[name.replace(".weight", ".weight_scale_inv")] = torch.ones(
                    -(-value.shape[0] // 128), -(-value.shape[1] // 128))
            else:
                _, quantized, scale_inv = _deepseek_fp8(*value.shape)
                tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = quantized, scale_inv
        else:
            tensors[name] = value.contiguous()
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_block_scaled_fp8_is_not_saturated(tmp_path: Path) -> None:
    assert findings(write_deepseek_fp8(tmp_path / "ds")) == []


def test_a_bare_fp8_cast_is_cg206_on_each_saturated_payload(tmp_path: Path) -> None:
    found = findings(write_deepseek_fp8(tmp_path / "ds", bare_cast=True))
    saturated = {tensor for code, tensor, _ in found if code == "CG206"}
    assert f"{DOWN}.weight" in saturated
    assert all(tensor.endswith("_proj.weight") for tensor in saturated)
    message = next(m for code, tensor, m in found if tensor == f"{DOWN}.weight")
    assert "±448" in message and "the format's maximum" in message


def test_planted_saturation_in_a_compressed_tensors_payload_is_cg206(tmp_path: Path) -> None:
    """3% of one payload's values set to ±448 (0x7E / 0xFE): far past one value a row at the maximum."""
    folder = write_compressed_fp8(tmp_path / "fp8")

    def saturate(view: Any) -> None:
        chosen = np.random.default_rng(0).choice(view.size, size=view.size * 3 // 100, replace=False)
        view[chosen] = np.where(chosen % 2 == 0, 0x7E, 0xFE).astype(np.uint8)

    plant(folder / "model.safetensors", f"{DOWN}.weight", saturate)
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG206", f"{DOWN}.weight")]


def test_names_are_escaped_by_the_reporters_not_trusted(tmp_path: Path) -> None:
    """The finding carries the raw name in ``tensor`` and a bounded repr in its message."""
    from guard.tensors import TensorInfo
    from guard.values.quantized import _scale_findings

    path = tmp_path / "s.bin"
    np.array([np.nan], dtype=np.float32).tofile(path)
    hostile = "x\x1b[31m\n" * 50 + ".weight_scale"
    info = TensorInfo(hostile, "F32", (1,), str(path), 0, 4)
    (finding,) = _scale_findings(info, "scales", "fp8", None)
    assert finding.tensor == hostile and "\x1b" not in finding.message and "\n" not in finding.message


def test_a_nan_scale_inside_a_torchao_pickle_is_cg205(tmp_path: Path) -> None:
    """torchao int8 ``pytorch_model.bin``: the subclass's scale is a plain tensor the walker lists (never loaded)."""
    from quant_writers import write_torchao

    from guard.readers.torch.zip import read_torch_zip
    from guard.sources import LocalFile

    folder = write_torchao(tmp_path / "ao", kind="int8")
    assert findings(folder) == []
    path = folder / "pytorch_model.bin"
    name = f"{DOWN}._weight_scale"
    with LocalFile(path, name=str(path)) as source:
        info = next(t for t in read_torch_zip(source, locate_data=True).tensors if t.name == name)
    data = bytearray(path.read_bytes())
    data[info.data_start:info.data_start + 4] = np.array([np.nan], dtype=np.float32).tobytes()
    path.write_bytes(bytes(data))  # storages carry no CRC torch checks; data.pkl is untouched
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG205", name)]


@pytest.mark.parametrize("storage", ["bfloat16", "float32"])
def test_bnb_4bit_bytes_stored_under_a_float_dtype_are_not_values(tmp_path: Path, storage: str) -> None:
    """``bnb_4bit_quant_storage`` bf16/fp32 keeps packed nibbles under a float dtype: no CG203 "NaN" on them;
    the absmax scales beside them are still values (a NaN planted there is CG205)."""
    pytest.importorskip("bitsandbytes")
    from quant_writers import write_bnb_4bit

    folder = write_bnb_4bit(tmp_path / storage, storage=storage)
    inv = load_local_model(discover_models([folder])[0])
    results = value_findings(inv, Policy())
    assert not [f for f in results.findings if f.code in ("CG203", "CG205", "CG206")]
    payload = f"{DOWN}.weight"
    assert payload not in {row["tensor"] for row in results.stats}  # never read as floats
    plant(folder / "model.safetensors", f"{DOWN}.weight.absmax", lambda view: view.view(np.float32).__setitem__(
        0, np.nan))
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG205", f"{DOWN}.weight.absmax")]


def test_fp8_tensors_with_no_quantization_config_and_no_scale_are_judged_as_one_group(tmp_path: Path) -> None:
    """A checkpoint cast to FP8 with no scale and no config (the inventory calls it low-precision): CG206
    on the clipped tensor only."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    folder = tmp_path / "cast"
    folder.mkdir()
    save_file({"fine.weight": (torch.randn(64, 64) * 10).to(torch.float8_e4m3fn),
               "clipped.weight": (torch.randn(64, 64) * 2000).clamp(-448, 448).to(torch.float8_e4m3fn)},
              str(folder / "model.safetensors"))
    found = findings(folder)
    assert [(code, tensor) for code, tensor, _ in found] == [("CG206", "clipped.weight")]
