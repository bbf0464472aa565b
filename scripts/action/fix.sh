#!/usr/bin/env bash
# `fix: true`: apply the fixes to the scanned models in the workspace (`ckpt-guard fix --write`), gather the
# files it wrote for the artifact, and put the plan and a `git apply` patch of the text changes in the job
# summary. It never commits or pushes. Like scan.sh it never fails itself: the verdict step reads exit-code.
set -uo pipefail

root="$RUNNER_TEMP/ckpt-guard"
report="$root/fix.json"
patch="$root/fix.patch"
changed="$root/fix-changed.list"
gathered="$root/fixed"  # the artifact: each written file at its path under working-directory
rm -rf "$report" "$patch" "$changed" "$gathered"
mkdir -p "$gathered"

paths=()
while IFS= read -r -d '' p; do paths+=("$p"); done < "$CG_LIST"

args=(fix --write --format json --patch "$patch" --changed "$changed")
[ -n "$CG_EXPECT" ] && args+=(--expect "$CG_EXPECT")
for target in ${CG_TARGETS//,/ }; do args+=(--target "$target"); done

"$CG_BIN" "${args[@]}" -- "${paths[@]}" > "$report"
rc=$?
if [ "$rc" -gt 1 ] || [ ! -s "$report" ]; then
  echo "::error title=ckpt-guard fix::the fix could not run (exit $rc); see the log above. Nothing was published."
  printf '%s\n' "exit-code=2" "fixed=0" "files=0" "patch=" "report=" >> "$GITHUB_OUTPUT"
  exit 0
fi

"$CG_PYTHON" - "$report" "$patch" "$changed" "$gathered" <<'PY'
import json, os, re, shutil, sys, uuid
from guard.reporters.github import escape_data
from guard.reporters.inert import inert_text
from guard.reporters.markdown import md_escape

report_path, patch_path, changed_path, gathered = sys.argv[1:]
fix = json.load(open(report_path, encoding="utf-8")).get("extra", {}).get("fix", {})
outcomes = fix.get("outcomes", [])
applied = [o for o in outcomes if o.get("ok")]

# The written files, gathered for upload-artifact: hard links where the filesystem allows, else copies.
names = []
if os.path.exists(changed_path):
    names = [n for n in open(changed_path, encoding="utf-8").read().split("\n") if n]
files = 0
for name in names:
    rel = os.path.normpath(name)
    if os.path.isabs(rel) or rel.split(os.sep)[0] == ".." or not os.path.isfile(rel):
        print(f"::warning title=ckpt-guard fix::not in the artifact (outside the working directory): {name!r}")
        continue
    dest = os.path.join(gathered, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    try:
        os.link(rel, dest)
    except OSError:
        shutil.copy2(rel, dest)
    files += 1

patch = open(patch_path, encoding="utf-8", errors="replace").read() if os.path.exists(patch_path) else ""
plan = fix.get("plan", [])
for planned, outcome in zip(plan, outcomes):
    if planned.get("enabled") and not outcome.get("ok"):
        why = inert_text(f"{outcome.get('action')}: {outcome.get('error') or outcome.get('summary')}", limit=300)
        print(f"::warning title=ckpt-guard fix::a fix was refused or rolled back, nothing published: "
              f"{escape_data(why)}")


def cell(value: object, limit: int = 200) -> str:
    return md_escape(str(value), limit=limit)


def result(planned: dict, outcome: dict | None) -> str:
    if not planned.get("enabled"):
        return f"waits for `{cell(planned.get('waiting_for'), 60)}`"
    if outcome is None:
        return "not applied"
    if outcome.get("ok"):
        return ":white_check_mark: " + cell(outcome.get("summary") or "written", 300)
    return ":x: " + cell(outcome.get("error") or outcome.get("summary") or "rolled back", 300)


lines = ["## :wrench: ckpt-guard fix", ""]
artifact = os.environ.get("CG_FIX_ARTIFACT", "ckpt-guard-fix")
lines.append(f"{len(applied)} fix(es) applied, {files} file(s) written"
             + (f": they are in the workflow artifact `{cell(artifact, 100)}`." if files else ".")
             + " Nothing was committed or pushed.")
lines.append("")
if plan:
    lines += ["| fix | findings | safety | files | result |", "|---|---|---|---|---|"]
    for i, planned in enumerate(plan):
        outcome = outcomes[i] if i < len(outcomes) else None
        writes = "<br>".join(f"`{cell(w, 160)}`" for w in planned.get("writes", [])[:20])
        lines.append(f"| {cell(planned.get('action'), 40)}: {cell(planned.get('description'), 300)} "
                     f"| {cell(', '.join(planned.get('codes', [])), 60)} | {cell(planned.get('safety'), 20)} "
                     f"| {writes} | {result(planned, outcome)} |")
    lines.append("")
unfixable = fix.get("unfixable", [])
if unfixable:
    lines += [f"<details><summary>{len(unfixable)} finding(s) with no mechanical fix</summary>", "",
              "| code | path | why |", "|---|---|---|"]
    lines += [f"| {cell(u.get('code'), 10)} | `{cell(u.get('path'), 160)}` | {cell(u.get('reason'), 300)} |"
              for u in unfixable[:200]]
    lines += ["", "</details>", ""]
if patch:
    budget = 512 * 1024  # GitHub shows at most 1 MiB of summary per step
    if len(patch.encode()) > budget:
        lines += [f"The patch is {len(patch.encode()):,} bytes, too long for the summary: it is the `patch` "
                  "output of this step.", ""]
    else:
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", patch)), default=0))
        lines += ["Apply the text changes with `git apply` (save the block as `ckpt-guard-fix.patch`; "
                  "weight files are in the artifact):", "", fence + "diff", patch.rstrip("\n"), fence, ""]
summary = "\n".join(lines) + "\n"
# the patch holds the files' own bytes: no line of it may act as a workflow command in the log
token = uuid.uuid4().hex
print(f"::stop-commands::{token}\n{summary}::{token}::")
if os.environ.get("CG_SUMMARY") == "true" and os.environ.get("GITHUB_STEP_SUMMARY"):
    try:
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as out:
            out.write(summary)
    except OSError:
        print("::warning title=ckpt-guard fix::could not write the job summary; the plan is in the log above")

values = {"fixed": len(applied), "files": files, "patch": os.path.abspath(patch_path) if patch else "",
          "report": os.path.abspath(report_path), "artifact-dir": os.path.abspath(gathered)}
with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
    for name, value in values.items():
        delimiter = f"ghadelimiter_{uuid.uuid4()}"
        out.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
PY
status=$?
echo "exit-code=$([ "$status" -eq 0 ] && echo "$rc" || echo 2)" >> "$GITHUB_OUTPUT"
exit 0
