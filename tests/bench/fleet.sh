#!/usr/bin/env bash
# `make bench-fleet`: a workshop day replayed twice on the test bed (tests/bench/bench_fleet.py),
# a fixed fleet against the hub driving the fleet through the bed's cloud
# (tests/integration/bed_cloud.py). The manager runs only the hub: every GPU machine is a fresh
# bed machine of the cloud's (its own root filesystem and engine), and the servers are the
# stand-in (images/scale-server), so that three such machines fit on 2 cores. Prints figures;
# asserts nothing. Arguments go to tests/bench/bench_fleet.py (--hour 120 --json FILE ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
export GPUHUB_SIMULATE_IF_NO_GPU=0 GPUHUB_CONFIG=none
# the stand-in server (busybox) has no gpuhub-firewall: no firewall in the servers or the machines
export GPUHUB_EGRESS=off
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
trap 'bash tests/bed/bed.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/bed.sh up 0
bash tests/bench/scale-server.sh
# the cloud's machines get the stand-in as their image file (make image-tar)
GPUHUB_SINGLEUSER_IMAGE=gpu-jupyterhub/scale-server:latest .venv/bin/python -m tests.bench.bench_fleet "$@"
