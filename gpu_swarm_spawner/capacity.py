"""How many GPU machines the hub wants, and which one may go: the decision of one round. Pure,
with the project's other pure modules; the hub's fleet keeper (``fleet.py``) reads the swarm
into ``Machine``s (``observe``) and the line, calls ``decide``, and carries the decisions out
through the provider (``provider.py``) and Swarm.

A machine's life, as the hub counts it (``STATES``):

    asked ──▶ booting ──▶ joining ──▶ ready ──▶ draining ──▶ leaving ──▶ gone
      (the group was grown;   (in the swarm,     (paused: no new    (the provider
       no machine seen yet)    not usable yet)    servers)           removes it)

``asked``, ``booting`` and ``joining`` are *on their way*: they are counted as the slices a new
machine brings, so the hub never asks twice for the same people. A machine whose swarm node is
``down`` (its engine died, it hangs, it rebooted and its engine stayed stopped, or the cloud
took it back) is ``gone``: it brings nothing, but a machine of the group is still in the
cloud's group, and paid for, until it is removed, so it counts in the group's size (rule 6).
A machine asked for that never reached the swarm is ``given up`` after ``join_within`` (rule
1): it brings nothing, but it is still in the cloud's group, so it counts in the group's size.

**The group's machines and the fixed ones.** A machine joined by the group's start-up script
carries the engine label ``contract.FLEET_LABEL`` (the join's ``--fleet-group``,
``deploy/cloud_init.py``); ``observe`` reads it into ``Machine.fixed``. Every other GPU machine
is *fixed*, the organizer's (joined by hand with the printed join line): its free slices count
toward the line and the margin, but it is never drained or removed, it is not in the group's
size that the grow command is given, and the minimum, the schedule and the maximum count the
group's machines only (what the organizer asks the cloud to keep).

The rules of ``decide``, in order:

1. A machine on its way for longer than ``Settings.join_within`` is **given up**: it is no
   longer counted as on its way. The provider removes it when the hub can name it (it reached
   the swarm but never became usable); one the swarm never saw has no name the hub knows, and
   the organizer is told to remove it in the cloud's console (the group is never made smaller
   by its size: the cloud would pick which machine goes, perhaps one with servers). Until then
   it is still in the group: the keeper passes it as ``given up``, counted in the group's size
   (a grow's target) and nothing else.
2. A draining machine that has a server again (a spawn slipped in before the pause) is
   **resumed**; while people wait, a draining machine is resumed before any new one is asked
   for (it is there, and paid for).
3. **Grow** when the free slices, those the machines on their way bring included, do not
   cover the people waiting plus the margin (free slices kept ready for the next arrivals, so
   that they need not wait a boot: ``Settings.margin``, or in a rush as many as people came
   over the last boot-and-join, at most one machine's, ``kept_free``): by as many machines as
   the missing slices need; or when the schedule's floor (``schedule.py``) or
   ``min_machines`` is above the machines there and on their way. Never above
   ``max_machines``, and never while the provider's back-off lasts after the cloud said no
   (the caller passes ``blocked_until``). While people wait, a
   machine on its way that is **late** (asked longer ago than ``late_after`` the expected
   boot-and-join) is not counted as bringing slices: when the free slices and the other
   machines on their way do not cover the line and the margin, one more is asked in its
   place. It stays in the group's size, so the maximum holds and the next round, which counts
   the new one on its way, does not ask again; it is still given up after ``join_within``
   (rule 1), and if it joins after all it is one of the group's like any other (the machine
   left empty is given back by rule 4). With nobody waiting it counts as before (the margin
   alone asks nothing in its place).
4. Otherwise, with nobody waiting, **drain** one machine: one that has held no server for
   ``empty_for`` seconds, when the others' free slices still cover the margin and the fleet
   stays at or above its floor; one machine at a time (none while another drains or leaves).
5. A draining machine that is still empty is **removed** through the provider.
6. A machine of the group whose node has been down for longer than ``down_limit`` is
   **removed** through the provider: a machine that stops answering is replaced, not repaired.
   While people wait and the maximum holds the grow back, after ``DOWN_LEAST_S`` already.
   Until then, and until the removal is asked, it counts in the group's size like a machine
   given up (a grow's target counts it, so that the cloud, which still has it, makes a new
   one; the maximum holds), and nothing else. A fixed machine that is down is never removed.

Never is a machine with a server on it drained to removal or removed (a machine down that long
holds none the hub still counts: ``down_limit``).

**The idle stop** (``idle_stop``; ``Settings.stop_idle_after``, GPUHUB_FLEET_STOP_IDLE_AFTER,
0: off) is a decision of its own, over the hub's servers as well as the machines: the servers
of one ready group machine are **stopped** when every one of them has been idle for at least
``stop_idle_after``, nobody waits, and the machines that keep servers hold the floor and cover
the margin with their free slices (rule 4's terms, as if the machine were already empty). The
machine then empties and rule 4 gives it back. One machine a round; never a fixed machine, a
server in use, starting or stopping, nor a machine holding a task the hub does not know.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from . import inventory
from .contract import DOCKER_STACK_LABEL, FLEET_GROUP, FLEET_LABEL, KIND_PREFIXES
from .line import about
from .schedule import Schedule, read_schedule
from .tasks import is_live, swarm_time

#: A machine asked for that never joined, given up: still in the cloud's group (rule 1).
GIVEN_UP = "given up"
STATES = ("asked", "booting", "joining", "ready", "draining", "leaving", "gone", GIVEN_UP)
#: Machines the hub counts as coming: asked for, not usable yet.
ON_ITS_WAY = frozenset({"asked", "booting", "joining"})
#: Machines that the hub still counts (not being removed, not gone, not given up).
COUNTED = ON_ITS_WAY | {"ready", "draining"}

#: What ``decide`` may say; each decision names one.
GROW, GIVE_UP, RESUME, DRAIN, REMOVE, NOTHING = (
    "grow",
    "give up",
    "resume",
    "drain",
    "remove",
    "nothing",
)
#: What ``idle_stop`` may say: stop these servers, so that their machine empties.
STOP_IDLE = "stop idle"


def fleet_settings_of(cfg) -> Settings:
    """``fleet_settings`` of the typed settings (``deploy.settings.Config``'s ``fleet_*``
    attributes and ``slices_per_gpu``; any object that has them): the one place the hub's
    config and the settings' tests build them."""
    return fleet_settings(
        min_machines=cfg.fleet_min_machines,
        max_machines=cfg.fleet_max_machines,
        schedule=cfg.fleet_schedule,
        timezone=cfg.fleet_timezone,
        empty_for=cfg.fleet_empty_for,
        margin=cfg.fleet_margin,
        slices_per_machine=cfg.fleet_slices_per_machine,
        slices_per_gpu=cfg.slices_per_gpu,
        boot_and_join=cfg.fleet_boot_and_join,
        join_within=cfg.fleet_join_within,
        stop_idle_after=cfg.fleet_stop_idle_after,
    )


