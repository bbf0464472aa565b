"""scan --values over tensors of many chunks: every figure equals numpy's over the whole tensor.

The scan reads 256 KiB at a time and batches the tiny values (under 2^-14) across chunks; the
smallest non-zero value, the NaN/Inf counts and the fp16 underflows must not depend on which chunk
holds what: zeros only in the first chunk, the smallest value alone in the last, NaN/Inf mid-way.
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
from guard.values.check import value_findings  # noqa: E402

N = 600_001  # five chunks of bf16 and fp16, ten of fp32, and a length no multiple of 4


def planted(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(N)
    away = np.sign(normal) * (np.abs(normal) + 0.01)  # nothing tiny
    late = away.copy()
    late[:1000] = 0.0  # zeros in the first chunk only
    late[-1] = -3.1e-7  # the smallest, alone in the last chunk
    mixed = normal * 3e-4  # tiny values in every chunk, some flushing in fp16
    mixed[N // 2] = np.nan
    mixed[N // 2 + 7] = -np.inf
    mixed[N // 3] = 0.0
    settled = away.copy()
    settled[:1000] = 0.0  # zeros first, nothing tiny anywhere: the smallest is a chunk's own minimum
    settled[N - 9] = 0.003  # the smallest, not tiny, in the last chunk
    sparse = normal * 3e-4
    sparse[0::4] = sparse[1::4] = 0.0  # 2:4 sparsity: every group of four flagged by its zeros
    return {"late": late, "mixed": mixed, "zeros": np.zeros(N), "settled": settled, "sparse": sparse}


def expected(x: np.ndarray) -> dict[str, object]:
    finite = x[np.isfinite(x)]
    nonzero = np.abs(finite[finite != 0])
    tiny = finite[(finite != 0) & (np.abs(finite) < 2.0**-14)]
    with np.errstate(under="ignore"):
        back = tiny.astype(np.float16).astype(np.float64)
    return {"nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum()),
            "max_abs": float(np.abs(finite).max()), "min_nonzero_abs": float(nonzero.min()) if nonzero.size else None,
            "flush": int(np.count_nonzero(back == 0)),
            "inexact_subnormal": int(np.count_nonzero((back != tiny) & (back != 0)))}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_figures_do_not_depend_on_the_chunking(dtype: torch.dtype, tmp_path: Path) -> None:
    tensors = {name: torch.from_numpy(x).to(dtype) for name, x in planted(7).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    inv = load_local_model(discover_models([tmp_path])[0])
    rows = {row["tensor"]: row for row in value_findings(inv, Policy(targets=(Target("torch", "F16"),))).stats}
    for name, tensor in tensors.items():
        x = tensor.to(torch.float64).numpy()  # every bf16/fp16/fp32 value is exact in fp64
        want, row = expected(x), rows[name]
        got = {"nan": row["nan"], "inf": row["inf"], "max_abs": row["max_abs"],
               "min_nonzero_abs": row["min_nonzero_abs"]}
        if dtype != torch.float16:  # fp16 -> fp16 casts nothing
            got.update(flush=row["casts"]["fp16"]["flush"],
                       inexact_subnormal=row["casts"]["fp16"]["inexact_subnormal"])
        else:
            want = {k: v for k, v in want.items() if k not in ("flush", "inexact_subnormal")}
        assert got == want, name


def test_the_batch_is_settled_as_it_fills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny values in every chunk wait in a batch of at most BATCH elements: settled as it fills, not held
    for the whole tensor (a bound on memory), with the same figures."""
    from guard.values import stats

    x = planted(3)["mixed"]
    save_file({"mixed": torch.from_numpy(x).to(torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    settles: list[int] = []
    real = stats.TensorScanner._settle

    def counted(self: stats.TensorScanner) -> None:
        settles.append(self._batched)
        real(self)

    monkeypatch.setattr(stats.TensorScanner, "BATCH", 4096)
    monkeypatch.setattr(stats.TensorScanner, "_settle", counted)
    inv = load_local_model(discover_models([tmp_path])[0])
    (row,) = value_findings(inv, Policy(targets=(Target("torch", "F16"),))).stats
    want = expected(torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy())
    assert row["min_nonzero_abs"] == want["min_nonzero_abs"] and row["casts"]["fp16"]["flush"] == want["flush"]
    assert len([n for n in settles if n]) > 3  # five chunks, each over the batch: settled along the way
