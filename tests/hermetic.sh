#!/usr/bin/env bash
# Run pytest (the unit and sync suites) so that nothing it starts can reach a Docker engine of
# this machine: in a mount namespace of its own, with an empty tmpfs over /run, where
# tests/hermetic.py puts a decoy engine socket that fails the session when anything connects.
# This machine's own /run (a demo's engine socket) is untouched and unseen.
#
#   tests/hermetic.sh PYTHON [pytest args...]
#   tests/hermetic.sh PYTHON --mutmut [mutmut args...]   (make mutation: mutmut runs pytest,
#                       loading tests.hermetic by pyproject.toml's [tool.mutmut])
set -euo pipefail
python=$1
shift
run=(-m pytest -p tests.hermetic)
if [ "${1:-}" = --mutmut ]; then
  shift
  run=(-m mutmut)
fi
command -v unshare >/dev/null || { echo "error: unshare (util-linux) is missing: apt-get install util-linux" >&2; exit 1; }
exec unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  mount -t tmpfs -o mode=755 gpuhub-unit-run /run
  GPUHUB_HERMETIC_RUN=1 exec "$@"
' hermetic "$python" "${run[@]}" "$@"
