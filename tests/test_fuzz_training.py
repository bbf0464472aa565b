"""The training readers in the fuzzing and the agreement checks: DCP ``.metadata`` (tests/fuzz_formats_training.py).

Byte mutations of ``.metadata`` files ``torch.distributed.checkpoint.save`` wrote never raise, hang, allocate
beyond a few MB or import anything, and our reading agrees with torch's own ``Metadata`` (pickle.load with
torch's classes) on each mutant, or differs for a documented reason.  The ZeRO rank files' mutations and
their agreement with ``zero_to_fp32`` are in tests/test_training_zero.py (they need DeepSpeed's own files).
"""

from __future__ import annotations

import random
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bounds import no_hang, traced  # noqa: E402
from fuzz_formats_training import KNOWN_TRAINING, dcp_metadata_samples, dcp_verdict, ours_dcp_metadata  # noqa: E402
from fuzz_inputs import SCAN_PEAK_BYTES, apply_all, random_mutations  # noqa: E402

COUNT = 150


@pytest.fixture(scope="module")
def samples() -> list[bytes]:
    return dcp_metadata_samples()


def test_the_samples_read_back_what_torch_reads(samples) -> None:
    for data in samples:
        assert dcp_verdict(data)[0] == "agree" and not isinstance(ours_dcp_metadata(data), str)


def test_metadata_mutants_are_well_behaved_and_agree_with_torch(samples) -> None:
    ours_dcp_metadata(samples[0])  # the reader's imports, before the count
    before = set(sys.modules)
    rng = random.Random(0)
    tally: Counter[str] = Counter()
    unexplained = []
    for i in range(COUNT):
        base = samples[i % len(samples)]
        data = apply_all(base, random_mutations(rng, base, hot=min(len(base), 600)))
        with traced() as peak, no_hang():
            ours_dcp_metadata(data)
        assert peak.bytes < SCAN_PEAK_BYTES + len(data), peak.bytes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            category, said = dcp_verdict(data)
        tally[category] += 1
        if category == "UNEXPLAINED":
            unexplained.append((data, said))
    assert set(sys.modules) == before  # our side never imported what a mutant named
    assert not unexplained, unexplained[:3]
    assert tally["agree"] / COUNT >= 0.9, tally


def test_a_mutated_metadata_in_its_folder_is_a_finding_naming_it(tmp_path: Path) -> None:
    """The whole folder scan (metadata, integrity, the training record) on mutants of a real save."""
    import torch.distributed.checkpoint as dcp

    from guard.training.dcp.dirs import claim, scan

    folder = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(4, 3), "b": torch.zeros(3)}}, checkpoint_id=str(folder))
    original = (folder / ".metadata").read_bytes()
    rng = random.Random(1)
    refused = 0
    for _ in range(40):
        (folder / ".metadata").write_bytes(apply_all(original, random_mutations(rng, original, hot=600)))
        found = claim(str(folder), frozenset(p.name for p in folder.iterdir()))
        if found is None:  # the first byte is no longer pickle's: not a DCP checkpoint, nothing to say
            continue
        with no_hang():
            result = scan(found, name=str(folder))
        errors = [f for f in result.findings if f.severity.value == "error"]
        if errors:
            refused += 1
            assert {f.code for f in errors} <= {"CG001", "CG003", "CG114", "CG115", "CG116"}, errors
            assert all(f.path.startswith(str(folder)) for f in errors)
    assert refused  # the mutants did reach the checks


def test_known_training_disagreements_are_documented() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "reliability.md").read_text(encoding="utf-8")
    for known in KNOWN_TRAINING:
        assert f"`{known.category}`" in doc and "dcp-metadata" in doc, known.category


UNIVERSAL_SEEDS = sorted((Path(__file__).parent.parent / "fuzz" / "corpus" / "zero_states").glob("seed-universal-*.pt"))


def test_universal_seeds_are_ds_to_universals_parameter_files() -> None:
    """The committed seeds (fuzz/make_corpus.py ran DeepSpeed's ds_to_universal): each walks clean, and the
    master and the moment hold one whole fp32 ``param`` tensor, as guard.training.deepspeed.universal reads it."""
    from guard.sources import BytesSource
    from guard.training.deepspeed.files import read_zero_file
    from guard.training.deepspeed.universal import param_in

    assert {p.name for p in UNIVERSAL_SEEDS} == {f"seed-universal-{k}.pt"
                                                 for k in ("fp32", "exp_avg", "step", "optimizer_state")}
    for path in UNIVERSAL_SEEDS:
        zfile = read_zero_file(BytesSource(path.read_bytes(), name=path.name))
        assert not zfile.unsafe, path.name
        if path.name in ("seed-universal-fp32.pt", "seed-universal-exp_avg.pt"):
            param = param_in(zfile)
            assert param is not None and param.dtype == "F32" and param.shape == (16,), path.name


def test_universal_file_mutants_are_findings_never_crashes_hangs_or_imports() -> None:
    """Byte mutations of ds_to_universal's files, read as a scan reads them (read_zero_input: the zip and pickle
    walk, then as model states, optimizer states and a parameter file): no exception outside READ_FAILURES,
    no hang, a small peak, nothing imported."""
    from fuzz_formats_training import read_zero_input

    bases = [p.read_bytes() for p in UNIVERSAL_SEEDS]
    read_zero_input(bases[0])  # the readers' imports, before the count
    before = set(sys.modules)
    rng = random.Random(31)
    for i in range(COUNT):
        base = bases[i % len(bases)]
        data = apply_all(base, random_mutations(rng, base, hot=min(len(base), 2000)))
        with traced() as peak, no_hang():
            read_zero_input(data)
        assert peak.bytes < SCAN_PEAK_BYTES + 2 * len(data), peak.bytes
    assert set(sys.modules) == before
