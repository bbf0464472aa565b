"""PyTorch Distributed Checkpoints, written by torch itself, read as one training-state set each.

Every layout is written on the CPU by ``tests/dcp_writers.py``: ``dcp.save`` without a process group,
FSDP2 on a gloo mesh of 2 with and without ``MixedPrecisionPolicy(param_dtype=bf16)``, and the HF
storage writer's shards.  The metadata reading agrees with torch's own reader; planted defects give
their codes; a forged ``.metadata`` is CG003 and runs nothing.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import dcp_writers  # noqa: E402
from scanning import codes, copy_tree, errors, json_scan  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    model = dcp_writers.tiny_llama()
    return {"num_parameters": model.num_parameters(),  # type: ignore[dict-item]
            **{k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dcp_writers.save_plain(tmp_path_factory.mktemp("plain") / "ckpt")


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dcp_writers.save_fsdp2(tmp_path_factory.mktemp("fsdp2"), mixed=False)


@pytest.fixture(scope="module")
def fsdp2_mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dcp_writers.save_fsdp2(tmp_path_factory.mktemp("fsdp2mp"), mixed=True)


def _training_set(report: dict) -> dict:
    (entry,) = report["models"]
    (found,) = entry["sets"]
    assert found["role"] == "training-state" and found["format"] == "dcp" and found["primary"]
    return found


def _shapes_of(report: dict) -> dict[str, tuple[int, ...]]:
    from guard.inventory import discover_models, load_local_model

    (inv,) = [load_local_model(m) for m in discover_models([report["models"][0]["path"]])]
    (scan,) = inv.files
    return {t.name: t.shape for t in scan.tensors}


@pytest.mark.parametrize("which", ["plain", "fsdp2", "fsdp2_mixed", "hf", "per-rank"])
def test_each_writer_is_one_set_of_the_models_logical_tensors(which: str, request: pytest.FixtureRequest,
                                                             capsys, reference, monkeypatch) -> None:
    root = {"plain": lambda: request.getfixturevalue("plain"),
            "fsdp2": lambda: request.getfixturevalue("fsdp2") / "dcp",
            "fsdp2_mixed": lambda: request.getfixturevalue("fsdp2_mixed") / "dcp",
            "hf": lambda: request.getfixturevalue("fsdp2") / "hf",
            "per-rank": lambda: request.getfixturevalue("fsdp2") / "per-rank"}[which]()
    monkeypatch.chdir(root.parent)
    code, report = json_scan(capsys, root.name)
    assert code == 0 and not errors(report), errors(report)
    found = _training_set(report)
    assert found["parameters"] == reference["num_parameters"]  # what num_parameters() says, not one rank's half
    assert set(found["dtypes"]) == {"F32"}  # FSDP2 with param_dtype=bf16 saves its fp32 sharded parameters
    notes = " ".join(found["notes"])
    ranks = 1 if which == "plain" else 2
    assert f"world size {ranks}" in notes and "module weights fp32" in notes
    if which not in ("hf", "per-rank"):
        assert "optimizer state fp32" in notes and "non-tensor item(s), not unpickled" in notes
    expected = {k: v[0] for k, v in reference.items() if k != "num_parameters"}
    assert _shapes_of(report) == expected  # the model's own keys, global shapes


def test_mixed_precision_inside_training_state_is_not_a_dtype_finding(tmp_path: Path, capsys) -> None:
    """bf16 module weights beside fp32 optimizer moments: the policy judges the weights it would publish."""
    import torch.distributed.checkpoint as dcp

    model = dcp_writers.tiny_llama().to(torch.bfloat16)
    moments = {k: {"exp_avg": torch.zeros(v.shape), "exp_avg_sq": torch.zeros(v.shape)}
               for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning):
        dcp.save({"model": model.state_dict(), "optim": {"state": moments}}, checkpoint_id=str(tmp_path / "ck"))
    code, report = json_scan(capsys, str(tmp_path / "ck"), "--expect", "bf16", "--ignore", "CG104")
    assert code == 0 and not {"CG101", "CG102"} & codes(report), report["findings"]
    assert set(_training_set(report)["dtypes"]) == {"BF16"}
    code, report = json_scan(capsys, str(tmp_path / "ck"), "--ignore", "CG104")  # expect fp32: bf16 weights
    assert code == 1 and "CG101" in codes(report) and "CG102" not in codes(report)


def test_metadata_agrees_with_torchs_own_reader(fsdp2: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from guard.training.dcp.layout import parse_metadata

    theirs = FileSystemReader(str(fsdp2 / "dcp")).read_metadata()
    ours = parse_metadata((fsdp2 / "dcp" / ".metadata").read_bytes())
    assert [i.fqn for i in ours.items] == list(theirs.state_dict_metadata)
    for item in ours.items:
        meta = theirs.state_dict_metadata[item.fqn]
        if isinstance(meta, BytesStorageMetadata):
            assert item.dtype is None and item.shape is None
            continue
        assert item.shape == tuple(meta.size)
        assert item.dtype == {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64"}[meta.properties.dtype]
        assert [(c.offsets, c.sizes) for c in item.chunks] == [(tuple(c.offsets), tuple(c.sizes)) for c in meta.chunks]
        assert item.path == tuple(theirs.planner_data[item.fqn])
    assert {(s.fqn, s.offset): (s.file, s.start, s.length) for s in ours.storage} == {
        (k.fqn, tuple(k.offset) if k.offset is not None else None): (v.relative_path, v.offset, v.length)
        for k, v in theirs.storage_data.items()}
    assert sum(len(i.chunks) for i in ours.items) > len([i for i in ours.items if i.shape])  # two ranks' chunks


def test_a_forged_metadata_is_cg003_and_runs_nothing(plain: Path, tmp_path: Path, capsys) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    sentinel = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(sentinel), "w"))

    ckpt = copy_tree(plain, tmp_path / "forged")
    metadata = FileSystemReader(str(plain)).read_metadata()
    metadata.planner_data = {"x": Payload()}  # hidden one level down, as an attacker would
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))
    code, report = json_scan(capsys, str(ckpt))
    assert code == 1 and not sentinel.exists()
    (finding,) = [f for f in report["findings"] if f["code"] == "CG003"]
    assert finding["path"].endswith("forged/.metadata") and "io.open" in finding["message"]


def _resaved(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy whose .metadata is torch's own Metadata, edited, pickled again as torch pickles it."""
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = copy_tree(src, dst)
    metadata = FileSystemReader(str(src)).read_metadata()
    edit(metadata)
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata, protocol=4))
    return ckpt


