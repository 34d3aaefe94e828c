#!/usr/bin/env bash
# Add this GPU machine to the hub's swarm, or take it out again. Run as root in a checkout of
# this repository on the GPU machine; `make join-command` on the manager prints the exact line:
#
#   sudo ./worker_setup/setup.sh --manager ADDR[:2377] --token SWMTKN-... [--slices-per-gpu N]
#        [--registry HOST:PORT | --image-tar FILE] [--shared-folder PATH=ID ...]
#        [--simulate-gpus N] [--dry-run] ...
#   sudo ./worker_setup/setup.sh --leave [--wait SECONDS] [--force] [--dry-run]
#
# This only finds a python that can import pynvml (nvidia-ml-py) and prometheus_client (the GPU
# guard's metrics) and runs the checklist with it: `python -m worker_setup` (worker_setup/join.py;
# --help lists every option and step). That python: GPUHUB_WORKER_PYTHON, else the repository's
# venv (GPUHUB_VENV, default .venv) when it has both, else a venv of its own holding only those
# two, made once in /opt/gpu-jupyterhub. The GPU guard it starts runs with the same python.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${GPUHUB_VENV:-$REPO/.venv}
WORKER_VENV=/opt/gpu-jupyterhub/worker-venv
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

die() { echo "error: $*" >&2; exit 1; }
has_pynvml() { [ -x "$1" ] && "$1" -c 'import pynvml, prometheus_client' 2>/dev/null; }
apt_install() {  # apt_install PACKAGE: Debian's, quietly
  command -v apt-get >/dev/null || die "$1 is missing; install it with your package manager"
  local -x DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$1"; } \
    </dev/null >/dev/null 2>&1 || die "apt-get could not install $1; install it, then run this again"
}

for arg in "$@"; do  # the options' help needs neither root nor nvidia-ml-py
  case $arg in -h|--help) command -v python3 >/dev/null && exec python3 -m worker_setup --help ;; esac
done
[ "$(id -u)" = 0 ] || die "this needs root (Docker engine, daemon.json); run it with sudo"
command -v python3 >/dev/null || apt_install python3

PY=${GPUHUB_WORKER_PYTHON:-}
if [ -z "$PY" ] && has_pynvml "$VENV/bin/python"; then PY=$VENV/bin/python; fi
if [ -z "$PY" ]; then
  PY=$WORKER_VENV/bin/python
  if ! has_pynvml "$PY"; then
    python3 -m venv "$WORKER_VENV" >/dev/null 2>&1 \
      || { apt_install python3-venv; python3 -m venv --clear "$WORKER_VENV" >/dev/null; }
    "$WORKER_VENV/bin/pip" install -q --disable-pip-version-check nvidia-ml-py prometheus-client >/dev/null 2>&1 \
      || die "could not install nvidia-ml-py and prometheus-client into $WORKER_VENV (pip); check the network or set GPUHUB_WORKER_PYTHON"
  fi
fi
exec "$PY" -m worker_setup "$@"
