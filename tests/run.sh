#!/usr/bin/env bash
# `make test`: lint, unit tests (first: they fail fast), then the test bed (tests/bed/bed.sh:
# a swarm of machines on this one whose manager is an engine of its own, never this machine's
# Docker engine) and the integration and browser tests against a real hub stack on it. The
# stack under test has its own name, port and network (tests/integration/conftest.py) and is
# removed afterwards; so is the bed, except the manager's images (kept for the next run).
#
# This machine's own Docker engine (a demo, a swarm) and /etc/docker/daemon.json are recorded
# before the bed starts and checked at the end: make test fails if it changed them.
#
#   tests/run.sh [unit|all] [pytest args for the integration tests...]
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/bootstrap.sh

what=all
case ${1:-} in unit|all) what=$1; shift ;; esac

export GPUHUB_CONFIG=none  # an organizer's ./config.env is not the test stack's
ensure_venv test
log "lint (ruff)"
"$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . >/dev/null \
  || die "ruff found problems; fix them or run: .venv/bin/ruff format ."

if [ "$what" = unit ]; then
  exec bash tests/hermetic.sh "$VENV/bin/python" tests/unit tests/sync "$@"
fi

log "unit tests"
# (in a mount namespace whose /run has a decoy engine socket: tests/hermetic.sh)
bash tests/hermetic.sh "$VENV/bin/python" -q -p no:cacheprovider tests/unit tests/sync

# What of this machine's own Docker the tests must leave as they found it: the system engine
# (running or not, its process, its swarm, its services) and its daemon.json.
SYSTEM_SOCKET=/var/run/docker.sock SYSTEM_PIDFILE=/var/run/docker.pid
SYSTEM_DAEMON_JSON=/etc/docker/daemon.json
system_state() {
  local SYSTEM_DOCKER=(docker -H "unix://$SYSTEM_SOCKET")
  echo "daemon.json: $(sha256sum "$SYSTEM_DAEMON_JSON" 2>/dev/null | cut -c1-16 || echo absent)"
  if ! "${SYSTEM_DOCKER[@]}" info >/dev/null 2>&1; then echo "engine: not running"; return; fi
  echo "engine: running, pid $(cat "$SYSTEM_PIDFILE" 2>/dev/null || echo '?')"
  "${SYSTEM_DOCKER[@]}" info --format 'swarm: {{.Swarm.LocalNodeState}} node {{.Swarm.NodeID}}'
  local ids; ids=$("${SYSTEM_DOCKER[@]}" service ls -q 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$ids" ] || "${SYSTEM_DOCKER[@]}" service inspect $ids \
    --format 'service: {{.Spec.Name}} {{.ID}} version {{.Version.Index}}' | sort
}
SYSTEM_BEFORE=$(system_state)

check_system_untouched() {
  local after; after=$(system_state)
  [ "$after" = "$SYSTEM_BEFORE" ] && return 0
  echo "error: make test changed this machine's own Docker engine or /etc/docker/daemon.json, which it must never touch:" >&2
  diff <(echo "$SYSTEM_BEFORE") <(echo "$after") | sed 's/^/  /' >&2
  return 1
}

finish() {
  local rc=$?
  bash tests/bed/bed.sh down >/dev/null 2>&1 || echo "warning: tests/bed/bed.sh down failed; run it again" >&2
  check_system_untouched || rc=1
  exit "$rc"
}

# Docker (CLI, SDK, python -m deploy) goes to the bed's manager from here on, in the bed and
# in pytest alike.
eval "$(bash tests/bed/bed.sh env | sed 's/^/export /')"
# the bed goes when the tests end, pass or fail
trap finish EXIT

# The bed runs in its own process: the demo settings it loads must not reach pytest, whose
# integration conftest picks the test stack's own name, port and network.
bash tests/bed/bed.sh up 2

log "pytest (integration)"
args=("$@")
# options only (or nothing): the integration tests; named tests: those
[[ " ${args[*]} " == *" tests/"* ]] || args=(tests/integration "${args[@]}")
# A crash of pytest itself (a segmentation fault) dumps every thread's stack, the crashed one
# among them; CI shows the end of the output, so that one is printed again last.
CRASH_LOG=test-artifacts/crash.txt
mkdir -p test-artifacts && rm -f "$CRASH_LOG"
rc=0
GPUHUB_CRASH_LOG=$CRASH_LOG "$VENV/bin/python" -m pytest "${args[@]}" || rc=$?
if [ "$rc" -gt 128 ] && [ -s "$CRASH_LOG" ]; then
  cat "$CRASH_LOG" >&2
  echo "pytest crashed (signal $((rc - 128))); the thread that crashed ($CRASH_LOG):" >&2
  awk '/^Current thread/ {on = 1} on && /^$/ {exit} on' "$CRASH_LOG" >&2
fi
exit "$rc"
