"""The modules transformers keeps in fp32 (guard.inventory.keep_fp32) are not dtype findings, and fix
leaves them fp32: DeepSeek-V3's router and T5's `wo`, written by transformers' own save_pretrained."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from scanning import codes, json_scan, tree_state  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.config import fp32_keeper  # noqa: E402
from guard.inventory.keep_fp32 import KEEP_IN_FP32, TRANSFORMERS_VERSION, Keeps, component_globs, kept_modules  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ROUTER = ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias")


def deepseek_v3(root: Path, *, dtype: torch.dtype = torch.bfloat16, also_fp32: str | None = None) -> Path:
    """A 2-layer DeepSeek-V3 (layer 1 MoE) in ``dtype``, its router held in fp32 as transformers 5 loads and
    saves it (``_keep_in_fp32_modules_strict``); ``also_fp32``: one more tensor left fp32 (the control)."""
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=32)
    model = transformers.DeepseekV3ForCausalLM(config).to(dtype)
    with torch.no_grad():
        gate = model.model.layers[1].mlp.gate
        gate.e_score_correction_bias.copy_(torch.randn(4))
        gate.float()
        if also_fp32 is not None:
            model.get_parameter(also_fp32).data = model.get_parameter(also_fp32).data.float()
    model.save_pretrained(root)
    return root


def t5(root: Path, *, also_fp32: str | None = None) -> Path:
    """A bf16 T5 whose `wo` projections stay fp32 (``_keep_in_fp32_modules``: fp16 overflows there)."""
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).to(torch.bfloat16)
    for name, module in model.named_modules():
        if name.endswith(".wo") or (also_fp32 is not None and also_fp32.startswith(name + ".") and name):
            module.float()
    model.save_pretrained(root)
    return root


def dtypes_of(root: Path) -> dict[str, str]:
    with safe_open(root / "model.safetensors", "pt") as f:
        return {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}


def test_the_saved_deepseek_holds_its_router_in_fp32(tmp_path: Path) -> None:
    held = dtypes_of(deepseek_v3(tmp_path / "ds"))
    assert {held[name] for name in ROUTER} == {"F32"}
    assert {d for name, d in held.items() if name not in ROUTER} == {"BF16"}


@pytest.mark.parametrize("expect", ["config", "bf16"])
def test_deepseek_v3_router_in_fp32_is_no_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  expect: str) -> None:
    src = deepseek_v3(tmp_path / "ds")
    code, report = json_scan(capsys, str(src), "--expect", expect)
    assert not codes(report) & {"CG101", "CG102", "CG103"}, report["findings"]
    assert code == 0


@pytest.mark.parametrize("expect", ["config", "bf16"])
def test_a_planted_fp32_tensor_is_still_found(tmp_path: Path, capsys: pytest.CaptureFixture[str], expect: str) -> None:
    planted = "model.layers.0.mlp.up_proj.weight"  # the dense layer: transformers 5 fuses the experts in memory
    src = deepseek_v3(tmp_path / "ds", also_fp32=planted)
    assert dtypes_of(src)[planted] == "F32"
    code, report = json_scan(capsys, str(src), "--expect", expect)
    found = {f["code"]: f for f in report["findings"]}
    assert {"CG101", "CG102"} <= set(found) and code == 1
    assert found["CG101"]["message"].startswith("1 floating tensor(s)") and found["CG101"]["tensor"] == planted
    assert found["CG102"]["tensor"] == planted


def test_fix_plans_nothing_for_the_router(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = deepseek_v3(tmp_path / "ds")
    before = tree_state(src)
    capsys.readouterr()
    code = main(["fix", str(src), "--expect", "config", "--write", "--cast", "--replace", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["extra"]["fix"]["outcomes"] == []
    assert tree_state(src) == before


def test_fix_casts_an_fp32_deepseek_to_bf16_and_keeps_its_router(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    src = deepseek_v3(tmp_path / "ds", dtype=torch.float32)
    capsys.readouterr()
    main(["fix", str(src), "--expect", "bf16", "--write", "--cast", "--replace", "--no-backup", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert not codes(report) & {"CG101", "CG102"}, report["findings"]
    held = dtypes_of(src)
    assert {held[name] for name in ROUTER} == {"F32"}
    assert {d for name, d in held.items() if "norm" in name} == {"F32"}  # the default keep-fp32 globs
    assert {d for name, d in held.items() if name not in ROUTER and "norm" not in name} == {"BF16"}
    loaded = transformers.DeepseekV3ForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    # 5.x loads the router in fp32 whatever the dtype (_keep_in_fp32_modules_strict); 4.57 has no keep list: it casts
    keeps = int(transformers.__version__.split(".")[0]) >= 5
    assert loaded.model.layers[1].mlp.gate.weight.dtype == (torch.float32 if keeps else torch.bfloat16)


def test_t5_wo_in_fp32_is_no_finding_and_a_planted_one_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = t5(tmp_path / "t5")
    held = dtypes_of(src)
    assert {d for n, d in held.items() if ".wo." in n} == {"F32"} and "BF16" in held.values()
    code, report = json_scan(capsys, str(src), "--expect", "config")
    assert not codes(report) & {"CG101", "CG102"} and code == 0, report["findings"]
    control = t5(tmp_path / "control", also_fp32="encoder.block.0.layer.1.DenseReluDense.wi.weight")
    code, report = json_scan(capsys, str(control), "--expect", "config")
    assert {"CG101", "CG102"} <= codes(report) and code == 1


def test_the_table_names_what_transformers_4_57_keeps() -> None:
    """Where transformers 4.57 has the same lists, the table (read from 5.x) holds them."""
    for model_type, cls in (("t5", "T5PreTrainedModel"), ("mt5", "MT5PreTrainedModel"),
                            ("umt5", "UMT5PreTrainedModel"), ("gpt_oss", "GptOssPreTrainedModel"),
                            ("rwkv", "RwkvPreTrainedModel")):
        assert set(getattr(transformers, cls)._keep_in_fp32_modules) == set(KEEP_IN_FP32[model_type].fp16)
    assert kept_modules("deepseek_v3") == ("e_score_correction_bias", "gate.weight")


def test_component_globs_match_whole_components() -> None:
    keeps = fp32_keeper(component_globs(kept_modules("deepseek_v3")))
    assert keeps("model.layers.3.mlp.gate.weight") and keeps("model.layers.3.mlp.gate.e_score_correction_bias")
    assert not keeps("model.layers.3.mlp.gate_proj.weight") and not keeps("model.layers.3.mlp.experts.0.gate.bias")
    wo = fp32_keeper(component_globs(kept_modules("t5")))
    assert wo("decoder.block.0.layer.2.DenseReluDense.wo.weight") and not wo("shared.weight")
    assert not wo("encoder.block.0.layer.0.SelfAttention.o.weight")


def test_the_table_is_what_the_script_reads_from_its_transformers(tmp_path: Path) -> None:
    """scripts/keep_fp32_table.py over the transformers the table names: constraints.txt's pin, the one
    `make test` installs here.  A newer pin without the table read again fails, never skips."""
    constraints = (REPO / "guard" / "envs" / "constraints.txt").read_text()
    pinned = next(line.split("==", 1)[1].strip() for line in constraints.splitlines()
                  if line.startswith("transformers=="))
    assert pinned == TRANSFORMERS_VERSION, (
        f"constraints.txt pins transformers {pinned}, the table is from {TRANSFORMERS_VERSION}: run "
        "scripts/keep_fp32_table.py over the pinned wheel's transformers/ and update guard/inventory/keep_fp32.py")
    source = Path(transformers.__file__).parent
    version = ast.literal_eval(next(line.split("=", 1)[1] for line in (source / "__init__.py").read_text()
                                    .splitlines() if line.startswith("__version__")).strip())
    if version != pinned:
        pytest.skip(f"transformers {version} is installed, not constraints.txt's {pinned} (make test installs it)")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "keep_fp32_table.py"), str(source)],
                          capture_output=True, text=True, check=True)
    assert eval("{" + done.stdout + "}", {"Keeps": Keeps}) == KEEP_IN_FP32  # noqa: S307 (the script's own rows)
