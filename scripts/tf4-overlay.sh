#!/usr/bin/env bash
# Builds .venv-tf4, the transformers-4 environment, as an overlay on the development venv.
#
# constraints-tf4.txt differs from constraints.txt only in the transformers line and what moves with it
# (huggingface_hub, tokenizers, diffusers).  A full second venv repeated several GB of identical wheels
# (torch, jax, tensorflow-cpu, ...), enough to fill a CI disk.  The overlay holds only the packages whose
# pins differ; a .pth file then adds the development venv's site-packages behind its own, so what the
# overlay holds comes first on sys.path and in importlib.metadata, and everything else is shared.
#
# usage: scripts/tf4-overlay.sh PYTHON MAIN_VENV OVERLAY_VENV
set -euo pipefail
python=$1
main=$2
overlay=$3

# the pins constraints-tf4.txt has and constraints.txt has not: what the overlay installs
differ=$(comm -13 <(grep '==' constraints.txt | sort) <(grep '==' constraints-tf4.txt | sort))
if [ -z "$differ" ]; then
    echo "constraints-tf4.txt pins nothing that constraints.txt does not" >&2
    exit 1
fi

rm -rf "$overlay"
"$python" -m venv "$overlay"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
main_site=$(cd "$(purelib "$main/bin/python")" && pwd -P)
overlay_site=$(purelib "$overlay/bin/python")
# shellcheck disable=SC2086  # one requirement per word
"$overlay/bin/python" -m pip install -q --disable-pip-version-check --no-deps $differ
# addsitedir, not a bare path line: the main venv's own .pth files (the editable install of this tree)
# are read too.  The name sorts last, after the overlay's own .pth files.
printf 'import site; site.addsitedir(%s)\n' "'$main_site'" > "$overlay_site/zz-ckpt-guard-main-venv.pth"
# the console script, as an install would write it, bound to the overlay's interpreter
overlay_bin=$(cd "$overlay/bin" && pwd)
printf '#!%s\nimport sys\nfrom guard.cli import main\nsys.exit(main())\n' "$overlay_bin/python" > "$overlay_bin/ckpt-guard"
chmod +x "$overlay_bin/ckpt-guard"

# the overlay's transformers is the one imported, and its version is the one metadata reports
"$overlay/bin/python" - <<'EOF'
import importlib.metadata, sys
import transformers
version = importlib.metadata.version("transformers")
assert version.startswith("4.") and transformers.__version__ == version, (version, transformers.__version__)
assert transformers.__file__.startswith(sys.prefix), transformers.__file__
print(f"{sys.prefix}: transformers {version} over the development venv")
EOF
