#!/usr/bin/env bash
# Convert the scanned models after a passing scan (`ckpt-guard convert`, bit-exact unless cast).
set -euo pipefail

out="$RUNNER_TEMP/ckpt-guard/converted"
mkdir -p "$out"
declare -A seen=()
args=(--to "$CG_CONVERT")
[ "$CG_PARITY" = true ] && args+=(--parity)
status=0
while IFS= read -r -d '' path; do
  [ -d "$path" ] || path=$(dirname "$path")
  dir=$(cd "$path" && pwd)
  [ -n "${seen[$dir]:-}" ] && continue
  seen[$dir]=1
  name=$(basename "$dir")
  n=1; target="$out/$name"
  while [ -e "$target" ]; do n=$((n + 1)); target="$out/$name-$n"; done
  "$CG_BIN" convert "$dir" "${args[@]}" --out "$target" || status=$?
done < "$CG_LIST"
echo "ckpt-guard: converted models are in $out"
exit "$status"
