#!/usr/bin/env bash
# Install esiwrap with the demo trainer's needs into .venv, then run the tiny CPU trainer under
# esiwrap with a deadline a minute away. Run it twice: the second run resumes from the checkpoint.
# Usage: scripts/demo.sh [extra esiwrap options...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[demo]'
set +e
# --local-checkpoints-survive: the second run resumes on this machine, whose disk outlives the first
.venv/bin/esiwrap --deadline +60s --redundant-time 20 --save-duration 2 --final-margin 3 \
    --local-checkpoints-survive --log-format console "$@" -- \
    .venv/bin/python examples/tiny_trainer.py --ckpt-dir demo-checkpoints --step-seconds 1
code=$?
echo "esiwrap exited with $code (75: stopped after a completed checkpoint; run again to resume)"
exit "$code"
