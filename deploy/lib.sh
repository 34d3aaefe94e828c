# Shared steps of demo.sh, down.sh and tests/run.sh. Source it; every ensure_* is idempotent.
# shellcheck shell=bash

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GPUHUB_VENV:-$REPO/.venv}
_T0=$(date +%s)

log() { printf '[%3ss] %s\n' "$(( $(date +%s) - _T0 ))" "$*"; }
die() { echo "error: $*" >&2; exit 1; }

# The organizer's config file: GPUHUB_CONFIG (`make up CONFIG=FILE`), else ./config.env when it
# exists; GPUHUB_CONFIG=none: no config file (the demo and the tests).
config_file() {
  case "${GPUHUB_CONFIG:-}" in
    none) ;;
    '') [ -f "$REPO/config.env" ] && echo "$REPO/config.env" ;;
    *) echo "$GPUHUB_CONFIG" ;;
  esac
  return 0
}

# Settings: the environment wins over the config file, which wins over deploy/settings.env.
# One reader takes all three (gpu_swarm_spawner/settings.py, standard library only, run with the
# system python3 before anything is installed): it refuses a config line it cannot take for
# certain, resolves `auto` limits on this machine and, given a mode (up|demo), checks everything
# that mode deploys; this shell then gets exactly the values it checked.
load_settings() {  # load_settings [up|demo]
  local config out
  config=$(config_file)
  command -v python3 >/dev/null 2>&1 || ensure_packages python3:python3
  out=$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m deploy.settings load \
          --defaults "$REPO/deploy/settings.env" ${config:+--config "$config"} ${1:+--mode "$1"}) \
    || die "fix the settings above${config:+ in $config} and run this again"
  eval "$out"
}

ensure_root() {
  [ "$(id -u)" = 0 ] || die "this needs root (Docker engine, swarm, daemon.json); run: sudo make $1"
}

# Install Debian packages for the commands that are missing: ensure_packages cmd:pkg ...
ensure_packages() {
  local want=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || want+=("${pair#*:}")
  done
  [ ${#want[@]} = 0 ] && return 0
  command -v apt-get >/dev/null || die "missing ${want[*]}; install them with your package manager (this script knows apt-get only)"
  log "installing ${want[*]} (apt-get)"
  local out; out=$(mktemp)
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}"; } >"$out" 2>&1 \
    || { tail -20 "$out" >&2; die "apt-get could not install ${want[*]} (output above)"; }
  rm -f "$out"
}

ensure_venv() {  # ensure_venv [extras]
  local extras=${1:-} stamp="$VENV/.installed${1:+-$1}"
  if [ -f "$stamp" ] && [ "$stamp" -nt "$REPO/pyproject.toml" ]; then return 0; fi
  python3 -m venv --help >/dev/null 2>&1 || ensure_packages_forced python3-venv
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
  log "installing the project into $VENV${extras:+ (with $extras)}"
  local out; out=$(mktemp)
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$REPO${extras:+[$extras]}" >"$out" 2>&1 \
    || { tail -20 "$out" >&2; die "pip install failed (output above)"; }
  rm -f "$out"; touch "$stamp"
}

ensure_packages_forced() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 || die "could not install $*"
}

engine_up() { docker info >/dev/null 2>&1; }

# GPUHUB_DOCKERD_CMD: how to start an engine that is not the system's (the test bed's machines).
systemd_engine() { [ -z "${GPUHUB_DOCKERD_CMD:-}" ] && [ -d /run/systemd/system ]; }

