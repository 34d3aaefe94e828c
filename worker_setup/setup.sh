#!/usr/bin/env bash
# Add this GPU machine to the hub's swarm, or take it out again. Run as root in a checkout of
# this repository on the worker; `make join-command` on the manager prints the exact line.
#
#   sudo ./worker_setup/setup.sh --manager ADDR[:2377] --token SWMTKN-...
#        [--slices-per-gpu N | --slice-memory SIZE] [--simulate-gpus N]
#        [--registry HOST:PORT | --image-tar FILE] [--advertise-addr ADDR] [--dry-run]
#   sudo ./worker_setup/setup.sh --leave [--wait SECONDS] [--force] [--dry-run]
#
# Joining is a checklist of idempotent steps; a second run changes nothing and says so:
#   checks       root, python3, daemon.json is valid JSON, the manager answers, the token's form
#   engine       the Docker engine is installed (Debian's docker.io) and running
#   gpus         GPUs found with NVML (or --simulate-gpus N), slices per GPU worked out
#   swarm        joined to the manager's swarm (a wrong token stops here, before any change)
#   image        the single-user image is present (already, from --image-tar, or pulled; with
#                --registry: every image of the manager's registry, pulled)
#   daemon.json  slices, gpu-jupyterhub.* engine labels, NVIDIA runtime merged in (backup kept);
#                with --registry, the manager's registry as a plain-HTTP one
#   restart      the engine restarts only when daemon.json changed
# With --registry (`make up` runs one on the manager) the image is pulled from it, after the
# restart that makes the engine trust it.
#
# For engines set up differently (the test bed's machines in network namespaces): DOCKER_HOST,
# GPUHUB_DAEMON_JSON, GPUHUB_DOCKERD_CMD (how to start dockerd), GPUHUB_DOCKERD_PIDFILE,
# GPUHUB_DOCKERD_LOG, GPUHUB_WORKER_PYTHON (a python with nvidia-ml-py).
set -euo pipefail
. "$(dirname "$0")/../deploy/lib.sh"
load_settings

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

MANAGER='' TOKEN='' ADVERTISE_ADDR='' IMAGE_TAR='' REGISTRY='' DRY_RUN='' LEAVE='' FORCE='' WAIT=0
ADVERTISE_ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --manager) MANAGER=${2:?--manager needs ADDR[:PORT]}; shift ;;
    --token) TOKEN=${2:?--token needs the swarm join token}; shift ;;
    --advertise-addr) ADVERTISE_ADDR=${2:?}; shift ;;
    --image-tar) IMAGE_TAR=${2:?--image-tar needs a file}; shift ;;
    --registry) REGISTRY=${2:?--registry needs HOST:PORT}; ADVERTISE_ARGS+=(--registry "$2"); shift ;;
    --slices-per-gpu|--slice-memory|--simulate-gpus|--nvml-fixture|--machine-id|--named-kind|--nvidia-runtime)
      ADVERTISE_ARGS+=("$1" "${2:?$1 needs a value}"); shift ;;
    --dry-run) DRY_RUN=1 ;;
    --leave) LEAVE=1 ;;
    --force) FORCE=1 ;;
    --wait) WAIT=${2:?--wait needs SECONDS}; shift ;;
    -h|--help) usage ;;
    *) echo "unknown option $1" >&2; usage 2 >&2 ;;
  esac
  shift
done

DAEMON_JSON=${GPUHUB_DAEMON_JSON:-/etc/docker/daemon.json}
IMAGE=$GPUHUB_SINGLEUSER_IMAGE
# the manager's registry serves the image under its own address; an --image-tar holds it
# under the name it was saved with
[ -n "$REGISTRY" ] && [ -z "$IMAGE_TAR" ] && IMAGE=$(image_in_registry "$REGISTRY" "$IMAGE")
ROWS=()    # the summary table: "step|what happened"
CHANGES=0

row() { ROWS+=("$1|$2"); log "$1: $2"; }
changed() { CHANGES=$((CHANGES + 1)); row "$@"; }
summary() {
  echo
  printf '  %-12s %s\n' step result
  local r; for r in "${ROWS[@]}"; do printf '  %-12s %s\n' "${r%%|*}" "${r#*|}"; done
  echo
}

