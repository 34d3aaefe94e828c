#!/usr/bin/env bash
# `make bench`: GPUSwarmSpawner against stock dockerspawner.SwarmSpawner and the bare Swarm
# operation, on the multi-node test bed. Prints figures; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# the stock baseline reserves named slots (the original workshop's form): advertise them too
export GPUHUB_NAMED_SLOTS=NVIDIA-GPU
trap 'bash tests/bed/workers.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/up.sh
.venv/bin/python -m tests.bench.bench "$@"
