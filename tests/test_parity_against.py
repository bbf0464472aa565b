"""`parity SRC --against tunix|keras-hub`: the stack's own loader and forward against the file and PyTorch.

Tiny Llama / Qwen3 (2 layers, hidden 64) with randomized norms, saved by transformers' own
save_pretrained; the stacks run in the environments `make test` builds (tests/against_envs.py).
Observed with google-tunix 0.1.7 and keras-hub 0.32.0 on a CPU: both load fp32 and bf16 files
bit-exactly with their exact options (keras-hub's default float32 policy widens bf16 exactly);
tunix's default (optimized) loader reads fp16 norms in a bf16 file as bf16, and its Qwen3 forward
ignores rope_theta (always 1e6).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guard.against.targets import TARGETS
from guard.against.tree import apply_steps, compare_tree, expected_tree, judge_one
from guard.cli import main
from guard.envs.protocol import ProtocolError, read_array, write_array

ml_dtypes = pytest.importorskip("ml_dtypes")


# ---- the tree comparison and the protocol, without a library ----

def test_judge_one_names_what_happened() -> None:
    bf16 = np.array([1.5, -0.25, 3.0], dtype=ml_dtypes.bfloat16)
    assert judge_one(bf16, bf16.copy()) is None
    assert judge_one(bf16, bf16.astype(np.float32)).startswith("widened bfloat16 -> float32")
    f16 = np.array([1.1, 0.9, 1.3], dtype=np.float16)
    said = judge_one(f16, f16.view(ml_dtypes.bfloat16))
    assert said.startswith("reinterpreted: the file's float16 bits read as bfloat16")
    f32 = np.array([1.0 + 2**-20, 2.0, 3.0], dtype=np.float32)
    assert judge_one(f32, f32.astype(np.float16)).startswith("rounded float32 -> float16: 1 of 3 elements changed")
    assert judge_one(f32, f32[:2]).startswith("shape [2]")
    changed = f32.copy()
    changed[2] = 4.0
    assert judge_one(f32, changed) == "1 of 3 elements differ from the file's bits"
    assert judge_one(f32, f32.astype(np.float16).astype(np.float32)) == (
        "rounded through float16: 1 of 3 elements differ from the file's bits")


def _tiny_config(model_type: str) -> dict[str, Any]:
    return {"model_type": model_type, "hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 4, "intermediate_size": 16, "num_hidden_layers": 1, "vocab_size": 5}


def test_mapping_places_every_tensor_and_flags_the_rest() -> None:
    config = _tiny_config("qwen3")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, 8)).astype(np.float32)  # [heads * head_dim, hidden]
    tensors = {"model.layers.0.self_attn.q_proj.weight": q, "model.norm.weight": np.ones(8, np.float32),
               "model.layers.0.self_attn.rotary.inv_freq": np.ones(2, np.float32)}
    placed, unplaced = expected_tree(TARGETS["tunix"], config, tensors)
    assert unplaced == ["model.layers.0.self_attn.rotary.inv_freq"]
    name, steps = placed["layers.0.attn.q_proj.w"]
    assert name == "model.layers.0.self_attn.q_proj.weight"
    kernel = apply_steps(q, steps, config)
    np.testing.assert_array_equal(kernel, q.T.reshape(8, 2, 4))  # tunix: transpose (1, 0), reshape [D, N, H]
    held = {"layers.0.attn.q_proj.w": kernel.copy(), "final_norm.w": np.ones(8, np.float16),
            "layers.0.attn.k_norm.w": np.ones(4, np.float32)}
    findings, figures = compare_tree(TARGETS["tunix"], "defaults", 'mode="original"', config,
                                     {k: (lambda v=v: v) for k, v in tensors.items()},
                                     {k: (lambda v=v: v) for k, v in held.items()}, where="m")
    by_code = sorted(((f.code, f.tensor) for f in findings), key=str)
    assert by_code == [("CG302", "model.norm.weight"), ("CG304", "model.layers.0.self_attn.rotary.inv_freq"),
                       ("CG304", None)]
    assert figures["exact"] == 1 and figures["extra"] == ["layers.0.attn.k_norm.w"]
    norm = next(f for f in findings if f.tensor == "model.norm.weight")
    assert "'final_norm.w' widened" not in norm.message and 'mode="original" avoids it' in norm.message


def _failing_fp32(scale: float) -> dict[str, Any]:
    """An fp32 comparison as parity's verdict makes it, of logits that differ by ``scale`` of their size."""
    from guard.parity import metrics as pm
    from guard.parity.verdict import fixed_comparison

    ref = np.random.default_rng(0).standard_normal((2, 16, 32)).astype(np.float32)
    other = ref + scale * np.abs(ref).max() * np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
    tol = pm.tolerance_for(layers=2)
    return fixed_comparison("fp32", "torch:fp32", "flax:fp32",
                            {"logits": pm.compare_output("logits", ref, other, tie=tol.max_rel)}, tol)