def _overlap(metadata) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    first, second = sorted((v for v in metadata.storage_data.values() if v.relative_path == "__0_0.distcp"),
                           key=lambda v: v.offset)[:2]
    key = next(k for k, v in metadata.storage_data.items() if v is second)
    metadata.storage_data[key] = _StorageInfo(second.relative_path, first.offset + 8, second.length)


def _gap(metadata) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    item = metadata.state_dict_metadata["model.model.embed_tokens.weight"]
    chunk = item.chunks[-1]
    item.chunks[-1] = ChunkStorageMetadata(chunk.offsets, torch.Size([chunk.sizes[0] - 1, *chunk.sizes[1:]]))


def _remove(name: str):  # type: ignore[no-untyped-def]
    return lambda ckpt: (ckpt / name).unlink()


def _truncate(ckpt: Path) -> None:
    data = (ckpt / "__0_0.distcp").read_bytes()
    (ckpt / "__0_0.distcp").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("defect,code,file", [
    (_remove("__1_0.distcp"), "CG114", "__1_0.distcp"),
    (_truncate, "CG115", "__0_0.distcp"),
    (_overlap, "CG115", "__0_0.distcp"),
    (_gap, "CG116", ".metadata"),
    (_remove(".metadata"), "CG117", "__0_0.distcp"),
], ids=["rank-missing", "truncated", "overlap", "not-tiling", "no-metadata"])
def test_planted_defects_get_their_code_naming_the_file(fsdp2: Path, tmp_path: Path, capsys, defect, code,
                                                       file) -> None:
    if defect in (_overlap, _gap):
        ckpt = _resaved(fsdp2 / "dcp", tmp_path / "ckpt", defect)
    else:
        ckpt = copy_tree(fsdp2 / "dcp", tmp_path / "ckpt")
        defect(ckpt)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    rc, report = json_scan(capsys, str(ckpt))
    assert rc == 1
    found = [f for f in report["findings"] if f["code"] == code]
    assert found and all(f["severity"] == "error" for f in found), report["findings"]
    assert any(f["path"].endswith(f"ckpt/{file}") for f in found), found
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before  # the input is never modified


