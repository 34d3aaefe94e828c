"""A workshop day replayed without a cloud, for the capacity policy's tests
(tests/unit/test_capacity.py): pure, deterministic, on a clock of its own.

The day (``workshop_day``): participants arrive over the morning (most at the start, some late),
most break for lunch (their servers culled while they eat) and some of them do not come back,
the rest leave over the afternoon; the culler ends a server a set time after its participant
stopped using it. Each participant's server needs one slice; whoever finds none waits in line,
first come first served, and the line's head takes the first free slice (on the busiest
machine, the hub's ``pack``, so machines empty out).

``replay`` runs the day against a fleet: either fixed (``fixed`` machines ready all day) or
driven by ``capacity.decide`` every ``ROUND_S`` seconds, with a provider that boots a machine
in ``boot_s`` seconds and may say no, a machine that never joins, or a machine the cloud takes
back. It returns what the goals are measured on.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_swarm_spawner import capacity
from gpu_swarm_spawner.capacity import Decision, Machine, Settings
from gpu_swarm_spawner.cost import Span, Usage, usage

HOUR = 3600.0
MINUTE = 60.0
DAY_START = 8 * HOUR  # seconds after midnight; the replay's clock is seconds of the day
DAY_END = 18 * HOUR
TICK_S = 15.0
ROUND_S = 30.0  # the hub's capacity round
CULL_S = 20 * MINUTE  # the culler ends a server this long after its participant stopped


@dataclass(frozen=True)
class Session:
    """One participant's wish for a server: from ``start`` until ``end`` (seconds of the day;
    the culler's delay included)."""

    who: str
    start: float
    end: float


def workshop_day(people: int = 40, seed: int = 41) -> list[Session]:
    """The sessions of a day of ``people`` participants (deterministic for a ``seed``)."""
    rng = random.Random(seed)
    sessions = []
    for i in range(people):
        who = f"p{i:02d}"
        late = i >= people * 3 // 4
        arrive = rng.uniform(9.5, 11.0) * HOUR if late else rng.uniform(9.0, 9.5) * HOUR
        leave = rng.uniform(14.5 * HOUR, 17.5 * HOUR)
        kind = rng.random()
        if kind < 0.2:  # works through lunch
            sessions.append(Session(who, arrive, leave + CULL_S))
            continue
        lunch = rng.uniform(12.5 * HOUR, 12.5 * HOUR + 10 * MINUTE)
        sessions.append(Session(who, arrive, lunch + CULL_S))
        if kind < 0.45:  # gone after lunch
            continue
        back = rng.uniform(13.5 * HOUR, 13.5 * HOUR + 20 * MINUTE)
        sessions.append(Session(who, back, leave + CULL_S))
    return sorted(sessions, key=lambda s: (s.start, s.who))


@dataclass
class Box:
    """A machine of the replay."""

    name: str
    state: str
    since: float
    asked: float
    slices: int
    ready_at: float  # when it will be ready (inf: never joins)
    servers: dict = field(default_factory=dict)  # who -> session end
    last_server: float | None = None
    gone_at: float | None = None

    def view(self) -> Machine:
        used = len(self.servers)
        return Machine(
            self.name,
            self.state,
            self.since,
            asked=self.asked,
            servers=used,
            free=self.slices - used if self.state in ("ready", "draining") else 0,
            slices=self.slices,
            last_server=self.last_server,
        )


@dataclass
class Provider:
    """The cloud of the replay: grows the group by booting machines in ``boot_s``; ``refuse``
    says, for a time of day, what the cloud answers a grow with ("" yes, else the kind of no);
    ``never_joins``: how many of the next machines asked never join."""

    boot_s: float = 5 * MINUTE
    refuse: Callable[[float], str] = lambda now: ""
    never_joins: int = 0
    backoff_s: float = 2 * MINUTE


@dataclass
class Day:
    """What the replay measured."""

    waits: list[float]  # seconds each served session waited for its slice
    machine_hours: float
    servers_ended_by_removal: int
    decisions: list[tuple[float, Decision]]
    told: list[tuple[float, str]]  # what the organizer was told (refusals), when
    unserved: int  # sessions that ended while still in line
    boxes: list[Box]
    restarted: int  # sessions started again after their machine was taken back
    usage: Usage  # machine-hours and slice-hours (cost.py)

    def p95_wait(self) -> float:
        waits = sorted(self.waits)
        return waits[min(math.ceil(0.95 * len(waits)) - 1, len(waits) - 1)] if waits else 0.0


