"""What one `hub fix` run found and did: the record the command prints and the reviewer logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from guard.fix.apply import Outcome
    from guard.fix.plan import FixPlan
    from guard.hub.proposal import Proposal
    from guard.report import Report

# What happened, one word each:
STATUSES = (
    "dry-run",         # planned and shown; nothing downloaded or opened
    "nothing-to-fix",  # no fix is ready (none planned, or every one waits for a flag)
    "own-fix",         # the revision is a fix of ours (its commit carries the marker): never fixed again
    "already-open",    # an open pull request of ours already proposes this plan
    "already-offered", # the reviewer offered a fix for this revision before (open, merged or closed)
    "up-to-date",      # the fixes write exactly what the revision holds (the pull request was merged)
    "not-applied",     # every ready fix was refused or rolled back
    "opened",          # a pull request was opened
)


@dataclass  # mutable: offer_fix sets status, outcomes, files, after, proposal and message step by step
class HubFix:
    repo_id: str
    sha: str  # the commit that was scanned and fixed
    before: Report
    plan: FixPlan
    status: str = "dry-run"
    plan_hash: str = ""
    outcomes: list[Outcome] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)  # repository path -> the verified file it carries
    after: Report | None = None  # the revision with the pull request's files (a new one, or the open one)
    proposal: Proposal | None = None
    message: str = ""  # one line for stderr

    @property
    def exit_code(self) -> int:
        """Dry run: 1 when something can be fixed; with a pull request: what its head scans to."""
        if self.status == "dry-run":
            return 1 if self.plan.fixes else self.before.exit_code
        if self.after is not None:
            return self.after.exit_code
        if self.status == "not-applied":
            return self.before.exit_code or 1
        return self.before.exit_code

    def to_json(self) -> dict[str, Any]:
        def verdict(report: Report | None) -> dict[str, Any] | None:
            return None if report is None else {"failed": report.failed, "exit_code": report.exit_code,
                                                "counts": report.counts()}

        proposal = self.proposal
        return {"repo": self.repo_id, "sha": self.sha, "status": self.status, "plan_hash": self.plan_hash or None,
                **self.plan.to_json(), "outcomes": [outcome_json(o) for o in self.outcomes],
                "files": sorted(self.files), "before": verdict(self.before), "after": verdict(self.after),
                "pull_request": None if proposal is None else {"num": proposal.num, "url": proposal.url,
                                                               "status": proposal.status}}


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    return {"action": outcome.planned.fix.action, "ok": outcome.ok, "written": list(outcome.written),
            "summary": outcome.summary, "error": outcome.error,
            "findings": [f.to_json() for f in outcome.findings]}