# Read when called, so a caller can point them at another engine in a subshell.
# GPUHUB_ENGINE_ADDR: where this machine reaches the ports the engine publishes (127.0.0.1;
# the test bed's manager engine is in a network namespace of its own).
engine_addr() { echo "${GPUHUB_ENGINE_ADDR:-127.0.0.1}"; }
# The engine's socket on this machine's filesystem (bind-mounted into the hub).
docker_socket() {
  case ${DOCKER_HOST:-} in unix://*) echo "${DOCKER_HOST#unix://}" ;; *) echo /var/run/docker.sock ;; esac
}
dockerd_log() { echo "${GPUHUB_DOCKERD_LOG:-/var/log/gpu-jupyterhub-dockerd.log}"; }
dockerd_pidfile() { echo "${GPUHUB_DOCKERD_PIDFILE:-/var/run/docker.pid}"; }

start_engine() {
  if systemd_engine; then
    systemctl start docker || die "systemctl start docker failed; see: journalctl -u docker"
  else
    # No init system (containers, CI): run dockerd ourselves. Services prefer local images,
    # so tasks do not wait on a registry that may not exist.
    rm -f "$(dockerd_pidfile)"
    DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 setsid nohup \
      sh -c "${GPUHUB_DOCKERD_CMD:-exec dockerd --pidfile $(dockerd_pidfile)}" \
      >>"$(dockerd_log)" 2>&1 </dev/null &
  fi
  local i wait=${GPUHUB_ENGINE_WAIT:-60}
  for i in $(seq 1 $((wait * 2))); do engine_up && return 0; sleep 0.5; done
  die "the Docker engine did not start within $wait s; read $(dockerd_log) (or journalctl -u docker)"
}

stop_engine() {
  if systemd_engine; then systemctl stop docker; return; fi
  local pid; pid=$(cat "$(dockerd_pidfile)" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  local i; for i in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  die "dockerd (pid $pid) did not stop within 60 s"
}

ensure_engine() {
  engine_up && return 0
  ensure_packages docker:docker.io dockerd:docker.io
  log "starting the Docker engine"
  start_engine
}

# Advertise this machine's GPUs (or simulated ones) as slices; restart the engine if that changed.
# GPUHUB_DAEMON_JSON: the engine's daemon.json when it is not /etc/docker/daemon.json.
ensure_gpu_slices() {
  local rc=0 out
  out=$("$VENV/bin/python" -m worker_setup.advertise \
          ${GPUHUB_DAEMON_JSON:+--daemon-json "$GPUHUB_DAEMON_JSON"} \
          --slices-per-gpu "$GPUHUB_SLICES_PER_GPU" \
          --simulate-if-no-gpu "$GPUHUB_SIMULATE_IF_NO_GPU" ${GPUHUB_GPU_OPTIONAL:+--none-if-no-gpu} \
          ${GPUHUB_NAMED_SLOTS:+--named-kind "$GPUHUB_NAMED_SLOTS"} 2>&1) || rc=$?
  case $rc in
    0) ;;
    3) log "GPU slices changed; restarting the Docker engine"; stop_engine; start_engine ;;
    *) echo "$out" >&2; exit 1 ;;
  esac
  echo "$out" | sed 's/^/      /'
}

# 1 when any node of the swarm advertises simulated GPUs (the hub then says so on every page).
simulated_gpus_in_swarm() {
  local ids; ids=$(docker node ls -q)
  # shellcheck disable=SC2086
  # (grep without -q: with pipefail, -q's early exit can fail the pipeline on a match)
  docker node inspect $ids --format '{{json .Description.Resources.GenericResources}}' \
    | grep -c '"Kind":"GPU-simulated-' >/dev/null && echo 1 || echo 0
}

default_advertise_addr() {
  ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}'
}

ensure_swarm() {
  local state; state=$(docker info --format '{{.Swarm.LocalNodeState}}')
  if [ "$state" = inactive ]; then
    local addr=${GPUHUB_ADVERTISE_ADDR:-$(default_advertise_addr)}
    log "initialising a swarm on ${addr:-127.0.0.1}"
    docker swarm init --advertise-addr "${addr:-127.0.0.1}" >/dev/null \
      || die "docker swarm init failed; set GPUHUB_ADVERTISE_ADDR to this machine's address"
  elif [ "$state" != active ]; then
    die "this engine's swarm state is '$state'; wait for it or run: docker swarm leave --force"
  fi
  [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ] \
    || die "this machine is a swarm worker; run this on a manager (or: docker swarm leave)"
}

