from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from guard.cli import main


def _model(directory: Path, tensors: dict[str, torch.Tensor], *, config: dict | None = None,
           name: str = "model.safetensors") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / name, metadata={"format": "pt"})
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def _bart_like(dtype_dec: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    return {
        "model.encoder.layers.0.fc1.weight": torch.randn(16, 4),
        "model.encoder.layernorm_embedding.weight": torch.ones(4),
        "model.decoder.layers.0.fc1.weight": torch.randn(8, 4).to(dtype_dec),
        "model.decoder.layernorm_embedding.weight": torch.ones(4).to(dtype_dec),
        "model.encoder.embed_positions.position_ids": torch.arange(4),
    }


def _json_scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["scan", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def _codes(report: dict) -> list[str]:
    return sorted({f["code"] for f in report["findings"]})


def test_clean_fp32_model_passes_with_a_dtype_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "clean", {"a.weight": torch.randn(4, 4), "b.bias": torch.zeros(4)},
           config={"torch_dtype": "float32"})
    code, report = _json_scan(capsys, str(tmp_path / "clean"))
    assert code == 0 and report["version"] == 2 and report["findings"] == []
    (model,) = report["models"]
    assert model["dtypes"] == {"F32": {"tensors": 2, "parameters": 20, "bytes": 80}}
    assert model["config_dtype"] == "float32"
    assert main(["scan", str(tmp_path / "clean")]) == 0
    out = capsys.readouterr().out
    assert "fp32" in out and "passed" in out


def test_bart_with_fp16_decoder_is_mixed_and_unexpected(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "bart", _bart_like(), config={"torch_dtype": "float32"})
    code, report = _json_scan(capsys, str(tmp_path))
    assert code == 1
    assert _codes(report) == ["CG101", "CG102", "CG104"]
    cg101 = next(f for f in report["findings"] if f["code"] == "CG101")
    assert cg101["path"] == "bart/model.safetensors" or cg101["path"].endswith("bart/model.safetensors")
    assert cg101["tensor"].startswith("model.decoder")
    for finding in report["findings"]:
        assert set(finding) >= {"code", "severity", "path", "tensor", "message"}


def test_integer_buffers_never_count_as_mixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m", {"w": torch.randn(2, 2), "position_ids": torch.arange(4)})
    code, report = _json_scan(capsys, str(tmp_path), "--target", "torch")
    assert code == 0 and report["findings"] == []


def test_bf16_weights_with_a_float32_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tensors = {"layers.0.mlp.weight": torch.randn(4, 4).bfloat16(),
               "layers.0.input_layernorm.weight": torch.ones(4)}
    _model(tmp_path / "m", tensors, config={"torch_dtype": "float32", "text_config": {"dtype": "bfloat16"}})
    code, report = _json_scan(capsys, str(tmp_path))
    assert code == 1 and _codes(report) == ["CG101", "CG103"]
    cg103 = next(f for f in report["findings"] if f["code"] == "CG103")
    assert cg103["path"].endswith("config.json") and cg103["line"] == 2
    # --expect bf16: the fp32 norm is allowed by the default keep-fp32 patterns.
    code, report = _json_scan(capsys, str(tmp_path), "--expect", "bf16")
    assert code == 0 and _codes(report) == ["CG103"]
    code, report = _json_scan(capsys, str(tmp_path), "--expect", "config")
    assert _codes(report) == ["CG101", "CG103"]


def test_low_precision_norms_and_uniform(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m", {"h.0.ln_1.weight": torch.ones(4).half(), "h.0.mlp.weight": torch.ones(4, 4).half()})
    code, report = _json_scan(capsys, str(tmp_path), "--expect", "uniform")
    assert code == 0 and _codes(report) == ["CG104"]
    assert main(["scan", str(tmp_path), "--expect", "uniform", "--fail-on", "note"]) == 1


def test_float64_and_target_support(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m", {"w": torch.randn(2, 2, dtype=torch.float64), "steps": torch.arange(3),
                            "position_ids": torch.arange(3)})
    code, report = _json_scan(capsys, str(tmp_path), "--target", "flax", "--target", "numpy")
    assert _codes(report) == ["CG101", "CG105", "CG106"]
    messages = [f["message"] for f in report["findings"] if f["code"] == "CG106"]
    assert any("I64" in m or "int32" in m for m in messages) and any("fp64" in m for m in messages)
    _model(tmp_path / "b", {"w": torch.randn(2, 2).bfloat16()})
    code, report = _json_scan(capsys, str(tmp_path / "b"), "--target", "numpy", "--expect", "bf16")
    assert _codes(report) == ["CG106"] and "ml_dtypes" in report["findings"][0]["message"]


def test_quantized_fp8_with_scales_is_not_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "q", {
        "layers.0.w.weight": torch.randn(4, 4).to(torch.float8_e4m3fn),
        "layers.0.w.weight_scale_inv": torch.ones(1),
        "embed.weight": torch.randn(4, 4),
    })
    code, report = _json_scan(capsys, str(tmp_path))
    assert code == 0, report["findings"]
    assert report["models"][0]["quantization"]["method"] == "fp8"  # its weight_scale_inv names the method


