"""convert on bad input: one-line errors (exit 2) or findings (exit 1); never partial output, inputs untouched."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from test_convert import convert, tiny_mistral  # noqa: E402

from guard.progress import progress  # noqa: E402
from guard.write import writer  # noqa: E402
from guard.write.bitviews import numpy_to_torch, torch_to_numpy  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CI", "true")


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name)


def run_json(tmp_path: Path, *args: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    report = tmp_path / "report.json"
    code = convert(*args, "-f", "json", "-o", report)
    return code, json.loads(report.read_text()) if report.exists() else {}


def codes(report: dict) -> list[str]:  # type: ignore[type-arg]
    return sorted(f["code"] for f in report["findings"])


def test_missing_shard(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path, max_shard_size="4KB")
    next(src.glob("model-00002-*.safetensors")).unlink()
    before = digest(src)
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and "CG004" in codes(report)
    assert not (tmp_path / "f").exists() and digest(src) == before


def test_truncated_tensor_bytes(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    path = src / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and codes(report) == ["CG001"]
    assert not (tmp_path / "f").exists()


def test_config_not_json(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    (src / "config.json").write_text("{not json")
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and codes(report) == ["CG001"]
    assert report["findings"][0]["path"].endswith("config.json")


@pytest.mark.parametrize("model_type", ["no-such-model", "../../etc/passwd\x1b[31m" + "x" * 5000, 42])
def test_unknown_or_hostile_model_type_is_refused(tmp_path: Path, model_type: object) -> None:
    """A guessed mapping never passes as success: an architecture convert does not know is refused."""
    src = tiny_mistral(tmp_path)
    config = json.loads((src / "config.json").read_text())
    config.update(model_type=model_type, architectures=["NoSuchModelForCausalLM"])
    (src / "config.json").write_text(json.dumps(config))
    before = digest(src)
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and codes(report) == ["CG304"]
    [finding] = report["findings"]
    assert finding["path"].endswith("config.json") and len(finding["message"]) < 1200
    assert not (tmp_path / "f").exists() and leftovers(tmp_path) == [] and digest(src) == before


def test_no_config_is_refused_across_frameworks(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    (src / "config.json").unlink()
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and codes(report) == ["CG304"] and "model_type" in report["findings"][0]["message"]
    assert not (tmp_path / "f").exists()


def test_tensor_names_of_no_known_architecture(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = tiny_mistral(tmp_path)
    tensors = {k.replace("model.layers.", "backbone.blocks."): v
               for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and set(codes(report)) == {"CG304"}
    named = {f["tensor"] for f in report["findings"]}
    assert "backbone.blocks.0.self_attn.q_proj.weight" in named
    assert "mistral models have no 'backbone'" in report["findings"][0]["message"]
    assert not (tmp_path / "f").exists()


def test_composite_config_without_its_sub_configs(tmp_path: Path) -> None:
    import transformers

    torch.manual_seed(0)
    bert = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(bert, bert)
    transformers.EncoderDecoderModel(config).save_pretrained(tmp_path / "src")
    data = json.loads((tmp_path / "src" / "config.json").read_text())
    del data["decoder"]
    (tmp_path / "src" / "config.json").write_text(json.dumps(data))
    code, report = run_json(tmp_path, tmp_path / "src", "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and codes(report) == ["CG304"]
    assert "encoder-decoder config has no 'decoder' sub-config" in report["findings"][0]["message"]
    assert not (tmp_path / "f").exists()


def test_a_layer_missing_from_the_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = tiny_mistral(tmp_path)
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and [f["tensor"] for f in report["findings"]] == ["model.layers.0.mlp.down_proj.weight"]


def test_shard_deleted_mid_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_mistral(tmp_path, max_shard_size="4KB")
    shard = next(src.glob("model-00002-*.safetensors"))
    real = writer.dtypes_code
    calls = {"n": 0}

    def vanish(array: np.ndarray) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            shard.unlink()  # after planning, before its tensors are read
        return real(array)

    monkeypatch.setattr(writer, "dtypes_code", vanish)
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and shard.name in err[0] and "nothing written" in err[0]
    assert not (tmp_path / "f").exists() and leftovers(tmp_path) == []


def test_refusal_says_what_to_do_not_an_empty_scan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_mistral(tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 1
    out = capsys.readouterr().out
    assert "CG304 [error]" in out and "no checkpoint files found" not in out and "0 model(s)" not in out
    assert out.strip().splitlines()[-2].startswith("ckpt-guard: convert refused: 1 error(s)")
    assert out.strip().splitlines()[-1].startswith("ckpt-guard: what to do: ")


def test_shape_mismatch_and_extra_tensor_are_cg304(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    from safetensors.torch import load_file, save_file

    tensors = load_file(src / "model.safetensors")
    tensors["model.extra.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    tensors["model.norm.weight"] = torch.zeros(17, dtype=torch.bfloat16)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1
    named = {f["tensor"] for f in report["findings"] if f["code"] == "CG304"}
    assert {"model.extra.weight", "model.norm.weight"} <= named
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("case", ["exists", "same", "not-writable"])
def test_refused_targets(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = tiny_mistral(tmp_path)
    before = digest(src)
    out = {"exists": tmp_path / "taken", "same": src, "not-writable": tmp_path / "file" / "out"}[case]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("a file, not a directory")
    assert convert(src, "--to", "flax", "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ckpt-guard: error:")
    assert digest(src) == before and (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_empty_existing_target_is_used(tmp_path: Path) -> None:
    src = tiny_mistral(tmp_path)
    (tmp_path / "f").mkdir()
    assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
    assert (tmp_path / "f" / "flax_model.msgpack").is_file()


@pytest.mark.parametrize("to", ["flax", "torch"])
def test_interrupt_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str) -> None:
    src = tiny_mistral(tmp_path, max_shard_size="4KB")
    if to == "torch":
        assert convert(src, "--to", "flax", "--out", tmp_path / "f") == 0
        src = tmp_path / "f"
    before = digest(src)
    real = writer.dtypes_code
    calls = {"n": 0}

    def interrupt(array: np.ndarray) -> str:
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(array)

    monkeypatch.setattr(writer, "dtypes_code", interrupt)
    assert convert(src, "--to", to, "--out", tmp_path / "out", "--max-shard-size", "4KB") == 130
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    assert digest(src) == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16])
def test_bit_views_keep_every_pattern(dtype: torch.dtype) -> None:
    width = torch.int16 if dtype.itemsize == 2 else torch.uint8
    count = 2**16 if dtype.itemsize == 2 else 256
    patterns = torch.arange(count, dtype=torch.int32).to(torch.int16 if width == torch.int16 else torch.uint8)
    t = patterns.view(dtype)
    a = torch_to_numpy(t)
    assert a.dtype.name == str(dtype).removeprefix("torch.")
    back = numpy_to_torch(a)
    assert torch.equal(back.view(width), patterns)


def test_progress_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert list(progress(range(3), total=3, desc="x")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert list(progress(range(4), total=4, desc="conv", unit="tensors")) == [0, 1, 2, 3]
    assert "] 100% conv" in capsys.readouterr().err


def test_convert_cli_import_is_light() -> None:
    import subprocess

    code = ("import sys, guard.cli; heavy = [m for m in ('torch', 'jax', 'flax', 'numpy', 'transformers') "
            "if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hostile_pickle_is_refused_before_torch_sees_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle
    import zipfile

    class Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with zipfile.ZipFile(src / "pytorch_model.bin", "w") as zf:
        zf.writestr("pytorch_model/data.pkl", pickle.dumps({"w": Payload()}, protocol=2))
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    code, report = run_json(tmp_path, src, "--to", "flax", "--out", tmp_path / "f")
    assert code == 1 and "CG003" in codes(report) and loads == []
    assert any("builtins.print" in f["message"] for f in report["findings"])
    assert not (tmp_path / "f").exists()
