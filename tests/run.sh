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

export GPUHUB_CONFIG=none  # an organizer's ./config.env is not the test stack's
ensure_venv test
log "lint (ruff)"
"$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . >/dev/null \
  || die "ruff found problems; fix them or run: .venv/bin/ruff format ."

if [ "$what" = unit ]; then
  exec "$VENV/bin/python" -m pytest tests/unit tests/sync "$@"
fi

# the worker machines go when the tests end, pass or fail
trap 'bash tests/bed/workers.sh down >/dev/null 2>&1 || true' EXIT

# The bed runs in its own process: the demo settings it loads must not reach pytest, whose
# integration conftest picks the test stack's own name, port and network.
bash tests/bed/up.sh

log "pytest"
"$VENV/bin/python" -m pytest tests "$@"