ensure_images() {
  if [ "$GPUHUB_BASE_IMAGE" = gpu-jupyterhub/base:bookworm ]; then
    ensure_packages debootstrap:debootstrap
    log "base image (debootstrap; cached after the first build)"
    bash "$REPO/images/base/build.sh" "$GPUHUB_BASE_IMAGE" | sed 's/^/      /'
  fi
  build_image singleuser "$GPUHUB_SINGLEUSER_IMAGE" --build-arg "BASE_IMAGE=$GPUHUB_BASE_IMAGE"
  build_image hub "$GPUHUB_HUB_IMAGE" --build-arg "BASE_IMAGE=$GPUHUB_BASE_IMAGE"
}

build_image() {  # build_image DIR-UNDER-images IMAGE [docker build args]
  local dir=$1 image=$2 out; shift 2
  log "image $image"
  out=$(mktemp)
  DOCKER_BUILDKIT=0 docker build -q "$@" -f "$REPO/images/$dir/Dockerfile" -t "$image" "$REPO" \
      >"$out" 2>&1 || { tail -30 "$out" >&2; die "building $image failed (output above)"; }
  rm -f "$out"
}

# The images of GPUHUB_ENVIRONMENTS (NAME=IMAGE ...): gpu-jupyterhub/X:TAG is built from
# images/X/Dockerfile when that exists (Docker's cache makes a re-run quick); any other image
# must be here already or pullable.
ensure_environment_images() {
  local entry image dir
  for entry in $GPUHUB_ENVIRONMENTS; do
    image=${entry#*=}; dir=${image#gpu-jupyterhub/}; dir=${dir%%:*}
    if [ "$dir" != "${image%%:*}" ] && [ -f "$REPO/images/$dir/Dockerfile" ]; then
      build_image "$dir" "$image" --build-arg "SINGLEUSER_IMAGE=$GPUHUB_SINGLEUSER_IMAGE"
    elif ! docker image inspect "$image" >/dev/null 2>&1 && ! docker pull -q "$image" >/dev/null 2>&1; then
      die "GPUHUB_ENVIRONMENTS: image $image is neither here nor pullable; build it (docker build -t $image ...) and run this again"
    fi
  done
}

ensure_secrets() {
  install -d -m 0700 "$GPUHUB_STATE_DIR"
  local name
  # demo_password: participants' shared password (GPUHUB_AUTH=local); admin_password: the
  # admins' (JupyterHub's shared-password login wants one of its own, of 32 characters or more)
  for name in proxy_token ops_token demo_password admin_password webhook_secret; do
    [ -s "$GPUHUB_STATE_DIR/$name" ] && continue
    ( umask 077; openssl rand -hex 16 >"$GPUHUB_STATE_DIR/$name" )
  done
}

# The ports to publish must be free, or already ours (a re-run): check_port [KEY...]
check_port() {
  local key port
  for key in "${@:-GPUHUB_HTTP_PORT}"; do
    port=${!key}
    [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] || continue
    docker stack ls --format '{{.Name}}' 2>/dev/null | grep -x "$GPUHUB_STACK" >/dev/null && continue
    die "port $port ($key) is already in use by another program; free it or set another port: $key=..."
  done
}

tls_on() { [ "${GPUHUB_TLS:-off}" != off ]; }

public_host() { echo "${GPUHUB_HOSTNAME:-127.0.0.1}"; }
public_port() { tls_on && echo "$GPUHUB_HTTPS_PORT" || echo "$GPUHUB_HTTP_PORT"; }

# The address participants open (the scheme's default port left out).
public_url() {
  local scheme port; port=$(public_port)
  scheme=$(tls_on && echo https || echo http)
  case "$scheme:$port" in
    https:443|http:80) echo "$scheme://$(public_host)" ;;
    *) echo "$scheme://$(public_host):$port" ;;
  esac
}

