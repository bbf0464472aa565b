"""CG008 and its fix: pickle-only weights get a safetensors copy, bit-exact, without unpickling them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from scanning import tree_state  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.config import Policy  # noqa: E402
from guard.errors import GuardError  # noqa: E402
from guard.findings import Finding, Severity  # noqa: E402
from guard.fix.actions import stage  # noqa: E402
from guard.fix.apply import Outcome, apply_plan  # noqa: E402
from guard.fix.context import ActionContext, FixOptions  # noqa: E402
from guard.fix.plan import plan_fixes  # noqa: E402
from guard.fix.tied import USUAL_TIED_NAMES, settle_shared, transformers_tied_keys  # noqa: E402
from guard.fixes import Fix  # noqa: E402
from guard.rules.pickle_only import copy_names, shard_count  # noqa: E402
from guard.samples import save_torch_bin  # noqa: E402
from guard.scan import scan_paths  # noqa: E402
from guard.tensors import TensorInfo  # noqa: E402
from guard.write.writer import Naming, plan_shards  # noqa: E402


class Foreign:
    """Any class outside the tensor allowlist: pickling an instance names it (CG003)."""


def cg008(model: Path) -> list[Finding]:
    return [f for f in scan_paths([model], Policy()).findings if f.code == "CG008"]


def fix_copy(model: Path, *, options: FixOptions | None = None) -> Outcome:
    """Plan from a scan and apply, as `ckpt-guard fix --write --select CG008` does."""
    options = options or FixOptions(write=True)
    plan = plan_fixes(scan_paths([model], Policy()), options, select=("CG008",))
    (planned,) = plan.fixes
    assert planned.fix.action == "safetensors-copy" and planned.fix.safety == "safe" and planned.enabled
    (outcome,) = apply_plan(plan, options, Policy())
    assert outcome.ok, outcome.error
    assert not [f for f in outcome.findings if f.severity is Severity.error], outcome.findings
    assert not [p for p in model.iterdir() if p.name.startswith(".ckpt-guard-fix-")]
    return outcome


def bits(tensor: Any) -> Any:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(bits(got[name]), bits(tensor)), name


def tiny_bert() -> Any:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=32))


# ---------------------------------------------------------------- transformers, end to end

def test_pickle_only_bert_with_tied_embeddings_gets_a_safetensors_copy_that_from_pretrained_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import BertForMaskedLM

    model = tmp_path / "bert"
    save_torch_bin(tiny_bert(), model)
    report = scan_paths([model], Policy())
    assert [f.code for f in report.findings] == ["CG008"] and report.exit_code == 0
    fix = report.findings[0].fix
    assert fix is not None and fix.action == "safetensors-copy" and fix.safety == "safe"
    assert fix.writes == (f"{report.findings[0].path.rpartition('/')[0]}/model.safetensors",)
    assert fix.arguments["reads"] == ["pytorch_model.bin", "config.json"] and fix.arguments["variant"] is None

    before = tree_state(model)
    assert main(["fix", str(model)]) == 1 and tree_state(model) == before  # a dry run: every byte, no staging
    capsys.readouterr()
    assert main(["fix", "--write", "--format", "json", str(model)]) == 0
    (outcome,) = json.loads(capsys.readouterr().out)["extra"]["fix"]["outcomes"]
    assert outcome["ok"] and outcome["written"] == [str(model / "model.safetensors")]
    tied = {tie["kept"]: tie["dropped"] for tie in outcome["details"]["tied"]}
    assert tied == {"bert.embeddings.word_embeddings.weight": ["cls.predictions.decoder.weight"],
                    "cls.predictions.bias": ["cls.predictions.decoder.bias"]}
    assert outcome["details"]["tied_names_from"] == "BertForMaskedLM._tied_weights_keys"
    assert "'cls.predictions.decoder.weight' -> 'bert.embeddings.word_embeddings.weight'" in outcome["summary"]
    assert not [p for p in model.iterdir() if p.name.startswith(".ckpt-guard-fix-")]

    # the same names transformers' own safetensors save keeps, and its metadata
    reference = tmp_path / "reference"
    tiny_bert().save_pretrained(reference, safe_serialization=True)
    ours = safetensors_torch.load_file(model / "model.safetensors")
    assert sorted(ours) == sorted(safetensors_torch.load_file(reference / "model.safetensors"))
    from safetensors import safe_open

    with safe_open(model / "model.safetensors", "pt") as fh:
        assert fh.metadata() == {"format": "pt"}

    # loaded by transformers from the safetensors copy, every name (tied ones too) bit-equal to torch.load's
    (model / "pytorch_model.bin").rename(tmp_path / "pytorch_model.bin")
    loaded = BertForMaskedLM.from_pretrained(model, use_safetensors=True).state_dict()
    assert_bit_equal(loaded, torch.load(tmp_path / "pytorch_model.bin", weights_only=True))
    (tmp_path / "pytorch_model.bin").rename(model / "pytorch_model.bin")
    assert cg008(model) == []


def test_sharded_bin_becomes_shards_and_an_index_under_transformers_names(tmp_path: Path) -> None:
    from transformers import BertForMaskedLM

    model = tmp_path / "bert"
    save_torch_bin(tiny_bert(), model, max_shard_size="8KB")
    shards = sorted(p.name for p in model.glob("pytorch_model-*.bin"))
    assert len(shards) > 1
    (finding,) = cg008(model)
    assert finding.path.endswith("pytorch_model.bin.index.json")
    assert finding.fix is not None
    assert finding.fix.arguments["reads"] == [*shards, "pytorch_model.bin.index.json", "config.json"]
    assert [w.rpartition("/")[2] for w in finding.fix.writes] == ["model.safetensors"]  # 5 GB shards by default

    staged = fix_copy(model, options=FixOptions(write=True, max_shard_size=8_000))
    names = staged.details["files"]
    assert names[-1] == "model.safetensors.index.json" and len(names) > 2
    assert names[:-1] == Naming("model", ".safetensors").shard_names(len(names) - 1)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(names[:-1])

    want: dict[str, Any] = {}
    for shard in shards:
        want.update(torch.load(model / shard, weights_only=True))
    for shard in shards + ["pytorch_model.bin.index.json"]:
        (model / shard).unlink()
    loaded = BertForMaskedLM.from_pretrained(model, use_safetensors=True).state_dict()
    assert_bit_equal(loaded, want)


def test_an_fp16_variant_gets_the_variant_names_and_loads_with_variant(tmp_path: Path) -> None:
    from transformers import BertForMaskedLM

    model = tmp_path / "bert"
    tiny_bert().save_pretrained(model)  # the default copy is safetensors already
    save_torch_bin(tiny_bert().half(), model, variant="fp16")
    (finding,) = cg008(model)
    assert finding.set == "pytorch_model.fp16.bin"
    assert finding.fix is not None and finding.fix.writes[0].endswith("/model.fp16.safetensors")
    fix_copy(model)
    loaded = BertForMaskedLM.from_pretrained(model, variant="fp16", use_safetensors=True, torch_dtype=torch.float16)
    assert_bit_equal(loaded.state_dict(), torch.load(model / "pytorch_model.fp16.bin", weights_only=True))


def test_bf16_weights_are_copied_bit_exactly_nan_payloads_included(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    torch.manual_seed(1)
    weight = torch.randn(64, 32).to(torch.bfloat16)
    weight.view(torch.int16)[0, :3] = torch.tensor([0x7FC1, -0x3F, 0x7F81], dtype=torch.int16)  # odd NaNs, -0
    state = {"weight": weight, "bias": torch.zeros(32, dtype=torch.bfloat16), "step": torch.tensor(7)}
    torch.save(state, model / "pytorch_model.bin")
    fix_copy(model)
    assert_bit_equal(safetensors_torch.load_file(model / "model.safetensors"), state)


def test_a_legacy_non_zip_bin_is_copied(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    state = {"a": torch.randn(5, 7), "b": torch.arange(10, dtype=torch.int64), "c": torch.randn(3).half()}
    torch.save(state, model / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    fix_copy(model)
    assert_bit_equal(safetensors_torch.load_file(model / "model.safetensors"), state)


def test_non_contiguous_views_are_gathered_and_disjoint_views_of_one_storage_become_copies(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    base = torch.randn(6, 4)
    rows = torch.randn(8, 3)
    state = {"transposed": torch.randn(5, 9).t(), "every_other": torch.randn(12)[::2], "first": rows[:4],
             "last": rows[4:], "base": base}
    torch.save(state, model / "pytorch_model.bin")
    staged = fix_copy(model)
    assert staged.details["gathered"] == 2 and staged.details["tied"] == []
    assert_bit_equal(safetensors_torch.load_file(model / "model.safetensors"), state)


# ---------------------------------------------------------------- diffusers and PEFT names

def test_a_diffusers_component_gets_diffusion_pytorch_model_safetensors(tmp_path: Path) -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2,
                                  down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",))
    model = tmp_path / "vae"
    vae.save_pretrained(model, safe_serialization=False)
    (finding,) = cg008(model)
    assert finding.fix is not None and finding.fix.writes[0].endswith("/diffusion_pytorch_model.safetensors")
    fix_copy(model)
    loaded = diffusers.AutoencoderKL.from_pretrained(model, use_safetensors=True)
    assert_bit_equal(loaded.state_dict(), torch.load(model / "diffusion_pytorch_model.bin", weights_only=True))


def test_a_peft_adapter_bin_gets_adapter_model_safetensors(tmp_path: Path) -> None:
    model = tmp_path / "adapter"
    model.mkdir()
    state = {"base_model.model.q.lora_A.weight": torch.randn(4, 16)}
    torch.save(state, model / "adapter_model.bin")
    (model / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (finding,) = cg008(model)
    assert finding.fix is not None and finding.fix.writes[0].endswith("/adapter_model.safetensors")
    fix_copy(model)
    assert_bit_equal(safetensors_torch.load_file(model / "adapter_model.safetensors"), state)


@pytest.mark.parametrize("name", ["optimizer.pt", "weights.pt", "checkpoint.pth", "training_args.bin"])
def test_training_state_and_loose_files_are_not_pickle_only_weights(tmp_path: Path, name: str) -> None:
    torch.save({"w": torch.zeros(2)}, tmp_path / name)
    assert cg008(tmp_path) == []


def test_torchscript_and_a_set_with_a_safetensors_copy_get_no_note(tmp_path: Path) -> None:
    scripted = tmp_path / "scripted"
    scripted.mkdir()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), scripted / "pytorch_model.bin")
    assert cg008(scripted) == []
    both = tmp_path / "both"
    both.mkdir()
    torch.save({"w": torch.zeros(2)}, both / "pytorch_model.bin")
    safetensors_torch.save_file({"w": torch.zeros(2)}, both / "model.safetensors")
    assert cg008(both) == []


# ---------------------------------------------------------------- refusals: nothing written

def test_a_hostile_pickle_gets_no_fix_and_nothing_is_written(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.zeros(3), "extra": Foreign()}, model / "pytorch_model.bin")
    report = scan_paths([model], Policy())
    assert {f.code for f in report.findings} >= {"CG003", "CG008"}
    (finding,) = [f for f in report.findings if f.code == "CG008"]
    assert finding.fix is not None and not finding.fix.available and "CG003" in finding.fix.description
    before = tree_state(model)
    planned = Fix("safetensors-copy", "", "safe", None, (), json.dumps(
        {"dir": str(model), "stem": "model", "variant": None, "files": ["pytorch_model.bin"], "index": None}))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(GuardError, match="CG003"):
        stage(planned, ActionContext(model, staging, FixOptions(write=True), Policy()))
    assert tree_state(model) == before and list(staging.iterdir()) == []


def test_a_sharded_set_with_a_broken_shard_gets_the_note_without_a_fix(tmp_path: Path) -> None:
    model = tmp_path / "bert"
    save_torch_bin(tiny_bert(), model, max_shard_size="8KB")
    last = sorted(model.glob("pytorch_model-*.bin"))[-1]
    last.write_bytes(last.read_bytes()[:100])
    (finding,) = cg008(model)
    assert "and its" in finding.message and finding.fix is not None and not finding.fix.available
    assert last.name in finding.fix.description and "CG001" in finding.fix.description


@pytest.mark.parametrize("params", [
    {"stem": "model", "files": [".."]}, {"stem": "model", "files": ["../x.bin"]}, {"stem": "../x", "files": ["a"]},
    {"stem": "model", "variant": "a/b", "files": ["a"]}, {"stem": "model", "files": ["a"], "index": "/etc/x"},
])
def test_params_from_a_tampered_report_are_refused_with_one_line(tmp_path: Path, params: dict[str, Any]) -> None:
    fix = Fix("safetensors-copy", "", "safe", None, (), json.dumps(params))
    with pytest.raises(GuardError, match="names no"):
        stage(fix, ActionContext(tmp_path, tmp_path, FixOptions(write=True), Policy()))


def test_partially_overlapping_views_of_one_storage_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    base = torch.randn(10)
    torch.save({"head": base[:6], "tail": base[4:]}, model / "pytorch_model.bin")
    (finding,) = cg008(model)
    before = tree_state(model)
    staging = tmp_path / "staging"
    staging.mkdir()
    assert finding.fix is not None
    with pytest.raises(GuardError, match="'head' and 'tail' share bytes of one storage"):
        stage(finding.fix, ActionContext(model.resolve(), staging, FixOptions(write=True), Policy()))
    assert tree_state(model) == before and list(staging.iterdir()) == []


def test_a_deflated_storage_is_refused_naming_file_and_tensor(tmp_path: Path) -> None:
    import zipfile

    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.randn(4, 4)}, tmp_path / "stored.bin")
    with zipfile.ZipFile(tmp_path / "stored.bin") as src, \
            zipfile.ZipFile(model / "pytorch_model.bin", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert torch.load(model / "pytorch_model.bin", weights_only=True)["w"].shape == (4, 4)
    (finding,) = cg008(model)
    assert finding.fix is not None
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(GuardError, match=r"^pytorch_model\.bin: tensor 'w' is not stored as a plain byte range"):
        stage(finding.fix, ActionContext(model.resolve(), staging, FixOptions(write=True), Policy()))
    assert sorted(p.name for p in model.iterdir()) == ["pytorch_model.bin"]


def test_a_copy_that_appeared_after_the_scan_is_never_replaced(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.randn(3)}, model / "pytorch_model.bin")
    (finding,) = cg008(model)
    (model / "model.safetensors").write_bytes(b"someone else's")
    staging = tmp_path / "staging"
    staging.mkdir()
    assert finding.fix is not None
    with pytest.raises(GuardError, match="already exists"):
        stage(finding.fix, ActionContext(model.resolve(), staging, FixOptions(write=True), Policy()))
    assert (model / "model.safetensors").read_bytes() == b"someone else's"


# ---------------------------------------------------------------- tied names and names, as data

def _info(name: str, start: int, end: int, *, storage: str = "0", shape: tuple[int, ...] = (4,),
          stride: tuple[int, ...] | None = None) -> TensorInfo:
    return TensorInfo(name, "F32", shape, "w.bin", start, end, stride, storage, start)


def test_ties_keep_the_undeclared_name_at_the_first_names_place() -> None:
    tensors = [_info("lm_head.weight", 0, 16), _info("x", 16, 32, storage="1"), _info("embed.weight", 0, 16),
               _info("empty", 8, 8, shape=(0,))]
    settled = settle_shared(tensors, {"model_type": "nope", "architectures": ["Nope"]})
    assert [t.name for t in settled.tensors] == ["embed.weight", "x", "empty"]
    assert [(t.kept, t.dropped) for t in settled.ties] == [("embed.weight", ("lm_head.weight",))]
    assert settled.patterns_from == "the usual tied output names" and r"lm_head\.weight" in USUAL_TIED_NAMES


def test_ties_with_no_declared_name_keep_the_first_sorted_and_views_that_differ_are_refused() -> None:
    settled = settle_shared([_info("b", 0, 16), _info("a", 0, 16)], None)
    assert [(t.kept, t.dropped) for t in settled.ties] == [("a", ("b",))]
    with pytest.raises(GuardError, match="'a' and 'b' share bytes"):
        settle_shared([_info("a", 0, 16, shape=(2, 2), stride=(1, 2)), _info("b", 0, 16, shape=(2, 2))], None)


def test_tied_keys_are_read_from_transformers_source_without_importing_it() -> None:
    pytest.importorskip("transformers")
    assert transformers_tied_keys("GPT2LMHeadModel", "gpt2") == ("lm_head.weight",)
    assert transformers_tied_keys("../../etc", "gpt2") is None
    assert transformers_tied_keys("GPT2LMHeadModel", "../gpt2") is None


@pytest.mark.parametrize("variant", [None, "fp16"])
@pytest.mark.parametrize("sizes, limit", [([5, 5, 5], 10), ([0, 11, 1], 10), ([3], 10), ([20, 20], 10)])
def test_the_rules_planned_names_are_the_writers(variant: str | None, sizes: list[int], limit: int) -> None:
    outputs = [type("T", (), {"nbytes": n})() for n in sizes]
    count = len(plan_shards(outputs, limit))  # type: ignore[arg-type]
    assert shard_count(sizes, limit) == count
    naming = Naming("model", ".safetensors", variant)
    assert copy_names("model", variant, count) == naming.shard_names(count) + ([naming.index_name] if count > 1 else [])


def test_the_scan_itself_never_imports_the_writer(tmp_path: Path) -> None:
    import subprocess

    torch.save({"w": torch.zeros(2)}, tmp_path / "pytorch_model.bin")
    code = ("import sys\nfrom guard.cli import main\nrc = main(['scan', '--no-summary', sys.argv[1]])\n"
            "print(rc, sorted(m for m in sys.modules if m == 'guard.fix' or m.startswith(('guard.write', 'guard.fix.', "
            "'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "0 []", out.stdout


@pytest.mark.parametrize("head", [0, 100, 4096])
@pytest.mark.parametrize("start", [0, 64, 4096 + 7])
def test_the_sink_copies_ranges_exactly_whether_or_not_their_pages_line_up(tmp_path: Path, head: int,
                                                                           start: int) -> None:
    from guard.write.sink import COPY_BLOCK, OutputStream

    source = tmp_path / "source"
    data = os.urandom(start + COPY_BLOCK + 12345)  # more than one mapped window
    source.write_bytes(data)
    stream = OutputStream()
    stream.open(tmp_path / "out")
    stream.write(b"h" * head)
    stream.copy_range(str(source), start, len(data) - start)
    stream.close()
    stream.finish()
    assert (tmp_path / "out").read_bytes() == b"h" * head + data[start:]


def test_torch_quantized_tensors_get_no_copy(tmp_path: Path) -> None:
    """A qint8 tensor's bytes are integers whose scale and zero point live only in the pickle: the copy
    would silently drop them, so the set gets the note without a fix, and nothing is written."""
    model = tmp_path / "m"
    model.mkdir()
    q = torch.quantize_per_tensor(torch.randn(4, 4), scale=0.1, zero_point=3, dtype=torch.qint8)
    torch.save({"w": q, "b": torch.zeros(4)}, model / "pytorch_model.bin")
    out = tmp_path / "r.json"
    main(["scan", str(model), "--format", "json", "-o", str(out)])
    cg008 = [f for f in json.loads(out.read_text())["findings"] if f["code"] == "CG008"]
    assert cg008 and not cg008[0]["fix"]["available"]
    assert "torch-quantized" in cg008[0]["fix"]["description"]
    before = sorted(p.name for p in model.iterdir())
    main(["fix", str(model), "--write"])
    assert sorted(p.name for p in model.iterdir()) == before


def test_the_plan_names_the_shards_max_shard_size_will_write(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Under --max-shard-size the plan lists the shard names the copy is then written under."""
    model = tmp_path / "m"
    model.mkdir()
    torch.save({f"layer{i}.weight": torch.randn(64, 64) for i in range(5)}, model / "pytorch_model.bin")
    capsys.readouterr()
    assert main(["fix", str(model), "--max-shard-size", "40KB", "--format", "json"]) == 1
    planned = json.loads(capsys.readouterr().out)["extra"]["fix"]["plan"]
    writes = sorted(Path(p).name for p in planned[0]["writes"])
    assert writes == sorted([f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
                            + ["model.safetensors.index.json"])
    main(["fix", str(model), "--max-shard-size", "40KB", "--write"])
    assert sorted(p.name for p in model.glob("model*")) == writes


def test_a_byteorder_record_under_another_case_is_found_as_torch_finds_it(tmp_path: Path) -> None:
    """miniz finds records ignoring case, so torch.load byte-swaps every storage of a file whose
    ``BYTEORDER`` record says ``big``; the readers find the small records the same way, and so
    does the copy: it refuses the file rather than copy little-endian bytes torch reads swapped."""
    import zipfile

    torch.save({"w": torch.arange(1, 5, dtype=torch.int32)}, tmp_path / "pytorch_model.bin")
    model = tmp_path / "m"
    model.mkdir()
    with zipfile.ZipFile(tmp_path / "pytorch_model.bin") as src, \
            zipfile.ZipFile(model / "pytorch_model.bin", "w") as dst:
        for info in src.infolist():
            name, data = info.filename, src.read(info)
            if name.endswith("/byteorder"):
                name, data = name[: -len("byteorder")] + "BYTEORDER", b"big"
            dst.writestr(zipfile.ZipInfo(name, info.date_time), data)
    swapped = torch.load(model / "pytorch_model.bin", weights_only=True)["w"]
    assert swapped.tolist() == [v << 24 for v in (1, 2, 3, 4)]  # torch read the record as its byteorder
    (finding,) = cg008(model)
    assert finding.fix is not None
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(GuardError, match=r"^pytorch_model\.bin: its storages are big-endian"):
        stage(finding.fix, ActionContext(model.resolve(), staging, FixOptions(write=True), Policy()))
    assert sorted(p.name for p in model.iterdir()) == ["pytorch_model.bin"]
