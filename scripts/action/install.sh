#!/usr/bin/env bash
# Install ckpt-guard into its own venv under $RUNNER_TEMP, with only the extras the inputs need.
set -euo pipefail

fail() { echo "::error title=ckpt-guard::$1"; exit 2; }

case "$CG_FAIL_ON" in error|warning|note|never) ;; *) fail "fail-on must be error, warning, note or never" ;; esac
for pair in "values=$CG_VALUES" "parity=$CG_PARITY" "changed-only=$CG_CHANGED_ONLY" \
            "summary=$CG_SUMMARY" "annotate=$CG_ANNOTATE" "fix=${CG_FIX:-false}" \
            "report-existing=${CG_REPORT_EXISTING:-false}"; do
  case "${pair#*=}" in true|false) ;; *) fail "${pair%%=*} must be true or false" ;; esac
done
case "$CG_CONVERT" in ""|flax|torch) ;; *) fail "convert must be flax, torch or empty" ;; esac
if [ "$CG_PARITY" = true ] && [ -z "$CG_CONVERT" ]; then fail "parity needs convert"; fi
case "${CG_PARITY_AGAINST:-}" in
  ""|tunix|keras-hub|easydel|maxtext) ;;
  *) fail "parity-against must be tunix, keras-hub, easydel, maxtext or empty" ;;
esac

extras=()
# fix writes weights through guard.write and value-checks its casts: both need numpy and ml_dtypes
if [ "$CG_VALUES" = true ] || [ "${CG_FIX:-false}" = true ]; then extras+=(values); fi
[ -n "$CG_CONVERT" ] && extras+=(convert)
[ "$CG_PARITY" = true ] && extras+=(parity)
# parity --against: PyTorch's side (transformers' forward) and JAX
[ -n "${CG_PARITY_AGAINST:-}" ] && [ "$CG_PARITY" != true ] && extras+=(parity)
# maxtext: the checkpoint is converted first, here, into Orbax's OCDBT (tensorstore writes it)
[ "${CG_PARITY_AGAINST:-}" = maxtext ] && extras+=(orbax)
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
python=python3
command -v "$python" >/dev/null 2>&1 || python=python
"$python" -m venv "$venv"
bindir="$venv/bin"
[ -d "$bindir" ] || bindir="$venv/Scripts"  # Windows
# parity's Flax side runs in the transformers-4 environment `ckpt-guard env install tf4` builds (convert.sh);
# keras-hub runs beside this venv (installed alone, --no-deps: its tensorflow-text would pull a second
# TensorFlow): the rest of what it imports comes from here
pins=()
[ "${CG_PARITY_AGAINST:-}" = keras-hub ] && pins+=("keras>=3.15" sentencepiece)
"$bindir/python" -m pip install --quiet --disable-pip-version-check "$spec" ${pins[@]+"${pins[@]}"}

{
  echo "bin=$bindir/ckpt-guard"
  echo "python=$bindir/python"
} >> "$GITHUB_OUTPUT"
"$bindir/ckpt-guard" --version
