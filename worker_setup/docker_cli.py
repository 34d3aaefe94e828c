"""This machine's Docker engine, as the worker setup sees it: the ``docker`` command's JSON.

A GPU machine's python has the standard library and nvidia-ml-py only (no Docker SDK), so the
setup runs the ``docker`` CLI (which honours ``DOCKER_HOST``) and reads only what it prints for
``--format '{{json ...}}'``, never its text for people. Installing, starting and restarting the
engine is ``worker_setup.engine``'s; this class hands those on, so that the unit tests replace
the whole engine with one fake of these methods.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

from gpu_swarm_spawner.contract import DOCKER_SERVICE_LABEL

from . import engine


def _one_line(text: str) -> str:
    return " ".join(text.split())


class DockerCLI:
    """The engine that ``docker`` reaches in ``env`` (``DOCKER_HOST``)."""

    def __init__(self, env: Mapping[str, str] = os.environ):
        self.env = dict(env)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        command = ["docker", *args]
        if not shutil.which("docker", path=self.env.get("PATH")):  # not installed (yet)
            return subprocess.CompletedProcess(command, 127, "", "docker: command not found")
        return subprocess.run(command, capture_output=True, text=True, env=self.env, check=False)

    def _json(self, *args: str):
        """The JSON that ``docker ARGS`` printed, or None when it failed."""
        result = self._run(*args)
        if result.returncode != 0:
            return None
        try:
            return json.loads(result.stdout)
        except ValueError:
            return None

    def _error(self, *args: str) -> str:
        """Run ``docker ARGS``: "" when it worked, else its error on one line."""
        result = self._run(*args)
        if result.returncode == 0:
            return ""
        return _one_line(result.stderr or result.stdout) or f"exit status {result.returncode}"

    # ---- the engine itself (worker_setup.engine) -----------------------------------------

    def running(self) -> bool:
        return engine.running(self.env)

    def ensure_running(self, log: Callable[[str], None]) -> bool:
        """Installed and started; True when this call started it. Raises EngineError."""
        return engine.ensure_running(log, self.env)

    def restart(self) -> None:
        engine.restart(self.env)

    def recent_log(self) -> str:
        """What the engine logged lately ("" when it cannot be read)."""
        return engine.recent_log(self.env)

    # ---- what it says ---------------------------------------------------------------------

    def info(self) -> dict:
        """``docker info`` (``Name``, ``Swarm.LocalNodeState``, ``Swarm.RemoteManagers``...);
        ``{}`` when the engine does not answer."""
        return self._json("info", "--format", "{{json .}}") or {}

    def server_version(self) -> str:
        return self._json("version", "--format", "{{json .Server.Version}}") or "unknown"

    def image_id(self, image: str) -> str:
        """``sha256:...`` of a local image, "" when it is not here."""
        return self._json("image", "inspect", "--format", "{{json .Id}}", image) or ""

    def container(self, name: str) -> dict | None:
        """``docker container inspect NAME`` (``Config.Labels``, ``Config.Image``,
        ``State.Running``), None when there is no such container."""
        return self._json("container", "inspect", "--format", "{{json .}}", name)

    def service_containers(self) -> list[str]:
        """The Swarm service of each running task container here."""
        label = f'{{{{json (.Label "{DOCKER_SERVICE_LABEL}")}}}}'
        result = self._run("ps", "--filter", f"label={DOCKER_SERVICE_LABEL}", "--format", label)
        if result.returncode != 0:
            return []
        return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]

    # ---- what it does: "" when done, else the error on one line ------------------------------

    def swarm_join(self, token: str, manager: str, advertise_addr: str = "") -> str:
        advertise = ["--advertise-addr", advertise_addr] if advertise_addr else []
        return self._error("swarm", "join", "--token", token, *advertise, manager)

    def swarm_leave(self) -> str:
        return self._error("swarm", "leave", "--force")

    def run_container(self, *args: str) -> str:
        """``docker run ARGS``."""
        return self._error("run", *args)

    def remove_container(self, name: str) -> str:
        return self._error("rm", "--force", name)

    def load(self, tar: str) -> str:
        return self._error("load", "-q", "-i", tar)

    def pull(self, image: str) -> str:
        return self._error("pull", "-q", image)
