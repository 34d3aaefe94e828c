#!/usr/bin/env bash
# One run that proves (or disproves) the GPU parts on a real GPU machine: NVML discovery as the
# join does it beside nvidia-smi, the guard's reading and enforcement with real CUDA processes,
# the frameworks' memory caps, CUDA_VISIBLE_DEVICES, check-environment's device check, and
# (where it needs no change to the GPU's settings) CUDA MPS. See docs/gpu-proof.md.
#
#   tests/gpu/prove.sh OUTDIR [--only SECTION ...] [--time-limit SECONDS]
#
# Needs: a python 3.9+ (PROVE_PYTHON, default python3: the one with PyTorch, JAX and CuPy) and
# the NVIDIA driver's nvidia-smi. No Docker, no network, no root: nvidia-ml-py and
# prometheus-client come as wheels in tests/gpu/wheels/, unpacked into a scratch folder for
# this run. Changes nothing on the machine and signals only processes it started.
# Writes OUTDIR/report.json, OUTDIR/report.txt and OUTDIR/logs.txt. Exit 0: nothing failed
# (also: no GPU here, every section skipped); 1: a section failed; 2: it could not run (the line
# says why).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: tests/gpu/prove.sh OUTDIR [--only SECTION ...] [--time-limit SECONDS]" >&2
  exit 2
fi
out=$1
shift
python=${PROVE_PYTHON:-python3}
command -v "$python" >/dev/null \
  || { echo "error: $python not found; set PROVE_PYTHON to the python that has PyTorch, JAX and CuPy" >&2; exit 2; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
  || { echo "error: $python is older than Python 3.9; set PROVE_PYTHON to a newer one" >&2; exit 2; }

mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-prove.XXXXXX")
# shellcheck disable=SC2317  # run by the trap
cleanup() {
  if [ -n "${PROVE_KEEP_WORK:-}" ]; then echo "scratch folder kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The wheels are pure Python: unpacked, they are importable as they are (no pip, no network).
"$python" - "$here/wheels" "$work/site" <<'PY'
import pathlib, sys, zipfile
wheels, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
found = sorted(wheels.glob("*-py3-none-any.whl"))
if not found:
    sys.exit(f"error: no wheels in {wheels}; the checkout is incomplete")
for wheel in found:
    zipfile.ZipFile(wheel).extractall(site)
PY
export PYTHONPATH="$repo:$work/site${PYTHONPATH:+:$PYTHONPATH}"

# A hard stop past the runner's own limit, in case something hangs outside a section.
limit=${PROVE_HARD_LIMIT:-460}
stopper=()
command -v timeout >/dev/null && stopper=(timeout --kill-after=10 "$limit")
cd "$repo"
rc=0
${stopper[@]+"${stopper[@]}"} "$python" -m tests.gpu.run "$out" --work "$work" "$@" || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "error: the GPU proof ran past $limit s and was stopped; $out holds what it wrote" >&2
fi
exit "$rc"
