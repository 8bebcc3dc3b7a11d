#!/usr/bin/env bash
# Install esiwrap with the demo trainer's needs into .venv, then run the tiny CPU trainer under
# esiwrap with a deadline a minute away. Run it twice: the second run resumes from the checkpoint,
# and esiwrap checks that it did (`resumed`, from the state file next to the checkpoints).
# Usage: scripts/demo.sh [extra esiwrap options...]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[demo]'
mkdir -p demo-checkpoints  # the checkpoint, esiwrap's state file and its log live together
set +e
# --local-checkpoints-survive: the second run resumes on this machine, whose disk outlives the first
# --state-file: the job's memory across runs (measured saves, the last checkpoint: `resumed`)
.venv/bin/esiwrap --deadline +60s --redundant-time 20 --save-duration 2 --final-margin 3 \
    --local-checkpoints-survive --state-file demo-checkpoints/esiwrap-state.json \
    --log-file demo-checkpoints/esiwrap.jsonl --log-format console "$@" -- \
    .venv/bin/python examples/tiny_trainer.py --ckpt-dir demo-checkpoints --step-seconds 1
code=$?
set -e
echo
.venv/bin/esiwrap report --last demo-checkpoints/esiwrap.jsonl | sed -n '1,/^  at risk/p'
echo
echo "esiwrap exited with $code (75: stopped after a completed checkpoint; run again to resume)."
echo "Every run so far, and a picture: .venv/bin/esiwrap report demo-checkpoints/esiwrap.jsonl --html demo.html"
exit "$code"
