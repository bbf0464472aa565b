"""Megatron-core ``torch_dist`` checkpoints, written by Megatron-core itself on the CPU, scanned and consolidated.

``tests/megatron_writers.py`` builds a tiny Llama-like GPTModel (RMSNorm, SwiGLU, GQA, untied) and saves it
as Megatron's training loop lays it out (``iter_0000010/`` beside ``latest_checkpointed_iteration.txt``): fp32
on one rank, fp32 with tensor parallelism over two gloo ranks, and bf16 with fp32 masters and Adam moments.
The scan reads it as one training-state set; planted defects give their codes, and a forged ``common.pt``
or ``.metadata`` is CG003 with a sentinel proving nothing ran.  ``convert`` unstacks the layers and splits
the fused q/k/v and gate/up into HF Llama's names: bit for bit what torch's own ``dcp_to_torch_save``
consolidates, split here by Megatron-Bridge's formulas (written out independently), loadable in
transformers with no missing or unexpected key, and computing Megatron's own logits within parity's
fp32 tolerance.  ``diff`` compares iteration 10 with iteration 20 of one run (an SGD step between them) as
one model, values checked against torch's consolidations; a Hub scan and the Hub reviewer read the
iterations by ranged reads and the tracker as the local scan does (CG119), through the loopback stand-in.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import megatron_writers  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402
from scanning import codes, copy_tree, errors, json_scan  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not megatron_writers.megatron_available(),
                                 reason="megatron-core is installed by `make test` (Makefile MEGATRON_STAMP)")]
ITER = "iter_0000010"


@pytest.fixture(scope="module")
def fp32(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("megatron") / "fp32"
    return root, megatron_writers.write_megatron(root, mode="fp32")


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Tensor parallelism over two gloo ranks: every tensor's chunks spread over __0_*.distcp and __1_*.distcp."""
    root = tmp_path_factory.mktemp("megatron") / "tp2"
    return root, megatron_writers.write_megatron(root, mode="fp32-tp2")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("megatron") / "bf16"
    return root, megatron_writers.write_megatron(root, mode="bf16")


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iter_0000010/ and, after one SGD step, iter_0000020/ of one run (the tracker names 20)."""
    root = tmp_path_factory.mktemp("megatron") / "steps"
    megatron_writers.write_megatron(root, mode="fp32-steps")
    return root


def _training_set(report: dict) -> dict:
    (entry,) = [m for m in report["models"] if any(s["role"] == "training-state" for s in m["sets"])]
    (found,) = entry["sets"]
    assert found["role"] == "training-state" and found["primary"]
    return found


def _convert(capsys, src: Path, out: Path, *extra: str) -> tuple[int, str]:
    from guard.cli import main

    capsys.readouterr()
    code = main(["convert", str(src), "--to", "torch", "--out", str(out), *extra])
    return code, capsys.readouterr().out


def test_scan_reads_the_checkpoint_as_one_megatron_training_set(fp32: tuple[Path, dict], capsys) -> None:
    """Megatron-core (torch_dist), its stacked layers counted in the model's parameters, its dtypes by role;
    common.pt (an argparse.Namespace) and the _extra_state objects are listed, never a CG003."""
    from torch.distributed.checkpoint import FileSystemReader

    root, run = fp32
    code, report = json_scan(capsys, str(root))
    assert code == 0 and not errors(report) and "CG003" not in codes(report), report["findings"]
    found = _training_set(report)
    notes = " ".join(found["notes"])
    assert "Megatron-core (torch_dist)" in notes and "2 layers stacked" in notes, notes
    assert "module weights fp32 (9 tensors)" in notes and "9 non-tensor item(s), not unpickled" in notes, notes
    assert found["parameters"] == run["parameters"] == 6736  # what Megatron's model.parameters() sums to
    torch_meta = FileSystemReader(str(root / ITER)).read_metadata()  # torch's own reader: the same shapes
    from guard.inventory import discover_models, load_local_model

    (inv,) = [load_local_model(m) for m in discover_models([str(root / ITER)])]
    (scan,) = inv.files
    ours = {t.name: t.shape for t in scan.tensors}
    theirs = {k: tuple(v.size) for k, v in torch_meta.state_dict_metadata.items() if hasattr(v, "size")}
    assert ours == theirs and ours["decoder.layers.self_attention.linear_qkv.weight"] == (2, 32, 16)


def test_bf16_with_fp32_masters_publishes_the_masters(bf16: tuple[Path, dict], capsys) -> None:
    """bf16 module weights beside fp32 masters and moments is normal training state (no CG101): the dtype
    policy judges the masters, which is what the checkpoint would publish."""
    root, run = bf16
    code, report = json_scan(capsys, str(root))
    assert code == 0 and not errors(report) and "CG101" not in codes(report), report["findings"]
    found = _training_set(report)
    notes = " ".join(found["notes"])
    assert "publishes the master weights: 9 tensors, 6,736 parameters" in notes, notes
    for home in ("module weights bf16 (9 tensors)", "master weights fp32 (9 tensors)",
                 "optimizer state fp32 (18 tensors)"):
        assert home in notes, notes
    assert found["parameters"] == run["parameters"]


def _drop_rank_file(ckpt: Path) -> None:
    (ckpt / "__0_1.distcp").unlink()


def _truncate(ckpt: Path) -> None:
    data = (ckpt / "__0_0.distcp").read_bytes()
    (ckpt / "__0_0.distcp").write_bytes(data[: len(data) // 2])


def _tracker_past_the_saves(ckpt: Path) -> None:
    (ckpt.parent / "latest_checkpointed_iteration.txt").write_text("20")


@pytest.mark.parametrize("plant, code", [(_drop_rank_file, "CG114"), (_truncate, "CG115"),
                                         (_tracker_past_the_saves, "CG119")],
                         ids=["rank-missing", "truncated", "tracker-names-no-iteration"])
def test_planted_defects_give_their_code_and_convert_writes_nothing(fp32: tuple[Path, dict], tmp_path: Path,
                                                                     capsys, plant, code: str) -> None:
    root = copy_tree(fp32[0], tmp_path / "save")
    plant(root / ITER)
    status, report = json_scan(capsys, str(root))
    assert status == 1 and code in codes(report, severity="error"), report["findings"]
    (finding,) = [f for f in report["findings"] if f["code"] == code][:1]
    assert str(root) in finding["path"]
    out = tmp_path / "out"
    status, text = _convert(capsys, root, out, "--config", str(root / "config.json"))
    assert status == 1 and code in text and not out.exists(), text


class _Sentinel:
    """Unpickling it would create the sentinel file: proof that a reader executed the pickle."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def test_a_forged_common_pt_is_cg003_and_runs_nothing(fp32: tuple[Path, dict], tmp_path: Path, capsys) -> None:
    root = copy_tree(fp32[0], tmp_path / "save")
    sentinel = tmp_path / "ran"
    torch.save({"args": _Sentinel(sentinel), "iteration": 10}, root / ITER / "common.pt")
    status, report = json_scan(capsys, str(root))
    assert status == 1 and not sentinel.exists()
    (finding,) = [f for f in report["findings"] if f["code"] == "CG003"]
    assert finding["path"].endswith(f"{ITER}/common.pt") and "io.open" in finding["message"]
    status, text = _convert(capsys, root / ITER, tmp_path / "out", "--config", str(root / "config.json"))
    assert status == 1 and "CG003" in text and not (tmp_path / "out").exists() and not sentinel.exists()


