#!/usr/bin/env bash
# On a pull request: compare each changed model with the pull request's base commit (diff.py).
# Never fails the job itself: without its outputs the scan step judges the whole snapshot.
set -uo pipefail

root="$RUNNER_TEMP/ckpt-guard/diff"
rm -rf "$root"
mkdir -p "$root"
"$CG_PYTHON" "$GITHUB_ACTION_PATH/scripts/action/diff.py" "$CG_LIST" "$CG_BASE" "$root" || true
