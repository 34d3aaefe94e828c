#!/usr/bin/env bash
# `make bench-scale`: the bed at ten times the original workshop (tests/bench/scale.py): a manager
# that runs only the hub, and GPUHUB_SCALE_MACHINES (10) GPU machines of 5 simulated GPUs x 10
# slices, which get the stand-in server image (images/scale-server) instead of the single-user
# one. Prints figures; asserts nothing. Arguments go to tests/bench/scale.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
MACHINES=${GPUHUB_SCALE_MACHINES:-10}
export GPUHUB_BED_GPUS=5 GPUHUB_SLICES_PER_GPU=10 GPUHUB_SIMULATE_IF_NO_GPU=0
# the stock baseline reserves named slots (the original workshop's form): advertise them too
export GPUHUB_NAMED_SLOTS=NVIDIA-GPU
export GPUHUB_CONFIG=none
# the stand-in server (busybox) has no gpuhub-firewall: no firewall in the servers or the machines
export GPUHUB_EGRESS=off
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
trap 'bash tests/bed/bed.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/bed.sh up 0
. deploy/bootstrap.sh
bash tests/bench/scale-server.sh
# the GPU machines get (and join with) the stand-in as their single-user image
GPUHUB_SINGLEUSER_IMAGE=gpu-jupyterhub/scale-server:latest bash tests/bed/bed.sh workers "$MACHINES"
"$VENV/bin/python" -m tests.bench.scale "$@"
