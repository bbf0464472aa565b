"""Training state where a model is published (CG120), and a repository whose only weights are training
partitions (CG121).

Judged over everything one scan reads (a folder about to be uploaded, a Hub repository, a commit), not
per model directory: ``global_stepN/`` sits beside ``model.safetensors``, in a folder of its own.
``publishing`` is the upload gate's and the Hub reviewer's view: the tree *is* a model repository, so
training state in it is always CG120 and a repository with nothing loadable is CG121 as an error.  A
plain scan (the pre-commit hook's too) says so only where the tree is one: a weight set, or a
config.json beside the training checkpoint; CG121 is then a warning.
"""

from __future__ import annotations

from guard import dtypes
from guard.catalogue import make_finding
from guard.findings import Finding, Severity
from guard.inventory import ModelInventory, WeightSet

CONFIG_BESIDE = "training.config"  # FileScan.metadata: a config.json beside the checkpoint (its layout says)
CONVERT = "ckpt-guard convert {path} --to torch --out OUT"


def _training_sets(inventory: ModelInventory) -> list[WeightSet]:
    return [ws for ws in inventory.sets if ws.files and ws.files[0].training is not None]


def _state_bytes(ws: WeightSet) -> tuple[int, int]:
    """(bytes of the checkpoint's files, bytes of its optimizer state: masters and moments)."""
    state = ws.files[0].training
    optimizer = sum(dtypes.nbytes(h.dtype, h.elements) or 0 for h in getattr(state, "homes", ())
                    if h.kind in ("master", "optimizer"))
    return sum(scan.size or 0 for scan in ws.files), optimizer


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**7 else f"{n / 1e6:.2f} MB"


class PublishingCheck:
    """Fed each inventory of one scan as it is read (only training sets are kept), then judged once."""

    def __init__(self, *, weights: bool = False) -> None:
        self.training: list[WeightSet] = []
        self.weights = weights  # loadable weights were seen (by the caller, or by ``add``)

    def add(self, inventory: ModelInventory) -> None:
        self.training += _training_sets(inventory)
        self.weights = self.weights or any(
            ws.role in ("weights", "adapter") and ws.files and ws.files[0].training is None
            and any(scan.tensors for scan in ws.files) for ws in inventory.sets)

    def findings(self, *, publishing: bool = False) -> list[Finding]:
        if not self.training:
            return []
        config = any(ws.files[0].metadata.get(CONFIG_BESIDE) for ws in self.training)
        if not (publishing or self.weights or config):
            return []  # a training checkpoint scanned on its own: nothing is being published
        findings = []
        for ws in self.training:
            total, optimizer = _state_bytes(ws)
            path = ws.files[0].path
            findings.append(make_finding(
                "CG120", path,
                f"training state in a model repository: {_gb(total)} of checkpoint files, {_gb(optimizer)} of it "
                f"optimizer state (master weights and moments); publish the consolidated weights instead "
                f"(`{CONVERT.format(path=path)}`) and leave the checkpoint out")._replace(set=ws.name))
        if not self.weights:
            ws = self.training[0]
            path = ws.files[0].path
            finding = make_finding(
                "CG121", path,
                f"the only weights here are training partitions ({len(self.training)} training checkpoint(s)): no "
                f"loadable model is published; consolidate first (`{CONVERT.format(path=path)}`) and publish OUT")
            findings.append(finding._replace(set=ws.name, severity=Severity.error if publishing else finding.severity))
        return findings
