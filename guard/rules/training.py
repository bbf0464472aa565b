"""A file's own findings, judged by the role of its set.

Training state is read for integrity and safety (CG001-CG005) like any file.
Its pickles are not weights-only by design, so the globals the Trainer itself
writes get one note instead of a wall of CG003 errors; anything else stays CG003.
"""

from __future__ import annotations

from collections.abc import Iterator

from guard.catalogue import make_finding
from guard.findings import Finding, Severity
from guard.inventory import WeightSet
from guard.tensors import FileScan

# transformers' own `safe_globals()` (trainer.py) allowlists these for `torch.load(weights_only=True)`
# of rng_state*.pth: numpy's RNG state is an array.
RNG_STATE_GLOBALS = frozenset({
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.dtypes.UInt32DType",
})
# training_args.bin pickles a TrainingArguments object: its classes and enums live in these packages.
TRAINER_PACKAGES = ("transformers.", "accelerate.", "peft.", "trl.")


def file_findings(ws: WeightSet, scan: FileScan) -> Iterator[Finding]:
    refused = scan.metadata.get("pickle_globals", "").split()
    if ws.role != "training-state" or not refused:
        yield from scan.findings
        return
    benign = _benign(ws.stem, refused)
    for finding in scan.findings:
        if finding.code != "CG003" or not benign:
            yield finding
    if benign and not ws.stem.startswith("rng_state"):
        example = next((g for g in refused if g.endswith("TrainingArguments")), refused[0])
        yield make_finding(
            "CG003", scan.path,
            f"training state, not weights: this pickle holds {example} ({len(refused)} class(es) of "
            f"{_packages(refused)}), so torch.load(weights_only=True) refuses it; nothing was imported or "
            "called. Keep it out of published repositories, or load it only from a source you trust",
        )._replace(severity=Severity.note)


def _benign(stem: str, refused: list[str]) -> bool:
    if stem.startswith("rng_state"):
        return all(g in RNG_STATE_GLOBALS for g in refused)
    return all(g.startswith(TRAINER_PACKAGES) or g in RNG_STATE_GLOBALS for g in refused)


def _packages(refused: list[str]) -> str:
    return ", ".join(sorted({g.split(".", 1)[0] for g in refused}))
