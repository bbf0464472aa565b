"""The one place that publishes a fix: staging, verification, backups, renames, rollback.

Per fix: a hidden staging directory inside the model directory (same filesystem, never
scanned); the action writes and verifies there.  An error finding or an exception removes
the staging directory and nothing reaches a final name.  Publishing fsyncs every staged
file, keeps each file about to be replaced (a hard link, or a copy) for rollback and, unless
``--no-backup``, as ``NAME.orig``; then ``os.replace`` puts each staged file at its final
name, and the directory is fsynced.  A rename is atomic, so a kill at any moment leaves
every final name either old or new; an error between two renames restores the old files.
config.json is the one file a fix may replace without ``--replace``: its rewrite changes
only the dtype values, which the plan and the patch name, so it keeps no backup.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from guard.config import Policy
from guard.errors import GuardError, MalformedCheckpoint, MissingExtraError
from guard.findings import Finding, Severity
from guard.fix.actions import stage
from guard.fix.context import ActionContext, FixOptions, Staged
from guard.fix.plan import FixPlan, PlannedFix
from guard.inventory.model import CONFIG_NAME
from guard.records import Record

STAGING_PREFIX = ".ckpt-guard-fix-"  # guard.inventory.discovery never walks into these
BACKUP_SUFFIX = ".orig"


class Outcome(Record):
    planned: PlannedFix
    ok: bool
    written: list[str]  # final paths published
    backups: list[str]  # NAME.orig kept for replaced files
    findings: list[Finding]  # what verification / value checks found
    summary: str
    error: str | None = None  # why it was refused or rolled back
    details: dict[str, object] | None = None  # the action's figures (Staged.details)

    def to_json(self) -> dict[str, object]:
        return {"action": self.planned.fix.action, "ok": self.ok, "written": self.written, "backups": self.backups,
                "findings": [f.to_json() for f in self.findings], "summary": self.summary, "error": self.error,
                "details": json.loads(json.dumps(self.details or {}, default=str))}  # an action's figures, as JSON


class Refused(GuardError):
    """A staged fix that may not be published (it would replace a file without --replace, ...)."""


def apply_plan(plan: FixPlan, options: FixOptions, policy: Policy, *, root: Path = Path(".")) -> list[Outcome]:
    outcomes: list[Outcome] = []
    applied: set[tuple[str, str]] = set()
    for planned in plan.fixes:  # a fix that writes weights draws its own bar, tensor by tensor
        if not planned.enabled:
            outcomes.append(Outcome(planned, False, [], [], [], "not applied",
                                    error=f"waits for {planned.waiting_for}"))
            continue
        after = planned.after
        if after is not None and (after.action, after.params) not in applied:
            outcomes.append(Outcome(planned, False, [], [], [], "not applied",
                                    error=f"it follows the {after.action} fix, which was not applied"))
            continue
        outcome = apply_fix(planned, options, policy, root=root)
        if outcome.ok:
            applied.add((planned.fix.action, planned.fix.params))
        outcomes.append(outcome)
    return outcomes


def apply_fix(planned: PlannedFix, options: FixOptions, policy: Policy, *, root: Path = Path(".")) -> Outcome:
    fix = planned.fix
    model_dir = root / str(fix.arguments.get("dir", "."))
    if not model_dir.is_dir():
        return Outcome(planned, False, [], [], [], "not applied", error=f"{model_dir}: not a directory")
    sweep_stale_staging(model_dir)
    staging = model_dir / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    staged = Staged()
    try:
        staging.mkdir()
        try:
            staged = stage(fix, ActionContext(model_dir, staging, options, policy))
        except ModuleNotFoundError as exc:  # weight fixes need numpy, ml_dtypes, torch or flax: the convert extra
            raise MissingExtraError(exc.name or "a dependency", "convert") from None
        errors = [f for f in staged.findings if f.severity is Severity.error]
        if errors:
            return Outcome(planned, False, [], [], staged.findings, staged.summary or "rolled back",
                           error=f"{errors[0].code}: {errors[0].message}; nothing written", details=staged.details)
        if not staged.files:
            return Outcome(planned, False, [], [], staged.findings, staged.summary or "nothing staged",
                           error="the action wrote nothing", details=staged.details)
        # the config rewrites replace a file without --replace: only the values the plan names change
        config_only = fix.action in ("config-dtype", "config-field")
        written, backups = publish(staged, model_dir, staging, options=options, config_only=config_only)
    except (GuardError, OSError, MalformedCheckpoint) as exc:
        reason = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
        filename = getattr(exc, "filename", None)
        text = f"{filename}: {reason}" if reason and filename else str(exc)
        return Outcome(planned, False, [], [], staged.findings, "rolled back: nothing written",
                       error=text.splitlines()[0][:500] if text else type(exc).__name__, details=staged.details)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Outcome(planned, True, written, backups, staged.findings, staged.summary, details=staged.details)


def publish(staged: Staged, model_dir: Path, staging: Path, *, options: FixOptions,
            config_only: bool = False) -> tuple[list[str], list[str]]:
    """Every staged file at its final name, or (on any error) every final name as it was."""
    pairs = [(Path(s), Path(f)) for s, f in staged.files]
    _check(pairs, model_dir, staging, options=options, config_only=config_only)
    keep = staging / ".old"
    keep.mkdir()
    _fsync_tree([s for s, _ in pairs] + [staging, keep])
    done: list[tuple[Path, Path | None]] = []  # (final, where its old file is kept; None: it was new)
    backups: list[Path] = []
    try:
        for i, (source, final) in enumerate(pairs):
            old = None
            if os.path.lexists(final):
                old = keep / str(i)
                _keep(final, old)
                _copy_mode(final, source)
                if options.backup and final.name != CONFIG_NAME:
                    backup = _backup_name(final)
                    _keep(final, backup)
                    backups.append(backup)
            os.replace(source, final)
            done.append((final, old))
        _fsync_dirs({final.parent for _, final in pairs})
    except BaseException:
        _restore(done, backups)
        raise
    return [str(final) for _, final in pairs], [str(b) for b in backups]


def _check(pairs: list[tuple[Path, Path]], model_dir: Path, staging: Path, *, options: FixOptions,
           config_only: bool) -> None:
    inside, staged_in = model_dir.resolve(), staging.resolve()
    for source, final in pairs:
        if not source.resolve().is_relative_to(staged_in) or not (source.is_file() or source.is_dir()):
            raise Refused(f"{source}: a staged file must be inside the staging directory")
        if not final.parent.resolve().is_relative_to(inside) or final.name.startswith(STAGING_PREFIX):
            raise Refused(f"{final}: outside the model directory {model_dir}")
        if os.path.lexists(final) and final.is_dir() != source.is_dir():
            raise Refused(f"{final}: would replace a {'directory' if final.is_dir() else 'file'} with a "
                          f"{'directory' if source.is_dir() else 'file'}")
        if os.path.lexists(final) and final.is_dir():
            raise Refused(f"{final}: already exists; a fix adds a directory only where there is none")
        replaced_config = final.name == CONFIG_NAME and config_only
        if os.path.lexists(final) and not options.replace and not replaced_config:
            raise Refused(f"{final}: exists, and this fix would replace it: give --replace (the old file is kept "
                          f"as {final.name}{BACKUP_SUFFIX} unless --no-backup)")


def _keep(final: Path, where: Path) -> None:
    """``where`` holds what ``final`` holds now: a hard link (free), or a copy where links are refused."""
    try:
        os.link(final, where, follow_symlinks=False)
    except OSError:
        shutil.copy2(final, where, follow_symlinks=False)


def _copy_mode(final: Path, source: Path) -> None:
    try:
        os.chmod(source, os.stat(final).st_mode & 0o7777)
    except OSError:
        pass  # a dangling link or a mode we may not set: the staged file keeps its own


def _backup_name(final: Path) -> Path:
    """NAME.orig; an older NAME.orig is an earlier original, kept: then NAME.2.orig, NAME.3.orig, ...
    (the suffix stays last: the scanner never takes a ``.orig`` file for weights)."""
    backup = final.with_name(final.name + BACKUP_SUFFIX)
    n = 2
    while os.path.lexists(backup):
        backup = final.with_name(f"{final.name}.{n}{BACKUP_SUFFIX}")
        n += 1
    return backup


def _restore(done: list[tuple[Path, Path | None]], backups: list[Path]) -> None:
    """Undo a publish half done: old files back at their names, new ones removed, no backups left."""
    for final, old in reversed(done):
        try:
            if old is not None:
                os.replace(old, final)
            elif final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            else:
                os.unlink(final)
        except OSError:
            pass  # best effort: the error that brought us here is what the user sees
    for backup in backups:
        try:
            os.unlink(backup)
        except OSError:
            pass


def _fsync_tree(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            for current, _dirs, files in os.walk(path):
                _fsync_tree([Path(current, name) for name in files])
                _fsync_dirs({Path(current)})
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _fsync_dirs(directories: set[Path]) -> None:
    for directory in sorted(directories):
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass  # some filesystems refuse fsync on a directory; the files were fsynced
        finally:
            os.close(fd)


def sweep_stale_staging(model_dir: Path) -> None:
    """Staging directories a killed run left behind (its process gone) are removed."""
    try:
        entries = [e for e in os.scandir(model_dir) if e.name.startswith(STAGING_PREFIX) and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(STAGING_PREFIX):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True
