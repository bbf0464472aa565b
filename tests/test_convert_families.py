"""Every PT/Flax pair of transformers 4.57: the family table and rules against transformers' own classes.

The rules convert without transformers; these tests prove them equal to it, pair by pair:
the table's rows against the classes' attributes and buffers, the converted tree against the
Flax class's own parameter tree, the output against both ``from_pretrained`` loaders, and the
way back bit-exact.  Parity runs in ``test_convert_pairs_parity.py``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
import transformers  # noqa: E402
from legacy_env import here_has_flax_transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from test_convert import convert, flax_params, safetensors_bits  # noqa: E402
from tiny_pairs import pairs, reference_tree, tiny_config  # noqa: E402

from guard.convert.map.families import ALIASES, FAMILIES, Family  # noqa: E402

# the pairs are transformers 4's Flax classes: these tests run in .venv-tf4 (`make test`); under transformers 5
# the module still imports (test_convert_history and test_convert_pairs_parity import from it), with no pairs
pytestmark = [pytest.mark.slow, pytest.mark.transformers4]
PAIRS = pairs() if here_has_flax_transformers() else []
T5_FAMILY = ("t5", "mt5", "longt5")


def family_rows(model_type: str, config: Any) -> Iterator[tuple[str, Family, Any]]:
    """(name prefix, family, config) for a model and, for composites, each of its parts."""
    family = FAMILIES[ALIASES.get(model_type, model_type)]
    yield "", family, config
    for part, key in family.parts.items():
        sub = getattr(config, key)
        for prefix, fam, cfg in family_rows(sub.model_type, sub):
            yield f"{part}.{prefix}", fam, cfg


def family_for(name: str, model_type: str, config: Any) -> tuple[str, Family, Any]:
    """The most specific row that owns ``name``, and the name relative to it."""
    best = max((r for r in family_rows(model_type, config) if name.startswith(r[0])), key=lambda r: len(r[0]))
    return name[len(best[0]):], best[1], best[2]


def matches(patterns: tuple[str, ...], name: str) -> bool:
    return any(re.search(p + "$", name) for p in patterns)


def test_the_table_has_a_row_for_every_pair_and_no_other() -> None:
    listed = {(mt, cls) for mt, fam in FAMILIES.items() for cls in fam.classes}
    found = {(mt, pt) for mt, pt, _ in PAIRS}
    assert found == listed, (sorted(found - listed), sorted(listed - found))


@pytest.mark.parametrize(("model_type", "pt_name", "flax_name"), PAIRS, ids=[p[1] for p in PAIRS])
def test_row_agrees_with_transformers_classes(model_type: str, pt_name: str, flax_name: str) -> None:
    """Prefix, roots, buffers, tied keys and the tie default: read from transformers, not guessed."""
    config = tiny_config(model_type)
    family = FAMILIES[model_type]
    pt_cls, flax_cls = getattr(transformers, pt_name), getattr(transformers, flax_name)
    assert family.prefix == pt_cls.base_model_prefix  # the Flax twins' nesting is proven by the tree test
    assert pt_name in family.classes and flax_cls.__name__ == "Flax" + pt_name.replace("LMHeadModel", "ForCausalLM") \
        if pt_name == "BertLMHeadModel" else flax_cls.__name__ == "Flax" + pt_name
    if not family.parts:
        assert family.tie_default == type(config)().tie_word_embeddings
    with torch.device("meta"):
        model = pt_cls(config)
    state = set(model.state_dict())
    roots = {k.split(".")[1] if k.split(".")[0] == family.prefix else k.split(".")[0] for k in state}
    assert roots <= family.roots, roots - family.roots
    for name, _ in model.named_buffers():  # transformers' loader skips any unexpected key naming a buffer
        if name not in state:
            rest, fam, _cfg = family_for(name, model_type, config)
            assert matches(fam.buffers, rest), f"{name}: a buffer the {model_type} row does not list"
    for pattern in pt_cls._keys_to_ignore_on_load_unexpected or ():
        assert any(p == pattern or re.sub(r"\\\.", ".", p) in pattern or pattern.replace(".", r"\.") in p
                   for p in family.buffers), pattern
    for tied in pt_cls._tied_weights_keys or ():
        rest, fam, _cfg = family_for(tied, model_type, config)
        assert matches(fam.tied + fam.always_tied, rest) or matches(fam.tied + fam.always_tied, tied), tied
    saved_without = pt_cls._keys_to_ignore_on_save or ()  # the way back must not write these either
    assert all(matches(family.unsaved.get(pt_name, ()), key) for key in saved_without), saved_without
    assert bool(saved_without) == bool(family.unsaved.get(pt_name)), family.unsaved
    for pattern in pt_cls._keys_to_ignore_on_load_missing or ():
        if "embed_positions" in pattern:
            assert matches(family.computed, pattern.replace("\\", "")), pattern


def save_tiny(root: Path, model_type: str, pt_name: str, *, dtype: torch.dtype | None = None,
              history: bool = False) -> Path:
    """The PyTorch model saved by transformers; ``history`` adds what older versions saved too:
    every buffer (position_ids, inv_freq, attn.bias, ...) and the tied aliases."""
    torch.manual_seed(0)
    model = getattr(transformers, pt_name)(tiny_config(model_type))
    if dtype is not None:
        model = model.to(dtype)
    src = root / "src"
    model.save_pretrained(src)
    if history:
        tensors = load_file(src / "model.safetensors")
        extra = {k: v for k, v in model.state_dict(keep_vars=False).items() if k not in tensors}
        extra.update({k: v for k, v in model.named_buffers() if k not in tensors})
        for name, value in extra.items():
            tensors[name] = value.detach().clone().contiguous()
        if model_type in ("llama", "mistral", "gemma"):  # where transformers < 4.38 kept the rotary buffer
            inv_freq = dict(model.named_buffers())[f"{'model.' if 'Causal' in pt_name else ''}rotary_emb.inv_freq"]
            tensors[("model." if "Causal" in pt_name else "") + "layers.0.self_attn.rotary_emb.inv_freq"] = inv_freq
        save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    return src


class LoadLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def load_log() -> Iterator[LoadLog]:
    handler = LoadLog()
    hf_logger = transformers.utils.logging.get_logger("transformers")
    level = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_warning()
    hf_logger.addHandler(handler)
    yield handler
    hf_logger.removeHandler(handler)
    transformers.utils.logging.set_verbosity(level)


def old_clip() -> Any:
    import jax.numpy as jnp

    clip = jnp.clip

    def shim(x: Any, a_min: Any = None, a_max: Any = None, **kw: Any) -> Any:
        return clip(x, kw.pop("min", a_min), kw.pop("max", a_max), **kw)

    return shim


def flax_load_check(out: Path, flax_name: str, monkeypatch: pytest.MonkeyPatch, log: LoadLog) -> set[Any]:
    """transformers' own Flax loader: the keys it loads, with no "newly initialized" / "not used" line."""
    import jax.numpy as jnp
    from flax.traverse_util import flatten_dict

    cls = getattr(transformers, flax_name)
    monkeypatch.setattr(jnp, "clip", old_clip())  # T5 family: jnp.clip(a_max=) is gone from jax 0.10
    try:
        _model, params = cls.from_pretrained(out, _do_init=False)
    except ValueError:  # composites refuse _do_init=False
        params = cls.from_pretrained(out).params
    bad = [line for line in log.lines if "newly initialized" in line or "were not used" in line]
    assert not bad, bad
    return set(flatten_dict(dict(params)))


