"""The hub's side of the disk watch: servers a machine's watch stopped for its disk are stopped
by the hub too, and their participants told why.

Every machine that runs servers has a disk watch (``contract.DISK_WATCH``, from the single-user
image), which measures each server's home and scratch space every 10 s against the labels its
container carries (``service_spec.container_labels``: the budget and the safety line). When a
file system it watches is fuller than the safety line, it pauses the container of the server
that wrote the most there since its last round, and reports that server as stopped, with a
reason written for its participant. A paused server holds its GPU slices and its route, and
its participant sees a page that never loads; so every ``EVERY_S`` seconds the hub reads every
machine's report (``GET /disk`` on ``contract.DISK_WATCH_PORT``) and stops, the way JupyterHub
stops a server (route first, then the server; the home is kept), each server a report says was
stopped. Its participant reads the reason on their page until their next start
(``GPUSwarmSpawner.failure_message``); the dashboard lists the stop (``events.DISK_STOP``).

A machine whose watch does not answer is logged once while it lasts, and never stops anyone:
only a report that names a server stopped does.

``read_report`` is the one reader of a report (it never raises: a report from a broken or
older watch loses only the entries it cannot use); ``machine_addresses`` and ``to_stop`` are
the other pure parts. ``DiskCheck`` does the I/O: the swarm's machines, the reports, the stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timezone

from . import contract, internals, periodic
from .tolerant import number

#: Seconds between the hub's reads of the reports: the watches measure every 10 s too.
EVERY_S = 10.0
#: Seconds a machine's watch has to answer; one that does not is read again the next round.
FETCH_TIMEOUT_S = 3.0
#: The most characters of a watch's reason kept for a participant's page.
REASON_MAX = 1000
#: What a participant's reason ends with when the watch's does not say what to do.
ADVICE = (
    "Your files are kept. Delete what you no longer need (large data files, checkpoints, "
    "caches such as ~/.cache), then start your server again; ask an organizer if this happens "
    "again."
)
#: The reason given when a watch gave none.
NO_REASON = (
    "Your server was stopped because the disk of the machine running it was nearly full, and "
    "your server was writing the most to it."
)


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileSystem:
    """A file system a watch measures (sizes in bytes)."""

    path: str
    total: int | None = None
    used: int | None = None
    line_percent: float | None = None  # the safety line; None: none
    past: bool = False  # fuller than its line


@dataclass(frozen=True)
class Stopped:
    time: float  # epoch seconds
    reason: str  # written for the participant


@dataclass(frozen=True)
class ServerDisk:
    """One participant's server as a watch measured it (sizes in bytes; None: unknown)."""

    service: str
    user: str = ""
    container: str = ""
    home: int | None = None
    scratch: int | None = None
    budget: int | None = None  # None: no budget
    over: bool = False
    stopped: Stopped | None = None


@dataclass(frozen=True)
class Report:
    """A machine's report. ``problems``: the watch's own, and what the reader skipped."""

    machine: str = ""
    version: int | None = None
    time: float | None = None
    every_s: float | None = None
    filesystems: tuple[FileSystem, ...] = ()
    servers: tuple[ServerDisk, ...] = ()
    problems: tuple[str, ...] = field(default=())


def _size(value) -> int | None:
    found = number(value)
    return int(found) if found is not None and found >= 0 else None


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _filesystem(entry) -> FileSystem | None:
    if not isinstance(entry, dict) or not _text(entry.get("path")):
        return None
    return FileSystem(
        path=entry["path"],
        total=_size(entry.get("total")),
        used=_size(entry.get("used")),
        line_percent=number(entry.get("line_percent")),
        past=entry.get("past") is True,
    )


def _stopped(value) -> Stopped | None:
    if not isinstance(value, dict):
        return None
    return Stopped(time=number(value.get("time")) or 0.0, reason=_text(value.get("reason")))


def _server(entry) -> ServerDisk | None:
    if not isinstance(entry, dict) or not _text(entry.get("service")):
        return None
    return ServerDisk(
        service=entry["service"],
        user=_text(entry.get("user")),
        container=_text(entry.get("container")),
        home=_size(entry.get("home")),
        scratch=_size(entry.get("scratch")),
        budget=_size(entry.get("budget")),
        over=entry.get("over") is True,
        stopped=_stopped(entry.get("stopped")),
    )


