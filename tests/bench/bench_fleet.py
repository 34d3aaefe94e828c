"""`make bench-fleet` (tests/bench/fleet.sh): a workshop day replayed on the bed twice, with a
fixed fleet sized for its peak and with the hub driving the fleet (GPUHUB_FLEET=on) through
the bed's cloud (tests/integration/bed_cloud.py), whose machines are fresh bed machines joined
by the printed join line after a boot delay. Figures printed, never asserted (issue 41's goals
beside them).

The day is the pure replay's (tests/unit/fleet_day.py, ``workshop_day``), compressed: one hour
of the day lasts ``--hour`` seconds (60: the 10-hour day in 10 minutes). Participants arrive
over the morning, most break for lunch and some do not come back, the rest leave over the
afternoon; each is an API client of the hub (the operations token, as the other benches'
participants are): it asks for a server (the line is ``auto``: who finds no free slice waits
in it), reports activity while it works (``POST /users/NAME/activity``), and stops reporting
when it leaves or goes to lunch, after which the hub's idle culler ends its server
(GPUHUB_IDLE_TIMEOUT: its default 90 minutes, as the replay's, compressed). A server ended
under a working participant (its machine taken back) is asked for again. Servers are the stand-in
(images/scale-server), so that three machines of 6 slices fit on the bed's 2 cores. Both runs
keep participants' homes on the bed's shared storage (GPUHUB_HOMES_DIR), which the fleet needs.

1. fixed: the group grown to the peak's machines before the day and left so all day.
2. hub: GPUHUB_FLEET=on (minimum 1, maximum the fixed fleet's, margin 2, a machine given back
   after 10 empty minutes, as the replay's hub), its boot-and-join the fixed run's median.
   Provider failures injected: the morning's grow refused (Google's recorded "zone
   exhausted": no capacity), a machine that never joins (the organizer removes it once the
   dashboard says it was given up), a machine taken back (spot) at 11:00, and the afternoon's
   grow left unanswered for as many tries as the hub makes (3).

Figures per run: machine-hours (the cloud's own records of when each machine was asked for
and ended, within the day), their ratio, p95 and longest time from asking to a ready server,
servers ended by a give-back (the hub's events on a machine after the cloud was asked to
remove it, and what the participants saw: must be 0), and each failure's time from when the
hub could know it to the dashboard showing it (goal: 10 s). Written to ``--json``
(default test-artifacts/bench-fleet.json).

    python -m tests.bench.bench_fleet [--people 16] [--hour 60] [--gpus 2] [--boot 20]
                                      [--only fixed|hub] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests

from gpu_swarm_spawner.events import Event, read_events
from gpu_swarm_spawner.provider import HUNG, NO_CAPACITY, last_line
from tests.bench import bench
from tests.bench.bench import HUB_DATA, pct
from tests.integration import bed_cloud
from tests.integration.aftermath import token_of
from tests.integration.bed_cloud import Bed, BedCloud, machine_hours, recorded
from tests.integration.hub import BED, BED_HOST, REPO, Hub, state_file
from tests.integration.spawners import inventory
from tests.unit.fleet_day import (
    DAY_END,
    DAY_START,
    HOUR,
    IDLE_TIMEOUT,
    MINUTE,
    Session,
    workshop_day,
)

CLOUD_PORT = 18960
IMAGE = "gpu-jupyterhub/scale-server:latest"
SHARED = Path(BED["BED_SHARED"], "bench-fleet")
STACK = {
    "STACK": "bench-fleet",
    "HTTP_PORT": "18650",
    "NETWORK": "bench-fleet",
    "NAMED_SLOTS": "",
    "POLL_INTERVAL": "5",
    "SINGLEUSER_IMAGE": IMAGE,
    "EGRESS": "off",  # busybox: no gpuhub-firewall (fleet.sh: nor on the machines)
    "CPU_LIMIT": "0.5",
    "MEM_LIMIT": "256M",
    "START_TIMEOUT": "300",
    "WAITING_LINE": "auto",
    "LINE_MAX_LENGTH": "0",
    "LINE_MAX_WAIT": "0",
    "CULL_EVERY": "5",
    "SIMULATE_IF_NO_GPU": "0",
    # on the bed's shared storage, which every fresh machine mounts; the homes too, as the
    # fleet needs them (docs/homes.md), in both runs alike
    "TUTORIALS_DIR": str(SHARED / "tutorials"),
    "DATASETS_DIR": str(SHARED / "datasets"),
    "HOMES_DIR": str(SHARED / "homes"),
}
TICK_S = 0.5  # the participants' clock (real seconds)
ACTIVITY_S = 5.0  # how often a working participant's activity is reported (real seconds)
HUNG_TRIES = 3  # provider.Commands' attempts: a grow left unanswered this often fails as hung
COMMAND_TIMEOUT_S = 20
ROUND_S = 10.0  # the fleet's round (docs/autoscaling.md)
#: the capacity policy's words for a machine given up (capacity.decide's GIVE_UP reason)
GIVEN_UP = "has not joined"
#: what a machine's state reads once it is gone, wherever a view shows it
GONE_WORDS = frozenset({"gone", "down", "disconnected", "unknown", "taken back"})


# ---- the day, compressed --------------------------------------------------------------------


@dataclass(frozen=True)
class Clock:
    """The day's time (seconds of the day) from this machine's (epoch seconds): the day's
    ``DAY_START`` at ``t0``, one of its hours every ``hour`` seconds."""

    t0: float
    hour: float

    def day(self, real: float) -> float:
        return DAY_START + (real - self.t0) * HOUR / self.hour

    def real(self, day: float) -> float:
        return self.t0 + (day - DAY_START) * self.hour / HOUR

    def seconds(self, day_seconds: float) -> float:
        """A duration of the day in real seconds."""
        return day_seconds * self.hour / HOUR


def peak(sessions: Iterable[Session]) -> int:
    """The most sessions at once."""
    edges = sorted([(s.start, 1) for s in sessions] + [(s.end, -1) for s in sessions])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def day_of(sessions: list[Session]) -> list[list[Session]]:
    """Each participant's sessions, in order (a participant's next one starts after their
    last ended)."""
    people: dict[str, list[Session]] = {}
    for s in sorted(sessions, key=lambda s: s.start):
        people.setdefault(s.who, []).append(s)
    return list(people.values())


# ---- what the organizer is shown ------------------------------------------------------------


def machine_shown_gone(state, name: str) -> bool:
    """Whether a view's JSON ``state`` shows machine ``name`` gone: no entry with a state names
    it, or one that does reads as gone."""
    entries = []

    def walk(value) -> None:
        if isinstance(value, dict):
            if name in value.values() and {"state", "status"} & value.keys():
                entries.append(value)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(state)
    return not entries or any(
        str(e.get(key, "")).lower() in GONE_WORDS for e in entries for key in ("state", "status")
    )


@dataclass
class Failure:
    """One injected provider failure: when the hub could know it (``known``), when the
    dashboard showed it (``told``)."""

    what: str
    armed: float  # real time it was set up
    known: float | None = None
    told: float | None = None
    note: str = ""

    def late(self) -> float | None:
        if self.known is None or self.told is None:
            return None
        return self.told - self.known


def shows(state, failure: Failure, refusal: str) -> bool:
    """Whether the dashboard's ``state`` (its JSON) tells of ``failure``."""
    text = json.dumps(state)
    if failure.what == "refused":  # its kind, and the cloud's words (as JSON writes them)
        return NO_CAPACITY in text and json.dumps(last_line(refusal))[1:-1] in text
    if failure.what == "hung":
        return HUNG in text
    if failure.what == "never joins":
        return GIVEN_UP in text
    if failure.what == "taken back":
        return machine_shown_gone(state, failure.note)
    return False


