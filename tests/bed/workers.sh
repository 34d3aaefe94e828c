#!/usr/bin/env bash
# Extra worker *machines* for the test bed: each is a dockerd in its own network namespace
# (wN at 10.199.0.1N on the bridge jhbr0), advertising simulated GPUs, joined to this swarm,
# with the single-user image loaded.
#
#   tests/bed/workers.sh bridge     only the bridge jhbr0 (10.199.0.1), to advertise a swarm on
#   tests/bed/workers.sh up [N]     start/join N workers (default 2); idempotent
#   tests/bed/workers.sh down       leave, stop and remove every worker and its namespace; the
#                                   bridge stays (the swarm is advertised on its address)
#   tests/bed/workers.sh stop wN    kill one worker's dockerd (a machine that disappears)
#   tests/bed/workers.sh machine wN a fresh machine: namespace and engine, not in the swarm
#   tests/bed/workers.sh env wN     the environment worker_setup/setup.sh needs for wN's engine
#   tests/bed/workers.sh setup wN A  worker_setup/setup.sh on wN with this swarm's address and
#                                   token, plus the arguments A (later ones override)
#   tests/bed/workers.sh join wN A   setup.sh on bed worker wN as `up` runs it, plus arguments A
#   tests/bed/workers.sh remove wN  take machine wN out of the swarm and remove it
#
# Workers join with worker_setup/setup.sh, the organizer's command, so every test run uses it.
#
# Settings: GPUHUB_BED_GPUS (simulated GPUs per worker, 2), GPUHUB_SLICES_PER_GPU (3),
#           GPUHUB_SINGLEUSER_IMAGE.
set -euo pipefail
. "$(dirname "$0")/../../deploy/lib.sh"
load_settings

NET=10.199.0
BR=jhbr0
MGR=$NET.1
GPUS=${GPUHUB_BED_GPUS:-2}

sock() { echo "unix:///var/run/docker-$1.sock"; }
wdocker() { local w=$1; shift; docker -H "$(sock "$w")" "$@"; }

ensure_bridge() {
  ip link show $BR >/dev/null 2>&1 || ip link add $BR type bridge
  [[ "$(ip addr show dev $BR)" == *"inet $MGR/24"* ]] || ip addr add $MGR/24 dev $BR
  ip link set $BR up
  # Docker sets FORWARD to DROP with br_netfilter; frames between workers cross this bridge
  iptables -C FORWARD -i $BR -o $BR -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 -i $BR -o $BR -j ACCEPT
}

ensure_netns() {
  local w=$1 addr=$2
  [ -e "/var/run/netns/$w" ] && return 0
  ip netns add "$w"
  ip link add "vh-$w" type veth peer name "ve-$w"
  ip link set "vh-$w" master $BR up
  ip link set "ve-$w" netns "$w"
  ip netns exec "$w" ip link set lo up
  ip netns exec "$w" ip link set "ve-$w" name eth0
  ip netns exec "$w" ip addr add "$addr/24" dev eth0
  ip netns exec "$w" ip link set eth0 up
  ip netns exec "$w" ip route add default via $MGR
}

# The environment under which worker_setup/setup.sh drives machine wN's engine.
machine_env() {  # shell-quoted NAME=value lines, for eval
  local w=$1
  printf '%s=%q\n' \
    DOCKER_HOST "$(sock "$w")" \
    GPUHUB_DAEMON_JSON "/etc/docker/$w.json" \
    GPUHUB_DOCKERD_PIDFILE "/var/run/docker-$w.pid" \
    GPUHUB_DOCKERD_LOG "/var/log/dockerd-$w.log" \
    GPUHUB_DOCKERD_CMD "exec nsenter --net=/var/run/netns/$w -- unshare --uts -- sh -c 'hostname $w && exec dockerd --config-file /etc/docker/$w.json'"
}

# A fresh machine: its own engine (data, sockets, pidfile) in namespace wN, not in any swarm.
ensure_machine() {
  local w=$1 addr=$2 cfg=/etc/docker/$1.json
  ensure_netns "$w" "$addr"
  mkdir -p "/var/lib/docker-$w" "/var/run/docker-$w" /etc/docker
  if [ ! -s "$cfg" ]; then
    cat >"$cfg" <<JSON
{
  "data-root": "/var/lib/docker-$w",
  "exec-root": "/var/run/docker-$w",
  "pidfile": "/var/run/docker-$w.pid",
  "hosts": ["$(sock "$w")"],
  "dns": ["$MGR"]
}
JSON
  fi
  wdocker "$w" info >/dev/null 2>&1 && return 0
  ( set -a; eval "$(machine_env "$w")"; start_engine )
}

# worker_setup/setup.sh on machine wN, as an organizer would run it there: ARGS are added.
setup_machine() {
  local w=$1 token; shift
  token=$(docker swarm join-token -q worker)  # the manager's, before DOCKER_HOST points at wN
  ( set -a; eval "$(machine_env "$w")"; set +a
    bash "$REPO/worker_setup/setup.sh" --manager "$MGR:2377" --token "$token" "$@" )
}

