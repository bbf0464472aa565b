#!/usr/bin/env bash
# Scan once to JSON, then render annotations, the job summary and SARIF from that JSON.
# Never fails itself on findings: it records the exit code for the action's last step,
# so every output is set even when the job is about to fail.
set -uo pipefail

root="$RUNNER_TEMP/ckpt-guard"
report="$root/report.json"
rm -f "$report"

paths=()
while IFS= read -r -d '' p; do paths+=("$p"); done < "$CG_LIST"

args=(scan --format json --output "$report" --no-summary --fail-on "$CG_FAIL_ON")
[ -n "$CG_EXPECT" ] && args+=(--expect "$CG_EXPECT")
for target in ${CG_TARGETS//,/ }; do args+=(--target "$target"); done
[ "$CG_VALUES" = true ] && args+=(--values)
# nothing changed: select.sh lists its empty folder, which is no gate pointed at the wrong folder (CG010)
[ "${#paths[@]}" = 1 ] && [ "${paths[0]}" = "$root/nothing-changed" ] && args+=(--ignore CG010)

"$CG_BIN" "${args[@]}" -- "${paths[@]}"
rc=$?
if [ "$rc" -gt 1 ] || [ ! -s "$report" ]; then
  echo "::error title=ckpt-guard::the scan could not run (exit $rc); see the log above"
  echo "exit-code=2" >> "$GITHUB_OUTPUT"
  exit 0
fi

# On a pull request compared with its base (the diff step), annotations, outputs and the verdict
# cover only the findings it introduces, unless report-existing; SARIF always holds every finding
# (code scanning tells new alerts from old ones by their fingerprints).
verdict="$report"
if [ -n "${CG_DIFF_REPORT:-}" ] && [ -s "$CG_DIFF_REPORT" ] && [ "${CG_REPORT_EXISTING:-false}" != true ]; then
  verdict="$CG_DIFF_REPORT"
  rc="${CG_DIFF_EXIT:-$rc}"
  echo "ckpt-guard: the verdict covers the ${CG_DIFF_INTRODUCED:-0} finding(s) this pull request introduces" \
       "(report-existing: true judges the whole snapshot)."
fi

# render: `report` exits 1 when the result fails the policy, which is not an error here
render() { "$CG_BIN" report "$report" "$@"; [ $? -le 1 ]; }
render_verdict() { "$CG_BIN" report "$verdict" "$@"; [ $? -le 1 ]; }

if [ "$CG_ANNOTATE" = true ]; then
  render_verdict --format github || echo "::warning title=ckpt-guard::could not render annotations"
fi

"$CG_PYTHON" - "$report" <<'PY'
import json, sys
findings = json.load(open(sys.argv[1], encoding="utf-8"))["findings"]
pointers = sorted({f["path"] for f in findings if f["code"] == "CG002"})
if pointers:
    print(f"::warning title=ckpt-guard%3A Git LFS pointers::{len(pointers)} file(s) are Git LFS pointers, "
          "not weights: the checkout did not fetch LFS objects. Set `lfs: true` on actions/checkout "
          "(or run `git lfs pull`) before this step.")
PY

if [ "$CG_SUMMARY" = true ] && [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  # the pull request's diff first (its findings introduced and resolved); the snapshot's report
  # where it is the verdict (no base to compare with, or report-existing)
  parts=()
  [ -n "${CG_DIFF_SUMMARY:-}" ] && [ -s "$CG_DIFF_SUMMARY" ] && parts+=("$CG_DIFF_SUMMARY")
  if [ "$verdict" = "$report" ]; then
    render --format markdown --output "$root/summary.md" && parts+=("$root/summary.md") || parts+=("")
  fi
  if [ "${#parts[@]}" -eq 0 ] || ! cat "${parts[@]}" >> "$GITHUB_STEP_SUMMARY" 2>/dev/null; then
    echo "::warning title=ckpt-guard::could not write the job summary; the findings are in the log and in $report"
  fi
fi

sarif=""
if [ -n "$CG_SARIF_FILE" ]; then
  mkdir -p "$(dirname "$CG_SARIF_FILE")"
  if render --format sarif --output "$CG_SARIF_FILE"; then
    sarif="$(cd "$(dirname "$CG_SARIF_FILE")" && pwd)/$(basename "$CG_SARIF_FILE")"
  else
    echo "::error title=ckpt-guard::could not write SARIF to the sarif-file path"
    rc=2
  fi
fi

"$CG_PYTHON" - "$report" "$sarif" "$rc" "$verdict" <<'PY'
import json, os, sys, uuid
report, sarif, rc, verdict = sys.argv[1:]
summary = json.load(open(verdict, encoding="utf-8"))["summary"]
values = {"findings": summary["findings"], "errors": summary["errors"], "warnings": summary["warnings"],
          "report": os.path.abspath(report), "sarif-file": sarif, "exit-code": rc}
with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
    for name, value in values.items():
        delimiter = f"ghadelimiter_{uuid.uuid4()}"  # never a line of a value (paths may hold newlines)
        out.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
PY
echo "ckpt-guard: JSON report with all findings: $report"