def given_back_endings(events: Iterable[Event], removed: dict[str, float]) -> list[Event]:
    """The servers the hub's events say ended on a machine at or after the cloud was asked to
    remove it (``removed``: machine -> when): ended by a give-back."""
    ends = ("stopped", "failed", "healed")
    return [e for e in events if e.kind in ends and e.node in removed and e.time >= removed[e.node]]


# ---- one run ---------------------------------------------------------------------------------


@dataclass
class Result:
    run: str
    machines: int  # the fixed fleet's, or the hub's maximum
    machine_hours: float = 0.0
    waits: list[float] = field(default_factory=list)  # real seconds, asking -> ready
    unserved: int = 0
    ended_by_give_back_events: int = 0
    ended_by_give_back_seen: int = 0
    ended_by_take_back: int = 0
    not_culled: int = 0
    boot_and_join: list[float] = field(default_factory=list)  # real seconds, per machine
    failures: list[Failure] = field(default_factory=list)
    requests: list[tuple] = field(default_factory=list)


class Participants:
    """The day's participants, as API clients of the hub, on one thread."""

    def __init__(self, hub: Hub, clock: Clock, sessions: list[Session], result: Result):
        self.hub, self.clock, self.result = hub, clock, result
        self.people = day_of(sessions)
        self.asked: dict[str, float] = {}  # who -> when they asked (waiting)
        self.working: dict[str, Session] = {}  # who -> the session their server serves
        self.node: dict[str, str] = {}  # who -> the machine their server is on
        self.reported: dict[str, float] = {}
        self.ended: list[tuple[str, str, float]] = []  # (who, machine, when) ended under them
        self.retry: dict[str, float] = {}  # who -> when they press Start again after a refusal

    def ask(self, who: str, now: float) -> None:
        if now < self.retry.get(who, 0):
            return
        r = self.hub.api("POST", f"/users/{who}/server")
        if r.status_code in (201, 202):
            self.asked[who] = now
        elif r.status_code != 400:  # 400: already running (culled late): kept as it is
            print(f"  {who} refused: {r.status_code} {r.text[:120]}", flush=True)
            self.retry[who] = now + 5

    def tick(self, now: float, running: dict[str, dict]) -> None:
        day = self.clock.day(now)
        for sessions in self.people:
            if not sessions:
                continue
            s = sessions[0]
            who, server = s.who, running.get(s.who)
            leaves = s.end - IDLE_TIMEOUT  # stops working; the culler ends it after its timeout
            if who not in self.asked and who not in self.working and s.start <= day:
                if day >= leaves:  # a session shorter than a tick of the day
                    sessions.pop(0)
                elif server and server.get("ready"):
                    self.working[who] = s  # their earlier server was still there
                else:
                    self.ask(who, now)
                continue
            if who in self.asked:
                if server and server.get("ready"):
                    self.result.waits.append(now - self.asked.pop(who))
                    self.working[who] = s
                    self.node[who] = ((server.get("state") or {}).get("gpu_node")) or ""
                elif day >= s.end:
                    self.asked.pop(who)
                    self.result.unserved += 1
                    self.hub.api("DELETE", f"/users/{who}/server")
                    sessions.pop(0)
                elif server is None:  # its start failed: asked again
                    self.ask(who, now)
                continue
            if who in self.working:
                if server is None and day < leaves:  # ended under them: they start again
                    self.ended.append((who, self.node.get(who, ""), now))
                    del self.working[who]
                    self.ask(who, now)
                elif server is None or day >= s.end + 10 * MINUTE:
                    if server is not None:  # the culler did not end it in time
                        self.result.not_culled += 1
                        self.hub.api("DELETE", f"/users/{who}/server")
                    del self.working[who]
                    sessions.pop(0)
                elif day < leaves and now - self.reported.get(who, 0) >= ACTIVITY_S:
                    self.report(who, now)

    def report(self, who: str, now: float) -> None:
        stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat()
        body = {"last_activity": stamp, "servers": {"": {"last_activity": stamp}}}
        self.hub.api("POST", f"/users/{who}/activity", json=body)
        self.reported[who] = now


