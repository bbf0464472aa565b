#!/usr/bin/env bash
# usage: env-install.sh NAME LABEL: `ckpt-guard env install NAME` (a no-op for one actions/cache kept), its output
# shown; one that cannot be built is an error annotation with ckpt-guard's one line, and exit 2, never a pass.
set -euo pipefail
code=0
said=$("$CG_BIN" env install "$1" 2>&1) || code=$?
echo "$said"
if [ "$code" -ne 0 ]; then
  line=""
  while IFS= read -r one; do
    case "$one" in "ckpt-guard: error: "*) line=${one#ckpt-guard: error: } ;; esac
  done <<< "$said"
  echo "::error title=ckpt-guard::$2: $line"
  exit 2
fi
