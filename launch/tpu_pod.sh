#!/usr/bin/env bash
# Launch the main job on every worker of a Cloud TPU pod slice.
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a bash launch/tpu_pod.sh experiments/babyai.py \
#       --config.learner.mesh.fsdp=-1 --config.rollout.engine_dtype=bfloat16
#
# Every host runs the same command; --distributed calls jax.distributed.initialize(), which on
# TPU VMs discovers the coordinator and process ids itself. Process 0 writes checkpoints and logs
# to WORKDIR, which must be shared storage (a gs:// bucket or an NFS mount) for resume to work.
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}"
: "${ZONE:?set ZONE}"
CONFIG=${1:?usage: launch/tpu_pod.sh CONFIG [overrides...]}
shift
REPO_DIR=${REPO_DIR:-'~/agentrl-jax'}
WORKDIR=${WORKDIR:-"runs/$(basename "${CONFIG%.py}")"}
PROJECT_FLAG=()
[[ -n "${PROJECT:-}" ]] && PROJECT_FLAG=(--project "$PROJECT")

# 1. ship the code (idempotent) and set up every worker
gcloud compute tpus tpu-vm scp --recurse --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all \
  . "$TPU_NAME:$REPO_DIR"
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all \
  --command "cd $REPO_DIR && pip install -q 'jax[tpu]==0.10.2' && bash setup.sh --no-test"

# 2. run the job on all workers at once
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all \
  --command "cd $REPO_DIR && python launch/run.py --config $CONFIG --workdir $WORKDIR --distributed $*"
