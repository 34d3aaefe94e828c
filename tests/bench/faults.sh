#!/usr/bin/env bash
# `make bench-faults`: the fault suite (tests/bench/faults.py) on the multi-node test bed
# (tests/bed/bed.sh: its manager is an engine of its own, never this machine's): bed up, each
# fault on a hub with servers running, bed down. Prints figures; asserts nothing. Arguments go
# to tests/bench/faults.py (--only proxy,cut --json FILE ...).
set -euo pipefail
cd "$(dirname "$0")/../.."
export GPUHUB_CONFIG=none
# Docker (CLI, SDK, python -m deploy) goes to the bed's manager, in the bed and the bench alike
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
trap 'bash tests/bed/bed.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/bed.sh up 2
.venv/bin/python -m tests.bench.faults "$@"
