#!/usr/bin/env bash
# `make bench`: GPUSwarmSpawner against stock dockerspawner.SwarmSpawner and the bare Swarm
# operation, on the multi-node test bed (tests/bed/bed.sh: its manager is an engine of its own,
# never this machine's); then the GPU guard's CPU per round (tests/bench/guard_cpu.py) and the
# dashboard with 500 participants' data (tests/bench/dashboard.py), which run in-process and need
# no bed: `--only guard` and `--only dashboard` run them alone. Prints figures; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ " $* " == *" --only guard "* || " $* " == *" --only=guard "* ]]; then
  exec .venv/bin/python -m tests.bench.guard_cpu
fi
if [[ " $* " == *" --only dashboard "* || " $* " == *" --only=dashboard "* ]]; then
  exec .venv/bin/python -m tests.bench.dashboard
fi
# the stock baseline reserves named slots (the original workshop's form): advertise them too
export GPUHUB_NAMED_SLOTS=NVIDIA-GPU
# Docker (CLI, SDK, python -m deploy) goes to the bed's manager, in the bed and the bench alike
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
trap 'bash tests/bed/bed.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/bed.sh up 2
.venv/bin/python -m tests.bench.bench "$@"
[[ " $* " == *" --only"* ]] || .venv/bin/python -m tests.bench.guard_cpu
[[ " $* " == *" --only"* ]] || .venv/bin/python -m tests.bench.dashboard
