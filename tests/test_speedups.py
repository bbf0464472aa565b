"""Both choices of guard._speedups give the same results: CPython's private C function and the pure-Python
fallback (``CKPT_GUARD_PURE_PYTHON=1``), for records, the JSON loader and whole scans.

Runs on every Python the package claims (Makefile: PYTHONS_TESTS); no torch, no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guard import _speedups

ROOT = Path(__file__).resolve().parents[1]

# what each choice prints: records' behaviour, the JSON loader's values and errors, safetensors headers read
_PROBE = r'''
import json, pickle, sys
from guard import _speedups, jsonload
from guard.findings import Finding
from guard.readers.safetensors import read_safetensors
from guard.records import Record
from guard.sources import BytesSource

class Point(Record):
    x: int
    y: int = 2
    label: str = "p"

def outcome(call, *args):
    try:
        return ["value", repr(call(*args))]
    except RecursionError:
        return ["RecursionError"]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

point = Point(1, label="q")
texts = ['{"a": 1, "b": [1, 2.5, -0, 1e400, null, true, false, "x\\u00e9\\ud800"]}', "  []  ", "NaN", "",
         '{"a": 1} x', "[1,]", "\ufeff{}", '{"a": "\x01"}', "01", "[" * 50_000, '{"a": 1, "a": 2}']
headers = [b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
           b'{"__metadata__":{"a":"b","a":"c"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
           b'{"__metadata__":{"n":[[[[1]]]]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
           b'{"w": {"data_offsets": [0, 8], "dtype": "F32", "shape": [2]}}',
           b'{"w":{"dtype":"X9","shape":[2],"data_offsets":[0,8]}}',
           b'{"__metadata__":{"format":"pt"' + b'}' * 3]
scans = []
for header in headers:
    data = len(header).to_bytes(8, "little") + header + bytes(8)
    scans.append(outcome(lambda: read_safetensors(BytesSource(data, name="m.safetensors"))))
print(json.dumps({
    "pure": _speedups.PURE_PYTHON,
    "record": [repr(point), point.x, point.y, point.label, repr(point._replace(y=5)), point._asdict(),
               pickle.loads(pickle.dumps(point)) == point, point == (1, 2, "q"), Point._fields,
               outcome(Point), outcome(Point, 1, 2, 3, 4), outcome(lambda: Point(1, z=1)), Point.x.__doc__,
               repr(Finding("CG101", "error", "a", "m"))],
    "loads": [outcome(jsonload.loads, text) for text in texts],
    "quoted": [jsonload.quoted(text) for text in ("torch_dtype", "caf\u00e9", 'a"b\\c', "\x00\n", "\U0001f600")],
    "decoder": outcome(jsonload.decoder(object_pairs_hook=lambda pairs: sorted(pairs)), 'x {"b": 1, "a": 2}', 2),
    "scans": scans,
}))
'''


def _probe(*, pure: bool) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CKPT_GUARD_PURE_PYTHON", None)
    if pure:
        env["CKPT_GUARD_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env, cwd=ROOT)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_fallbacks_give_what_the_c_functions_give() -> None:
    private, pure = _probe(pure=False), _probe(pure=True)
    assert private.pop("pure") is False and pure.pop("pure") is True
    assert private == pure


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's private modules")
def test_cpython_takes_its_c_functions() -> None:
    import _collections

    assert not _speedups.PURE_PYTHON
    assert _speedups.tuple_field is _collections._tuplegetter  # type: ignore[attr-defined]  # private, no stub


def test_a_scan_reports_the_same_bytes_either_way(tmp_path: Path) -> None:
    """The fuzz corpus's safetensors files and the test data, scanned to JSON by each choice: byte for byte."""
    targets = sorted(str(path) for path in (ROOT / "fuzz" / "corpus").rglob("*.safetensors"))[:40]
    assert targets
    reports = []
    for pure in (False, True):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("CKPT_GUARD_PURE_PYTHON", None)
        if pure:
            env["CKPT_GUARD_PURE_PYTHON"] = "1"
        out = tmp_path / f"report-{pure}.json"
        done = subprocess.run([sys.executable, "-m", "guard", "scan", "--format", "json", "-o", str(out), *targets],
                              capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode in (0, 1, 2), done.stderr
        reports.append((done.returncode, out.read_bytes()))
    assert reports[0] == reports[1]
