#!/usr/bin/env bash
# What must run before Python exists: root, python3 and its venv module (apt), the project's
# venv. Then the deploy is Python's: `python -m deploy VERB` (deploy/__main__.py).
#
#   bash deploy/bootstrap.sh VERB [ARGS]   what `make VERB` runs: root is checked, the settings
#                                          read and checked (system python3, before anything on
#                                          this machine changes), the venv made, then the verb
#   . deploy/bootstrap.sh                  only defines log, die, ensure_root, ensure_packages,
#                                          ensure_venv (tests/run.sh, tests/bed/bed.sh)
#
# Environment: GPUHUB_VENV (the venv; default .venv in the checkout), GPUHUB_CONFIG (the config
# file, see deploy/settings.py). DEPLOY_T0 (exported): when the log's clock started, for Python.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${GPUHUB_VENV:-$REPO/.venv}
export DEPLOY_T0=${DEPLOY_T0:-$(date +%s)}

log() { printf '[%3ss] %s\n' "$(( $(date +%s) - DEPLOY_T0 ))" "$*"; }
die() { echo "error: $*" >&2; exit 1; }

ensure_root() {  # ensure_root VERB
  [ "$(id -u)" = 0 ] || die "this needs root (Docker engine, swarm, daemon.json); run: sudo make $1"
}

# Run a command with its output kept aside; shown (its end) only when it fails: quietly WHAT CMD...
quietly() {
  local what=$1 out; shift
  out=$(mktemp)
  "$@" >"$out" 2>&1 || { tail -20 "$out" >&2; rm -f "$out"; die "$what failed (output above)"; }
  rm -f "$out"
}

apt_install() {  # apt_install PACKAGE...
  command -v apt-get >/dev/null || die "missing $*; install them with your package manager (this script knows apt-get only)"
  log "installing $* (apt-get)"
  DEBIAN_FRONTEND=noninteractive quietly "apt-get update" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive quietly "apt-get install $*" \
    apt-get install -y -qq --no-install-recommends "$@"
}

# Debian packages for the commands that are missing: ensure_packages cmd:pkg ...
ensure_packages() {
  local want=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || want+=("${pair#*:}")
  done
  [ ${#want[@]} = 0 ] || apt_install "${want[@]}"
}

# The project installed into $VENV (with pip extras, e.g. test); again when pyproject.toml is
# newer than the stamp. A venv installed with extras serves a call without.
venv_ready() {  # venv_ready [extras]
  local extras=${1:-} stamp stamps
  stamps=("$VENV/.installed${extras:+-$extras}")
  [ -n "$extras" ] || stamps=("$VENV"/.installed*)  # any: the project is in it
  # a stamp names the checkout installed: a venv shared with another checkout (a git worktree
  # linking it) is installed again from this one, not left importing the other's files
  for stamp in "${stamps[@]}"; do
    [ -f "$stamp" ] && [ "$stamp" -nt "$REPO/pyproject.toml" ] \
      && [ "$(cat "$stamp")" = "$REPO" ] && return 0
  done
  return 1
}

ensure_venv() {  # ensure_venv [extras]
  local extras=${1:-}
  venv_ready "$extras" && return 0
  command -v python3 >/dev/null 2>&1 || ensure_packages python3:python3
  if [ ! -x "$VENV/bin/pip" ]; then
    python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
    quietly "python3 -m venv $VENV" python3 -m venv "$VENV"
  fi
  log "installing the project into $VENV${extras:+ (with $extras)}"
  quietly "pip install" "$VENV/bin/pip" install -q --disable-pip-version-check -e "$REPO${extras:+[$extras]}"
  local stamp
  for stamp in "$VENV"/.installed*; do  # the others name the checkout installed before
    [ "$stamp" = "$VENV/.installed${extras:+-$extras}" ] || rm -f "$stamp"
  done
  echo "$REPO" >"$VENV/.installed${extras:+-$extras}"
}

# Sourced: the functions only (and the caller's clock).
(return 0 2>/dev/null) && return 0
DEPLOY_T0=$(date +%s)  # `make VERB`'s own clock

verb=${1:-}
[ -n "$verb" ] || die "name a verb: bash deploy/bootstrap.sh VERB (make help lists them)"
case $verb in
  status|settings|check|-h|--help) ;;
  *) ensure_root "$verb" ;;
esac
command -v python3 >/dev/null 2>&1 || ensure_packages python3:python3
python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
  || die "python3 is $(python3 -V 2>&1 | cut -d' ' -f2); this needs 3.9 or newer: install a newer python3"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# The settings are checked before anything on this machine changes: here, with the system
# python3, when the venv is still to be made (python -m deploy checks them again, first thing)
if ! venv_ready; then
  case $verb in
    status|settings|check|-h|--help) ;;
    *) python3 -m deploy check "$verb" ;;
  esac
  ensure_venv
fi
exec "$VENV/bin/python" -m deploy "$@"
