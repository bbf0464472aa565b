"""guard.jsonload gives what json gives, without importing json: the same values, the same errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from guard import _speedups, jsonload

TEXTS = [
    '{"a": 1, "b": [1, 2.5, -0, 1e400, null, true, false, "x\\u00e9\\ud800"]}', "  \t\n[]\r\n ", '"s"', "0", "-1.5e3",
    "NaN", "[Infinity, -Infinity, NaN]", '{"a": 1, "a": 2}', '{"__metadata__":{"format":"pt"}}',
    # refused: json's own error, worded as json words it
    "", "   ", "{", '{"a": 1} x', '{"a": 1}}', "[1,]", "\ufeff{}", '{"a": "\x01"}', "nan", "01", "[" * 100_000,
    '{"a": 1} \x0b', "\u00a0{}",
]


def _outcome(load: object, text: str) -> object:
    try:
        value = load(text)  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the type and the words are what is compared
        return type(exc), str(exc)
    return "value", repr(value)  # repr: nan compares unequal to itself


@pytest.mark.parametrize("text", TEXTS)
def test_loads_agrees_with_json(text: str) -> None:
    assert _outcome(jsonload.loads, text) == _outcome(json.loads, text)


@pytest.mark.parametrize("text", TEXTS[:4])
def test_loads_with_the_pure_python_scanner_is_json_itself(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonload, "make_scanner", _speedups._py_make_scanner)  # the fallback guard._speedups has
    monkeypatch.setattr(jsonload, "_scan", jsonload.scanner())
    assert _outcome(jsonload.loads, text) == _outcome(json.loads, text)


@pytest.mark.parametrize("text", ["torch_dtype", "caf\u00e9", 'a"b\\c', "\x00\n", "\U0001f600", ""])
def test_quoted_is_json_dumps_of_a_string(text: str) -> None:
    assert jsonload.quoted(text) == json.dumps(text)


def test_scanner_settings_are_the_decoders() -> None:
    seen: list[list[tuple[str, object]]] = []
    scan = jsonload.scanner(object_pairs_hook=lambda pairs: seen.append(pairs) or dict(pairs))
    assert scan is not None
    assert scan('x {"a": {"b": 1}, "c": 2}', 2) == ({"a": {"b": 1}, "c": 2}, 25)
    assert seen == [[("b", 1)], [("a", {"b": 1}), ("c", 2)]]
    with pytest.raises(StopIteration):
        scan("x ", 2)


def test_the_hooks_scan_of_a_pipeline_imports_no_json(tmp_path: Path) -> None:
    """A diffusers-style commit: safetensors headers with metadata, config.json with a dtype (its line is
    found with a JSON-spelled key), model_index.json: read, and nothing writes JSON, so json stays out."""
    folder = tmp_path / "unet"
    folder.mkdir()
    save_file({"conv.weight": np.zeros((4,), np.float32)}, str(folder / "diffusion_pytorch_model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text('{"_class_name": "UNet2DModel", "torch_dtype": "float32"}')
    (tmp_path / "model_index.json").write_text('{"_class_name": "P", "unet": ["diffusers", "UNet2DModel"]}')
    code = ("import sys\nfrom guard.cli import main\n"
            "rc = main(['scan', '--format', 'text', '--no-summary', 'model_index.json', 'unet/config.json',"
            " 'unet/diffusion_pytorch_model.safetensors'])\n"
            "sys.stdout.write('MODULES %d %s' % (rc, sorted(m for m in sys.modules if m.split('.')[0] == 'json')))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert out.stdout.rsplit("MODULES ", 1)[1] == "0 []", out.stdout
