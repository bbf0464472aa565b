#!/usr/bin/env bash
# `parity-against:` does each scanned model load right in that JAX stack? (`ckpt-guard parity --against`)
# The stack gets the environment docs/jax.md names: keras-hub beside ckpt-guard, tunix and easydel in venvs of
# their own (google-tunix 0.1.7 pins safetensors < 0.8; easydel 0.3 pins jax ~= 0.9), MaxText in a Python 3.12
# venv (it needs Python >= 3.12; ckpt-guard converts the checkpoint first, in this Python, as `convert --to maxtext`).
set -euo pipefail

# MaxText's venv: kept when it already holds maxtext 0.2.5 (a self-hosted runner's earlier run, a restored cache);
# else built from the first Python >= 3.12 found, pinned by the constraints its tests ran with (~12 min uncached)
maxtext_venv() {
  local venv="$1" constraints="${GITHUB_ACTION_PATH:-.}/constraints-maxtext.txt" candidate python=""
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c \
      'import importlib.metadata as m, sys; sys.exit(m.version("maxtext") != "0.2.5")' >/dev/null 2>&1; then
    return 0
  fi
  for candidate in python3.12 python3.13 python3 python; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      python=$candidate
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "::error title=ckpt-guard::parity-against maxtext needs Python >= 3.12 on the runner (actions/setup-python)"
    exit 2
  fi
  local pins=()
  [ -f "$constraints" ] && pins=(-c "$constraints")
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ${pins[@]+"${pins[@]}"} "maxtext[tpu]==0.2.5"
}

root="$RUNNER_TEMP/ckpt-guard"
args=(--against "$CG_PARITY_AGAINST")
case "$CG_PARITY_AGAINST" in
  keras-hub)
    "$CG_PYTHON" -m pip install --quiet --disable-pip-version-check "keras-hub==0.32.0" ;;
  tunix)
    python=python3
    command -v "$python" >/dev/null 2>&1 || python=python
    "$python" -m venv "$root/tunix"
    "$root/tunix/bin/python" -m pip install --quiet --disable-pip-version-check \
      --extra-index-url https://download.pytorch.org/whl/cpu \
      "google-tunix==0.1.7" "jax==0.10.2" "flax==0.12.8" "torch==2.13.0"
    args+=(--against-python "$root/tunix/bin/python") ;;
  easydel)
    python=python3
    command -v "$python" >/dev/null 2>&1 || python=python
    "$python" -m venv "$root/easydel"
    "$root/easydel/bin/python" -m pip install --quiet --disable-pip-version-check \
      --extra-index-url https://download.pytorch.org/whl/cpu "easydel==0.3.0" "Pillow" "torch==2.13.0"
    args+=(--against-python "$root/easydel/bin/python") ;;
  maxtext)
    maxtext_venv "$root/maxtext"
    args+=(--against-python "$root/maxtext/bin/python") ;;
  *) echo "::error title=ckpt-guard::parity-against must be tunix, keras-hub, easydel, maxtext or empty"; exit 2 ;;
esac
declare -A seen=()
status=0
while IFS= read -r -d '' path; do
  [ -d "$path" ] || path=$(dirname "$path")
  dir=$(cd "$path" && pwd)
  [ -n "${seen[$dir]:-}" ] && continue
  seen[$dir]=1
  [ -f "$dir/config.json" ] || continue  # parity needs a transformers model
  code=0
  "$CG_BIN" parity "$dir" "${args[@]}" || code=$?
  [ "$code" -gt "$status" ] && status=$code
done < "$CG_LIST"
exit "$status"
