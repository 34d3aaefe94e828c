#!/usr/bin/env bash
# `make up`: the production hub on this machine (the swarm's manager), from the organizer's
# config file (GPUHUB_CONFIG / `make up CONFIG=FILE`, default ./config.env; example:
# deploy/config.example.env). Reads and checks every setting first, before anything on this
# machine changes (only python3 is installed if missing: the reader needs it). Then: Docker
# engine, this machine's GPUs (none is fine: the GPU machines join later), swarm, images, an
# image registry the GPU machines pull from, the stack (gateway with HTTPS, proxy, hub,
# tutorial sync, idle culler).
# Prints the URL and the line that adds a GPU machine. Safe to run again: it applies changes of
# the config file and keeps everything else; `make down` removes the stack.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
[ -n "$(config_file)" ] || die "no config file: cp deploy/config.example.env config.env, edit it, then run: sudo make up (or: make up CONFIG=FILE)"
ensure_root up
load_settings up
log "settings checked: $GPUHUB_CONFIG_FILE"

ensure_packages curl:curl openssl:openssl ss:iproute2 ip:iproute2
ensure_venv
ensure_engine
GPUHUB_GPU_OPTIONAL=1 ensure_gpu_slices
ensure_swarm
check_port GPUHUB_HTTP_PORT GPUHUB_REGISTRY_PORT $(tls_on && echo GPUHUB_HTTPS_PORT)
ensure_images
ensure_environment_images
ensure_secrets

# GPU machines pull the servers' images from the registry this stack runs on the manager
export GPUHUB_REGISTRY=1
use_registry_names

trap 'echo "make up stopped before the hub answered; fix the cause and run it again, or remove what it deployed with: make down" >&2' ERR
deploy_stack
publish_images
wait_hub
trap - ERR

login=$([ "$GPUHUB_AUTH" = github ] \
  && echo "GitHub login: ${GPUHUB_ALLOWED_ORGS:+members of $GPUHUB_ALLOWED_ORGS}${GPUHUB_ALLOWED_ORGS:+${GPUHUB_ROSTER:+, and }}${GPUHUB_ROSTER:+the roster $GPUHUB_ROSTER}" \
  || echo "local login: any username with the password in $GPUHUB_STATE_DIR/demo_password, admins with $GPUHUB_STATE_DIR/admin_password")
cat <<MSG

  GPU JupyterHub is up: $(public_url)/
    ${login}
    admins: ${GPUHUB_ADMIN_USERS}
    HTTPS: ${GPUHUB_TLS}$( [ "$GPUHUB_TLS" = self-signed ] && echo " (certificate: $GPUHUB_STATE_DIR/tls/cert.pem)")
    GPU machines pull the servers' images from $(registry_image "")
    environments: ${GPUHUB_ENVIRONMENTS:-the single-user image only}; full GPU: ${GPUHUB_FULL_GPU}
  See the GPU machines and servers with: sudo make status

MSG
print_join_command