def replay(
    sessions: list[Session],
    fixed: int = 0,
    settings: Settings | None = None,
    provider: Provider | None = None,
    start_machines: int = 0,
    slices: int = 8,
    take_back: tuple[float, str] | None = None,
) -> Day:
    """The day ``sessions`` against a fixed fleet of ``fixed`` machines, or (``settings``)
    against the capacity policy starting with ``start_machines`` ready; ``take_back``: (time,
    machine) the cloud takes back (spot), ending its servers, whose participants start again."""
    provider = provider or Provider()
    now = DAY_START
    boxes = [
        Box(f"gpu-{i}", "ready", now, 0.0, slices, now) for i in range(fixed or start_machines)
    ]
    pending = list(sessions)
    line: list[tuple[Session, float]] = []  # (session, joined)
    waits: list[float] = []
    ended_by_removal = 0
    restarted = 0
    unserved = 0
    decisions: list[tuple[float, Decision]] = []
    told: list[tuple[float, str]] = []
    blocked_until, blocked_why = 0.0, ""
    never_joins = provider.never_joins
    next_round = now
    servers: list[Span] = []

    def ask(count: int) -> None:
        nonlocal never_joins
        for _ in range(count):
            ready_at = now + provider.boot_s
            if never_joins:
                never_joins -= 1
                ready_at = math.inf
            boxes.append(Box(f"gpu-{len(boxes)}", "asked", now, now, slices, ready_at))

    while now <= DAY_END:
        for box in boxes:
            if box.state in capacity.ON_ITS_WAY and now >= box.ready_at:
                box.state, box.since = "ready", now
            for who, end in list(box.servers.items()):
                if end <= now:
                    del box.servers[who]
                    box.last_server = now
        if take_back and take_back[0] <= now:
            victim = next(b for b in boxes if b.name == take_back[1])
            for who, end in victim.servers.items():
                line.append((Session(who, now, end), now))
                restarted += 1
            victim.servers.clear()
            victim.state, victim.since, victim.gone_at = "gone", now, now
            take_back = None
        while pending and pending[0].start <= now:
            line.append((pending.pop(0), now))
        still = []
        for session, joined in line:
            if session.end <= now:
                unserved += 1
                continue
            usable = [b for b in boxes if b.state == "ready" and len(b.servers) < b.slices]
            if not usable:
                still.append((session, joined))
                continue
            box = max(usable, key=lambda b: (len(b.servers), b.name))  # pack
            box.servers[session.who] = session.end
            box.last_server = now
            waits.append(now - joined)
            servers.append(Span(now, session.end, 1))
        line = still

        if settings is not None and now >= next_round:
            next_round = now + ROUND_S
            views = [b.view() for b in boxes]
            for decision in capacity.decide(
                now, views, [1] * len(line), settings, blocked_until, blocked_why
            ):
                decisions.append((now, decision))
                box = next((b for b in boxes if b.name == decision.machine), None)
                if decision.action == capacity.GROW:
                    counted = sum(b.state in capacity.COUNTED for b in boxes)
                    answer = provider.refuse(now)
                    if answer:
                        blocked_until, blocked_why = now + provider.backoff_s, answer
                        told.append((now, answer))
                    else:
                        ask(decision.target - counted)
                elif decision.action == capacity.DRAIN:
                    box.state, box.since = "draining", now
                elif decision.action == capacity.RESUME:
                    box.state, box.since = "ready", now
                elif decision.action in (capacity.REMOVE, capacity.GIVE_UP):
                    ended_by_removal += len(box.servers)
                    box.servers.clear()
                    box.state, box.since, box.gone_at = "gone", now, now
        now += TICK_S

    machines = [Span(b.asked or DAY_START, b.gone_at, b.slices) for b in boxes]
    used = usage(machines, servers, now, price_per_hour=14.0)
    return Day(
        waits,
        used.machine_hours,
        ended_by_removal,
        decisions,
        told,
        unserved,
        boxes,
        restarted,
        used,
    )