# setup.sh on bed worker wN with the bed's own arguments (its address, simulated GPUs), plus ARGS.
join_machine() {
  local w=$1; shift
  setup_machine "$w" --advertise-addr "$NET.$((10 + ${w#w}))" --simulate-gpus "$GPUS" \
    --slices-per-gpu "$GPUHUB_SLICES_PER_GPU" --machine-id "bed-$w" \
    ${GPUHUB_NAMED_SLOTS:+--named-kind "$GPUHUB_NAMED_SLOTS"} "$@"
}

needs_image() {
  local want; want=$(docker image inspect -f '{{.Id}}' "$GPUHUB_SINGLEUSER_IMAGE")
  [ "$(wdocker "$1" image inspect -f '{{.Id}}' "$GPUHUB_SINGLEUSER_IMAGE" 2>/dev/null)" != "$want" ]
}

stop_worker() {
  local w=$1 pidf=/var/run/docker-$1.pid pid
  pid=$(cat "$pidf" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || true
  local i; for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}

wait_ready() {
  local n=$1 i ready
  for i in $(seq 1 120); do
    ready=$(docker node ls --format '{{.Hostname}} {{.Status}}' | grep -c '^w[0-9]* Ready' || true)
    [ "$ready" -ge "$n" ] && return 0
    sleep 0.5
  done
  docker node ls >&2
  die "only $ready of $n workers are Ready"
}

# Overlay traffic between the manager and the namespaced workers only flows when the manager
# advertises the bridge address (its VXLAN packets leave from that address).
check_swarm_address() {
  local addr; addr=$(docker info --format '{{.Swarm.NodeAddr}}')
  [ "$addr" = "$MGR" ] || die "the multi-node test bed needs the swarm advertised on $MGR, \
but it is on $addr; on a test machine: make down && docker swarm leave --force, then make test"
}

up() {
  local n=${1:-2} i w tar out image
  ensure_bridge
  check_swarm_address
  tar=$(mktemp --suffix=.tar); rm -f "$tar"
  for i in $(seq 1 "$n"); do
    w=w$i
    ensure_machine "$w" "$NET.$((10 + i))"
    image=()
    if needs_image "$w"; then
      [ -s "$tar" ] || docker save "$GPUHUB_SINGLEUSER_IMAGE" >"$tar"
      image=(--image-tar "$tar")
    fi
    out=$(join_machine "$w" "${image[@]}" 2>&1) \
      || { echo "$out" >&2; die "worker_setup/setup.sh failed on $w (output above)"; }
  done
  rm -f "$tar"
  wait_ready "$n"
  log "$n worker(s) ready, $GPUS simulated GPU(s) x $GPUHUB_SLICES_PER_GPU slices each"
}

# Machine wN gone for good: out of the swarm, engine stopped, its files and namespace removed.
remove_machine() {
  local w=$1 id
  wdocker "$w" swarm leave --force >/dev/null 2>&1 || true
  stop_worker "$w"
  # an engine that did not stop cleanly leaves its network namespaces and layers mounted
  local mnt
  for mnt in $(findmnt -rno TARGET | grep -E "^(/var)?/run/docker-$w/|^/var/lib/docker-$w/" | sort -r); do
    umount -l "$mnt" 2>/dev/null || true
  done
  rm -rf "/var/lib/docker-$w" "/var/run/docker-$w" "/etc/docker/$w.json" /etc/docker/"$w".json.bak-*
  if [ -e "/var/run/netns/$w" ]; then ip netns del "$w"; fi
  for id in $(docker node ls --filter "name=$w" -q 2>/dev/null); do
    [ "$(docker node inspect -f '{{.Description.Hostname}}' "$id")" = "$w" ] \
      && docker node rm --force "$id" >/dev/null 2>&1 || true
  done
}

down() {
  local w id
  for w in $( { ls /var/run/docker-w*.pid 2>/dev/null | sed 's#.*/docker-\(w[0-9]*\)\.pid#\1#'
                ip netns list | awk '/^w[0-9]+/{print $1}'; } | sort -u); do
    remove_machine "$w"
  done
  # nodes that left (or vanished) are removed from the manager's list
  for id in $(docker node ls --filter role=worker -q 2>/dev/null); do
    docker node rm --force "$id" >/dev/null 2>&1 || true
  done
  log "workers removed"
}

case "${1:-}" in
  bridge) ensure_bridge ;;
  up) up "${2:-2}" ;;
  down) down ;;
  stop) stop_worker "${2:?which worker, e.g. w1}" ;;
  machine) ensure_bridge; ensure_machine "${2:?which machine, e.g. w3}" "$NET.$((10 + ${2#w}))" ;;
  env) machine_env "${2:?which machine, e.g. w3}" ;;
  setup) w=${2:?which machine, e.g. w3}; shift 2; setup_machine "$w" "$@" ;;
  join) w=${2:?which worker, e.g. w1}; shift 2; join_machine "$w" "$@" ;;
  remove) remove_machine "${2:?which machine, e.g. w3}" ;;
  *) echo "usage: $0 up [N] | down | stop wN | machine wN | env wN | setup wN ARGS | join wN ARGS | remove wN" >&2
     exit 2 ;;
esac
