"""guard.jsonload, the one JSON reader: json's values, and for any other bytes one ValueError of one line naming the
file, never a traceback; through the scan and the pre-commit hook's line as well, on every Python the package
claims (Makefile: PYTHONS_TESTS; no torch).

Issue 46: a trailing comma in config.json crashed `scan` and the hook with ``SystemError: <_json.Scanner object>
returned NULL without setting an exception`` on Python 3.10 and 3.11, where the private C scanner was called
without ``json.decoder`` imported.  The properties below are Hypothesis', over hand-broken documents: truncation
at every offset, stray and missing commas, bad escapes and lone surrogates, deep nesting, a BOM, NaN, duplicate
keys, bytes that are not UTF-8.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.numpy import save_file

from guard import jsonload
from guard.cli import main

ROOT = Path(__file__).resolve().parents[1]

# --- the documents: valid ones json.dumps writes, then broken by hand ----------------------------------------------

_KEYS = st.sampled_from(["architectures", "torch_dtype", "vocab_size", "eos_token_id", "weight_map", "a", "caf\u00e9",
                         "model_type", "hidden_size"])
_SCALARS = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
            | st.text(max_size=12))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
                       max_leaves=12)
_DOCUMENTS = st.builds(lambda value, indent, ascii_only: json.dumps(value, indent=indent, ensure_ascii=ascii_only),
                       st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=5), st.sampled_from([None, 2]),
                       st.booleans())


@st.composite
def broken(draw: st.DrawFn) -> bytes:
    """A document broken one of the ways a hand, an editor or a cut download breaks it."""
    text = draw(_DOCUMENTS)
    at = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["truncate", "stray comma", "missing comma", "bad escape", "lone surrogate", "deep",
                                "bom", "nan", "duplicate key", "not utf-8", "byte", "splice"]))
    if how == "truncate":
        text = text[:at]
    elif how == "stray comma":
        closer = [i for i, c in enumerate(text) if c in "]}"]
        at = draw(st.sampled_from(closer)) if closer and draw(st.booleans()) else at
        text = text[:at] + "," + text[at:]
    elif how == "missing comma":
        commas = [i for i, c in enumerate(text) if c == ","]
        if commas:
            at = draw(st.sampled_from(commas))
            text = text[:at] + text[at + 1:]
    elif how == "bad escape":
        text = text[:at] + draw(st.sampled_from(["\\x", "\\u12", "\\uZZZZ", "\\", '"\\q"', "\\\n"])) + text[at:]
    elif how == "lone surrogate":
        text = text[:-1] + ', "s": "' + draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d x", "\\ude00\\ud83d"])) \
            + '"}' if text.endswith("}") else text + '"\\ud800"'
    elif how == "deep":
        depth = draw(st.sampled_from([50, 1_000, 5_000, 100_000]))
        text = '{"a": ' + "[" * depth + "1" + "]" * draw(st.sampled_from([depth, depth - 1, 0])) + "}"
    elif how == "bom":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    elif how == "nan":
        text = text[:-1] + ', "n": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf"])) + "}" \
            if text.endswith("}") else text
    elif how == "duplicate key":
        text = text[:-1] + ', "torch_dtype": "float16", "torch_dtype": "bfloat16"}' if text.endswith("}") else text
    elif how == "not utf-8":
        data = text.encode("utf-8")
        return data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xfe\xff"])) \
            + data[at:]
    elif how == "byte":
        text = text[:at] + draw(st.sampled_from(["\x00", "\x01", "\x1f", "\t", "'", "}", "]", "{", '"', "\\"])) \
            + text[at:]
    else:  # a piece of the document pasted again somewhere else
        end = draw(st.integers(at, len(text)))
        where = draw(st.integers(0, len(text)))
        text = text[:where] + text[at:end] + text[where:]
    return text.encode("utf-8", "surrogatepass")


def _is_json(data: bytes) -> object:
    """json's own verdict on a file's bytes, read as the loaders read them (UTF-8 text): (True, value) or (False,)."""
    try:
        text = data.decode("utf-8")
        value = json.loads(text)
        text.encode("utf-8")
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # no lone surrogate anywhere in it
    except (ValueError, RecursionError, UnicodeEncodeError):
        return (False,)
    return (True, repr(value))  # repr: NaN is unequal to itself


# --- the reader itself -----------------------------------------------------------------------------------------------

def _check_reader(data: bytes) -> None:
    verdict = _is_json(data)
    try:
        value = jsonload.parse(data, "dir/config.json")
    except jsonload.JSONError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("dir/config.json: not valid JSON: "), message
        assert isinstance(exc, ValueError) and isinstance(exc, json.JSONDecodeError)
        assert jsonload.describe(exc) and "\n" not in jsonload.describe(exc)
        assert verdict == (False,), (data[:200], message)
        return
    assert verdict == (True, repr(value)), data[:200]


@settings(max_examples=400, deadline=None)
@given(broken())
def test_the_reader_gives_a_value_or_one_line_naming_the_file(data: bytes) -> None:
    _check_reader(data)


@settings(max_examples=60, deadline=None)
@given(_DOCUMENTS)
def test_a_document_cut_at_every_offset_is_refused_or_read(text: str) -> None:
    data = text.encode("utf-8")
    for at in range(len(data) + 1):
        _check_reader(data[:at])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_at_all(data: bytes) -> None:
    _check_reader(data)
    try:  # loads on bytes (json detects UTF-16 and -32 itself): a value, or the one error
        jsonload.loads(data)
    except jsonload.JSONError as exc:
        assert "\n" not in str(exc)


TEXTS = [
    '{"a": 1, "b": [1, 2.5, -0, 1e400, null, true, false, "x\\u00e9\\ud83d\\ude00"]}', "  \t\n[]\r\n ", '"s"', "0",
    "-1.5e3", "NaN", "[Infinity, -Infinity, NaN]", '{"a": 1, "a": 2}', '{"__metadata__":{"format":"pt"}}',
]
REFUSED = ["", "   ", "{", '{"a": 1} x', '{"a": 1}}', "[1,]", '{"a": 1,}', '{"a": 1 "b": 2}', '{"a": [1, 2',
           "\ufeff{}", '{"a": "\x01"}', "nan", "01", "[" * 100_000, '{"a": 1} \x0b', "\u00a0{}",
           "[" + "1" * 5_000 + "]"]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_is_json_loads(text: str) -> None:
    assert repr(jsonload.loads(text)) == repr(json.loads(text))
    assert repr(jsonload.parse(text.encode(), "f.json")) == repr(json.loads(text))


@pytest.mark.parametrize("text", REFUSED)
def test_what_is_refused_is_one_error_of_one_line(text: str) -> None:
    with pytest.raises(jsonload.JSONError) as caught:
        jsonload.loads(text)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("not valid JSON: ")
    with pytest.raises(jsonload.JSONError, match=r"^f\.json: not valid JSON: [^\n]+$"):
        jsonload.parse(text.encode("utf-8"), "f.json")


@pytest.mark.parametrize("text", ['"\\ud800"', '{"\\udc00": 1}', '["\\ud83d x"]', '{"a": ["\\ude00\\ud83d"]}'])
def test_a_file_with_a_lone_surrogate_is_refused_naming_it(text: str) -> None:
    """json reads it into a str no UTF-8 output can write (the text report crashed on it): a file's reader refuses
    it; a pair is one character and is read."""
    assert jsonload.loads(text) == json.loads(text)
    with pytest.raises(jsonload.JSONError, match=r"^f\.json: not valid JSON: a lone surrogate escape \(\\ud"):
        jsonload.parse(text, "f.json")
    assert jsonload.parse('["\\ud83d\\ude00"]', "f.json") == ["\U0001f600"]


def test_read_names_the_file_it_could_not_read(tmp_path: Path) -> None:
    with pytest.raises(jsonload.JSONError, match=r"^.*missing\.json: could not be read \("):
        jsonload.read(tmp_path / "missing.json")
    (tmp_path / "big.json").write_bytes(b"[" + b"0," * 100 + b"0]")
    with pytest.raises(jsonload.JSONError, match=r"big\.json: larger than 100 bytes"):
        jsonload.read(tmp_path / "big.json", limit=100)
    (tmp_path / "ok.json").write_text('{"a": [1]}')
    assert jsonload.read(tmp_path / "ok.json") == {"a": [1]}


@pytest.mark.parametrize("text", ["torch_dtype", "caf\u00e9", 'a"b\\c', "\x00\n", "\U0001f600", ""])
def test_quoted_is_json_dumps_of_a_string(text: str) -> None:
    assert jsonload.quoted(text) == json.dumps(text)


def test_the_decoder_takes_the_settings_and_refuses_with_a_value_error() -> None:
    seen: list[list[tuple[str, object]]] = []
    decode = jsonload.decoder(object_pairs_hook=lambda pairs: seen.append(pairs) or dict(pairs))
    assert decode('x {"a": {"b": 1}, "c": 2}', 2) == ({"a": {"b": 1}, "c": 2}, 25)
    assert seen == [[("b", 1)], [("a", {"b": 1}), ("c", 2)]]
    for text in ("x ", 'x {"a": 1,}', 'x {"a": 1 "b": 2}'):
        with pytest.raises(ValueError):
            decode(text, 2)


# --- through the scan and the hook's line ----------------------------------------------------------------------------

_WEIGHTS = {"model.embed_tokens.weight": np.zeros((8, 4), np.float32)}


def _scan(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:  # click's own exits (usage): a code, never a traceback
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def model_folder() -> Iterator[Path]:
    """A model folder written by the libraries (safetensors' save_file, a sharded one's index as transformers
    writes it); each example puts its broken file into a copy."""
    folder = Path(tempfile.mkdtemp(prefix="cg-jsonload-"))
    save_file(_WEIGHTS, str(folder / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 128},
         "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}, indent=2, sort_keys=True)
        + "\n")
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "torch_dtype": "float32", "vocab_size": 8}, indent=2))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=broken(), which=st.sampled_from(["config.json", "model.safetensors.index.json", "generation_config.json",
                                            "tokenizer_config.json"]),
       fmt=st.sampled_from(["text", "json", "github", "sarif"]), as_hook=st.booleans())
def test_the_scan_and_the_hook_give_a_finding_naming_the_file_never_a_traceback(
        model_folder: Path, data: bytes, which: str, fmt: str, as_hook: bool) -> None:
    folder = Path(tempfile.mkdtemp(prefix="cg-broken-"))
    try:
        for item in model_folder.iterdir():
            shutil.copy(item, folder / item.name)
        (folder / which).write_bytes(data)
        files = sorted(str(p) for p in folder.iterdir())
        # the hook: `ckpt-guard scan --format text --no-summary FILES...` (.pre-commit-hooks.yaml); or the folder
        rc, output = _scan(["scan", "--format", fmt, "--no-summary", *(files if as_hook else [str(folder)])])
        assert rc in (0, 1, 2), output
        assert "Traceback" not in output and "SystemError" not in output, output
        if _is_json(data) == (False,):  # every one of them is read (CG128 reads the generation and tokenizer configs)
            assert rc == 1 and "CG001" in output and which in output, output
            if fmt == "json":
                assert any(f["code"] == "CG001" and f["path"].endswith("/" + which)
                           for f in json.loads(output)["findings"]), output
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("text", ['{"architectures": ["LlamaForCausalLM"],}', '{"a": 1 "b": 2}', '{"a": [1, 2',
                                  '{"torch_dtype": "\\ud800"}', "\ufeff{}", '{"a": "\\x"}'])
def test_a_fresh_process_reports_a_broken_config_as_cg001(tmp_path: Path, text: str) -> None:
    """The hook's own process, json not imported before the scan (``-S``, the tree on the path): the case where
    the private scanner raised SystemError on 3.10 and 3.11."""
    save_file(_WEIGHTS, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    code = "import sys\nfrom guard.cli import main\nraise SystemExit(main(sys.argv[1:]))"
    out = subprocess.run([sys.executable, "-S", "-c", code, "scan", "--format", "text", "--no-summary",
                          "model.safetensors", "config.json"], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "SystemError" not in out.stderr, out.stderr
    lines = [line for line in out.stdout.splitlines() if "CG001" in line]
    assert len(lines) == 1 and lines[0].startswith("config.json: CG001 [error] not valid JSON: "), out.stdout
