"""`ckpt-guard diff OLD NEW`: models written by transformers, diffusers and safetensors, changed the way
people change them, each diff asserted tensor by tensor against what torch computes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from guard.cli import main  # noqa: E402
from guard.samples import save_torch_bin  # noqa: E402


def diff_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    rc = main(["diff", "--no-summary", "--format", "json", *map(str, args)])
    return rc, json.loads(capsys.readouterr().out)


def diff_text(capsys: pytest.CaptureFixture[str], *args: str, fmt: str = "text") -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["diff", "--no-summary", "--format", fmt, *map(str, args)])
    return rc, capsys.readouterr().out


def tensors(directory: Path) -> dict[str, Any]:
    """Every tensor of every safetensors file in a directory, as torch reads them."""
    out: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(path)))
    return out


def only_set(result: dict[str, Any]) -> dict[str, Any]:
    (model,) = result["models"]
    (ws,) = model["sets"]
    return ws


def torch_figures(old: Any, new: Any) -> tuple[float, float | None]:
    """max |new - old| as torch computes it (promoted to float32 at least), and that over max |old|."""
    wide = torch.float64 in (old.dtype, new.dtype)
    old, new = (old.double(), new.double()) if wide else (old.float(), new.float())
    diff = (new - old).abs().max().item()
    scale = old.abs().max().item()
    return diff, (diff / scale if scale else None)


def llama(seed: int = 0, layers: int = 3) -> Any:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=False, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def bert_classifier() -> Any:
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                     intermediate_size=48, max_position_embeddings=32, num_labels=3)
    return transformers.BertForSequenceClassification(config).eval()


def test_a_resave_in_bf16_recasts_every_tensor_by_the_rounding_torch_sees(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    ws = only_set(result)
    assert ws["added"] == [] and ws["removed"] == [] and ws["unchanged"] == 0
    assert {c["name"] for c in ws["changed"]} == set(old) == set(new)
    for c in ws["changed"]:
        assert c["kinds"] == ["recast"]
        assert (c["old"]["dtype"], c["new"]["dtype"]) == ("F32", "BF16")
        assert c["old"]["shape"] == c["new"]["shape"] == list(old[c["name"]].shape)
        max_abs, max_rel = torch_figures(old[c["name"]], new[c["name"]])
        assert c["max_abs"] == pytest.approx(max_abs, rel=1e-12, abs=0)
        assert c["max_rel"] == pytest.approx(max_rel, rel=1e-12)
        assert c["identical"] is False or max_abs == 0
    assert ws["old"]["parameters"] == ws["new"]["parameters"] == sum(t.numel() for t in old.values())
    assert ws["old"]["bytes"] == 2 * ws["new"]["bytes"] == sum(4 * t.numel() for t in old.values())
    # the change brings CG101 (bf16 under the default fp32 expectation): that fails it
    assert rc == 1 and "CG101" in {f["code"] for f in result["introduced"]}
    assert result["resolved"] == [] and result["summary"]["tensors_recast"] == len(old)
    assert result["models"][0]["note"] == "config dtype float32 -> bfloat16"


def test_many_tensors_with_one_change_collapse_into_one_line(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    rc, out = diff_text(capsys, tmp_path / "old", tmp_path / "new")
    recast = [line for line in out.splitlines() if "recast" in line]
    count = len(tensors(tmp_path / "old"))
    assert len(recast) == 1 and f"F32 -> BF16 ({count} tensor(s), e.g. " in recast[0], out
    assert "model.safetensors: changed" in out and rc == 1


def test_under_a_bf16_expectation_the_resave_resolves_a_finding(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--expect", "bf16", tmp_path / "old", tmp_path / "new")
    assert rc == 0 and [f["code"] for f in result["introduced"]] == ["CG104"]  # a note: norms in bf16
    assert [f["code"] for f in result["resolved"]] == ["CG101"]
    assert result["resolved"][0]["path"] == f"{tmp_path / 'old'}/model.safetensors"


def test_resize_token_embeddings_reshapes_embeddings_and_head_and_keeps_the_old_rows(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.resize_token_embeddings(136)
    model.save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    reshaped = {name for name in old if old[name].shape != new[name].shape}
    assert reshaped == {"model.embed_tokens.weight", "lm_head.weight"}
    ws = only_set(result)
    assert {c["name"] for c in ws["changed"]} == reshaped
    for c in ws["changed"]:
        assert c["kinds"] == ["reshaped"]
        assert (c["old"]["shape"], c["new"]["shape"]) == ([128, 32], [136, 32])
        assert c["overlap_rows"] == 128
        assert c["identical"] is torch.equal(old[c["name"]], new[c["name"]][:128])
        assert c["max_abs"] == pytest.approx(torch_figures(old[c["name"]], new[c["name"]][:128])[0], abs=0)
    assert ws["unchanged"] == len(old) - 2
    assert ws["new"]["parameters"] - ws["old"]["parameters"] == 2 * 8 * 32
    assert rc == 0
    _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new", "--values")
    assert "~ reshaped [128, 32] -> [136, 32] (2 tensor(s): " in out
    assert "the rows both sides hold are identical" in out


def test_a_bias_dropped_from_every_layer_is_one_removed_line(tmp_path: Path, capsys) -> None:
    model = bert_classifier()
    model.save_pretrained(tmp_path / "old")
    for layer in model.bert.encoder.layer:
        dense = layer.output.dense
        replacement = torch.nn.Linear(dense.in_features, dense.out_features, bias=False)
        replacement.weight.data.copy_(dense.weight.data)
        layer.output.dense = replacement
    model.save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    ws = only_set(result)
    assert [t["name"] for t in ws["removed"]] == sorted(set(old) - set(new)) == [
        f"bert.encoder.layer.{i}.output.dense.bias" for i in range(3)]
    assert all(t["dtype"] == "F32" and t["shape"] == [32] for t in ws["removed"])
    assert ws["added"] == [] and ws["changed"] == []  # every other tensor kept its bytes
    assert ws["unchanged"] == len(new) and all(torch.equal(old[n], new[n]) for n in new)
    assert ws["old"]["parameters"] - ws["new"]["parameters"] == 3 * 32
    # the new side is one transformers loads with the biases missing (filled at random, as it reports): the
    # change introduces that error
    assert rc == 1 and [f["code"] for f in result["introduced"]] == ["CG123"]
    assert "output.dense.bias" in result["introduced"][0]["message"]
    _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new")
    removed = [line for line in out.splitlines() if "removed" in line]
    assert removed == ["    - removed bert.encoder.layer.*.output.dense.bias F32 [32] (3 tensor(s): "
                       "bert.encoder.layer.0.output.dense.bias, bert.encoder.layer.1.output.dense.bias, "
                       "bert.encoder.layer.2.output.dense.bias)"], out


def fine_tune_layer(model: Any, index: int, scale: float = 1e-3) -> None:
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.model.layers[index].parameters():
            p.add_(torch.randn_like(p) * scale)


def test_a_fine_tune_of_some_layers_changes_only_their_values(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old", max_shard_size="40KB")
    fine_tune_layer(model, 1)
    model.save_pretrained(tmp_path / "new", max_shard_size="40KB")
    assert len(list((tmp_path / "new").glob("*.safetensors"))) > 3  # sharded: some files equal, some not
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    moved = {n for n in old if not torch.equal(old[n], new[n])}
    assert moved and all(n.startswith("model.layers.1.") for n in moved)
    ws = only_set(result)
    assert ws["key"] == "model.safetensors.index.json"
    assert {c["name"] for c in ws["changed"]} == moved and ws["values_differ"] == len(moved)
    for c in ws["changed"]:
        assert c["kinds"] == ["values"] and c["identical"] is False
        max_abs, max_rel = torch_figures(old[c["name"]], new[c["name"]])
        assert c["max_abs"] == pytest.approx(max_abs, rel=1e-12) and c["max_rel"] == pytest.approx(max_rel, rel=1e-12)
    assert ws["values_only"] is True and ws["unchanged"] == len(old) - len(moved) and ws["not_compared"] == 0
    assert rc == 0 and result["introduced"] == result["resolved"] == []
    _, out = diff_text(capsys, "--values", tmp_path / "old", tmp_path / "new")
    assert "only values changed" in out and f"~ values same dtype and shape ({len(moved)} tensor(s)" in out
    # headers alone cannot see it: the same names, dtypes and shapes
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    assert only_set(result)["status"] == "unchanged" and result["summary"]["changed"] is False


def test_an_identical_resave_is_no_change(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.save_pretrained(tmp_path / "new")
    assert (tmp_path / "old/model.safetensors").read_bytes() == (tmp_path / "new/model.safetensors").read_bytes()
    for values in ([], ["--values"]):
        rc, result = diff_json(capsys, *values, tmp_path / "old", tmp_path / "new")
        assert rc == 0 and result["summary"]["changed"] is False
        assert result["models"][0]["status"] == "unchanged"
        assert only_set(result)["unchanged"] == len(tensors(tmp_path / "old"))
    rc, out = diff_text(capsys, "--values", tmp_path / "old", tmp_path / "new")
    assert (f"unchanged, {len(tensors(tmp_path / 'old'))} tensor(s) with identical values" in out
            and "no weight changes" in out)
    rc, md = diff_text(capsys, tmp_path / "old", tmp_path / "new", fmt="markdown")
    assert "no weight changes" in md and "| model |" not in md


def test_a_pickle_resaved_as_safetensors_is_one_set_with_the_same_values(tmp_path: Path, capsys) -> None:
    model = bert_classifier()
    save_torch_bin(model, tmp_path / "old")
    model.save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    ws = only_set(result)
    assert ws["key"] == "pytorch_model.bin -> model.safetensors" and ws["note"] == "format torch -> safetensors"
    new = tensors(tmp_path / "new")
    state = torch.load(tmp_path / "old/pytorch_model.bin", weights_only=True)
    assert ws["changed"] == [] and ws["unchanged"] == len(new) and ws["not_compared"] == 0
    assert all(torch.equal(state[n], new[n]) for n in new)
    assert [t["name"] for t in ws["removed"]] == sorted(set(state) - set(new))  # tied aliases the .bin kept


def test_diffusers_fp16_variant_against_the_default_weights(tmp_path: Path, capsys) -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(3)
    unet = diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(8, 16), norm_num_groups=4,
                                 down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D"))
    unet.save_pretrained(tmp_path / "old")
    unet.to(torch.float16).save_pretrained(tmp_path / "new", variant="fp16")
    old_file = tmp_path / "old/diffusion_pytorch_model.safetensors"
    new_file = tmp_path / "new/diffusion_pytorch_model.fp16.safetensors"
    rc, result = diff_json(capsys, "--values", old_file, new_file)
    old, new = safetensors_torch.load_file(str(old_file)), safetensors_torch.load_file(str(new_file))
    ws = only_set(result)
    assert ws["key"] == "diffusion_pytorch_model.safetensors -> diffusion_pytorch_model.fp16.safetensors"
    assert {c["name"] for c in ws["changed"]} == set(old) == set(new)
    for c in ws["changed"]:
        assert (c["old"]["dtype"], c["new"]["dtype"], c["kinds"]) == ("F32", "F16", ["recast"])
        assert c["max_abs"] == pytest.approx(torch_figures(old[c["name"]], new[c["name"]])[0], rel=1e-12)
    # a directory with the variant added beside the default weights: one set added, the other unchanged
    shutil.copytree(tmp_path / "old", tmp_path / "both")
    shutil.copy(new_file, tmp_path / "both")
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "both")
    sets = {s["key"]: s for s in result["models"][0]["sets"]}
    assert sets["diffusion_pytorch_model.safetensors"]["status"] == "unchanged"
    added = sets["diffusion_pytorch_model.fp16.safetensors"]
    assert added["status"] == "added" and added["new"]["tensors"] == len(new)


def test_a_missing_path_is_a_usage_error(tmp_path: Path, capsys) -> None:
    llama().save_pretrained(tmp_path / "old")
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "old"), str(tmp_path / "nope")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "nope: no such file or directory" in err[0]


def test_two_different_models_say_so_in_one_line_then_list_the_tensors(tmp_path: Path, capsys) -> None:
    llama().save_pretrained(tmp_path / "old")
    bert_classifier().save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    ws = only_set(result)
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    assert ws["note"] == (f"the two sides hold different models: 0 of {len(old)} old and {len(new)} new tensor "
                          "names in common")
    assert {t["name"] for t in ws["removed"]} == set(old) and {t["name"] for t in ws["added"]} == set(new)
    _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new")
    assert out.count("the two sides hold different models") == 1
    assert out.index("different models") < out.index("- removed") < out.index("+ added")


def test_an_unreadable_shard_is_its_finding_and_the_rest_is_still_compared(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old", max_shard_size="40KB")
    fine_tune_layer(model, 0)
    model.save_pretrained(tmp_path / "new", max_shard_size="40KB")
    index = json.loads((tmp_path / "new/model.safetensors.index.json").read_text())["weight_map"]
    broken = index["model.layers.2.mlp.up_proj.weight"]
    (tmp_path / "new" / broken).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    ws = only_set(result)
    lost = {name for name, file in index.items() if file == broken}
    assert ws["removed"] == [] and ws["unknown"] == len(lost) and ws["not_compared"] == 0  # unknown, not removed
    assert ws["unreadable"] == [f"{tmp_path / 'new'}/{broken}"]
    moved = {c["name"] for c in ws["changed"]}
    assert moved and all(n.startswith("model.layers.0.") for n in moved)
    assert rc == 1 and [f["code"] for f in result["introduced"]] == ["CG001"]
    assert result["introduced"][0]["path"].endswith(broken)


def test_hostile_tensor_names_stay_inert_in_every_format(tmp_path: Path, capsys) -> None:
    names = ["evil\n::error file=x::pwned", "\x1b[31mred\x1b[0m", "<img src=x>|**bold**|", "\u202egnp.exe"]
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    safetensors_torch.save_file({n: torch.ones(2, 2) for n in names}, str(tmp_path / "old/model.safetensors"))
    safetensors_torch.save_file({n: torch.ones(2, 3, dtype=torch.float16) for n in names[:3]},
                                str(tmp_path / "new/model.safetensors"))
    for fmt in ("text", "markdown", "github", "json"):
        _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new", fmt=fmt)
        assert "\x1b" not in out and "\u202e" not in out, fmt
        assert not any(line.startswith("::error file=x") for line in out.splitlines()), fmt
    _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new", fmt="markdown")
    assert "&lt;img src=x&gt;&#124;\\*\\*bold\\*\\*&#124;" in out and "<img" not in out


def test_models_pair_by_their_path_under_each_side(tmp_path: Path, capsys) -> None:
    llama().save_pretrained(tmp_path / "old/lm")
    bert_classifier().save_pretrained(tmp_path / "old/classifier")
    llama().save_pretrained(tmp_path / "new/lm")
    llama(seed=5, layers=1).save_pretrained(tmp_path / "new/small")
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    status = {m["key"]: m["status"] for m in result["models"]}
    assert status == {"classifier": "removed", "lm": "unchanged", "small": "added"}


def test_markdown_stays_within_its_budget(tmp_path: Path, capsys) -> None:
    from guard.config import Policy
    from guard.diff import compare_sides, local_side, render_change_markdown

    model = llama(layers=8)
    model.save_pretrained(tmp_path / "old")
    bert_classifier().save_pretrained(tmp_path / "new")
    change = compare_sides(local_side(tmp_path / "old"), local_side(tmp_path / "new"), Policy())
    for budget in (2500, 6000):
        text = render_change_markdown(change, heading="### org/model: main@1 → main@2", max_bytes=budget)
        assert text.startswith("### org/model: main@1 → main@2\n")
        assert len(text.encode()) <= budget and "| model | weight set | change |" in text


def test_json_is_versioned_and_sarif_carries_only_what_the_change_introduces(tmp_path: Path, capsys) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    _, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    assert (result["version"], result["kind"]) == (1, "ckpt-guard-diff")
    assert set(result["summary"]) >= {"changed", "introduced", "resolved", "failed", "fail_on"}
    _, sarif = diff_text(capsys, tmp_path / "old", tmp_path / "new", fmt="sarif")
    results = json.loads(sarif)["runs"][0]["results"]
    assert sorted(r["ruleId"] for r in results) == sorted(f["code"] for f in result["introduced"])


def test_fail_on_decides_the_exit_code_and_actions_get_the_summary(tmp_path: Path, capsys, monkeypatch) -> None:
    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["diff", "--fail-on", "never", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    assert main(["diff", "--ignore", "CG101", str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    assert main(["diff", "--ignore", "CG101", "--fail-on", "note", str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    assert summary.read_text().count("ckpt-guard diff") == 3


def test_a_header_diff_imports_neither_click_nor_numpy(tmp_path: Path) -> None:
    import subprocess
    import sys

    model = llama()
    model.save_pretrained(tmp_path / "old")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "new")
    code = ("import sys, json\nfrom guard.cli import main\n"
            f"rc = main(['diff', '--no-summary', '-f', 'json', {str(tmp_path / 'old')!r}, {str(tmp_path / 'new')!r}])\n"
            "print(json.dumps([rc, sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    rc, modules = json.loads(out.stdout.splitlines()[-1])
    assert rc == 1
    assert not [m for m in ("click", "typing", "numpy", "torch", "safetensors", "transformers") if m in modules]


@pytest.mark.parametrize("args", [
    ["a", "b"], ["--values", "-f", "json", "a", "b"], ["--format=markdown", "-o", "out.md", "a", "b"],
    ["--expect", "bf16", "--ignore", "CG104", "--fail-on", "warning", "--no-summary", "a", "b"],
])
def test_plain_diff_spellings_parse_as_click_parses_them(args: list[str]) -> None:
    from guard.cli.diff import diff
    from guard.cli.flags import parse_plain
    from guard.cli.review import DIFF_FLAGS

    options, paths = parse_plain(args, DIFF_FLAGS)
    params = dict(diff.make_context("diff", list(args)).params)
    assert (str(params.pop("old")), str(params.pop("new"))) == tuple(paths)
    assert params == options


def test_a_set_finding_whose_example_moved_is_neither_introduced_nor_resolved(tmp_path: Path, capsys) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    half = {f"layers.{i}.weight": torch.ones(4, 4, dtype=torch.float16) for i in range(3)}
    safetensors_torch.save_file(half, str(tmp_path / "old/model.safetensors"))
    # a tensor sorted first joins: CG101 (fp16 under the fp32 default) now names it as its example
    safetensors_torch.save_file({"a.weight": torch.ones(2, dtype=torch.float16), **half},
                                str(tmp_path / "new/model.safetensors"))
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    old_scan = [f for f in result["resolved"] + result["introduced"] if f["code"] == "CG101"]
    assert old_scan == [] and rc == 0
    assert [t["name"] for t in only_set(result)["added"]] == ["a.weight"]


def test_a_widening_resave_keeps_every_value_exactly(tmp_path: Path, capsys) -> None:
    model = llama().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "old")
    model.to(torch.float32).save_pretrained(tmp_path / "new")
    rc, result = diff_json(capsys, "--values", tmp_path / "old", tmp_path / "new")
    old, new = tensors(tmp_path / "old"), tensors(tmp_path / "new")
    for c in only_set(result)["changed"]:
        assert c["kinds"] == ["recast"] and (c["old"]["dtype"], c["new"]["dtype"]) == ("BF16", "F32")
        assert torch.equal(old[c["name"]].float(), new[c["name"]])
        assert (c["identical"], c["max_abs"], c["max_rel"]) == (False, 0.0, 0.0)  # other bytes, the same values
    _, out = diff_text(capsys, "--values", tmp_path / "old", tmp_path / "new")
    assert "~ recast BF16 -> F32" in out and "every value kept exactly" in out


def test_the_flag_table_knows_every_view() -> None:
    from guard.cli.review import DIFF_FORMATS
    from guard.diff import VIEWS

    assert DIFF_FORMATS == tuple(VIEWS)


def test_an_unreadable_file_on_one_side_removes_nothing(tmp_path: Path, capsys) -> None:
    llama().save_pretrained(tmp_path / "old")
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    data = (tmp_path / "new/model.safetensors").read_bytes()
    (tmp_path / "new/model.safetensors").write_bytes(data[:4096])  # a download cut short
    rc, result = diff_json(capsys, tmp_path / "old", tmp_path / "new")
    ws = only_set(result)
    assert ws["removed"] == [] and ws["unknown"] == len(tensors(tmp_path / "old")) and ws["status"] == "changed"
    assert rc == 1 and [f["code"] for f in result["introduced"]] == ["CG001"]
    _, out = diff_text(capsys, tmp_path / "old", tmp_path / "new")
    assert f"! {tmp_path / 'new'}/model.safetensors: unreadable (see its finding)" in out
