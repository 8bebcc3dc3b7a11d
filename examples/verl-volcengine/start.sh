#!/usr/bin/env bash
# The container's command: the unchanged training script under esiwrap. `exec`: esiwrap becomes
# the container's PID 1, so `docker stop` (the host unit's stop) is its SIGTERM, the checkpoint.
#
# Before the script starts, esiwrap brings the job's last checkpoint back from TOS when this
# instance does not have it (--restore; --restore-manifests finds it with no state file on the
# disk). Each completed checkpoint is uploaded to TOS, its manifest last, before esiwrap exits 75.
# esiwrap's other settings come from the environment (ESIWRAP_<OPTION>, the unit's grpo.env).
set -euo pipefail
GRPO_DIR=${GRPO_DIR:-/opt/grpo}
CKPT_DIR=${CKPT_DIR:-/data/checkpoints/grpo}
mkdir -p "$CKPT_DIR"  # a new instance's data disk: the state file (grpo.env) goes there too

exec esiwrap \
    --upload "$GRPO_DIR/upload-to-tos.sh {path} {step} {manifest}" \
    --restore "$GRPO_DIR/restore-from-tos.sh {path} {step}" \
    --restore-manifests "$GRPO_DIR/manifests-from-tos.sh {dir}" \
    -- bash "$GRPO_DIR/run_qwen2-7b.sh" trainer.default_local_dir="$CKPT_DIR" "$@"