# curl the hub on this machine by its public name (which may not resolve here), certificate
# unchecked (a self-signed one, or one ACME is still fetching): hub_curl PATH [curl args]
hub_curl() {
  curl -sfk --resolve "$(public_host):$(public_port):$(engine_addr)" "$(public_url)$1" "${@:2}"
}

# Contents hash for the name of a Docker secret (secrets cannot change in place).
content_version() { sha256sum "$1" | cut -c1-12; }

# The gateway's certificate and key in $GPUHUB_STATE_DIR/tls: generated (self-signed, again when
# the hostname changes), copied from GPUHUB_TLS_CERT/_KEY (files), or placeholders (acme).
ensure_tls() {
  local dir=$GPUHUB_STATE_DIR/tls host=$GPUHUB_HOSTNAME
  install -d -m 0700 "$dir"
  case $GPUHUB_TLS in
    self-signed)
      if [ "$(cat "$dir/self-signed-for" 2>/dev/null)" != "$host" ]; then
        local san; san=$([[ $host =~ ^[0-9.]+$|: ]] && echo "IP:$host" || echo "DNS:$host")
        log "generating a self-signed certificate for $host (valid 825 days)"
        openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=$host" \
          -addext "subjectAltName=$san" -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null \
          || die "openssl could not generate a certificate for $host"
        echo "$host" >"$dir/self-signed-for"
      fi ;;
    files)
      install -m 0600 "$GPUHUB_TLS_CERT" "$dir/cert.pem"
      install -m 0600 "$GPUHUB_TLS_KEY" "$dir/key.pem"
      rm -f "$dir/self-signed-for" ;;
    acme)
      echo "# not used with GPUHUB_TLS=acme" >"$dir/cert.pem"; cp "$dir/cert.pem" "$dir/key.pem"
      rm -f "$dir/self-signed-for" ;;
  esac
  chmod 0600 "$dir/key.pem"
  GPUHUB_TLS_CERT_VERSION=$(content_version "$dir/cert.pem")
  GPUHUB_TLS_KEY_VERSION=$(content_version "$dir/key.pem")
  export GPUHUB_TLS_CERT_VERSION GPUHUB_TLS_KEY_VERSION
}

# The GitHub OAuth client secret as a file for its Docker secret; never printed.
ensure_github_secret() {
  local file=$GPUHUB_STATE_DIR/github_client_secret
  ( umask 077
    if [ -n "$GPUHUB_GITHUB_CLIENT_SECRET_FILE" ]; then
      tr -d '\n' <"$GPUHUB_GITHUB_CLIENT_SECRET_FILE" >"$file.tmp"
    else
      printf '%s' "$GPUHUB_GITHUB_CLIENT_SECRET" >"$file.tmp"
    fi )
  mv "$file.tmp" "$file"
  GPUHUB_GITHUB_SECRET_VERSION=$(content_version "$file")
  export GPUHUB_GITHUB_SECRET_VERSION
}

# The roster, checked, copied where the hub reads it (it re-reads it when it changes).
ensure_roster() {
  local dir=$GPUHUB_STATE_DIR/roster
  install -d -m 0755 "$dir"
  GPUHUB_ROSTER_FILE=
  if [ -n "${GPUHUB_ROSTER:-}" ]; then
    local out; out=$("$VENV/bin/python" -m deploy.settings roster "$GPUHUB_ROSTER" 2>&1) \
      || die "${out#error: }"
    install -m 0644 "$GPUHUB_ROSTER" "$dir/.roster.txt.tmp"
    mv "$dir/.roster.txt.tmp" "$dir/roster.txt"
    GPUHUB_ROSTER_FILE=/srv/jupyterhub/roster/roster.txt
    log "roster: ${out#*: }"
  fi
  export GPUHUB_ROSTER_FILE
}

