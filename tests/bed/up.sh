#!/usr/bin/env bash
# The test bed, idempotently: Docker engine, simulated GPU slices, a swarm advertised on the
# bridge address, the images, and 2 worker machines. Used by tests/run.sh and tests/bench/run.sh;
# `tests/bed/workers.sh down` removes the workers again.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/lib.sh
load_settings
ensure_root test
ensure_packages curl:curl openssl:openssl ss:iproute2 ip:iproute2 chromium:chromium
ensure_venv test
ensure_engine
ensure_gpu_slices
bash tests/bed/workers.sh bridge
GPUHUB_ADVERTISE_ADDR=10.199.0.1 ensure_swarm
ensure_images
bash tests/bed/workers.sh up 2
