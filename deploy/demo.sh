#!/usr/bin/env bash
# `make demo`: a single-machine GPU hub. Installs what is missing (Docker engine from the
# distribution, debootstrap), starts the engine, advertises the GPUs (simulated ones when there is
# no NVIDIA GPU), initialises a swarm, builds the images, deploys the stack and prints how to log
# in. Safe to run again; `make down` removes what it created.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ensure_root demo
load_settings demo  # read and checked before anything changes; resolves the `auto` limits
ensure_packages curl:curl openssl:openssl ss:iproute2 ip:iproute2
ensure_venv
ensure_engine
ensure_gpu_slices
ensure_swarm
check_port
ensure_images
ensure_secrets

trap 'echo "make demo stopped before the hub answered; remove what it deployed with: make down" >&2' ERR
deploy_stack
wait_hub
trap - ERR

cat <<MSG

  GPU JupyterHub is running: $(public_url)/
    log in with any username and the demo password: $(cat "$GPUHUB_STATE_DIR/demo_password")
    admin user: ${GPUHUB_ADMIN_USERS}, with the admin password: $(cat "$GPUHUB_STATE_DIR/admin_password")
    limits per server: cores ${GPUHUB_CPU_LIMIT:-none}, memory ${GPUHUB_MEM_LIMIT:-none}, tasks ${GPUHUB_PIDS_LIMIT:-none}
    GPU slices: $( [ "$GPUHUB_SIMULATED_GPUS" = 1 ] && echo "SIMULATED (no NVIDIA GPU on this machine)" || echo "real GPUs" ), ${GPUHUB_SLICES_PER_GPU} per GPU
  Stop and remove it with: make down

MSG
