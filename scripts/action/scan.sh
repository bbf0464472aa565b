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

"$CG_BIN" "${args[@]}" -- "${paths[@]}"
rc=$?
if [ "$rc" -gt 1 ] || [ ! -s "$report" ]; then
  echo "::error title=ckpt-guard::the scan could not run (exit $rc); see the log above"
  echo "exit-code=2" >> "$GITHUB_OUTPUT"
  exit 0
fi

# render: `report` exits 1 when the result fails the policy, which is not an error here
render() { "$CG_BIN" report "$report" "$@"; [ $? -le 1 ]; }

if [ "$CG_ANNOTATE" = true ]; then
  render --format github || echo "::warning title=ckpt-guard::could not render annotations"
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
  if ! render --format markdown --output "$root/summary.md" \
     || ! cat "$root/summary.md" >> "$GITHUB_STEP_SUMMARY" 2>/dev/null; then
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

"$CG_PYTHON" - "$report" "$sarif" "$rc" <<'PY'
import json, os, sys, uuid
report, sarif, rc = sys.argv[1:]
summary = json.load(open(report, encoding="utf-8"))["summary"]
values = {"findings": summary["findings"], "errors": summary["errors"], "warnings": summary["warnings"],
          "report": os.path.abspath(report), "sarif-file": sarif, "exit-code": rc}
with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as out:
    for name, value in values.items():
        delimiter = f"ghadelimiter_{uuid.uuid4()}"  # never a line of a value (paths may hold newlines)
        out.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
PY
echo "ckpt-guard: JSON report with all findings: $report"
