#!/usr/bin/env bash
# esiwrap --upload '.../upload-to-tos.sh {path} {step}': one verl checkpoint (the directory
# global_step_N) to TOS through its S3-compatible endpoint, then the step in
# latest_checkpointed_iteration.txt beside it, written last: a restore never finds a step whose
# files are not all there. Exit 0 only when both are up (esiwrap exits 75 only then).
#
#   TOS_BUCKET    the bucket (its region's endpoint below)
#   TOS_ENDPOINT  https://tos-s3-<region>.ivolces.com from an ECS instance in the region (private
#                 network), https://tos-s3-<region>.volces.com from elsewhere
#   JOB           the folder of this job in the bucket (default: grpo)
#   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: a Volcengine access key allowed to write the bucket;
#   AWS_CONFIG_FILE: tos-aws-config (virtual-hosted addressing, which TOS requires)
#   AWS           the aws executable (default: aws)
set -euo pipefail
path=$1
step=$2
: "${TOS_BUCKET:?set TOS_BUCKET}" "${TOS_ENDPOINT:?set TOS_ENDPOINT}"
prefix="s3://$TOS_BUCKET/${JOB:-grpo}"

"${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" s3 cp --recursive --only-show-errors \
    "$path" "$prefix/$(basename "$path")/"
printf '%s' "$step" | "${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" s3 cp --only-show-errors \
    - "$prefix/latest_checkpointed_iteration.txt"
