#!/usr/bin/env bash
# `make test`: lint, unit tests, then set up the test bed (idempotent: Docker engine, swarm with
# simulated GPU slices, images, Chromium) and run the integration and browser tests against a
# real hub stack. The stack under test is separate from the demo's (own name, port, network:
# tests/integration/conftest.py) and is removed afterwards.
#
#   tests/run.sh [unit|all] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh

what=${1:-all}; [ $# -gt 0 ] && shift

ensure_venv test
log "lint (ruff)"
"$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . >/dev/null \
  || die "ruff found problems; fix them or run: .venv/bin/ruff format ."

if [ "$what" = unit ]; then
  exec "$VENV/bin/python" -m pytest tests/unit "$@"
fi

# the worker machines go when the tests end, pass or fail
trap 'bash tests/bed/workers.sh down >/dev/null 2>&1 || true' EXIT

# The bed steps run in a subshell: the demo settings they load must not reach pytest, whose
# integration conftest picks the test stack's own name, port and network.
(
  load_settings
  ensure_root test
  ensure_packages curl:curl openssl:openssl ss:iproute2 ip:iproute2 chromium:chromium
  ensure_engine
  ensure_gpu_slices
  bash tests/bed/workers.sh bridge
  GPUHUB_ADVERTISE_ADDR=10.199.0.1 ensure_swarm
  ensure_images
  bash tests/bed/workers.sh up 2
)

log "pytest"
"$VENV/bin/python" -m pytest tests "$@"
