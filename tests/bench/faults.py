"""The fault suite on the bed (issue 29), run by `make bench-faults` (tests/bench/faults.sh):
each fault hits a hub with N participants' servers running and a marker file in each home, and
one table row says how the hub healed and what was lost. Figures printed, never asserted.

Faults (--only NAME,...; run in this order):
  proxy       the proxy's task killed (SIGKILL to its container; Swarm starts another)
  prometheus  Prometheus stopped (scaled to 0) for 30 s, then started again; meanwhile the
              organizer's dashboard is read (its live state, and its plots, which need it)
  worker      a GPU machine's engine stopped and started again (tests/bed/bed.sh restart wN)
  worker-killed  the same engine killed (SIGKILL, as the OOM killer does) and started again
  hub-kill    the hub killed (SIGKILL) in the middle of a burst of 20 spawns and 5 stops
  cut         a GPU machine cut off from the manager for 60 s, then back (bed.sh cut/uncut)
  manager     the manager's engine stopped and started again (bed.sh restart manager)
  manager-killed  the manager's engine killed (SIGKILL) and started again
  gone        a GPU machine gone for good (bed.sh stop wN; afterwards it joins again afresh)
  full        the hub's data volume full (a tmpfs of 64 MiB filled up), then space freed
  broken      (only when named) no fault: the instrument's check. One route deleted from the
              proxy, one marker deleted, a service holding a slice for nobody the hub knows, and
              a second container of one participant's server claiming 3 slices of its GPU:
              silent, lost, orphans, leaked, twice and over must each read at least 1 where the
              hub does not heal them (on 72cddb7, none is healed)

The bed is filled first (--spare): "fillers" (services of their own, not the hub's, running
`sleep`) hold every slice the participants do not, but for the spare ones (as many as the
participants on the machine a fault takes away, where one does), so that a slice the hub leaves
held is one a participant is refused for, as on a full event day. The hub-kill burst runs on an
unfilled bed.

After the fault, every participant acts as one would: while the hub lists their server, they
use it (GET /user/NAME/api/status through the proxy, with their own token); once the hub lists
it as stopped, they press Start (POST /hub/api/users/NAME/server, their token), and again every
10 s while refused for slices of their own. Columns:
  hub s        the fault injected -> the hub's API answers again through the proxy (probed
               every 0.5 s from the fault on; 0.0: it answered throughout)
  answer s     the hub answers and the fault is over -> every server that should still run
               (all but those on the machine hit) answers through the proxy; "-": not all did
  silent       of those, how many never answered as the same server within the limit
  dropped      of those, how many the hub listed as stopped (their participants pressed Start)
  orphans      services holding GPU slices whose participant the hub lists no server for,
               60 s after the hub answers and the fault is over
  died         participants the hub listed as stopped, who pressed Start (hub-kill: those of
               the burst; full: those refused while the disk was full)
  own          of those, refused on their first press while a service of their own held slices
  refused      of those, refused on their first press (any reason); a participant refused
               presses again every 10 s, unless the refusal was true (every slice the bed had
               before the fault held by others): then they give up
  back s       Start pressed -> their server ready, p50 (max)
  lost         marker files gone from homes (read back through the contents API at the end)
  unread       markers not read: no server of theirs answered at the end
  twice        most participants seen running their server in two containers at once (a copy
               waiting for the earlier one to end, images/singleuser/one_copy.py, runs none;
               sampled every ~2 s on every machine's own engine, during and after the fault)
  over         most slices held by running containers beyond a GPU's slices (a slice given
               twice; a waiting copy holds none yet)
  leaked       slices Swarm counts on a GPU beyond those held there by running servers of
               participants the hub lists

    python -m tests.bench.faults [--servers 6] [--only proxy,cut,...] [--json FILE]
                                 [--limit 300] [--homes-dir DIR] [--no-fill]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker
import requests

from gpu_swarm_spawner.contract import (
    DOCKER_SERVICE_LABEL,
    DOCKER_STACK_LABEL,
    GPU_LABEL,
    SLICES_LABEL,
    STACK_LABEL,
    USER_LABEL,
)
from tests.bench.bench import BED_ENGINE
from tests.bench.client import join_clients_cpu
from tests.integration.aftermath import (
    Participant,
    bed_engines,
    hub_answers,
    listed,
    marker_kept,
    orphans,
    over_capacity,
    running_copies,
    server_answers,
    slice_holders,
    token_of,
    twice,
    write_marker,
)
from tests.integration.hub import REPO, Hub, hub_url, launch_chromium, log_in, state_file
from tests.integration.spawners import inventory

STACK = {"STACK": "bench-faults", "HTTP_PORT": "18500", "NETWORK": "bench-faults"}
STACK["CONFIG"] = "none"  # an organizer's ./config.env is not the bench's
#: the restarted hub's log lines that tell how its start-up went (JupyterHub's own words)
STARTUP_LOG = ("still running", "reported in", "ready", "Adding user", "Healed", "Hub API", "away")
#: the hub's data volume, bound to a tmpfs of this size (tests/bed/bed.sh small-dir)
HUB_DATA_SIZE = "64m"
FAULTS = ["proxy", "prometheus", "worker", "worker-killed", "hub-kill", "cut", "manager"]
FAULTS += ["manager-killed", "gone", "full"]
#: not a fault: the instrument's own check (--only broken), each figure made bad on purpose
CHECKS = ["broken"]
ORPHAN_AFTER_S = 60  # the goal: no orphan 60 s after the hub answers
PRESS_AGAIN_S = 10  # a participant refused for their own slices presses Start again after this
CUT_S = 60
PROMETHEUS_OUTAGE_S = 30
BURST, BURST_STOPS = 20, 5
#: the label of the fillers' services: not the hub's stack (whose keeper removes services of its
#: own label that no server owns), and not counted as orphans here
FILLER_LABEL = "bench-faults-filler"
#: a filler's command: a server's first step (images/singleuser/start-singleuser: one copy at a
#: time in its home, one_copy.py), then it holds its slices doing nothing
FILLER_COMMAND = [
    "sh", "-c",
    '{ command exec 9>>"$HOME/.gpuhub-server.lock"; } && python3 -m one_copy 9;'
    " exec sleep infinity",
]  # fmt: skip
#: and a server's restart policy (GPUSwarmSpawner.create_object), Swarm's own delay and attempts
FILLER_RESTART = {"Condition": "on-failure"}
#: the burst's requests answered before the hub is killed (the rest are in flight)
KILL_AFTER_ANSWERS = 10


def say(text: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {text}", flush=True)


def bed(*args: str) -> str:
    """tests/bed/bed.sh ARGS; its output."""
    result = subprocess.run(
        ["bash", str(REPO / "tests/bed/bed.sh"), *args], capture_output=True, text=True
    )
    if result.returncode:
        raise RuntimeError(f"bed.sh {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def env(extra: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_") or k in BED_ENGINE}
    return {**clean, **{f"GPUHUB_{k}": v for k, v in {**STACK, **extra}.items()}}


def deploy_cli(extra: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "deploy", *args],
        cwd=REPO,
        env=env(extra),
        capture_output=True,
        text=True,
    )
    if result.returncode:
        raise RuntimeError(f"python -m deploy {' '.join(args)}:\n{result.stdout}{result.stderr}")
    return result.stdout


def p50_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({max(values):.1f})"


class NodeStates:
    """Each machine's state in Swarm (and Swarm's message) whenever it changes, sampled every
    0.5 s from ``start`` until ``stop``: what the manager made of its machines across a fault."""

    def __init__(self):
        self.client = docker.from_env(timeout=3)  # the manager may not answer
        self.changes: list[str] = []
        self._last: dict[str, tuple] = {}
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        def sample():
            while not self._done.wait(0.5):
                try:
                    nodes = self.client.api.nodes()
                except (docker.errors.DockerException, requests.RequestException):
                    continue  # the manager is away
                for n in nodes:
                    host = n["Description"]["Hostname"]
                    now = (n["Status"]["State"], n["Status"].get("Message", ""))
                    if self._last.get(host) != now:
                        self._last[host] = now
                        message = f" ({now[1]})" if now[1] else ""
                        self.changes.append(
                            f"+{time.monotonic() - t0:.1f} s {host}: {now[0]}{message}"
                        )

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> list[str]:
        self._done.set()
        if self._thread:
            self._thread.join()
        return self.changes


@dataclass
class Row:
    """One fault's figures (see the module's docstring for each)."""

    fault: str
    hub_s: float | None = None
    answer_s: float | None = None
    expected: int = 0
    silent: int = 0
    dropped: int = 0
    orphans: int | None = None
    died: int = 0
    own: int = 0
    refused: int = 0
    back_s: list[float] = field(default_factory=list)
    lost: int = 0
    unread: int = 0
    twice: int | None = None
    over: int | None = None
    leaked: int | None = None
    notes: dict = field(default_factory=dict)

    def cells(self) -> list[str]:
        def s(v):
            return "-" if v is None else f"{v:.1f}"

        def n(v):
            return "-" if v is None else str(v)

        return [
            self.fault,
            s(self.hub_s),
            s(self.answer_s),
            f"{self.silent}/{self.expected}",
            str(self.dropped),
            n(self.orphans),
            str(self.died),
            str(self.own),
            str(self.refused),
            p50_max(self.back_s),
            str(self.lost),
            str(self.unread),
            n(self.twice),
            n(self.over),
            n(self.leaked),
        ]


HEADER = [
    "fault", "hub s", "answer s", "silent", "dropped", "orphans", "died", "own", "refused",
    "back s", "lost", "unread", "twice", "over", "leaked",
]  # fmt: skip


def table(rows: list[Row]) -> str:
    cells = [HEADER, *(r.cells() for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]  # fmt: skip
    return "\n".join(lines)


@dataclass
class Tracked:
    """A participant through one fault: what they met after it."""

    p: Participant
    wanted: bool = True  # they want their server (not one of the burst's stops)
    expected: bool = False  # their server should still run
    answered_at: float | None = None  # their running server answered through the proxy
    pressed_at: float | None = None  # they pressed Start (the hub listed them stopped)
    first_press: str = ""  # what the first press got: accepted, refused, refused-own, ...
    last_press_at: float = 0.0
    back_at: float | None = None  # their new server answered
    gave_up: bool = False  # refused for a reason other than their own slices: they stop trying

    @property
    def settled(self) -> bool:
        return self.answered_at is not None or self.back_at is not None or self.gave_up


@dataclass
class Press:
    """What a press of Start got."""

    at: float  # time.monotonic() when pressed
    status: int  # the hub's answer (0: none)
    text: str
    own: bool  # refused while a service of their own held slices
    full: bool  # refused while every slice of the bed was held (a true refusal)
    swarm: str  # what Swarm counted then (for a refusal)


class InBrowser:
    """A participant in Chromium, logged in (which starts their server) and then stopped, so
    that they can press Start later as on the page they see."""

    #: JupyterHub writes down a user's activity at most this often (``activity_resolution``);
    #: pressing Start later than this after the last request meets that write
    ACTIVITY_S = 31

    def __init__(self, hub: Hub, p: Participant):
        self.hub, self.p = hub, p

    def __enter__(self) -> InBrowser:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._chromium = launch_chromium(self._playwright, self.hub.url)
        self.page = self._chromium.new_context().new_page()
        log_in(self.page, self.hub, self.p.name)
        self.hub.wait_ready(self.p.name)
        self.hub.stop(self.p.name)
        self.since = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self._chromium.close()
        self._playwright.stop()

    def press_start(self, told: str = "disk is full", timeout: float = 60) -> str:
        """Start pressed on the home page: what the page says (``told`` found, or not)."""
        time.sleep(max(0.0, self.since + self.ACTIVITY_S - time.monotonic()))
        t0 = time.monotonic()
        try:
            self.page.goto(f"{self.hub.url}/hub/home")
            self.page.click("#start", timeout=timeout * 1000)
            self.page.wait_for_function(
                f"document.body && document.body.innerText.includes({told!r})",
                timeout=timeout * 1000,
            )
            found = "told"
        except Exception as e:  # Playwright's timeouts and errors: the page says what it shows
            found = f"not told ({type(e).__name__})"
        seconds = time.monotonic() - t0
        text = " ".join(self.page.inner_text("body").split())[:240]
        return f"{found} in {seconds:.1f} s at {self.page.url}: {text}"


class HubPulse:
    """The hub's API through the proxy, probed every 0.5 s in a thread of its own from just
    before a fault: whether it stopped answering, and when it answered again."""

    def __init__(self, hub: Hub):
        self.hub = hub
        self.down_at: float | None = None
        self.back_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            answers = hub_answers(self.hub)
            now = time.monotonic()
            if not answers and self.down_at is None:
                self.down_at = now
            elif answers and self.down_at is not None and self.back_at is None:
                self.back_at = now
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class Suite:
    def __init__(self, args):
        self.args = args
        self.extra: dict[str, str] = {}
        if args.homes_dir:
            Path(args.homes_dir).mkdir(parents=True, exist_ok=True)
            self.extra["HOMES_DIR"] = args.homes_dir
        self.client = docker.from_env()
        self.engines = bed_engines()
        self.count = 0
        self.pulse: HubPulse | None = None

    def arm(self) -> None:
        """The hub's pulse taken from now on (just before a fault)."""
        self.pulse = HubPulse(self.hub)

    # ---- the stack ---------------------------------------------------------------------------

    def deploy(self) -> None:
        stack = STACK["STACK"]
        if self.client.services.list(filters={"label": f"{DOCKER_STACK_LABEL}={stack}"}):
            deploy_cli(self.extra, "down", "--purge")
        # the hub's data volume on a small file system of its own, which the `full` fault fills
        self.hub_data = Path(bed("small-dir", f"{stack}-hub-data", HUB_DATA_SIZE).strip())
        for path in self.hub_data.iterdir():  # a previous run's database
            path.unlink()
        volume = f"{stack}_hub-data"
        with contextlib.suppress(docker.errors.NotFound):
            self.client.volumes.get(volume).remove()
        self.client.volumes.create(
            volume,
            driver="local",
            driver_opts={"type": "none", "o": "bind", "device": str(self.hub_data)},
            labels={DOCKER_STACK_LABEL: stack},
        )
        say(f"deploying {stack} (hub data on a {HUB_DATA_SIZE} tmpfs: {self.hub_data})")
        deploy_cli(self.extra, "stack")
        state = {"GPUHUB_STATE_DIR": deploy_cli(self.extra, "settings", "GPUHUB_STATE_DIR").strip()}
        self.hub = Hub(
            hub_url(STACK["HTTP_PORT"]),
            state_file(state, "ops_token"),
            state_file(state, "demo_password"),
            stack,
            admin_password=state_file(state, "admin_password"),
        )
        admin = token_of(self.hub, "admin", self.hub.admin_password)
        self.admin = requests.Session()
        self.admin.headers["Authorization"] = f"token {admin}"
        self.capacity = {g.uuid: g.slices for g in inventory().values()}
        say(f"bed: {len(self.capacity)} GPUs, {sum(self.capacity.values())} slices")

    def remove(self) -> None:
        deploy_cli(self.extra, "down", "--purge")

    def container_of(self, service: str):
        """The running container of one of the stack's services (on the manager)."""
        name = f"{STACK['STACK']}_{service}"
        found = self.client.containers.list(filters={"label": f"{DOCKER_SERVICE_LABEL}={name}"})
        if not found:
            raise RuntimeError(f"no running container of {name}")
        return found[0]

    def hub_log(self, since: float, grep: tuple[str, ...] = ()) -> list[str]:
        """The hub's log lines since ``since`` (time.time()), those with any of ``grep``."""
        try:
            service = self.client.services.get(f"{STACK['STACK']}_hub")
            raw = b"".join(service.logs(stdout=True, stderr=True, since=int(since) - 1))
        except (docker.errors.DockerException, requests.RequestException) as e:
            return [f"(hub log not read: {e})"]
        lines = raw.decode(errors="replace").splitlines()
        return [x for x in lines if not grep or any(g in x for g in grep)]

    # ---- participants ------------------------------------------------------------------------

    def participants(self, n: int, tag: str) -> list[Participant]:
        """``n`` new participants, each with a token of their own."""
        self.count += 1
        names = [f"flt{self.count}-{tag}-{i}" for i in range(n)]
        r = self.hub.api("POST", "/users", json={"usernames": names})
        if r.status_code not in (201, 409):
            raise RuntimeError(f"users not created: {r.status_code} {r.text}")
        return [Participant(name, token_of(self.hub, name)) for name in names]

    def press_start(self, p: Participant) -> requests.Response:
        return p.session.post(
            f"{self.hub.url}/hub/api/users/{p.name}/server", timeout=60, verify=self.hub.verify
        )

    def start(self, ps: list[Participant], timeout: float = 240) -> None:
        """Their servers running, each with a marker file in its home, and where each runs."""
        for p in ps:
            r = self.press_start(p)
            if r.status_code not in (201, 202):
                raise RuntimeError(f"{p.name} not started: {r.status_code} {r.text}")
        deadline = time.monotonic() + timeout
        for p in ps:
            self.hub.wait_ready(p.name, timeout=max(1, deadline - time.monotonic()))
            write_marker(self.hub, p)
        where = self.nodes()
        for p in ps:
            p.node = where.get(p.name, "?")
        say(f"{len(ps)} servers running with a marker each: {self.spread(ps)}")

    def spread(self, ps: list[Participant]) -> str:
        count: dict[str, int] = {}
        for p in ps:
            count[p.node] = count.get(p.node, 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(count.items()))

    def nodes(self) -> dict[str, str]:
        """{participant: the machine their running task is on}."""
        hostnames = {n.id: n.attrs["Description"]["Hostname"] for n in self.client.nodes.list()}
        found = {}
        label = f"{STACK_LABEL}={STACK['STACK']}"
        for service in self.client.services.list(filters={"label": label}):
            user = service.attrs["Spec"]["Labels"].get(USER_LABEL)
            for task in service.tasks(filters={"desired-state": "running"}):
                if task["Status"]["State"] == "running":
                    found[user] = hostnames.get(task["NodeID"], task["NodeID"][:7])
        return found

    def on_busiest_worker(self, ps: list[Participant]) -> int:
        """How many of ``ps`` run on the worker a fault will take away."""
        w = self.busiest_worker(ps)
        return sum(p.node == w for p in ps)

    def busiest_worker(self, ps: list[Participant]) -> str:
        on = {w: sum(p.node == w for p in ps) for w in ("w1", "w2")}
        return max(on, key=lambda w: (on[w], w == "w1"))

    # ---- between faults ----------------------------------------------------------------------

    def settle(self) -> None:
        """No server, no participant's service, every slice free, the proxy's routes in sync."""
        self.until("the hub answers", lambda: hub_answers(self.hub), 180)
        for name in listed(self.hub):
            try:
                self.hub.api("DELETE", f"/users/{name}/server")
            except requests.RequestException as e:
                say(f"stop of {name} not answered: {e}")
        self.until("the hub lists no server", lambda: not listed(self.hub), 120)
        label = f"{STACK_LABEL}={STACK['STACK']}"
        for service in self.client.services.list(filters={"label": label}):
            service.remove()
        self.unfill()
        self.until(
            "every slice is free", lambda: all(g.used == 0 for g in inventory().values()), 120
        )
        # routes a fault left out of the proxy (a restarted proxy's): back, for the next fault;
        # a hub that cannot reach its proxy is restarted, so that the next fault starts clean
        try:
            r = self.admin.post(f"{self.hub.url}/hub/api/proxy", timeout=90)
            synced = r.status_code == 200
            if not synced:
                say(f"the proxy's routes not synced: {r.status_code} {r.text[:200]}")
        except requests.RequestException as e:
            synced = False
            say(f"the proxy's routes not synced: {e}")
        if not synced:
            say("restarting the hub for the next fault")
            self.client.services.get(f"{STACK['STACK']}_hub").force_update()
            time.sleep(5)
            self.until("the hub answers", lambda: hub_answers(self.hub), 180)

    def until(self, what: str, check: Callable[[], bool], timeout: float) -> bool:
        """Wait (bounded) until ``check()``; say so when it does not come true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return True
            except (docker.errors.DockerException, requests.RequestException):
                pass
            time.sleep(1)
        say(f"not within {timeout:g} s: {what}")
        return False

    def sample(self, row: Row, during: bool = False) -> None:
        """Copies of servers running now, on every machine's engine: the most seen at once,
        after the fault (the row's figures) or ``during`` it (in its notes)."""
        copies = running_copies(self.engines)
        double, over = twice(copies), over_capacity(copies, self.capacity)
        if during:
            seen = row.notes.setdefault("during the fault", {"twice": 0, "over": 0})
            seen["twice"] = max(seen["twice"], len(double))
            seen["over"] = max(seen["over"], sum(over.values()))
        else:
            row.twice = max(row.twice or 0, len(double))
            row.over = max(row.over or 0, sum(over.values()))
        if double:
            row.notes.setdefault("seen twice", sorted(double))
        waiting = {c.user for c in copies if c.waiting}
        if waiting:  # a second copy, waiting for the first to end (one_copy.py)
            seen = set(row.notes.get("seen waiting for their earlier copy", ()))
            row.notes["seen waiting for their earlier copy"] = sorted(seen | waiting)
        if over:
            row.notes.setdefault("over capacity", over)

    def watch(
        self,
        row: Row,
        tracked: list[Tracked],
        t_fault: float,
        t_end: float,
        limit: float,
        copies: bool = False,
    ) -> None:
        """From the fault's end: the hub's answer, each participant's server, their presses of
        Start, and the orphans ORPHAN_AFTER_S after; then the markers and leaked slices."""
        hub_at = None
        while hub_at is None:
            if hub_answers(self.hub):
                hub_at = time.monotonic()
            elif time.monotonic() - t_fault > limit + 300:
                say("the hub never answered")
                row.notes["hub"] = "never answered"
                if self.pulse:
                    self.pulse.stop()
                    self.pulse = None
                return
            else:
                time.sleep(0.5)
        pulse, self.pulse = self.pulse, None
        if pulse:
            pulse.stop()
            if pulse.down_at is None:  # it answered throughout
                hub_at = t_fault
            elif pulse.back_at is not None:
                hub_at = min(hub_at, pulse.back_at)
        row.hub_s = hub_at - t_fault
        ref = max(hub_at, t_end)
        say(f"hub answers {row.hub_s:.1f} s after the fault (over after {t_end - t_fault:.1f} s)")
        expected = [t for t in tracked if t.expected]
        row.expected = len(expected)
        last_report = 0.0
        in_flight: dict[int, tuple[Tracked, bool, Future]] = {}  # presses under way
        # presses run in the background, as participants act: a press waits for its spawn (up
        # to 10 s), which must delay neither the others' presses nor the probes of servers
        pressing = ThreadPoolExecutor(max(1, len(tracked)))
        while True:
            now = time.monotonic()
            self.record_presses(row, in_flight)
            try:
                servers = listed(self.hub)
            except requests.RequestException as e:
                say(f"the hub did not list servers: {e}")
                if now - ref > limit:
                    break
                time.sleep(1)
                continue
            probe = []  # those whose server the hub lists as ready: do they answer?
            for t in tracked:
                if not t.wanted or t.settled or id(t) in in_flight:
                    continue
                server = servers.get(t.p.name)
                if server is None:
                    first = t.pressed_at is None
                    if first or now - t.last_press_at > PRESS_AGAIN_S:
                        in_flight[id(t)] = (t, first, pressing.submit(self.press, t))
                elif server.get("ready"):
                    probe.append(t)
            for t, answers, at in self.probe(probe):
                if not answers:
                    continue
                if t.pressed_at is None:
                    t.answered_at = at
                else:
                    t.back_at = at
                    row.back_s.append(at - t.pressed_at)
            if copies:
                self.sample(row)
            if row.orphans is None and now - ref >= ORPHAN_AFTER_S:
                try:
                    found = orphans(self.hub, STACK["STACK"])
                    row.orphans = len(found)
                    if found:
                        row.notes["orphans"] = found
                    say(f"{ORPHAN_AFTER_S} s after: {len(found)} orphan(s) {found}")
                except (docker.errors.DockerException, requests.RequestException) as e:
                    say(f"orphans not counted: {e}")
            if now - last_report > 10:
                last_report = now
                answering = sum(t.answered_at is not None for t in expected)
                pressed = sum(t.pressed_at is not None for t in tracked)
                back = sum(t.back_at is not None for t in tracked)
                say(
                    f"{now - ref:5.0f} s: {answering}/{len(expected)} answer; "
                    f"{pressed} pressed Start, {back} back"
                )
            done = all(t.settled for t in tracked if t.wanted)
            if (done and row.orphans is not None) or now - ref > limit:
                break
            time.sleep(1)
        pressing.shutdown(wait=True)  # the presses still under way, counted too
        self.record_presses(row, in_flight)
        answered = [t.answered_at for t in expected if t.answered_at is not None]
        row.silent = len(expected) - len(answered)
        row.dropped = sum(t.pressed_at is not None for t in expected)
        if expected and not row.silent:
            row.answer_s = max(0.0, max(answered) - ref)
        stale = [t.p.name for t in tracked if t.wanted and not t.settled]
        if stale:
            row.notes["unsettled at the limit"] = stale
            if row.orphans is None:
                with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                    row.orphans = len(orphans(self.hub, STACK["STACK"]))
        self.markers(row, tracked)
        self.leaks(row)

    def probe(self, tracked: list[Tracked]) -> list[tuple[Tracked, bool, float]]:
        """Each one's server through the proxy, all at once (a server that does not answer
        takes the probe's whole timeout): (tracked, answers, when it answered)."""
        if not tracked:
            return []

        def one(t: Tracked) -> tuple[Tracked, bool, float]:
            answers = server_answers(self.hub, t.p)
            return t, answers, time.monotonic()

        with ThreadPoolExecutor(len(tracked)) as pool:
            return list(pool.map(one, tracked))

    def record_presses(self, row: Row, in_flight: dict[int, tuple[Tracked, bool, Future]]) -> None:
        """The presses of Start that have been answered, recorded (and no longer under way)."""
        for key, (t, first, future) in list(in_flight.items()):
            if future.done():
                del in_flight[key]
                self.record_press(row, t, first, future.result())

    def press(self, t: Tracked) -> Press:
        """``t``'s participant presses Start: what they got."""
        now = time.monotonic()
        try:
            r = self.press_start(t.p)
            status, text = r.status_code, r.text
        except requests.RequestException as e:
            status, text = 0, str(e)
        if status in (201, 202):
            return Press(now, status, text, False, False, "")
        own = t.p.name in slice_holders(STACK["STACK"], self.client)
        # every slice of the bed as it was before the fault (a machine still coming back is not
        # counted by Swarm meanwhile) held: a true refusal
        full = sum(g.used for g in inventory().values()) >= sum(self.capacity.values())
        return Press(now, status, text, own, full, self.swarm_use())

    def record_press(self, row: Row, t: Tracked, first: bool, press: Press) -> None:
        """What ``t``'s press of Start got, in ``t`` and the row."""
        t.last_press_at = press.at
        accepted = press.status in (201, 202)
        outcome = "accepted" if accepted else ("refused-own" if press.own else "refused")
        if first:
            t.pressed_at = press.at
            t.first_press = outcome
            row.died += 1
            row.own += press.own
            row.refused += not accepted
            if not accepted:
                row.notes.setdefault("refusals", []).append(
                    f"{t.p.name}: {press.status} {press.text[:160]} ({press.swarm})"
                )
            say(f"{t.p.name} pressed Start: {press.status} {outcome}")
        if outcome == "refused" and press.full:
            t.gave_up = True  # every slice is in use by others: a true refusal

    def swarm_use(self) -> str:
        """What Swarm counts now: slices in use, and the services holding them."""
        try:
            gpus = inventory().values()
            holders = slice_holders(STACK["STACK"], self.client)
        except (docker.errors.DockerException, requests.RequestException) as e:
            return f"Swarm not read: {e}"
        used, total = sum(g.used for g in gpus), sum(g.slices for g in gpus)
        return f"Swarm counts {used}/{total} slices in use; {len(holders)} participants hold some"

    def markers(self, row: Row, tracked: list[Tracked]) -> None:
        for t in tracked:
            if not t.p.marker or not t.wanted:
                continue
            kept = marker_kept(self.hub, t.p) if t.answered_at or t.back_at else None
            if kept is None:
                row.unread += 1
            elif not kept:
                row.lost += 1
                row.notes.setdefault("markers lost", []).append(f"{t.p.name} (was on {t.p.node})")

    def leaks(self, row: Row) -> None:
        """Slices Swarm counts on each GPU of a ready machine beyond those the running
        containers of participants the hub lists hold there (least of three readings, 2 s
        apart)."""
        readings = []
        for _ in range(3):
            try:
                gpus = inventory()  # ready machines only: one gone counts nothing here
                servers = listed(self.hub)
                held: dict[str, int] = {}
                for c in running_copies(self.engines):
                    if c.user in servers or c.user.startswith("fltfill-"):
                        held[c.gpu] = held.get(c.gpu, 0) + c.slices
                readings.append(sum(max(0, g.used - held.get(u, 0)) for u, g in gpus.items()))
            except (docker.errors.DockerException, requests.RequestException):
                pass
            time.sleep(2)
        row.leaked = min(readings) if readings else None

    # ---- the faults --------------------------------------------------------------------------

    def base(self, tag: str) -> tuple[Row, list[Participant]]:
        row = Row(tag)
        ps = self.participants(self.args.servers, tag)
        self.start(ps)
        return row, ps

    def simple(
        self,
        tag: str,
        inject: Callable[[list[Participant], Row], tuple[float, str]],
        copies: bool = False,
        spare: Callable[[list[Participant]], int] = lambda ps: 0,
    ) -> Row:
        """A fault that hits one machine (or none): ``inject`` returns when it is over, with the
        time it began and the machine it hit ("" for none). ``spare``: the slices left free
        when the bed is filled."""
        row, ps = self.base(tag)
        self.fill(row, spare(ps))
        self.arm()
        t_fault, machine = inject(ps, row)
        t_end = time.monotonic()
        tracked = [Tracked(p, expected=p.node != machine) for p in ps]
        self.watch(row, tracked, t_fault, t_end, self.args.limit, copies=copies)
        replaced = self.replaced(ps)
        if replaced:
            row.notes["servers Swarm started anew"] = replaced
        return row

    def replaced(self, ps: list[Participant]) -> dict[str, list[str]]:
        """For each participant whose server Swarm ran in more than one task: each task (its
        state, desired state, machine, when made) and what their containers said about an
        earlier copy (images/singleuser/one_copy.py)."""
        out: dict[str, list[str]] = {}
        try:
            hosts = {n["ID"]: n["Description"]["Hostname"] for n in self.client.api.nodes()}
            for p in ps:
                found = self.client.services.list(filters={"label": f"{USER_LABEL}={p.name}"})
                if not found:
                    continue
                tasks = sorted(found[0].tasks(), key=lambda t: t["CreatedAt"])
                if len(tasks) < 2:
                    continue
                out[p.name] = [
                    f"{t['Status']['State']}/{t['DesiredState']} on "
                    f"{hosts.get(t.get('NodeID', ''), '?')} made {t['CreatedAt'][11:19]}"
                    + (f" ({t['Status']['Err']})" if t["Status"].get("Err") else "")
                    for t in tasks
                ] + self.copy_lines(p)
        except (docker.errors.DockerException, requests.RequestException) as e:
            out["(not read)"] = [str(e)]
        return out

    def copy_lines(self, p: Participant) -> list[str]:
        """What ``p``'s containers, on every machine, said about an earlier copy."""
        lines = []
        for machine, engine in self.engines.items():
            try:
                mine = {"label": f"{USER_LABEL}={p.name}"}
                for c in engine.containers.list(all=True, filters=mine):
                    log = c.logs(tail=200).decode(errors="replace")
                    lines += [f"{machine}: {x[:160]}" for x in log.splitlines() if "copy" in x]
            except (docker.errors.DockerException, requests.RequestException):
                continue
        return lines

    def fill(self, row: Row, spare: int) -> None:
        """Fillers on every slice but ``spare``: one service per GPU, holding its free slices,
        with the labels, the restart policy and the first step of a server's container (counted
        as holders, never as orphans)."""
        if self.args.no_fill:
            return
        image = deploy_cli(self.extra, "settings", "GPUHUB_SINGLEUSER_IMAGE").strip()
        gpus = sorted(inventory().values(), key=lambda g: -g.free)
        left = sum(g.free for g in gpus) - spare
        for g in gpus:
            n = min(g.free, left)
            if n <= 0:
                continue
            left -= n
            name = f"fltfill-{g.uuid[-10:].lower()}"
            self.client.services.create(
                image,
                FILLER_COMMAND,
                name=name,
                labels={STACK_LABEL: FILLER_LABEL},
                container_labels={USER_LABEL: name, GPU_LABEL: g.uuid, SLICES_LABEL: str(n)},
                resources=docker.types.Resources(generic_resources={g.uuid: n}),
                # a home of its own on its machine, as a server's (the one-copy lock is there)
                mounts=[f"{name}-home:/home/jovyan:rw"],
                restart_policy=FILLER_RESTART,
            )
        self.until(
            f"fillers hold all but {spare} slices",
            lambda: sum(g.free for g in inventory().values()) <= spare,
            120,
        )
        row.notes["free slices (spare)"] = sum(g.free for g in inventory().values())

    def unfill(self) -> None:
        for service in self.client.services.list(
            filters={"label": f"{STACK_LABEL}={FILLER_LABEL}"}
        ):
            service.remove()

    def fault_proxy(self) -> Row:
        def inject(ps, row):
            t = time.monotonic()
            self.container_of("proxy").kill("SIGKILL")
            say("proxy's container killed")
            return t, ""

        return self.simple("proxy", inject)

    def fault_worker(self, kill: bool = False) -> Row:
        def inject(ps, row):
            w = self.busiest_worker(ps)
            row.notes["machine"] = w
            t = time.monotonic()
            say(f"{'killing' if kill else 'restarting'} {w}'s engine")
            bed("restart", w, *(["--kill"] if kill else []))
            say(f"{w}'s engine answers again after {time.monotonic() - t:.1f} s")
            return t, w

        return self.simple("worker-killed" if kill else "worker", inject)

    def fault_worker_killed(self) -> Row:
        return self.fault_worker(kill=True)

    def fault_manager(self, kill: bool = False) -> Row:
        seen = NodeStates()

        def inject(ps, row):
            t = time.monotonic()
            seen.start(t)
            say(f"{'killing' if kill else 'restarting'} the manager's engine")
            bed("restart", "manager", *(["--kill"] if kill else []))
            row.notes["engine back s"] = round(time.monotonic() - t, 1)
            say(f"the manager's engine answers again after {time.monotonic() - t:.1f} s")
            return t, "manager"

        row = self.simple("manager-killed" if kill else "manager", inject)
        row.notes["machines as Swarm saw them"] = seen.stop()
        return row

    def fault_manager_killed(self) -> Row:
        return self.fault_manager(kill=True)

    def fault_cut(self) -> Row:
        def inject(ps, row):
            w = self.busiest_worker(ps)
            row.notes["machine"] = w
            t = time.monotonic()
            bed("cut", w)
            say(f"{w} cut off from the manager for {CUT_S} s")
            try:
                while time.monotonic() - t < CUT_S:
                    self.sample(row, during=True)
                    time.sleep(2)
                try:
                    seen = listed(self.hub)
                    row.notes["hub lists at the end of the cut"] = sum(
                        p.name in seen for p in ps if p.node == w
                    )
                except requests.RequestException:
                    pass
            finally:
                bed("uncut", w)
            say(f"{w} back")
            return t, w

        return self.simple("cut", inject, copies=True, spare=self.on_busiest_worker)

    def fault_gone(self) -> Row:
        w = "w1"

        def inject(ps, row):
            nonlocal w
            w = self.busiest_worker(ps)
            row.notes["machine"] = w
            t = time.monotonic()
            bed("stop", w)
            say(f"{w} gone (its engine killed; it does not come back)")
            return t, w

        try:
            return self.simple("gone", inject, spare=self.on_busiest_worker)
        finally:
            say(f"{w} joins afresh for the next faults")
            bed("remove", w)
            bed("workers", "2")

    def fault_prometheus(self) -> Row:
        def dashboard(path: str) -> tuple[int, str, float]:
            t = time.monotonic()
            try:
                r = self.admin.get(f"{self.hub.url}/services/dashboard/{path}", timeout=30)
                return r.status_code, r.text, time.monotonic() - t
            except requests.RequestException as e:
                return 0, str(e), time.monotonic() - t

        def inject(ps, row):
            prometheus = self.client.services.get(f"{STACK['STACK']}_prometheus")
            status, _, _ = dashboard("api/series")
            row.notes["plots before"] = status
            t = time.monotonic()
            prometheus.scale(0)
            say(f"Prometheus stopped for {PROMETHEUS_OUTAGE_S} s")
            states, said = [], None
            while time.monotonic() - t < PROMETHEUS_OUTAGE_S:
                status, body, took = dashboard("api/state")
                states.append((status, took, '"machines"' in body))
                status, body, took = dashboard("api/series")
                if said is None and status != 200:
                    said = (time.monotonic() - t, status, body[:200], took)
                time.sleep(1)
            ok = [took for status, took, machines in states if status == 200 and machines]
            row.notes["live state answered"] = f"{len(ok)}/{len(states)}"
            row.notes["live state max s"] = round(max(ok), 2) if ok else None
            if said:
                row.notes["plots say"] = f"after {said[0]:.1f} s: {said[1]} {said[2]}"
                row.notes["plots answer s"] = round(said[3], 2)
            else:
                row.notes["plots say"] = "nothing: they answered 200 throughout"
            prometheus.reload()  # the scale-down made a new version of it
            prometheus.scale(1)
            back = time.monotonic()
            while time.monotonic() - back < 120:
                status, body, _ = dashboard("api/series")
                if status == 200 and '"plots"' in body:
                    row.notes["plots back s"] = round(time.monotonic() - back, 1)
                    break
                time.sleep(1)
            say(f"Prometheus back; the dashboard: {row.notes}")
            return t, ""

        return self.simple("prometheus", inject)

    def fault_hub_kill(self) -> Row:
        row, ps = self.base("hub-kill")
        burst = self.participants(BURST, "burst")
        stops = ps[1 : 1 + BURST_STOPS]
        answers: list[tuple[str, int, str]] = []
        lock = threading.Lock()

        def spawn(p: Participant):
            try:
                r = self.press_start(p)
                out = (f"start {p.name}", r.status_code, r.text[:120])
            except requests.RequestException as e:
                out = (f"start {p.name}", 0, str(e)[:120])
            with lock:
                answers.append(out)

        def stop(p: Participant):
            try:
                r = p.session.delete(f"{self.hub.url}/hub/api/users/{p.name}/server", timeout=60)
                out = (f"stop {p.name}", r.status_code, r.text[:120])
            except requests.RequestException as e:
                out = (f"stop {p.name}", 0, str(e)[:120])
            with lock:
                answers.append(out)

        self.arm()
        wall_burst = time.time()
        with ThreadPoolExecutor(BURST + BURST_STOPS) as pool:
            t_burst = time.monotonic()
            for p in burst:
                pool.submit(spawn, p)
            for p in stops:
                pool.submit(stop, p)
            while len(answers) < KILL_AFTER_ANSWERS and time.monotonic() - t_burst < 10:
                time.sleep(0.05)
            t = time.monotonic()
            hub = self.container_of("hub")
            hub.kill("SIGKILL")
            say(
                f"hub killed {t - t_burst:.2f} s into the burst, {len(answers)} of "
                f"{BURST + BURST_STOPS} requests answered"
            )
        refused = {
            what.split()[1] for what, status, _ in answers if what[:5] == "start" and status == 503
        }
        try:
            holders = slice_holders(STACK["STACK"], self.client)
            row.notes["burst: answered a refusal, yet holding slices in Swarm"] = sorted(
                refused & holders.keys()
            )
        except (docker.errors.DockerException, requests.RequestException) as e:
            say(f"slices not read after the burst: {e}")
        codes: dict[str, int] = {}
        for what, status, text in answers:
            key = f"{what.split()[0]} {status}"
            codes[key] = codes.get(key, 0) + 1
            row.notes.setdefault(f"burst: {key}, e.g.", f"{what}: {text}")
        row.notes["burst answers"] = codes
        row.notes["after the burst"] = self.swarm_use()
        try:  # what the killed hub logged of the burst
            lines = hub.logs(since=int(wall_burst) - 1).decode(errors="replace").splitlines()
            row.notes["killed hub's log"] = [
                x[:300] for x in lines if "GET /" not in x and "/activity" not in x
            ][-25:]
        except docker.errors.DockerException as e:
            row.notes["killed hub's log"] = f"not read: {e}"
        wall = time.time()
        tracked = [Tracked(ps[0], expected=True)]
        tracked += [Tracked(p, wanted=False) for p in stops]
        tracked += [Tracked(p) for p in burst]
        self.watch(row, tracked, t, time.monotonic(), self.args.limit)
        seen = listed(self.hub)
        holders = slice_holders(STACK["STACK"], self.client)
        row.notes["stops lost"] = sorted(
            p.name for p in stops if p.name in seen or p.name in holders
        )
        row.notes["burst: ready"] = sum(t.answered_at is not None or t.back_at is not None
                                        for t in tracked[1 + len(stops):])  # fmt: skip
        row.notes["hub log"] = self.hub_log(wall, ("Error", "error", "Traceback", "orphan"))[-15:]
        row.notes["restarted hub's start-up"] = [
            x[:300] for x in self.hub_log(wall, STARTUP_LOG) if ps[0].name in x or "ervers" in x
        ][:30]
        return row

    def fault_broken(self) -> Row:
        """The instrument's check: every figure made bad on purpose, no fault."""
        row, ps = self.base("broken")
        self.fill(row, 1)  # the orphan's slice
        first, second = ps[0], ps[1]
        image = deploy_cli(self.extra, "settings", "GPUHUB_SINGLEUSER_IMAGE").strip()
        self.arm()
        t = time.monotonic()
        # a route gone from the proxy: first's server does not answer through it
        drop = (
            "import urllib.request; token = open('/run/secrets/proxy_token').read().strip(); "
            f"r = urllib.request.Request('http://proxy:8001/api/routes/user/{first.name}', "
            "method='DELETE', headers={'Authorization': 'token ' + token}); "
            "print(urllib.request.urlopen(r).status)"
        )
        out = self.container_of("hub").exec_run(["python3", "-c", drop])
        row.notes["route deleted"] = out.output.decode().strip()[-200:]
        # a marker gone from a home
        r = second.session.delete(
            f"{self.hub.url}/user/{second.name}/api/contents/fault-marker.txt", timeout=30
        )
        row.notes["marker deleted"] = r.status_code
        # a service holding a slice for nobody the hub knows
        gpu = max(inventory().values(), key=lambda g: g.free)
        self.client.services.create(
            image,
            ["sleep", "infinity"],
            name="jy-selfcheck-orphan",
            labels={STACK_LABEL: STACK["STACK"], USER_LABEL: "selfcheck-nobody"},
            resources=docker.types.Resources(generic_resources={gpu.uuid: 1}),
        )
        # a second container of second's server on its machine, claiming 3 slices of its GPU
        (mine,) = [c for c in running_copies(self.engines) if c.user == second.name]
        engine = self.engines[mine.machine]
        copy = engine.containers.run(
            image,
            ["infinity"],
            entrypoint=["sleep"],
            name="selfcheck-copy",
            labels={USER_LABEL: second.name, GPU_LABEL: mine.gpu, SLICES_LABEL: "3"},
            detach=True,
            network_mode="none",
        )
        say("broken: a route, a marker, an orphan service, a second copy of a server")
        try:
            tracked = [Tracked(p, expected=True) for p in ps]
            self.watch(row, tracked, t, time.monotonic(), min(self.args.limit, 90), copies=True)
        finally:
            copy.remove(force=True)
        return row

    def fault_full(self) -> Row:
        row, ps = self.base("full")
        late = self.participants(3, "late")
        with InBrowser(self.hub, self.participants(1, "page")[0]) as page:
            self.fill(row, len(late))
            self.fill_hub_data(row, ps, late, page)
        return row

    def fill_hub_data(
        self, row: Row, ps: list[Participant], late: list[Participant], page: InBrowser
    ) -> None:
        """The hub's data volume filled up while ``ps`` run; ``late`` and ``page`` press Start
        (by the REST API; in the browser), then space is freed and ``late`` start again."""
        wall = time.time()
        fill = self.hub_data / "fill"
        # the write-ahead log emptied first, as after a quiet moment or a restart: the hub's next
        # writes must grow it (a log that has grown before takes writes in its own space)
        row.notes["checkpoint"] = self.checkpoint()
        self.arm()
        t = time.monotonic()
        written = 0
        with open(fill, "wb", buffering=0) as f:
            chunk = b"\0" * (1 << 20)
            try:
                while f.write(chunk) == len(chunk):
                    written += 1
            except OSError:
                pass
        say(f"hub data volume full ({written} MiB written)")
        told = []
        for p in late:
            t0 = time.monotonic()
            try:
                r = self.press_start(p)
                told.append(f"{r.status_code} in {time.monotonic() - t0:.1f} s: {r.text[:200]}")
            except requests.RequestException as e:
                told.append(f"no answer: {e}")
        row.notes["starts while full"] = told
        say(f"starts while full: {told}")
        row.notes["browser while full"] = page.press_start()
        say(f"in the browser while full: {row.notes['browser while full']}")
        time.sleep(10)  # what a start let through does meanwhile
        seen = listed(self.hub) if hub_answers(self.hub) else {}
        row.notes["late listed while full"] = [
            f"{p.name}: {'ready' if seen[p.name].get('ready') else 'pending'}"
            for p in late
            if p.name in seen
        ]
        row.notes["running answer while full"] = sum(server_answers(self.hub, p) for p in ps)
        stopping = ps[-1]
        try:
            r = stopping.session.delete(
                f"{self.hub.url}/hub/api/users/{stopping.name}/server", timeout=60
            )
            row.notes["stop while full"] = f"{r.status_code} {r.text[:200]}"
        except requests.RequestException as e:
            row.notes["stop while full"] = f"no answer: {e}"
        fill.unlink()
        say("space freed")
        row.notes["database"] = self.database_check()
        row.notes["hub log"] = self.hub_log(
            wall, ("full", "disk", "space", "OperationalError", "rolled back")
        )[-10:]
        tracked = [Tracked(p, expected=True) for p in ps[:-1]]
        tracked.append(Tracked(stopping, wanted=False))
        tracked += [Tracked(p) for p in late]  # press Start again once the space is back
        self.watch(row, tracked, t, time.monotonic(), self.args.limit)

    def checkpoint(self) -> str:
        """SQLite's TRUNCATE checkpoint of the hub's database: its write-ahead log emptied."""
        path = self.hub_data / "jupyterhub.sqlite"
        try:
            db = sqlite3.connect(str(path), timeout=10)
            try:
                busy, log, done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                db.close()
        except sqlite3.Error as e:
            return f"failed: {e}"
        wal = path.with_name(path.name + "-wal")
        size = wal.stat().st_size if wal.exists() else 0
        return f"busy {busy}, {done}/{log} pages; log now {size} bytes"

    def database_check(self) -> str:
        """SQLite's integrity check of the hub's database, and its users and servers."""
        path = self.hub_data / "jupyterhub.sqlite"
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            try:
                (check,) = db.execute("PRAGMA integrity_check").fetchone()
                users = db.execute("SELECT count(*) FROM users").fetchone()[0]
                servers = db.execute("SELECT count(*) FROM servers").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error as e:
            return f"not read: {e}"
        return f"integrity {check}; {users} users, {servers} servers"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=6, help="participants' servers per fault")
    parser.add_argument("--only", default=",".join(FAULTS), help=f"some of {','.join(FAULTS)}")
    parser.add_argument("--json", help="write the figures to this file too")
    parser.add_argument(
        "--limit",
        type=float,
        default=300,
        help="seconds to wait for healing after a fault (JupyterHub checks the proxy's routes "
        "every 300 s)",
    )
    parser.add_argument(
        "--homes-dir",
        default="",
        help="shared homes (GPUHUB_HOMES_DIR) under this folder, e.g. "
        "/var/lib/gpu-jupyterhub-bed/faults-homes (every bed machine sees this machine's files)",
    )
    parser.add_argument(
        "--no-fill", action="store_true", help="leave the slices nobody uses free (no fillers)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the stack deployed")
    args = parser.parse_args()
    chosen = [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = sorted(set(chosen) - set(FAULTS) - set(CHECKS))
    if unknown:
        known = ", ".join(FAULTS + CHECKS)
        parser.error(f"unknown fault(s) {', '.join(unknown)}; choose from {known}")
    join_clients_cpu(threading.current_thread())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    suite = Suite(args)
    rows: list[Row] = []
    try:
        suite.deploy()
        for fault in [f for f in FAULTS + CHECKS if f in chosen]:
            print(f"\n== {fault}", flush=True)
            try:
                suite.settle()
                row = getattr(suite, f"fault_{fault.replace('-', '_')}")()
            except Exception as e:  # one fault's failure does not stop the others
                say(f"{fault} failed: {type(e).__name__}: {e}")
                row = Row(fault, notes={"failed": f"{type(e).__name__}: {e}"})
            rows.append(row)
            print(table([row]), flush=True)
            for key, value in row.notes.items():
                print(f"    {key}: {value}", flush=True)
    finally:
        if not args.keep:
            suite.remove()
    homes = f"shared homes ({args.homes_dir})" if args.homes_dir else "homes on their machine"
    fill = "bed not filled" if args.no_fill else "bed filled but for the spare slices"
    print(f"\nsummary: commit {commit}, {args.servers} servers per fault, {homes}, {fill}")
    print(table(rows))
    if args.json:
        result = {
            "commit": commit,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "servers": args.servers,
            "homes": args.homes_dir or "local",
            "filled": not args.no_fill,
            "rows": [asdict(r) for r in rows],
        }
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