class Watcher:
    """The organizer's dashboard, read every half second, for the failures not told yet."""

    def __init__(self, hub: Hub, refusal: str):
        self.url = f"{hub.url}/services/dashboard/api/state"
        self.session = requests.Session()
        token = token_of(hub, "admin", hub.admin_password)
        self.session.headers["Authorization"] = f"token {token}"
        self.refusal = refusal
        self.failures: list[Failure] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            waiting = [f for f in self.failures if f.told is None and f.known is not None]
            if not waiting:
                continue
            try:
                state = self.session.get(self.url, timeout=10).json()
            except (requests.RequestException, ValueError):
                continue
            for failure in waiting:
                if shows(state, failure, self.refusal):
                    failure.told = time.time()


def join_line(run: str) -> str:
    """What `make join-command` prints for the run's stack (its shared folders marked)."""
    return subprocess.run(
        ["make", "-s", "join-command"],
        cwd=REPO,
        env=bench.env_of(run),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def wait_slices(count: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while sum(g.slices for g in inventory().values()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} slices not seen after {timeout} s: {inventory()}")
        time.sleep(1)


def replay(
    hub: Hub,
    clock: Clock,
    sessions: list[Session],
    result: Result,
    faults: list[tuple[float, Callable[[], None]]],
) -> Participants:
    people = Participants(hub, clock, sessions, result)
    end = clock.real(DAY_END)
    while (now := time.time()) < end or people.asked or people.working:
        while faults and clock.real(faults[0][0]) <= now:
            faults.pop(0)[1]()
        try:
            people.tick(now, bench.servers(hub))
        except requests.RequestException as e:  # the hub not answering for a moment
            print(f"  the hub did not answer: {e}", flush=True)
        if now > end + clock.seconds(2 * HOUR):
            break  # two hours after the day: whatever is left is left
        time.sleep(TICK_S)
    return people


def run_day(run: str, sessions: list[Session], args, machines: int, boot_and_join: float):
    result = Result(run, machines)
    refusal = recorded(bed_cloud.NO_CAPACITY_TEXT)
    cloud_url = f"http://{BED_HOST}:{CLOUD_PORT}"
    settings = {"IDLE_TIMEOUT": str(round(IDLE_TIMEOUT * args.hour / HOUR))}
    if run == "hub":
        clock_s = args.hour / HOUR  # real seconds per second of the day
        settings.update(
            {
                "FLEET": "on",
                "FLEET_MIN_MACHINES": "1",
                "FLEET_MAX_MACHINES": str(machines),
                "FLEET_MARGIN": "2",
                "FLEET_EMPTY_FOR": str(max(round(10 * MINUTE * clock_s), int(ROUND_S))),
                "FLEET_SLICES_PER_MACHINE": str(args.gpus * args.slices_per_gpu),
                "FLEET_BOOT_AND_JOIN": str(round(boot_and_join)),
                "FLEET_JOIN_WITHIN": str(round(3 * boot_and_join)),
                "FLEET_COMMAND_TIMEOUT": str(COMMAND_TIMEOUT_S),
                **{k.removeprefix("GPUHUB_"): v for k, v in bed_cloud.commands(cloud_url).items()},
            }
        )
    bench.VARIANTS[run] = {**STACK, **settings}
    first = 11 if run == "fixed" else 51
    cloud = BedCloud(Bed(args.gpus), join_line(run), boot_s=args.boot, first=first)
    cloud.bed.prepare()
    server = bed_cloud.serve(cloud, BED_HOST, CLOUD_PORT)
    watcher = None
    by_organizer: set[str] = set()
    try:
        if run == "fixed":
            cloud.request("grow", [str(machines)])
            wait_slices(machines * args.gpus * args.slices_per_gpu)
        hub = bench.deploy(run)
        state = {"GPUHUB_STATE_DIR": bench.setting(run, "GPUHUB_STATE_DIR")}
        hub.admin_password = state_file(state, "admin_password")
        for who in {s.who for s in sessions}:
            hub.api("POST", f"/users/{who}")
        clock = Clock(time.time(), args.hour)
        faults: list[tuple[float, Callable[[], None]]] = []
        if run == "hub" and args.faults:
            watcher = Watcher(hub, refusal)
            faults = injections(cloud, watcher, refusal, 3 * boot_and_join, by_organizer)
        print(f"\n== {run}: the day starts ({machines} machines)", flush=True)
        people = replay(hub, clock, sessions, result, faults)
        end = min(time.time(), clock.real(DAY_END))
        result.machine_hours = machine_hours(cloud.spans(), clock.t0, end) * HOUR / args.hour
        result.boot_and_join = [
            i.started - i.asked
            for i in cloud.instances.values()
            if i.started is not None and i.startup == "joined"
        ]
        removed = {
            r.args[0]: r.at
            for r in cloud.asked("remove")
            if r.status == 0 and r.args and r.args[0] not in by_organizer
        }
        events = hub_events(hub)
        result.ended_by_give_back_events = len(given_back_endings(events, removed))
        taken = {i.name for i in cloud.instances.values() if i.ended_by == bed_cloud.TAKEN_BACK}
        result.ended_by_give_back_seen = sum(1 for _, node, _ in people.ended if node in removed)
        result.ended_by_take_back = sum(1 for _, node, _ in people.ended if node in taken)
        result.requests = [
            (round(r.at - clock.t0, 1), r.op, r.args, r.status) for r in cloud.requests
        ]
        if watcher is not None:
            time.sleep(15)  # the last failures' last chance to be told
            result.failures = watcher.failures
    finally:
        if watcher is not None:
            watcher.stop.set()
        bench.remove(run)
        server.shutdown()
        cloud.close()
    return result


def injections(
    cloud: BedCloud, watcher: Watcher, refusal: str, join_within: float, by_organizer: set[str]
) -> list[tuple[float, Callable[[], None]]]:
    """The hub run's failures: (time of the day, what to do), in order. ``by_organizer``
    gets the machines the bench removes itself, as the organizer does in the cloud's console
    (a machine that never joined, once the dashboard says it was given up)."""

    def refuse() -> None:
        failure = Failure("refused", time.time())
        watcher.failures.append(failure)
        cloud.refuse_next_grow(refusal)

        def known() -> None:  # the refused grow's answer
            while failure.known is None and not watcher.stop.is_set():
                refused = [
                    r for r in cloud.asked("grow") if r.status == 1 and r.at >= failure.armed
                ]
                if refused:
                    failure.known = refused[0].at
                time.sleep(0.2)

        threading.Thread(target=known, daemon=True).start()

    def never_joins() -> None:
        failure = Failure("never joins", time.time())
        watcher.failures.append(failure)
        cloud.never_join_next()

        def known() -> None:  # its join limit passed: the organizer removes it once told
            while not watcher.stop.is_set():
                silent = [i for i in cloud.instances.values() if i.silent]
                if silent and failure.known is None:
                    failure.note = silent[0].name
                    failure.known = silent[0].asked + join_within
                if failure.told is not None and failure.note:
                    by_organizer.add(failure.note)
                    cloud.request("remove", [failure.note])
                    return
                time.sleep(0.5)

        threading.Thread(target=known, daemon=True).start()

    def take_back() -> None:
        # a machine that joined (the one that never did is running too, in the cloud's books)
        running = [
            i
            for i in cloud.instances.values()
            if i.state == bed_cloud.RUNNING and i.startup == "joined"
        ]
        if not running:
            watcher.failures.append(Failure("taken back", time.time(), note="(no machine)"))
            return
        victim = max(running, key=lambda i: i.asked)  # the newest: likely the least used
        failure = Failure("taken back", time.time(), note=victim.name)
        cloud.take_back(victim.name)
        failure.known = time.time()
        watcher.failures.append(failure)

    def hang() -> None:
        failure = Failure("hung", time.time())
        watcher.failures.append(failure)
        cloud.hang_next("grow", HUNG_TRIES)

        def known() -> None:  # the last unanswered try's time limit passed
            while failure.known is None and not watcher.stop.is_set():
                hung = [
                    r for r in cloud.asked("grow") if r.status is None and r.at >= failure.armed
                ]
                if len(hung) >= HUNG_TRIES:
                    failure.known = hung[HUNG_TRIES - 1].at + COMMAND_TIMEOUT_S
                time.sleep(0.2)

        threading.Thread(target=known, daemon=True).start()

    return [
        (8.75 * HOUR, refuse),  # the morning's grow
        (9.25 * HOUR, never_joins),
        (11.0 * HOUR, take_back),
        (13.25 * HOUR, hang),  # the return from lunch
    ]


def hub_events(hub: Hub) -> list[Event]:
    out = bench.hub_container_of(hub).exec_run(
        ["tail", "-n", "100000", f"{HUB_DATA}/dashboard/events.jsonl"]
    )
    return read_events(out.output.splitlines())


# ---- the report --------------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    return pct(values, 0.95) if values else 0.0


def report(results: dict[str, Result], hour: float) -> dict:
    """The summary, printed and returned (for the results file)."""
    summary: dict = {}
    fixed, hub = results.get("fixed"), results.get("hub")
    print("\nsummary (waits in real seconds; machine-hours of the day)")
    for r in results.values():
        line = (
            f"  {r.run:5}  {r.machine_hours:6.1f} machine-hours  wait p95 {p95(r.waits):6.1f} s "
            f"max {max(r.waits, default=0):6.1f} s (n={len(r.waits)}, unserved {r.unserved})  "
            f"ended by a give-back: events {r.ended_by_give_back_events}, seen "
            f"{r.ended_by_give_back_seen}; by a take-back {r.ended_by_take_back}; "
            f"not culled in time {r.not_culled}"
        )
        print(line)
    if fixed and hub and fixed.machine_hours:
        ratio = hub.machine_hours / fixed.machine_hours
        boot = statistics.median(fixed.boot_and_join) if fixed.boot_and_join else math.nan
        extra = p95(hub.waits) - p95(fixed.waits)
        print(f"  machine-hours: hub / fixed = {ratio:.2f}   goal <= 0.6")
        print(
            f"  p95 wait: hub - fixed = {extra:.1f} s, one boot-and-join {boot:.1f} s "
            f"({boot * HOUR / hour / 60:.0f} min of the day)   goal <= one boot-and-join"
        )
        summary.update({"ratio": ratio, "p95_extra_s": extra, "boot_and_join_s": boot})
    if hub:
        for f in hub.failures:
            late = f.late()
            if f.known is None:
                said = "not triggered (no request met it)"
            elif late is None:
                said = "NOT told on the dashboard"
            else:
                said = f"told {late:.1f} s after the hub could know"
            print(f"  failure {f.what:11} {f.note:8} {said}   goal <= 10 s")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=16)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--hour", type=float, default=60.0, help="real seconds per day hour")
    parser.add_argument("--gpus", type=int, default=2, help="simulated GPUs per machine")
    parser.add_argument("--boot", type=float, default=20.0, help="the cloud's boot delay (s)")
    parser.add_argument("--only", choices=("fixed", "hub"))
    parser.add_argument(
        "--no-faults",
        dest="faults",
        action="store_false",
        help="the hub's run without provider failures (its waits without their back-offs)",
    )
    parser.add_argument("--json", default=str(REPO / "test-artifacts" / "bench-fleet.json"))
    args = parser.parse_args()
    bench.VARIANTS["fixed"] = dict(STACK)
    args.slices_per_gpu = int(bench.setting("fixed", "GPUHUB_SLICES_PER_GPU"))
    sessions = workshop_day(args.people, args.seed)
    most = peak(sessions)
    machines = math.ceil(most / (args.gpus * args.slices_per_gpu))
    print(
        f"the day: {args.people} participants, {len(sessions)} sessions, peak {most} at once; "
        f"machines of {args.gpus} x {args.slices_per_gpu} slices: {machines} for the peak; "
        f"one hour of the day = {args.hour:g} s"
    )
    results: dict[str, Result] = {}
    args.boot_and_join = 120.0
    for run in ("fixed", "hub"):
        if args.only not in (None, run):
            continue
        results[run] = run_day(run, sessions, args, machines, args.boot_and_join)
        if results[run].boot_and_join:
            args.boot_and_join = statistics.median(results[run].boot_and_join)
    summary = report(results, args.hour)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {
                "commit": commit,
                "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "args": {k: v for k, v in vars(args).items() if k != "json"},
                "summary": summary,
                "runs": {k: asdict(v) for k, v in results.items()},
            },
            indent=2,
            default=str,
        )
    )
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
