"""convert --to maxtext: MaxText's own tree (checked against MaxText 0.2.5's conversion hooks), restored by
orbax itself, a forward from MaxText's layout that matches transformers, and the way back bit-exact except
the declared query-scale rounding."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("transformers")
ocp = pytest.importorskip("orbax.checkpoint")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from against_envs import managed_python  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from test_convert import _offline  # noqa: E402,F401

from guard.against.maxtext_causes import tied_logits_as_maxtext  # noqa: E402
from guard.cli import main  # noqa: E402
from guard.convert.maxtext.flags import rope_theta  # noqa: E402

pytestmark = pytest.mark.slow
MAXTEXT = Path(__file__).resolve().parent.parent / ".maxtext"  # gitignored; MaxText 0.2.5's wheel, unpacked
# MaxText's own environment: the managed one (`ckpt-guard env install maxtext`, which `make maxtext-venv` runs)
MAXTEXT_PYTHON = managed_python("maxtext") or Path("/nonexistent/maxtext/bin/python")
BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6)
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},  # as Gemma 3 4B
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # factor 1: llama3's scaling is the identity


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def build(kind: str, path: Path, dtype: torch.dtype = torch.bfloat16, *, rope: dict[str, Any] | None = None) -> Path:
    """A tiny model of ``kind`` written by transformers' save_pretrained, its norms and biases randomized."""
    import transformers as tf

    configs = {
        "llama3": lambda: tf.LlamaConfig(**BASE, rope_scaling=rope or LLAMA3_ROPE, max_position_embeddings=16384),
        "llama": lambda: tf.LlamaConfig(**BASE),
        "llama_tied": lambda: tf.LlamaConfig(**BASE, tie_word_embeddings=True),  # as Llama 3.2 1B and 3B
        "mistral": lambda: tf.MistralConfig(**BASE, sliding_window=None),
        "mistral_tied": lambda: tf.MistralConfig(**BASE, sliding_window=None, tie_word_embeddings=True),
        "qwen3": lambda: tf.Qwen3Config(**BASE),
        "qwen2": lambda: tf.Qwen2Config(**{k: v for k, v in BASE.items() if k != "head_dim"}),
        "mixtral": lambda: tf.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**BASE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                               norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
        # 4 layers: two of MaxText's local/global pairs; a window shorter than the test inputs
        "gemma2": lambda: tf.Gemma2Config(**{**BASE, "num_hidden_layers": 4}, query_pre_attn_scalar=8, sliding_window=4,
                                          final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
        # 8 layers: one of MaxText's scanned blocks of 6 (5 local + 1 global) and 2 in layers_remainder
        "gemma3": lambda: tf.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 8}, query_pre_attn_scalar=8,
                                              sliding_window=4, rope_parameters=GEMMA3_ROPE),
        # the gemma3-27b query scale (hidden_size // heads = 8, head_dim 16); 4 layers: no full block, all in
        # layers_remainder when scanned
        "gemma3_27b": lambda: tf.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 4, "head_dim": 16},
                                                  query_pre_attn_scalar=8, sliding_window=4,
                                                  rope_parameters=GEMMA3_ROPE),
    }
    torch.manual_seed(7)
    model = tf.AutoModelForCausalLM.from_config(configs[kind]()).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


def convert(src: Path, out: Path, *extra: str) -> int:
    return main(["convert", str(src), "--to", "maxtext", "--out", str(out), *extra])


def restore(items: Path) -> dict[str, np.ndarray]:
    tree = ocp.PyTreeCheckpointer().restore(items.resolve())
    assert list(tree) == ["params"] and list(tree["params"]) == ["params"]  # {"params": {"params": tree}}
    return {"/".join(k): np.asarray(v) for k, v in flatten_dict(tree["params"]["params"]).items()}


def bits(a: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    return a.dtype.name, a.shape, np.ascontiguousarray(a).tobytes()


# ------------------------------------------------------------------ MaxText's own hooks
def maxtext_module(name: str) -> Any:
    """A MaxText 0.2.5 module loaded from its wheel (its package needs Python >= 3.12; these files do not)."""
    if not (MAXTEXT / "maxtext").is_dir():
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(MAXTEXT),
                               "--python-version", "3.12", "--only-binary=:all:", "maxtext==0.2.5"],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            pytest.skip(f"MaxText 0.2.5's wheel could not be fetched: {proc.stderr.strip()[-300:]}")
    path = MAXTEXT / "maxtext" / "checkpoint_conversion" / "utils" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"maxtext_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAXTEXT_NAMES = {"llama3": "llama3.1-8b", "qwen3": "qwen3-0.6b", "qwen2": "qwen2.5-7b",
                 "qwen3_moe": "qwen3-30b-a3b", "mixtral": "mixtral-8x7b", "gemma2": "gemma2-2b",
                 "gemma3": "gemma3-4b", "gemma3_27b": "gemma3-27b"}


