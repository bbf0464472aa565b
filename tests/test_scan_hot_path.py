"""What the scan at scale shares with the hook: each shortcut gives what the long way gives.

Shard names classified once per form, the config search's pre-filter, the collector settled per
file in the command line's own process, a safetensors header read with its format's sniff, and
the keep-fp32 globs tested a slice of names at a time.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from guard import config
from guard.inventory import names
from guard.sources import LocalFile

ROOT = Path(__file__).resolve().parents[1]

_PARTS = st.sampled_from(["model", "diffusion_pytorch_model", "pytorch_model", "tf_model", "flax_model",
                          "adapter_model", "consolidated", "x", "a-b", "model.fp16", "fp16", "ema", "00", ""])
_EXTS = st.sampled_from(["safetensors", "bin", "msgpack", "h5", "gguf", "json", "pt", "index.json",
                         "safetensors.index.json"])
_NUMBERS = st.sampled_from(["00001", "00002", "00000", "04000", "99999", "0001", "000001", "1"])


@settings(max_examples=600, deadline=None)
@given(_PARTS, _NUMBERS, _NUMBERS, _EXTS, st.sampled_from(["", ".fp16", ".bf16", "-of-3"]), st.booleans())
def test_a_shard_is_classified_as_its_first_shard_is(stem: str, k: str, n: str, ext: str, tail: str,
                                                     weights: bool) -> None:
    """A shard's role is looked up once per form of its name; it must be what classifying the name itself gives."""
    name = f"{stem}-{k}-of-{n}{tail}.{ext}"
    names._classify_name.cache_clear()
    assert names.classify(name, weights=weights) == names._classify.__wrapped__(name, weights)
    assert names.classify(f"dir/{name}", weights=weights) == names._classify.__wrapped__(name, weights)


@pytest.mark.parametrize("text, has_table", [
    ('[tool.ckpt-guard]\nexpect = "bf16"\n', True),
    ('[tool."ckpt-guard"]\nexpect = "bf16"\n', True),
    ("[tool.'ckpt-guard']\nexpect = 'bf16'\n", True),
    ('[tool]\nckpt-guard = { expect = "bf16" }\n', True),
    ('[tool]\nckpt-guard.expect = "bf16"\n', True),
    ('[tool.ckpt-guard.targets]\n', True),
    ('[project]\nname = "ckpt-guard"\n', False),
    ('[project]\ndependencies = ["ckpt-guard>=0.2", "torch"]\n', False),
    ('[project.optional-dependencies]\ndev = ["ckpt-guard[values]"]\n', False),
    ('[project]\nname = "other"\n', False),
    ('[project.scripts]\nckpt-guard = "guard.cli:main"\n', False),
    ('[project.scripts]\nckpt-guard = "guard.cli:main"\n[tool]\nckpt-guard = { expect = "bf16" }\n', True),
    ('tool = { ckpt-guard = { expect = "bf16" } }\n', True),
    ('tool."ckpt-guard".expect = "bf16"\n', True),
])
def test_the_config_search_parses_only_a_file_that_may_hold_the_table(
        text: str, has_table: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    parsed: list[object] = []
    real = config._load_toml
    monkeypatch.setattr(config, "_load_toml", lambda p: parsed.append(p) or real(p))
    assert config._has_tool_table(str(path)) is has_table
    assert bool(parsed) is has_table  # no parse where the name is only a dependency or the project's own


def test_the_collector_freezes_read_records_and_never_garbage(tmp_path: Path) -> None:
    """In the command line's own process: a file's records leave the collector's reach once read, a cyclic
    reader's garbage is collected first (never frozen), and a library caller's collector is left alone."""
    code = """
import gc, json, weakref
from guard import collector

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

before = gc.get_freeze_count()
collector.settle("torch-zip")  # not owned yet: nothing happens
untouched = gc.get_freeze_count() == before
collector.own_process()
frozen = gc.get_freeze_count()
kept = [Node() for _ in range(100)]  # a file's records
dead = cycle()  # a pickle's cyclic garbage
collector.settle("torch-zip")
after_cyclic = gc.get_freeze_count()
dead_after = dead() is None
dead2 = cycle()
more = [Node() for _ in range(100)]
collector.settle("safetensors")  # an acyclic reader: frozen without a collection
print(json.dumps([untouched, after_cyclic >= frozen + 100, dead_after, gc.get_freeze_count() >= after_cyclic + 100,
                  gc.get_count()[0] < 50]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert json.loads(out.stdout) == [True, True, True, True, True]


def test_a_scan_in_tests_leaves_the_collector_as_it_was(tmp_path: Path) -> None:
    import gc

    from guard.cli import main

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    before = gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()
    assert main(["scan", "--no-summary", str(tmp_path)]) == 0
    assert (gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()) == before


@pytest.mark.parametrize("ahead, size", [(0, 100), (16384, 100), (16384, 40_000), (512, 40_000)])
def test_a_read_ahead_serves_the_same_bytes(ahead: int, size: int, tmp_path: Path) -> None:
    data = bytes(range(256)) * (size // 256 + 1)
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[:size])
    with LocalFile(path, read_ahead=ahead) as source:
        assert source.read_at(0, 16) == data[:16]
        assert source.read_at(8, 60) == data[8:68]
        assert source.read_at(size - 10, 10) == data[size - 10:size]
        reads = source.reads
    expected = 1 if (ahead >= size or size - 10 < min(ahead, size)) else 2 if ahead >= 68 else 3
    assert reads == expected
    with LocalFile(path, read_ahead=ahead) as source:
        with pytest.raises(Exception, match="runs past the end"):
            source.read_at(size - 4, 8)


def test_keep_fp32_globs_match_a_slice_at_a_time() -> None:
    """``match_flags`` lowers a slice of names at a time: the same answers as the glob matcher, name by name."""
    tensors = [f"model.layers.{i}.{part}" for i in range(3000) for part in
               ("input_layernorm.weight", "self_attn.q_proj.weight", "LayerNorm.bias", "ln_1.weight", "LN_F.weight")]
    patterns = config.NORM_PATTERNS
    assert config.match_flags(patterns, tensors) == [config.fp32_keeper(patterns)(name) for name in tensors]
    assert sum(config.match_flags(patterns, tensors)) == 4 * 3000
