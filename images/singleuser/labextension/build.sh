#!/usr/bin/env bash
# `make labextension`: build the lab extension gpuhub-notices from this folder with JupyterLab's
# extension tooling, into the folder package.json's jupyterlab.outputDir names
# (../sys-prefix/share/jupyter/labextensions/gpuhub-notices, which the image copies), and record
# what it was built from in build-stamp.json (stamp.py). Commit both: images, CI and `make test`
# need no Node. Needs Node 20+ and npm, python3, and the npm registry and PyPI.
#
# The JupyterLab of the build is the image's (requirements.txt), in a venv of its own under
# build/ at the repository's root: its `jupyter-builder` (what `jupyter labextension build`
# runs since JupyterLab 4.6) makes the extension against that JupyterLab's core package.json.
# The npm packages, @jupyter/builder among them, come from package-lock.json (npm ci).
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../../.. && pwd)
venv=$repo/build/labextension-venv
# jupyterlab 4.6 asks for jupyter-builder without pinning it: pinned here, for the same build
# on every machine
jupyter_builder=1.3.0

for tool in node npm python3; do
  command -v "$tool" >/dev/null \
    || { echo "error: $tool is missing; the build needs Node 20+ with npm, and python3" >&2; exit 1; }
done
jupyterlab=$(python3 stamp.py pin)

if ! "$venv/bin/python" - "$jupyterlab" "$jupyter_builder" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version

sys.exit((version("jupyterlab"), version("jupyter_builder")) != tuple(sys.argv[1:]))
PY
then
  echo "build venv: jupyterlab==$jupyterlab jupyter-builder==$jupyter_builder in $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "jupyterlab==$jupyterlab" "jupyter-builder==$jupyter_builder"
fi
core=$("$venv/bin/python" -c \
  'import jupyterlab, pathlib; print(pathlib.Path(jupyterlab.__file__).parent / "staging/package.json")')

npm ci --no-audit --no-fund --ignore-scripts
rm -rf lib tsconfig.tsbuildinfo "$(python3 -c 'import stamp; print(stamp.output_dir())')"
npm run --silent build:lib
PATH="$venv/bin:$PATH" jupyter-builder build --core-package-file "$core" .
python3 stamp.py write
python3 stamp.py check
echo "built gpuhub-notices with JupyterLab $jupyterlab's tooling; commit images/singleuser/labextension and images/singleuser/sys-prefix"
