#!/usr/bin/env bash
# Convert the scanned models after a passing scan (`ckpt-guard convert`, from the conversion issue).
set -euo pipefail

out="$RUNNER_TEMP/ckpt-guard/converted"
paths=()
while IFS= read -r -d '' p; do paths+=("$p"); done < "$CG_LIST"
args=(--to "$CG_CONVERT")
[ "$CG_PARITY" = true ] && args+=(--parity)
for path in "${paths[@]}"; do
  [ -d "$path" ] || path=$(dirname "$path")
  "$CG_BIN" convert "$path" "${args[@]}" --output "$out/$(basename "$(cd "$path" && pwd)")"
done
echo "ckpt-guard: converted models are in $out"