def test_a_forward_miss_over_an_exact_tree_names_the_rows_cause() -> None:
    """tunix's forward always uses rope_theta 1e6: at the file's 1e4 its logits miss by 0.171 with every parameter
    bit-exact.  The finding says so, naming tunix's configuration from its row; where the row knows no cause it
    still says the weights are exact; where a parameter differs it claims nothing of the kind."""
    from guard.against.run import forward_findings

    target, load = TARGETS["tunix"], TARGETS["tunix"].loads[1]
    config = {**_tiny_config("qwen3"), "rope_theta": 1e4}
    comp = _failing_fp32(0.1)
    (finding,) = forward_findings(target, load, comp, config, who="tunix 0.1.7 (exact)", where="m", exact_tree=True)
    assert finding.code == "CG302" and finding.message.startswith("tunix 0.1.7 (exact) forward: fp32 ")
    said = finding.message.split("; every parameter bit-exact, the forward differs: ")[1]
    assert said.startswith("tunix's Qwen3 and Llama 3 call RoPE without ModelConfig's rope_theta, so it runs at "
                           "base 1e6 whatever the model's (this one's: 10000)") and "tunix.txt" not in said
    nested = {**_tiny_config("qwen3"), "rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}
    assert forward_findings(target, load, comp, nested, who="t", where="m", exact_tree=True)[0].message.endswith(
        said)  # transformers 5's layout: the same value read
    (plain,) = forward_findings(target, load, comp, {**config, "rope_theta": 1e6}, who="t", where="m",
                                exact_tree=True)
    assert plain.message.endswith("the forward differs: tunix's forward or its configuration, for a cause not "
                                  "known here (the file's weights are as stored)")
    (changed,) = forward_findings(target, load, comp, config, who="t", where="m", exact_tree=False)
    assert "bit-exact" not in changed.message and changed.message.endswith(said)
    assert forward_findings(target, load, _failing_fp32(0.0), config, who="t", where="m", exact_tree=True) == []


def test_keras_hub_rms_norm_eps_named_where_it_applies() -> None:
    from guard.against.causes import known_causes

    keras = TARGETS["keras-hub"]
    (qwen,) = known_causes(keras, {"model_type": "qwen3", "rms_norm_eps": 1e-6}, {}, "F32")
    assert "q/k norms run at epsilon 1e-5" in qwen and "(this model's: 1e-06)" in qwen
    assert known_causes(keras, {"model_type": "qwen3", "rms_norm_eps": 1e-5}, {}, "BF16") == ()
    (llama,) = known_causes(keras, {"model_type": "llama", "rms_norm_eps": 1e-5}, {"dtype": "float32"}, "F32")
    assert "epsilon 1e-6" in llama and known_causes(keras, {"model_type": "llama"}, {}, "F32") == ()


def test_easydel_rope_theta_and_table_named_where_they_apply() -> None:
    """EasyDeL 0.3 reads rope_theta at config.json's top level only; transformers 5 writes it in rope_parameters.
    Its bf16 RoPE table is a difference in fp32 (and fp16) passes, not in bf16 ones (transformers rounds alike)."""
    from guard.against.easydel_causes import ROPE_THETA_FROM_FILE, forward_causes
    from guard.worker.easydel_side import library_options

    nested = {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    rope, table = forward_causes(nested, {}, "F32")
    assert 'config_kwargs={"rope_theta": 1000000.0} avoids it' in rope and "get_basic_frequencies" in table
    assert forward_causes(nested, {ROPE_THETA_FROM_FILE: True}, "F32") == (table,)
    assert forward_causes({"rope_theta": 1e6, **nested}, {}, "BF16") == ()  # top level: EasyDeL reads it
    assert forward_causes({"rope_parameters": {"rope_theta": 1e4}}, {}, "F16") == (table,)  # its default anyway
    exact = {"torch_load_mode": "streaming", ROPE_THETA_FROM_FILE: True}
    assert library_options(nested, exact) == {"torch_load_mode": "streaming", "config_kwargs": {"rope_theta": 1e6}}
    assert library_options({"rope_theta": 1e6}, exact) == {"torch_load_mode": "streaming"}


def test_protocol_keeps_bits_and_checks_digests(tmp_path: Path) -> None:
    array = np.array([[1.5, -0.0], [np.nan, 3.0]], dtype=ml_dtypes.bfloat16)
    record = write_array(array, tmp_path, "a")
    assert record["dtype"] == "bfloat16"
    back = read_array(record, tmp_path)
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()
    Path(record["npy"]).write_bytes(Path(record["npy"]).read_bytes()[:-2] + b"\0\0")
    with pytest.raises(ProtocolError, match="digest"):
        read_array(record, tmp_path)
    with pytest.raises(ProtocolError, match="outside"):
        read_array({**record, "npy": str(tmp_path.parent / "x.npy")}, tmp_path)


def test_worker_refuses_an_unknown_target() -> None:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "guard.worker"], input=json.dumps({"protocol": 1, "target": "x"}),
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"] == "unknown protocol or target"


def test_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_tiny_config("qwen3")))
    assert main(["parity", str(tmp_path), str(tmp_path), "--against", "tunix"]) == 2
    assert main(["parity", str(tmp_path)]) == 2
    capsys.readouterr()
    monkeypatch.setenv("CKPT_GUARD_HOME", str(tmp_path / "envs"))  # no environment built there
    out = tmp_path / "report.json"
    assert main(["parity", str(tmp_path), "--against", "tunix", "-o", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ckpt-guard: error: --against tunix: tunix is not installed")
    assert line.endswith("run `ckpt-guard env install tunix`, or name its Python with --against-python")
    assert not out.exists()  # nothing written before a missing requirement is known


# ---- the real stacks ----

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def save_tiny(folder: Path, arch: str, dtype: str, *, rope_theta: float = 1e6, eps: float | None = None,
              f16_norms: bool = False) -> Path:
    """``rope_theta`` 1e6: the value tunix's forward always uses; ``eps`` by default the one keras-hub always uses
    for that architecture (Qwen3's q/k norms 1e-5, Llama's norms 1e-6): the passing models must have both."""
    eps = eps if eps is not None else {"qwen3": 1e-5, "llama": 1e-6}[arch]
    torch.manual_seed(0)
    sizes = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rope_theta=rope_theta, tie_word_embeddings=False,
                 head_dim=16, rms_norm_eps=eps)
    model = (transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**sizes)) if arch == "qwen3"
             else transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    if f16_norms:  # the norms rewritten in fp16, the rest left as save_pretrained wrote it
        from safetensors.torch import load_file, save_file

        path = folder / "model.safetensors"
        tensors = {k: (v.to(torch.float16) if "norm" in k else v) for k, v in load_file(path).items()}
        save_file(tensors, path, metadata={"format": "pt"})
    return folder


