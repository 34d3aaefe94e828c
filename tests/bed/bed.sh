#!/usr/bin/env bash
# The test bed: a Docker Swarm of several *machines* on this one, none of them this machine's
# own Docker engine (which the bed never starts, stops, reconfigures or joins; a demo, a swarm
# or /etc/docker/daemon.json of the user's stay as they are). Names and addresses: bed.env.
#
#   manager   a dockerd in network namespace gjbed-m (10.199.8.2 on the bridge gjbed0), with
#             its own data-root, exec-root, pidfile, socket and daemon.json (its simulated GPU
#             slices are written there); the swarm's manager, the images, the stack under test
#   wN        bed workers: a dockerd each in namespace gjbed-wN (10.199.8.1N), sharing this
#             machine's filesystem (quick to start), joined with worker_setup/setup.sh
#   freshN    a fresh GPU machine (10.199.8.3N): a container with its own root filesystem and
#             its own dockerd (not started: setup.sh starts it), a clean copy of the repository
#             (tracked and untracked files, no ignored ones: no .venv), no internet; it reaches
#             the manager only over the bridge. It runs on the manager's engine, with no
#             network of Docker's: a veth pair puts it on the bridge. The bed's shared storage
#             ($BED_SHARED, the manager's NFS export on an installed hub) reaches it at
#             /mnt/manager-share and is mounted at $BED_SHARED, as an organizer mounts the export.
#
#   tests/bed/bed.sh env             the environment that points Docker and python -m deploy
#                                    at the manager (shell-quoted NAME=value lines, for eval)
#   tests/bed/bed.sh up [N]          bridge, manager, swarm, images, N workers (default 2)
#   tests/bed/bed.sh workers [N]     only the N workers (the rest must be up); idempotent
#   tests/bed/bed.sh down            remove every machine, the manager's daemon, namespaces,
#                                    veths, the bridge and its rules; the manager's data (its
#                                    images) stays for the next run
#   tests/bed/bed.sh stop wN         kill one worker's dockerd (a machine that disappears)
#   tests/bed/bed.sh restart M [--kill]  stop machine M's engine (manager or wN) and start it
#                                    again, as a reboot or an engine upgrade does; --kill: kill it
#                                    (SIGKILL, as the OOM killer does), then start it
#   tests/bed/bed.sh cut wN          cut worker wN off from the manager: every packet between
#                                    them dropped (in wN's namespace), wN still up; uncut wN: back
#   tests/bed/bed.sh small-dir NAME SIZE  a folder on a file system of its own of SIZE (tmpfs,
#                                    e.g. 64m) at $BED_RUN/small/NAME, printed: a disk to fill
#   tests/bed/bed.sh join wN A       setup.sh on worker wN as `up` runs it, plus the arguments A
#   tests/bed/bed.sh fresh NAME [--unshared]  a fresh machine (removed first if it exists), with
#                                    the bed's shared storage mounted (--unshared: not mounted;
#                                    `mount --bind /mnt/manager-share $BED_SHARED` on it mounts it)
#   tests/bed/bed.sh on NAME CMD     run the shell command CMD on fresh machine NAME, as root in
#                                    its copy of the repository (like ssh)
#   tests/bed/bed.sh image-tar NAME  `make image-tar` here, the file copied to NAME's /root
#   tests/bed/bed.sh remove NAME [--keep-node]  take machine NAME (wN or freshN) out of the
#                                    swarm, remove it; --keep-node: its swarm node stays (down)
#
# Settings: GPUHUB_BED_GPUS (simulated GPUs per worker, 2), GPUHUB_SLICES_PER_GPU (3),
# GPUHUB_SIMULATE_IF_NO_GPU (the manager's simulated GPUs; 0: none, it runs only the hub),
# GPUHUB_SINGLEUSER_IMAGE (the image the workers get from the manager).
set -euo pipefail
BED_DIR=$(cd "$(dirname "$0")" && pwd)
while IFS='=' read -r key value; do
  case $key in BED_*) declare "$key=$value" ;; esac
