#!/usr/bin/env bash
# Install everything the test suite needs into .venv, then run the whole suite in two lanes: the
# fast lane (pure and in-process tests), then the system lane (real processes: esiwrap, trainers,
# Slurm, systemd, Chromium, Ray, the wheel, the docs build), each with its wall time
# (tests/lib/lanes.py).
# Usage: scripts/test.sh [--fast] [pytest args...]   (--fast: the fast lane alone)
set -euo pipefail
cd "$(dirname "$0")/.."
fast_only=0
if [ "${1:-}" = "--fast" ]; then
    fast_only=1
    shift
fi
python3 -m venv .venv
# torch first and pinned: the CPU wheel; anything unpinned could pull a multi-GB CUDA build
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
# verl as its users install it beside esiwrap (whose `verl` extra installs none): the newest verl
# checked, with what its trainer modules import (verl 0.9.1 declares them in its `verl-core` extra)
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test,verl,hf,lightning,docs]' \
    'verl==0.9.1' 'TransferQueue>=0.1.10' cachetools fastapi uvicorn
# systemd-analyze checks the shipped unit (tests/system/platforms/test_systemd_unit.py);
# tests/system/platforms/test_systemd_real.py runs the installed systemd as PID 1 of a private
# namespace (unshare, nsenter, setpriv, mount from util-linux); PID 1 of this machine need not be
# systemd. Chromium renders `esiwrap report --html` in tests/system/tools/test_timeline.py
# (headless, no network). tests/system/platforms/test_slurm_real.py starts a real Slurm (munged,
# slurmctld, slurmd from Debian, as plain processes; no systemd, no cgroups).
missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
{ command -v nsenter && command -v setpriv; } >/dev/null || missing+=(util-linux)
command -v mount >/dev/null || missing+=(mount)
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)  # the font the picture names first
# tests/lib/slowfs.py mounts a FUSE filesystem paced like network storage (fusepy needs libfuse2)
ldconfig -p | grep -q 'libfuse\.so\.2 ' || missing+=(libfuse2)
command -v slurmctld >/dev/null || missing+=(slurmctld)
command -v slurmd >/dev/null || missing+=(slurmd)
{ command -v sbatch && command -v squeue && command -v scontrol; } >/dev/null || missing+=(slurm-client)
command -v munged >/dev/null || missing+=(munge)
# tests/lib/faketime.py steps the wall clock of real processes: Debian's libfaketime (its
# thread-safe build), preloaded behind a shim it compiles at test time (gcc, libc6-dev's headers)
compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null || missing+=(libfaketime)
command -v gcc >/dev/null || missing+=(gcc)
[ -e /usr/include/dlfcn.h ] || missing+=(libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
.venv/bin/ruff check esiwrap tests examples benchmarks
.venv/bin/mypy

failed=0
lane() {  # NAME PYTEST-ARGS...: run one lane and say how long it took
    local name=$1 started=$SECONDS code=0 outcome=passed
    shift
    .venv/bin/pytest "$@" || code=$?
    case $code in
        0) ;;
        5) outcome="no tests (the arguments select none in this lane)" ;;
        *) outcome="FAILED (pytest exit $code)"; failed=1 ;;
    esac
    times+=("$name lane: $((SECONDS - started)) s, $outcome")
    echo "${times[-1]}"
}
times=()
# The fast lane's tests keep a CPU busy: one worker per core, each test handed out on its own.
lane fast -m "not system" -n auto "$@"
if [ "$fast_only" -eq 0 ]; then
    # Three workers, one test file each at a time: these tests mostly wait on real processes and
    # signals, so this cuts the wall time by more than half on 2 cores (files keep their shared
    # fixtures, e.g. Ray).
    lane system -m system -n 3 --dist loadfile "$@"
    printf '%s\n' "${times[@]}"
fi
exit "$failed"