def _sharded(tmp_path: Path) -> Path:
    d = tmp_path / "sharded"
    d.mkdir()
    save_file({"a": torch.ones(2)}, d / "model-00001-of-00002.safetensors")
    save_file({"b": torch.ones(2), "stray": torch.ones(1)}, d / "model-00002-of-00002.safetensors")
    index = {"metadata": {"total_size": 20},
             "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                            "c": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return d


def test_shard_index_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _sharded(tmp_path)
    code, report = _json_scan(capsys, str(d))
    cg004 = [f for f in report["findings"] if f["code"] == "CG004"]
    assert code == 1 and len(cg004) == 2
    missing = next(f for f in cg004 if f["tensor"] == "c")
    assert missing["path"].endswith("model.safetensors.index.json") and missing["line"] == 8
    assert any(f["tensor"] == "stray" for f in cg004)
    (d / "model-00001-of-00002.safetensors").unlink()
    code, report = _json_scan(capsys, str(d))
    assert any("is missing" in f["message"] for f in report["findings"])


def test_file_argument_scans_its_whole_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _sharded(tmp_path)
    code, report = _json_scan(capsys, str(d / "model-00001-of-00002.safetensors"))
    assert len(report["models"][0]["files"]) == 2 and code == 1


def test_config_files_and_cli_precedence(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _model(tmp_path / "m", {"w": torch.randn(2, 2).bfloat16()})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.ckpt-guard]\nexpect = "bf16"\ntargets = ["torch"]\n')
    code, report = _json_scan(capsys, "m")
    assert code == 0 and report["policy"]["expect"] == "bf16"
    code, report = _json_scan(capsys, "m", "--expect", "fp32")
    assert code == 1 and _codes(report) == ["CG101"]
    (tmp_path / ".ckpt-guard.toml").write_text('expect = "fp32"\nignore = ["CG1"]\nextend-select = ["CG101"]\n')
    code, report = _json_scan(capsys, "m")  # longest prefix wins: CG101 selected over CG1 ignored
    assert _codes(report) == ["CG101"]
    (tmp_path / ".ckpt-guard.toml").write_text('expect = "fp32"\n[per-file-ignores]\n"m/*" = ["CG101"]\n')
    code, report = _json_scan(capsys, "m")
    assert code == 0 and report["findings"] == []


@pytest.mark.parametrize(
    ("content", "message"),
    [('expect = "fp12"', "expect"), ('colour = "red"', "unknown key"), ("expect = [", "invalid TOML"),
     ('select = ["XX9"]', "matches no rule")],
)
def test_bad_config_is_exit_2_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, content: str, message: str) -> None:
    _model(tmp_path / "m", {"w": torch.randn(2, 2)})
    (tmp_path / ".ckpt-guard.toml").write_text(content + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["scan", "m"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_paths_that_cannot_be_scanned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main(["scan", str(tmp_path / "empty")]) == 0
    assert "no checkpoint files found" in capsys.readouterr().out
    assert main(["scan", "--fail-on", "sometimes", str(tmp_path)]) == 2


def test_unreadable_file_is_cg001(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = _model(tmp_path / "m", {"w": torch.randn(2, 2)})
    real_open = os.open

    def deny(path: str, *args: object, **kwargs: object) -> int:
        if str(path).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    code, report = _json_scan(capsys, str(d))
    assert code == 1 and _codes(report) == ["CG001"] and "Permission denied" in report["findings"][0]["message"]


def test_output_file_and_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m", _bart_like())
    out = tmp_path / "r.json"
    assert main(["scan", str(tmp_path / "m"), "-f", "json", "-o", str(out)]) == 1
    assert json.loads(out.read_text())["summary"]["failed"] is True
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert main(["rules", "CG102"]) == 0
    text = capsys.readouterr().out
    assert "mixed-float-dtypes" in text and "Fix:" in text and "Example:" in text
    assert main(["rules", "CG999"]) == 2


def test_hostile_names_stay_inert_in_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _model(tmp_path / "m", {"w\n\x1b[31mEVIL": torch.randn(2, 2).half(), "ok": torch.randn(2)})
    main(["scan", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert "\x1b[31m" not in out and "\\n" in out


def test_scan_stays_light() -> None:
    code = (
        "import sys\nfrom guard.cli import main\n"
        "rc = main(['scan', sys.argv[1], '--format', 'json', '-o', sys.argv[2]])\n"
        "heavy = [m for m in ('torch', 'jax', 'flax', 'numpy', 'transformers', 'huggingface_hub') "
        "if m in sys.modules]\nprint(heavy)\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "m"
        _model(d, _bart_like())
        torch.save({"w": torch.ones(2)}, d / "pytorch_model.bin")
        out = subprocess.run([sys.executable, "-c", code, str(d), str(Path(tmp) / "r.json")],
                             capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_guard(tmp_path: Path) -> None:
    _model(tmp_path / "m", {"w": torch.randn(2, 2)})
    proc = subprocess.run([sys.executable, "-m", "guard", "scan", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "passed" in proc.stdout


def test_the_hook_process_ends_with_its_report_and_code(tmp_path: Path) -> None:
    # the plain scan's process tunes its collector and skips teardown; a caller's main([...]) does neither
    import gc

    model = _model(tmp_path / "m", {"w": torch.ones(2, 2, dtype=torch.float16)})
    before = (gc.get_threshold(), gc.get_freeze_count())
    assert main(["scan", "--no-summary", "--expect", "fp32", str(model)]) == 1
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    proc = subprocess.run([sys.executable, "-m", "guard", "scan", "--no-summary", "--expect", "fp32", str(model)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "CG101" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith(
        "ckpt-guard: FAILED")
