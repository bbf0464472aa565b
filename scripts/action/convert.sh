#!/usr/bin/env bash
# Convert the scanned models after a passing scan (`ckpt-guard convert`, bit-exact unless cast).
set -euo pipefail

out="$RUNNER_TEMP/ckpt-guard/converted"
mkdir -p "$out"
declare -A seen=()
args=(--to "$CG_CONVERT")
if [ "$CG_PARITY" = true ]; then
  # parity's Flax side: transformers 4 (5 removed the Flax models), in the environment `ckpt-guard env install tf4`
  # builds under CKPT_GUARD_HOME (kept by actions/cache); one that cannot be built is exit 2, never a pass
  bash "$(dirname "$0")/env-install.sh" tf4 parity || exit 2
  args+=(--parity)
fi
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
