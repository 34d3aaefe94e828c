"""The GPU guard: every few seconds, each participant's GPU memory against their budget.

One runs on every GPU machine, started by the worker setup (``join.ensure_guard``) as a host
process beside the engine. Each round it

1. reads NVML (``telemetry.read``): every GPU's utilisation, memory, temperature and power,
   and every GPU process with the memory it holds;
2. finds whose each process is: its cgroup names its container (``container_of``), and the
   container carries the labels the spawner sets (user, GPU, slices, budget in MiB);
3. asks the pure policy (``guard_policy.decide``) whom to warn and what to stop;
4. carries it out: a notice written into the participant's container (``write_into``), which
   JupyterLab shows (images/singleuser/gpuhub_notices), a line in the log, and in ``enforce``
   mode SIGTERM to the process holding the most memory (SIGKILL ``--kill-after`` seconds later
   if it is still there); a process that belongs to nobody is reported in the log, never
   touched;
5. keeps the round's figures for Prometheus (``--metrics-port``, ``/metrics``).

Nothing stops it but SIGTERM: NVML failing (it is opened again next round), a GPU lost, a
process gone between reading and acting, a container without labels and the engine
restarting are logged, once each while they last, and the next round goes on. While the
engine does not answer, nobody can be attributed, so no decision is made (and no grace runs
out) until it answers again.

``python -m worker_setup.guard --once`` prints one round's reading and what the policy would
do, and changes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_swarm_spawner import contract

from . import guard_policy as policy
from . import guard_service, telemetry
from .engine_api import EngineAPI, EngineUnavailable

log = logging.getLogger("gpu-guard")

#: Where a participant's notices go, inside their container (JupyterLab reads it there).
NOTICES_FILE = "/tmp/gpuhub-guard/notices.json"
#: How many notices the file keeps.
NOTICES_KEPT = 20
#: Where a participant's own GPU figures go, beside the notices (their JupyterLab status bar
#: and gpu-info read it; images/singleuser/gpuhub_notices/usage.py is its reader).
USAGE_FILE = "/tmp/gpuhub-guard/usage.json"
#: The figures are written again at least this often (the page tells fresh from stale by it),
#: and at once when they change by more than these steps.
USAGE_REFRESH_S = 30.0
USAGE_STEP_MB = 64
USAGE_STEP_PERCENT = 5
#: How often the slices the engine advertises are read again, in seconds.
ADVERTISED_MAX_AGE_S = 60.0
MiB = 1024 * 1024

_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def container_of(cgroup: str) -> str | None:
    """The container id in a process's ``/proc/PID/cgroup`` text, None for a host process.

    cgroup v1 (``…:/docker/<id>``), v2 with cgroupfs (``0::/docker/<id>``) or systemd
    (``0::/system.slice/docker-<id>.scope``), nested engines (the last id is the innermost)."""
    found = _CONTAINER_ID.findall(cgroup)
    return found[-1] if found else None


@dataclass(frozen=True)
class Server:
    """A participant's server running here, from its container's labels."""

    container: str
    owner: str  # its service, jy-<user>[--<server>]: the policy's key
    user: str
    gpu_uuid: str
    slices: int
    budget_mb: int | None


def servers_from(containers: Iterable[Mapping]) -> tuple[dict[str, Server], list[str]]:
    """The participants' servers among the engine's containers (its list API's objects), by
    container id; and a line for each container whose labels are not usable."""
    servers, problems = {}, []
    for container in containers:
        labels = container.get("Labels") or {}
        ident = str(container.get("Id", ""))
        owner = labels.get("com.docker.swarm.service.name") or _name(container) or ident[:12]
        user, gpu = labels.get(contract.USER_LABEL), labels.get(contract.GPU_LABEL)
        if not user or not gpu:
            continue  # a server without a GPU: nothing to guard
        try:
            slices = int(labels.get(contract.SLICES_LABEL, "1"))
            budget = labels.get(contract.BUDGET_LABEL)
            budget_mb = int(budget) if budget else None
        except ValueError:
            problems.append(
                f"{owner}: labels {contract.SLICES_LABEL}/{contract.BUDGET_LABEL} "
                "are not whole numbers; its processes count as nobody's"
            )
            continue
        servers[ident] = Server(ident, owner, user, gpu, slices, budget_mb)
    return servers, problems


def _name(container: Mapping) -> str:
    names = container.get("Names") or []
    return names[0].lstrip("/") if names else ""


def budgets_of(servers: Iterable[Server]) -> dict[str, policy.Budget]:
    return {
        s.owner: policy.Budget(s.gpu_uuid, s.budget_mb) for s in servers if s.budget_mb is not None
    }


def attribute(
    snapshot: telemetry.Snapshot,
    containers: Mapping[int, str | None],
    servers: Mapping[str, Server],
) -> policy.Reading:
    """The policy's reading: each process with the server it belongs to (None: nobody's).
    A process whose memory NVML cannot tell counts as 0 MiB."""
    processes = []
    for p in snapshot.processes:
        server = servers.get(containers.get(p.pid) or "")
        owner = server.owner if server else None
        processes.append(policy.GPUProcess(p.pid, p.gpu_uuid, p.used_mb or 0, owner))
    return policy.Reading(frozenset(g.uuid for g in snapshot.gpus), tuple(processes))


# ---- what participants read --------------------------------------------------------------


def gb(mb: float) -> str:
    return f"{mb / 1024:.1f} GB"


@dataclass(frozen=True)
class ProcessInfo:
    """What the participant knows a process by: its pid inside their server, its command."""

    pid_inside: int | None
    command: str

    def describe(self, pid: int) -> str:
        inside = self.pid_inside if self.pid_inside is not None else pid
        return f"pid {inside} in your server ({self.command})" if self.command else f"pid {inside}"


def warn_notice(
    w: policy.Warn,
    server: Server,
    gpu_name: str,
    settings: policy.GuardSettings,
    wall_now: float,
    now: float,
    top: str,
) -> dict:
    """The notice for a participant over their budget; ``top``: their biggest process."""
    share = f"{server.slices} slice{'s' if server.slices != 1 else ''} of {gpu_name}"
    text = (
        f"Your processes use {gb(w.used_mb)} of GPU memory; your budget is {gb(w.budget_mb)} "
        f"({share}), and the others on this GPU need theirs. Free some (del tensors you no "
        "longer need, torch.cuda.empty_cache()) or restart a kernel."
    )
    if w.stop_at is not None:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(wall_now + (w.stop_at - now)))
        stop_line = w.budget_mb * settings.stop_percent / 100
        text += (
            f" If you still use more than {gb(stop_line)} at {when}, the process holding the "
            f"most ({top}) will be stopped."
        )
    return {
        "id": f"warn-{w.owner}-{int(wall_now - (now - w.over_since))}",
        "level": "warning",
        "time": wall_now,
        "title": "GPU memory over your budget",
        "message": text,
    }


def stop_notice(
    s: policy.Stop, settings: policy.GuardSettings, wall_now: float, process: str
) -> dict:
    text = (
        f"The GPU guard stopped {process}, which held {gb(s.process_mb)} of GPU memory: your "
        f"processes used {gb(s.used_mb)}, above {gb(s.stop_line_mb)} ({settings.stop_percent:g}%"
        f" of your {gb(s.budget_mb)} budget) for more than {settings.grace_seconds:g} s. Your "
        "server, your files and your other processes are untouched; restart the kernel and use "
        "less GPU memory (a smaller batch or model)."
    )
    return {
        "id": f"stop-{s.owner}-{s.pid}-{int(wall_now)}",
        "level": "error",
        "time": wall_now,
        "title": "A process of yours was stopped: too much GPU memory",
        "message": text,
    }


def ok_notice(owner: str, wall_now: float) -> dict:
    return {
        "id": f"ok-{owner}-{int(wall_now)}",
        "level": "info",
        "time": wall_now,
        "title": "GPU memory back within your budget",
        "message": "Thank you: your processes are within your GPU memory budget again.",
    }


# ---- the machine: /proc, signals ----------------------------------------------------------


class Proc:
    """This machine's processes, as /proc shows them (the guard runs in the host's PID
    namespace, where NVML's pids are)."""

    def __init__(self, root: str = "/proc"):
        self.root = Path(root)

    def _read(self, pid: int, name: str) -> str:
        return (self.root / str(pid) / name).read_text(errors="replace")

    def cgroup(self, pid: int) -> str | None:
        try:
            return self._read(pid, "cgroup")
        except OSError:
            return None  # gone

    def start_time(self, pid: int) -> int | None:
        """Field 22 of /proc/PID/stat: tells a process from a later one with its pid."""
        try:
            stat = self._read(pid, "stat")
            return int(stat.rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return None

    def info(self, pid: int) -> ProcessInfo:
        inside = None
        try:
            for line in self._read(pid, "status").splitlines():
                if line.startswith("NSpid:"):
                    inside = int(line.split()[-1])
            command = " ".join(self._read(pid, "cmdline").split("\0")).strip()
        except (OSError, ValueError):
            command = ""
        return ProcessInfo(inside, command[:80] + ("..." if len(command) > 80 else ""))


def send_signal(pid: int, sig: int) -> bool:
    """False when the process is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def usage_record(
    server: Server, reading: policy.Reading, gpus: Mapping[str, telemetry.GPUStats], now: float
) -> dict:
    """What ``USAGE_FILE`` says to the participant of ``server``: their processes' GPU memory
    against their budget, and their GPU's figures (shared by the holders of its slices)."""
    used = sum(
        p.used_mb
        for p in reading.processes
        if p.owner == server.owner and p.gpu_uuid == server.gpu_uuid
    )
    gpu = gpus.get(server.gpu_uuid)
    return {
        "time": now,
        "gpu": server.gpu_uuid,
        "used_mb": used,
        "budget_mb": server.budget_mb,
        "gpu_utilization": gpu.utilization_percent if gpu else None,
        "gpu_memory_used_mb": gpu.memory_used_mb if gpu else None,
        "gpu_memory_total_mb": gpu.memory_total_mb if gpu else None,
    }


def usage_changed(last: dict | None, new: dict) -> bool:
    """Whether ``new`` is worth writing over ``last`` (the previous one written)."""
    if last is None or new["time"] - last["time"] >= USAGE_REFRESH_S:
        return True
    if (last["gpu"], last["budget_mb"]) != (new["gpu"], new["budget_mb"]):
        return True
    if abs(new["used_mb"] - last["used_mb"]) >= USAGE_STEP_MB:
        return True
    before, now = last["gpu_utilization"], new["gpu_utilization"]
    if before is None or now is None:
        return (before is None) != (now is None)  # the figure appeared or went away
    return abs(now - before) >= USAGE_STEP_PERCENT


def write_into(root: str, text: str, path: str = NOTICES_FILE) -> None:
    """Write ``text`` to ``path`` under a container's root (``/proc/PID/root``), atomically.

    The participant owns that file system: every step below its root is opened relative to the
    last without following symbolic links, so a link they plant (``/tmp/gpuhub-guard`` pointing
    at the host's /etc, say) fails the write instead of redirecting it."""
    folder_path, name = os.path.split(path)
    directory = os.O_RDONLY | os.O_DIRECTORY
    fds = [os.open(root, directory)]  # the magic link: followed on purpose, into the container
    try:
        for part in folder_path.strip("/").split("/"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fds[-1])
            fds.append(os.open(part, directory | os.O_NOFOLLOW, dir_fd=fds[-1]))
        temporary = f"{name}.{os.getpid()}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=fds[-1])
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o644, dir_fd=fds[-1]), "w") as f:
            f.write(text)
        os.rename(temporary, name, src_dir_fd=fds[-1], dst_dir_fd=fds[-1])
    finally:
        for fd in reversed(fds):
            os.close(fd)


