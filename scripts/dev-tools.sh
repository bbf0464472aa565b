#!/usr/bin/env bash
# The system tools the test suite drives for real, from Debian's packages when missing:
# git-lfs (the action's pull-request diff reads LFS-stored base revisions, tests/test_action.py)
# and PostgreSQL (the job-queue tests start a real server, tests/hub_postgres.py).
# `make test` runs this; it needs root or sudo only when something is missing.
set -euo pipefail

missing=()
git lfs version >/dev/null 2>&1 || missing+=(git-lfs)
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "make test needs ${missing[*]}: install them with your system's package manager" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "make test needs ${missing[*]} (apt-get install ${missing[*]}, as root)" >&2; exit 1; }
    sudo="sudo"
fi
echo "installing ${missing[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
