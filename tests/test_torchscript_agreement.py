"""Mutated TorchScript archives and 0.4-era legacy pickles: our verdict against the reference loaders.

TorchScript against ``torch.jit.load`` in a forked worker (tests/torchscript_agreement.py
has the documented categories); torch 0.4-era files against ``torch.load(weights_only=True)``
through the legacy differential of tests/fuzz_inputs.py.  A few hundred mutants here;
``fuzz/agreement_torchscript.py`` runs the thousands behind docs/reliability.md.
"""

from __future__ import annotations

import logging
import warnings

import pytest
from fuzz_inputs import differential_run

torch = pytest.importorskip("torch")
from torchscript_agreement import agreement_run  # noqa: E402
from torchscript_samples import sample_torchscripts  # noqa: E402

COUNT = 240


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)


def test_torchscript_verdicts_agree_with_jit_load() -> None:
    tally, unexplained = agreement_run(sample_torchscripts(), count=COUNT, seed=0)
    assert not unexplained, [why for _, why in unexplained[:3]]
    assert tally["agree"] >= 0.8 * COUNT, tally


def test_torch04_verdicts_agree_with_torch_load() -> None:
    from torch04 import legacy_samples

    bases = legacy_samples()
    tally, unexplained = differential_run("torch-legacy", bases, count=COUNT, seed=0)
    assert not unexplained, [why for _, why in unexplained[:3]]
    assert tally["agree"] >= 0.8 * COUNT, tally
