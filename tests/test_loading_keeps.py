"""CG126: the DeepSeek-V3 pair of the issue, both written by transformers 5's save_pretrained.

As transformers writes it (loaded in bf16, the router kept fp32 by ``_keep_in_fp32_modules_strict``): no
finding at all, and ``fix`` plans nothing.  Narrowed by ``.to(torch.bfloat16)`` before the save: the
CG126 warning, naming the router's tensors and the table's transformers version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from scanning import codes, json_scan  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.inventory.keep_fp32 import TRANSFORMERS_VERSION  # noqa: E402
from guard.rules.loading import NARROWED  # noqa: E402

ROUTER = ("model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias")


def deepseek_v3(root: Path, *, narrowed: bool) -> Path:
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=32)
    transformers.DeepseekV3ForCausalLM(config).save_pretrained(root / "fp32")
    model = transformers.DeepseekV3ForCausalLM.from_pretrained(root / "fp32", dtype=torch.bfloat16)
    if narrowed:
        model = model.to(torch.bfloat16)  # what transformers#46167 did to DeepSeek-V4's 417 fp32 tensors
    model.save_pretrained(root / "out")
    return root / "out"


def router_dtypes(root: Path) -> set[str]:
    with safe_open(root / "model.safetensors", "pt") as f:
        return {str(f.get_slice(name).get_dtype()) for name in ROUTER}


def test_as_transformers_writes_it_no_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = deepseek_v3(tmp_path, narrowed=False)
    assert router_dtypes(root) == {"F32"}
    code, report = json_scan(capsys, "--expect", "config", str(root))
    assert code == 0 and codes(report) == {"CG104"}  # the bf16 norms' note, as for any bf16 model
    capsys.readouterr()
    code = main(["fix", str(root), "--expect", "config", "--write", "--cast", "--replace", "--format", "json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["extra"]["fix"]["outcomes"] == []


def test_narrowed_router_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = deepseek_v3(tmp_path, narrowed=True)
    assert router_dtypes(root) == {"BF16"}
    code, report = json_scan(capsys, "--expect", "config", str(root))
    assert code == 0  # a warning: the model loads (transformers widens the router back), the precision is gone
    assert codes(report) == {"CG104", "CG126"}  # no CG101/CG102: the router is as narrow as the rest
    [finding] = [f for f in report["findings"] if f["code"] == "CG126"]
    assert finding["code"] == "CG126" and finding["severity"] == "warning"
    assert all(repr(name) in finding["message"] for name in ROUTER)
    assert TRANSFORMERS_VERSION in finding["message"] and NARROWED in finding["message"]
