"""scan --values without a cast in play: each read's figures from four reductions on its bits (issue 47).

The fast path (``TensorScanner._update_fast``) must give every figure the chunked path gives: the NaN/Inf
counts, max |x| and the first largest value's sign, the smallest non-zero |x|, the fp16 overflow count.  It
hands a read back to the chunked path where it holds a zero, a NaN or Inf, a value past fp16's range, or the
largest magnitude with both signs; each case is planted in a tensor of several reads, in several dtypes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from guard.config import Policy, Target  # noqa: E402
from guard.inventory import discover_models, load_local_model  # noqa: E402
from guard.values import stats  # noqa: E402
from guard.values.check import value_findings  # noqa: E402

N = 1_300_003  # several 1 MiB reads of every width, and a length no multiple of 4


def planted(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(N) * 0.02
    ties = normal.copy()
    ties[N // 2], ties[N // 2 + 5] = -4.0, 4.0  # the largest magnitude with both signs, the negative first
    late_zero = normal.copy()
    late_zero[-3] = 0.0  # a zero in the last read only
    late_zero[N // 3] = -0.0
    non_finite = normal.copy()
    non_finite[N // 4], non_finite[3 * N // 4] = np.nan, -np.inf
    huge = normal.copy()
    huge[N - 10] = -70000.0  # past fp16's range: the overflow figure, with no cast in play
    return {"normal": normal, "negative": -np.abs(normal) - 1e-3, "positive": np.abs(normal) + 1e-3,
            "ties": ties, "late_zero": late_zero, "non_finite": non_finite, "huge": huge,
            "zeros": np.zeros(N)}


def rows(directory: Path, policy: Policy) -> dict[str, dict]:  # type: ignore[type-arg]
    inv = load_local_model(discover_models([directory])[0])
    return {row["tensor"]: row for row in value_findings(inv, policy).stats}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_fast_path_gives_the_chunked_paths_figures(dtype: torch.dtype, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = {name: torch.from_numpy(x).to(dtype) for name, x in planted(11).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    fast = rows(tmp_path, Policy())
    calls: list[bool] = []
    real = stats.TensorScanner._update_fast

    def counted(self: stats.TensorScanner, raw: memoryview) -> bool:
        calls.append(real(self, raw))
        return calls[-1]

    monkeypatch.setattr(stats.TensorScanner, "_update_fast", counted)
    assert rows(tmp_path, Policy()) == fast
    assert True in calls and False in calls  # both paths taken
    monkeypatch.setattr(stats.TensorScanner, "_update_fast", lambda self, raw: False)
    assert rows(tmp_path, Policy()) == fast  # every read on the chunked path: the same figures
    for name, tensor in tensors.items():
        x = tensor.to(torch.float64).numpy()
        finite = x[np.isfinite(x)]
        nonzero = np.abs(finite[finite != 0])
        row = fast[name]
        assert (row["nan"], row["inf"]) == (int(np.isnan(x).sum()), int(np.isinf(x).sum())), name
        assert row["max_abs"] == float(np.abs(finite).max()), name
        assert row["worst_value"] == float(finite[np.argmax(np.abs(finite))]), name
        assert row["min_nonzero_abs"] == (float(nonzero.min()) if nonzero.size else None), name
    if dtype != torch.float16:  # fp16 -> fp16 casts nothing
        assert fast["huge"]["casts"]["fp16"]["overflow"] == 1
        assert fast["huge"]["casts"]["fp16"]["flush"] is None  # not in play: its underflows not counted
    assert fast["ties"]["worst_value"] == -4.0


def test_a_cast_in_play_counts_its_underflows(tmp_path: Path) -> None:
    x = planted(5)["normal"] * 1e-3  # tiny values in every read
    save_file({"w": torch.from_numpy(x).to(torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    cast = rows(tmp_path, Policy(targets=(Target("torch", "F16"),)))["w"]["casts"]["fp16"]
    tiny = torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    tiny = tiny[(tiny != 0) & (np.abs(tiny) < 2.0**-14)]
    with np.errstate(under="ignore"):
        back = tiny.astype(np.float16).astype(np.float64)
    assert cast["flush"] == int(np.count_nonzero(back == 0)) > 0
    assert cast["inexact_subnormal"] == int(np.count_nonzero((back != tiny) & (back != 0))) > 0