def _entries(record: dict, key: str, read) -> tuple[tuple, list[str]]:
    """The usable entries of ``record[key]`` (a list), and a line saying how many were not."""
    listed = record.get(key)
    if listed is None:
        return (), []
    if not isinstance(listed, list):
        return (), [f"'{key}' is not a list; left out"]
    read_ones = [read(entry) for entry in listed]
    found = tuple(x for x in read_ones if x is not None)
    skipped = len(listed) - len(found)
    return found, [f"{skipped} entry(ies) of '{key}' unusable; left out"] if skipped else []


def read_report(text: str | bytes, machine: str = "") -> Report:
    """A watch's report (``GET /disk``'s body) read; never raises. ``machine``: the name the
    swarm gives the machine it came from, used when the report names none. Entries it cannot
    use are left out and said in ``problems``; a body that is no report at all reads as a
    report of nothing, whose ``problems`` say so."""
    try:
        record = json.loads(text)
    except (ValueError, TypeError):  # not JSON, not UTF-8, not text
        return Report(machine=machine, problems=("the answer is not a JSON report",))
    if not isinstance(record, dict):
        return Report(machine=machine, problems=("the answer is not a JSON object",))
    filesystems, skipped_fs = _entries(record, "filesystems", _filesystem)
    servers, skipped_servers = _entries(record, "servers", _server)
    problems = record.get("problems")
    own = [p for p in problems if isinstance(p, str)] if isinstance(problems, list) else []
    version = record.get("version")
    return Report(
        machine=_text(record.get("machine")) or machine,
        version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        time=number(record.get("time")),
        every_s=number(record.get("every_s")),
        filesystems=filesystems,
        servers=servers,
        problems=tuple(own + skipped_fs + skipped_servers),
    )


# ---- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """A server the hub has, by its service's name."""

    user: str
    server: str = ""  # a named server's name; "" for the default one
    started: float = 0.0  # epoch seconds of its start; 0: unknown
    pending: str | None = None  # JupyterHub's: "spawn", "stop", ... or None


@dataclass(frozen=True)
class Stop:
    """A server to stop, and what its participant is told."""

    service: str
    user: str
    server: str
    machine: str
    reason: str
    key: tuple  # the watch's stop it answers (service, container, time): stopped once


def for_participant(reason: str) -> str:
    """The watch's reason as the participant's page shows it: with what to do at its end when
    it does not say already (start again), and never longer than ``REASON_MAX``."""
    said = " ".join(reason.split())[:REASON_MAX] or NO_REASON
    if "start your server again" in said.lower() or "start it again" in said.lower():
        return said
    return f"{said.rstrip('.')}. {ADVICE}"


def to_stop(
    reports: Iterable[Report], running: Mapping[str, Running], done: Iterable[tuple] = ()
) -> list[Stop]:
    """The servers the hub stops: those a report says its watch stopped, that the hub has
    running and not starting or stopping, and that started before that stop (a report about
    the server before a restart is old news); each watch's stop once (``done``: the keys of
    those stopped already)."""
    done = set(done)
    chosen = []
    for report in reports:
        for seen in report.servers:
            if seen.stopped is None:
                continue
            key = (seen.service, seen.container, seen.stopped.time)
            server = running.get(seen.service)
            if key in done or server is None or server.pending:
                continue
            if server.started and seen.stopped.time and seen.stopped.time < server.started:
                continue
            done.add(key)
            reason = for_participant(seen.stopped.reason)
            chosen.append(
                Stop(seen.service, server.user, server.server, report.machine, reason, key)
            )
    return chosen


def machine_addresses(nodes: Iterable[Mapping]) -> list[tuple[str, str]]:
    """``(name, address)`` of each ready machine of the swarm (the Engine API's nodes), where
    its watch answers. A manager may show its address as 0.0.0.0 (advertised on every
    interface): its manager address's host is taken then."""
    found = []
    for node in nodes:
        status = node.get("Status") or {}
        if status.get("State") != "ready":
            continue
        address = status.get("Addr") or ""
        if address in ("", "0.0.0.0"):
            manager = (node.get("ManagerStatus") or {}).get("Addr") or ""
            address = manager.rsplit(":", 1)[0] if ":" in manager else manager
        name = (node.get("Description") or {}).get("Hostname") or str(node.get("ID", ""))[:12]
        if address and address != "0.0.0.0":
            found.append((name, address.strip("[]")))
    return found


def _url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/disk"


# ---- the check -------------------------------------------------------------------------------


