#!/usr/bin/env bash
# `parity-against:` does each scanned model load right in that JAX stack? (`ckpt-guard parity --against`)
# The stack runs in the environment `ckpt-guard env install` builds (tunix, keras-hub and easydel as overlays on
# ckpt-guard's Python, its torch theirs; MaxText in a Python 3.12 venv; docs/jax.md), under CKPT_GUARD_HOME, which the action keeps
# across runs with actions/cache: a kept one is a no-op.  A check that cannot run for want of its environment is
# exit 2 with its one line, never a pass.
set -euo pipefail

stacks=$("$CG_PYTHON" -m guard.targets against)  # the installed package's table of targets
case $'\n'"$stacks"$'\n' in
  *$'\n'"$CG_PARITY_AGAINST"$'\n'*) ;;
  *) echo "::error title=ckpt-guard::parity-against must be ${stacks//$'\n'/, } or empty"; exit 2 ;;
esac
bash "$(dirname "$0")/env-install.sh" "$CG_PARITY_AGAINST" "parity-against $CG_PARITY_AGAINST" || exit 2
declare -A seen=()
status=0
while IFS= read -r -d '' path; do
  [ -d "$path" ] || path=$(dirname "$path")
  dir=$(cd "$path" && pwd)
  [ -n "${seen[$dir]:-}" ] && continue
  seen[$dir]=1
  [ -f "$dir/config.json" ] || continue  # parity needs a transformers model
  code=0
  "$CG_BIN" parity "$dir" --against "$CG_PARITY_AGAINST" || code=$?
  [ "$code" -gt "$status" ] && status=$code
done < "$CG_LIST"
exit "$status"
