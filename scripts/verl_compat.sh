#!/usr/bin/env bash
# verl compatibility of esiwrap's zero-code hook: one Markdown table row per verl version.
#
#   scripts/verl_compat.sh [--reuse] [--venvs DIR] [--out DIR] [--timeout SECONDS] [VERSION ...]
#   (--reuse-venvs is --reuse)
#
# For each version (default: every one below) a venv of its own, DIR/<version> (default
# /tmp/verl-compat/venvs): `torch==2.13.0` first (anything that pulls an unpinned torch downloads a
# CUDA build), then `verl==<version>` with the pins that version needs on today's PyPI (see
# pins_for), installed as a user has it: nothing of esiwrap's extras. --reuse uses a venv that is
# already there (its Python runs) as it is, without pip. esiwrap comes from this checkout
# (PYTHONPATH), in the venv's Python and in every process of the check. Then
# tests/lib/verl_compat_row.py runs the zero-code check (tests/lib/verl_zero_code.py) through each loop
# the version has and prints the row; each run's details go to OUT/<version>.json (default
# /tmp/verl-compat). Exit 1 when a check failed. docs/running/verl.md holds the table.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
VENVS=/tmp/verl-compat/venvs
OUT=/tmp/verl-compat
TIMEOUT=300
REUSE=0
PYTHON="${PYTHON:-python3}"
VERSIONS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --reuse|--reuse-venvs) REUSE=1 ;;
        --venvs) VENVS=$2; shift ;;
        --out) OUT=$2; shift ;;
        --timeout) TIMEOUT=$2; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        -*) echo "verl_compat.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) VERSIONS+=("$1") ;;
    esac
    shift
done
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(0.4.1 0.5.0 0.6.1 0.7.1 0.8.0 0.9.0 0.9.1)

# What each verl needs beside it on today's PyPI (torch 2.13.0 CPU, Python 3.11):
#   0.4.x        `import verl` needs pkg_resources: setuptools<81; building an actor, transformers<5
#   0.5.x, 0.6.x verl pins numpy<2 and pyarrow 26 wants numpy>=2: pyarrow<26; transformers<5
#   0.7.x        pyarrow<26
#   0.8.x        pyarrow<26; cachetools fastapi uvicorn (its trainer module imports them); TransferQueue
#                0.1.6 to run main_ppo_sync
#   0.9.x        TransferQueue cachetools fastapi uvicorn (0.9.1 declares them in its `verl-core` extra)
pins_for() {
    case "$1" in
        0.4.*) echo "setuptools>=77.0.3,<81 transformers<5" ;;
        0.5.*|0.6.*) echo "pyarrow<26 transformers<5" ;;
        0.7.*) echo "pyarrow<26" ;;
        0.8.*) echo "pyarrow<26 cachetools fastapi uvicorn TransferQueue==0.1.6" ;;
        *) echo "TransferQueue>=0.1.10 cachetools fastapi uvicorn" ;;
    esac
}

venv_for() {  # VERSION: the venv's Python, built unless --reuse finds one
    local v=$1 dir="$VENVS/$1" log="$OUT/$1-install.log"
    if [ "$REUSE" = 1 ] && "$dir/bin/python" -c 'import verl' >/dev/null 2>&1; then
        echo "$dir/bin/python"
        return 0
    fi
    rm -rf "$dir"
    # shellcheck disable=SC2046 # the pins are words
    "$PYTHON" -m venv "$dir" >"$log" 2>&1 &&
        "$dir/bin/pip" install --quiet torch==2.13.0 >>"$log" 2>&1 &&
        "$dir/bin/pip" install --quiet "verl==$v" $(pins_for "$v") psutil structlog >>"$log" 2>&1 ||
        return 1
    echo "$dir/bin/python"
}

mkdir -p "$OUT" "$VENVS"
status=0
(cd "$REPO" && PYTHONPATH="$REPO" "$PYTHON" -c 'import sys; sys.path.insert(0, "tests"); import verl_compat_row as r; print(r.HEADER)')
for v in "${VERSIONS[@]}"; do
    if ! python=$(venv_for "$v"); then
        echo "| $v | install failed: $OUT/$v-install.log | | | | | | |"
        status=1
        continue
    fi
    (cd /tmp && PYTHONPATH="$REPO" "$python" "$REPO/tests/lib/verl_compat_row.py" --pins "$(pins_for "$v")" \
        --timeout "$TIMEOUT" --json "$OUT/$v.json" 2>"$OUT/$v.stderr") || status=1
done
exit "$status"