done <"$BED_DIR/bed.env"

MGR=$BED_MANAGER_ADDR
HOST=$BED_HOST_ADDR
MGR_JSON=$BED_DATA/manager/daemon.json
GPUS=${GPUHUB_BED_GPUS:-2}

# Each bed machine's CPU: a cgroup of its own (cgroup v1's cpu controller), in which its engine
# (dockerd, its containerd and their shims: gjbed-M/engine) and its containers (gjbed-M/docker)
# are siblings, as the engine's service and its containers are on an installed machine. Workers
# weigh the same against each other (the manager more: below), and each of the host's own
# runnable threads weighs as one worker. Without it, every thread of every engine weighed as
# much as all the containers of all machines together, and a hub starved while the workers'
# engines started their servers: a bench measured this machine's 2 cores, not the hub. Where
# cgroup v1's cpu controller is not writable, the machines share the CPU as before.
CPU_CGROUPS=${GPUHUB_BED_CPU_CGROUPS:-/sys/fs/cgroup/cpu}
cpu_cgroups() { [ -w "$CPU_CGROUPS/cgroup.procs" ]; }
# The manager weighs MANAGER_CPU_SHARES against a worker's 1024: on separate machines the workers'
# load would not slow the manager at all; on shared cores the nearest a weight comes is to let the
# manager go first whenever it has work.
MANAGER_CPU_SHARES=8192
# the shell words that move the engine's shell into machine M's group (before it execs dockerd)
machine_cpu() {  # machine_cpu M
  cpu_cgroups || return 0
  local group=$CPU_CGROUPS/gjbed-$1 shares=1024
  [ "$1" = m ] && shares=$MANAGER_CPU_SHARES
  printf 'mkdir -p %s && echo %s >%s && echo $$ >%s &&' \
    "$group/engine" "$shares" "$group/cpu.shares" "$group/engine/cgroup.procs"
}
# dockerd's option that puts machine M's containers in its group
machine_cpu_parent() {  # machine_cpu_parent M
  cpu_cgroups || return 0
  printf -- '--cgroup-parent /gjbed-%s/docker' "$1"
}
# The participants' browsers, which are on machines of their own too: the benchmarks' client
# thread joins this group (tests/bench/client.py), weighed as the manager, so that a bench
# does not time its own client waiting for the CPU.
CLIENTS_CPU=$CPU_CGROUPS/gjbed-clients
ensure_clients_cpu() {
  cpu_cgroups || return 0
  mkdir -p "$CLIENTS_CPU"
  echo "$MANAGER_CPU_SHARES" >"$CLIENTS_CPU/cpu.shares"
}

