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

The guard's modules, each importing only those named before it (besides guard_policy,
telemetry, engine_api and the contract): guard_attribution (whose each process is),
guard_notices (what goes into a participant's container), this one (the loop: ``Guard``, its
rounds and what it carries out), guard_metrics (the Prometheus collector) and guard_command
(the command line: ``--once``, ``--help``, ``main``, which this module's ``__main__`` runs: its
one import of a module named after it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpu_swarm_spawner import contract

from . import guard_policy as policy
from . import telemetry
from .engine_api import EngineAPI, EngineUnavailable
from .guard_attribution import Proc, Server, attribute, budgets_of, container_of, servers_from
from .guard_notices import (
    NOTICES_FILE,
    NOTICES_KEPT,
    USAGE_FILE,
    gb,
    ok_notice,
    stop_notice,
    usage_changed,
    usage_record,
    warn_notice,
    write_into,
)

log = logging.getLogger("gpu-guard")

#: How often the slices the engine advertises are read again, in seconds.
ADVERTISED_MAX_AGE_S = 60.0


def send_signal(pid: int, sig: int) -> bool:
    """False when the process is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


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


if __name__ == "__main__":
    from .guard_command import main

    raise SystemExit(main())
