#!/usr/bin/env bash
# Decide what to scan: every path, or only the models whose files the push / pull request changed.
# Writes a NUL-separated list of paths and sets the `list` output to its location.
set -euo pipefail

root="$RUNNER_TEMP/ckpt-guard"
list="$root/paths.list"
empty="$root/nothing-changed"
mkdir -p "$root" "$empty"
echo "list=$list" >> "$GITHUB_OUTPUT"

all() {
  [ -n "${1:-}" ] && echo "ckpt-guard: $1; scanning every path."
  "$CG_PYTHON" - "$list" <<'PY'
import os, sys
paths = [p.strip() for p in os.environ.get("CG_PATHS", ".").splitlines() if p.strip()] or ["."]
with open(sys.argv[1], "wb") as fh:
    fh.write(b"".join(os.fsencode(p) + b"\0" for p in paths))
PY
  exit 0
}

[ "$CG_CHANGED_ONLY" = true ] || all ""

# base, head (or "all: why" / "none: why") from the event payload; a garbage file means "all"
range=$("$CG_PYTHON" - <<'PY'
import json, os
name = os.environ.get("GITHUB_EVENT_NAME", "")
try:
    with open(os.environ["GITHUB_EVENT_PATH"], encoding="utf-8") as fh:
        event = json.load(fh)
    if not isinstance(event, dict):
        raise ValueError("not an object")
except (KeyError, OSError, ValueError) as exc:
    print(f"all: the event payload is unreadable ({type(exc).__name__})")
    raise SystemExit(0)
zero = "0" * 40
def sha(value):
    ok = isinstance(value, str) and len(value) in (40, 64) and all(c in "0123456789abcdef" for c in value)
    return value if ok else None
if name == "push":
    before, after = sha(event.get("before")), sha(event.get("after")) or sha(os.environ.get("GITHUB_SHA"))
    if event.get("deleted") is True or after == zero:
        print("none: the push deleted the branch")
    elif before is None or before == zero or after is None:
        print("all: a new branch (no previous commit to compare with)")
    else:
        print(f"{before} {after}")
elif name.startswith("pull_request"):
    pr = event.get("pull_request")
    pr = pr if isinstance(pr, dict) else {}
    base = sha((pr.get("base") or {}).get("sha")) if isinstance(pr.get("base"), dict) else None
    head = sha((pr.get("head") or {}).get("sha")) if isinstance(pr.get("head"), dict) else None
    print(f"{base} {head or 'HEAD'}" if base else "all: the pull request has no base commit")
else:
    print(f"all: {name or 'this'} event has no change set")
PY
) || all "the event payload could not be read"

case "$range" in
  all:*) all "${range#all: }" ;;
  none:*) echo "ckpt-guard: ${range#none: }; nothing to scan."; printf '%s\0' "$empty" > "$list"; exit 0 ;;
esac
base=${range% *}
head=${range#* }
for commit in "$base" "$head"; do
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    all "commit $commit is not in this clone (shallow checkout or force-push; fetch-depth: 0 fixes it)"
  fi
done

# a pull request with its base in this clone: the diff step compares each changed model with it
case "${GITHUB_EVENT_NAME:-}" in pull_request*) echo "base=$base" >> "$GITHUB_OUTPUT" ;; esac

changed="$root/changed.list"
git diff --name-only -z --no-ext-diff --diff-filter=ACMRT --relative "$base...$head" > "$changed" 2>/dev/null \
  || git diff --name-only -z --no-ext-diff --diff-filter=ACMRT --relative "$base..$head" > "$changed" \
  || all "git diff $base..$head failed"

"$CG_PYTHON" - "$changed" "$list" "$empty" <<'PY'
import os, re, sys
changed_file, list_file, empty = sys.argv[1:]
# the same selection as the pre-commit hook's `files:` pattern
pattern = re.compile(r"(\.(safetensors|bin|pt|pth|jit|ptl|pt2|pte|ckpt|msgpack|h5|hdf5|keras|gguf|onnx|npz|npy|tflite|ot|mlmodel|pdparams|caffemodel|distcp|nemo|engine|plan|llamafile|pb|index|data-[0-9]{5}-of-[0-9]{5})|\.index(\.[^./]+)?\.json|(^|/)(config|model_index)\.json|(^|/)(_METADATA|_CHECKPOINT_METADATA|manifest\.ocdbt)|(^|/)openvino_[^/]*\.xml)$", re.I)
roots = [os.path.normpath(p.strip()) for p in os.environ.get("CG_PATHS", ".").splitlines() if p.strip()] or ["."]
with open(changed_file, "rb") as fh:
    names = [os.fsdecode(n) for n in fh.read().split(b"\0") if n]

def inside(name: str) -> bool:
    return any(r == "." or name == r or name.startswith(r.rstrip("/") + "/") for r in roots)

picked: dict[str, str] = {}  # one file per directory: the scanner reads its siblings from disk
for name in names:
    if pattern.search(name) and inside(os.path.normpath(name)) and os.path.isfile(name):
        picked.setdefault(os.path.dirname(name), name)
print(f"ckpt-guard: {len(names)} changed file(s), {len(picked)} model director(y/ies) to scan.")
with open(list_file, "wb") as fh:
    for name in picked.values() or [empty]:
        fh.write(os.fsencode(name) + b"\0")
PY