@dataclass(frozen=True)
class Machine:
    """One GPU machine of the fleet, as the hub sees it this round."""

    name: str  # the swarm's hostname, or the cloud's id while it has none ("asked-3")
    state: str  # one of STATES
    since: float  # epoch seconds it has been in ``state`` since
    asked: float = 0.0  # when the hub asked the cloud for it; 0: not asked by the hub
    servers: int = 0  # participants' servers on it
    free: int = 0  # free GPU slices (ready machines)
    slices: int = 0  # GPU slices in all
    last_server: float | None = None  # when it last held a server; None: never
    fixed: bool = False  # not the cloud group's: never drained nor removed, not in its size

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"unknown machine state {self.state!r}; one of {', '.join(STATES)}")

    def empty_since(self) -> float:
        """Since when it has held no server (it became ready empty, or its last one stopped)."""
        return self.since if self.last_server is None else max(self.last_server, self.since)


@dataclass(frozen=True)
class Settings:
    """The fleet's settings (GPUHUB_FLEET_*: docs/autoscaling.md; ``fleet_settings`` makes
    them from the settings' values)."""

    min_machines: int = 0
    max_machines: int = 4
    slices_per_machine: int = 3  # slices a new machine is expected to bring
    empty_for: float = 900.0  # seconds a machine may hold no server before it is given back
    margin: int = 0  # free slices kept ready: grow below it, give back only above it
    boot_and_join: float = 300.0  # expected seconds from asking to ready (the keeper: learnt)
    join_within: float = 900.0  # a machine not ready this long after it was asked is given up
    schedule: Schedule = field(default_factory=Schedule)
    stop_idle_after: float = 0.0  # seconds every server of a machine was idle: stopped; 0: off

    def __post_init__(self):
        if not 0 <= self.min_machines <= self.max_machines:
            raise ValueError(
                f"the fleet's minimum ({self.min_machines}) must be from 0 to its maximum "
                f"({self.max_machines})"
            )
        if self.slices_per_machine < 1:
            raise ValueError(
                f"a new machine must bring at least 1 slice, not {self.slices_per_machine}"
            )


def fleet_settings(
    *,
    min_machines: int,
    max_machines: int,
    schedule: str,
    timezone: str,
    empty_for: float,
    margin: int,
    slices_per_machine: int,
    slices_per_gpu: int,
    boot_and_join: float,
    join_within: float,
    stop_idle_after: float = 0.0,
) -> Settings:
    """``Settings`` from the GPUHUB_FLEET_* settings' values (the hub's ``cfg.fleet_*``):
    the schedule read in its time zone (a ``ScheduleError`` naming GPUHUB_FLEET_SCHEDULE when
    it cannot be, which the settings' check says before anything is deployed), and
    ``slices_per_machine`` 0 (learnt from the machines seen) standing in as GPUHUB_SLICES_PER_GPU
    until a machine has been seen."""
    return Settings(
        min_machines=min_machines,
        max_machines=max_machines,
        slices_per_machine=slices_per_machine or slices_per_gpu,
        empty_for=float(empty_for),
        margin=margin,
        boot_and_join=float(boot_and_join),
        join_within=float(join_within),
        schedule=read_schedule(schedule, timezone, "GPUHUB_FLEET_SCHEDULE"),
        stop_idle_after=float(stop_idle_after),
    )


@dataclass(frozen=True)
class Decision:
    """One thing to do, and why, in the words the dashboard shows."""

    action: str  # GROW, GIVE_UP, RESUME, DRAIN, REMOVE, STOP_IDLE or NOTHING
    reason: str
    machine: str = ""  # GIVE_UP, RESUME, DRAIN, REMOVE, STOP_IDLE: which one
    target: int = 0  # GROW: the group's new size (machines counted, new ones included)
    servers: tuple[str, ...] = ()  # STOP_IDLE: the servers to stop (``Server.name``)


