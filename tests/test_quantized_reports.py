"""The markdown and text reports count a quantized set's parameters logically: the packed payloads as their
logical weights ("nf4 (packed)"), the components (absmax, quant maps, scales, zeros, g_idx, ...) as none,
so the shares and the mermaid pie sum to the set's ``parameters``: the unquantized model's
``num_parameters()``.  On checkpoints written by bitsandbytes itself and by the GPTQ spec writer."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_spec_writers as qs  # noqa: E402
import quant_writers as qw  # noqa: E402

from guard.cli import main  # noqa: E402
from guard.dtypes import display_name  # noqa: E402
from guard.report import Report  # noqa: E402
from guard.reporters import render  # noqa: E402

pytestmark = pytest.mark.slow

# id -> (writer, options, the unquantized tensors' dtype label, the packed label)
CASES: dict[str, tuple[Callable[..., Path], dict[str, Any], str, str]] = {
    "bnb-nf4-double-quant": (qw.write_bnb_4bit, {"double_quant": True}, "bf16", "nf4 (packed)"),
    "gptq": (qs.write_gptq, {}, "fp16", "gptq (packed)"),
}


def _pie(markdown: str) -> dict[str, int]:
    block = markdown.split("```mermaid\npie showData\n", 1)[1].split("```", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r'^\s+"([^"]+)" : (\d+)$', block, re.M)}


def _shares(markdown: str) -> dict[str, float]:
    table = markdown.split("### Models", 1)[1].split("###", 1)[0]
    [row] = [line for line in table.splitlines() if line.startswith("| ") and "model.safetensors" in line]
    cell = row.split(" | ")[5]
    return {label: float(share) for label, share in re.findall(r"(.+?) ([\d.]+)%(?: · |$)", cell)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_markdown_counts_logical_parameters(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer, options, unquantized, packed = CASES[case]
    folder = writer(tmp_path / case, **options)
    # what the writer's libraries print is not the report (DeepSpeed, imported by transformers' quantizer
    # integration when it is installed, prints "Setting accelerator to CPU" to stdout the first time only)
    capsys.readouterr()
    expected = qw.tiny_llama().num_parameters()
    assert main(["scan", str(folder), "--expect", "config", "--format", "json", "-o", str(tmp_path / "r.json")]) == 0
    saved = json.loads((tmp_path / "r.json").read_text())
    [model] = saved["models"]
    assert model["parameters"] == expected
    [ws] = model["sets"]
    by_label = {display_name(code): n for code, n in ws["parameters_by_label"].items()}  # BF16 -> bf16
    assert set(by_label) == {unquantized, packed}
    assert sum(by_label.values()) == expected

    main(["scan", str(folder), "--expect", "config", "--format", "markdown"])
    markdown = capsys.readouterr().out
    pie = _pie(markdown)
    assert set(pie) == {unquantized, packed}  # no U8 / F32 / I32 slice: components are no parameters
    assert sum(pie.values()) == expected
    assert pie == by_label
    shares = _shares(markdown)
    assert set(shares) == {unquantized, packed}
    assert sum(shares.values()) == pytest.approx(100, abs=0.11)
    assert shares[packed] == pytest.approx(100 * pie[packed] / expected, abs=0.051)
    # the same markdown from the saved JSON (`ckpt-guard report`)
    assert render(Report.from_json(saved), "markdown") == markdown

    main(["scan", str(folder), "--expect", "config"])
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.lstrip().startswith("set "))
    assert packed in header and unquantized in header and "fp32" not in header and "U8" not in header
