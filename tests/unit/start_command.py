"""start-singleuser (the server's command in the single-user image) run here as in the image:
its Python modules in a folder of their own on PYTHONPATH (as /usr/local/lib/gpu-jupyterhub),
``python3`` the given interpreter, ``jupyterhub-singleuser`` a stand-in script."""

from __future__ import annotations

import shutil
from pathlib import Path

SINGLEUSER = Path(__file__).resolve().parents[2] / "images" / "singleuser"
#: what the image copies to /usr/local/lib/gpu-jupyterhub besides tutorial_sync
MODULES = ["one_copy.py", "server_start.py"]


def start_command(
    tmp_path: Path, python: Path | str, server: str, **environ: str
) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run start-singleuser with ``server`` (a script) as
    jupyterhub-singleuser, HOME ``tmp_path`` unless ``environ`` says, and no tutorials."""
    stubs, lib = tmp_path / "bin", tmp_path / "lib"
    for folder in (stubs, lib):
        folder.mkdir(exist_ok=True)
    for name in MODULES:
        shutil.copy(SINGLEUSER / name, lib / name)
    # a venv's python is found by its path, which a symbolic link would hide
    (stubs / "python3").write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    (stubs / "jupyterhub-singleuser").write_text(server)
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(lib),
           "TUTORIALS_SHARE": str(tmp_path / "no-tutorials"), **environ}  # fmt: skip
    return [str(SINGLEUSER / "start-singleuser")], env