# An image's name in a registry at HOST:PORT (any registry host in the name is replaced).
image_in_registry() {  # image_in_registry HOST:PORT IMAGE
  echo "$1/${2#*.*/}"
}

# Where the GPU machines pull an image from: the manager's registry (make up).
registry_image() {  # registry_image LOCAL-NAME
  image_in_registry "$(docker info --format '{{.Swarm.NodeAddr}}'):$GPUHUB_REGISTRY_PORT" "$1"
}

# Servers' images by their names in the manager's registry: the single-user image and those of
# GPUHUB_ENVIRONMENTS are tagged so (this machine then never pulls them) and listed in
# GPUHUB_PUBLISH for publish_images.
use_registry_names() {
  local entry envs='' image
  GPUHUB_PUBLISH=$GPUHUB_SINGLEUSER_IMAGE
  GPUHUB_SINGLEUSER_IMAGE=$(registry_image "$GPUHUB_SINGLEUSER_IMAGE")
  for entry in $GPUHUB_ENVIRONMENTS; do
    image=${entry#*=}
    GPUHUB_PUBLISH+=" $image"
    envs+="${entry%%=*}=$(registry_image "$image") "
  done
  GPUHUB_ENVIRONMENTS=${envs% }
  for image in $GPUHUB_PUBLISH; do docker tag "$image" "$(registry_image "$image")"; done
  export GPUHUB_SINGLEUSER_IMAGE GPUHUB_ENVIRONMENTS GPUHUB_PUBLISH
}

# Push GPUHUB_PUBLISH to the manager's registry (by its local address, which Docker trusts
# without TLS; the GPU machines pull them by the manager's).
publish_images() {
  local image push i out
  for i in $(seq 1 120); do
    curl -sf -o /dev/null "http://$(engine_addr):$GPUHUB_REGISTRY_PORT/v2/" && break
    [ "$i" = 120 ] && die "the registry did not answer on port $GPUHUB_REGISTRY_PORT within 60 s; see: docker service logs ${GPUHUB_STACK}_registry"
    sleep 0.5
  done
  for image in $GPUHUB_PUBLISH; do
    push=$(image_in_registry "127.0.0.1:$GPUHUB_REGISTRY_PORT" "$image")
    log "pushing $image to the registry (a new image takes a minute or two)"
    docker tag "$image" "$push"
    out=$(mktemp)
    docker push "$push" >"$out" 2>&1 || { tail -5 "$out" >&2; die "docker push $push failed (output above)"; }
    rm -f "$out"
  done
}

deploy_stack() {
  log "deploying stack $GPUHUB_STACK"
  # Image ids go into container labels: a rebuilt image under the same tag then rolls the
  # services forward, and an unchanged one leaves them alone.
  GPUHUB_HUB_IMAGE_ID=$(docker image inspect -f '{{.Id}}' "$GPUHUB_HUB_IMAGE")
  GPUHUB_SINGLEUSER_IMAGE_ID=$(docker image inspect -f '{{.Id}}' "$GPUHUB_SINGLEUSER_IMAGE")
  GPUHUB_SIMULATED_GPUS=$(simulated_gpus_in_swarm)
  GPUHUB_TUTORIAL_SYNC_REPLICAS=$([ -n "$GPUHUB_TUTORIAL_REPOS" ] && echo 1 || echo 0)
  # bind-mount sources must exist (on shared storage they then exist on every machine)
  install -d -m 0755 "$GPUHUB_TUTORIALS_DIR" ${GPUHUB_DATASETS_DIR:+"$GPUHUB_DATASETS_DIR"}
  GPUHUB_PUBLIC_URL=$(public_url)
  GPUHUB_DOCKER_SOCKET=$(docker_socket)
  export GPUHUB_HUB_IMAGE_ID GPUHUB_SINGLEUSER_IMAGE_ID GPUHUB_SIMULATED_GPUS \
    GPUHUB_TUTORIAL_SYNC_REPLICAS GPUHUB_PUBLIC_URL GPUHUB_DOCKER_SOCKET
  local files=(-c "$REPO/deploy/stack.yml")
  if tls_on; then ensure_tls; files+=(-c "$REPO/deploy/stack.tls.yml")
  else files+=(-c "$REPO/deploy/stack.http.yml"); fi
  if [ "$GPUHUB_AUTH" = github ]; then
    ensure_github_secret; ensure_roster; files+=(-c "$REPO/deploy/stack.github.yml")
  fi
  [ "${GPUHUB_REGISTRY:-0}" = 1 ] && files+=(-c "$REPO/deploy/stack.registry.yml")
  local out; out=$(mktemp)
  docker stack deploy --prune --resolve-image never "${files[@]}" "$GPUHUB_STACK" >"$out" 2>&1 \
    || { cat "$out" >&2; die "docker stack deploy failed (output above); remove what exists with: make down"; }
  rm -f "$out"
  remove_unused_secrets
}

# Versions of the hashed secrets that no service uses any more (best effort: a secret of a task
# still stopping is removed by the next deploy).
remove_unused_secrets() {
  local name
  for name in $(docker secret ls --format '{{.Name}}' | grep -E "^${GPUHUB_STACK}_(tls_cert|tls_key|github_client_secret)_" || true); do
    docker secret rm "$name" >/dev/null 2>&1 || true
  done
}


# Until a service runs exactly its current spec: after a deploy that changed it, the old task
# may still answer for a few seconds.
wait_converged() {
  local service=$1 i tasks
  for i in $(seq 1 240); do
    # one line per task: "<desired> <current state...>", e.g. "Running Running 3 seconds ago"
    tasks=$(docker service ps --format '{{.DesiredState}} {{.CurrentState}}' "$service" 2>/dev/null || true)
    # converged: a task meant to run runs, none meant to run is elsewhere, no old one still runs
    if [[ "$tasks" =~ (^|$'\n')"Running Running" ]] \
       && ! grep -E '^Running [^R]|^Shutdown Running' <<<"$tasks" >/dev/null; then
      return 0
    fi
    sleep 0.5
  done
  die "service $service did not converge within 120 s; see: docker service ps $service"
}

wait_hub() {
  local url; url=$(public_url)/hub/api/
  local i
  wait_converged "${GPUHUB_STACK}_proxy"
  wait_converged "${GPUHUB_STACK}_hub"
  tls_on && wait_converged "${GPUHUB_STACK}_gateway"
  for i in $(seq 1 240); do
    if hub_curl /hub/api/ -o /dev/null; then log "hub answers at $(public_url)"; return 0; fi
    [ $((i % 20)) = 0 ] && log "waiting for the hub ($((i / 2)) s)..."
    sleep 0.5
  done
  docker service ps --no-trunc "${GPUHUB_STACK}_hub" "${GPUHUB_STACK}_proxy" >&2 || true
  docker service logs --tail 30 "${GPUHUB_STACK}_hub" >&2 || true
  tls_on && { docker service logs --tail 10 "${GPUHUB_STACK}_gateway" >&2 || true; }
  die "the hub did not answer at $url within 120 s (state and logs above$(tls_on && echo '; with acme, the gateway log says whether the certificate was issued')); remove the stack with: make down"
}

# Remove the user servers this stack created, then the stack itself.
remove_stack() {
  local ids
  ids=$(docker service ls -q --filter "label=gpu-jupyterhub.stack=$GPUHUB_STACK" 2>/dev/null || true)
  [ -n "$ids" ] && { log "removing user servers"; docker service rm $ids >/dev/null; }
  if docker stack ls --format '{{.Name}}' 2>/dev/null | grep -x "$GPUHUB_STACK" >/dev/null; then
    log "removing stack $GPUHUB_STACK"
    docker stack rm "$GPUHUB_STACK" >/dev/null
  fi
  local i
  for i in $(seq 1 60); do  # the network goes last, once its tasks are gone
    docker network inspect "$GPUHUB_NETWORK" >/dev/null 2>&1 || return 0
    docker network rm "$GPUHUB_NETWORK" >/dev/null 2>&1 || true
    sleep 1
  done
  die "network $GPUHUB_NETWORK is still in use; see: docker network inspect $GPUHUB_NETWORK"
}

# Remove the volumes (hub database, user homes) and generated secrets of a removed stack.
purge_stack_data() {
  local vols i
  vols=$(docker volume ls -q --filter "label=gpu-jupyterhub.stack=$GPUHUB_STACK"; \
         docker volume ls -q --filter "label=com.docker.stack.namespace=$GPUHUB_STACK")
  if [ -n "$vols" ]; then
    # a stack's containers take a few seconds to go; their volumes are busy until then
    # shellcheck disable=SC2086
    for i in $(seq 1 30); do docker volume rm $vols >/dev/null 2>&1 && break; sleep 1; done
    log "removed volumes: $(echo $vols)"
  fi
  rm -rf "$GPUHUB_STATE_DIR"
  log "removed generated secrets in $GPUHUB_STATE_DIR"
}

# ---- adding GPU machines (worker_setup/setup.sh runs on them) --------------------------------

# The line an organizer runs on each GPU machine, with this swarm's address and worker token.
print_join_command() {
  [ "$(docker info --format '{{.Swarm.ControlAvailable}}' 2>/dev/null)" = true ] \
    || die "this machine is not a swarm manager; run 'make demo' (or make up) here first"
  local addr token registry=''
  addr=$(docker info --format '{{.Swarm.NodeAddr}}')
  token=$(docker swarm join-token -q worker)
  if docker service inspect "${GPUHUB_STACK}_registry" >/dev/null 2>&1; then
    registry=" --registry $addr:$GPUHUB_REGISTRY_PORT"
    echo "# On each GPU machine, as root, in a checkout of this repository (it pulls the"
    echo "# single-user image from this machine's registry):"
  else
    echo "# On each GPU machine, as root, in a checkout of this repository (add --image-tar FILE,"
    echo "# made by 'make image-tar' here, when the machine cannot pull $GPUHUB_SINGLEUSER_IMAGE):"
  fi
  echo "sudo ./worker_setup/setup.sh --manager $addr:2377 --token $token --slices-per-gpu $GPUHUB_SLICES_PER_GPU$registry"
}

# The single-user image as a file to copy to GPU machines that cannot pull it.
save_image_tar() {
  local tar=${GPUHUB_IMAGE_TAR:-/var/lib/gpu-jupyterhub/singleuser-image.tar}
  install -d "$(dirname "$tar")"
  log "saving $GPUHUB_SINGLEUSER_IMAGE to $tar"
  docker save "$GPUHUB_SINGLEUSER_IMAGE" >"$tar.tmp" && mv "$tar.tmp" "$tar"
  log "copy $tar to each GPU machine and add --image-tar $(basename "$tar") to the join command"
}

# Stop new servers landing on a machine (before it leaves) without stopping those running
# there: Swarm "pause". ("drain" would stop them: a GPU server cannot move to another GPU.)
set_node_availability() {  # set_node_availability NODE pause|active
  local node=${1:?name the machine: make pause-node NODE=<hostname>} to=$2
  docker node inspect "$node" >/dev/null 2>&1 \
    || die "no machine '$node' in this swarm; 'docker node ls' lists them"
  docker node update --availability "$to" "$node" >/dev/null
  if [ "$to" = pause ]; then
    log "$node takes no new servers; its running servers stay. On $node: sudo ./worker_setup/setup.sh --leave --wait 600"
  else
    log "$node takes new servers again"
  fi
}
