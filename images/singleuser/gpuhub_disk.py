"""The disk watch: what each participant's server writes on this machine, against their budget
and the machine's safety line.

A participant's home (a Docker volume on this machine, or their folder on shared storage) and
their container's writable layer (``/tmp`` and every other file outside the home: their
"scratch") take disk that the machine's engine and every other participant need. Where the
storage cannot enforce a limit, this watch does what the GPU guard does for GPU memory:

- **the budget** (``gpu-jupyterhub.disk-budget-mb`` on the server's container, the hub's
  GPUHUB_DISK_BUDGET_GB): a participant whose home and scratch together pass it is warned on
  their JupyterLab page (a notice, ``NOTICES_FILE``, which images/singleuser/gpuhub_notices
  shows), with the figures and what to do; told again when they are back within it;
- **the safety line** (``gpu-jupyterhub.disk-safety-percent``, GPUHUB_DISK_SAFETY_PERCENT): a
  file system holding servers' homes or writable layers that is filled past it (df's Use%)
  never fills up: the server that wrote the most to it since the last round is *paused*
  (``docker pause``: every process of it frozen at once, nothing lost, and Swarm does not
  restart a paused container), told why in a notice, and reported as stopped; the hub, which
  reads the report (gpu_swarm_spawner/disk.py), stops that server the way JupyterHub stops
  one (its files kept) and shows the reason on the participant's page and the dashboard. One
  server per file system per round: the next round pauses the next writer if the disk still
  fills. A file system past its line that nobody writes to pauses nobody (pausing frees
  nothing) and is reported.

Every ``--every`` seconds (10) it reads the engine (the servers: containers labelled
``gpu-jupyterhub.user``), measures each server's home and writable layer by walking them (the
blocks their files take: a sparse file counts what it holds, a file linked twice once), and the
fill of the file systems holding them. It serves the last round's report as JSON at
``GET /disk`` on ``--port`` (9446), the one format the hub reads::

    {"version": 1, "machine": "w1", "time": 1732350000.5, "every_s": 10,
     "filesystems": [{"path": "/var/lib/docker", "total": 1000, "used": 900,
                      "line_percent": 90.0, "past": true}],
     "servers": [{"service": "jy-alice", "user": "alice", "container": "<id>",
                  "home": 123, "scratch": 456, "budget": 20971520000, "over": false,
                  "stopped": null or {"time": 1732350000.5, "reason": "Your server was ..."}}],
     "problems": ["..."]}

It runs as the container ``gpuhub-disk`` of the machine's engine (worker_setup/disk_watch.py
starts it; the join, `make demo` and `make up` do): root, the host's network and processes, the
engine's socket at ``/var/run/docker.sock`` and the machine's file system read-only at ``/host``
(the paths the engine names are the machine's; a home is read as its server sees it, ``Watch.
where``). Standard library only; ``decide`` is pure.
``gpuhub-disk once`` prints one round's reading and what would be done, and does nothing.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import io
import json
import os
import signal
import socket
import stat
import sys
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

# The names the hub uses (gpu_swarm_spawner/contract.py; tests hold them equal): this program
# runs from the single-user image, without the hub's package.
USER_LABEL = "gpu-jupyterhub.user"
DISK_BUDGET_LABEL = "gpu-jupyterhub.disk-budget-mb"
DISK_SAFETY_LABEL = "gpu-jupyterhub.disk-safety-percent"
SERVICE_LABEL = "com.docker.swarm.service.name"
DISK_WATCH_PORT = 9446
HOME_PATH = "/home/jovyan"
#: Beside the GPU guard's notices.json (images/singleuser/gpuhub_notices reads both).
NOTICES_FILE = "/tmp/gpuhub-guard/disk-notices.json"
NOTICES_KEPT = 10
EVERY_S = 10.0
#: Less written than this in a round is not writing (the journal of a file system, a log line).
MIN_WRITE = 1024 * 1024
#: A participant over their budget is told again when their use moved this much of it.
RETELL_FRACTION = 0.05
MiB = 1024 * 1024
GiB = 1024 * MiB
REPORT_VERSION = 1


# ---- the reading and the decision (pure) ------------------------------------------------


@dataclass(frozen=True)
class FileSystem:
    """One file system holding homes or writable layers: ``key`` tells it from the others
    (its device number), ``path`` names it for people, sizes in bytes (``used`` and
    ``available`` as df counts them: ``used + available`` is what non-root may fill)."""

    key: int
    path: str
    total: int
    used: int
    available: int

    @property
    def percent(self) -> float:
        usable = self.used + self.available
        return 100.0 * self.used / usable if usable else 0.0


@dataclass(frozen=True)
class Server:
    """A participant's server here, as read: its container, its home and scratch (bytes, None
    when they could not be measured) and the file systems they are on (``FileSystem.key``);
    its budget (bytes) and safety line (percent), None where its labels set none."""

    container: str
    service: str
    user: str
    home: int | None = None
    scratch: int | None = None
    home_fs: int | None = None
    scratch_fs: int | None = None
    budget: int | None = None
    line: float | None = None
    paused: bool = False

    @property
    def total(self) -> int:
        return (self.home or 0) + (self.scratch or 0)

    @property
    def over(self) -> bool:
        """Over its budget (never, without one)."""
        return bool(self.budget) and self.total > self.budget

    def on(self, fs: int) -> int:
        """Bytes of this server on file system ``fs``."""
        return (self.home or 0) * (self.home_fs == fs) + (self.scratch or 0) * (
            self.scratch_fs == fs
        )


@dataclass(frozen=True)
class Reading:
    time: float  # epoch seconds
    machine: str
    filesystems: Mapping[int, FileSystem]
    servers: tuple[Server, ...]
    every_s: float = EVERY_S


@dataclass(frozen=True)
class Stopped:
    time: float
    reason: str


@dataclass(frozen=True)
class WatchState:
    """What one round hands to the next: each server's bytes per file system, the use each
    participant over budget was last told, and the servers this watch paused."""

    written: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    told: Mapping[str, int] = field(default_factory=dict)
    stopped: Mapping[str, Stopped] = field(default_factory=dict)


@dataclass(frozen=True)
class Warn:
    server: Server
    first: bool


@dataclass(frozen=True)
class Within:
    """Back within the budget after a warning."""

    server: Server


@dataclass(frozen=True)
class Stop:
    server: Server
    filesystem: FileSystem
    line: float
    wrote: int  # bytes since the last round
    reason: str


@dataclass(frozen=True)
class Past:
    """A file system past its line that none of the servers here wrote to."""

    filesystem: FileSystem
    line: float


def gb(size: float) -> str:
    """Bytes for people, in the hub's units (GPUHUB_DISK_BUDGET_GB counts 1024 MiB a GB, as df
    -h does): 21.3 GB, or 420 MB below 1 GB."""
    return f"{size / GiB:.1f} GB" if size >= GiB else f"{size / MiB:.0f} MB"


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def describe_use(server: Server) -> str:
    home = gb(server.home) if server.home is not None else "unknown"
    scratch = gb(server.scratch) if server.scratch is not None else "unknown"
    return f"home {home}, scratch (/tmp and other files outside your home) {scratch}"


def filesystem_words(fs: FileSystem, machine: str, homes: bool) -> str:
    if homes:
        return f"the shared storage of the homes ({fs.path})"
    return f"the disk of the machine your server ran on ({machine}, {fs.path})"


def stop_reason(
    server: Server, fs: FileSystem, line: float, wrote: int, r: Reading, homes: bool
) -> str:
    """What the participant reads on their page about the stop (the hub shows it)."""
    budget = f"; your disk budget is {gb(server.budget)}" if server.budget else ""
    return (
        f"Your server was stopped at {_clock(r.time)} because "
        f"{filesystem_words(fs, r.machine, homes)} was {fs.percent:.0f}% full, past its safety "
        f"line of {line:g}%, and your server was writing to it the most: {gb(wrote)} in the "
        f"last {r.every_s:g} seconds. Your files are kept ({describe_use(server)}{budget}). "
        "Start your server again when you are ready, delete what you no longer need, and "
        "keep large downloads out of your home."
    )


def decide(
    r: Reading, state: WatchState | None = None
) -> tuple[tuple[Warn | Within | Stop | Past, ...], WatchState]:
    """Whom to warn, who is back within budget, which server to stop on each file system past
    its line (the one that wrote the most to it since the last round), for reading ``r``; and
    the state for the next round (``state``: the last round's; None: the first)."""
    state = state or WatchState()
    here = {s.container for s in r.servers}
    actions: list[Warn | Within | Stop | Past] = []
    told = {c: used for c, used in state.told.items() if c in here}
    stopped = {c: s for c, s in state.stopped.items() if c in here}

    for server in r.servers:
        if server.container in stopped:
            continue
        if server.over:
            last = told.get(server.container)
            if last is None or abs(server.total - last) >= RETELL_FRACTION * server.budget:
                actions.append(Warn(server, first=last is None))
                told[server.container] = server.total
        elif server.container in told and server.home is not None:
            actions.append(Within(server))  # (a home not measured this round is no news)
            del told[server.container]

    written = {
        s.container: {fs: s.on(fs) for fs in {s.home_fs, s.scratch_fs} if fs is not None}
        for s in r.servers
    }
    lines = safety_lines(r)
    for key, fs in sorted(r.filesystems.items()):
        line = lines.get(key)
        if line is None or fs.percent < line:
            continue
        on_it = [s for s in r.servers if key in (s.home_fs, s.scratch_fs)]
        growth = [
            (written[s.container][key] - state.written[s.container][key], s)
            for s in on_it
            if s.container not in stopped
            and not s.paused
            and key in state.written.get(s.container, {})
        ]
        writers = sorted(
            ((wrote, s) for wrote, s in growth if wrote >= MIN_WRITE),
            key=lambda pair: (-pair[0], pair[1].container),
        )
        if not writers:
            actions.append(Past(fs, line))
            continue
        wrote, server = writers[0]
        homes = server.home_fs == key and server.scratch_fs != key
        reason = stop_reason(server, fs, line, wrote, r, homes)
        actions.append(Stop(server, fs, line, wrote, reason))
        stopped[server.container] = Stopped(r.time, reason)
    return tuple(actions), WatchState(written, told, stopped)


def safety_lines(r: Reading) -> dict[int, float]:
    """Each file system's safety line: the lowest of the servers with files on it (all the same
    when one hub labels them); a file system no server sets a line for has none."""
    lines: dict[int, float] = {}
    for s in r.servers:
        for key in {s.home_fs, s.scratch_fs} - {None}:
            if s.line:
                lines[key] = min(lines.get(key, s.line), s.line)
    return lines


def report(r: Reading, state: WatchState, problems: Iterable[str] = ()) -> dict:
    """The round's report (``GET /disk``), from its reading and the state after it."""
    lines = safety_lines(r)
    return {
        "version": REPORT_VERSION,
        "machine": r.machine,
        "time": r.time,
        "every_s": r.every_s,
        "filesystems": [
            {
                "path": fs.path,
                "total": fs.used + fs.available,
                "used": fs.used,
                "line_percent": lines.get(key),
                "past": key in lines and fs.percent >= lines[key],
            }
            for key, fs in sorted(r.filesystems.items())
        ],
        "servers": [
            {
                "service": s.service,
                "user": s.user,
                "container": s.container,
                "home": s.home,
                "scratch": s.scratch,
                "budget": s.budget,
                "over": s.over,
                "stopped": (
                    {
                        "time": state.stopped[s.container].time,
                        "reason": state.stopped[s.container].reason,
                    }  # fmt: skip
                    if s.container in state.stopped
                    else None
                ),
            }
            for s in r.servers
        ],
        "problems": list(problems),
    }


# ---- notices (what the participant's JupyterLab shows) -----------------------------------


def notice_of(action: Warn | Within | Stop, when: float) -> dict:
    s = action.server
    if isinstance(action, Warn):
        return {
            "id": f"disk-over-{s.container[:12]}",
            "level": "warning",
            "time": when,
            "title": "Disk use over your budget",
            "message": (
                f"Your files take {gb(s.total)} of disk; your budget is {gb(s.budget)} "
                f"({describe_use(s)}). Delete what you no longer need (a downloaded dataset, "
                "checkpoints, ~/.cache), or keep it outside this server: when the machine's "
                "disk runs low, the server writing the most is stopped."
            ),
        }
    if isinstance(action, Within):
        return {
            "id": f"disk-ok-{s.container[:12]}-{int(when)}",
            "level": "info",
            "time": when,
            "title": "Disk use within your budget again",
            "message": f"Your files take {gb(s.total)} of your {gb(s.budget)} budget.",
        }
    return {
        "id": f"disk-stop-{s.container[:12]}",
        "level": "error",
        "time": when,
        "title": "Your server is being stopped: the disk is nearly full",
        "message": action.reason,
    }


def notices_tar(notices: list[dict], path: str = NOTICES_FILE) -> tuple[str, bytes]:
    """``(folder, tar)`` to put into a container (the engine's archive API extracts it inside
    the container's own file system, so nothing the participant links there leads out of it):
    the notices file and its folder, owned by root, readable by all."""
    parent, folder = os.path.split(os.path.dirname(path))
    body = json.dumps({"notices": notices[-NOTICES_KEPT:]}).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo(folder)
        entry.type, entry.mode, entry.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        tar.addfile(entry)
        entry = tarfile.TarInfo(f"{folder}/{os.path.basename(path)}")
        entry.size, entry.mode, entry.mtime = len(body), 0o644, int(time.time())
        tar.addfile(entry, io.BytesIO(body))
    return parent, buffer.getvalue()


# ---- measuring (I/O) ----------------------------------------------------------------------


def measure(root: str) -> tuple[int, int]:
    """``(bytes, device)`` of the tree at ``root``: the blocks its files, folders and links
    take (``st_blocks``), each inode once, not crossing into other file systems; a part that
    vanishes or cannot be read while it is walked is left out. OSError when ``root`` itself
    cannot be read."""
    top = os.lstat(root)
    device, total, seen = top.st_dev, top.st_blocks * 512, set()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_dev != device:
                    continue
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if info.st_ino in seen:
                        continue
                    seen.add(info.st_ino)
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
    return total, device


def filesystem_of(path: str, shown: str, device: int) -> FileSystem:
    v = os.statvfs(path)
    used = (v.f_blocks - v.f_bfree) * v.f_frsize
    return FileSystem(device, shown, v.f_blocks * v.f_frsize, used, v.f_bavail * v.f_frsize)


def _number(labels: Mapping[str, str], key: str) -> float | None:
    try:
        value = float(labels.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 and value == value and value != float("inf") else None


@dataclass(frozen=True)
class Paths:
    """A server's container as the engine describes it: its labels, the machine's paths of
    its home (the volume's or the shared folder's) and writable layer (None: not known), and
    its first process (on the machine: 0 when it runs none)."""

    container: str
    labels: Mapping[str, str]
    home: str | None
    scratch: str | None
    paused: bool
    pid: int = 0


def paths_of(inspected: Mapping) -> Paths:
    """From the engine's ``GET /containers/ID/json``."""
    home = None
    for mount in inspected.get("Mounts") or []:
        if mount.get("Destination") == HOME_PATH:
            home = mount.get("Source") or None
    data = (inspected.get("GraphDriver") or {}).get("Data") or {}
    state = inspected.get("State") or {}
    return Paths(
        str(inspected.get("Id", "")),
        (inspected.get("Config") or {}).get("Labels") or {},
        home,
        data.get("UpperDir") or None,
        bool(state.get("Paused")),
        int(state.get("Pid") or 0),
    )


class Engine:
    """The machine's Docker engine, over its unix socket: the few calls the watch makes."""

    def __init__(self, path: str = "/var/run/docker.sock", timeout: float = 30):
        self.path, self.timeout = path, timeout

    def call(self, method: str, url: str, body: bytes | None = None, kind: str = "") -> object:
        connection = _UnixConnection(self.path, self.timeout)
        try:
            headers = {"Content-Type": kind} if kind else {}
            connection.request(method, url, body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
        except OSError as e:
            raise EngineError(f"the engine at {self.path} did not answer: {e}") from None
        finally:
            connection.close()
        if answer.status >= 300:
            text = data.decode(errors="replace").strip()
            raise EngineError(f"{method} {url.split('?')[0]}: {answer.status} {text}")
        return (
            json.loads(data)
            if data and answer.getheader("Content-Type", "").endswith("json")
            else None
        )

    def servers(self) -> list[Paths]:
        query = urllib.parse.quote(json.dumps({"label": [USER_LABEL]}))
        found = self.call("GET", f"/containers/json?filters={query}") or []
        inspected = []
        for listed in found:
            try:
                inspected.append(paths_of(self.call("GET", f"/containers/{listed['Id']}/json")))
            except EngineError:
                continue  # gone between the list and the look
        return inspected

    def root_dir(self) -> str:
        return (self.call("GET", "/info") or {}).get("DockerRootDir", "/var/lib/docker")

    def pause(self, container: str) -> None:
        self.call("POST", f"/containers/{container}/pause")

    def put(self, container: str, folder: str, tar: bytes) -> None:
        query = urllib.parse.urlencode({"path": folder})
        self.call("PUT", f"/containers/{container}/archive?{query}", tar, "application/x-tar")


class EngineError(Exception):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Watch:
    """The rounds: read, decide, act; the last report kept for ``GET /disk``."""

    def __init__(
        self,
        engine: Engine,
        host_root: str = "/host",
        every_s: float = EVERY_S,
        proc: str = "/proc",
    ):
        self.engine, self.host_root, self.every_s = engine, host_root.rstrip("/"), every_s
        self.proc = proc
        self.machine = socket.gethostname()
        self.state = WatchState()
        self.notices: dict[str, list[dict]] = {}
        self.said: set[str] = set()
        self.last: dict = {}
        self.lock = threading.Lock()

    def where(self, what: str, p: Paths) -> str | None:
        """Where this watch reads a server's ``what``: its writable layer through the machine's
        file system (mounted at ``host_root``), its home as the server itself sees it
        (``/proc/PID/root``; the machine's pid namespace): a shared folder mounted on the
        machine after this watch started is not under ``host_root``, but always there."""
        if what == "scratch":
            return self.host_root + p.scratch if p.scratch else None
        return f"{self.proc}/{p.pid}/root{HOME_PATH}" if p.home and p.pid else None

    def read(self) -> tuple[Reading, list[str]]:
        problems: list[str] = []
        root = self.engine.root_dir()
        filesystems: dict[int, FileSystem] = {}
        servers = []
        for p in self.engine.servers():
            measured = {}
            for what, path in (("home", p.home), ("scratch", p.scratch)):
                read_at = self.where(what, p)
                if path is None or read_at is None:
                    continue
                try:
                    size, device = measure(read_at)
                    if device not in filesystems:
                        shown = root if path.startswith(root) else os.path.dirname(path)
                        filesystems[device] = filesystem_of(read_at, shown, device)
                    measured[what] = (size, device)
                except OSError as e:
                    problems.append(f"{p.container[:12]}: its {what} {path}: {e}")
            budget_mb = _number(p.labels, DISK_BUDGET_LABEL)
            home, home_fs = measured.get("home", (None, None))
            scratch, scratch_fs = measured.get("scratch", (None, None))
            servers.append(
                Server(
                    container=p.container,
                    service=p.labels.get(SERVICE_LABEL, p.container[:12]),
                    user=p.labels.get(USER_LABEL, ""),
                    home=home,
                    scratch=scratch,
                    home_fs=home_fs,
                    scratch_fs=scratch_fs,
                    budget=int(budget_mb * MiB) if budget_mb else None,
                    line=_number(p.labels, DISK_SAFETY_LABEL),
                    paused=p.paused,
                )
            )
        reading = Reading(time.time(), self.machine, filesystems, tuple(servers), self.every_s)
        return reading, problems

    def round(self) -> dict:
        try:
            reading, problems = self.read()
        except EngineError as e:
            self._say(f"no round: {e}")
            return self.last
        actions, self.state = decide(reading, self.state)
        for action in actions:
            problems += self.act(action, reading)
            if isinstance(action, Stop) and not self.paused(action.server, problems):
                stopped = dict(self.state.stopped)  # the next round tries again
                del stopped[action.server.container]
                self.state = replace(self.state, stopped=stopped)
        done = report(reading, self.state, problems)
        with self.lock:
            self.last = done
        return done

    def act(self, action, reading: Reading) -> list[str]:
        if isinstance(action, Past):
            line = (
                f"{action.filesystem.path} is {action.filesystem.percent:.0f}% full, past the "
                f"safety line of {action.line:g}%, and no participant's server here writes to it"
            )
            self._say(line)
            return [line]
        s = action.server
        if isinstance(action, Stop):
            self._say(
                f"{s.service} ({s.user}) wrote {gb(action.wrote)} to {action.filesystem.path}, "
                f"{action.filesystem.percent:.0f}% full (line {action.line:g}%): pausing it",
                always=True,
            )
        elif isinstance(action, Warn) and action.first:
            self._say(f"{s.service} ({s.user}) uses {gb(s.total)} of {gb(s.budget)}", always=True)
        problems = []
        try:
            self.tell(s.container, notice_of(action, reading.time))
        except EngineError as e:
            problems.append(f"{s.service}: its notice was not written: {e}")
        return problems

    def paused(self, s: Server, problems: list[str]) -> bool:
        """Pause the server's container (after its notice was written); False, with the
        problem said, when the engine would not."""
        try:
            self.engine.pause(s.container)
        except EngineError as e:
            problems.append(f"{s.service}: could not be paused: {e}")
            self._say(problems[-1], always=True)
            return False
        return True

    def tell(self, container: str, notice: dict) -> None:
        kept = self.notices.setdefault(container, [])
        kept[:] = [n for n in kept if n["id"] != notice["id"]][-(NOTICES_KEPT - 1) :] + [notice]
        self.engine.put(container, *notices_tar(kept))

    def _say(self, line: str, always: bool = False) -> None:
        if always or line not in self.said:
            self.said.add(line)
            print(time.strftime("%Y-%m-%d %H:%M:%S"), line, flush=True)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.round()
            except Exception as e:  # a bug must not end the watch of every other server
                self._say(f"this round failed ({type(e).__name__}: {e}); the next goes on")
            here = {server["container"] for server in self.last.get("servers", [])}
            for container in set(self.notices) - here:
                del self.notices[container]
            stop.wait(max(1.0, self.every_s - (time.monotonic() - started)))


def serve(watch: Watch, port: int, address: str = "") -> http.server.ThreadingHTTPServer:
    """``GET /disk`` on ``address`` (every address of the machine: the hub reads it from the
    manager) and ``port``, in a thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/disk":
                self.send_error(404, "only /disk")
                return
            with watch.lock:
                body = json.dumps(watch.last).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuhub-disk", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("watch", "once"))
    parser.add_argument("--port", type=int, default=DISK_WATCH_PORT)
    parser.add_argument("--every", type=float, default=EVERY_S, metavar="S")
    parser.add_argument("--host-root", default="/host", metavar="PATH")
    parser.add_argument("--engine", default="/var/run/docker.sock", metavar="SOCKET")
    parser.add_argument("--proc", default="/proc", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    watch = Watch(Engine(args.engine), args.host_root, args.every, args.proc)
    if args.what == "once":
        reading, problems = watch.read()
        actions, _ = decide(reading)
        print(json.dumps(report(reading, WatchState(), problems), indent=2))
        for action in actions:
            print("would:", type(action).__name__, getattr(action, "server", action))
        return 0
    serve(watch, args.port)
    print(f"disk watch on {watch.machine}: a round every {args.every:g} s, GET /disk on "
          f":{args.port}", flush=True)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    watch.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
