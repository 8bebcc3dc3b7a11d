#!/usr/bin/env bash
# esiwrap --restore-manifests '.../manifests-from-tos.sh {dir}': the job's manifests (one per
# uploaded checkpoint, upload-to-tos.sh copies each after its checkpoint) into the empty directory
# esiwrap gives. esiwrap takes the newest complete one: its checkpoint is the one to restore, its
# state the job's. None at all: the job's first run.
set -euo pipefail
dir=$1
: "${TOS_BUCKET:?set TOS_BUCKET}" "${TOS_ENDPOINT:?set TOS_ENDPOINT}"
"${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" s3 cp --recursive --only-show-errors \
    "s3://$TOS_BUCKET/${JOB:-grpo}/manifests/" "$dir/"
