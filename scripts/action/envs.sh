#!/usr/bin/env bash
# The environments `parity-against:` and a convert step's `parity:` run in: which ones, where they live (under the
# runner's tool cache, CKPT_GUARD_HOME) and the key actions/cache keeps them by.  `ckpt-guard env install` builds
# them from the constraints inside the installed package (guard/envs/*.txt), so the key hashes those files, as
# installed (hashFiles() reads only the workspace), with the Python they are built for.
set -euo pipefail

names=()
[ "${CG_PARITY:-false}" = true ] && [ -n "${CG_CONVERT:-}" ] && names+=(tf4)
[ -n "${CG_PARITY_AGAINST:-}" ] && names+=("$CG_PARITY_AGAINST")
if [ "${#names[@]}" -eq 0 ]; then
  exit 0
fi
envs_dir=$("$CG_PYTHON" -c 'import guard.envs, os; print(os.path.dirname(guard.envs.__file__))')
python_version=$("$CG_PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
hash=$( (cd "$envs_dir" && sha256sum -- *.txt; echo "python $python_version") | sha256sum | cut -c1-16)
home="${CG_TOOL_CACHE:-${RUNNER_TEMP:?}}/ckpt-guard"
{
  echo "names=${names[*]}"
  echo "home=$home"
  echo "key=ckpt-guard-envs-${RUNNER_OS:-Linux}-$(IFS=-; echo "${names[*]}")-$hash"
} >> "$GITHUB_OUTPUT"
echo "ckpt-guard: environments ${names[*]} under $home (constraints $hash)"
