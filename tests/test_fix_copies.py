"""CG107 by value (a stale Flax copy), its fix (copy-regenerate), and `fix --add`: models saved by transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax.traverse_util import flatten_dict  # noqa: E402
from scanning import tree_state  # noqa: E402
from test_convert import _offline  # noqa: E402,F401  (autouse: no Hub, no network)

from guard.cli import main  # noqa: E402
from guard.config import Policy  # noqa: E402
from guard.errors import GuardError  # noqa: E402
from guard.findings import Severity  # noqa: E402
from guard.fix.context import FixOptions  # noqa: E402
from guard.fixes import Fix, make_fix  # noqa: E402
from guard.inventory import discover_models, load_local_model  # noqa: E402
from guard.rules.copies import plan_add_copy  # noqa: E402
from guard.samples import save_torch_bin  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:  # with test_convert's _offline (imported above)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def tiny_bert() -> transformers.BertModel:
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32))


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT saved by transformers in PyTorch and in Flax (from_pt), then retrained and re-saved in PyTorch only."""
    root = tmp_path_factory.mktemp("twins") / "bert"
    model = tiny_bert()
    model.save_pretrained(root)
    transformers.FlaxBertModel.from_pretrained(root, from_pt=True).save_pretrained(root)
    with torch.no_grad():  # "retrained": every Linear moves, the embeddings stay
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.add_(0.25)
    model.save_pretrained(root)
    return root


