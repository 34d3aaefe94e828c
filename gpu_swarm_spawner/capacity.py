"""How many GPU machines the hub wants, and which one may go: the decision of one round. Pure,
with the project's other pure modules; the hub's fleet keeper (``fleet.py``) reads the swarm
into ``Machine``s (``observe``) and the line, calls ``decide``, and carries the decisions out
through the provider (``provider.py``) and Swarm.

A machine's life, as the hub counts it (``STATES``):

    asked ──▶ booting ──▶ joining ──▶ ready ──▶ draining ──▶ leaving ──▶ gone
      (the group was grown;   (in the swarm,     (paused: no new    (the provider
       no machine seen yet)    not usable yet)    servers)           removes it)

``asked``, ``booting`` and ``joining`` are *on their way*: they are counted as the slices a new
machine brings, so the hub never asks twice for the same people. A machine taken back by the
cloud (spot) or lost is ``gone`` like one removed; gone machines count for nothing. A machine
asked for that never reached the swarm is ``given up`` after ``join_within`` (rule 1): it brings
nothing, but it is still in the cloud's group, so it counts in the group's size.

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
   cover the people waiting plus ``margin`` (free slices kept ready for the next arrivals, so
   that they need not wait a boot): by as many machines as the missing slices need; or when
   the schedule's floor (``schedule.py``) or ``min_machines`` is above the machines there and
   on their way. Never above ``max_machines``, and never while the provider's back-off lasts
   after the cloud said no (the caller passes ``blocked_until``).
4. Otherwise, with nobody waiting, **drain** one machine: one that has held no server for
   ``empty_for`` seconds, when the others' free slices still cover ``margin`` and the fleet
   stays at or above its floor; one machine at a time (none while another drains or leaves).
5. A draining machine that is still empty is **removed** through the provider.

Never is a machine with a server on it drained to removal or removed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from . import inventory
from .contract import DOCKER_STACK_LABEL, FLEET_GROUP, FLEET_LABEL, KIND_PREFIXES
from .line import about
from .schedule import Schedule, read_schedule
from .tasks import is_live

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
    boot_and_join: float = 300.0  # expected seconds from asking to a ready machine
    join_within: float = 900.0  # a machine not ready this long after it was asked is given up
    schedule: Schedule = field(default_factory=Schedule)

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
    )


@dataclass(frozen=True)
class Decision:
    """One thing to do, and why, in the words the dashboard shows."""

    action: str  # GROW, GIVE_UP, RESUME, DRAIN, REMOVE or NOTHING
    reason: str
    machine: str = ""  # GIVE_UP, RESUME, DRAIN, REMOVE: which one
    target: int = 0  # GROW: the group's new size (machines counted, new ones included)


def floor(settings: Settings, now: float) -> int:
    """The fewest machines to have now: ``min_machines``, or the schedule's number when higher,
    the schedule read one boot-and-join ahead so that machines are ready at the time written;
    never above ``max_machines``."""
    scheduled = settings.schedule.most(now, now + settings.boot_and_join)
    return min(max(settings.min_machines, scheduled), settings.max_machines)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def _slices(n: int) -> str:
    return f"{n} slice{'s' if n != 1 else ''}"


def decide(
    now: float,
    fleet: Sequence[Machine],
    line: Sequence[int],
    settings: Settings,
    blocked_until: float = 0.0,
    blocked_why: str = "",
) -> list[Decision]:
    """This round's decisions, in the order to carry them out (a machine given up is
    removed before the group is grown past it); at least one: ``NOTHING`` with its reason when
    there is nothing to do. ``line``: the slices each waiting participant needs, head first (a
    full GPU as that GPU's slices); ``blocked_until``: the provider's back-off after the cloud
    said no (epoch seconds), ``blocked_why`` what it said."""
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
    # name them to the remove command; the organizer removes them)
    stale = [m for m in fleet if m.state == GIVEN_UP or (m.name in given_up and m.state == "asked")]
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

    grow = _grow(now, group, stale, coming, line, free, settings, blocked_until, blocked_why)
    if grow is not None:
        decisions.append(grow)
    elif not line and not leaving and not draining:
        drain = _drain(now, group, ready, settings)
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
    if not decisions or all(d.action == NOTHING for d in decisions):
        return decisions or [Decision(NOTHING, _steady(now, counted, coming, line, settings))]
    return [d for d in decisions if d.action != NOTHING]


def _grow(
    now: float,
    group: list[Machine],
    stale: list[Machine],
    coming: list[Machine],
    line: Sequence[int],
    free: int,
    settings: Settings,
    blocked_until: float,
    blocked_why: str,
) -> Decision | None:
    """A GROW decision (or a NOTHING saying why not) when the line and the margin, or the
    floor, ask for more machines than are there and on their way; None when nothing is
    missing. ``group``: the group's machines counted; ``stale``: those given up but still in
    the group, which count in its size (the target) and nothing else; ``free``: the free
    slices of every machine, the fixed ones' included."""
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
                f"{_of_them_given_up(stale)})",
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
            f"{who} and the fleet keeps {_slices(settings.margin)} free; {_slices(free)} free "
            f"now and {len(coming)} machine(s) on their way"
        )
    if lowest > len(group) + for_slices:
        written = settings.schedule.describe() if settings.schedule.entries else "none"
        why.append(
            f"the fleet keeps at least {lowest} machines now (minimum {settings.min_machines}, "
            f"schedule: {written})"
        )
    if stale:
        why.append(
            f"{len(stale)} machine(s) given up are still in the group until removed in the "
            "cloud's console"
        )
    if max(lowest, len(group) + for_slices) + len(stale) > settings.max_machines:
        why.append(f"held to the maximum, {settings.max_machines}")
    return Decision(GROW, f"grow the group to {target} machines: {'; '.join(why)}", target=target)


