#!/usr/bin/env bash
# esiwrap --upload '.../upload-to-tos.sh {path} {step} {manifest}': one verl checkpoint (the
# directory global_step_N) to TOS through its S3-compatible endpoint, then its esiwrap manifest,
# last: a manifest in the bucket means its checkpoint is all there (esiwrap --restore-manifests
# finds the job's checkpoint and state by it). Exit 0 only when both are up (esiwrap exits 75 only
# then).
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
manifest=$3
: "${TOS_BUCKET:?set TOS_BUCKET}" "${TOS_ENDPOINT:?set TOS_ENDPOINT}"
prefix="s3://$TOS_BUCKET/${JOB:-grpo}"
name=$(basename "$path")
aws() { "${AWS:-aws}" --endpoint-url "$TOS_ENDPOINT" "$@"; }

aws s3 cp --recursive --only-show-errors "$path" "$prefix/$name/"
aws s3 cp --only-show-errors "$manifest" "$prefix/manifests/$name.json"
echo "upload: step $step to $prefix/$name/" >&2
