"""CG106 is about what `convert` would meet: export formats it never reads get no conversion-target warnings,
and a quantized set's components (whose dtypes a conversion dequantizes away) never count toward them.

The IR is written by ``openvino.convert_model`` + ``save_model`` (``ir_package_writers``), the quantized
set by hqq through transformers (``quant_writers``).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from scanning import codes, json_scan  # noqa: E402


def test_an_openvino_ir_gets_no_flax_target_warning(tmp_path_factory: pytest.TempPathFactory,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    from ir_package_writers import built

    out, _ = built("openvino", tmp_path_factory)
    folder = tmp_path_factory.mktemp("ir") / "m"
    folder.mkdir()
    for suffix in (".xml", ".bin"):
        shutil.copy(out / ("loop" + suffix), folder / ("loop" + suffix))  # a Loop's I64 trip count and bounds
    rc, report = json_scan(capsys, "--expect", "uniform", "--target", "flax", "--target", "numpy", str(folder))
    assert "CG106" not in codes(report), report["findings"]
    assert "I64" in report["models"][0]["dtypes"]  # the shape constants JAX would narrow, were it converted


def test_hqq_metadata_tensors_get_no_jax_int64_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import quant_writers as qw

    folder = qw.write_hqq(tmp_path / "m")  # HQQ's P.shape is I64: a component, dequantized away
    rc, report = json_scan(capsys, "--expect", "config", "--target", "flax", str(folder))
    assert "CG106" not in codes(report), report["findings"]