def scan_json(*args: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["scan", *map(str, args), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def fix_cli(*args: object, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """`ckpt-guard fix ... --format json`: the exit code, and the report with extra["fix"]."""
    capsys.readouterr()
    code = main(["fix", *map(str, args), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def fixes_of(report: dict[str, Any], code: str) -> list[Fix]:
    return [Fix.from_json(f["fix"]) for f in report["findings"] if f["code"] == code]  # type: ignore[misc]


def apply(fix: Fix, model_dir: Path, *, replace: bool = False) -> list[str]:
    """One fix published as `ckpt-guard fix --write` publishes it (guard.fix.apply): the final names written."""
    from guard.fix.apply import apply_fix
    from guard.fix.plan import PlannedFix

    options = FixOptions(write=True, replace=replace)
    outcome = apply_fix(PlannedFix(None, fix, True, None), options, Policy(), root=model_dir.parent)
    if not outcome.ok:
        raise GuardError(outcome.error or outcome.summary)
    assert not [f for f in outcome.findings if f.severity is Severity.error], outcome.findings
    return [Path(p).name for p in outcome.written]


def add_fix(model_dir: Path, what: str) -> Fix:
    here = model_dir.resolve()
    inv = next(load_local_model(m) for m in discover_models([model_dir]) if Path(m.directory).resolve() == here)
    return plan_add_copy(inv, what)


def flax_from_pt(model_dir: Path) -> dict[tuple[str, ...], np.ndarray]:
    """The PyTorch weights as transformers transposes them into Flax (from a folder holding only them)."""
    alone = model_dir.parent / f"{model_dir.name}-pt-alone"
    shutil.rmtree(alone, ignore_errors=True)
    alone.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, alone / name)
    model = transformers.FlaxBertModel.from_pretrained(alone, from_pt=True)
    return {k: np.asarray(v) for k, v in flatten_dict(model.params).items()}


def assert_same_bits(a: dict[tuple[str, ...], np.ndarray], b: dict[tuple[str, ...], np.ndarray]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.transformers4  # transformers 4's FlaxBertModel (from_pt) is the reference
def test_stale_flax_copy_is_found_by_values_and_regenerated(
        twins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    shutil.copytree(twins, model)
    monkeypatch.chdir(tmp_path)
    stale_bytes = (model / "flax_model.msgpack").read_bytes()

    code, report = scan_json("bert", capsys=capsys)
    assert code == 0 and not [f for f in report["findings"] if f["code"] == "CG107"]  # headers agree

    code, report = scan_json("bert", "--values", capsys=capsys)
    found = [f for f in report["findings"] if f["code"] == "CG107"]
    assert code == 1 and len(found) == 1, report["findings"]
    assert found[0]["severity"] == "error" and found[0]["path"] == "bert/flax_model.msgpack"
    assert found[0]["set"] == "flax_model.msgpack"
    assert "13 of 39 tensor(s) differ" in found[0]["message"]  # every Linear of two layers and the pooler
    fix = fixes_of(report, "CG107")[0]
    assert fix.action == "copy-regenerate" and fix.safety == "needs-flag" and fix.flag == "--replace"
    assert fix.writes == ("bert/flax_model.msgpack",)
    assert fix.arguments == {"dir": "bert", "stale": "flax_model.msgpack", "primary": "model.safetensors",
                             "to": "flax", "layout": "msgpack", "reads": ["config.json", "model.safetensors"],
                             "files": ["flax_model.msgpack"]}

    before = tree_state(model)
    code, _report = fix_cli("bert", "--values", capsys=capsys)  # a dry run: the plan, nothing written
    assert code == 1 and tree_state(model) == before
    code, report = fix_cli("bert", "--values", "--write", capsys=capsys)  # waits for --replace
    assert tree_state(model) == before

    code, report = fix_cli("bert", "--values", "--write", "--replace", capsys=capsys)
    outcome = report["extra"]["fix"]["outcomes"][0]
    assert code == 0 and outcome["ok"] and outcome["action"] == "copy-regenerate", outcome
    assert [Path(p).name for p in outcome["written"]] == ["flax_model.msgpack"]
    assert (model / "config.json").read_bytes() == before["config.json"][0]  # only weight files are published
    assert (model / "flax_model.msgpack.orig").read_bytes() == stale_bytes
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "flax_model.msgpack",
                                                         "flax_model.msgpack.orig", "model.safetensors"]

    code, report = scan_json("bert", "--values", capsys=capsys)
    assert code == 0 and not [f for f in report["findings"] if f["code"] == "CG107"], report["findings"]
    loaded = transformers.FlaxBertModel.from_pretrained(model)
    assert_same_bits({k: np.asarray(v) for k, v in flatten_dict(loaded.params).items()}, flax_from_pt(model))


@pytest.mark.transformers4  # transformers 4's FlaxBertModel (from_pt) is the reference
def test_the_copy_check_transposes_kernels_and_stays_quiet_on_twins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    tiny_bert().save_pretrained(model)
    transformers.FlaxBertModel.from_pretrained(model, from_pt=True).save_pretrained(model)
    monkeypatch.chdir(tmp_path)
    code, report = scan_json("bert", "--values", capsys=capsys)
    assert code == 0 and not [f for f in report["findings"] if f["code"] == "CG107"]

    # a kernel stored un-transposed ([out, in] bytes under Flax's [in, out] shape) is caught
    from flax.serialization import msgpack_restore, msgpack_serialize
    from flax.traverse_util import unflatten_dict

    params = flatten_dict(msgpack_restore((model / "flax_model.msgpack").read_bytes()))
    key = ("encoder", "layer", "0", "intermediate", "dense", "kernel")
    kernel = np.asarray(params[key])
    params[key] = np.ascontiguousarray(kernel.T).reshape(kernel.shape)
    (model / "flax_model.msgpack").write_bytes(msgpack_serialize(unflatten_dict(params)))
    code, report = scan_json("bert", "--values", capsys=capsys)
    found = [f for f in report["findings"] if f["code"] == "CG107"]
    assert code == 1 and len(found) == 1 and "1 of 39 tensor(s) differ" in found[0]["message"]
    assert found[0]["tensor"] == "encoder/layer/0/intermediate/dense/kernel"


@pytest.mark.transformers4  # transformers 4's FlaxBertModel (from_pt) is the reference
def test_dtypes_that_differ_are_one_finding_with_the_fix(
        twins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    shutil.copytree(twins, model)
    transformers.BertModel.from_pretrained(model).half().save_pretrained(model)  # fp16 beside an fp32 Flax copy
    monkeypatch.chdir(tmp_path)
    for flags in ((), ("--values",)):
        _code, report = scan_json("bert", *flags, capsys=capsys)
        found = [f for f in report["findings"] if f["code"] == "CG107"]
        assert len(found) == 1 and "fp32 100.0%" in found[0]["message"], found  # headers only: never twice
        assert fixes_of(report, "CG107")[0].action == "copy-regenerate"
    apply(fixes_of(report, "CG107")[0], model, replace=True)
    code, report = scan_json("bert", "--values", capsys=capsys)
    assert not [f for f in report["findings"] if f["code"] == "CG107"], report["findings"]
    loaded = transformers.FlaxBertModel.from_pretrained(model, dtype=np.float16)
    assert {np.asarray(v).dtype.name for v in flatten_dict(loaded.params).values()} == {"float16"}


def test_a_copy_convert_cannot_write_has_no_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    bert = tiny_bert()
    bert.save_pretrained(model)  # model.safetensors
    save_torch_bin(bert.half(), model)  # pytorch_model.bin in fp16: stale, pickled
    monkeypatch.chdir(tmp_path)
    _code, report = scan_json("bert", capsys=capsys)
    fix = fixes_of(report, "CG107")[0]
    assert not fix.available and "convert writes no pytorch_model.bin" in fix.description


@pytest.mark.transformers4  # transformers 4's FlaxBertModel (from_pt) is the reference
def test_add_flax_and_orbax_to_a_pytorch_only_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ocp = pytest.importorskip("orbax.checkpoint")
    model = tmp_path / "bert"
    tiny_bert().save_pretrained(model)
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_bytes() for p in model.iterdir()}

    fix = add_fix(Path("bert"), "flax")
    assert fix.action == "add-copy" and fix.safety == "safe" and fix.writes == ("bert/flax_model.msgpack",)
    code, report = fix_cli("bert", "--add", "flax", "--add", "orbax", "--write", capsys=capsys)
    outcomes = report["extra"]["fix"]["outcomes"]
    assert code == 0 and [o["ok"] for o in outcomes] == [True, True], outcomes
    assert sorted(Path(p).name for o in outcomes for p in o["written"]) == ["flax_model.msgpack", "orbax"]
    loaded = transformers.FlaxAutoModel.from_pretrained(model)
    assert_same_bits({k: np.asarray(v) for k, v in flatten_dict(loaded.params).items()}, flax_from_pt(model))

    assert add_fix(Path("bert"), "orbax").writes == ("bert/orbax",)
    restored = flatten_dict(ocp.StandardCheckpointer().restore((model / "orbax").resolve()))
    assert_same_bits({k: np.asarray(v) for k, v in restored.items()}, flax_from_pt(model))

    assert {p.name: p.read_bytes() for p in model.iterdir() if p.name in before} == before  # inputs untouched
    code, report = scan_json("bert", "--values", capsys=capsys)
    assert code == 0, report["findings"]

    # a copy that exists already is refused, at planning and at staging
    for what in ("flax", "safetensors"):
        assert not add_fix(Path("bert"), what).available
    before = tree_state(model)
    code, report = fix_cli("bert", "--add", "flax", "--write", capsys=capsys)
    assert "already has flax_model.msgpack" in report["extra"]["fix"]["not_added"][0]["reason"]
    assert tree_state(model) == before
    for what in ("flax", "orbax", "safetensors"):
        request = make_fix("add-copy", f"add {what}", dir="bert", what=what)
        with pytest.raises(GuardError, match="already"):
            apply(request, model)


def test_add_safetensors_to_a_pickle_only_model_is_the_safetensors_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("guard.fix.actions.safetensors_copy")
    model = tmp_path / "bert"
    bert = tiny_bert()
    save_torch_bin(bert, model)
    monkeypatch.chdir(tmp_path)
    fix = add_fix(Path("bert"), "safetensors")
    assert fix.available and fix.writes == ("bert/model.safetensors",)
    assert apply(fix, model) == ["model.safetensors"]  # the CG008 fix itself, asked for by --add
    loaded = transformers.BertModel.from_pretrained(model, use_safetensors=True)
    for name, tensor in bert.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_hostile_names_are_escaped_in_the_value_finding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.torch import save_file

    model = tmp_path / "m"
    model.mkdir()
    name = "w\x1b[31m::error::\n"
    save_file({name: torch.zeros(4)}, str(model / "model.safetensors"))
    torch.save({name: torch.ones(4)}, model / "pytorch_model.bin")  # the same header, other values
    monkeypatch.chdir(tmp_path)
    _code, report = scan_json("m", "--values", capsys=capsys)
    found = [f for f in report["findings"] if f["code"] == "CG107"]
    assert len(found) == 1 and found[0]["tensor"] == name
    assert "\x1b" not in found[0]["message"] and "\n" not in found[0]["message"]


def test_add_a_dtype_variant_is_the_variant_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "bert"
    bert = tiny_bert()
    bert.save_pretrained(model)
    monkeypatch.chdir(tmp_path)
    fix = add_fix(Path("bert"), "variant:fp16")
    assert fix.action == "add-copy" and fix.writes == ("bert/model.fp16.safetensors",)
    code, report = fix_cli("bert", "--add", "variant:fp16", "--write", capsys=capsys)
    outcome = report["extra"]["fix"]["outcomes"][0]
    assert code == 0 and outcome["ok"] and [Path(p).name for p in outcome["written"]] == ["model.fp16.safetensors"]
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(model / "model.fp16.safetensors").values()} == {torch.float16}
    loaded, info = transformers.BertModel.from_pretrained(model, variant="fp16", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # lists (transformers 4) or sets (5)
    for name, tensor in bert.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.half().float()), name
    assert not add_fix(Path("bert"), "variant:fp16").available


@pytest.mark.transformers4  # transformers 4's FlaxBertModel (from_pt) is the reference
def test_a_sharded_stale_flax_copy_is_regenerated_in_its_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Both copies sharded by save_pretrained(max_shard_size="20KB"): with no --max-shard-size, the
    regenerated Flax copy is split at the stale copy's own shard size, so it keeps its shard names and
    index (no old shard is left beside it), and loads."""
    model_dir = tmp_path / "bert"
    model = tiny_bert()
    model.save_pretrained(tmp_path / "whole")  # from_pt reads no sharded safetensors
    transformers.FlaxBertModel.from_pretrained(tmp_path / "whole", from_pt=True).save_pretrained(
        model_dir, max_shard_size="20KB")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.add_(0.25)
    model.save_pretrained(model_dir, max_shard_size="20KB")
    stale = sorted(p.name for p in model_dir.glob("flax_model*"))
    assert len(stale) > 2 and "flax_model.msgpack.index.json" in stale
    monkeypatch.chdir(tmp_path)

    code, report = scan_json("bert", "--values", capsys=capsys)
    assert code == 1 and [f["code"] for f in report["findings"] if f["code"] == "CG107"] == ["CG107"]
    code, report = fix_cli("bert", "--values", "--write", "--replace", capsys=capsys)
    outcome = report["extra"]["fix"]["outcomes"][0]
    assert outcome["ok"], outcome
    assert sorted(p.name for p in model_dir.glob("flax_model*") if not p.name.endswith(".orig")) == stale
    code, report = scan_json("bert", "--values", capsys=capsys)
    assert code == 0 and not [f for f in report["findings"] if f["code"] == "CG107"], report["findings"]
    loaded = transformers.FlaxBertModel.from_pretrained(model_dir)
    pt = {k: v.numpy() for k, v in model.state_dict().items()}
    kernel = np.asarray(loaded.params["encoder"]["layer"]["0"]["attention"]["self"]["query"]["kernel"])
    assert np.array_equal(kernel, pt["encoder.layer.0.attention.self.query.weight"].T)