def torch_load_check(back: Path, pt_name: str, model_type: str) -> None:
    """Nothing missing but what the row says the Flax twin has no place for (BigBird's MLM pooler)."""
    _model, info = getattr(transformers, pt_name).from_pretrained(back, output_loading_info=True)
    unavoidable = FAMILIES[model_type].pt_only.get(pt_name, ())
    assert all(matches(unavoidable, k) for k in info["missing_keys"]), info
    assert info["unexpected_keys"] == [] and info["mismatched_keys"] == [], info


@pytest.mark.parametrize("history", [False, True], ids=["as-saved", "with-history"])
@pytest.mark.parametrize(("model_type", "pt_name", "flax_name"), PAIRS, ids=[p[1] for p in PAIRS])
def test_every_pair_converts_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_log: LoadLog,
                                       model_type: str, pt_name: str, flax_name: str, history: bool) -> None:
    src = save_tiny(tmp_path, model_type, pt_name, history=history)
    plain = save_tiny(tmp_path / "plain", model_type, pt_name)
    (tmp_path / "plain.json").write_text(json.dumps(sorted(safetensors_bits(plain))))
    report = tmp_path / "r.json"
    assert convert(src, "--to", "flax", "--out", tmp_path / "f", "-f", "json", "-o", report) == 0, \
        json.loads(report.read_text())["findings"]
    figures = json.loads(report.read_text())["extra"]["conversion"]
    assert figures["mapping"] == "rules" and figures["architecture"] == flax_name
    written = {k: tuple(v.shape) for k, v in flax_params(tmp_path / "f").items()}
    config = transformers.AutoConfig.from_pretrained(src)
    assert written == reference_tree(getattr(transformers, flax_name), config)
    assert flax_load_check(tmp_path / "f", flax_name, monkeypatch, load_log) == set(written)
    if history and figures["tensors_in"] > len(json.loads((tmp_path / "plain.json").read_text())):
        assert figures["dropped"] or figures["tied"]

    assert convert(tmp_path / "f", "--to", "torch", "--out", tmp_path / "b") == 0
    original, back = safetensors_bits(plain), safetensors_bits(tmp_path / "b")
    assert {k: back[k] for k in original if k in back} == {k: v for k, v in original.items() if k in back}
    heads = next((d["tensors"] for d in figures["decisions"] if d["kind"] == "head"), [])
    assert set(original) - set(back) == set(heads)  # dropped with a warning, and named
    assert set(back) - set(original) == set()  # exactly what save_pretrained of the class holds, no more
    torch_load_check(tmp_path / "b", pt_name, model_type)
