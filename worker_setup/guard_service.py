"""The GPU guard as a service of this machine: installed, (re)started, removed.

A host process, not a container: it must see every process on the machine (NVML's pids are
the host's), signal participants' processes and read the driver's NVML as it is; it must keep
running while the engine restarts (the join restarts it); and it must not need an image on a
machine that may have none yet. A container would need the host's PID namespace, the NVIDIA
runtime, the engine's socket and a registry to come from, and would stop with the engine.

With systemd: the unit ``gpu-jupyterhub-guard.service`` (restarted on failure, started at
boot). Without (containers, the test bed): a process in a session of its own, its pid in
GPUHUB_GUARD_PIDFILE (/var/run/gpu-jupyterhub-guard.pid), its log in GPUHUB_GUARD_LOG
(/var/log/gpu-jupyterhub-guard.log); it does not come back after a reboot (nor does an
engine started that way): run the join line again.

Either way the guard's command line is its configuration: a join with other settings
restarts it, one with the same changes nothing. It imports what the join imports: PYTHONPATH
is this checkout, then the join's own entries (``wanted``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_swarm_spawner.contract import GUARD_METRICS_PORT, GUARD_MODES, GuardSettings

UNIT = "gpu-jupyterhub-guard.service"
UNIT_DIR = "/etc/systemd/system"
REPO = Path(__file__).resolve().parent.parent


def add_options(group: argparse.ArgumentParser, prefix: str = "") -> None:
    """The guard's settings as options of ``group`` (a parser or one of its argument groups):
    ``--mode``, ``--warn-percent``, ``--stop-percent``, ``--grace-seconds``,
    ``--metrics-port``; the join spells them ``--guard-mode`` and so on (``prefix`` "guard-"),
    as 'make join-command' passes the manager's GPUHUB_GUARD_* on. Their defaults are the
    guard's own."""
    d = GuardSettings()
    group.add_argument(
        f"--{prefix}mode",
        default=d.mode,
        choices=GUARD_MODES,
        help="off, warn (participants over budget) or enforce (then stop)",
    )
    for name, default, metavar, text in (
        ("warn-percent", d.warn_percent, "P", "warn above P%% of a budget"),
        ("stop-percent", d.stop_percent, "P", "stop above P%% of a budget"),
        ("grace-seconds", d.grace_seconds, "S", "from the first warning to a stop"),
    ):
        group.add_argument(
            f"--{prefix}{name}",
            type=float,
            default=default,
            metavar=metavar,
            help=f"{text} (%(default)g)",
        )
    group.add_argument(
        f"--{prefix}metrics-port",
        type=int,
        default=GUARD_METRICS_PORT,
        metavar="PORT",
        help="its Prometheus metrics; 0: none (%(default)s)",
    )


@dataclass(frozen=True)
class Wanted:
    """The guard as it should run: its command line and environment."""

    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]

    @property
    def env(self) -> dict[str, str]:
        return dict(self.environment)


def wanted(options: list[str], environ: Mapping[str, str]) -> Wanted:
    """The guard's command with ``options`` (``--mode enforce ...``), run by this python from
    this checkout, importing what the join imports: PYTHONPATH this checkout, then the join's
    own entries (as setup.sh makes it); the engine's socket (DOCKER_HOST) passed on. Without
    systemd the guard inherits the rest of the join's environment too; a unit has only these."""
    command = (sys.executable, "-m", "worker_setup.guard", *options)
    joins = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO)]
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), *joins])}
    if environ.get("DOCKER_HOST"):
        env["DOCKER_HOST"] = environ["DOCKER_HOST"]
    return Wanted(command, tuple(sorted(env.items())))


def uses_systemd(environ: Mapping[str, str]) -> bool:
    return not environ.get("GPUHUB_GUARD_PIDFILE") and Path("/run/systemd/system").is_dir()


def pidfile(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("GPUHUB_GUARD_PIDFILE") or "/var/run/gpu-jupyterhub-guard.pid")


