#!/usr/bin/env bash
# esiwrap --restore '.../restore-from-tos.sh {path} {step}': the job's checkpoint (the one its
# state file or newest manifest names) back from TOS into the path verl wrote it to, with verl's
# tracker latest_checkpointed_iteration.txt beside it naming the step, as verl's
# `resume_mode=auto` looks for it. esiwrap runs it only when the checkpoint is not on this disk,
# verifies what came back, and retries or exits 66 when it is not right.
set -euo pipefail
path=$1
step=$2
: "${TOS_BUCKET:?set TOS_BUCKET}" "${TOS_ENDPOINT:?set TOS_ENDPOINT}"
prefix="s3://$TOS_BUCKET/${JOB:-grpo}"
aws() { "${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" "$@"; }

aws s3 cp --recursive --only-show-errors "$prefix/$(basename "$path")/" "$path/"
printf '%s' "$step" > "$(dirname "$path")/latest_checkpointed_iteration.txt"
echo "restore: step $step from $prefix into $path" >&2
