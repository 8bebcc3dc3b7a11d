#!/usr/bin/env bash
# The container's command: bring the job's last checkpoint back when this instance has none, then
# the unchanged training script under esiwrap. `exec`: esiwrap becomes the container's PID 1, so
# `docker stop` (the host unit's stop) is its SIGTERM, the checkpoint.
#
# esiwrap's settings come from the environment (ESIWRAP_<OPTION>, the unit's grpo.env); each
# completed checkpoint is uploaded to TOS before esiwrap exits 75.
set -euo pipefail
GRPO_DIR=${GRPO_DIR:-/opt/grpo}
CKPT_DIR=${CKPT_DIR:-/data/checkpoints/grpo}

"$GRPO_DIR/restore-from-tos.sh" "$CKPT_DIR"  # until `esiwrap --restore`: see the recipe page
exec esiwrap --upload "$GRPO_DIR/upload-to-tos.sh {path} {step}" -- \
    bash "$GRPO_DIR/run_qwen2-7b.sh" trainer.default_local_dir="$CKPT_DIR" "$@"