# machine M's groups in every hierarchy Docker made them in, once its engine has stopped
remove_machine_cpu() {  # remove_machine_cpu M
  local dir
  for dir in /sys/fs/cgroup/*/"gjbed-$1"; do
    [ -d "$dir" ] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || log "cgroup $dir still holds processes: left"
  done
}

# The environment under which Docker's CLI and SDK, python -m deploy and the tests use the
# manager's engine (never the system's).
manager_env() {
  printf '%s=%q\n' \
    DOCKER_HOST "unix://$BED_RUN/manager.sock" \
    GPUHUB_DAEMON_JSON "$MGR_JSON" \
    GPUHUB_DOCKERD_PIDFILE "$BED_RUN/manager.pid" \
    GPUHUB_DOCKERD_LOG "$BED_LOGS/manager.log" \
    GPUHUB_DOCKERD_CMD "exec nsenter --net=/run/netns/gjbed-m -- unshare --uts -- sh -c 'hostname manager && $(machine_cpu m) exec dockerd --config-file $MGR_JSON $(machine_cpu_parent m)'" \
    GPUHUB_ADVERTISE_ADDR "$MGR" \
    GPUHUB_BED_CLIENTS_CPU "$(cpu_cgroups && echo "$CLIENTS_CPU")" \
    GPUHUB_ENGINE_ADDR "$MGR" \
    GPUHUB_IMAGE_TAR "$BED_DATA/singleuser-image.tar"
}

if [ "${1:-}" = env ]; then manager_env; exit 0; fi

set -a; eval "$(manager_env)"; set +a
. "$BED_DIR/../../deploy/bootstrap.sh"  # log, die, ensure_root, ensure_packages, ensure_venv
# the deploy's steps, on the engine DOCKER_HOST names (the manager's)
deploy() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -m deploy "$@"; }
# an engine started, stopped or restarted as GPUHUB_DOCKERD_* say (standard library only)
engine() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m worker_setup.engine "$@"; }
engine_up() { docker info >/dev/null 2>&1; }
# the checked settings (GPUHUB_SINGLEUSER_IMAGE, GPUHUB_SLICES_PER_GPU, ...) as the deploy reads them
command -v python3 >/dev/null 2>&1 || ensure_packages python3:python3
SETTINGS=$(PYTHONPATH="$REPO" python3 -m deploy settings) || die "fix the settings above, then run this again"
eval "$SETTINGS"
mkdir -p "$BED_RUN" "$BED_DATA" "$BED_LOGS"

sock() { echo "unix://$BED_RUN/$1.sock"; }
wdocker() { local w=$1; shift; DOCKER_HOST=$(sock "$w") docker "$@"; }

# iptables rule, added once: rule TABLE CHAIN SPEC...
rule() {
  local table=$1 chain=$2; shift 2
  iptables -t "$table" -C "$chain" "$@" 2>/dev/null || iptables -t "$table" -I "$chain" 1 "$@"
}

# The bridge, and this machine as the bed's router: Docker's engines set FORWARD to DROP; the
# manager builds images, which needs the internet (masqueraded, as for Docker's own bridges).
# Only the manager: the workers and the fresh machines reach nothing beyond the bridge.
ensure_bridge() {
  ip link show "$BED_BRIDGE" >/dev/null 2>&1 || ip link add "$BED_BRIDGE" type bridge
  [[ "$(ip addr show dev "$BED_BRIDGE")" == *"inet $HOST/24"* ]] || ip addr add "$HOST/24" dev "$BED_BRIDGE"
  ip link set "$BED_BRIDGE" up
  rule filter FORWARD -i "$BED_BRIDGE" -j ACCEPT
  rule filter FORWARD -o "$BED_BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
  rule nat POSTROUTING -s "$MGR/32" ! -o "$BED_BRIDGE" -j MASQUERADE
  sysctl -qw net.ipv4.ip_forward=1
}

remove_bridge() {
  iptables -D FORWARD -i "$BED_BRIDGE" -j ACCEPT 2>/dev/null || true
  iptables -D FORWARD -o "$BED_BRIDGE" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT 2>/dev/null || true
  iptables -t nat -D POSTROUTING -s "$MGR/32" ! -o "$BED_BRIDGE" -j MASQUERADE 2>/dev/null || true
  if ip link show "$BED_BRIDGE" >/dev/null 2>&1; then ip link del "$BED_BRIDGE"; fi
}

# A veth pair from the bridge into a network namespace (NS: a name under /run/netns, or the
# process id of a container's first process), as eth0 with ADDR, default route via this machine.
plug() {  # plug VETH NS ADDR
  local veth=$1 ns=$2 addr=$3 nspath
  [[ $ns =~ ^[0-9]+$ ]] && nspath=/proc/$ns/ns/net || nspath=/run/netns/$ns
  ip link del "$veth" 2>/dev/null || true
  ip link add "$veth" type veth peer name "$veth-p"
  ip link set "$veth" master "$BED_BRIDGE" up
  ip link set "$veth-p" netns "$ns"
  nsenter --net="$nspath" sh -ec "
    ip link set lo up
    ip link set $veth-p name eth0
    ip addr add $addr/24 dev eth0
    ip link set eth0 up
    ip route add default via $HOST"
}

ensure_netns() {  # ensure_netns NS VETH ADDR
  [ -e "/run/netns/$1" ] && return 0
  ip netns add "$1"
  plug "$2" "$1" "$3"
}

# ---- the manager ------------------------------------------------------------------------------

ensure_manager() {
  ensure_bridge
  ensure_netns gjbed-m gjb-m "$MGR"
  mkdir -p "$BED_DATA/manager/docker" "$BED_RUN/manager"
  if [ ! -s "$MGR_JSON" ]; then
    cat >"$MGR_JSON" <<JSON
{
  "data-root": "$BED_DATA/manager/docker",
  "exec-root": "$BED_RUN/manager",
  "pidfile": "$BED_RUN/manager.pid",
  "hosts": ["unix://$BED_RUN/manager.sock"]
}
JSON
  fi
  ensure_clients_cpu
  engine_up && return 0
  log "starting the bed's manager engine (namespace gjbed-m, $MGR)"
  engine start
  MANAGER_STARTED=1
}

# A bed whose run was killed before `down` (CI's time limit, a reboot) leaves its services in the
# manager's swarm state, which outlives the engine: stacks and servers of that run would hold
# GPU slices in the next. A manager engine that just started holds no test's services yet.
remove_leftover_services() {
  local ids='' names i
  for i in $(seq 1 60); do  # the swarm's manager elects itself leader after its engine starts
    ids=$(docker service ls -q 2>/dev/null) && break
    sleep 0.5
  done
  [ -n "$ids" ] || return 0
  # shellcheck disable=SC2086
  names=$(docker service inspect --format '{{.Spec.Name}}' $ids | tr '\n' ' ')
  log "removing the services an earlier bed left: $names"
  # shellcheck disable=SC2086
  docker service rm $ids >/dev/null
}

stop_daemon() {  # stop_daemon PIDFILE
  local pid; pid=$(cat "$1" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  local i; for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

# An engine that did not stop cleanly leaves its network namespaces and layers mounted.
unmount_under() {  # unmount_under DIR...
  local dir mnt
  for dir in "$@"; do
    for mnt in $(findmnt -rno TARGET | grep -F "$dir/" | sort -r); do umount -l "$mnt" 2>/dev/null || true; done
  done
}

# ---- bed workers (namespaces, shared filesystem) ----------------------------------------------

worker_addr() { echo "$BED_NET.$((10 + ${1#w}))"; }

# The environment under which worker_setup/setup.sh drives worker wN's engine.
worker_env() {  # shell-quoted NAME=value lines, for eval
  local w=$1
  printf '%s=%q\n' \
    DOCKER_HOST "$(sock "$w")" \
    GPUHUB_DAEMON_JSON "$BED_DATA/$w/daemon.json" \
    GPUHUB_DOCKERD_PIDFILE "$BED_RUN/$w.pid" \
    GPUHUB_DOCKERD_LOG "$BED_LOGS/$w.log" \
    GPUHUB_DOCKERD_CMD "exec nsenter --net=/run/netns/gjbed-$w -- unshare --uts -- sh -c 'hostname $w && $(machine_cpu "$w") exec dockerd --config-file $BED_DATA/$w/daemon.json $(machine_cpu_parent "$w")'"
}

ensure_worker_engine() {
  local w=$1 cfg=$BED_DATA/$1/daemon.json
  ensure_netns "gjbed-$w" "gjb-$w" "$(worker_addr "$w")"
  mkdir -p "$BED_DATA/$w/docker" "$BED_RUN/$w"
  if [ ! -s "$cfg" ]; then
    cat >"$cfg" <<JSON
{
  "data-root": "$BED_DATA/$w/docker",
  "exec-root": "$BED_RUN/$w",
  "pidfile": "$BED_RUN/$w.pid",
  "hosts": ["$(sock "$w")"],
  "dns": ["$HOST"]
}
JSON
  fi
  wdocker "$w" info >/dev/null 2>&1 && return 0
  ( set -a; eval "$(worker_env "$w")"; engine start )
}

# setup.sh on worker wN with the bed's own arguments (its address, simulated GPUs), plus ARGS.
join_worker() {
  local w=$1 token; shift
  token=$(docker swarm join-token -q worker)  # the manager's, before DOCKER_HOST points at wN
  ( set -a; eval "$(worker_env "$w")"; set +a
    bash "$REPO/worker_setup/setup.sh" --manager "$MGR:2377" --token "$token" \
      --advertise-addr "$(worker_addr "$w")" --simulate-gpus "$GPUS" \
      --slices-per-gpu "$GPUHUB_SLICES_PER_GPU" --machine-id "bed-$w" \
      --image "$GPUHUB_SINGLEUSER_IMAGE" \
      ${GPUHUB_NAMED_SLOTS:+--named-kind "$GPUHUB_NAMED_SLOTS"} \
      $([ "${GPUHUB_EGRESS:-}" != off ] || echo --no-firewall --no-disk-watch) "$@" )
}

needs_image() {
  local want; want=$(docker image inspect -f '{{.Id}}' "$GPUHUB_SINGLEUSER_IMAGE")
  [ "$(wdocker "$1" image inspect -f '{{.Id}}' "$GPUHUB_SINGLEUSER_IMAGE" 2>/dev/null)" != "$want" ]
}

wait_ready() {  # wait_ready HOSTNAME...
  local i name missing
  for i in $(seq 1 120); do
    missing=''
    for name in "$@"; do
      docker node ls --format '{{.Hostname}} {{.Status}}' | grep -x "$name Ready" >/dev/null || missing+=" $name"
    done
    [ -z "$missing" ] && return 0
    sleep 0.5
  done
  docker node ls >&2
  die "bed machine(s)$missing not Ready in the swarm"
}

workers_up() {
  local n=${1:-2} i w tar out image names=()
  tar=$(mktemp --suffix=.tar); rm -f "$tar"
  for i in $(seq 1 "$n"); do
    w=w$i; names+=("$w")
    ensure_worker_engine "$w"
    image=()
    if needs_image "$w"; then
      [ -s "$tar" ] || docker save "$GPUHUB_SINGLEUSER_IMAGE" >"$tar"
      image=(--image-tar "$tar")
    fi
    out=$(join_worker "$w" "${image[@]}" 2>&1) \
      || { rm -f "$tar"; echo "$out" >&2; die "worker_setup/setup.sh failed on $w (output above)"; }
  done
  rm -f "$tar"
  wait_ready "${names[@]}"
  log "$n worker(s) ready, $GPUS simulated GPU(s) x $GPUHUB_SLICES_PER_GPU slices each"
}

remove_worker() {
  local w=$1
  wdocker "$w" swarm leave --force >/dev/null 2>&1 || true
  stop_daemon "$BED_RUN/$w.pid"
  remove_machine_cpu "$w"
  unmount_under "$BED_RUN/$w" "$BED_DATA/$w"
  rm -rf "${BED_DATA:?}/$w" "${BED_RUN:?}/$w" "$BED_RUN/$w.sock" "$BED_RUN/$w.pid"
  if [ -e "/run/netns/gjbed-$w" ]; then ip netns del "gjbed-$w"; fi
  ip link del "gjb-$w" 2>/dev/null || true
}

# The manager or worker wN: its engine stopped (as its machine shuts down: containers stopped)
# and started again with the same settings; with --kill, killed instead (its containers stay
# until the new engine finds them).
restart_machine() {  # restart_machine manager|wN [--kill]
  case $1 in
    manager) ;;
    w[0-9]*) [ -e "/run/netns/gjbed-$1" ] || die "no bed worker $1 (tests/bed/bed.sh up N)" ;;
    *) die "restart: manager or a worker (w1, w2, ...), not '$1'" ;;
  esac
  case ${2:-} in ''|--kill) ;; *) die "restart: --kill or nothing after the machine, not '$2'" ;; esac
  ( if [ "$1" != manager ]; then set -a; eval "$(worker_env "$1")"; set +a; fi
    if [ "${2:-}" = --kill ]; then
      local pid i; pid=$(cat "$GPUHUB_DOCKERD_PIDFILE" 2>/dev/null || true)
      [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      engine start
    else
      engine restart
    fi )
}

# Worker wN and the manager cannot reach each other (a switch or link between them down):
# rules at the top of wN's own INPUT and OUTPUT chains, which go with its namespace.
CUT_RULES=("INPUT -s $MGR -j DROP" "OUTPUT -d $MGR -j DROP")
cut_worker() {  # cut_worker wN on|off
  local w=$1 spec
  [ -e "/run/netns/gjbed-$w" ] || die "no bed worker $w (tests/bed/bed.sh up N)"
  for spec in "${CUT_RULES[@]}"; do
    # shellcheck disable=SC2086
    if [ "$2" = on ]; then
      ip netns exec "gjbed-$w" iptables -C $spec 2>/dev/null || ip netns exec "gjbed-$w" iptables -I ${spec%% *} 1 ${spec#* }
    else
      while ip netns exec "gjbed-$w" iptables -D $spec 2>/dev/null; do :; done
    fi
  done
}

# A folder on a tmpfs of SIZE: a volume bound to it (docker volume create -o type=none -o o=bind
# -o device=DIR) is a disk that fills up at SIZE. `down` unmounts it.
SMALL=$BED_RUN/small
small_dir() {  # small_dir NAME SIZE
  local dir=$SMALL/$1
  mkdir -p "$dir"
  mountpoint -q "$dir" || mount -t tmpfs -o "size=$2,mode=0755" "gjbed-$1" "$dir"
  echo "$dir"
}

remove_small_dirs() {
  local dir
  unmount_under "$SMALL"
  for dir in "$SMALL"/*; do
    [ -d "$dir" ] || continue
    if mountpoint -q "$dir"; then umount -l "$dir"; fi
    rmdir "$dir"
  done
}

# ---- fresh machines (containers with their own root filesystem and engine) --------------------

fresh_addr() { echo "$BED_NET.$((30 + ${1#fresh}))"; }

# The fresh machine's image: the project's base image plus what a GPU machine has, and local
# wheels of what the worker venv holds, nvidia-ml-py and prometheus-client (downloaded here, as
# ensure_venv installs packages).
ensure_machine_image() {
  local ctx=$BED_DATA/machine-context wheel
  mkdir -p "$ctx/wheels"
  for wheel in nvidia_ml_py prometheus_client; do
    ls "$ctx"/wheels/"$wheel"-*.whl >/dev/null 2>&1 && continue
    log "downloading the ${wheel//_/-} wheel for the fresh machines"
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$ctx/wheels" "${wheel//_/-}" \
      || die "pip download ${wheel//_/-} failed"
  done
  cp "$BED_DIR/machine/Dockerfile" "$BED_DIR/machine/pip.conf" "$ctx/"
  log "image $BED_MACHINE_IMAGE"
  DOCKER_BUILDKIT=0 quietly "building $BED_MACHINE_IMAGE" \
    docker build -q --build-arg "BASE_IMAGE=$GPUHUB_BASE_IMAGE" -t "$BED_MACHINE_IMAGE" "$ctx"
}

# Machine NAME, new: its container (its own root filesystem and /var/lib/docker volume), on the
# bridge at its address, a clean copy of the repository in /root/gpu-jupyterhub, and the bed's
# shared storage mounted at $BED_SHARED unless --unshared (SYS_ADMIN: its engine, and mount).
fresh_machine() {  # SYS_PTRACE: as root on a GPU machine, the GPU guard reads (/proc/PID/...) and
  # signals its participants' processes
  local name=$1 shared=${2:-} pid
  case $shared in ''|--unshared) ;; *) die "fresh $name: unknown option $shared (--unshared)" ;; esac
  remove_machine "$name"
  docker image inspect "$BED_MACHINE_IMAGE" >/dev/null 2>&1 || ensure_machine_image
  mkdir -p "$BED_SHARED"
  docker run -d --name "gjbed-$name" --hostname "$name" --network none \
    --label gpu-jupyterhub-bed.machine="$name" \
    --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
    -v /sys/fs/cgroup:/sys/fs/cgroup:rw -v "gjbed-$name-docker:/var/lib/docker" \
    -v "$BED_SHARED:/mnt/manager-share" \
    "$BED_MACHINE_IMAGE" >/dev/null
  if [ -z "$shared" ]; then  # as /etc/fstab would at boot
    docker exec "gjbed-$name" sh -c "mkdir -p '$BED_SHARED' && mount --bind /mnt/manager-share '$BED_SHARED'"
  fi
  # its name resolves on it, as on any installed machine (sudo asks)
  docker exec "gjbed-$name" sh -c "echo '127.0.1.1 $name' >>/etc/hosts"
  pid=$(docker inspect -f '{{.State.Pid}}' "gjbed-$name")
  plug "gjb-$name" "$pid" "$(fresh_addr "$name")"
  # how the host reaches its engine and files (like ssh): links into its root filesystem
  ln -sfn "/proc/$pid/root/run/docker.sock" "$BED_RUN/$name.sock"
  ln -sfn "/proc/$pid/root" "$BED_RUN/$name.root"
  ( cd "$REPO" && git ls-files -co --exclude-standard -z \
      | while IFS= read -r -d '' f; do [ -e "$f" ] || continue; printf '%s\0' "$f"; done \
      | tar --null -T - -c ) \
    | docker exec -i "gjbed-$name" sh -c 'mkdir -p /root/gpu-jupyterhub && tar -x -C /root/gpu-jupyterhub'
  log "fresh machine $name at $(fresh_addr "$name") (repository copied, engine not started)"
}

on_machine() {  # on_machine NAME COMMAND
  docker exec -i -w /root/gpu-jupyterhub "gjbed-$1" bash -c "$2"
}

# `make image-tar` here, the file copied onto machine NAME (as an organizer would with scp).
image_tar_to() {
  local name=$1
  ( cd "$REPO" && make -s image-tar >/dev/null )
  docker cp "$GPUHUB_IMAGE_TAR" "gjbed-$name:/root/$(basename "$GPUHUB_IMAGE_TAR")" >/dev/null
  echo "/root/$(basename "$GPUHUB_IMAGE_TAR")"
}

remove_fresh() {
  local name=$1 id
  docker rm -f -v "gjbed-$name" >/dev/null 2>&1 || true
  docker volume rm "gjbed-$name-docker" >/dev/null 2>&1 || true
  ip link del "gjb-$name" 2>/dev/null || true
  rm -f "$BED_RUN/$name.sock" "$BED_RUN/$name.root"
}

# Machine NAME out of the swarm's node list and gone; with --keep-node its node stays (down), as
# a cloud that ends a machine leaves it (tests/integration/bed_cloud.py).
remove_machine() {
  local name=$1 keep=${2:-} id
  case $keep in ''|--keep-node) ;; *) die "remove $name: unknown option $keep (--keep-node)" ;; esac
  case $name in fresh*) remove_fresh "$name" ;; *) remove_worker "$name" ;; esac
  [ -z "$keep" ] || return 0
  engine_up || return 0
  for id in $(docker node ls --filter "name=$name" -q 2>/dev/null); do
    [ "$(docker node inspect -f '{{.Description.Hostname}}' "$id")" = "$name" ] \
      && docker node rm --force "$id" >/dev/null 2>&1 || true
  done
}

# ---- the whole bed ----------------------------------------------------------------------------

# Debian's docker.io starts the system's engine when installed; the bed only needs its binaries.
install_without_starting_services() {  # install_without_starting_services cmd:pkg ...
  local policy=/usr/sbin/policy-rc.d
  if [ -e "$policy" ]; then ensure_packages "$@"; return; fi
  printf '#!/bin/sh\n# tests/bed/bed.sh: no service starts while it installs packages\nexit 101\n' >"$policy"
  chmod +x "$policy"
  ( trap 'rm -f "$policy"' EXIT; ensure_packages "$@" )
}

up() {
  ensure_root test
  install_without_starting_services curl:curl openssl:openssl ss:iproute2 ip:iproute2 \
    iptables:iptables nsenter:util-linux chromium:chromium docker:docker.io dockerd:docker.io
  ensure_venv test
  ensure_manager
  # GPUHUB_SIMULATE_IF_NO_GPU=0: a manager with no GPU slices (it runs only the hub)
  if [ "${GPUHUB_SIMULATE_IF_NO_GPU:-}" = 0 ]; then deploy gpu-slices --optional; else deploy gpu-slices; fi
  deploy swarm
  if [ -n "${MANAGER_STARTED:-}" ]; then remove_leftover_services; fi
  deploy images
  ensure_machine_image
  workers_up "${1:-2}"
}

down() {
  local name id
  for name in $( { ls "$BED_RUN" 2>/dev/null | sed -n 's/^\(w[0-9]*\|fresh[0-9]*\)\.\(pid\|sock\|root\)$/\1/p'
                   ip netns list | awk '/^gjbed-w[0-9]+/{sub("gjbed-", "", $1); print $1}'
                   docker ps -a --filter label=gpu-jupyterhub-bed.machine \
                     --format '{{.Label "gpu-jupyterhub-bed.machine"}}' 2>/dev/null; } | sort -u); do
    remove_machine "$name"
  done
  if engine_up; then
    for id in $(docker node ls --filter role=worker -q 2>/dev/null); do
      docker node rm --force "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_daemon "$BED_RUN/manager.pid"
  remove_machine_cpu m
  remove_machine_cpu clients
  unmount_under "$BED_RUN/manager"
  if [ -e /run/netns/gjbed-m ]; then ip netns del gjbed-m; fi
  ip link del gjb-m 2>/dev/null || true
  remove_bridge
  remove_small_dirs
  log "test bed removed (the manager's images stay in $BED_DATA/manager)"
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  workers) workers_up "${2:-2}" ;;
  down) down ;;
  stop) stop_daemon "$BED_RUN/${2:?which worker, e.g. w1}.pid" ;;
  restart) restart_machine "${2:?which machine, manager or e.g. w1}" "${3:-}" ;;
  cut) cut_worker "${2:?which worker, e.g. w1}" on ;;
  uncut) cut_worker "${2:?which worker, e.g. w1}" off ;;
  small-dir) small_dir "${2:?a name}" "${3:?a size, e.g. 64m}" ;;
  join) w=${2:?which worker, e.g. w1}; shift 2; join_worker "$w" "$@" ;;
  fresh) fresh_machine "${2:?which machine, e.g. fresh1}" "${3:-}" ;;
  on) on_machine "${2:?which machine, e.g. fresh1}" "${3:?a command}" ;;
  image-tar) image_tar_to "${2:?which machine, e.g. fresh1}" ;;
  remove) remove_machine "${2:?which machine, e.g. fresh1}" "${3:-}" ;;
  *) echo "usage: $0 env | up [N] | workers [N] | down | stop wN | restart manager|wN [--kill] | cut wN | uncut wN | small-dir NAME SIZE | join wN ARGS | fresh NAME | on NAME CMD | image-tar NAME | remove NAME [--keep-node]" >&2
     exit 2 ;;
esac