def maxtext_tree(kind: str, src: Path, ours: dict[str, np.ndarray], *, scan: bool) -> dict[str, np.ndarray]:
    """What MaxText's to_maxtext builds, from its own PARAM_MAPPING and HOOK_FNS (its stacking rules:
    a list on param_scan_axis 1 when scanned, on the expert axis 0 otherwise, nested lists on axes 0 and 1)."""
    mapping_module = maxtext_module("param_mapping")
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    experts = config.get("num_local_experts") or config.get("num_experts") or 0
    mt_config = SimpleNamespace(num_experts=experts, head_dim=config["head_dim"] if "head_dim" in config else
                                config["hidden_size"] // config["num_attention_heads"], param_scan_axis=1)
    config.setdefault("head_dim", mt_config.head_dim)
    model = MAXTEXT_NAMES[kind]
    if model.startswith("gemma3"):  # MaxText's gemma3 mapping reads a multimodal config (text_config, vision_config)
        config = {"text_config": config, "vision_config": {"num_hidden_layers": 0}}
    names = mapping_module.PARAM_MAPPING[model](config, mt_config, scan)
    hooks = mapping_module.HOOK_FNS[model](config, mt_config, scan, saving_to_hf=False)
    out = {}
    for key, hf in names.items():
        path = key.replace("-", "/")[len("params/"):]
        hf = _text_only(hf)
        if hf == []:  # gemma3, scanned, fewer layers than a block: MaxText's decoder then builds no decoder/layers
            continue
        if path not in ours and (isinstance(hf, list) or hf not in state):
            continue  # a mapping row this model has not (biases, an untied head)
        target = ours[path].shape

        def one(name: str, shape: tuple[int, ...], key: str = key) -> np.ndarray:
            hook = hooks.get(key)
            chain = hook if isinstance(hook, list) else [hook] if hook else []
            value = state[name]
            for fn in chain:
                value = fn(value, shape)
            # to_maxtext casts each result to the stored dtype (its `.astype(target_dtype)`): Gemma's
            # scale_rmsnorm_layer computes bf16 + 1.0 in float32
            return np.asarray(value).astype(state[name].dtype)

        if isinstance(hf, str):
            out[path] = one(hf, target)
        elif isinstance(hf[0], list):  # scanned experts: (experts, layers, ...)
            out[path] = np.stack([np.stack([one(n, target[2:]) for n in row]) for row in hf])
        else:
            axis = 1 if scan and "{e}" not in str(hf) and not _expert_list(hf) else 0
            piece = tuple(d for i, d in enumerate(target) if i != axis)
            out[path] = np.stack([one(n, piece) for n in hf], axis=axis)
    return out


def _text_only(hf: Any) -> Any:
    """Gemma 3's names in MaxText's mapping are Gemma3ForConditionalGeneration's; Gemma3ForCausalLM's lack the
    language model's prefix."""
    if isinstance(hf, list):
        return [_text_only(h) for h in hf]
    return hf.replace("model.language_model.", "model.", 1) if isinstance(hf, str) else hf


def _expert_list(names: list[str]) -> bool:
    return ".experts." in names[0] and len({n.split(".experts.")[0] for n in names}) == 1


@pytest.mark.parametrize("kind", sorted(MAXTEXT_NAMES))
@pytest.mark.parametrize("scan", [False, True])
def test_tree_equals_maxtexts_own_hooks(tmp_path: Path, kind: str, scan: bool) -> None:
    src = build(kind, tmp_path / "src")
    out = tmp_path / "mt"
    assert convert(src, out, *(["--scan-layers"] if scan else [])) in (0, 1)
    ours = restore(out / "0" / "items")  # orbax's own restore reads the checkpoint
    theirs = maxtext_tree(kind, src, ours, scan=scan)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert bits(ours[key]) == bits(theirs[key].astype(ours[key].dtype)), key
        assert ours[key].dtype == theirs[key].dtype, key
    if kind.startswith("gemma3"):
        _gemma3_blocks(ours, kind, scan)
        return
    layers = "decoder/layers" if scan else "decoder/layers_0"
    attention = "self_attention_local" if kind == "gemma2" else "self_attention"  # gemma2: 4 HF layers, 2 pairs
    q = ours[f"{layers}/{attention}/query/kernel"]
    assert q.shape == ((32, 2, 4, 8) if scan else (32, 4, 8))  # [D, (layers,) heads, head_dim]
    assert ours[f"{layers}/{attention}/out/kernel"].shape == ((4, 2, 8, 32) if scan else (4, 8, 32))


def _gemma3_blocks(ours: dict[str, np.ndarray], kind: str, scan: bool) -> None:
    """Gemma 3 scanned: blocks of 6 layers (decoder/layers/layers_0..5, stacked over the full blocks) and the
    leftover layers unstacked in decoder/layers_remainder; unscanned: decoder/layers_{i} for every layer."""
    layers, head_dim = (8, 8) if kind == "gemma3" else (4, 16)
    query = "self_attention/query/kernel"
    if not scan:
        assert {k.split("/")[1] for k in ours if k.startswith("decoder/layers_")} == {
            f"layers_{i}" for i in range(layers)}
        assert ours[f"decoder/layers_{layers - 1}/{query}"].shape == (32, 4, head_dim)
        return
    stacked = {k.split("/")[2] for k in ours if k.startswith("decoder/layers/")}
    remainder = {k.split("/")[2] for k in ours if k.startswith("decoder/layers_remainder/")}
    assert stacked == ({f"layers_{k}" for k in range(6)} if layers >= 6 else set())
    assert remainder == {f"layers_{r}" for r in range(layers % 6)}
    if stacked:
        assert ours[f"decoder/layers/layers_0/{query}"].shape == (32, 1, 4, head_dim)  # [D, blocks, N, H]
        assert ours["decoder/layers/layers_5/pre_ffw_norm/scale"].shape == (32, 1)
    assert ours[f"decoder/layers_remainder/layers_1/{query}"].shape == (32, 4, head_dim)


def test_checkpoint_layout_is_maxtexts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = build("llama3", tmp_path / "src")
    out = tmp_path / "mt"
    assert convert(src, out) == 0
    text = capsys.readouterr().out
    assert "model_name=llama3.1-8b" in text and "base_emb_dim=32" in text and "head_dim=8" in text
    assert f"load_parameters_path={out / '0' / 'items'}" in text and "scan_layers=false" in text
    items = out / "0" / "items"
    meta = json.loads((items / "_METADATA").read_text())
    assert meta["use_ocdbt"] is True and meta["use_zarr3"] is True
    assert all(k.startswith("('params', 'params', ") for k in meta["tree_metadata"])
    step = json.loads((out / "0" / "_CHECKPOINT_METADATA").read_text())
    assert step["item_handlers"]["items"].endswith("PyTreeCheckpointHandler")
    manager = ocp.CheckpointManager(out.resolve(), item_names=("items",))  # MaxText's reader: a step, item "items"
    assert manager.all_steps() == [0]
    restored = manager.restore(0, args=ocp.args.Composite(items=ocp.args.PyTreeRestore()))
    assert "token_embedder" in restored["items"]["params"]["params"]
    assert not list(tmp_path.glob(".mt.partial-*"))


@pytest.mark.parametrize("kind,normalize", [("llama_tied", "false"), ("gemma2", "true"), ("gemma3", "true"),
                                            ("llama", None)])
def test_tied_embeddings_get_maxtexts_logit_flags_and_the_bf16_table_note(tmp_path: Path, kind: str,
                                                                          normalize: str | None) -> None:
    """base.yml divides tied logits by sqrt(emb_dim) (normalize_embedding_logits: true), right only for Gemma's
    table stored times sqrt(hidden_size); a tied Llama's logits were 1/sqrt(hidden_size) of transformers'.
    A tied model is also told that MaxText rounds the table to bfloat16 for the logits."""
    src = build(kind, tmp_path / "src", torch.float32)
    report = tmp_path / "report.json"
    assert convert(src, tmp_path / "mt", "--format", "json", "-o", str(report)) in (0, 1)
    conversion = json.loads(report.read_text())["extra"]["conversion"]
    flags = [f for f in conversion["maxtext_flags"] if f.startswith(("normalize_embedding_logits=",
                                                                      "logits_via_embedding="))]
    if normalize is None:
        assert flags == ["logits_via_embedding=false"]
        assert not any("bfloat16" in n for n in conversion["maxtext_notes"])
    else:
        assert flags == ["logits_via_embedding=true", f"normalize_embedding_logits={normalize}"]
        assert any("rounds the embedding table to bfloat16" in n and "attend_on_embedding" in n
                   for n in conversion["maxtext_notes"])


def test_scanned_is_the_unscanned_layers_stacked(tmp_path: Path) -> None:
    src = build("mixtral", tmp_path / "src")
    assert convert(src, tmp_path / "flat") == 0  # the query scale's rounding is a warning: it passes
    assert convert(src, tmp_path / "scan", "--scan-layers") == 0
    flat, scanned = restore(tmp_path / "flat" / "0" / "items"), restore(tmp_path / "scan" / "0" / "items")
    for key, value in scanned.items():
        if not key.startswith("decoder/layers/"):
            assert bits(value) == bits(flat[key])
            continue
        tail = key.removeprefix("decoder/layers/")
        axis = 1  # param_scan_axis; experts lead (0) and layers follow (1) for MoE experts too
        stacked = np.stack([flat[f"decoder/layers_{i}/{tail}"] for i in range(2)], axis=axis)
        assert bits(value) == bits(stacked), key


# ------------------------------------------------------------------ a forward from MaxText's layout
def rms(x: Any, scale: Any, eps: float) -> Any:
    import jax.numpy as jnp

    return x * (1.0 / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)) * scale