def test_a_missing_rank_of_the_hf_writer_is_a_gap(fsdp2: Path, tmp_path: Path, capsys) -> None:
    ckpt = copy_tree(fsdp2 / "hf", tmp_path / "hf")
    (ckpt / "shard-00001-model-00001-of-00001.safetensors").unlink()  # rank 0's pieces: the first rows
    rc, report = json_scan(capsys, str(ckpt))
    assert rc == 1 and {"CG114", "CG116"} <= codes(report), report["findings"]


def test_a_scan_reads_only_the_metadata(fsdp2: Path) -> None:
    from guard.inventory import discover_models, load_local_model

    (inv,) = [load_local_model(m) for m in discover_models([fsdp2 / "dcp"])]
    (scan,) = inv.files
    assert scan.bytes_read == (fsdp2 / "dcp" / ".metadata").stat().st_size
    # the .distcp files are listed with their sizes, never opened
    assert scan.size == sum(p.stat().st_size for p in (fsdp2 / "dcp").iterdir())


def _dcp_to_torch_save_model(ckpt: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(ckpt), str(tmp_path / "reference.pt"))
    return torch.load(tmp_path / "reference.pt", weights_only=True)["model"]  # the tutorial's {"model": ...}


@pytest.mark.parametrize("which", ["plain", "fsdp2", "per-rank"])
def test_convert_equals_dcp_to_torch_save_and_loads_in_transformers(which: str, request: pytest.FixtureRequest,
                                                                   tmp_path: Path, capsys) -> None:
    """per-rank: the same model saved without collectives (no .metadata, each rank's own) against the
    reference of the save with collectives (dcp_to_torch_save needs the global .metadata)."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from guard.cli import main

    root = request.getfixturevalue("fsdp2" if which == "per-rank" else which)
    ckpt, config = (root, root.parent / f"{root.name}-config") if which == "plain" else (root / which, root / "config")
    if which == "fsdp2":
        ckpt = root / "dcp"
    out = tmp_path / "out"
    assert main(["convert", str(ckpt), "--to", "torch", "--out", str(out), "--config", str(config / "config.json"),
                 "--format", "json"]) == 0, capsys.readouterr().out
    ours = load_file(out / "model.safetensors")
    reference = _dcp_to_torch_save_model(root / "dcp" if which == "per-rank" else ckpt, tmp_path)
    assert set(ours) == set(reference)  # the model's own keys: no `model.` container, no optimizer
    for key, tensor in reference.items():
        assert ours[key].dtype == tensor.dtype and ours[key].shape == tensor.shape
        assert ours[key].view(torch.uint8).equal(tensor.contiguous().view(torch.uint8)), key  # bit for bit
    _, info = LlamaForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


@pytest.mark.parametrize("defect,code", [
    (lambda ckpt: (ckpt / "__1_0.distcp").unlink(), "CG114"),
    (_truncate, "CG115"),
    (lambda ckpt: (ckpt / ".metadata").write_bytes(b"\x80\x04cos\nsystem\n(S'touch /tmp/x'\ntR."), "CG003"),
], ids=["rank-missing", "truncated", "forged"])
def test_convert_refuses_a_bad_checkpoint_and_writes_nothing(fsdp2: Path, tmp_path: Path, capsys, defect,
                                                            code) -> None:
    from guard.cli import main

    ckpt = copy_tree(fsdp2 / "dcp", tmp_path / "ckpt")
    defect(ckpt)
    out = tmp_path / "out"
    rc = main(["convert", str(ckpt), "--to", "torch", "--out", str(out), "--config", str(fsdp2 / "config"),
               "--format", "json"])
    text = capsys.readouterr().out
    assert rc == 1 and f'"{code}"' in text, text
    assert not out.exists() or not any(out.iterdir())


def test_a_narrower_published_copy_beside_the_masters_is_a_note(fsdp2: Path, tmp_path: Path, capsys,
                                                               monkeypatch) -> None:
    run = tmp_path / "run"
    copy_tree(fsdp2 / "dcp", run / "dcp")  # fp32 module weights: FSDP2's sharded parameters
    dcp_writers.tiny_llama().to(torch.bfloat16).save_pretrained(run)  # the bf16 copy a user would publish
    monkeypatch.chdir(tmp_path)
    code, report = json_scan(capsys, "run", "--ignore", "CG101,CG104")
    (note,) = [f for f in report["findings"] if f["code"] == "CG122"]
    assert note["severity"] == "note" and note["path"] == "run/model.safetensors"
    assert "ckpt-guard convert run/dcp --to torch --out" in note["message"]
    same = tmp_path / "same"
    copy_tree(fsdp2 / "dcp", same / "dcp")
    dcp_writers.tiny_llama().save_pretrained(same)  # fp32 beside fp32 masters: nothing to say
    code, report = json_scan(capsys, "same", "--ignore", "CG101,CG104")
    assert "CG122" not in codes(report)


def test_metadata_mutations_are_findings_never_crashes() -> None:
    """Byte mutations of a real .metadata: a parse, or one MalformedCheckpoint-like failure; never anything else,
    never a hang, and nothing is ever imported (the allow-list holds whatever the bytes say)."""
    import random
    import sys
    import time

    from guard.readers import READ_FAILURES
    from guard.training.dcp.layout import parse_metadata

    data = _small_metadata()
    rng = random.Random(30)
    before = set(sys.modules)
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(mutated))
            mutated[at] = rng.randrange(256)
        start = time.monotonic()
        try:
            parse_metadata(bytes(mutated))
        except READ_FAILURES:
            pass
        assert time.monotonic() - start < 2
    assert set(sys.modules) == before


def _small_metadata() -> bytes:
    import io
    import tempfile
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(4, 3), "b": torch.zeros(3)}, "step": io.BytesIO(b"7")},
                 storage_writer=FileSystemWriter(folder))
        return (Path(folder) / ".metadata").read_bytes()


def test_megatron_torch_dist_files_are_listed_never_unpickled(tmp_path: Path, capsys) -> None:
    """Megatron-core's torch_dist is DCP plus metadata.json and common.pt (an argparse.Namespace): the
    checkpoint's own files, not a pickle of weights to refuse (no CG003), and nothing in them is read."""
    import argparse
    import json
    import warnings

    import torch.distributed.checkpoint as dcp

    ckpt = tmp_path / "iter_0000010"
    model = dcp_writers.tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(dict(model.state_dict()), checkpoint_id=str(ckpt))
    (ckpt / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    torch.save({"args": argparse.Namespace(params_dtype=torch.bfloat16, iteration=10)}, ckpt / "common.pt")
    code, report = json_scan(capsys, str(ckpt))
    assert code == 0 and not errors(report), report["findings"]
    found = _training_set(report)
    notes = " ".join(found["notes"])
    assert "Megatron-core (torch_dist)" in notes and "common.pt" in notes
    assert found["parameters"] == model.num_parameters()


def test_torchtitan_llama_converts_to_the_hf_model_it_came_from(tmp_path: Path, capsys) -> None:
    """Its names mapped and its q/k RoPE permutation undone: bit for bit the HF weights torchtitan started from."""
    from safetensors.torch import load_file

    from guard.cli import main

    original = dcp_writers.save_torchtitan_layout(tmp_path / "step-3")
    code, report = json_scan(capsys, str(tmp_path / "step-3"))
    assert code == 0 and "torchtitan" in " ".join(_training_set(report)["notes"])
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "step-3"), "--to", "torch", "--out", str(out)]) == 1  # no config: refused
    assert "CG304" in capsys.readouterr().out and not (out / "model.safetensors").exists()
    dcp_writers.tiny_llama_config().save_pretrained(tmp_path / "config")
    assert main(["convert", str(tmp_path / "step-3"), "--to", "torch", "--out", str(tmp_path / "hf"),
                 "--config", str(tmp_path / "config")]) == 0, capsys.readouterr().out
    ours = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(ours) == set(original)
    for key, tensor in original.items():
        assert torch.equal(ours[key].view(torch.uint8), tensor.contiguous().view(torch.uint8)), key


