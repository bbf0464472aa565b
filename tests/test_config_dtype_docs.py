"""CG103's documentation says what the rule does: an error when config.json is narrower than the weights,
a warning when it is wider (the catalogue, `ckpt-guard rules CG103` and the README say the same)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402
from scanning import json_scan  # noqa: E402

from guard.catalogue import RULES_BY_CODE  # noqa: E402
from guard.cli import main  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"


def model(root: Path, *, config_dtype: str, weights: torch.dtype) -> Path:
    root.mkdir()
    save_file({"w": torch.ones(4, 4, dtype=weights)}, root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": config_dtype}))
    return root


@pytest.mark.parametrize(("config_dtype", "weights", "severity", "exit_code"), [
    ("bfloat16", torch.float32, "error", 1),  # transformers 5 loads in bf16: the fp32 weights are rounded
    ("float16", torch.bfloat16, "warning", 0),  # same width, not narrower: loading changes range, not width
    ("float32", torch.bfloat16, "warning", 0),  # loading widens, exactly
])
def test_severity_is_what_the_docs_say(tmp_path: Path, capsys: pytest.CaptureFixture[str], config_dtype: str,
                                       weights: torch.dtype, severity: str, exit_code: int) -> None:
    code, report = json_scan(capsys, str(model(tmp_path / "m", config_dtype=config_dtype, weights=weights)),
                             "--expect", "uniform")
    [finding] = [f for f in report["findings"] if f["code"] == "CG103"]
    assert finding["severity"] == severity and code == exit_code


def test_rules_cg103_names_both_severities(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "CG103"]) == 0
    text = capsys.readouterr().out
    assert "default severity: warning" in text
    assert "An error when the config names a narrower float dtype than the weights hold" in text
    assert "a warning when it is wider" in text
    assert RULES_BY_CODE["CG103"].summary in README.read_text()