def floor(settings: Settings, now: float) -> int:
    """The fewest machines to have now: ``min_machines``, or the schedule's number when higher,
    the schedule read one boot-and-join ahead so that machines are ready at the time written;
    never above ``max_machines``."""
    scheduled = settings.schedule.most(now, now + settings.boot_and_join)
    return min(max(settings.min_machines, scheduled), settings.max_machines)


def late_after(expected: float) -> float:
    """Seconds after asking from which a machine not ready yet is late (``decide``'s rule 3): half
    as long again as ``expected``, the expected boot-and-join (the median of the last joins seen,
    ``boot_and_join``, so it follows the cloud of the day). Joins spread around their median (the
    bed's six in make bench-fleet: 36 to 41 s); half as long again is taken to be past that spread,
    late rather than slow (an assumption: the project keeps no record of a real cloud's). Calling a
    slow machine late costs little: one more is asked only while people wait whom nothing else
    covers, it serves them, and if both join, the one left empty is given back by the empty rule. A
    bound cannot be shorter than the boot-and-join itself (every machine slower than the median
    would be late), and each second of it is a second more for those who wait on a machine that
    never comes. On the replayed day (tests/unit/fleet_day.py, a machine that never joins asked for
    just before the 09:00 rush) the p95 wait was 540 s when it was counted until given up; 510 s
    with twice ``expected``, 360 s with half as long again (the median over 20 seeded days: 548, 518
    and 465 s; 450 s with a quarter as long again, too close to the spread of real joins, which the
    replay, booting every machine in exactly its time, does not have). Those were measured with
    the organizer's margin alone; with the margin kept in a rush (``kept_free``), which asks for
    the rush's machines as it comes, 420 s, 360 s and 210 s (285 s with a quarter), and the
    median over the 20 days 300 s whatever the bound: there the rush's margin does the most."""
    return 1.5 * expected


#: The least seconds a node may be down before its machine is given back (``down_limit``).
DOWN_LEAST_S = 60.0


def down_limit(settings: Settings) -> float:
    """Seconds a group machine's node may be down before the machine is removed (``decide``'s
    rule 6): the expected boot-and-join (``settings.boot_and_join``: the median of the last
    joins seen, else GPUHUB_FLEET_BOOT_AND_JOIN, 5 minutes), at least ``DOWN_LEAST_S``. Waiting
    longer for a machine to answer again than a new one takes to be ready is waiting for
    nothing better, and a reboot that brings the engine back takes about a boot. A short
    network blip must not destroy a machine whose servers still run: Swarm calls a node down
    after 10 to 30 s without an answer, and the hub keeps that node's servers as running for
    ``server_lost_after`` (30 s, docs/faults.md) before it reports them stopped and their
    participants start again elsewhere; past ``DOWN_LEAST_S`` both have happened, so a machine
    given back holds nothing the hub still counts. The bound costs twice: the machine's price
    meanwhile, and, when it keeps the group at its maximum, the wait of those in line: the hub
    cannot tell a machine the cloud took back (its place in the group already free) from one
    whose engine died (still in the group), so it counts both until removed; which is why
    ``decide`` gives one back after ``DOWN_LEAST_S`` already while people wait and the maximum
    holds the grow back. On the replayed day (tests/unit/fleet_day.py) with the busiest machine
    lost at 11:00 and the group at its maximum, the p95 wait was 420 s (taken back or dead
    alike); with this bound alone 660 s, with half as long again 810 s, with
    GPUHUB_FLEET_JOIN_WITHIN (15 min) 1260 s; counting the machine for nothing, as the hub did
    before, 300 s for one taken back and for ever for one that died (the cloud saw its size
    met). GPUHUB_FLEET_EMPTY_FOR was not taken: it may be 0."""
    return max(settings.boot_and_join, DOWN_LEAST_S)


def is_late(now: float, machine: Machine, expected: float) -> bool:
    """Whether ``machine``, on its way, was asked for longer ago than ``late_after(expected)``
    (one never asked for by the hub, ``asked`` 0, is never late)."""
    return bool(machine.asked) and now - machine.asked > late_after(expected)


def came_within(now: float, arrivals: Sequence[float], window: float) -> int:
    """How many of ``arrivals`` (epoch seconds) came in the ``window`` seconds up to ``now``."""
    return sum(1 for t in arrivals if now - window < t <= now)


