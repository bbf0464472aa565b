"""Never silent: a weight file with no tensors is a finding, and the text report never points at none.

Written with the real tools: llama.cpp's vocab-only GGUF by gguf's GGUFWriter (tensor_count
0), ``torch.save({})``, an ONNX graph of operators only (onnx.helper), a Trainer-style
``training_args.bin`` beside real weights.  A header that declares tensors none of which
were read is CG001 (the rule, on a FileScan as a failing reader would return it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fuzz_formats_a import write_gguf
from scanning import json_scan

from guard.cli import main
from guard.inventory import WeightSet
from guard.rules.no_tensors import no_tensor_findings
from guard.tensors import FileScan

np = pytest.importorskip("numpy")


def vocab_only(folder: Path) -> Path:
    """ggml-vocab-llama.gguf as llama.cpp ships it: a tokenizer, no tensors."""
    def build(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(["<s>", "</s>", "a", "b"])
        w.add_token_scores([0.0] * 4)

    folder.mkdir(parents=True, exist_ok=True)
    return write_gguf(folder / "ggml-vocab-llama.gguf", build)


def _text(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["scan", "--no-summary", *args])
    return code, capsys.readouterr().out


def test_vocab_only_gguf_is_a_note_not_silence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gguf import GGUFReader

    path = vocab_only(tmp_path / "vocab")
    assert len(GGUFReader(path).tensors) == 0 and GGUFReader(path).fields["tokenizer.ggml.tokens"]
    rc, report = json_scan(capsys, str(path.parent))
    assert rc == 0 and [(f["code"], f["severity"]) for f in report["findings"]] == [("CG007", "note")]
    assert "tensor_count 0" in report["findings"][0]["message"]
    rc, text = _text(capsys, str(path.parent))
    assert rc == 0 and "no tensors read (see the findings below)" in text
    assert "CG007 [note]" in text.split("see the findings below", 1)[1]


@pytest.mark.parametrize("kind", ["empty-state-dict", "onnx-without-weights"])
def test_a_weight_file_without_tensors_is_a_note(kind: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "empty-state-dict":
        torch = pytest.importorskip("torch")
        torch.save({}, folder / "pytorch_model.bin")
    else:
        onnx = pytest.importorskip("onnx")
        from onnx import TensorProto, helper

        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y")]
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", io[:1], io[1:])
        onnx.save(helper.make_model(graph), str(folder / "model.onnx"))
    rc, report = json_scan(capsys, str(folder))
    assert rc == 0 and [f["code"] for f in report["findings"]] == ["CG007"]


def test_training_state_without_tensors_is_not_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, tmp_path / "pytorch_model.bin")
    torch.save({"learning_rate": 1e-4, "epochs": 3}, tmp_path / "training_args.bin")
    rc, report = json_scan(capsys, str(tmp_path))
    assert rc == 0 and "CG007" not in {f["code"] for f in report["findings"]}


def test_a_declared_count_with_nothing_read_is_cg001() -> None:
    ws = WeightSet(name="model.gguf", role="weights", layout="file", stem="model", format="gguf", variant=None,
                   sharded=False, files=(), indexes=(), claimed_dtype=None, primary=True, memo={})
    failed = FileScan("m/model.gguf", "gguf", 1000, metadata={"declared_tensors": "291"})
    (finding,) = no_tensor_findings(ws, failed)
    assert finding.code == "CG001" and finding.severity.value == "error" and "declares 291 tensor(s)" in finding.message
    assert no_tensor_findings(ws, failed._replace(findings=(finding,))) == []  # a reader that said so itself


def test_no_tensors_line_never_points_at_missing_findings(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    vocab_only(tmp_path / "vocab")
    rc, text = _text(capsys, str(tmp_path / "vocab"), "--ignore", "CG007")
    assert rc == 0 and "see the findings below" not in text
    assert "no tensors read (its files hold none)" in text
