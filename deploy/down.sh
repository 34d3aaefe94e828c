#!/usr/bin/env bash
# `make down`: remove the user servers and the stack. Data (hub database, user homes) is kept;
# `make down PURGE=1` also removes the volumes and generated secrets of this stack.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
load_settings
ensure_root down
engine_up || { log "the Docker engine is not running: nothing deployed to remove"; exit 0; }
[ "$(docker info --format '{{.Swarm.LocalNodeState}}')" = active ] \
  || { log "no swarm on this machine: nothing deployed to remove"; exit 0; }
remove_stack
if [ "${PURGE:-0}" = 1 ]; then
  purge_stack_data
else
  log "kept the hub database and user homes (volumes); remove them too with: make down PURGE=1"
fi
log "stack $GPUHUB_STACK removed. The swarm, the Docker engine and the images stay."