def kept_free(came: int, settings: Settings) -> int:
    """The free slices the fleet keeps for the next arrivals, ``decide``'s margin: as many as
    people ``came`` over the last expected boot-and-join (``came_within`` over
    ``settings.boot_and_join``), at most one machine's slices, and never fewer than the
    organizer's ``margin``. Those still in line count twice, once in the line (now's demand)
    and once here (the forecast of the next boot-and-join's).

    The window is the boot-and-join because that is the demand a machine asked now must
    absorb: those who come before it is ready find only the free slices there and on their way,
    and the last boot-and-join's arrivals are the forecast of the next's. Outside a rush that is
    a person or two, below the organizer's margin, which holds; in a rush it follows the rush
    up and falls back one boot-and-join after it. On the replayed day (tests/unit/fleet_day.py)
    three quarters of it left the p95 wait at 195 s instead of 60 s for the same machine-hours;
    half as long again kept the wait behind a machine that never joins within a boot-and-join
    on all of 20 seeded days (17 of 20 with the boot-and-join itself), for the same median
    machine-hours, but cost 0.015 more of the fixed fleet's on the day itself.

    The cap, one machine's slices, bounds a burst: when a whole room presses Start at once, the
    line itself asks for machines for all of them, and a forecast of as many again for the next
    boot-and-join would ask for as many machines more, to be given back empty. One machine
    ahead of the line is what a steady rush needs (six people in five minutes at the replayed
    day's peak, eight slices a machine). With a 30-minute culler, which ends the servers of
    those at lunch, the returners' rush asked for less with it: 0.899 of the fixed fleet's
    machine-hours instead of 0.912 (the median of 20 days), for a p95 wait of 90 s instead of
    75 s. An organizer's margin above it is kept as set."""
    return max(settings.margin, min(came, settings.slices_per_machine))


def _keeps(came: int, margin: int, settings: Settings) -> str:
    """Why ``margin`` slices are kept free, for a grow's reason."""
    if margin == settings.margin:
        return f"the fleet keeps {_slices(margin)} free"
    window = _took(settings.boot_and_join, settings.boot_and_join)
    people = "1 person" if came == 1 else f"{came} people"
    kept = f"{_slices(margin)} {'is' if margin == 1 else 'are'} kept free"
    most = " (at most one machine's)" if came > margin else ""
    return f"{people} came in the last {window}, so {kept} for the next{most}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _took(seconds: float, boot: float) -> str:
    """A duration beside the boot-and-join ``boot``, in its unit: seconds when it is under two
    minutes ("170 s"), else minutes ("7 min")."""
    return f"{seconds:.0f} s" if boot < 120 else _minutes(seconds)


def _slices(n: int) -> str:
    return f"{n} slice{'s' if n != 1 else ''}"


def decide(
    now: float,
    fleet: Sequence[Machine],
    line: Sequence[int],
    settings: Settings,
    blocked_until: float = 0.0,
    blocked_why: str = "",
    arrivals: Sequence[float] = (),
) -> list[Decision]:
    """This round's decisions, in the order to carry them out (a machine given up is
    removed before the group is grown past it); at least one: ``NOTHING`` with its reason when
    there is nothing to do. ``line``: the slices each waiting participant needs, head first (a
    full GPU as that GPU's slices); ``blocked_until``: the provider's back-off after the cloud
    said no (epoch seconds), ``blocked_why`` what it said; ``arrivals``: when people came
    (epoch seconds: each server's start, each join of the line still waiting), for the margin
    kept in a rush (``kept_free``; older ones are not counted)."""
    decisions: list[Decision] = []
    coming = []
    for m in fleet:
        if m.fixed or m.state not in ON_ITS_WAY:
            continue  # a fixed machine not ready yet is not the cloud's to wait for
        if m.asked and now - m.asked > settings.join_within:
            decisions.append(
                Decision(
                    GIVE_UP,
                    f"{m.name} was asked for {_minutes(now - m.asked)} ago and has not joined "
                    f"(limit {_minutes(settings.join_within)}); it is no longer counted as on "
                    "its way",
                    machine=m.name,
                )
            )
        else:
            coming.append(m)
    given_up = {d.machine for d in decisions}
    # still in the cloud's group though given up: those the swarm never saw (the hub cannot
    # name them to the remove command; the organizer removes them); and the group's machines
    # whose node is down, until their removal is asked (rule 6)
    down = [m for m in fleet if m.state == "gone" and not m.fixed]
    stale = [m for m in fleet if m.state == GIVEN_UP or (m.name in given_up and m.state == "asked")]
    stale += down
    counted = [m for m in fleet if m.state in COUNTED and m.name not in given_up]
    group = [m for m in counted if not m.fixed]
    ready = [m for m in counted if m.state == "ready"]  # the fixed ones' free slices count
    draining = [m for m in group if m.state == "draining"]
    leaving = [m for m in fleet if m.state == "leaving"]

    for m in draining:
        if m.servers:
            decisions.append(
                Decision(
                    RESUME,
                    f"{m.name} got a server while it was being paused; it stays",
                    machine=m.name,
                )
            )
    resumed = {d.machine for d in decisions if d.action == RESUME}
    draining = [m for m in draining if m.name not in resumed]

    wanted = sum(line)
    free = sum(m.free for m in ready) + sum(m.free for m in counted if m.name in resumed)
    if wanted and free < wanted and draining:
        # the soonest and cheapest slices: those of a machine that is there and paid for
        back = max(draining, key=lambda m: (m.free, m.name))
        decisions.append(
            Decision(
                RESUME,
                f"{len(line)} wait for {_slices(wanted)}; {back.name} is resumed instead of "
                "being given back",
                machine=back.name,
            )
        )
        free += back.free
        draining = [m for m in draining if m is not back]

    # while people wait, a late machine is not counted as bringing slices (rule 3); with
    # nobody waiting it still counts for the margin
    late = [m for m in coming if is_late(now, m, settings.boot_and_join)] if line else []
    late_why = [
        f"{m.name} is late: asked {_took(now - m.asked, settings.boot_and_join)} ago, a "
        f"machine usually joins in {_took(settings.boot_and_join, settings.boot_and_join)}"
        for m in late
    ]
    coming = [m for m in coming if m not in late]
    came = came_within(now, arrivals, settings.boot_and_join)
    margin = kept_free(came, settings)
    keeps = _keeps(came, margin, settings)
    kept = replace(settings, margin=margin)
    grow = _grow(
        now, group, stale, coming, late_why, line, free, kept, keeps, blocked_until, blocked_why
    )
    if grow is not None:
        decisions.append(grow)
    elif not line and not leaving and not draining:
        drain = _drain(now, group, ready, kept)
        if drain is not None:
            decisions.append(drain)

    for m in draining:  # those with a server were resumed above
        decisions.append(
            Decision(
                REMOVE,
                f"{m.name} is paused and still holds no server; the provider removes it",
                machine=m.name,
            )
        )
    # while people wait and the maximum holds the grow back, the machine down is what stands
    # between them and a new one: given back as soon as its servers are surely lost
    held = wanted > 0 and len(group) + len(stale) >= settings.max_machines
    limit = DOWN_LEAST_S if held else down_limit(settings)
    for m in down:
        if now - m.since > limit:
            decisions.append(
                Decision(
                    REMOVE,
                    f"{m.name} has been down for {_minutes(now - m.since)} (limit "
                    f"{_minutes(limit)}): given back, a machine that stops answering is "
                    "replaced, not repaired",
                    machine=m.name,
                )
            )
    if not decisions or all(d.action == NOTHING for d in decisions):
        return decisions or [Decision(NOTHING, _steady(now, counted, coming, line, settings))]
    return [d for d in decisions if d.action != NOTHING]


