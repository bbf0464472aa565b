"""What ``fix`` hands each action, and what an action hands back before anything is published."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard.config import Policy
from guard.findings import Finding
from guard.records import Record

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # transformers' save_pretrained default, "5GB"


class FixOptions(Record):
    write: bool = False  # False: a dry run, nothing is written
    replace: bool = False  # allow fixes that replace an existing weight file
    backup: bool = True  # keep a replaced file as NAME.orig
    allow_lossy: bool = False  # a narrowing cast that loses values is written (and reported) instead of refused
    cast: bool = False  # CG101 / CG102: write the set in the expected dtype
    to_config: bool = False  # CG103: cast the weights to config.json's dtype instead of rewriting config.json
    unsafe_fixes: bool = False  # apply the fixes marked unsafe (CG124's layer count): shown, else never applied
    values: bool = False  # scan values too (CG107 checksums, CG201-CG204)
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    verify: str = "sampled"  # "sampled" | "full" (guard.write.verify)
    add: tuple[str, ...] = ()  # --add flax|orbax|safetensors|variant:fp16|variant:bf16


class ActionContext(Record):
    model_dir: Path  # the model directory the fix's finding was raised in (a real path)
    staging: Path  # an empty directory on the same filesystem: the action writes only here
    options: FixOptions
    policy: Policy

    def final(self, name: str) -> Path:
        """A final path inside the model directory; a name that would leave it is refused."""
        path = (self.model_dir / name)
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise ValueError(f"{name!r} is not a name inside the model directory")
        return path


@dataclass  # mutable: an action appends the files it stages and its findings, then sets summary and details
class Staged:
    """What one action wrote into the staging directory: nothing is at a final name yet."""

    files: list[tuple[Path, Path]] = field(default_factory=list)  # (staged file, final path), in publish order
    findings: list[Finding] = field(default_factory=list)  # verification (CG301) and cast (CG201-CG204); an
    #                                                        error among them rolls the fix back
    summary: str = ""  # one line for the report: what was written and what it holds
    details: dict[str, Any] = field(default_factory=dict)  # figures for the JSON report (tied names, casts, ...)
