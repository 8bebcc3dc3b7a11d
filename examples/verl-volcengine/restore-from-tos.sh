#!/usr/bin/env bash
# Until `esiwrap --restore` (see the recipe page): the newest checkpoint upload-to-tos.sh put in
# TOS, back into verl's trainer.default_local_dir (the argument), as verl's `resume_mode=auto`
# looks for it: global_step_N and latest_checkpointed_iteration.txt naming N. Nothing is done when
# the directory has a checkpoint already (the same instance, started again). What it does, or why
# the job starts from scratch, is said on stderr.
set -euo pipefail
dir=$1
: "${TOS_BUCKET:?set TOS_BUCKET}" "${TOS_ENDPOINT:?set TOS_ENDPOINT}"
prefix="s3://$TOS_BUCKET/${JOB:-grpo}"
aws() { "${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" "$@"; }

if [ -e "$dir/latest_checkpointed_iteration.txt" ]; then
    echo "restore: $dir has checkpoint $(cat "$dir/latest_checkpointed_iteration.txt") already" >&2
    exit 0
fi
if ! step=$(aws s3 cp --only-show-errors "$prefix/latest_checkpointed_iteration.txt" -); then
    echo "restore: no checkpoint in $prefix (above: why); the job starts from scratch" >&2
    exit 0
fi
mkdir -p "$dir"
aws s3 cp --recursive --only-show-errors "$prefix/global_step_$step/" "$dir/global_step_$step/"
printf '%s' "$step" > "$dir/latest_checkpointed_iteration.txt"
echo "restore: checkpoint $step from $prefix into $dir" >&2
