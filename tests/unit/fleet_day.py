"""A workshop day replayed without a cloud, for the capacity policy's tests
(tests/unit/test_capacity.py) and its figures (docs/autoscaling.md): pure, deterministic, on a
clock of its own (seconds of the day).

The day (``workshop_day``), one tutorial day of the kind this project grew from (README: an
8-hour tutorial for 50+ people; issue 41: "arrivals over the morning, a lunch dip, people
leaving in the afternoon, the culler on"). Each number is an assumption written down, not a
record: no trace of a real day is kept in the project.

- **48 participants, one GPU slice each, machines of 8 slices** (one 80 GB GPU joined with
  ``--slice-memory 10GiB``): 6 machines hold everyone at once, the **fixed fleet** an organizer
  sizes for the peak, started at 08:30 (before the first arrival) and stopped at 17:30 (after
  the last person), 54 machine-hours.
- **Arrivals over the morning**: the tutorial starts at 09:00; three in four arrive from 08:45
  to 09:15, the others late, until 11:00. Each starts a server on arrival.
- **Lunch, 12:30 to 13:30**: one in five work on through it (a training left running, a
  notebook still at work: the culler sees activity); the others stop between 12:30 and 12:40,
  and one in four of them does not come back; the rest return between 13:30 and 13:50.
- **Leaving over the afternoon**: everyone still there leaves between 14:30 and 17:00 (the
  tutorial's end), about half the room gone by 15:45.
- **Nobody stops their own server**: they close the tab. A server ends when JupyterHub's idle
  culler ends it, ``idle_timeout`` after its participant's last activity, at the culler's next
  check (``GPUHUB_IDLE_TIMEOUT``, 5400 s by default, "outlasts a workshop's lunch break";
  ``GPUHUB_CULL_EVERY``, 60 s), or when the organizer stops everything at 17:30. With the
  default a server outlives the lunch hour, and its participant comes back to it; with a
  timeout shorter than lunch it is ended while they eat and they start a new one.

``replay`` runs the day against a fleet: either fixed (``fixed`` machines ready all day) or
driven by ``capacity.decide`` every ``ROUND_S`` seconds, with a provider that boots a machine
in ``boot_s`` seconds and may say no, a machine that never joins, or a machine the cloud takes
back. Whoever finds no slice waits in line, first come first served; each start is placed by
the hub's own ``placement.choose`` under ``policy`` (``spread``, the hub's default, or
``pack``). The fleet requires shared homes (GPUHUB_HOMES_DIR: a machine given back would take
local home volumes with it), so with ``settings`` a returning participant is placed like
anyone; without, as the hub without shared homes, first on the machine of their home volume
while it has room (``prefer_home_node``) unless ``shared_homes``. It returns what issue 41's
goals are measured on; ``packed_machine_hours`` the least any fleet could pay for the same
servers if they could move.

The hub's **idle stop** (``GPUHUB_FLEET_STOP_IDLE_AFTER``, ``capacity.idle_stop``) is replayed
by ``fleet_idle_stops`` (``replay``'s ``people`` and ``fleet_idle``): idle servers stopped early
where that lets a machine of the group be given back. ``with_break`` adds a break to the day,
to measure what it costs people who come back from one (``AFTERNOON_BREAK``; not part of the
day).
``python -m tests.unit.fleet_day`` prints docs/autoscaling.md's figures.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpu_swarm_spawner import capacity, placement
from gpu_swarm_spawner.capacity import Decision, Machine, Settings
from gpu_swarm_spawner.cost import Span, Usage, usage
from gpu_swarm_spawner.inventory import GPU

HOUR = 3600.0
MINUTE = 60.0
DAY_START = 8.5 * HOUR  # seconds after midnight: the fixed fleet is started
DAY_END = 17.5 * HOUR  # the organizer stops every machine (and so every server)
TICK_S = 15.0
ROUND_S = 30.0  # the hub's capacity round
PEOPLE = 48
SLICES = 8  # a machine's slices
FIXED = 6  # the fixed fleet: PEOPLE / SLICES, everyone at once
IDLE_TIMEOUT = 5400.0  # GPUHUB_IDLE_TIMEOUT's default
CULL_EVERY = 60.0  # GPUHUB_CULL_EVERY's default
PRICE = 14.0  # dollars a machine-hour, the price the project's first event paid (issue 41)
LUNCH_CULLED = 30 * MINUTE  # an organizer's GPUHUB_IDLE_TIMEOUT shorter than lunch

#: What the organizer of the day sets for the hub's fleet: the fixed fleet's 6 machines as the
#: most (the budget), one machine kept for the first arrivals, 2 slices kept free for the
#: 09:00 rush (docs/autoscaling.md: the margin), the proposed defaults otherwise (15 empty
#: minutes before a give-back, 5 minutes' boot-and-join).
ORGANIZER = Settings(
    min_machines=1,
    max_machines=FIXED,
    slices_per_machine=SLICES,
    empty_for=15 * MINUTE,
    margin=2,
    boot_and_join=5 * MINUTE,
)
#: The best a fleet can do without moving servers: machines ready the moment they are asked
#: for (``Provider(boot_s=0)``, a boot-and-join of 0: no margin kept for a rush) and given back
#: the moment they are empty.
INSTANT = Settings(
    min_machines=0, max_machines=FIXED, slices_per_machine=SLICES, empty_for=0, boot_and_join=0
)


@dataclass(frozen=True)
class Person:
    """One participant's day: active from ``arrive`` (to ``lunch``, None: works through it;
    again from ``back``, None: does not come back) until ``leave``, away during each of
    ``breaks`` (start, end) they are there for; seconds of the day."""

    who: str
    arrive: float
    leave: float
    lunch: float | None = None
    back: float | None = None
    breaks: tuple[tuple[float, float], ...] = ()

    def active(self) -> list[tuple[float, float]]:
        """The stretches of time this person works."""
        if self.lunch is None:
            stretches = [(self.arrive, self.leave)]
        else:
            stretches = [(self.arrive, self.lunch)]
            stretches += [(self.back, self.leave)] if self.back is not None else []
        for away, again in self.breaks:
            cut = []
            for begin, stop in stretches:
                if begin < away < stop:  # there when the break starts: away until its end
                    cut += [(begin, away)] + ([(again, stop)] if again < stop else [])
                else:
                    cut.append((begin, stop))
            stretches = cut
        return stretches

    def idle_since(self, now: float) -> float | None:
        """When this person last stopped working, if they are not at work at ``now``; None while
        they are (or before they first arrive)."""
        last = None
        for begin, stop in self.active():
            if begin <= now < stop:
                return None
            if stop <= now:
                last = stop
        return last

    def back_after(self, now: float) -> float | None:
        """When this person next starts working after ``now``; None: they do not."""
        return next((begin for begin, _ in self.active() if begin > now), None)


@dataclass(frozen=True)
class Session:
    """One server a participant wants: from ``start`` until ``end`` (seconds of the day; the
    culler's delay included)."""

    who: str
    start: float
    end: float
    again: bool = False  # a new server: the fleet-aware culler stopped its participant's last


def workshop_people(people: int = PEOPLE, seed: int = 41) -> list[Person]:
    """The participants of the day (module docstring), deterministic for a ``seed``."""
    rng = random.Random(seed)
    day = []
    for i in range(people):
        late = i >= people * 3 // 4
        arrive = rng.uniform(9.25, 11.0) if late else rng.uniform(8.75, 9.25)
        leave = rng.uniform(14.5, 17.0) * HOUR
        kind = rng.random()
        if kind < 0.2:  # works through lunch
            day.append(Person(f"p{i:02d}", arrive * HOUR, leave))
            continue
        lunch = rng.uniform(12.5 * HOUR, 12.5 * HOUR + 10 * MINUTE)
        back = rng.uniform(13.5 * HOUR, 13.5 * HOUR + 20 * MINUTE) if kind >= 0.4 else None
        day.append(Person(f"p{i:02d}", arrive * HOUR, leave, lunch, back))
    return day


def with_break(people: list[Person], start: float, end: float) -> list[Person]:
    """``people`` with a break from ``start`` to ``end`` for everyone there then: a variant of
    the day for the fleet-aware culler's cost (docs/autoscaling.md), not the day itself."""
    return [replace(p, breaks=(*p.breaks, (start, end))) for p in people]


def culled(idle_from: float, idle_timeout: float, cull_every: float = CULL_EVERY) -> float:
    """When the culler, checking every ``cull_every`` seconds from the day's start, ends a
    server idle since ``idle_from``."""
    due = idle_from + idle_timeout
    return DAY_START + math.ceil((due - DAY_START) / cull_every) * cull_every


def servers_of(people: list[Person], idle_timeout: float = IDLE_TIMEOUT) -> list[Session]:
    """The servers the day's ``people`` want with the culler at ``idle_timeout``: one from
    arrival, kept through lunch when they are back before the culler ends it, else a new one on
    their return; each ends at the culler's check after its last activity, or at the day's end.
    An ``idle_timeout`` of 0 (no culling) keeps every server to the day's end."""
    sessions = []
    for person in people:
        start = None
        stretches = person.active()
        for n, (begin, stop) in enumerate(stretches):
            start = begin if start is None else start
            end = culled(stop, idle_timeout) if idle_timeout else DAY_END
            after = stretches[n + 1][0] if n + 1 < len(stretches) else math.inf
            if end <= after:  # ended before they come back (or they never do)
                sessions.append(Session(person.who, start, min(end, DAY_END)))
                start = None
    return sorted(sessions, key=lambda s: (s.start, s.who))


def workshop_day(
    people: int = PEOPLE, seed: int = 41, idle_timeout: float = IDLE_TIMEOUT
) -> list[Session]:
    """The servers of the day (module docstring) for ``people``, with the culler at
    ``idle_timeout``."""
    return servers_of(workshop_people(people, seed), idle_timeout)


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
    removed: bool = False  # out of the group and the swarm: the hub no longer sees it
    taken: bool = False  # taken back by the cloud: out of its group, still a node down

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

    def gpu(self) -> GPU:
        """The machine's one GPU as the hub's inventory shows it."""
        return GPU(f"GPU-{self.name}", self.name, self.name, self.slices, len(self.servers))


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
    # the servers the fleet-aware culler stopped (``fleet_idle``): (when, whose)
    stopped_early: list[tuple[float, str]] = field(default_factory=list)
    came_back: int = 0  # participants who came back to a server it had stopped
    came_back_waits: list[float] = field(default_factory=list)  # their new servers' waits

    def p95_wait(self) -> float:
        waits = sorted(self.waits)
        return waits[min(math.ceil(0.95 * len(waits)) - 1, len(waits) - 1)] if waits else 0.0


def fleet_idle_stops(
    now: float,
    boxes: list[Box],
    waiting: int,
    settings: Settings,
    people: dict[str, Person],
    idle_for: float,
) -> list[Box]:
    """The machines whose servers a **fleet-aware culler** stops at ``now``: a variant measured
    in the replay (docs/autoscaling.md), not the hub's culler. It stops idle servers early only
    where that lets a machine of the group be given back: a ready machine whose participants
    (``people``, by name) have all been away for at least ``idle_for`` seconds, while nobody
    waits, the machines that keep servers still hold the fleet's floor, and their free slices
    still cover its margin (``capacity.decide`` drains on those terms). Machines already empty,
    or being given back, count as gone."""
    if waiting:
        return []
    going = ("draining", "ready")  # being given back, or empty (and so soon given back)
    staying = [
        b for b in boxes if b.state in capacity.COUNTED and (b.servers or b.state not in going)
    ]
    stops: list[Box] = []
    for box in staying:
        if box.state != "ready" or not box.servers:
            continue
        away = [people[who].idle_since(now) for who in box.servers]
        if any(since is None or now - since < idle_for for since in away):
            continue
        others = [b for b in staying if b is not box and b not in stops]
        free = sum(b.slices - len(b.servers) for b in others if b.state == "ready")
        if len(others) >= capacity.floor(settings, now) and free >= settings.margin:
            stops.append(box)
    return stops


def replay(
    sessions: list[Session],
    fixed: int = 0,
    settings: Settings | None = None,
    provider: Provider | None = None,
    start_machines: int = 0,
    slices: int = SLICES,
    take_back: tuple[float, str] | None = None,
    dies: tuple[float, str] | None = None,
    policy: str = "spread",
    shared_homes: bool | None = None,
    people: list[Person] | None = None,
    fleet_idle: float = 0.0,
) -> Day:
    """The day ``sessions`` against a fixed fleet of ``fixed`` machines, or (``settings``)
    against the capacity policy starting with ``start_machines`` ready; servers placed by the
    hub's ``placement.choose`` under ``policy``; ``take_back``: (time, machine) the cloud takes
    back (spot), ending its servers, whose participants start again; ``dies``: (time, machine)
    whose node goes down for good (its engine died), ending its servers likewise, while the
    cloud keeps it in the group, and paid for, until the hub removes it.

    ``shared_homes``: None, as the hub: shared with the fleet on (it requires them,
    GPUHUB_HOMES_DIR), else local, a returning participant placed first on their home's machine.

    ``fleet_idle`` (seconds, with ``settings`` and ``people``, the participants whose servers
    ``sessions`` are: ``servers_of(people, ...)``): the fleet-aware culler of
    ``fleet_idle_stops`` at each of the culler's checks; whoever comes back to a server it
    stopped joins the line for a new one, kept until the hub's culler would have ended the
    old."""
    if shared_homes is None:
        shared_homes = settings is not None
    elif settings is not None and not shared_homes:
        raise ValueError(
            "the hub's fleet requires shared homes (GPUHUB_HOMES_DIR): replay it with "
            "shared_homes=True (or None)"
        )
    if fleet_idle and (settings is None or people is None):
        raise ValueError("a fleet-aware culler (fleet_idle) needs the fleet's settings and people")
    by_who = {p.who: p for p in people or []}
    if fleet_idle and not {s.who for s in sessions} <= by_who.keys():
        raise ValueError("every session's participant must be one of people")
    provider = provider or Provider()
    now = DAY_START
    boxes = [
        Box(f"gpu-{i}", "ready", now, 0.0, slices, now) for i in range(fixed or start_machines)
    ]
    pending = list(sessions)
    line: list[tuple[Session, float]] = []  # (session, joined)
    homes: dict[str, str] = {}  # who -> the machine of their last server (their home volume)
    waits: list[float] = []
    ended_by_removal = 0
    restarted = 0
    unserved = 0
    decisions: list[tuple[float, Decision]] = []
    told: list[tuple[float, str]] = []
    blocked_until, blocked_why = 0.0, ""
    never_joins = provider.never_joins
    next_round = next_cull = now
    servers: list[Span] = []
    running: dict[str, int] = {}  # who -> their server's span in ``servers``
    stopped_early: list[tuple[float, str]] = []
    came_back = 0
    came_back_waits: list[float] = []

    def end_servers(box: Box) -> list[tuple[str, float]]:
        """Ends ``box``'s servers now; (who, when the session would have ended) each."""
        ended = list(box.servers.items())
        for who, _ in ended:
            servers[running[who]] = replace(servers[running[who]], end=now)
        box.servers.clear()
        box.last_server = now
        return ended

    def ask(count: int) -> None:
        nonlocal never_joins
        for _ in range(count):
            ready_at = now + provider.boot_s
            if never_joins:
                never_joins -= 1
                ready_at = math.inf
            boxes.append(Box(f"gpu-{len(boxes)}", "asked", now, now, slices, ready_at))

    while now < DAY_END:
        for box in boxes:
            if box.state in capacity.ON_ITS_WAY and now >= box.ready_at:
                box.state, box.since = "ready", now
            # a machine given up is removed by the organizer when the hub stops counting it
            if box.state == capacity.GIVEN_UP and now - box.since > settings.join_within:
                box.state, box.since, box.gone_at, box.removed = "gone", now, now, True
            for who, end in list(box.servers.items()):
                if end <= now:
                    del box.servers[who]
                    box.last_server = now
        for lost in (take_back, dies):
            if lost and lost[0] <= now:
                victim = next(b for b in boxes if b.name == lost[1])
                for who, end in end_servers(victim):
                    line.append((Session(who, now, end), now))
                    restarted += 1
                victim.state, victim.since = "gone", now
                if lost is take_back:  # the cloud ended it: no longer paid for
                    victim.gone_at, victim.taken = now, True
        if take_back and take_back[0] <= now:
            take_back = None
        if dies and dies[0] <= now:
            dies = None
        if fleet_idle and now >= next_cull:
            next_cull = now + CULL_EVERY
            for box in fleet_idle_stops(now, boxes, len(line), settings, by_who, fleet_idle):
                for who, end in end_servers(box):
                    stopped_early.append((now, who))
                    back = by_who[who].back_after(now)
                    if back is not None and back < end:  # back before the culler would end it
                        again = Session(who, back, end, again=True)
                        bisect.insort(pending, again, key=lambda s: s.start)
                        came_back += 1
        while pending and pending[0].start <= now:
            line.append((pending.pop(0), now))
        still = []
        for session, joined in line:
            if session.end <= now:
                unserved += 1
                continue
            usable = {b.name: b for b in boxes if b.state == "ready"}  # paused: no new server
            home = "" if shared_homes else homes.get(session.who, "")
            gpu = placement.choose([b.gpu() for b in usable.values()], 1, policy, session.who, home)
            if gpu is None:
                still.append((session, joined))
                continue
            box = usable[gpu.node_name]
            box.servers[session.who] = session.end
            box.last_server = now
            homes[session.who] = box.name
            waits.append(now - joined)
            running[session.who] = len(servers)
            servers.append(Span(now, session.end, 1))
            if session.again:
                came_back_waits.append(now - joined)
        line = still

        if settings is not None and now >= next_round:
            next_round = now + ROUND_S
            views = [b.view() for b in boxes if not b.removed]
            # as the hub's keeper counts them: each server's start, each join of those waiting
            arrivals = [s.start for s in servers] + [joined for _, joined in line]
            for decision in capacity.decide(
                now, views, [1] * len(line), settings, blocked_until, blocked_why, arrivals
            ):
                decisions.append((now, decision))
                box = next((b for b in boxes if b.name == decision.machine), None)
                if decision.action == capacity.GROW:
                    # the cloud's group: a machine given up or dead is in it until removed
                    counted = sum(not b.removed and not b.taken for b in boxes)
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
                elif decision.action == capacity.GIVE_UP and box.state == "asked":
                    box.state, box.since = capacity.GIVEN_UP, now  # never seen: not named
                elif decision.action in (capacity.REMOVE, capacity.GIVE_UP):
                    ended_by_removal += len(end_servers(box))
                    # one the cloud took back was paid for until then
                    box.state, box.since = "gone", now
                    box.gone_at, box.removed = box.gone_at or now, True
        now += TICK_S

    machines = [Span(b.asked or DAY_START, b.gone_at, b.slices) for b in boxes]
    used = usage(machines, servers, DAY_END, price_per_hour=PRICE)
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
        stopped_early,
        came_back,
        came_back_waits,
    )