def test_a_forged_metadata_is_cg003_and_runs_nothing(fp32: tuple[Path, dict], tmp_path: Path, capsys) -> None:
    root = copy_tree(fp32[0], tmp_path / "save")
    sentinel = tmp_path / "ran"
    (root / ITER / ".metadata").write_bytes(pickle.dumps(_Sentinel(sentinel), protocol=4))
    status, report = json_scan(capsys, str(root))
    assert status == 1 and not sentinel.exists()
    assert "CG003" in codes(report, severity="error")
    status, text = _convert(capsys, root / ITER, tmp_path / "out", "--config", str(root / "config.json"))
    assert status == 1 and "CG003" in text and not (tmp_path / "out").exists() and not sentinel.exists()


def _reference(ckpt: Path, tmp_path: Path, config: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """torch's own consolidation (dcp_to_torch_save), unstacked and split by Megatron-Bridge's formulas:
    linear_qkv per query group [q heads; k; v] (QKVMapping), linear_fc1 [gate; up] (GatedMLPMapping).
    ``prefix``: "optimizer.state.fp32_param." for the masters."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(ckpt), str(tmp_path / "ref.pt"))
    saved = torch.load(tmp_path / "ref.pt", weights_only=False)  # written by this test from Megatron's save
    stacked = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
    heads, groups = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, ffn = config["hidden_size"] // heads, config["intermediate_size"]
    per = heads // groups
    ref = {"model.embed_tokens.weight": stacked["embedding.word_embeddings.weight"],
           "lm_head.weight": stacked["output_layer.weight"],
           "model.norm.weight": stacked["decoder.final_layernorm.weight"]}
    for i in range(config["num_hidden_layers"]):
        layer, at = f"model.layers.{i}.", lambda key: stacked[f"decoder.layers.{key}"][i]  # noqa: B023 (called within this iteration)
        qkv = at("self_attention.linear_qkv.weight").reshape(groups, per + 2, head_dim, -1)
        hidden = qkv.shape[-1]
        ref[layer + "self_attn.q_proj.weight"] = qkv[:, :per].reshape(-1, hidden)
        ref[layer + "self_attn.k_proj.weight"] = qkv[:, per].reshape(-1, hidden)
        ref[layer + "self_attn.v_proj.weight"] = qkv[:, per + 1].reshape(-1, hidden)
        ref[layer + "self_attn.o_proj.weight"] = at("self_attention.linear_proj.weight")
        fc1 = at("mlp.linear_fc1.weight")
        ref[layer + "mlp.gate_proj.weight"], ref[layer + "mlp.up_proj.weight"] = fc1[:ffn], fc1[ffn:]
        ref[layer + "mlp.down_proj.weight"] = at("mlp.linear_fc2.weight")
        ref[layer + "input_layernorm.weight"] = at("self_attention.linear_qkv.layer_norm_weight")
        ref[layer + "post_attention_layernorm.weight"] = at("mlp.linear_fc1.layer_norm_weight")
    return ref


def _assert_bit_exact(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(ref)
    for key, tensor in ref.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        bits = torch.int16 if tensor.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(got[key].view(bits), tensor.contiguous().view(bits)), key


@pytest.mark.parametrize("written", ["fp32", "tp2"])
def test_convert_unstacks_splits_and_computes_megatrons_logits(written: str, request, tmp_path: Path,
                                                               capsys) -> None:
    """One rank, and tensor parallelism over two (q/k/v split per query group across ranks, [gate; up] saved
    as four chunks): the same HF Llama, computing what Megatron's own forward computed."""
    import numpy as np
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from guard.parity.metrics import TOLERANCES

    root, _ = request.getfixturevalue(written)
    config = json.loads((root / "config.json").read_text())
    status, text = _convert(capsys, root / ITER, tmp_path / "hf", "--config", str(root / "config.json"))
    assert status == 0, text
    got = load_file(tmp_path / "hf" / "model.safetensors")
    _assert_bit_exact(got, _reference(root / ITER, tmp_path, config))
    assert not (tmp_path / "hf" / "latest_checkpointed_iteration.txt").exists()
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    code, report = json_scan(capsys, str(root))
    notes = " ".join(_training_set(report)["notes"])
    assert code == 0 and _training_set(report)["parameters"] == model.num_parameters(), notes
    assert f"world size {2 if written == 'tp2' else 1}" in notes, notes
    result = model.load_state_dict(got, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    with torch.no_grad():
        logits = model(torch.tensor(megatron_writers.TOKENS)).logits.numpy()
    megatron = np.load(f"{root}.logits.npy").reshape(logits.shape)  # Megatron's own forward, in the writer
    assert np.abs(logits - megatron).max() / np.abs(megatron).max() <= TOLERANCES["F32"].max_rel


def test_convert_follows_the_tracker_and_writes_the_fp32_masters(bf16: tuple[Path, dict], tmp_path: Path,
                                                                 capsys) -> None:
    """The save folder given: latest_checkpointed_iteration.txt names iter_0000010/, its config.json is used,
    and the fp32 masters (not the bf16 module weights) are written, bit for bit."""
    from safetensors.torch import load_file

    root, _ = bf16
    status, text = _convert(capsys, root, tmp_path / "hf")
    assert status == 0, text
    got = load_file(tmp_path / "hf" / "model.safetensors")
    config = json.loads((root / "config.json").read_text())
    _assert_bit_exact(got, _reference(root / ITER, tmp_path, config, prefix="optimizer.state.fp32_param."))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "float32"


@pytest.mark.parametrize("change, why", [
    (None, "needs the model's config.json"),
    ({"model_type": "gpt2"}, "only Llama's layout"),
    ({"num_key_value_heads": 2}, "does not split into 2 query heads in 2 groups"),
    ({"num_hidden_layers": 3}, "stacks 2 layers"),
], ids=["no-config", "other-architecture", "wrong-groups", "wrong-layers"])
def test_convert_refuses_a_layout_it_cannot_map(fp32: tuple[Path, dict], tmp_path: Path, capsys, change,
                                                why: str) -> None:
    root = copy_tree(fp32[0] / ITER, tmp_path / "save" / ITER)  # no config.json beside or above it
    extra: list[str] = []
    if change is not None:
        config = {**json.loads((fp32[0] / "config.json").read_text()), **change}
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "config.json").write_text(json.dumps(config))
        extra = ["--config", str(tmp_path / "config")]
    status, text = _convert(capsys, root, tmp_path / "out", *extra)
    assert status == 1 and "CG304" in text and why in text and not (tmp_path / "out").exists(), text


def test_a_megatron_name_outside_the_llama_table_is_refused() -> None:
    """A fused qkv bias (Qwen2's layout, not Llama's) has no row: CG304 naming it, and no tensor to write."""
    from guard.convert.read.source import SourceModel
    from guard.convert.training.megatron import from_megatron
    from guard.tensors import TensorInfo
    from guard.write.plan import SourceTensor

    config = {"model_type": "llama", **megatron_writers.TINY}
    names = {"embedding.word_embeddings.weight": (64, 16), "decoder.layers.self_attention.linear_qkv.bias": (2, 32)}
    source = SourceModel("torch", "dcp", [Path("ckpt/__0_0.distcp")], None,
                         [SourceTensor(TensorInfo(n, "F32", shape, "ckpt"), None) for n, shape in names.items()])
    out = from_megatron(source, config)
    assert not out.tensors and [f.code for f in out.findings] == ["CG304"]
    assert out.findings[0].tensor == "decoder.layers.self_attention.linear_qkv.bias"


def test_nemo2_weights_beside_context_are_read_and_the_context_never_loaded(fp32: tuple[Path, dict],
                                                                           tmp_path: Path, capsys) -> None:
    """NeMo 2 keeps Megatron's torch_dist files in <ckpt>/weights/ beside <ckpt>/context/ (io.json, model.yaml,
    artifacts, possibly cloudpickle files): the set is NeMo 2's, the context's files are listed by count and
    never opened (a forged pickle there creates no sentinel), and convert given <ckpt> consolidates weights/.
    The layout is Megatron-core's own save moved where NeMo 2 puts it: NeMo itself is not installed here."""
    from safetensors.torch import load_file

    root, _ = fp32
    ckpt = tmp_path / "nemo-ckpt"
    copy_tree(root / ITER, ckpt / "weights")
    (ckpt / "context" / "artifacts").mkdir(parents=True)
    (ckpt / "context" / "io.json").write_text('{"root": {"type": "ref"}}')
    (ckpt / "context" / "model.yaml").write_text("_target_: nemo.collections.llm.gpt.model.llama.LlamaModel\n")
    sentinel = tmp_path / "ran"
    (ckpt / "context" / "artifacts" / "state.pkl").write_bytes(pickle.dumps(_Sentinel(sentinel), protocol=4))
    code, report = json_scan(capsys, str(ckpt))
    assert not sentinel.exists() and not errors(report), report["findings"]
    notes = " ".join(_training_set(report)["notes"])
    assert "NeMo 2 (Megatron-core torch_dist)" in notes and "2 layers stacked" in notes, notes
    status, text = _convert(capsys, ckpt, tmp_path / "hf", "--config", str(root / "config.json"))
    assert status == 0 and not sentinel.exists(), text
    config = json.loads((root / "config.json").read_text())
    _assert_bit_exact(load_file(tmp_path / "hf" / "model.safetensors"), _reference(ckpt / "weights", tmp_path, config))


def _stacked(ckpt: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """torch's own consolidation of one iteration: Megatron's stacked logical tensors, by their own names."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(out))
    saved = torch.load(out, weights_only=False)  # written by this test from Megatron's save
    return {k: v for k, v in saved.items() if isinstance(v, torch.Tensor)}


def test_diff_compares_two_iterations_as_models_values_included(steps: Path, tmp_path: Path, capsys) -> None:
    """iter_0000010 against iter_0000020: the logical (stacked, global-shape) tensors paired by name, every one
    changed by the SGD step, each max abs difference what torch's own consolidations of the two give."""
    from guard.cli import main

    old, new = steps / ITER, steps / f"iter_{megatron_writers.LATER:07d}"
    capsys.readouterr()
    assert main(["diff", "--values", "--format", "json", "--no-summary", str(old), str(new)]) == 0
    result = json.loads(capsys.readouterr().out)
    [pair] = result["models"]
    [weights] = pair["sets"]
    assert pair["status"] == "changed" and not weights["added"] and not weights["removed"]
    before, after = _stacked(old, tmp_path), _stacked(new, tmp_path)
    assert weights["old"]["dtypes"] == weights["new"]["dtypes"] == {"F32": sum(t.numel() for t in after.values())}
    changed = {t["name"]: t for t in weights["changed"]}
    assert changed.keys() == {k for k in after if not torch.equal(before[k], after[k])} == after.keys()
    for name, tensor in changed.items():  # each global tensor assembled from its chunks, layers stacked
        assert tensor["new"]["shape"] == list(after[name].shape), name
        expected = (after[name].double() - before[name].double()).abs().max().item()
        assert tensor["kinds"] == ["values"] and tensor["max_abs"] == pytest.approx(expected, rel=1e-6), name
    assert not result["introduced"] and not result["resolved"]


def test_diff_of_two_save_folders_pairs_the_iterations_they_hold(steps: Path, tmp_path: Path, capsys) -> None:
    """A save folder holding iteration 10 against one holding iteration 20: one model at two iterations;
    against the folder that holds both, iteration 10 is unchanged and iteration 20 is added."""
    from guard.cli import main

    later = f"iter_{megatron_writers.LATER:07d}"
    old, new = tmp_path / "old", tmp_path / "new"
    copy_tree(steps / ITER, old / ITER)
    (old / "latest_checkpointed_iteration.txt").write_text(str(megatron_writers.ITERATION))
    copy_tree(steps / later, new / later)
    (new / "latest_checkpointed_iteration.txt").write_text(str(megatron_writers.LATER))
    capsys.readouterr()
    assert main(["diff", "--values", "--no-summary", str(old), str(new)]) == 0
    assert f"model {ITER} -> {later}: changed" in capsys.readouterr().out
    assert main(["diff", "--values", "--format", "json", "--no-summary", str(old), str(steps)]) == 0
    status = {m["key"]: m["status"] for m in json.loads(capsys.readouterr().out)["models"]}
    assert status == {ITER: "unchanged", later: "added"}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    yield from standin_fixture(monkeypatch, tmp_path)


def _repo_files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _publishing_view(findings, root: str) -> set[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    """(code, severity, path under the root) of each finding; CG121 by code only: it names any one set."""
    return {(f.code, f.severity.value, "" if f.code == "CG121" else f.path[len(root):].lstrip("/"))
            for f in findings}


@pytest.mark.parametrize("tracker, problem", [
    (b"30\n", "names iteration 30, and there is no folder iter_0000030/"),
    (b"junk\n", "neither an iteration nor 'release'"),
], ids=["past-the-saves", "no-iteration"])
def test_a_hub_scan_reads_the_iterations_and_checks_the_tracker_as_locally(steps: Path, standin: StandinHub,
                                                                          tmp_path: Path, tracker: bytes,
                                                                          problem: str) -> None:
    """The repository's iteration folders are read by ranged reads (.metadata and common.pt, never a .distcp):
    one training-state set each, with the model's parameter count and no CG003 for Megatron's common.pt; the
    tracker is fetched and a broken one is CG119, as the upload gate's local scan of the same folder says."""
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.scan import scan_hub
    from guard.scan import scan_paths

    local = copy_tree(steps, tmp_path / "run")
    (local / "latest_checkpointed_iteration.txt").write_bytes(tracker)
    standin.add_repo("org/good", _repo_files(steps))
    standin.add_repo("org/run", _repo_files(local))
    policy = build_policy({}, source=None, overrides={})
    result = scan_hub(["org/good", "org/run"], policy, HubClient(token="hf_bot"), publishing=True)
    ours = [f for f in result.report.findings if f.path.startswith("org/run")]
    expected = scan_paths([str(local)], policy, publishing=True)
    assert _publishing_view(ours, "org/run") == _publishing_view(expected.findings, str(local))
    [cg119] = [f for f in ours if f.code == "CG119"]
    assert cg119.path == "org/run/latest_checkpointed_iteration.txt" and problem in cg119.message
    assert "CG119" not in {f.code for f in result.report.findings if f.path.startswith("org/good")}
    assert "CG003" not in {f.code for f in result.report.findings}
    later = f"iter_{megatron_writers.LATER:07d}"
    params = {m.path[len(str(local)) + 1:]: m.parameters for m in expected.models if "/iter_" in m.path}
    assert params.keys() == {ITER, later} and all(params.values())
    iterations = {m.path: m.parameters for m in result.report.models if "/iter_" in m.path}
    assert iterations == {f"org/{repo}/{it}": params[it] for repo in ("good", "run") for it in (ITER, later)}
    read = {f["path"]: f for r in result.report.extra["hub"]["repos"] for f in r["files"]}
    assert read[ITER]["bytes"] < read[ITER]["size"]  # the .distcp files are listed, never fetched


def test_the_reviewer_answers_a_push_whose_tracker_names_no_iteration_with_cg119(steps: Path, standin: StandinHub,
                                                                                tmp_path: Path) -> None:
    from hub_delivery import AppServer, make_reviewer

    files = {**_repo_files(steps), "latest_checkpointed_iteration.txt": b"30\n"}
    sha = standin.add_repo("org/run", files)
    service = AppServer(make_reviewer(tmp_path / "queue.sqlite3"))
    try:
        event = {"event": {"action": "update", "scope": "repo.content"},
                 "repo": {"type": "model", "name": "org/run", "id": "abc", "private": False,
                          "url": {"web": "https://hub/org/run", "api": "https://hub/api/models/org/run"},
                          "headSha": sha, "owner": {"id": "o1"}},
                 "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "0" * 40, "newSha": sha}],
                 "webhook": {"id": "w1", "version": 3}}
        assert service.post(event).status_code == 202
        assert service.reviewer.wait_idle(60)
    finally:
        service.stop()
    [discussion] = standin.repos["org/run"].discussions
    assert "| error | CG119 | org/run/latest\\_checkpointed\\_iteration.txt |" in discussion.description
    assert "CG121" in discussion.description and "CG003" not in discussion.description
