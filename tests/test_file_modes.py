"""Files written for the user follow the umask, as a plain ``open(path, "w")`` would: reports (``-o``),
patches, converted models and the files carried with them, and the files a fix adds.

The atomic writers stage under a temporary name (0600 by ``mkstemp``); the user must not get that mode.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from guard.cli import main  # noqa: E402

UMASKS = (0o022, 0o077, 0o002)


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _weights(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    state = {"layers.0.mlp.down_proj.weight": torch.randn(8, 8, generator=torch.Generator().manual_seed(0))}
    safetensors_torch.save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("fmt", ["json", "sarif", "text"])
def test_a_report_written_with_o_follows_the_umask(tmp_path: Path, umask: int, fmt: str) -> None:
    target = tmp_path / f"report.{fmt}"
    assert main(["scan", str(_weights(tmp_path / "m")), "-f", fmt, "-o", str(target)]) == 0
    assert mode(target) == 0o666 & ~umask


def test_a_report_written_again_keeps_the_mode_its_owner_gave_it(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "report.json"
    target.write_text("{}")
    target.chmod(0o640)
    assert main(["scan", str(_weights(tmp_path / "m")), "-f", "json", "-o", str(target)]) == 0
    assert mode(target) == 0o640 and json.loads(target.read_text())["models"]


def test_a_converted_model_and_the_files_it_carries_follow_the_umask(tmp_path: Path, umask: int) -> None:
    pytest.importorskip("flax")
    from transformers import BertConfig, BertModel

    source = tmp_path / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=32)).save_pretrained(source)
    (source / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (source / "vocab.txt").chmod(0o600)  # a copy is a new file of the user's: the umask, not the source's mode
    out = tmp_path / "flax"
    assert main(["convert", str(source), "--to", "flax", "--out", str(out)]) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"flax_model.msgpack", "config.json", "vocab.txt"}
    assert {p.name: mode(p) for p in files} == {p.name: 0o666 & ~umask for p in files}
    assert mode(out) == 0o777 & ~umask


def test_a_file_a_fix_adds_follows_the_umask(tmp_path: Path, umask: int) -> None:
    from transformers import BertConfig, BertModel

    from guard.samples import save_torch_bin

    model = tmp_path / "bert"
    torch.manual_seed(0)
    save_torch_bin(BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=32)), model)
    assert main(["fix", "--write", str(model)]) == 0
    assert mode(model / "model.safetensors") == 0o666 & ~umask


def test_a_patch_follows_the_umask(tmp_path: Path, umask: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).to(torch.bfloat16)
    model.save_pretrained("m")
    model.config.dtype = torch.float32
    model.config.save_pretrained("m")
    assert main(["fix", "m", "--expect", "bf16", "--patch", "fix.patch"]) == 1
    assert mode(tmp_path / "fix.patch") == 0o666 & ~umask