def against(src: Path, stack: str, out: Path) -> tuple[int, dict[str, Any]]:
    from against_envs import ensure

    ensure(stack)
    code = main(["parity", str(src), "--against", stack, "-f", "json", "-o", str(out)])
    return code, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["tunix", "keras-hub"])
@pytest.mark.parametrize(("arch", "dtype"), [("qwen3", "float32"), ("qwen3", "bfloat16"), ("llama", "bfloat16")])
def test_fp32_and_bf16_models_pass(tmp_path: Path, stack: str, arch: str, dtype: str) -> None:
    src = save_tiny(tmp_path / "m", arch, dtype)
    code, report = against(src, stack, tmp_path / "r.json")
    figures = report["extra"]["parity"]
    assert code == 0, [f["message"] for f in report["findings"]]
    assert figures["against"] == stack and figures["library"]["version"] == TARGETS[stack].version
    tensors = len(json.loads((src / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (src / "model.safetensors").read_bytes()[:8], "little")])) - 1
    for label, load in figures["loads"].items():
        tree = load["tree"]
        assert tree["exact"] + len(tree["widened"]) == tensors, label  # every tensor placed, bit for bit
        assert not (tree["changed"] or tree["missing"] or tree["extra"] or tree["unplaced"]), label
        if stack == "keras-hub" and dtype == "bfloat16":  # keras-hub: float32 unless the policy says bf16
            assert len(tree["widened"]) == (0 if label == "bfloat16 policy" else tensors)
    judged = [c for c in figures["comparisons"] if c["judged"]]
    assert judged and all(c["passed"] for c in judged)
    assert {c["name"].split(": ")[1] for c in judged} == (
        {"fp32"} if dtype == "float32" else {"fp32", "flax vs fp32 reference"})
    assert figures["comparisons"][0]["outputs"]["logits"]["max_rel"] < 1e-5  # fp32 under "highest"


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["tunix", "keras-hub"])
def test_drift_is_measured_in_the_stacks_worker_when_asked(tmp_path: Path, stack: str) -> None:
    """--drift runs each load's fp32 pass again at JAX's default matmul precision in the worker: a figure per
    load, never a verdict. On the CPU the default precision is full fp32, so it equals the 'highest' pass."""
    from against_envs import ensure

    src = save_tiny(tmp_path / "m", "qwen3", "float32")
    ensure(stack)
    out = tmp_path / "r.json"
    assert main(["parity", str(src), "--against", stack, "--drift", "-f", "json", "-o", str(out)]) == 0
    figures = json.loads(out.read_text())["extra"]["parity"]
    assert figures["jax_backend"] == "cpu"
    for label, load in figures["loads"].items():
        drift = load["default_precision_drift"]
        assert drift["precision"] == "default" and drift["output"] == "logits", label
        assert drift["vs_highest"] == 0.0 and drift["vs_torch_fp32"] == drift["highest_vs_torch_fp32"] <= 1e-5
    assert figures["default_precision_drift"]["load"] == next(iter(figures["loads"]))
    assert not any(c["name"].endswith("default") for c in figures["comparisons"])  # not judged
    plain = tmp_path / "plain.json"  # not asked, on a CPU: not run
    assert main(["parity", str(src), "--against", stack, "-f", "json", "-o", str(plain)]) == 0
    assert "default_precision_drift" not in json.loads(plain.read_text())["extra"]["parity"]
    text = tmp_path / "r.txt"
    assert main(["parity", str(src), "--against", stack, "--drift", "-o", str(text)]) == 0
    assert "JAX on cpu" in text.read_text() and "load) logits drifts" in text.read_text()