# A python that can import pynvml (nvidia-ml-py): the repository's venv when it has it, else a
# small venv of its own under /opt/gpu-jupyterhub.
worker_python() {
  local py=${GPUHUB_WORKER_PYTHON:-}
  if [ -z "$py" ] && [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import pynvml' 2>/dev/null; then
    py=$VENV/bin/python
  fi
  if [ -z "$py" ]; then
    local venv=/opt/gpu-jupyterhub/worker-venv
    if ! "$venv/bin/python" -c 'import pynvml' 2>/dev/null; then
      python3 -m venv --help >/dev/null 2>&1 || ensure_packages_forced python3-venv
      python3 -m venv "$venv" >/dev/null
      "$venv/bin/pip" install -q --disable-pip-version-check nvidia-ml-py >/dev/null 2>&1 \
        || die "could not install nvidia-ml-py into $venv (pip); check the network or set GPUHUB_WORKER_PYTHON"
    fi
    py=$venv/bin/python
  fi
  echo "$py"
}

# Run the worker's python ($PY) on this checkout's code. The repository goes on PYTHONPATH: the
# small venv above holds nvidia-ml-py only, and the worker code needs nothing else (the standard
# library and gpu_swarm_spawner.contract; tests/unit/test_worker_venv.py checks that).
worker_py() {
  (cd "$REPO" && PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$@")
}

advertise() {  # advertise ARGS...: worker_setup.advertise on this machine's daemon.json
  worker_py -m worker_setup.advertise --daemon-json "$DAEMON_JSON" "$@"
}

# A name the GPU machines and the hub share, from gpu_swarm_spawner/contract.py (its one place).
contract() {  # contract NAME
  worker_py -c 'import sys; from gpu_swarm_spawner import contract; print(getattr(contract, sys.argv[1]))' "$1"
}

swarm_state() { docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unknown; }

check_prerequisites() {
  [ "$(id -u)" = 0 ] || die "this needs root (Docker engine, daemon.json); run it with sudo"
  [ "$(uname -s)" = Linux ] || die "worker setup supports Linux only"
  command -v python3 >/dev/null || ensure_packages python3:python3
  if [ -e "$DAEMON_JSON" ]; then
    python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$DAEMON_JSON" 2>/dev/null \
      || die "$DAEMON_JSON is not valid JSON; fix or move it, then run this again. Nothing was changed."
  fi
  [ -n "$LEAVE" ] && return 0
  [ -n "$MANAGER" ] || die "--manager ADDR is missing; run 'make join-command' on the manager for the full line"
  [ -n "$TOKEN" ] || die "--token is missing; run 'make join-command' on the manager for the full line"
  [[ $TOKEN =~ ^SWMTKN-1-[0-9a-z]+-[0-9a-z]+$ ]] \
    || die "--token does not look like a swarm join token (SWMTKN-1-...); copy it again from 'make join-command'"
  [[ $MANAGER == *:* ]] || MANAGER=$MANAGER:2377
  timeout 5 bash -c "exec 3<>/dev/tcp/${MANAGER%:*}/${MANAGER##*:}" 2>/dev/null \
    || die "cannot reach the manager at $MANAGER; check the address and that TCP 2377 and 7946 and UDP 4789 and 7946 are open between the machines"
  row checks "root, python3, $DAEMON_JSON, manager $MANAGER answers"
}

ensure_docker_engine() {
  if engine_up; then row engine "running ($(docker version --format '{{.Server.Version}}'))"; return; fi
  if [ -n "$DRY_RUN" ]; then row engine "would install docker.io if missing and start it"; return; fi
  ensure_packages docker:docker.io dockerd:docker.io
  start_engine
  changed engine "started ($(docker version --format '{{.Server.Version}}'))"
}

ensure_joined() {
  local state; state=$(swarm_state)
  if [ "$state" = active ]; then
    local managers; managers=$(docker info --format '{{range .Swarm.RemoteManagers}}{{.Addr}} {{end}}')
    [[ " $managers " == *" $MANAGER "* ]] \
      || die "this machine is already in another swarm (managers: $managers); run '$0 --leave' first"
    row swarm "already joined ($MANAGER)"
    return
  fi
  if [ -n "$DRY_RUN" ]; then row swarm "would join the swarm of $MANAGER"; return; fi
  local out
  out=$(docker swarm join --token "$TOKEN" ${ADVERTISE_ADDR:+--advertise-addr "$ADVERTISE_ADDR"} \
          "$MANAGER" 2>&1) \
    || die "joining the swarm at $MANAGER failed: ${out##*: }; run 'make join-command' on the manager for a fresh token. Nothing else was changed."
  changed swarm "joined the swarm of $MANAGER"
}

ensure_image() {
  local want=''
  if [ -n "$REGISTRY" ] && [ -z "$IMAGE_TAR" ]; then ensure_registry_images; return; fi
  [ -n "$IMAGE_TAR" ] && { [ -r "$IMAGE_TAR" ] || die "--image-tar $IMAGE_TAR: no such file"; }
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    if [ -z "$IMAGE_TAR" ]; then row image "$IMAGE present"; return; fi
    # the tar may hold a newer build: compare image ids
    want=$(tar -xOf "$IMAGE_TAR" manifest.json 2>/dev/null | python3 -c \
      'import json,sys; print(json.load(sys.stdin)[0]["Config"].split("/")[-1].split(".")[0])' 2>/dev/null || true)
    if [ "$(docker image inspect -f '{{.Id}}' "$IMAGE")" = "sha256:$want" ]; then
      row image "$IMAGE present (same as $IMAGE_TAR)"; return
    fi
  fi
  if [ -n "$DRY_RUN" ]; then row image "would ${IMAGE_TAR:+load $IMAGE_TAR}${IMAGE_TAR:-pull $IMAGE}"; return; fi
  if [ -n "$IMAGE_TAR" ]; then
    docker load -q <"$IMAGE_TAR" >/dev/null || die "docker load $IMAGE_TAR failed"
    changed image "loaded $IMAGE from $IMAGE_TAR"
  elif docker pull -q "$IMAGE" >/dev/null 2>&1; then
    changed image "pulled $IMAGE"
  else
    die "the single-user image $IMAGE is not here and cannot be pulled; on the manager run 'make image-tar', copy the file here and pass --image-tar FILE"
  fi
}

# Every image of the manager's registry (the single-user image and the spawn page's
# environments), pulled now so that no participant's first start waits for a download of
# gigabytes; pulled every time (a no-op when up to date), so rebuilt images arrive with a re-run.
ensure_registry_images() {
  if [ -n "$DRY_RUN" ]; then row image "would pull the images of $REGISTRY"; return; fi
  local images image before pulled=() current=()
  images=$(python3 - "$REGISTRY" <<'PY' 2>/dev/null
import json, sys, urllib.request
base = f"http://{sys.argv[1]}/v2"
get = lambda path: json.load(urllib.request.urlopen(base + path, timeout=30))
for repo in get("/_catalog")["repositories"]:
    for tag in get(f"/{repo}/tags/list").get("tags") or []:
        print(f"{sys.argv[1]}/{repo}:{tag}")
PY
  ) || true
  grep -x "$IMAGE" <<<"$images" >/dev/null \
    || die "cannot find $IMAGE in the manager's registry $REGISTRY; check that 'make up' ran on the manager and that TCP ${REGISTRY##*:} to it is open"
  for image in $images; do
    before=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
    docker pull -q "$image" >/dev/null 2>&1 || die "docker pull $image from the manager's registry failed"
    if [ "$(docker image inspect -f '{{.Id}}' "$image")" = "$before" ]; then current+=("$image")
    else pulled+=("$image"); fi
  done
  if [ ${#pulled[@]} -gt 0 ]; then
    changed image "pulled from the manager's registry: ${pulled[*]}"
  else
    row image "up to date: ${current[*]}"
  fi
}

# Servers of participants running on this machine: their service names (<SERVICE_PREFIX>-...).
local_servers() {
  local prefix; prefix=$(contract SERVICE_PREFIX)
  docker ps --filter label=com.docker.swarm.service.name \
    --format '{{.Label "com.docker.swarm.service.name"}}' | { grep "^$prefix-" || true; }
}

# Find the GPUs and work out the daemon.json change before anything changes: a machine whose
# NVML fails stops here, outside the swarm.
plan_slices() {
  local rc=0
  PLAN=$(advertise "${ADVERTISE_ARGS[@]}" --dry-run 2>&1) || rc=$?
  case $rc in 0|3) ;; *) echo "$PLAN" >&2; exit 1 ;; esac
  SLICES_CHANGE=$rc
  local gpus; gpus=$(echo "$PLAN" | { grep '^GPU [0-9]*:' || true; })
  row gpus "$(echo "$gpus" | wc -l) GPU(s): $(echo "$gpus" | sed 's/^GPU [0-9]*: [^ ]* //' \
    | sort | uniq -c | sed 's/^ *//' | paste -sd ';' -)"
  echo "$PLAN" | { grep -v '^GPU [0-9]*:' || true; } | sed 's/^/      /'
}

ensure_slices() {
  if [ "$SLICES_CHANGE" = 0 ]; then row daemon.json "already as wanted"; return; fi
  if [ -n "$DRY_RUN" ]; then row daemon.json "would change (diff above)"; return; fi
  local out users; users=$(local_servers)
  if [ -n "$users" ] && [ -z "$FORCE" ]; then
    die "applying the new GPU settings restarts the Docker engine, which would stop the servers running here: $(echo $users); run this again once they have stopped, or add --force"
  fi
  local rc=0
  out=$(advertise "${ADVERTISE_ARGS[@]}" 2>&1) || rc=$?
  [ $rc = 3 ] || { echo "$out" >&2; die "writing $DAEMON_JSON failed (output above)"; }
  apply_daemon_json "slices and labels written (backup kept)"
}

apply_daemon_json() {  # apply_daemon_json WHAT-CHANGED: record it, restart the engine
  changed daemon.json "$1"
  log "restarting the Docker engine to apply $DAEMON_JSON"
  stop_engine; start_engine
  changed restart "engine restarted"
}

join() {
  check_prerequisites
  ensure_docker_engine
  PY=$(worker_python)
  plan_slices
  ensure_joined
  if [ -n "$REGISTRY" ]; then ensure_slices; ensure_image; else ensure_image; ensure_slices; fi
  summary
  if [ -n "$DRY_RUN" ]; then echo "dry run: nothing was changed"
  elif [ "$CHANGES" = 0 ]; then echo "nothing to change: this machine is already set up"
  else echo "done: this machine's GPU slices are available to the hub in a few seconds"
  fi
}

leave() {
  check_prerequisites
  engine_up || die "the Docker engine is not running here; start it first"
  PY=$(worker_python)
  local users deadline=$((SECONDS + WAIT))
  users=$(local_servers)
  while [ -n "$users" ] && [ $SECONDS -lt $deadline ]; do
    log "waiting for $(echo "$users" | wc -l) server(s) to stop: $(echo $users)"
    sleep 5; users=$(local_servers)
  done
  if [ -n "$users" ] && [ -z "$FORCE" ]; then
    die "participants' servers still run here: $(echo $users); on the manager run 'make pause-node NODE=$(docker info --format '{{.Name}}')' so no new ones start here, ask them to stop (or stop them on the hub's admin page), then wait with --wait SECONDS, or stop them with --force"
  fi
  if [ -n "$DRY_RUN" ]; then
    row swarm "would leave the swarm${users:+ and stop $(echo $users)}"
  elif [ "$(swarm_state)" = active ]; then
    docker swarm leave --force >/dev/null
    changed swarm "left the swarm${users:+ (stopped $(echo $users))}"
  else
    row swarm "not in a swarm"
  fi
  local rc=0 out
  out=$(advertise --remove ${DRY_RUN:+--dry-run} 2>&1) || rc=$?
  case $rc in
    0) row daemon.json "no GPU settings left" ;;
    3) echo "$out" | sed 's/^/      /'
       if [ -n "$DRY_RUN" ]; then row daemon.json "would take the GPU settings out"
       else apply_daemon_json "GPU slices and labels taken out (backup kept)"
       fi ;;
    *) echo "$out" >&2; exit 1 ;;
  esac
  summary
  echo "The Docker engine and the single-user image stay. On the manager, 'docker node rm $(docker info --format '{{.Name}}')' removes it from the node list."
}

if [ -n "$LEAVE" ]; then leave; else join; fi
