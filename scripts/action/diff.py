"""The pull request's change: every changed model compared with the pull request's base commit.

Run by diff.sh with the action's own Python (ckpt-guard installed in it):
    diff.py LIST BASE_SHA OUT_DIR
LIST is select.sh's NUL-separated list (one file per changed model directory).  The base side is
read as the repository stores it: each directory's files at BASE_SHA are written out of git under
OUT_DIR/base/, and a file that is a Git LFS pointer there is smudged through git-lfs (its object
fetched when the clone lacks it).  A pointer that cannot be fetched stays a pointer (CG002 on the
base side) and the summary says so.  Both sides are scanned under the scan step's policy.

Writes OUT_DIR/diff.json (the ChangeReport), OUT_DIR/introduced.json (a scan report of the new
side holding only the findings the pull request introduces: annotations and the verdict come from
it) and OUT_DIR/summary.md; sets the step's outputs.  Any failure is one line and exit 2: the scan
step then falls back to the whole-snapshot verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

LFS_SPECS = (b"version https://git-lfs.github.com/spec/v1", b"version https://hawser.github.com/spec/v1")
POINTER_MAX = 1024  # git-lfs: only blobs under 1 KiB are pointer candidates
SUMMARY_BYTES = 900_000  # GitHub takes 1 MiB per step summary; leave room for the notes


def model_dirs(listing: Path) -> list[str]:
    """One directory per changed model, outermost first, none inside another (its subdirectories are its own)."""
    names = [os.fsdecode(n) for n in listing.read_bytes().split(b"\0") if n]
    dirs = sorted({os.path.normpath(os.path.dirname(n) or ".") for n in names if os.path.isfile(n)})
    kept: list[str] = []
    for d in dirs:
        if not any(k == "." or d == k or d.startswith(k + "/") for k in kept):
            kept.append(d)
    return kept


def git(*args: str, stdout: object = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], stdout=stdout, stderr=subprocess.PIPE)  # type: ignore[call-overload]


def materialize(base: str, directory: str, dest_root: Path, notes: list[str]) -> int:
    """Write ``directory`` as it is at ``base`` under ``dest_root``; the number of files written."""
    listed = git("ls-tree", "-r", "-z", base, "--", directory)
    if listed.returncode != 0:
        raise RuntimeError(f"git ls-tree {base} failed: {listed.stderr.decode(errors='replace').strip()}")
    written = 0
    for entry in filter(None, listed.stdout.split(b"\0")):
        meta, _, raw_path = entry.partition(b"\t")
        mode, kind, oid = meta.decode().split()
        if kind != "blob" or mode == "120000":  # submodules and symlinks are not checkpoints
            continue
        path = os.fsdecode(raw_path)
        dest = dest_root / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            blob = git("cat-file", "blob", oid, stdout=out)
        if blob.returncode != 0:
            raise RuntimeError(f"git cat-file {oid} ({path}) failed")
        written += 1
        if dest.stat().st_size < POINTER_MAX and dest.read_bytes().startswith(LFS_SPECS):
            smudge(path, dest, notes)
    return written


def smudge(path: str, dest: Path, notes: list[str]) -> None:
    """Replace the pointer at ``dest`` by its object, through git-lfs; a note when that cannot be done."""
    pointer = dest.read_bytes()
    temp = dest.with_name(dest.name + ".lfs-tmp")
    try:
        with open(temp, "wb") as out:
            done = subprocess.run(["git", "lfs", "smudge", "--", path], input=pointer, stdout=out,
                                  stderr=subprocess.PIPE, timeout=3600)
        why = done.stderr.decode(errors="replace").strip().splitlines()
        ok = done.returncode == 0 and temp.stat().st_size > 0 and not temp.read_bytes()[:64].startswith(LFS_SPECS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, [str(exc)]
    if ok:
        os.replace(temp, dest)
        return
    temp.unlink(missing_ok=True)
    errors = [line.strip() for line in why if "rror" in line and "logged to" not in line]  # not "Downloading..."
    reason = errors[0] if errors else (why[0] if why else "git-lfs is not installed")
    notes.append(f"the base revision of `{escape(path)}` is a Git LFS pointer whose object could not be fetched "
                 f"({escape(reason)}): that side is compared as a pointer (CG002). Install git-lfs and give the job "
                 "access to the LFS objects (actions/checkout `lfs: true`, `fetch-depth: 0`).")


def escape(text: str) -> str:
    from guard.reporters.markdown import md_escape

    return md_escape(text.replace("\r", "\\r").replace("\n", "\\n"), limit=300)


def policy() -> object:
    from guard.cli.run import resolve_policy

    targets = tuple(t for t in os.environ.get("CG_TARGETS", "").replace(",", " ").split() if t)
    return resolve_policy(config_file=None, expect=os.environ.get("CG_EXPECT") or None, keep_fp32=(),
                          targets=targets, select=(), extend_select=(), ignore=(),
                          fail_on=os.environ.get("CG_FAIL_ON") or None)


def side(label: str, paths: list[Path], root: str) -> object:
    from guard.diff import Side
    from guard.inventory import discover_models, load_local_model

    models = discover_models(paths) if paths else []
    return Side(label, tuple(load_local_model(m) for m in models), root)


def main(listing: str, base: str, out_dir: str) -> int:
    from guard.atomic import write_text_atomic
    from guard.diff import compare_sides, render_change_markdown
    from guard.inventory import display_path
    from guard.report import REPORT_VERSION  # noqa: F401 - fails early on a ckpt-guard without reports

    out = Path(out_dir)
    base_root = out / "base"
    dirs = model_dirs(Path(listing))
    notes: list[str] = []
    present = [d for d in dirs if materialize(base, d, base_root, notes)]
    old = side(f"base {base[:12]}", [base_root / d for d in present], display_path(base_root))
    new = side("this pull request", [Path(d) for d in dirs], "")
    change = compare_sides(old, new, policy(), values=os.environ.get("CG_VALUES") == "true")  # type: ignore[arg-type]

    import json

    write_text_atomic(out / "diff.json", json.dumps(change.to_json(), indent=1) + "\n")
    introduced = change.introduced_report()
    write_text_atomic(out / "introduced.json", json.dumps(introduced.to_json(), indent=1) + "\n")
    existing = os.environ.get("CG_REPORT_EXISTING") == "true"
    head = [f"## ckpt-guard: this pull request against its base `{base[:12]}`", "",
            ("Annotations and the verdict cover the whole snapshot (`report-existing: true`)." if existing else
             "Annotations and the verdict cover only the findings this pull request introduces "
             "(`report-existing: true` judges the whole snapshot)."), ""]
    head += [f"> **Note:** {note}" for note in notes] + ([""] if notes else [])
    body = render_change_markdown(change, heading="### Changes", max_bytes=SUMMARY_BYTES)
    # the base side's files sit in the runner's temp directory: show them under their repository paths
    prefix = display_path(base_root).rstrip("/") + "/"
    from guard.reporters.markdown import md_escape

    body = body.replace(md_escape(prefix, limit=4096), "").replace(prefix, "")
    write_text_atomic(out / "summary.md", "\n".join(head) + "\n" + body + "\n")
    outputs = {"report": out / "introduced.json", "diff-report": out / "diff.json", "summary": out / "summary.md",
               "exit-code": introduced.exit_code, "introduced": len(change.introduced),
               "resolved": len(change.resolved), "notes": len(notes)}
    with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as fh:
        for name, value in outputs.items():
            delimiter = f"ghadelimiter_{uuid.uuid4()}"
            fh.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
    print(f"ckpt-guard: {len(dirs)} changed model director(y/ies) compared with {base[:12]}: "
          f"{len(change.introduced)} finding(s) introduced, {len(change.resolved)} resolved.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:4]))
    except Exception as exc:  # noqa: BLE001 - one line, and the scan step judges the whole snapshot
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"::warning title=ckpt-guard::could not compare with the pull request's base "
              f"({type(exc).__name__}: {first.replace('%', '%25')}); the verdict covers the whole snapshot")
        sys.exit(2)
