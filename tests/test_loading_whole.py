"""The judgement's shortcut (``whole``): true exactly where judging in full finds nothing.

``whole`` says "the weights the class builds, each of its shape" from the sorted names written out as
text, without the judgement's work per name; the scan asks it first and judges only where it is false.
Here both are asked of every differential case of ``test_loading.py`` (every architecture of the table,
each layout, each planted defect, as transformers 5 saved them): the shortcut must hold for every model
as saved and never for a defect, and where it holds the full judgement must find nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
from test_loading import _cases, fused, plant, save, tensors  # noqa: E402

from guard.inventory.architectures import judge, table_row, whole  # noqa: E402

RENAMED = {("gpt_neox", "as saved"), ("mixtral", "per-expert (as saved)"), ("gemma3", "as saved")}


def _verdicts(root: Path) -> tuple[bool, object]:
    config = json.loads((root / "config.json").read_text())
    found = table_row(config)
    assert not isinstance(found, str), found
    class_name, row = found
    state = {name: tuple(t.shape) for name, t in tensors(root).items()}
    return (whole(row, class_name, config, list(state), list(state.values())),
            judge(row, class_name, config, state, tried_whole=True))


@pytest.mark.parametrize(("model_type", "layout", "defect"), _cases())
def test_whole_agrees_with_the_judgement(tmp_path: Path, model_type: str, layout: str, defect: str) -> None:
    root = save(tmp_path / model_type, model_type, tie=False if defect == "head removed" else None)
    if layout == "fused":
        fused(root, model_type)
    if defect != "none":
        plant(root, model_type, defect)
    shortcut, loading = _verdicts(root)
    found = not isinstance(loading, str) and any(loading[1:5])
    # every saved model takes the shortcut, but those saved with names transformers renames at load (the
    # judgement renames them: GPT-NeoX's embed_out, the Hub's per-expert Mixtral, Gemma 3's language_model)
    assert shortcut == (defect == "none" and (model_type, layout) not in RENAMED), (shortcut, loading)
    assert not (shortcut and found), loading
    assert found == (defect != "none"), loading


def test_whole_on_tied_and_untied_heads(tmp_path: Path) -> None:
    for tie in (True, False):
        root = save(tmp_path / f"llama-{tie}", "llama", tie=tie)
        assert ("lm_head.weight" in tensors(root)) != tie
        assert _verdicts(root)[0]


def test_whole_refuses_a_swapped_shape_and_a_name_with_a_line_break() -> None:
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8,
              "intermediate_size": 12, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
              "num_hidden_layers": 2, "tie_word_embeddings": True}
    class_name, row = table_row(config)  # type: ignore[misc]  # a row: llama has one
    names, shapes = [], []
    for layer in range(2):
        p = f"model.layers.{layer}."
        for name, shape in (("input_layernorm.weight", (8,)), ("post_attention_layernorm.weight", (8,)),
                            ("mlp.down_proj.weight", (8, 12)), ("mlp.gate_proj.weight", (12, 8)),
                            ("mlp.up_proj.weight", (12, 8)), ("self_attn.k_proj.weight", (4, 8)),
                            ("self_attn.v_proj.weight", (4, 8)), ("self_attn.q_proj.weight", (8, 8)),
                            ("self_attn.o_proj.weight", (8, 8))):
            names.append(p + name)
            shapes.append(shape)
    names += ["model.embed_tokens.weight", "model.norm.weight"]
    shapes += [(16, 8), (8,)]
    assert whole(row, class_name, config, names, shapes)
    assert judge(row, class_name, config, dict(zip(names, shapes)), tried_whole=True)[1:5] == ((),) * 4
    swapped = list(shapes)
    swapped[2], swapped[3] = swapped[3], swapped[2]  # the down and gate projections' shapes exchanged
    assert not whole(row, class_name, config, names, swapped)
    # two names next to each other in sorted order run together across a line break: the same text, a name fewer
    shape_of = dict(zip(names, shapes))
    ordered = sorted(names)
    joined = ordered[:3] + [ordered[3] + "\n" + ordered[4]] + ordered[5:]
    assert not whole(row, class_name, config, joined, [shape_of[n.split("\n")[0]] for n in joined])


SHARDED = [("qwen3_moe", "none"), ("qwen3_moe", "expert removed"), ("qwen3_moe", "layer added"),
           ("llama", "none"), ("llama", "head removed"), ("llama", "shape changed"), ("gemma3", "none")]


@pytest.mark.parametrize(("model_type", "defect"), SHARDED)
def test_a_sharded_set_is_judged_in_the_index_proofs_order(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, model_type: str,
                                                            defect: str) -> None:
    """A sharded set's proven index sorted its names already: the loading check takes that order (``in_order``)
    and says what it says of the same tensors in one file, saved whole or with each defect planted."""
    from huggingface_hub import save_torch_state_dict
    from scanning import codes, json_scan
    from test_loading import MODELS

    from guard.inventory import architectures

    one = save(tmp_path / "one", model_type, tie=False if defect == "head removed" else None)
    if defect != "none":
        plant(one, model_type, defect)
    sharded = tmp_path / "sharded"
    if defect == "none":  # as transformers shards it
        import transformers

        model = getattr(transformers, MODELS[model_type][0]).from_pretrained(one)
        model.save_pretrained(sharded, max_shard_size="20KB")
    else:  # the planted tensors, sharded as huggingface_hub writes them
        sharded.mkdir()
        (sharded / "config.json").write_bytes((one / "config.json").read_bytes())
        save_torch_state_dict(tensors(one), sharded, max_shard_size="20KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    asked: list[tuple[bool, bool]] = []
    real = architectures.whole

    def spy(*args: object, in_order: bool = False) -> bool:
        answer = real(*args, in_order=in_order)  # type: ignore[arg-type]  # the arguments as given
        asked.append((in_order, answer))
        return answer

    monkeypatch.setattr(architectures, "whole", spy)
    verdicts, orders = [], []
    for root in (one, sharded):
        asked.clear()
        _, report = json_scan(capsys, str(root))
        verdicts.append(codes(report) & {"CG123", "CG124", "CG125", "CG127"})
        orders.append(asked[0])  # the scan's own question (CG124's fix asks again of the config it proposes)
    # the one file sorted its own names; the shards were sorted by the index proof
    assert [in_order for in_order, _ in orders] == [False, True]
    # the shortcut's answer is the one file's, in either order: true exactly for the model as saved (Gemma 3's
    # names are renamed at load: the judgement says it)
    assert orders[0][1] == orders[1][1] == (defect == "none" and model_type != "gemma3")
    assert verdicts[0] == verdicts[1]
    assert bool(verdicts[1]) == (defect != "none"), verdicts