@pytest.mark.slow
def test_tunix_default_loader_reinterprets_fp16_norms(tmp_path: Path) -> None:
    src = save_tiny(tmp_path / "m", "qwen3", "bfloat16", f16_norms=True)
    code, report = against(src, "tunix", tmp_path / "r.json")
    assert code == 1
    tree = [f for f in report["findings"] if f["code"] == "CG302" and f.get("tensor")]
    norms = sorted(f["tensor"] for f in tree)
    assert norms and all("norm" in n for n in norms)
    assert len(norms) == 2 * 4 + 1  # per layer: input, post-attention, q_norm, k_norm; and the final norm
    assert all("(defaults" in f["message"] and "reinterpreted: the file's float16 bits read as bfloat16"
               in f["message"] and 'mode="original" avoids it' in f["message"] for f in tree)
    exact = report["extra"]["parity"]["loads"]["exact"]["tree"]
    assert not exact["changed"] and exact["widened"] == []  # mode="original" keeps the norms' fp16 bits


@pytest.mark.slow
def test_tunix_qwen3_ignores_rope_theta(tmp_path: Path) -> None:
    src = save_tiny(tmp_path / "m", "qwen3", "float32", rope_theta=1e4)
    code, report = against(src, "tunix", tmp_path / "r.json")
    assert code == 1
    messages = [f["message"] for f in report["findings"] if f["code"] == "CG302"]
    assert messages and all(m.startswith("tunix 0.1.7") and "forward: fp32" in m for m in messages)
    assert not any(f.get("tensor") for f in report["findings"])  # the weights are right: the forward is not
    cause = ("every parameter bit-exact, the forward differs: tunix's Qwen3 and Llama 3 call RoPE without "
             "ModelConfig's rope_theta, so it runs at base 1e6 whatever the model's (this one's: 10000)")
    assert all(cause in m for m in messages), messages


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "eps"), [("qwen3", 1e-6), ("llama", 1e-5)])
def test_keras_hub_ignores_rms_norm_eps(tmp_path: Path, arch: str, eps: float) -> None:
    """keras-hub 0.32 reads no rms_norm_eps: its Qwen3Decoder builds Qwen3Attention without
    layer_norm_epsilon (q/k norms always 1e-5; Qwen3's own value is 1e-6), and convert_llama3's
    convert_backbone_config omits it (always 1e-6; Llama 3's own value is 1e-5).  Every parameter is
    exact; the forward is not, under both loads."""
    src = save_tiny(tmp_path / "m", arch, "float32", eps=eps)
    code, report = against(src, "keras-hub", tmp_path / "r.json")
    assert code == 1
    messages = [f["message"] for f in report["findings"] if f["code"] == "CG302"]
    assert len(messages) == 2 and all(m.startswith("keras-hub 0.32.0") and "forward: fp32" in m for m in messages)
    assert not any(f.get("tensor") for f in report["findings"])