def _grow(
    now: float,
    group: list[Machine],
    stale: list[Machine],
    coming: list[Machine],
    late_why: list[str],
    line: Sequence[int],
    free: int,
    settings: Settings,
    keeps: str,
    blocked_until: float,
    blocked_why: str,
) -> Decision | None:
    """A GROW decision (or a NOTHING saying why not) when the line and the margin, or the
    floor, ask for more machines than are there and on their way; None when nothing is
    missing. ``group``: the group's machines counted; ``stale``: those given up but still in
    the group, which count in its size (the target) and nothing else; ``coming``: the
    machines on their way that bring their slices (the late ones left out, though still in
    ``group``); ``late_why``: each late machine left out, in words; ``free``: the free slices
    of every machine, the fixed ones' included; ``settings``: with this round's margin
    (``kept_free``), ``keeps`` saying why it is that."""
    wanted = sum(line)
    short = wanted + settings.margin - free - settings.slices_per_machine * len(coming)
    for_slices = math.ceil(short / settings.slices_per_machine) if short > 0 else 0
    lowest = floor(settings, now)
    size = len(group) + len(stale)
    target = min(settings.max_machines, max(lowest, len(group) + for_slices) + len(stale))
    if target <= size:
        if for_slices and line:
            return Decision(
                NOTHING,
                f"{len(line)} wait for {_slices(wanted)} with {_slices(free)} free, but the "
                f"fleet is at its maximum ({settings.max_machines} machines"
                f"{_of_them_given_up(stale)}){''.join(f'; {w}' for w in late_why)}",
            )
        return None
    if now < blocked_until:
        return Decision(
            NOTHING,
            f"{target - size} more machine(s) wanted, but the cloud said no"
            f"{f' ({blocked_why})' if blocked_why else ''}; asking again in "
            f"{_minutes(blocked_until - now)}",
        )
    why = []
    if for_slices:
        who = f"{len(line)} wait for {_slices(wanted)}" if line else "nobody waits"
        why.append(
            f"{who} and {keeps}; {_slices(free)} free now and {len(coming)} machine(s) on their way"
        )
    if lowest > len(group) + for_slices:
        written = settings.schedule.describe() if settings.schedule.entries else "none"
        why.append(
            f"the fleet keeps at least {lowest} machines now (minimum {settings.min_machines}, "
            f"schedule: {written})"
        )
    if late_why:
        instead = "one more asked in its place" if len(late_why) == 1 else "one more for each"
        why.append(f"{'; '.join(late_why)}; {instead}")
    given_up = sum(m.state != "gone" for m in stale)
    if given_up:
        why.append(
            f"{given_up} machine(s) given up are still in the group until removed in the "
            "cloud's console"
        )
    if len(stale) > given_up:
        why.append(
            f"{len(stale) - given_up} machine(s) down are still in the group until the hub "
            "gives them back"
        )
    if max(lowest, len(group) + for_slices) + len(stale) > settings.max_machines:
        why.append(f"held to the maximum, {settings.max_machines}")
    return Decision(GROW, f"grow the group to {target} machines: {'; '.join(why)}", target=target)


def _of_them_given_up(stale: list[Machine]) -> str:
    down = sum(m.state == "gone" for m in stale)
    said = [f"{len(stale) - down} of them given up"] if len(stale) > down else []
    said += [f"{down}{'' if said else ' of them'} down"] if down else []
    return f", {' and '.join(said)} but still in the group" if stale else ""


