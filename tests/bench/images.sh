#!/usr/bin/env bash
# `make bench-images`: the real PyTorch and TensorFlow images (several GB each: not built by CI,
# which uses the slim stand-ins of images/standin), built on the bed's manager engine (never
# this machine's) from the single-user image and PyPI's wheels, then proven in a container of
# each (tests/bench/images.py). Arguments go to tests/bench/images.py. Prints figures; exits 1
# when a build or a check failed. The images stay in the bed's manager engine for the next run.
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
trap 'bash tests/bed/bed.sh down >/dev/null 2>&1 || true' EXIT
bash tests/bed/bed.sh up 0
. deploy/bootstrap.sh
"$VENV/bin/python" -m tests.bench.images "$@"