def test_action_script_refuses_an_unknown_stack(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    env = {"PATH": "/usr/bin:/bin", "RUNNER_TEMP": str(tmp_path), "CG_PARITY_AGAINST": "mlx", "CG_BIN": "false",
           "CG_PYTHON": sys.executable, "CG_LIST": str(tmp_path / "list")}
    proc = subprocess.run(["bash", str(root / "scripts" / "action" / "against.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "::error title=ckpt-guard::parity-against must be tunix, keras-hub, easydel, maxtext or empty" in proc.stdout


@pytest.mark.slow
def test_easydel_default_load_rounds_an_fp32_checkpoint_through_fp16(tmp_path: Path) -> None:
    """EasyDeL 0.3's default torch_load_mode="full" loads through torch in float16: every tensor of an fp32
    file comes back changed; torch_load_mode="streaming" holds every one bit for bit.  Its forward misses
    PyTorch's even so, for two reasons of its own (guard/against/easydel_causes.py): under its defaults it
    ignores rope_theta 1e6, which transformers 5 writes in rope_parameters (0.19 of the logits' scale); given
    rope_theta (the exact load), its bf16 RoPE cos/sin table alone leaves 7.7e-4 in fp32."""
    src = save_tiny(tmp_path / "m", "qwen3", "float32")
    assert "rope_theta" not in json.loads((src / "config.json").read_text())  # transformers 5's layout
    code, report = against(src, "easydel", tmp_path / "r.json")
    assert code == 1
    loads = report["extra"]["parity"]["loads"]
    assert loads["exact"]["tree"]["exact"] == 25 and not loads["exact"]["tree"]["changed"]
    head = next(f for f in report["findings"] if f.get("tensor") == "lm_head.weight")
    assert head["code"] == "CG302" and "(defaults)" in head["message"]
    assert 'torch_load_mode="streaming", config_kwargs={"rope_theta"' in head["message"]
    assert head["message"].endswith("avoids it")
    assert len([f for f in report["findings"] if f.get("tensor")]) == 25  # every tensor, under the defaults only
    forward = {f["message"].split(":")[0]: f["message"] for f in report["findings"] if not f.get("tensor")}
    defaults, exact = (next(m for k, m in forward.items() if f"({label}" in k) for label in ("defaults", "exact"))
    table = "casts its RoPE cos/sin table to bfloat16 whatever the dtype"
    assert 'config_kwargs={"rope_theta": 1000000.0} avoids it' in defaults and table in defaults
    assert "rope_theta" not in exact.split("forward:")[1] and table in exact and "no option avoids it" in exact
    max_rel = {c["name"]: c["outputs"]["logits"]["max_rel"] for c in report["extra"]["parity"]["comparisons"]}
    assert max_rel["defaults: fp32"] > 0.1 and 1e-4 < max_rel["exact: fp32"] < 2e-3
