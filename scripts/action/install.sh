#!/usr/bin/env bash
# Install ckpt-guard into its own venv under $RUNNER_TEMP, with only the extras the inputs need.
set -euo pipefail

fail() { echo "::error title=ckpt-guard::$1"; exit 2; }

python=python3
command -v "$python" >/dev/null 2>&1 || python=python
# the table of targets of the action's own tree (guard/targets): the stacks parity-against takes and what each
# needs installed beside ckpt-guard; sys.path[0] is that tree, not the working directory
targets() {
  "$python" -c 'import sys; sys.path[0] = sys.argv.pop(1); from guard.targets.__main__ import main; sys.exit(main(sys.argv[1:]))' \
    "${GITHUB_ACTION_PATH:?GITHUB_ACTION_PATH is not set}" "$@"
}

case "$CG_FAIL_ON" in error|warning|note|never) ;; *) fail "fail-on must be error, warning, note or never" ;; esac
for pair in "values=$CG_VALUES" "parity=$CG_PARITY" "changed-only=$CG_CHANGED_ONLY" \
            "summary=$CG_SUMMARY" "annotate=$CG_ANNOTATE" "fix=${CG_FIX:-false}" \
            "report-existing=${CG_REPORT_EXISTING:-false}"; do
  case "${pair#*=}" in true|false) ;; *) fail "${pair%%=*} must be true or false" ;; esac
done
case "$CG_CONVERT" in ""|flax|torch) ;; *) fail "convert must be flax, torch or empty" ;; esac
if [ "$CG_PARITY" = true ] && [ -z "$CG_CONVERT" ]; then fail "parity needs convert"; fi
stacks=$(targets against) || fail "the action's table of targets did not load with $python"
case $'\n'"$stacks"$'\n' in
  *$'\n'"${CG_PARITY_AGAINST:-}"$'\n'*) ;;
  *) [ -z "${CG_PARITY_AGAINST:-}" ] || fail "parity-against must be ${stacks//$'\n'/, } or empty" ;;
esac

extras=()
# fix writes weights through guard.write and value-checks its casts: both need numpy and ml_dtypes
if [ "$CG_VALUES" = true ] || [ "${CG_FIX:-false}" = true ]; then extras+=(values); fi
[ -n "$CG_CONVERT" ] && extras+=(convert)
[ "$CG_PARITY" = true ] && extras+=(parity)
# parity --against: PyTorch's side (transformers' forward) and JAX, and what the stack's row adds (maxtext: the
# orbax extra, for the conversion it reads; keras-hub: keras and sentencepiece beside its folder)
pins=()
if [ -n "${CG_PARITY_AGAINST:-}" ]; then
  while read -r kind what; do
    case "$kind" in
      extra) [[ " ${extras[*]:-} " == *" $what "* ]] || extras+=("$what") ;;
      pip) pins+=("$what") ;;
    esac
  done < <(targets needs "$CG_PARITY_AGAINST")
fi
suffix=""
if [ "${#extras[@]}" -gt 0 ]; then suffix="[$(IFS=,; echo "${extras[*]}")]"; fi

if [ -n "$CG_VERSION" ]; then
  spec="ckpt-guard${suffix}==${CG_VERSION#v}"
else
  spec="${GITHUB_ACTION_PATH}${suffix}"
fi

root="${RUNNER_TEMP:?RUNNER_TEMP is not set}/ckpt-guard"
venv="$root/venv"
mkdir -p "$root"
"$python" -m venv "$venv"
bindir="$venv/bin"
[ -d "$bindir" ] || bindir="$venv/Scripts"  # Windows
# parity's Flax side runs in the transformers-4 environment `ckpt-guard env install tf4` builds (convert.sh);
# the stacks in theirs (against.sh)
"$bindir/python" -m pip install --quiet --disable-pip-version-check "$spec" ${pins[@]+"${pins[@]}"}

{
  echo "bin=$bindir/ckpt-guard"
  echo "python=$bindir/python"
} >> "$GITHUB_OUTPUT"
"$bindir/ckpt-guard" --version