def _of_them_given_up(stale: list[Machine]) -> str:
    return f", {len(stale)} of them given up but still in the group" if stale else ""


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


# ---- what the line is told ------------------------------------------------------------------


def boot_and_join(samples: Sequence[float], default: float) -> float:
    """The expected seconds from asking for a machine to its being ready: the median of the
    last joins seen (``samples``, most recent last; the last 10 count), else ``default``."""
    recent = [s for s in samples[-10:] if s > 0]
    return statistics.median(recent) if recent else default


def arrival(now: float, fleet: Sequence[Machine], expected: float) -> float | None:
    """Seconds until the first machine on its way is likely ready (at least a minute while it
    is not); None when none is on its way."""
    coming = [m for m in fleet if m.state in ON_ITS_WAY and not m.fixed]
    if not coming:
        return None
    soonest = min((m.asked or m.since) + expected for m in coming)
    return max(soonest - now, 60.0)


#: What people in line read beside their place while the grow command runs: the cloud has not
#: said yes yet (Azure's scale command waits until the machines are made).
ASKING_MESSAGE = "The hub is asking the cloud for a GPU machine."


def on_its_way_message(seconds: float | None) -> str:
    """What people in line read beside their place: "A GPU machine is on its way (about 4
    minutes)."; "" when no machine is on its way."""
    if seconds is None:
        return ""
    return f"A GPU machine is on its way ({about(seconds)})."


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


def is_group_machine(node: dict) -> bool:
    """Whether the swarm's ``node`` carries the cloud group's mark (``FLEET_LABEL``, set by
    the join's ``--fleet-group``); a GPU machine without it is fixed."""
    labels = ((node.get("Description") or {}).get("Engine") or {}).get("Labels") or {}
    return labels.get(FLEET_LABEL) == FLEET_GROUP


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
        name = (node.get("Description") or {}).get("Hostname") or node_id[:12]
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
    return on_its_way_message(arrival(now, fleet, expected)) or (ASKING_MESSAGE if asking else "")
