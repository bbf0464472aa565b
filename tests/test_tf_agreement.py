"""Differential agreement on mutated TensorFlow files: our verdict against TensorFlow's and LiteRT's.

``fuzz/agreement.py tf-bundle tflite`` runs thousands (docs/reliability.md); this runs a
few hundred in the suite and fails on any disagreement outside the documented categories.
The references run in forked children (TensorFlow aborts the process on some corrupt indexes).
"""

from __future__ import annotations

import random
import warnings

import pytest
from fuzz_formats_tf import repair_crcs, warm_up
from fuzz_inputs import (
    FILE_NAMES,
    REFERENCES,
    apply_all,
    assert_well_behaved,
    bounded_scan,
    differential_run,
    explain,
    random_mutations,
    sample_checkpoints,
)

pytest.importorskip("tensorflow")
pytest.importorskip("ai_edge_litert")


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warnings.simplefilter("ignore")
    warm_up()


@pytest.mark.parametrize("fmt", ["tf-bundle", "tflite"])
def test_mutants_agree_with_the_reference(fmt: str) -> None:
    tally, unexplained = differential_run(fmt, sample_checkpoints(fmt), count=150, seed=7)
    assert not unexplained, unexplained[:3]
    assert tally["agree"] / sum(tally.values()) >= 0.98, tally


def test_resealed_index_mutants_agree_with_tensorflow() -> None:
    """Mutants with their block crcs recomputed: the entries and restart arrays are what differ."""
    rng = random.Random(11)
    bases = sample_checkpoints("tf-bundle")
    tally: dict[str, int] = {}
    unexplained = []
    for i in range(150):
        base = bases[i % len(bases)]
        data = repair_crcs(apply_all(base, random_mutations(rng, base, hot=len(base))))
        ours = bounded_scan(data, FILE_NAMES["tf-bundle"])
        assert_well_behaved(ours, data)
        theirs = REFERENCES["tf-bundle"](data)
        category = explain("tf-bundle", ours, theirs) or "UNEXPLAINED"
        tally[category] = tally.get(category, 0) + 1
        if category == "UNEXPLAINED":
            unexplained.append(f"ours: {ours.reason or ours.inventory} / theirs: {theirs}")
    assert not unexplained, (tally, unexplained[:5])
