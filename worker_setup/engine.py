"""This machine's Docker engine and Debian packages: installed, started, stopped.

Standard library only: the manager's deploy steps (``deploy``) and the GPU machines' worker
setup both use it, and a GPU machine's small venv holds nothing but nvidia-ml-py.

Where the engine is not the system's (the test bed's machines, each a dockerd in a network
namespace of its own), the environment says how to reach and run it:

``DOCKER_HOST``
    its socket (``unix://...``), as for Docker's own CLI and SDK;
``GPUHUB_DOCKERD_CMD``
    a shell command that starts it in the foreground (no systemd then);
``GPUHUB_DOCKERD_PIDFILE``, ``GPUHUB_DOCKERD_LOG``
    its pid file and log (``/var/run/docker.pid``, ``/var/log/gpu-jupyterhub-dockerd.log``);
``GPUHUB_ENGINE_WAIT``
    seconds to wait for it to answer after a start (60).
``GPUHUB_ENGINE_ADDR``
    where this machine reaches the ports it publishes (127.0.0.1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path


class EngineError(RuntimeError):
    """A step failed; the message says how to fix it."""


def _setting(env: Mapping[str, str], key: str, default: str) -> str:
    return env.get(key) or default


def dockerd_log(env: Mapping[str, str] = os.environ) -> str:
    return _setting(env, "GPUHUB_DOCKERD_LOG", "/var/log/gpu-jupyterhub-dockerd.log")


def dockerd_pidfile(env: Mapping[str, str] = os.environ) -> str:
    return _setting(env, "GPUHUB_DOCKERD_PIDFILE", "/var/run/docker.pid")


def docker_socket(env: Mapping[str, str] = os.environ) -> str:
    """The engine's socket on this machine's filesystem (the hub bind-mounts it)."""
    host = env.get("DOCKER_HOST", "")
    return host[len("unix://") :] if host.startswith("unix://") else "/var/run/docker.sock"


def published_addr(env: Mapping[str, str] = os.environ) -> str:
    """Where this machine reaches the ports the engine publishes: GPUHUB_ENGINE_ADDR, else
    127.0.0.1 (the test bed's manager engine is in a network namespace of its own)."""
    return env.get("GPUHUB_ENGINE_ADDR") or "127.0.0.1"


def uses_systemd(env: Mapping[str, str] = os.environ) -> bool:
    """The system's engine under systemd, unless GPUHUB_DOCKERD_CMD names another."""
    return not env.get("GPUHUB_DOCKERD_CMD") and Path("/run/systemd/system").is_dir()


#: how much of the end of the engine's own log file ``recent_log`` reads
LOG_TAIL_BYTES = 1 << 20
#: how far back ``recent_log`` reads the journal of systemd's docker unit
JOURNAL_SINCE = "-15min"


def recent_log(env: Mapping[str, str] = os.environ) -> str:
    """What the engine logged lately: the journal of systemd's docker unit where systemd runs
    it, else the end of its log file (``GPUHUB_DOCKERD_LOG``). "" when it cannot be read."""
    if uses_systemd(env):
        try:
            result = subprocess.run(
                ["journalctl", "-u", "docker", "--since", JOURNAL_SINCE, "-o", "cat", "--no-pager"],
                capture_output=True, text=True, errors="replace", timeout=30, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return result.stdout if result.returncode == 0 else ""
    try:
        with open(dockerd_log(env), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def running(env: Mapping[str, str] | None = None) -> bool:
    """The engine answers (``docker info``)."""
    if not shutil.which("docker", path=(env or os.environ).get("PATH")):
        return False
    result = subprocess.run(
        ["docker", "info"], capture_output=True, env=None if env is None else dict(env)
    )
    return result.returncode == 0


def missing_packages(wanted: Mapping[str, str]) -> list[str]:
    """The Debian packages of ``{command: package}`` whose command is not on PATH."""
    return sorted({package for command, package in wanted.items() if not shutil.which(command)})


def ensure_packages(wanted: Mapping[str, str], log: Callable[[str], None] = print) -> list[str]:
    """Install the packages whose commands are missing (apt-get); returns those installed."""
    packages = missing_packages(wanted)
    if not packages:
        return []
    if not shutil.which("apt-get"):
        raise EngineError(
            f"missing {' '.join(packages)}; install them with your package manager "
            "(this setup knows apt-get only)"
        )
    log(f"installing {' '.join(packages)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise EngineError(f"{tail}\napt-get could not install {' '.join(packages)} (above)")
    return packages


def start(env: Mapping[str, str] = os.environ) -> None:
    """Start the engine and wait until it answers."""
    if uses_systemd(env):
        if subprocess.run(["systemctl", "start", "docker"]).returncode != 0:
            raise EngineError("systemctl start docker failed; see: journalctl -u docker")
    else:
        # No init system (containers, CI, the test bed): run dockerd ourselves, in a session of
        # its own so that it outlives this process. Services prefer local images, so tasks do
        # not wait on a registry that may not exist.
        pidfile = dockerd_pidfile(env)
        Path(pidfile).unlink(missing_ok=True)
        command = env.get("GPUHUB_DOCKERD_CMD") or f"exec dockerd --pidfile {pidfile}"
        with open(dockerd_log(env), "ab") as log:
            subprocess.Popen(
                ["sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**env, "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE": "1"},
            )
    wait = float(_setting(env, "GPUHUB_ENGINE_WAIT", "60"))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if running(env):
            return
        time.sleep(0.5)
    raise EngineError(
        f"the Docker engine did not start within {wait:g} s; "
        f"read {dockerd_log(env)} (or journalctl -u docker)"
    )


def stop(env: Mapping[str, str] = os.environ) -> None:
    """Stop the engine and wait until its process is gone."""
    if uses_systemd(env):
        subprocess.run(["systemctl", "stop", "docker"], check=False)
        return
    try:
        pid = int(Path(dockerd_pidfile(env)).read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait = float(_setting(env, "GPUHUB_ENGINE_WAIT", "60"))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        # an engine this process started is its child: reaped here, or it would linger as a
        # zombie that kill(pid, 0) still finds (worker setup starts, then restarts, the engine)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise EngineError(f"dockerd (pid {pid}) did not stop within {wait:g} s")


def restart(env: Mapping[str, str] = os.environ) -> None:
    stop(env)
    start(env)


def ensure_running(log: Callable[[str], None] = print, env: Mapping[str, str] = os.environ) -> bool:
    """The engine runs: installed (Debian's docker.io) and started when it is not. True when
    this call started it."""
    if running(env):
        return False
    ensure_packages({"docker": "docker.io", "dockerd": "docker.io"}, log)
    log("starting the Docker engine")
    start(env)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m worker_setup.engine start|stop|restart|ensure``: for the test bed's machines."""
    parser = argparse.ArgumentParser(prog="python -m worker_setup.engine")
    parser.add_argument("action", choices=("start", "stop", "restart", "ensure"))
    action = parser.parse_args(argv).action
    try:
        if action == "ensure":
            ensure_running()
        else:
            {"start": start, "stop": stop, "restart": restart}[action]()
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