def packed_machine_hours(sessions: list[Session], slices: int = SLICES) -> float:
    """The machine-hours of a fleet that, every minute, held the day's servers on the fewest
    machines (servers moved at will, machines ready at once): less than any fleet whose
    servers stay where they started can pay."""
    hours, now = 0.0, DAY_START
    while now < DAY_END:
        held = sum(1 for s in sessions if s.start <= now < s.end)
        hours += math.ceil(held / slices) * MINUTE / HOUR
        now += MINUTE
    return hours


def figures(sessions: list[Session]) -> dict[str, Day]:
    """The day against the fixed fleet (the hub's default placement, ``spread``), the hub's
    fleet under each placement policy, and an instant cloud under ``pack``; shared homes in
    each (the fleet requires them), so that a returning participant is placed like anyone."""
    days = {"fixed": replay(sessions, fixed=FIXED, shared_homes=True)}
    for policy in placement.POLICIES:
        days[policy] = replay(sessions, settings=ORGANIZER, start_machines=1, policy=policy)
    days["instant"] = replay(sessions, settings=INSTANT, provider=Provider(boot_s=0), policy="pack")
    return days


#: A 20-minute afternoon break, for the fleet-aware culler's cost: not part of the day.
AFTERNOON_BREAK = (15 * HOUR, 15 * HOUR + 20 * MINUTE)
#: The fleet-aware culler's idle times tried (``fleet_idle_stops``; docs/autoscaling.md).
FLEET_IDLE = (10 * MINUTE, 15 * MINUTE, 20 * MINUTE, 30 * MINUTE)