# ---- the guard ----------------------------------------------------------------------------


@dataclass
class Options:
    """The guard's settings beyond the policy's (``python -m worker_setup.guard --help``)."""

    interval: float = 5.0
    kill_after: float = 10.0
    machine: str = field(default_factory=socket.gethostname)


@dataclass
class Round:
    """One round's figures, for the metrics and ``--once``."""

    snapshot: telemetry.Snapshot
    servers: dict[str, Server]
    reading: policy.Reading | None  # None: the engine did not answer
    actions: tuple[policy.Action, ...] = ()
    slices: dict[str, int] = field(default_factory=dict)  # advertised here, per GPU


class Guard:
    def __init__(
        self,
        settings: policy.GuardSettings,
        nvml,
        engine: EngineAPI,
        options: Options | None = None,
        proc: Proc | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        kill: Callable[[int, int], bool] = send_signal,
    ):
        self.settings = settings
        self.nvml = nvml
        self.engine = engine
        self.options = options or Options()
        self.proc = proc or Proc()
        self.clock, self.wall, self.kill = clock, wall, kill
        self.state = policy.GuardState()
        self.nvml_open = False
        self.last: Round | None = None
        self.lock = threading.Lock()  # the metrics thread reads ``last`` and the counters
        self.warnings: dict[tuple[str, str], int] = {}  # (user, gpu) -> warnings begun
        self.stops: dict[tuple[str, str], int] = {}
        self.errors: dict[str, int] = {}  # kind -> count
        self._containers: dict[tuple[int, int | None], str | None] = {}
        self._notices: dict[str, list[dict]] = {}  # container -> its notices, newest last
        self._usage: dict[str, dict] = {}  # container -> the figures last written into it
        self._pending_kill: dict[int, tuple[int | None, float]] = {}  # pid -> start, when
        self._starts: dict[int, int | None] = {}  # this round's GPU pids -> their start time
        self._said: set[str] = set()  # problems logged while they last
        self._slices: dict[str, int] = {}  # what the engine advertises, per GPU
        self._slices_read: float | None = None  # when (the guard's clock); None: read again

    # -- one round --

    def observe(self, now: float | None = None) -> tuple[Round, policy.Decision | None]:
        """Read the GPUs and the servers, and ask the policy (at ``now``, the guard's clock);
        nothing is done yet."""
        snapshot = self._read_gpus()
        servers = self._servers()
        if servers is None:
            return Round(snapshot, {}, None, slices=self._slices), None
        slices = self._advertised()
        containers = self._containers_of(p.pid for p in snapshot.processes)
        reading = attribute(snapshot, containers, servers)
        decision = policy.decide(
            reading,
            budgets_of(servers.values()),
            self.settings,
            self.clock() if now is None else now,
            self.state,
        )
        return Round(snapshot, servers, reading, decision.actions, slices), decision

    def round(self) -> Round:
        """One round: observe, then warn, stop and notify as decided."""
        now, wall_now = self.clock(), self.wall()
        done, decision = self.observe(now)
        if decision is not None:
            by_owner = {s.owner: s for s in done.servers.values()}
            previous, self.state = self.state, decision.state
            self._act(decision.actions, by_owner, done.snapshot, now, wall_now)
            for owner in set(previous.over_since) - set(self.state.over_since):
                if owner in by_owner and by_owner[owner].gpu_uuid in done.reading.gpus:
                    log.info("%s is back within budget", owner)
                    self._notify(by_owner[owner], ok_notice(owner, wall_now))
        self._finish_kills(now)
        if done.reading is not None:
            self._share_usage(done, wall_now)
        with self.lock:
            self.last = done
        return done

    def _problem(self, kind: str, message: str) -> None:
        """Log a problem once while it lasts; count it every time."""
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)

    def _resolved(self, prefix: str) -> None:
        for message in [m for m in self._said if m.startswith(prefix)]:
            self._said.discard(message)
            log.info("%s: fine again", message.split(";")[0])

    def _read_gpus(self) -> telemetry.Snapshot:
        try:
            if not self.nvml_open:
                self.nvml.nvmlInit()
                self.nvml_open = True
                self._resolved("NVML")
        except self.nvml.NVMLError as e:
            self._problem("nvml", f"NVML: cannot start ({e}); trying again next round")
            return telemetry.Snapshot((), (), ())
        snapshot = telemetry.read(self.nvml)
        for line in snapshot.errors:
            self._problem("nvml", f"NVML: {line}")
        if not snapshot.gpus and snapshot.errors:  # the driver went away: open it again
            self._close_nvml()
        if not snapshot.errors:
            self._resolved("NVML")
        return snapshot

    def _close_nvml(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()
        self.nvml_open = False

    def _servers(self) -> dict[str, Server] | None:
        try:
            found = self.engine.containers(contract.USER_LABEL)
        except EngineUnavailable as e:
            self._problem("engine", f"engine: {e}; no decisions until it answers")
            self._slices_read = None
            return None
        self._resolved("engine")
        servers, problems = servers_from(found)
        for line in problems:
            self._problem("labels", f"labels: {line}")
        return servers

    def _advertised(self) -> dict[str, int]:
        """The slices this machine's engine advertises per GPU, read again every minute and
        after the engine was away (a join changes them by restarting the engine)."""
        now = self.clock()
        if self._slices_read is None or now - self._slices_read >= ADVERTISED_MAX_AGE_S:
            try:
                info = self.engine.info()
            except EngineUnavailable as e:
                self._problem("engine", f"engine: {e}; slices advertised here unknown")
                return self._slices
            self._slices = contract.advertised_slices(
                info.get("GenericResources"), info.get("Labels")
            )
            self._slices_read = now
        return self._slices

    def _containers_of(self, pids: Iterable[int]) -> dict[int, str | None]:
        """Each pid's container (cached by pid and start time; forgotten once gone)."""
        seen, found = set(), {}
        self._starts = {}
        for pid in pids:
            key = (pid, self.proc.start_time(pid))
            self._starts[pid] = key[1]
            seen.add(key)
            if key not in self._containers:
                cgroup = self.proc.cgroup(pid)
                self._containers[key] = container_of(cgroup) if cgroup is not None else None
            found[pid] = self._containers[key]
        for key in set(self._containers) - seen:
            del self._containers[key]
        return found

    # -- acting --

    def _act(self, actions, by_owner: Mapping[str, Server], snapshot, now, wall_now) -> None:
        names = {g.uuid: g.name for g in snapshot.gpus}
        for action in actions:
            if isinstance(action, policy.Report):
                log.info(
                    "GPU process %d on %s (%s): %s; not touched",
                    action.pid,
                    action.gpu_uuid,
                    gb(action.used_mb),
                    action.reason,
                )
                continue
            server = by_owner[action.owner]
            if isinstance(action, policy.Warn):
                if action.first:
                    self._count(self.warnings, server)
                    log.warning(
                        "%s (%s) uses %s of their %s budget on %s",
                        action.owner,
                        server.user,
                        gb(action.used_mb),
                        gb(action.budget_mb),
                        action.gpu_uuid,
                    )
                    top = self.proc.info(action.pids[0]).describe(action.pids[0])
                    notice = warn_notice(
                        action,
                        server,
                        names.get(action.gpu_uuid, "the GPU"),
                        self.settings,
                        wall_now,
                        now,
                        top,
                    )
                    self._notify(server, notice)
            elif isinstance(action, policy.Stop):
                self._stop(action, server, now, wall_now)

    def _stop(self, s: policy.Stop, server: Server, now: float, wall_now: float) -> None:
        info = self.proc.info(s.pid).describe(s.pid)
        start = self.proc.start_time(s.pid)
        # gone, or its pid another process's since NVML listed it
        if (
            start is None
            or start != self._starts.get(s.pid)
            or not self.kill(s.pid, signal.SIGTERM)
        ):
            log.info("%s: pid %d is already gone", s.owner, s.pid)
            return
        self._pending_kill[s.pid] = (start, now + self.options.kill_after)
        self._count(self.stops, server)
        log.warning(
            "%s (%s): stopped pid %d (%s of GPU memory; they used %s of %s)",
            s.owner,
            server.user,
            s.pid,
            gb(s.process_mb),
            gb(s.used_mb),
            gb(s.budget_mb),
        )
        self._notify(server, stop_notice(s, self.settings, wall_now, info))

    def _finish_kills(self, now: float) -> None:
        """SIGKILL what SIGTERM did not end within --kill-after seconds (the same process:
        its start time tells it from a later one with the pid)."""
        for pid, (start, when) in list(self._pending_kill.items()):
            current = self.proc.start_time(pid)
            if current != start:
                del self._pending_kill[pid]
            elif now >= when:
                del self._pending_kill[pid]
                if self.kill(pid, signal.SIGKILL):
                    log.warning("pid %d did not end on SIGTERM; sent SIGKILL", pid)

    def _count(self, counter: dict, server: Server) -> None:
        with self.lock:
            key = (server.user, server.gpu_uuid)
            counter[key] = counter.get(key, 0) + 1

    def _share_usage(self, done: Round, wall_now: float) -> None:
        """Each participant's own figures into their container (``USAGE_FILE``), when they
        changed or are about to go stale."""
        gpus = {g.uuid: g for g in done.snapshot.gpus}
        for container in set(self._usage) - set(done.servers):
            del self._usage[container]  # stopped: forgotten
        for container, server in done.servers.items():
            record = usage_record(server, done.reading, gpus, wall_now)
            if not usage_changed(self._usage.get(container), record):
                continue
            if self._write(server, json.dumps(record), USAGE_FILE, "usage"):
                self._usage[container] = record

    def _write(self, server: Server, text: str, path: str, what: str) -> bool:
        """``text`` into ``path`` in the server's container; False when it could not be."""
        try:
            pid = self.engine.container_pid(server.container)
            if not pid:
                return False  # it has just stopped
            write_into(str(self.proc.root / str(pid) / "root"), text, path)
        except (EngineUnavailable, OSError) as e:
            self._problem(what, f"{what} to {server.owner}: {e}")
            return False
        return True

    def _notify(self, server: Server, notice: dict) -> None:
        """Write the participant's notices into their container's file system."""
        kept = self._notices.setdefault(server.container, [])
        kept[:] = [n for n in kept if n["id"] != notice["id"]][-(NOTICES_KEPT - 1) :] + [notice]
        self._write(server, json.dumps({"notices": kept}), NOTICES_FILE, "notice")

    # -- running --

    def run(self, stop: threading.Event) -> None:
        log.info(
            "GPU guard on %s: mode %s, warn above %g%% of a budget, stop above %g%% after "
            "%g s, a round every %g s",
            self.options.machine,
            self.settings.mode,
            self.settings.warn_percent,
            self.settings.stop_percent,
            self.settings.grace_seconds,
            self.options.interval,
        )
        while not stop.is_set():
            started = self.clock()
            try:
                self.round()
            except Exception:  # a bug must not end the guarding of every other GPU
                self.errors["round"] = self.errors.get("round", 0) + 1
                log.exception("this round failed; the next one goes on")
            stop.wait(max(0.0, self.options.interval - (self.clock() - started)))
        if self.nvml_open:
            self._close_nvml()
        log.info("GPU guard stopped")


# ---- metrics ------------------------------------------------------------------------------


def metric_families(guard: Guard):
    """The last round as Prometheus metric families (prometheus_client's)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    machine = guard.options.machine
    with guard.lock:
        last = guard.last
        warnings, stops, errors = dict(guard.warnings), dict(guard.stops), dict(guard.errors)

    def gauge(name: str, doc: str, labels: list[str]):
        return GaugeMetricFamily(f"gpuhub_{name}", doc, labels=["machine", *labels])

    gpu = {
        "util": gauge("gpu_utilization_percent", "GPU utilisation", ["gpu"]),
        "used": gauge("gpu_memory_used_bytes", "GPU memory in use", ["gpu"]),
        "total": gauge("gpu_memory_total_bytes", "GPU memory", ["gpu"]),
        "temp": gauge("gpu_temperature_celsius", "GPU temperature", ["gpu"]),
        "power": gauge("gpu_power_watts", "GPU power draw", ["gpu"]),
    }
    info = gauge("gpu_info", "A GPU (or MIG instance) read by the guard", ["gpu", "name", "parent"])
    slices_used = gauge("gpu_slices_used", "Slices held by participants' servers here", ["gpu"])
    slices_total = gauge("gpu_slices_total", "Slices this machine's engine advertises", ["gpu"])
    user_used = gauge(
        "participant_gpu_memory_used_bytes", "A participant's GPU memory in use", ["gpu", "user"]
    )
    user_budget = gauge(
        "participant_gpu_memory_budget_bytes", "A participant's GPU memory budget", ["gpu", "user"]
    )
    unowned = gauge(
        "unattributed_gpu_memory_bytes", "GPU memory of processes of no participant", ["gpu"]
    )
    engine_up = gauge("guard_engine_up", "1 when the guard could read the engine's containers", [])
    if last is not None:
        for g in last.snapshot.gpus:
            info.add_metric([machine, g.uuid, g.name, g.parent_uuid or ""], 1)
            used = None if g.memory_used_mb is None else g.memory_used_mb * MiB
            figures = {
                "util": g.utilization_percent,
                "temp": g.temperature_c,
                "power": g.power_w,
                "used": used,
                "total": g.memory_total_mb * MiB,
            }
            for key, value in figures.items():
                if value is not None:
                    gpu[key].add_metric([machine, g.uuid], value)
        engine_up.add_metric([machine], 0 if last.reading is None else 1)
        held: dict[str, int] = {}
        for s in last.servers.values():
            held[s.gpu_uuid] = held.get(s.gpu_uuid, 0) + s.slices
        for uuid, n in sorted(held.items()):
            slices_used.add_metric([machine, uuid], n)
        for uuid, n in sorted(last.slices.items()):
            slices_total.add_metric([machine, uuid], n)
        by_owner = {s.owner: s for s in last.servers.values()}
        used: dict[tuple[str, str], int] = {}
        nobody: dict[str, int] = {}
        for p in last.reading.processes if last.reading else ():
            server = by_owner.get(p.owner or "")
            if server is None:
                nobody[p.gpu_uuid] = nobody.get(p.gpu_uuid, 0) + p.used_mb
            else:
                key = (p.gpu_uuid, server.user)
                used[key] = used.get(key, 0) + p.used_mb
        for s in last.servers.values():
            key = (s.gpu_uuid, s.user)
            user_used.add_metric([machine, *key], used.get(key, 0) * MiB)
            if s.budget_mb is not None:
                user_budget.add_metric([machine, *key], s.budget_mb * MiB)
        for uuid, mb in sorted(nobody.items()):
            unowned.add_metric([machine, uuid], mb * MiB)
    yield from gpu.values()
    yield from (info, slices_used, slices_total, user_used, user_budget, unowned, engine_up)
    counted = (
        ("participant_warnings", "Times a participant went over budget", warnings),
        ("participant_stops", "Processes the guard stopped", stops),
    )
    for name, doc, counts in counted:
        family = CounterMetricFamily(f"gpuhub_{name}", doc, labels=["machine", "user", "gpu"])
        for (user, uuid), n in sorted(counts.items()):
            family.add_metric([machine, user, uuid], n)
        yield family
    family = CounterMetricFamily(
        "gpuhub_guard_errors", "Problems met, by kind", labels=["machine", "kind"]
    )
    for kind, n in sorted(errors.items()):
        family.add_metric([machine, kind], n)
    yield family


def serve_metrics(guard: Guard, address: str, port: int):
    """Serve /metrics on ``address:port`` in a thread of its own."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    class Collector:
        def collect(self):
            return metric_families(guard)

    registry = CollectorRegistry()
    registry.register(Collector())
    return start_http_server(port, addr=address, registry=registry)


# ---- the command line ---------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m worker_setup.guard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    guard_service.add_options(parser)
    parser.add_argument(
        "--interval",
        type=float,
        default=Options.interval,
        metavar="S",
        help="seconds between rounds (%(default)g)",
    )
    parser.add_argument(
        "--kill-after",
        type=float,
        default=Options.kill_after,
        metavar="S",
        help="SIGKILL after SIGTERM (%(default)g)",
    )
    parser.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR")
    parser.add_argument("--machine", default="", help="the machine's name in metrics (hostname)")
    parser.add_argument(
        "--once", action="store_true", help="print one round's reading and decision; change nothing"
    )
    args = parser.parse_args(argv)
    try:
        args.settings = policy.GuardSettings(
            args.mode, args.warn_percent, args.stop_percent, args.grace_seconds
        )
    except ValueError as e:
        parser.error(str(e))
    if args.interval <= 0 or args.kill_after < 0:
        parser.error("--interval must be above 0 and --kill-after at least 0 seconds")
    return args


def describe_round(done: Round) -> list[str]:
    """``--once``'s lines: the GPUs, the processes and whose, and the policy's actions."""
    lines = []
    for g in done.snapshot.gpus:
        used = "?" if g.memory_used_mb is None else gb(g.memory_used_mb)
        extra = [
            f"{g.utilization_percent}% busy" if g.utilization_percent is not None else "",
            f"{g.temperature_c} C" if g.temperature_c is not None else "",
            f"{g.power_w:.0f} W" if g.power_w is not None else "",
        ]
        if g.uuid in done.slices:
            held = sum(s.slices for s in done.servers.values() if s.gpu_uuid == g.uuid)
            extra.append(f"{held} of {done.slices[g.uuid]} slices held")
        lines.append(
            f"{g.uuid}  {g.name}  {used} of {gb(g.memory_total_mb)} in use  "
            + "  ".join(e for e in extra if e)
        )
    by_owner = {s.owner: s for s in done.servers.values()}
    for p in done.reading.processes if done.reading else ():
        server = by_owner.get(p.owner or "")
        whose = f"{server.owner} ({server.user})" if server else "no participant's"
        lines.append(f"  pid {p.pid:>7}  {gb(p.used_mb):>8}  on {p.gpu_uuid}  {whose}")
    if done.reading is None:
        lines.append("  (the engine did not answer: processes not attributed)")
    lines += [f"  error: {e}" for e in done.snapshot.errors]
    lines += [f"  would {type(a).__name__.lower()}: {a}" for a in done.actions]
    return lines


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    from .gpus import load_nvml

    nvml = load_nvml()
    try:
        engine = EngineAPI(environ)
    except EngineUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    options = Options(args.interval, args.kill_after, args.machine or socket.gethostname())
    guard = Guard(args.settings, nvml, engine, options)
    if args.once:
        print("\n".join(describe_round(guard.observe()[0])))
        return 0
    if args.metrics_port:
        try:
            serve_metrics(guard, args.metrics_addr, args.metrics_port)
        except OSError as e:
            print(
                f"error: cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {e}; "
                "choose another --metrics-port (0: none)",
                file=sys.stderr,
            )
            return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    guard.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