def _drain(
    now: float, group: list[Machine], ready: list[Machine], settings: Settings
) -> Decision | None:
    """A DRAIN decision for the group's machine empty the longest, when one may go (the
    others' free slices, the fixed machines' included, cover the margin)."""
    if len(group) - 1 < floor(settings, now):
        return None
    empty = [
        m
        for m in ready
        if not m.fixed and not m.servers and now - m.empty_since() >= settings.empty_for
    ]
    for m in sorted(empty, key=lambda m: (m.empty_since(), m.name)):
        others = sum(o.free for o in ready if o is not m)
        if others >= settings.margin:
            return Decision(
                DRAIN,
                f"{m.name} has held no server for {_minutes(now - m.empty_since())} and the "
                f"others' {_slices(others)} free cover the margin ({settings.margin}); it is "
                "paused, then removed",
                machine=m.name,
            )
    return None


def _steady(
    now: float,
    counted: list[Machine],
    coming: list[Machine],
    line: Sequence[int],
    settings: Settings,
) -> str:
    if coming:
        return f"{len(coming)} machine(s) on their way; waiting for them to join"
    if line:
        return f"{len(line)} wait; the machines there and on their way cover them"
    fixed = sum(1 for m in counted if m.fixed)
    also = f" and {fixed} fixed" if fixed else ""
    return (
        f"{len(counted) - fixed} machine(s) of the group{also}; none may go yet "
        f"(floor {floor(settings, now)})"
    )


# ---- the idle stop ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    """A participant's server of the hub, as the idle stop sees it."""

    name: str  # whose: "alice", or "alice/big" for a named server
    machine: str  # the machine it runs on (``Machine.name``)
    last_activity: float | None  # epoch seconds (JupyterHub's); None: starting or stopping


def idle_stop(
    now: float,
    fleet: Sequence[Machine],
    servers: Sequence[Server],
    line: Sequence[int],
    settings: Settings,
    going: Collection[str] = (),
) -> Decision | None:
    """A STOP_IDLE decision: the servers of the one ready group machine to stop this round so
    that it empties, and why; None when none may be stopped (``settings.stop_idle_after`` 0:
    never). ``servers``: the hub's servers, each on its machine; ``line``: as ``decide``'s;
    ``going``: machines whose servers were stopped already (counted as given back, never
    chosen again). A machine qualifies when it is ready and of the group, every task on it is
    one of ``servers`` (``Machine.servers`` of them) and each has been idle for at least
    ``stop_idle_after``, nobody waits, and without it the group's machines that keep servers
    (or are on their way) hold the floor and the free slices of the machines that stay (the
    fixed ones' included) cover the margin: the terms on which rule 4 gives a machine back. An
    empty machine counts as given back (rule 4 takes it). Of several, the one idle longest."""
    after = settings.stop_idle_after
    if after <= 0 or line:
        return None
    staying = [
        m
        for m in fleet
        if m.state in COUNTED
        and m.name not in going
        and (m.servers or m.fixed or m.state not in ("ready", "draining"))
    ]
    lowest = floor(settings, now)
    chosen: tuple[float, str] | None = None
    for m in staying:
        if m.fixed or m.state != "ready":
            continue
        on = [s for s in servers if s.machine == m.name]
        if len(on) != m.servers or any(
            s.last_activity is None or now - s.last_activity < after for s in on
        ):
            continue
        others = [o for o in staying if o is not m]
        if sum(not o.fixed for o in others) < lowest:
            continue
        if sum(o.free for o in others if o.state == "ready") < settings.margin:
            continue
        last = max(s.last_activity for s in on)
        if chosen is None or (last, m.name) < chosen:
            chosen = (last, m.name)
    if chosen is None:
        return None
    last, name = chosen
    on = sorted(s.name for s in servers if s.machine == name)
    return Decision(
        STOP_IDLE,
        f"{name}'s {len(on)} server{'s' if len(on) != 1 else ''} idle for "
        f"{(now - last) // 60:.0f}+ min (GPUHUB_FLEET_STOP_IDLE_AFTER: {_minutes(after)}) and "
        "nobody waits; stopped so that the machine can be given back (files kept, kernels "
        f"lost): {', '.join(on)}",
        machine=name,
        servers=tuple(on),
    )


# ---- what the line is told ------------------------------------------------------------------


def boot_and_join(samples: Sequence[float], default: float) -> float:
    """The expected seconds from asking for a machine to its being ready: the median of the
    last joins seen (``samples``, most recent last; the last 10 count), else ``default``."""
    recent = [s for s in samples[-10:] if s > 0]
    return statistics.median(recent) if recent else default


def awaited(fleet: Sequence[Machine]) -> list[Machine]:
    """The machines of ``fleet`` the line waits for: the group's on their way (a fixed machine
    not ready yet is not the cloud's to wait for)."""
    return [m for m in fleet if m.state in ON_ITS_WAY and not m.fixed]


def arrival(now: float, fleet: Sequence[Machine], expected: float) -> float | None:
    """Seconds until the first machine on its way is likely ready (at least a minute while it
    is not); None when none is on its way. A late machine (``is_late``) is counted only while
    no other is on its way: the one asked in its place is the one to wait for."""
    coming = awaited(fleet)
    if not coming:
        return None
    timely = [m for m in coming if not is_late(now, m, expected)] or coming
    soonest = min((m.asked or m.since) + expected for m in timely)
    return max(soonest - now, 60.0)


#: What people in line read beside their place while the grow command runs: the cloud has not
#: said yes yet (Azure's scale command waits until the machines are made).
ASKING_MESSAGE = "The hub is asking the cloud for a GPU machine."