def fleet_idle_day(
    idle_timeout: float, fleet_idle: float, policy: str, people: list[Person] | None = None
) -> Day:
    """The hub's fleet (``ORGANIZER``) on the day of ``people`` (the workshop's), the hub's
    culler at ``idle_timeout``, with a fleet-aware culler at ``fleet_idle`` (0: none)."""
    people = people or workshop_people()
    return replay(
        servers_of(people, idle_timeout),
        settings=ORGANIZER,
        start_machines=1,
        policy=policy,
        people=people,
        fleet_idle=fleet_idle,
    )


def _table(sessions: list[Session]) -> str:
    days = figures(sessions)
    fixed = days["fixed"].machine_hours
    rows = []
    for name, day in days.items():
        used = day.usage
        rows.append(
            f"| {name} | {used.machine_hours:.1f} | {used.machine_hours / fixed:.2f} | "
            f"${used.cost:,.0f} | {used.used_share:.0%} | {day.p95_wait():.0f} s | "
            f"{max(day.waits):.0f} s | {day.servers_ended_by_removal} |"
        )
    packed = packed_machine_hours(sessions)
    rows.append(f"| servers moved at will | {packed:.1f} | {packed / fixed:.2f} | | | | | |")
    return "\n".join(rows)


def _fleet_idle_table() -> str:
    fixed = FIXED * (DAY_END - DAY_START) / HOUR
    people = workshop_people()
    with_coffee = with_break(people, *AFTERNOON_BREAK)
    rows, came_back_waits = [], []
    for timeout in (IDLE_TIMEOUT, LUNCH_CULLED):
        for idle in (0.0, *FLEET_IDLE):
            if idle >= timeout:
                continue
            for policy in ("pack", "spread"):
                day = fleet_idle_day(timeout, idle, policy, people)
                coffee = fleet_idle_day(timeout, idle, policy, with_coffee)
                came_back_waits += day.came_back_waits + coffee.came_back_waits
                after = f"{idle / MINUTE:.0f} min" if idle else "none"
                rows.append(
                    f"| {timeout / MINUTE:.0f} min | {after} | `{policy}` | "
                    f"{day.machine_hours:.1f} | {day.machine_hours / fixed:.2f} | "
                    f"{day.p95_wait():.0f} s | {len(day.stopped_early)} | {day.came_back} | "
                    f"{coffee.machine_hours / fixed:.2f} | {len(coffee.stopped_early)} | "
                    f"{coffee.came_back} |"
                )
    longest = max(came_back_waits, default=0.0)
    rows.append(f"the longest wait of anyone who came back to a stopped server: {longest:.0f} s")
    return "\n".join(rows)