class DiskCheck:
    """The periodic read of every machine's report, and the stops, for one hub."""

    def __init__(self, hub, every: float = EVERY_S, port: int = contract.DISK_WATCH_PORT):
        self.hub = hub
        self.every = every
        self.port = port
        self.timeout = FETCH_TIMEOUT_S
        self.log = hub.log
        self.done: set[tuple] = set()  # the watches' stops answered (to_stop's keys)
        self.silent: dict[str, str] = {}  # machine: why its watch did not answer (said once)
        self._client = None

    async def nodes(self) -> list[dict]:
        """The swarm's machines, from the manager's Docker API (in a thread)."""

        def read():
            if self._client is None:
                import docker

                self._client = docker.APIClient(**docker.utils.kwargs_from_env())
            return self._client.nodes()

        return await asyncio.to_thread(read)

    async def fetch(self, name: str, address: str) -> Report | None:
        """``name``'s report; None when its watch did not answer (said once while it lasts)."""
        from tornado.httpclient import AsyncHTTPClient

        url = _url(address, self.port)
        try:
            answer = await AsyncHTTPClient().fetch(
                url, request_timeout=self.timeout, connect_timeout=self.timeout, raise_error=False
            )
            failing = "" if answer.code == 200 else f"HTTP {answer.code}"
            if answer.code == 599 and answer.error is not None:
                failing = f"{type(answer.error).__name__}: {answer.error}"
        except Exception as e:  # a name that does not resolve, a refused address
            failing, answer = f"{type(e).__name__}: {e}", None
        if failing:
            if name not in self.silent:
                self.log.warning(
                    "The disk watch of %s (%s) does not answer: %s; nobody there is stopped "
                    "for the disk by the hub until it does",
                    name,
                    url,
                    failing,
                )
            self.silent[name] = failing
            return None
        if self.silent.pop(name, None) is not None:
            self.log.info("The disk watch of %s answers again", name)
        return read_report(answer.body, name)

    def running(self) -> dict[str, Running]:
        """The servers the hub has (active), by service name, with the spawner of each."""
        found = {}
        for user in list(self.hub.users.values()):
            for server_name, spawner in list(user.spawners.items()):
                service = getattr(spawner, "service_name", "")
                if not spawner.active or not service:
                    continue
                started = getattr(getattr(spawner, "orm_spawner", None), "started", None)
                if started is not None and started.tzinfo is None:
                    started = started.replace(tzinfo=timezone.utc)  # JupyterHub's: naive UTC
                found[service] = Running(
                    user.name,
                    server_name or "",
                    started.timestamp() if started is not None else 0.0,
                    spawner.pending,
                )
        return found

    async def check(self) -> list[Stop]:
        """One round: every machine's report read, and the servers their watches stopped
        stopped by the hub. Returns the stops made."""
        machines = machine_addresses(await self.nodes())
        answers = await asyncio.gather(*(self.fetch(name, addr) for name, addr in machines))
        reports = [r for r in answers if r is not None]
        made = []
        for stop in to_stop(reports, self.running(), self.done):
            try:
                await self.stop(stop)
            except Exception:
                self.log.exception(
                    "Could not stop %s for the disk of %s", stop.service, stop.machine
                )
                continue
            self.done.add(stop.key)
            made.append(stop)
        return made

    async def stop(self, stop: Stop) -> None:
        """Stop ``stop``'s server as JupyterHub does (``internals.stop_server``: route, then
        server; files kept), its participant told why."""
        user = self.hub.users[stop.user]
        spawner = user.spawners[stop.server]
        spawner.stopped_for_disk(stop.reason, stop.machine)
        await internals.stop_server(self.hub, user, stop.server)
        self.log.warning(
            "Stopped %s of %s for the disk of %s (files kept): %s",
            stop.server or "the server",
            stop.user,
            stop.machine,
            stop.reason,
        )

    async def keep(self) -> None:
        """The check at once, then every ``every`` seconds (``periodic.keep``)."""
        await periodic.keep(lambda: self.check(), self.every, self.log, "disk check")


def start(hub) -> None:
    """Start the hub's disk check (``internals.after_hub_start``)."""
    check = DiskCheck(hub)
    hub.gpuhub_disk_check = check
    hub.gpuhub_disk_task = asyncio.ensure_future(check.keep())


def install() -> None:
    """Start the disk check once JupyterHub has started (from the hub's config, when the disk
    has a safety line). Idempotent."""
    internals.after_hub_start(start)