def rope(x: Any, theta: float, *, interleaved: bool) -> Any:
    """[T, N, H]; MaxText's LLaMARotaryEmbedding pairs (2i, 2i+1), RotaryEmbedding (i, i + H/2)."""
    import jax.numpy as jnp

    t, _, h = x.shape
    freq = 1.0 / theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h)
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    a, b = (x[..., ::2], x[..., 1::2]) if interleaved else (x[..., : h // 2], x[..., h // 2:])
    ra, rb = a * cos - b * sin, b * cos + a * sin
    return jnp.stack([ra, rb], axis=-1).reshape(x.shape) if interleaved else jnp.concatenate([ra, rb], axis=-1)


def maxtext_forward(tree: dict[str, np.ndarray], ids: np.ndarray, *, layers: int, eps: float, theta: float,
                     interleaved: bool, qk_norm: bool) -> np.ndarray:
    """Logits from MaxText's documented layout: q = x @ query [D, N, H] (1/sqrt(H) folded in unless qk-norm),
    out [N, H, D], mlp wi_0/wi_1/wo, logits_dense [D, V]."""
    import jax
    import jax.numpy as jnp

    p = {k: jnp.asarray(v, jnp.float32) for k, v in tree.items()}
    with jax.default_matmul_precision("highest"):
        x = p["token_embedder/embedding"][ids]
        t = x.shape[0]
        mask = jnp.tril(jnp.ones((t, t), bool))
        for i in range(layers):
            at = f"decoder/layers_{i}/"
            h = rms(x, p[at + "pre_self_attention_layer_norm/scale"], eps)
            q, k, v = (jnp.einsum("td,dnh->tnh", h, p[at + f"self_attention/{n}/kernel"])
                       for n in ("query", "key", "value"))
            if qk_norm:
                q = rms(q, p[at + "self_attention/query_norm/scale"], eps) / jnp.sqrt(q.shape[-1])
                k = rms(k, p[at + "self_attention/key_norm/scale"], eps)
            q, k = rope(q, theta, interleaved=interleaved), rope(k, theta, interleaved=interleaved)
            groups = q.shape[1] // k.shape[1]
            k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
            scores = jnp.where(mask[None], jnp.einsum("tnh,snh->nts", q, k), -jnp.inf)
            o = jnp.einsum("nts,snh->tnh", jax.nn.softmax(scores, axis=-1), v)
            x = x + jnp.einsum("tnh,nhd->td", o, p[at + "self_attention/out/kernel"])
            h = rms(x, p[at + "post_self_attention_layer_norm/scale"], eps)
            gate, up = h @ p[at + "mlp/wi_0/kernel"], h @ p[at + "mlp/wi_1/kernel"]
            x = x + (jax.nn.silu(gate) * up) @ p[at + "mlp/wo/kernel"]
        x = rms(x, p["decoder/decoder_norm/scale"], eps)
        return np.asarray(x @ p["decoder/logits_dense/kernel"])


@pytest.mark.parametrize("kind,interleaved,qk_norm", [("llama3", True, False), ("mistral", False, False),
                                                      ("qwen3", False, True)])
def test_forward_from_the_tree_matches_transformers(tmp_path: Path, kind: str, interleaved: bool,
                                                     qk_norm: bool) -> None:
    import transformers as tf

    src = build(kind, tmp_path / "src", torch.float32)
    assert convert(src, tmp_path / "mt") in (0, 1)
    tree = restore(tmp_path / "mt" / "0" / "items")
    ids = np.array([3, 17, 42, 5, 88, 1, 64, 9])
    model = tf.AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(torch.tensor(ids)[None]).logits[0].numpy()
    config = json.loads((src / "config.json").read_text())
    got = maxtext_forward(tree, ids, layers=2, eps=config["rms_norm_eps"], theta=rope_theta(config),
                          interleaved=interleaved, qk_norm=qk_norm)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-5
    if kind != "qwen3":  # the fold of 1/sqrt(H) is what makes the query kernel differ from W.T
        hf_q = load_file(str(src / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
        assert not np.array_equal(tree["decoder/layers_0/self_attention/query/kernel"].reshape(32, -1), hf_q.T)


MAXTEXT_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # what MaxText's LLaMARotaryEmbedding hard-codes


EMBED_STEPS = {"gemma2": "embed_scale", "gemma3": "embed_scale_bf16", "gemma3_27b": "embed_scale_bf16"}


def forward_cases(tmp_path: Path, kinds: tuple[str, ...], ids: list[list[int]]) -> list[dict[str, Any]]:
    """Each kind in fp32, converted scanned and not, with the flags convert printed and transformers' logits
    (tied ones as MaxText computes them; ``-plain``: transformers' own, for the declared figure)."""
    import transformers as tf

    cases = []
    for kind in kinds:
        src = build(kind, tmp_path / kind / "src", torch.float32, rope=MAXTEXT_ROPE)
        model = tf.AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32,
                                                        attn_implementation="eager").eval()
        with torch.no_grad():
            plain = model(torch.tensor(ids)).logits.numpy()
        tied = model.config.tie_word_embeddings
        np.save(tmp_path / kind / "logits.npy", tied_logits_as_maxtext(model, ids, step=EMBED_STEPS.get(kind))
                if tied else plain)
        if tied:  # the same MaxText forward against transformers' own logits: the declared figure
            np.save(tmp_path / kind / "plain.npy", plain)
        for scan in (False, True):
            report = tmp_path / kind / f"report-{scan}.json"
            assert convert(src, tmp_path / kind / f"mt-{scan}", "--format", "json", "-o", str(report),
                           *(["--scan-layers"] if scan else [])) == 0
            flags = json.loads(report.read_text())["extra"]["conversion"]["maxtext_flags"]
            cases.append({"name": f"{kind}-{scan}", "flags": flags, "ids": ids,
                          "logits": str(tmp_path / kind / "logits.npy")})
            if tied:
                assert f"normalize_embedding_logits={str(kind in EMBED_STEPS).lower()}" in flags
                assert any("rounds the embedding table to bfloat16" in n
                           for n in json.loads(report.read_text())["extra"]["conversion"]["maxtext_notes"])
            if tied and not scan:
                cases.append({"name": f"{kind}-plain", "flags": flags, "ids": ids,
                              "logits": str(tmp_path / kind / "plain.npy")})
    return cases


def maxtext_errors(cases: list[dict[str, Any]], tmp_path: Path) -> dict[str, float]:
    """MaxText's own decoder on every case, in its venv: {name: max |MaxText - reference| / max |reference|}."""
    proc = subprocess.run([str(MAXTEXT_PYTHON), str(Path(__file__).parent / "maxtext_forward.py")],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=1200,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(errors) == sorted(c["name"] for c in cases)
    return errors


def test_maxtexts_own_forward_matches_transformers(tmp_path: Path) -> None:
    """MaxText 0.2.5's decoder, in its Python 3.12 venv, loads every row's output (scanned and not) with the
    flags convert printed, and its fp32 logits match transformers' PyTorch forward.  Tied embeddings (Gemma 2,
    a tied Llama) match it once the table is rounded to bfloat16 for the logits, as MaxText does in every
    dtype; against transformers' own logits that convention costs ~1e-3 of their scale (convert's note)."""
    if not MAXTEXT_PYTHON.is_file():
        pytest.skip("MaxText's environment is not built (make maxtext-venv: Python 3.12, maxtext[tpu]==0.2.5)")
    ids = [[3, 17, 42, 5, 88, 1, 64, 9]]
    cases = forward_cases(tmp_path, ("llama3", "llama", "mistral", "qwen3", "qwen2", "mixtral", "qwen3_moe",
                                     "gemma2", "llama_tied"), ids)
    errors = maxtext_errors(cases, tmp_path)
    plain = {name: errors.pop(name) for name in ("gemma2-plain", "llama_tied-plain")}
    assert all(e < 1e-5 for e in errors.values()), errors
    # MaxText's bf16 table against transformers' fp32 one: ~1e-3 (1.6e-3..2.3e-3 measured for Gemma 2)
    assert all(3e-4 < e < 5e-3 for e in plain.values()), plain


def test_maxtexts_own_gemma3_forward_matches_transformers(tmp_path: Path) -> None:
    """Gemma 3 in MaxText's own decoder: 8 layers (a scanned block of 6 and a remainder of 2; 5 local + 1 global,
    a window of 4 < the 8 inputs, linear RoPE factor 8 on global layers only), and 4 layers with the
    gemma3-27b query scale (all in the remainder when scanned).  Once the reference takes MaxText's two
    conventions (the rows x bfloat16(sqrt(D)), the bf16 table for the logits) it matches to fp32 precision."""
    if not MAXTEXT_PYTHON.is_file():
        pytest.skip("MaxText's environment is not built (make maxtext-venv: Python 3.12, maxtext[tpu]==0.2.5)")
    ids = [[3, 17, 42, 5, 88, 1, 64, 9]]
    cases = forward_cases(tmp_path, ("gemma3", "gemma3_27b"), ids)
    assert {c["name"]: next(f for f in c["flags"] if f.startswith("model_name=")) for c in cases} == {
        **{f"gemma3-{s}": "model_name=gemma3-4b" for s in (False, True, "plain")},
        **{f"gemma3_27b-{s}": "model_name=gemma3-27b" for s in (False, True, "plain")}}
    errors = maxtext_errors(cases, tmp_path)
    plain = {name: errors.pop(name) for name in ("gemma3-plain", "gemma3_27b-plain")}
    assert all(e < 1e-5 for e in errors.values()), errors
    # against transformers' own fp32 logits: the bf16 table (~1e-3) and the bf16 sqrt(32) (1.1e-4)
    assert all(3e-4 < e < 5e-3 for e in plain.values()), plain


# ------------------------------------------------------------------ the way back
@pytest.mark.parametrize("kind,dtype", [("llama3", torch.bfloat16), ("llama3", torch.float32),
                                        ("qwen3_moe", torch.bfloat16), ("mixtral", torch.bfloat16),
                                        ("gemma2", torch.bfloat16), ("gemma3", torch.bfloat16),
                                        ("gemma3_27b", torch.bfloat16)])
@pytest.mark.parametrize("scan", [False, True])
def test_way_back_is_bit_exact_except_the_declared_rounding(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            kind: str, dtype: torch.dtype, scan: bool) -> None:
    src = build(kind, tmp_path / "src", dtype)
    capsys.readouterr()  # what transformers printed while building (Gemma 2's attention advice)
    code = convert(src, tmp_path / "mt", "--format", "json", *(["--scan-layers"] if scan else []))
    report = json.loads(capsys.readouterr().out)
    declared = report["extra"]["conversion"]["declared_roundings"]
    rounding = [f for f in report["findings"] if f["code"] == "CG301"]
    assert code == 0 and all(f["severity"] == "warning" for f in rounding)
    back = tmp_path / "back"
    assert main(["convert", str(tmp_path / "mt"), "--to", "torch", "--out", str(back)]) == 0
    before, after = load_file(str(src / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert sorted(before) == sorted(after)
    changed = 0
    # only the declared tensors: the query scale (not Gemma 3's, scaled at run time); for Gemma also its norms
    # (1 + w; Gemma 3's q/k norms too) and scaled embedding
    declared_names = (() if kind.startswith("gemma3") else ("q_proj.weight",)) + (
        ("norm.weight", "embed_tokens.weight") if kind.startswith("gemma") else ())
    for name in before:
        if bits(before[name]) != bits(after[name]):
            assert name.endswith(declared_names) and kind != "qwen3_moe", name
            width = f"u{before[name].dtype.itemsize}"
            changed += int(np.count_nonzero(before[name].view(width) != after[name].view(width)))
    assert changed == sum(d["changed"] for d in declared.values())
    assert bool(changed) == bool(rounding)
    if kind != "qwen3_moe" and dtype == torch.bfloat16:
        assert changed  # 1/sqrt(8), sqrt(32) and 1 + w round in bf16: declared, never silent
    if kind.startswith("gemma"):  # every rounding step of Gemma's layout declared on its own parameter
        norm = "layers/pre_ffw_norm_local/scale" if kind == "gemma2" else "layers/self_attention/key_norm/scale"
        assert {"token_embedder/embedding", "decoder/decoder_norm/scale", norm} <= {
            k for k, v in declared.items() if v["changed"]}
    config = json.loads((back / "config.json").read_text())
    assert config["model_type"] == json.loads((src / "config.json").read_text())["model_type"]


# ------------------------------------------------------------------ refusals write nothing
def test_unsupported_architecture_is_cg304(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import transformers as tf

    src = tmp_path / "src"
    config = tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    tf.GPT2LMHeadModel(config).save_pretrained(src)
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    report = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in report["findings"]] == ["CG304"] and "gpt2" in report["findings"][0]["message"]
    assert not (tmp_path / "mt").exists() and not list(tmp_path.glob(".mt.partial-*"))


def test_a_router_maxtext_cannot_express_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """MaxText's MoE renormalizes the top-k weights (a softmax over the top-k logits, layers/moe.py); a Qwen3
    MoE with norm_topk_prob false does not, and MaxText's forward would differ by 1.5e-2 (measured)."""
    src = build("qwen3_moe", tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "norm_topk_prob": False}))
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["code"] for f in findings] == ["CG304"] and "norm_topk_prob" in findings[0]["message"]
    assert not (tmp_path / "mt").exists()


def test_gemma3_flags_name_maxtexts_model_and_both_ropes(tmp_path: Path) -> None:
    """Every layer counted (not pairs, as Gemma 2), both RoPEs (gemma3-*.yml's 10k local, 1M global with factor
    8), no softcaps, and the model_name whose hard-coded query scale is the config's."""
    src = build("gemma3", tmp_path / "src")
    report = tmp_path / "report.json"
    assert convert(src, tmp_path / "mt", "--format", "json", "-o", str(report)) == 0
    conversion = json.loads(report.read_text())["extra"]["conversion"]
    assert conversion["model_name"] == "gemma3-4b"
    flags = dict(f.split("=", 1) for f in conversion["maxtext_flags"])
    assert {k: flags[k] for k in ("model_name", "base_num_decoder_layers", "head_dim", "rope_max_timescale",
                                  "local_rope_max_timescale", "rope_linear_scaling_factor", "sliding_window_size",
                                  "final_logits_soft_cap", "attn_logits_soft_cap", "logits_via_embedding",
                                  "normalize_embedding_logits")} == {
        "model_name": "gemma3-4b", "base_num_decoder_layers": "8", "head_dim": "8", "rope_max_timescale": "1000000",
        "local_rope_max_timescale": "10000", "rope_linear_scaling_factor": "8", "sliding_window_size": "4",
        "final_logits_soft_cap": "0", "attn_logits_soft_cap": "0", "logits_via_embedding": "true",
        "normalize_embedding_logits": "true"}
    assert any("bfloat16" in n and "5.65625" in n for n in conversion["maxtext_notes"])
    assert not any("RoPE scaling" in n for n in conversion["maxtext_notes"])
    config = json.loads((src / "config.json").read_text())  # transformers 4's keys: the same flags
    del config["rope_parameters"]
    (src / "config.json").write_text(json.dumps({**config, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}}))
    assert convert(src, tmp_path / "mt4", "--format", "json", "-o", str(report)) == 0
    again = dict(f.split("=", 1) for f in json.loads(report.read_text())["extra"]["conversion"]["maxtext_flags"])
    assert {k: again[k] for k in ("rope_max_timescale", "local_rope_max_timescale", "rope_linear_scaling_factor")} == {
        "rope_max_timescale": "1000000", "local_rope_max_timescale": "10000", "rope_linear_scaling_factor": "8"}


@pytest.mark.parametrize("change,says", [
    ({"query_pre_attn_scalar": 12}, "get_query_pre_attn_scalar"),
    ({"layer_types": ["sliding_attention"] * 4 + ["full_attention"] * 4}, "GEMMA3_ATTENTION_PATTERN"),
    ({"tie_word_embeddings": False}, "logits_via_embedding"),
    ({"use_bidirectional_attention": True}, "causally"),
    ({"rope_parameters": {**GEMMA3_ROPE, "sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 1e4}}}, "sliding layers' RoPE"),
])
def test_what_maxtexts_gemma3_block_hard_codes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          change: dict[str, Any], says: str) -> None:
    src = build("gemma3", tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    capsys.readouterr()
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["code"] for f in findings] == ["CG304"] and says in findings[0]["message"], findings
    assert not (tmp_path / "mt").exists() and not list(tmp_path.glob(".mt.partial-*"))


def test_a_multimodal_gemma3_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma3ForConditionalGeneration: MaxText's gemma3 mapping converts its vision tower with the text
    decoder; this row writes the text decoder only, so the whole model is refused, saying why."""
    import transformers as tf

    text = {k: v for k, v in BASE.items() if k != "vocab_size"}
    config = tf.Gemma3Config(text_config={**text, "vocab_size": 300}, mm_tokens_per_image=4, image_token_index=299,
                             boi_token_index=297, eoi_token_index=298,
                             vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                            "num_attention_heads": 2, "image_size": 28, "patch_size": 14})
    tf.Gemma3ForConditionalGeneration(config).save_pretrained(tmp_path / "src")
    capsys.readouterr()
    assert convert(tmp_path / "src", tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["code"] for f in findings] == ["CG304"], findings
    assert "vision" in findings[0]["message"] and "gemma3_text" in findings[0]["message"]
    assert not (tmp_path / "mt").exists()


def test_missing_tensor_and_wrong_shape_are_cg304(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import save_file

    src = build("qwen3", tmp_path / "src", torch.float32)
    state = load_file(str(src / "model.safetensors"))
    del state["model.layers.1.self_attn.k_norm.weight"]
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["code"], f["tensor"]) for f in findings] == [("CG304", "model.layers.1.self_attn.k_norm.weight")]
    config = json.loads((src / "config.json").read_text())
    config["intermediate_size"] = 64
    (src / "config.json").write_text(json.dumps(config))
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert {f["tensor"] for f in findings if "shape" in f["message"]} == {
        f"model.layers.{i}.mlp.{n}_proj.weight" for i in range(2) for n in ("gate", "up", "down")}
    assert not (tmp_path / "mt").exists() and not list(tmp_path.glob(".mt.partial-*"))


def test_dtype_cast_and_the_items_path_back(tmp_path: Path) -> None:
    src = build("qwen3", tmp_path / "src")
    assert convert(src, tmp_path / "mt", "--dtype", "fp32") == 0
    tree = restore(tmp_path / "mt" / "0" / "items")
    assert {a.dtype.name for a in tree.values()} == {"float32"}
    back = tmp_path / "back"
    assert main(["convert", str(tmp_path / "mt" / "0" / "items"), "--to", "torch", "--out", str(back)]) == 0
    before, after = load_file(str(src / "model.safetensors")), load_file(str(back / "model.safetensors"))
    for name, value in before.items():  # bf16 -> fp32 is exact, and Qwen3's layout only moves elements
        assert bits(value.astype(np.float32)) == bits(after[name]), name
    config = json.loads((back / "config.json").read_text())
    assert config.get("torch_dtype", config.get("dtype")) == "float32"


def test_a_maxtext_checkpoint_it_did_not_write_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """MaxText's own checkpoints carry no HF config: the way back says so in one line and writes nothing."""
    tree = {"params": {"params": {"token_embedder": {"embedding": np.ones((4, 2), np.float32)}}}}
    manager = ocp.CheckpointManager((tmp_path / "mt").resolve(), item_names=("items",),
                                    item_handlers={"items": ocp.PyTreeCheckpointHandler(use_zarr3=True)})
    manager.save(0, args=ocp.args.Composite(items=ocp.args.PyTreeSave(tree)))
    manager.wait_until_finished()
    manager.close()
    assert main(["convert", str(tmp_path / "mt"), "--to", "torch", "--out", str(tmp_path / "back")]) == 2
    assert "ckpt-guard did not write" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()


def test_a_config_without_sizes_is_cg304(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = build("llama", tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    del config["num_attention_heads"]
    (src / "config.json").write_text(json.dumps(config))
    assert convert(src, tmp_path / "mt", "--format", "json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["code"] for f in findings] == ["CG304"] and "num_attention_heads" in findings[0]["message"]
    assert not (tmp_path / "mt").exists()


def test_an_ocdbt_tree_that_is_not_maxtexts_still_converts_as_orbax(tmp_path: Path) -> None:
    """Detection is by MaxText's tree (every leaf under params/params), not by OCDBT alone."""
    from guard.cli.convert_maxtext import is_maxtext_source

    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=True))
    checkpointer.save((tmp_path / "flax").resolve(), {"model": {"embed_tokens": {"embedding": np.ones((4, 2))}}})
    assert (tmp_path / "flax" / "manifest.ocdbt").is_file() and not is_maxtext_source(tmp_path / "flax")
    src = build("qwen3", tmp_path / "src")
    assert convert(src, tmp_path / "mt") == 0
    assert is_maxtext_source(tmp_path / "mt") and is_maxtext_source(tmp_path / "mt" / "0" / "items")