if __name__ == "__main__":
    for timeout in (IDLE_TIMEOUT, LUNCH_CULLED):
        print(f"GPUHUB_IDLE_TIMEOUT={timeout:.0f}")
        print(_table(workshop_day(idle_timeout=timeout)))
    fixed = FIXED * (DAY_END - DAY_START) / HOUR
    for timeout in (10 * MINUTE, 5 * MINUTE):
        packed = packed_machine_hours(workshop_day(idle_timeout=timeout))
        print(
            f"servers moved at will, a {timeout / MINUTE:.0f}-minute culler: {packed / fixed:.2f}"
        )
    at_work = [Session(p.who, a, b) for p in workshop_people() for a, b in p.active()]
    at_work_share = packed_machine_hours(at_work) / fixed
    print(f"only the slices of people at work, moved at will: {at_work_share:.2f}")
    at_work_hours = sum(s.end - s.start for s in at_work) / HOUR
    room_hours = PEOPLE * (DAY_END - DAY_START) / HOUR
    print(
        f"people at work: {at_work_hours:.0f} of {room_hours:.0f} slice-hours "
        f"({at_work_hours / room_hours:.0%})"
    )
    print("the hub's fleet with the idle stop (GPUHUB_FLEET_STOP_IDLE_AFTER)")
    print(_fleet_idle_table())
