"""Everywhere the same: `hub scan` builds the same sets from the listing as a local scan from disk;
the JSON report carries them (version 2) and `report` still reads version 1."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("diffusers")

import layouts  # noqa: E402
from hub_standin import StandinHub, standin_fixture  # noqa: E402
from test_hub_scan import finding_keys, local_and_remote  # noqa: E402

from guard.cli import main  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandinHub]:
    yield from standin_fixture(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-sd") / "sd"
    layouts.diffusers_pipeline(root, max_shard_size="60KB")
    (root / "text_encoder" / "model.fp16.safetensors").unlink()  # CG109 across components
    return root


@pytest.fixture(scope="module")
def multi_format(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-bart") / "bart"
    layouts.bart_like_copies(root)  # CG107
    return root


def _sets(report: dict) -> set[tuple[str, str, str | None, bool]]:
    out = set()
    for m in report["models"]:
        rel = m["path"].split("/", 2)[-1] if m["path"].startswith("org/") else m["path"]
        for s in m["sets"]:
            out.add((rel.rsplit("/", 1)[-1], s["name"], s["variant"], s["primary"]))
    return out


@pytest.mark.parametrize("layout", ["pipeline", "multi_format"])
def test_remote_sets_and_findings_equal_the_local_ones(standin: StandinHub, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch, request, layout) -> None:
    source: Path = request.getfixturevalue(layout)
    local_copy = tmp_path / "repo"
    shutil.copytree(source, local_copy)
    rc_local, local, rc_remote, remote = local_and_remote(standin, local_copy, "org/repo", monkeypatch)
    assert rc_local == rc_remote == 1
    assert finding_keys(remote, "org/repo") == finding_keys(local, "repo")
    assert _sets(remote) == _sets(local)
    expected = "CG109" if layout == "pipeline" else "CG107"
    assert expected in {f["code"] for f in remote["findings"]}


def test_report_reads_version_1_and_version_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    layouts_v1 = {
        "version": 1, "tool": {"name": "ckpt-guard", "version": "0.1.0"}, "policy": {"fail_on": "error"},
        "summary": {}, "extra": {},
        "models": [{"path": "m", "files": [{"path": "m/model.safetensors", "format": "safetensors", "size": 10,
                                            "tensors": 1}],
                    "dtypes": {"F16": {"tensors": 1, "parameters": 4, "bytes": 8}}, "parameters": 4, "bytes": 8,
                    "config_dtype": None, "quantization": None}],
        "findings": [{"code": "CG101", "severity": "error", "path": "m/model.safetensors", "tensor": "w",
                      "message": "1 floating tensor(s) are fp16", "line": None}],
    }
    (tmp_path / "v1.json").write_text(json.dumps(layouts_v1))
    assert main(["report", str(tmp_path / "v1.json"), "--format", "markdown"]) == 1
    out = capsys.readouterr().out
    assert "| m | m | weights |" in out and "CG101" in out
    assert main(["report", str(tmp_path / "v1.json"), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["version"] == 2


@pytest.mark.parametrize("code", ["CG006", "CG107", "CG108", "CG109"])
def test_rules_explain_the_new_codes(capsys: pytest.CaptureFixture[str], code: str) -> None:
    assert main(["rules", code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(code) and "Example:" in out and "Fix:" in out