#: What people in line read while every machine on its way is late (``is_late``): no minutes
#: promised that the cloud has already failed to keep.
LATE_MESSAGE = "A GPU machine is on its way, later than the cloud usually takes."


def on_its_way_message(seconds: float | None, late: bool = False) -> str:
    """What people in line read beside their place: "A GPU machine is on its way (about 4
    minutes)."; ``LATE_MESSAGE`` when every machine on its way is ``late``; "" when no machine
    is on its way."""
    if seconds is None:
        return ""
    return LATE_MESSAGE if late else f"A GPU machine is on its way ({about(seconds)})."


def idle_stop_message(stopped_at: float, idle_s: float) -> str:
    """What a participant whose server the idle stop ended reads on their page until their
    next start: when (the hub's clock, as its other messages there), after how long without
    activity (``idle_s``, whole minutes), and why."""
    at = time.strftime("%H:%M", time.localtime(stopped_at))
    minutes = max(int(idle_s // 60), 1)
    return (
        f"Stopped at {at} after {minutes} minute{'s' if minutes != 1 else ''} "
        "without activity, so that its GPU machine could be given back. Your files are kept; "
        "start your server again when you are back."
    )


# ---- the swarm read into machines ------------------------------------------------------------


@dataclass(frozen=True)
class Asked:
    """A machine the hub asked the cloud for that has not joined yet."""

    name: str  # "asked-3": the cloud names it, the swarm shows it only once it joins
    at: float  # when it was asked for (epoch seconds)
    reason: str = ""  # the grow's reason


@dataclass(frozen=True)
class GivenUp:
    """A machine asked for that never joined, given up (``decide``'s rule 1): the hub cannot
    name it, so it stays in the cloud's group until the organizer removes it there; the keeper
    counts it in the group's size for ``Settings.join_within`` after giving it up."""

    name: str  # its asked-for name ("asked-3")
    asked: float  # when it was asked for
    at: float  # when it was given up
    reason: str = ""  # what the organizer is told


@dataclass(frozen=True)
class Memory:
    """What the fleet keeper remembers of a GPU machine of the swarm from round to round (its
    state file keeps it over a hub restart)."""

    node: str  # the swarm's node ID
    state: str  # as last seen: one of STATES
    since: float  # in ``state`` since
    start: float  # paid for since: when the hub asked for it, else when it was first seen
    asked: float = 0.0  # when the hub asked for it; 0: not asked by the hub
    last_server: float | None = None  # when it last held a server
    slices: int = 0
    hub: str = ""  # what the hub did to it: "" , "paused" (draining) or "leaving" (removed)
    hub_at: float = 0.0  # when
    reason: str = ""  # why it is in its state, as the dashboard shows it
    fixed: bool = False  # without the group's mark (``observe``): the organizer's own


@dataclass(frozen=True)
class Seen:
    """The swarm read into the fleet (``observe``)."""

    machines: list[Machine]  # the GPU machines and the asked-for ones, as ``decide`` takes them
    memory: dict[str, Memory]  # by name: what to remember of each machine in the swarm
    asked: list[Asked]  # those still not joined
    joined: list[tuple[str, float]]  # (name, seconds from asking to joining) joined this round
    left: list[tuple[str, Memory]]  # machines no longer in the swarm, as last remembered
    used: int  # GPU slices the servers of the group's machines hold
    given_up: list[GivenUp] = field(default_factory=list)  # those still not joined


def is_server(task: dict) -> bool:
    """A live task that is not a service of a stack (``docker stack deploy`` labels its
    containers): a participant's server, or something else nobody may end by giving its
    machine back."""
    labels = ((task.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels") or {}
    return is_live(task) and DOCKER_STACK_LABEL not in labels


def servers_on(tasks: Sequence[dict], node_id: str) -> int:
    """The servers (``is_server``) on the node ``node_id``."""
    return sum(1 for t in tasks if t.get("NodeID") == node_id and is_server(t))


def arrivals(
    tasks: Sequence[dict], joined: Sequence[float], kind_prefix=KIND_PREFIXES
) -> list[float]:
    """When people came, as the swarm and the line show it (epoch seconds), for ``decide``'s
    margin in a rush: each live server holding GPU slices, by its task's ``CreatedAt``, and
    each participant still in line, by when they joined it (``joined``). One who waited is
    counted at their join while they wait, then at their server's start (no longer in line)."""
    came = list(joined)
    for t in tasks:
        created = swarm_time(t.get("CreatedAt"))
        if created is not None and is_server(t) and inventory.task_reservations(t, kind_prefix):
            came.append(created)
    return came


def is_group_machine(node: dict) -> bool:
    """Whether the swarm's ``node`` carries the cloud group's mark (``FLEET_LABEL``, set by
    the join's ``--fleet-group``); a GPU machine without it is fixed."""
    labels = ((node.get("Description") or {}).get("Engine") or {}).get("Labels") or {}
    return labels.get(FLEET_LABEL) == FLEET_GROUP


def machine_name(node: dict) -> str:
    """The name the fleet knows a swarm node by: its hostname, else its ID's first 12 digits."""
    return (node.get("Description") or {}).get("Hostname") or str(node.get("ID", ""))[:12]


def observe(
    now: float,
    nodes: Sequence[dict],
    tasks: Sequence[dict],
    memory: dict[str, Memory],
    asked: Sequence[Asked],
    leave_within: float = 900.0,
    kind_prefix=KIND_PREFIXES,
    given_up: Sequence[GivenUp] = (),
) -> Seen:
    """The fleet this round: every GPU machine of the swarm (``nodes`` and ``tasks`` as the
    Engine API gives them) with what the hub remembers of it, the machines asked for that have
    not joined, and those given up (``given_up``) that still have not. A machine with the
    group's mark (``is_group_machine``) new to the hub takes the place of the oldest one asked
    for (it joined after being asked for), else of the oldest one given up (it joined late);
    a machine without it is fixed (``Machine.fixed``). A machine paused by someone else than
    the hub is the organizer's, left out; one the hub asked the provider to remove
    (``leaving``) that is still up after ``leave_within`` seconds is paused again, so that the
    removal is asked again."""
    usage = inventory.task_usage(list(tasks), kind_prefix)
    waiting = sorted(asked, key=lambda a: (a.at, a.name))
    late = sorted(given_up, key=lambda g: (g.at, g.name))
    machines, remembered, joined, used = [], {}, [], 0
    for node in nodes:
        kinds = inventory.gpu_kinds(node, kind_prefix)
        if not kinds:
            continue
        node_id = str(node.get("ID", ""))
        name = machine_name(node)
        status = (node.get("Status") or {}).get("State", "")
        availability = (node.get("Spec") or {}).get("Availability", "")
        fixed = not is_group_machine(node)
        old = memory.get(name)
        if old is None:
            if fixed:
                why = "fixed: joined without the group's mark; its slices count, never given back"
                old = Memory(node_id, "joining", now, now, reason=why)
            elif waiting:
                first = waiting.pop(0)
                joined.append((name, now - first.at))
                old = Memory(node_id, "joining", now, first.at, first.at, reason=first.reason)
            elif late:
                first = late.pop(0)
                why = f"joined {_minutes(now - first.at)} after it was given up"
                old = Memory(node_id, "joining", now, first.asked, first.asked, reason=why)
            else:
                old = Memory(node_id, "joining", now, now, reason="joined without being asked")
        hub, hub_at = old.hub, old.hub_at
        if hub == "leaving" and status == "ready" and now - hub_at > leave_within:
            hub, hub_at = "paused", now  # the removal did not happen: asked again
        if hub == "paused" and availability == "active":
            hub = ""  # resumed by someone else
        if hub == "leaving":
            state = "leaving"
        elif status == "down":
            state = "gone"
        elif status != "ready":
            state = "joining"
        elif hub == "paused":
            state = "draining"
        elif availability == "active":
            state = "ready"
        else:  # paused or drained by the organizer: theirs, neither counted nor given back
            if name in memory:  # remembered as it was (paid for all along)
                remembered[name] = replace(old, reason="paused by an organizer: not counted")
            continue
        servers = servers_on(tasks, node_id)
        held = sum(min(usage.used.get(u, 0), n) for u, n in kinds.items())
        used += 0 if fixed else held
        last_server = now if servers else old.last_server
        since = old.since if state == old.state else now
        # a paused machine's free slices are those it brings back when resumed
        free = sum(kinds.values()) - held if state in ("ready", "draining") else 0
        remembered[name] = replace(
            old,
            node=node_id,
            state=state,
            since=since,
            last_server=last_server,
            slices=sum(kinds.values()),
            hub=hub,
            hub_at=hub_at,
            fixed=fixed,
        )
        machines.append(
            Machine(
                name,
                state,
                since,
                asked=old.asked,
                servers=servers,
                free=max(free, 0),
                slices=sum(kinds.values()),
                last_server=last_server,
                fixed=fixed,
            )
        )
    machines += [Machine(a.name, "asked", a.at, asked=a.at) for a in waiting]
    machines += [Machine(g.name, GIVEN_UP, g.at, asked=g.asked) for g in late]
    left = [(name, m) for name, m in memory.items() if name not in remembered]
    return Seen(machines, remembered, waiting, joined, left, used, late)


def learnt_slices(memory: dict[str, Memory], default: int) -> int:
    """The slices a new machine is expected to bring: those most of the group's machines seen
    have (the larger on a tie; a fixed machine may be of another kind), else ``default``."""
    counts: dict[int, int] = {}
    for m in memory.values():
        if m.slices > 0 and not m.fixed:
            counts[m.slices] = counts.get(m.slices, 0) + 1
    if not counts:
        return default
    return max(counts, key=lambda n: (counts[n], n))


def for_the_line(
    now: float,
    fleet: Sequence[Machine],
    expected: float,
    refused: str = "",
    asking: bool = False,
) -> str:
    """What people in line read beside their place about the fleet: ``refused`` (what the
    cloud's refusal means for them, ``provider.FOR_THE_LINE``) while the cloud says no, else
    when the first machine on its way (``fleet``: those the cloud said yes to) is likely
    ready, else ``ASKING_MESSAGE`` while the grow command runs (``asking``), else nothing."""
    if refused:
        return refused
    coming = awaited(fleet)
    late = all(is_late(now, m, expected) for m in coming)
    said = on_its_way_message(arrival(now, coming, expected), late)
    return said or (ASKING_MESSAGE if asking else "")