def test_convert_refuses_a_forged_chunk_record_and_runs_nothing(fsdp2: Path, tmp_path: Path, capsys) -> None:
    """A chunk's bytes are a torch.save zip torch.load would unpickle: each is walked before anything is written."""
    import io

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from guard.cli import main

    sentinel = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(sentinel), "w"))

    record = io.BytesIO()
    torch.save(Payload(), record)
    forged = record.getvalue()
    ckpt = tmp_path / "ckpt"

    def point_at_the_forged_record(metadata) -> None:  # type: ignore[no-untyped-def]
        key = next(k for k in metadata.storage_data if k.fqn == "model.model.norm.weight")
        size = (fsdp2 / "dcp" / "__0_0.distcp").stat().st_size
        metadata.storage_data[key] = _StorageInfo("__0_0.distcp", size, len(forged))

    _resaved(fsdp2 / "dcp", ckpt, point_at_the_forged_record)
    with open(ckpt / "__0_0.distcp", "ab") as fh:
        fh.write(forged)
    out = tmp_path / "out"
    rc = main(["convert", str(ckpt), "--to", "torch", "--out", str(out), "--config", str(fsdp2 / "config"),
               "--format", "json"])
    text = capsys.readouterr().out
    assert rc == 1 and '"CG003"' in text and "__0_0.distcp" in text, text
    assert not sentinel.exists() and (not out.exists() or not any(out.iterdir()))