def logfile(environ: Mapping[str, str]) -> str:
    return environ.get("GPUHUB_GUARD_LOG") or "/var/log/gpu-jupyterhub-guard.log"


def unit_text(w: Wanted) -> str:
    command = " ".join(_quote(part) for part in w.command)
    env = "\n".join(f"Environment={_quote(f'{k}={v}')}" for k, v in w.environment)
    return f"""[Unit]
Description=GPU JupyterHub guard: participants' GPU memory against their budgets
After=docker.service

[Service]
{env}
WorkingDirectory={REPO}
ExecStart={command}
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
"""


def _quote(text: str) -> str:
    return f'"{text}"' if any(c in text for c in ' "\\') else text


@dataclass(frozen=True)
class Running:
    """What runs now: None when nothing; ``same``: with the wanted command."""

    pid: int | None
    same: bool


class Service:
    """The guard's process on this machine, under systemd or on its own."""

    def __init__(
        self,
        environ: Mapping[str, str] = os.environ,
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
        unit_dir: str = UNIT_DIR,
        proc: str = "/proc",
    ):
        self.environ = environ
        self.systemd = uses_systemd(environ)
        self._run = run
        self.unit = Path(unit_dir) / UNIT
        self.proc = Path(proc)

    def where(self) -> str:
        return f"systemd unit {UNIT}" if self.systemd else f"pid file {pidfile(self.environ)}"

    def installed(self) -> bool:
        """Something would start it: the unit file, or the pid file."""
        return (self.unit if self.systemd else pidfile(self.environ)).is_file()

    def state(self, w: Wanted | None) -> Running:
        if self.systemd:
            active = self._systemctl("is-active", "--quiet", UNIT).returncode == 0
            same = w is not None and self.unit.is_file() and self.unit.read_text() == unit_text(w)
            return Running(0 if active else None, active and same)
        pid = self._pid()
        if pid is None:
            return Running(None, False)
        return Running(pid, w is not None and self._cmdline(pid) == w.command)

    def start(self, w: Wanted) -> int | None:
        """Start (or restart) the guard as wanted; its pid when known."""
        self.stop()
        if self.systemd:
            self.unit.write_text(unit_text(w))
            self._systemctl("daemon-reload")
            result = self._systemctl("enable", "--now", UNIT)
            if result.returncode != 0:
                raise RuntimeError(
                    f"systemctl enable --now {UNIT} failed; see journalctl -u {UNIT}"
                )
            return None
        with open(logfile(self.environ), "ab") as log:
            process = subprocess.Popen(
                list(w.command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=str(REPO),
                start_new_session=True,
                env={**self.environ, **w.env},
            )
        pidfile(self.environ).write_text(f"{process.pid}\n")
        time.sleep(1)
        if process.poll() is not None:
            raise RuntimeError(
                f"the GPU guard exited at once (status {process.returncode}); "
                f"read {logfile(self.environ)}"
            )
        return process.pid

    def stop(self, wait: float = 15) -> bool:
        """Stop it and remove what starts it; True when something was running."""
        if self.systemd:
            had = self.unit.is_file()
            if had:
                self._systemctl("disable", "--now", UNIT)
                self.unit.unlink()
                self._systemctl("daemon-reload")
            return had
        pid = self._pid()
        pidfile(self.environ).unlink(missing_ok=True)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self._alive(pid):
            time.sleep(0.1)
        if self._alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return True

    def _alive(self, pid: int) -> bool:
        # a guard this process started is its child: reap it, or it lingers as a zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _pid(self) -> int | None:
        """The pid in the pid file, when that process is a guard."""
        try:
            pid = int(pidfile(self.environ).read_text().strip())
        except (OSError, ValueError):
            return None
        command = self._cmdline(pid)
        return pid if command and "worker_setup.guard" in command else None

    def _cmdline(self, pid: int) -> tuple[str, ...]:
        try:
            raw = (self.proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            return ()
        return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)

    def _systemctl(self, *args: str) -> subprocess.CompletedProcess:
        return self._run(["systemctl", *args], capture_output=True, text=True)
