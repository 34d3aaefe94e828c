#!/usr/bin/env bash
# The stand-in server's image (images/scale-server: busybox answering as a single-user server
# does), built from the base image on the engine DOCKER_HOST names (the bed's manager): for the
# benches that run many servers or many machines on 2 cores (scale.sh, fleet.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/bootstrap.sh
log "image gpu-jupyterhub/scale-server:latest"
base=$(PYTHONPATH=. "$VENV/bin/python" -m deploy settings GPUHUB_BASE_IMAGE)
DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$base" \
  -f images/scale-server/Dockerfile -t gpu-jupyterhub/scale-server:latest . >/dev/null