def test_convert_of_the_hf_writers_shards_equals_its_own_consolidation(fsdp2: Path, tmp_path: Path, capsys) -> None:
    from safetensors.torch import load_file

    from guard.cli import main

    written = fsdp2 / "hf-consolidated"
    (theirs,) = written.glob("model-*.safetensors")
    out = tmp_path / "out"
    assert main(["convert", str(written / "sharded"), "--to", "torch", "--out", str(out), "--config",
                 str(fsdp2 / "config")]) == 0, capsys.readouterr().out
    ours, reference = load_file(out / "model.safetensors"), load_file(theirs)
    assert set(ours) == set(reference)
    for key, tensor in reference.items():
        assert ours[key].dtype == tensor.dtype and torch.equal(ours[key].view(torch.uint8), tensor.view(torch.uint8))


def test_diff_compares_two_checkpoints_as_models_values_included(plain: Path, fsdp2: Path, tmp_path: Path,
                                                                 capsys) -> None:
    """Step 0 (seeded init) against step 1, and one FSDP2 state saved twice (with and without collectives):
    the logical tensors are compared, each assembled from its chunks."""
    import json
    import warnings

    import torch.distributed.checkpoint as dcp

    from guard.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": dcp_writers.tiny_llama().state_dict()}, checkpoint_id=str(tmp_path / "step-0"))
    assert main(["diff", str(tmp_path / "step-0"), str(plain), "--values", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    text = json.dumps(report)
    assert '"max_abs"' in text and "not compared" not in text
    assert main(["diff", str(fsdp2 / "dcp"), str(fsdp2 / "per-rank"), "--values"]) == 0
    out = capsys.readouterr().out
    assert "model .: unchanged, 21 tensor(s) with identical values" in out, out  # the folders' names are no change


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "module._orig_mod."], ids=["compile", "ddp", "both"])
def test_wrapper_prefixes_are_stripped_to_the_models_own_keys(prefix: str, tmp_path: Path, capsys) -> None:
    """torch.compile's `_orig_mod.` and DDP's `module.`, under the tutorial's {"model": ...}: the model's keys."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from guard.cli import main

    model = dcp_writers.tiny_llama()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {prefix + k: v for k, v in model.state_dict().items()}}, checkpoint_id=str(tmp_path / "ck"))
    dcp_writers.tiny_llama_config().save_pretrained(tmp_path / "ck")  # config.json beside the checkpoint
    assert main(["convert", str(tmp_path / "ck"), "--to", "torch", "--out", str(tmp_path / "out")]) == 0, \
        capsys.readouterr().out
    assert set(load_file(tmp_path / "out" / "model.safetensors")) == set(model.state_dict())


def test_diff_pairs_a_checkpoint_saved_at_another_step_and_guesses_nothing_else(tmp_path: Path, capsys) -> None:
    """Beside a published model, ``step-1/`` against ``step-2/`` is one model at two steps; against
    ``step-2/`` and ``step-3/`` it is not known which, and nothing is paired."""
    import json
    import warnings

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from guard.cli import main

    def side(name: str, steps: tuple[int, ...]) -> Path:
        root = tmp_path / name
        root.mkdir()
        save_file({"w": torch.ones(2, 2)}, root / "model.safetensors")
        for step in steps:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.save({"model": {"w": torch.full((2, 2), float(step))}}, checkpoint_id=str(root / f"step-{step}"))
        return root

    def keys(old: Path, new: Path) -> dict[str, str]:
        capsys.readouterr()
        assert main(["diff", "--values", "--format", "json", "--no-summary", str(old), str(new)]) == 0
        return {m["key"]: m["status"] for m in json.loads(capsys.readouterr().out)["models"]}

    old = side("old", (1,))
    assert keys(old, side("new", (2,))) == {".": "unchanged", "step-1 -> step-2": "changed"}
    assert keys(old, side("two", (2, 3))) == {".": "unchanged", "step-1": "removed", "step-2": "added",
                                              "step-3": "added"}


@pytest.fixture()
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    from hub_standin import standin_fixture

    yield from standin_fixture(monkeypatch, tmp_path)


def test_a_hub_scan_reads_the_hf_writers_shards_as_one_set_as_locally(fsdp2: Path, standin, tmp_path: Path) -> None:
    """The HF storage writer's shards pushed to a repository: read by ranged reads into one
    training-state set with the model's global shapes and parameter count, as the local scan reads them (before,
    two models of half the parameters, with shard shapes), and
    a repository of nothing else publishes no loadable model (CG121); a missing rank is CG114 there too."""
    from guard.config import build_policy
    from guard.hub.client import HubClient
    from guard.hub.scan import scan_hub
    from guard.scan import scan_paths

    def files(path: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}

    gapped = copy_tree(fsdp2 / "hf", tmp_path / "gapped")
    (gapped / "shard-00001-model-00001-of-00001.safetensors").unlink()
    standin.add_repo("org/hf", files(fsdp2 / "hf"))
    standin.add_repo("org/gapped", files(gapped))
    policy = build_policy({}, source=None, overrides={})
    result = scan_hub(["org/hf", "org/gapped"], policy, HubClient(token="hf_bot"), publishing=True)
    local = scan_paths([str(fsdp2 / "hf")], policy, publishing=True)
    (expected,) = local.models
    remote = {m.path: m for m in result.report.models}
    assert set(remote) == {"org/hf", "org/gapped"}
    assert remote["org/hf"].parameters == expected.parameters == dcp_writers.tiny_llama().num_parameters()
    ours = {(f.code, f.severity.value) for f in result.report.findings if f.path.startswith("org/hf")}
    assert ours == {(f.code, f.severity.value) for f in local.findings} and ("CG121", "error") in ours
    gap = {f.code for f in result.report.findings if f.path.startswith("org/gapped")}
    assert {"CG114", "CG116"} <= gap
    read = {r["repo"]: {f["path"]: f for f in r["files"]} for r in result.report.extra["hub"]["repos"]}
    assert read["org/hf"]["."]["requests"] >= 2  # one folder entry: each shard's header, by ranged reads


def test_a_diff_of_two_checkpoint_folders_names_only_what_changed(tmp_path: Path, capsys) -> None:
    """``diff step-100/ step-200/``: each folder is its side's checkpoint, so the folders' names are no
    change.  The same save twice is unchanged; one tensor saved anew in another dtype is the only change."""
    import json
    import warnings

    import torch.distributed.checkpoint as dcp

    from guard.cli import main

    def save(name: str, bias_dtype: torch.dtype) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": {"w": torch.ones(4, 4), "b": torch.zeros(4, dtype=bias_dtype)}},
                     checkpoint_id=str(tmp_path / name))
        return tmp_path / name

    def report(old: Path, new: Path) -> dict:  # type: ignore[type-arg]
        capsys.readouterr()
        main(["diff", "--values", "--format", "json", "--no-summary", str(old), str(new)])
        return json.loads(capsys.readouterr().out)

    first, same, recast = save("step-100", torch.float32), save("step-200", torch.float32), \
        save("step-300", torch.bfloat16)
    (model,) = report(first, same)["models"]
    assert model["status"] == "unchanged" and [s["status"] for s in model["sets"]] == ["unchanged"], model
    (model,) = report(first, recast)["models"]
    (changed,) = model["sets"]
    assert model["status"] == changed["status"] == "changed"
    assert [(t["name"], t["kinds"]) for t in changed["changed"]] == [("b", ["recast"])], changed
