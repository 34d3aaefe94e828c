"""The steps before JupyterLab (images/singleuser/server_start.py, run by start-singleuser): one
Python process for the one-copy lock, the tutorials and JAX's share; a failing step never keeps
the server from starting.

start-singleuser runs here as in the image, with a stand-in ``jupyterhub-singleuser`` that
prints its environment, and a ``python3`` that records each of its calls.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .start_command import start_command
from .test_gpu_caps import BUDGET  # a server's GPU memory budget

SERVER = "#!/bin/sh\necho serving\n"


def run(tmp_path: Path, **environ: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """start-singleuser's outcome, and the python3 calls it made."""
    command, env = start_command(tmp_path, sys.executable, SERVER, **environ)
    calls = tmp_path / "python3-calls"
    stub = tmp_path / "bin" / "python3"
    stub.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{sys.executable}" "$@"\n')
    # in the home, as in the image (python3 -m puts the current folder first on the path)
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    made = calls.read_text().splitlines() if calls.exists() else []
    return result, made


def test_one_python_process_runs_before_jupyterlab(tmp_path):
    share = tmp_path / "share"
    share.mkdir()  # a share with nothing published yet
    result, calls = run(tmp_path, TUTORIALS_SHARE=str(share))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "serving\n"
    assert calls == ["-m server_start 9"], calls
    # the start hook ran, and what it said went to the log, not to the command
    assert "tutorials: none published" in result.stderr, result.stderr


def test_a_failing_start_hook_is_reported_and_the_server_starts(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    hook = tmp_path / "lib" / "tutorial_sync"  # (lib: the image's modules, first on the path)
    hook.mkdir(parents=True)
    (hook / "__init__.py").write_text("")
    (hook / "start_hook.py").write_text("def main(argv):\n    raise OSError('share unreadable')\n")
    result, _ = run(tmp_path, TUTORIALS_SHARE=str(share))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "serving\n"
    expected = "tutorials: OSError: share unreadable; the server starts without updates"
    assert expected in result.stderr, result.stderr


def test_a_broken_step_module_is_reported_and_the_server_starts(tmp_path):
    result, _ = run(tmp_path, PYTHONPATH=str(tmp_path / "nothing-here"), **BUDGET)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "serving\n"
    assert "server start: the steps before JupyterLab failed (above); starting" in result.stderr


def test_a_failing_fraction_is_reported_and_jax_left_alone(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "gpu_caps.py").write_text("def xla_fraction():\n    raise ValueError('odd budget')\n")
    command, env = start_command(tmp_path, sys.executable, "#!/bin/sh\nenv\n", **BUDGET)
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in result.stdout
    assert "JAX's memory share: ValueError: odd budget; JAX is not capped" in result.stderr
