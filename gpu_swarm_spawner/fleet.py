"""The hub's fleet keeper: GPU machines that follow the day (docs/autoscaling.md).

With ``GPUHUB_FLEET=on`` the hub runs a round every ``EVERY_S`` seconds (``periodic.keep``),
and at once when someone joins the waiting line (``broker.line_joined``; at most one round a
``SOONEST_S``):

1. it reads the swarm's nodes and tasks (the broker's shared read, when a spawner made the
   broker) and the waiting line (``broker.waiting()``); the servers' starts and the line's
   joins are when people came (``capacity.arrivals``), which the margin follows in a rush;
2. ``capacity.observe`` makes them the fleet: every GPU machine of the swarm with what the hub
   remembers of it (those of the cloud's group by the mark their start-up script's join puts
   on them; the others are fixed, the organizer's: their slices count, nothing else), the
   machines asked for that have not joined yet, and those given up that are still in the
   cloud's group;
3. ``capacity.decide`` says what to do, and the keeper does it: **grow** asks the provider to
   make the group larger, in the background (never two provider calls at once; the round does
   not wait for one); **drain** pauses a machine (the node's availability, through the
   Engine API); **resume** makes it active again; **remove** reads the machine's tasks once
   more right before, and with no server on it asks the provider to remove it (in the
   background), then removes the swarm's node once it is down; **give up** stops waiting for a
   machine that never joined (one in the swarm is removed like any other; one the swarm never
   saw stays counted in the group's size for ``join_within`` more, or until it joins late,
   while the organizer is told to remove it in the cloud's console);
4. with ``GPUHUB_FLEET_STOP_IDLE_AFTER`` set (``Settings.stop_idle_after``), the **idle
   stop**: the hub's servers (JupyterHub's, through ``internals.running_servers``, each with
   its last activity as the idle culler reads it, or the time its task began running when that
   is later) are placed on their machines by the swarm's tasks, ``capacity.idle_stop`` names
   at most one machine whose servers are all idle, and each is stopped as JupyterHub's REST
   API stops it (``internals.stop_idle_server``, which
   checks again that it is still idle), its participant told why on their page until their
   next start (``capacity.idle_stop_message``); the machine, emptied, is given back by rule 4 later.
   The stop is a decision like the others (the dashboard and ``make status``) and an event
   (``events.FLEET_STOP_IDLE``);
5. while a machine is overdue, the provider's ``why`` command is asked (at most every
   ``WHY_EVERY_S``) what the cloud said, since AWS and Google Cloud accept a grow and fail
   to launch later;
6. it writes its state (``STATE_FILE`` in the hub's data folder: what it asked for and when,
   each machine's history, the provider's last outcome and back-off), the dashboard's snapshot
   (``SNAPSHOT_FILE`` in the dashboard folder), events for the dashboard (``events.FLEET_*``),
   and what the line reads beside their place (``broker.fleet_note``): while the grow command
   runs, that the hub is asking the cloud; once the cloud said yes, when the machine is
   likely ready; after a refusal, what it means for them (``capacity.for_the_line``).

A provider call that ends writes its outcome at once: a refusal is in the snapshot, in the
events and in the line's words before the next round. A hub restart reads the state back:
machines asked for stay on their way (never asked twice), machines keep their history, a
back-off goes on. Every file is written whole (a new file renamed over the old one).

``snapshot``, ``read_state`` and ``state_text`` are pure; ``FleetKeeper`` does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

from . import broker, capacity, cost, events, fleet_view, internals, periodic, provider
from .capacity import Asked, Decision, GivenUp, Machine, Memory
from .contract import KIND_PREFIXES
from .internals import HubServer
from .inventory import gpu_kinds
from .tasks import running_since

#: Seconds between rounds.
EVERY_S = 10.0
#: The fewest seconds from one round's start to the next one's, however many join the line.
SOONEST_S = 1.0
#: The keeper's state, in the hub's data folder; the dashboard's snapshot, in its folder.
STATE_FILE = "fleet-state.json"
SNAPSHOT_FILE = fleet_view.FLEET_FILE
#: The decisions the snapshot keeps (newest last), the ended machines the state keeps, the
#: joins (seconds from asking to joining) the expected boot-and-join is the median of.
DECISIONS_KEPT = 50
HISTORY_KEPT = 1000
JOINS_KEPT = 10
#: Seconds between the provider's ``why`` calls while a machine is overdue.
WHY_EVERY_S = 30.0
#: Rounds further apart than this (the hub was down) count this long for the slice-hours.
GAP_S = 3 * EVERY_S


# ---- the state --------------------------------------------------------------------------------


@dataclass
class State:
    """What the keeper keeps over a hub restart (``STATE_FILE``)."""

    asked: list[Asked] = field(default_factory=list)  # asked for, not joined yet
    asked_count: int = 0  # asked entries made so far (their names: asked-1, asked-2, ...)
    given_up: list[GivenUp] = field(default_factory=list)  # never joined, still in the group
    memory: dict[str, Memory] = field(default_factory=dict)  # the swarm's GPU machines
    # ended machines: name, start, end, slices (and fixed: true for a fixed one)
    history: list[dict] = field(default_factory=list)
    joins: list[float] = field(default_factory=list)  # seconds from asking to joining, last ones
    last: dict | None = None  # the provider's last outcome, as the snapshot shows it
    failures: int = 0  # the provider's failures in a row
    blocked_until: float = 0.0  # no call of ``blocked_action`` before (the back-off)
    blocked_action: str = ""  # "grow" (a grow or the why command failed) or "remove"
    blocked_why: str = ""  # the failure's kind
    line_note: str = ""  # what the line reads while blocked (provider.FOR_THE_LINE)
    call: dict | None = None  # the provider call in flight: action, at, target, machine, asked
    last_why: float = 0.0  # when the why command was last asked
    used_slice_seconds: float = 0.0  # slices servers held, times seconds, over the rounds
    last_round: float = 0.0
    decisions: list[dict] = field(default_factory=list)  # carried out: at, action, ..., reason


def _number(value, default: float = 0.0) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else default


def _asked(entry) -> Asked | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    return Asked(entry["name"], _number(entry.get("at")), str(entry.get("reason", "")))


def _given_up(entry) -> GivenUp | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        return None
    return GivenUp(
        entry["name"],
        _number(entry.get("asked")),
        _number(entry.get("at")),
        str(entry.get("reason", "")),
    )


def _memory(entry) -> Memory | None:
    if not isinstance(entry, dict) or entry.get("state") not in capacity.STATES:
        return None
    last = entry.get("last_server")
    return Memory(
        node=str(entry.get("node", "")),
        state=entry["state"],
        since=_number(entry.get("since")),
        start=_number(entry.get("start")),
        asked=_number(entry.get("asked")),
        last_server=None if last is None else _number(last),
        slices=int(_number(entry.get("slices"))),
        hub=entry.get("hub") if entry.get("hub") in ("", "paused", "leaving") else "",
        hub_at=_number(entry.get("hub_at")),
        reason=str(entry.get("reason", "")),
        fixed=entry.get("fixed") is True,
    )


def read_state(text: str) -> State:
    """``STATE_FILE`` read; entries it cannot use are left out, and a file that is no state at
    all reads as a fresh one (raises ValueError then, for the caller to say so)."""
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError("the fleet's state is not a JSON object")

    def listed(key):
        value = record.get(key)
        return value if isinstance(value, list) else []

    memory = record.get("memory") if isinstance(record.get("memory"), dict) else {}
    return State(
        asked=[a for a in map(_asked, listed("asked")) if a is not None],
        asked_count=int(_number(record.get("asked_count"))),
        given_up=[g for g in map(_given_up, listed("given_up")) if g is not None],
        memory={k: m for k, m in ((k, _memory(v)) for k, v in memory.items()) if m is not None},
        history=[h for h in listed("history") if isinstance(h, dict)],
        joins=[_number(s) for s in listed("joins") if _number(s) > 0],
        last=record.get("last") if isinstance(record.get("last"), dict) else None,
        failures=int(_number(record.get("failures"))),
        blocked_until=_number(record.get("blocked_until")),
        blocked_action=str(record.get("blocked_action", "")),
        blocked_why=str(record.get("blocked_why", "")),
        line_note=str(record.get("line_note", "")),
        call=record.get("call") if isinstance(record.get("call"), dict) else None,
        last_why=_number(record.get("last_why")),
        used_slice_seconds=_number(record.get("used_slice_seconds")),
        last_round=_number(record.get("last_round")),
        decisions=[d for d in listed("decisions") if isinstance(d, dict)],
    )


def state_text(state: State) -> str:
    return json.dumps(asdict(state), ensure_ascii=False, indent=1)


def group_size(state: State) -> int:
    """The cloud's group as the hub counts it, what a grow's ``{count}`` starts from: the
    group's machines counted (``capacity.COUNTED``) or down (in the group, and paid for, until
    removed: ``capacity.decide``'s rule 6), those asked for, and those given up."""
    there = sum(
        not m.fixed and (m.state in capacity.COUNTED or m.state == "gone")
        for m in state.memory.values()
    )
    return there + len(state.asked) + len(state.given_up)


def down_again(state: State, name: str, since: float) -> None:
    """Machine ``name``, down since ``since``, whose removal did not end (the cloud said no,
    or the hub stopped during the call): down again as it was, for ``capacity.decide``'s rule
    6 to give back once more."""
    state.memory[name] = replace(state.memory[name], state="gone", since=since, hub="")


# ---- the snapshot -----------------------------------------------------------------------------


def snapshot(
    now: float,
    state: State,
    seen: Sequence[Machine],
    settings: capacity.Settings,
    expected: float,
    busy: bool,
    price_per_hour: float,
) -> dict:
    """The dashboard's ``SNAPSHOT_FILE``: the fleet's machines now (``seen``: this round's,
    for their servers and free slices), what is coming, the provider, the cost, the last
    decisions."""
    live = {m.name: m for m in seen}
    machines = []
    for name, m in sorted(state.memory.items()):
        now_seen = live.get(name)
        machines.append(
            {
                "name": name,
                "state": m.state,
                "since": m.since,
                "servers": now_seen.servers if now_seen else 0,
                "free": now_seen.free if m.state == "ready" and now_seen else 0,
                "slices": m.slices,
                "reason": m.reason,
                "fixed": m.fixed,
            }
        )
    unseen = [(a.name, "asked", a.at, a.reason) for a in state.asked]
    unseen += [(g.name, capacity.GIVEN_UP, g.at, g.reason) for g in state.given_up]
    for name, st, since, reason in unseen:
        machines.append(
            {
                "name": name,
                "state": st,
                "since": since,
                "servers": 0,
                "free": 0,
                "slices": 0,
                "reason": reason,
                "fixed": False,
            }
        )
    group = [m for m in state.memory.values() if not m.fixed]
    on_the_way = [
        Machine(m.node, m.state, m.since, asked=m.asked)
        for m in group
        if m.state in capacity.ON_ITS_WAY
    ]
    on_the_way += [Machine(a.name, "asked", a.at, asked=a.at) for a in state.asked]
    ready_in = capacity.arrival(now, on_the_way, expected)
    # the cost is the group's: the fixed machines are the organizer's own
    spans = [
        cost.Span(_number(h.get("start")), _number(h.get("end")), int(_number(h.get("slices"))))
        for h in state.history
        if h.get("fixed") is not True
    ]
    # a group machine down is paid for until the hub removes it (then it is history)
    spans += [cost.Span(m.start, None, m.slices) for m in group]
    spans += [cost.Span(a.at) for a in state.asked]
    spans += [cost.Span(g.asked) for g in state.given_up]  # paid for while in the group
    used = cost.usage(spans, [], now, price_per_hour)
    used = replace(used, slice_hours_used=state.used_slice_seconds / 3600)
    priced = price_per_hour > 0
    return {
        "at": now,
        "fleet": "on",
        "min": settings.min_machines,
        "max": settings.max_machines,
        "floor": capacity.floor(settings, now),
        "group": group_size(state),
        "machines": machines,
        "coming": {"machines": len(on_the_way), "ready_in": ready_in} if on_the_way else None,
        "provider": {
            "busy": busy,
            "last": state.last,
            "blocked_until": state.blocked_until if state.blocked_until > now else None,
        },
        "cost": {
            "machine_hours": round(used.machine_hours, 3),
            "slice_hours_offered": round(used.slice_hours_offered, 3),
            "slice_hours_used": round(used.slice_hours_used, 3),
            "price_per_hour": price_per_hour if priced else None,
            "estimated": round(used.cost, 2) if priced else None,
        },
        "decisions": state.decisions[-DECISIONS_KEPT:],
    }


# ---- the keeper -------------------------------------------------------------------------------


class FleetKeeper:
    """The fleet's rounds, for one hub. ``settings``: the fleet's (``slices_per_machine`` the
    value before any machine is seen when ``learn_slices``); ``provider``: the organizer's
    commands (``provider.Provider``); ``data_dir``: where ``STATE_FILE`` is kept;
    ``dashboard_dir``: the dashboard's folder (the snapshot and the events); ``client``: a
    ``docker.APIClient`` (made from the environment when None); ``broker_of``: the hub's
    broker, None before a spawner made it; ``line_joined``: the hub's event set when someone
    joins the line, which starts a round at once (``keep``); ``hub_servers`` and
    ``stop_server``: JupyterHub's servers and their stop (``internals.running_servers``,
    ``internals.stop_idle_server``), for the idle stop (``Settings.stop_idle_after``; none
    without them)."""

    def __init__(
        self,
        settings: capacity.Settings,
        provider_: provider.Provider,
        data_dir: str | os.PathLike,
        dashboard_dir: str | os.PathLike,
        *,
        log,
        learn_slices: bool = True,
        price_per_hour: float = 0.0,
        client=None,
        broker_of: Callable[[], broker.GPUBroker | None] = broker.of_hub_if_made,
        line_joined: Callable[[], asyncio.Event] = broker.line_joined,
        clock: Callable[[], float] = time.time,
        every: float = EVERY_S,
        soonest: float = SOONEST_S,
        kind_prefix=KIND_PREFIXES,
        hub_servers: Callable[[], list[HubServer]] | None = None,
        stop_server: Callable[[HubServer, float, str], Awaitable[bool]] | None = None,
    ):
        self.settings = settings
        self.provider = provider_
        self.state_path = Path(data_dir) / STATE_FILE
        self.dashboard_dir = Path(dashboard_dir)
        self.log = log
        self.learn_slices = learn_slices
        self.price_per_hour = price_per_hour
        self.client = client
        self.broker_of = broker_of
        self.line_joined = line_joined
        self.clock = clock
        self.every = every
        self.soonest = soonest
        self.kind_prefix = kind_prefix
        self.hub_servers = hub_servers
        self.stop_server = stop_server
        self.call_task: asyncio.Task | None = None
        self.seen: list[Machine] = []
        self.emptied: dict[str, float] = {}  # machines whose idle servers it stopped: when
        self.state = self._load()

    # ---- the state file ----

    def _load(self) -> State:
        try:
            text = self.state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return State()
        try:
            state = read_state(text)
        except ValueError as e:
            aside = self.state_path.with_name(STATE_FILE + ".unreadable")
            with contextlib.suppress(OSError):
                self.state_path.replace(aside)
            self.log.warning(
                "The fleet's state %s cannot be read (%s); kept as %s, and the fleet starts "
                "afresh: machines asked for before are counted once they join",
                self.state_path,
                e,
                aside,
            )
            return State()
        if state.call is not None:
            # the hub stopped during a provider call: a grow's machines stay on their way (never
            # asked twice), a machine being removed is asked again if it is still there later
            # (one down is down again: its node's being down says nothing of the removal)
            self.log.info("The fleet's provider call %s ended with the hub", state.call)
            name = str(state.call.get("machine", ""))
            down = state.memory.get(name)
            if "down_since" in state.call and down is not None and down.hub == "leaving":
                down_again(state, name, _number(state.call["down_since"]))
            state.call = None
        return state

    def save(self) -> None:
        events.write_whole(self.state_path, state_text(self.state))

    # ---- the engine ----

    async def engine(self, method: str, *args, **kwargs):
        """A call of the Docker Engine API (``docker.APIClient``), in a thread."""

        def call():
            if self.client is None:
                import docker

                self.client = docker.APIClient(**docker.utils.kwargs_from_env())
            return getattr(self.client, method)(*args, **kwargs)

        return await asyncio.to_thread(call)

    async def _read(self) -> tuple[list[dict], list[dict]]:
        return await self.engine("nodes"), await self.engine("tasks")

    async def read_swarm(self) -> tuple[list[dict], list[dict]]:
        """Nodes and tasks, through the broker's shared read when there is a broker."""
        hub_broker = self.broker_of()
        if hub_broker is not None:
            return await hub_broker.read_swarm(self._read)
        return await self._read()

    async def set_availability(self, node_id: str, availability: str) -> None:
        """The node's availability (``active``, ``pause``), its spec otherwise unchanged."""
        node = await self.engine("inspect_node", node_id)
        spec = dict(node.get("Spec") or {}, Availability=availability)
        await self.engine("update_node", node_id, node["Version"]["Index"], spec)

    # ---- the round ----

    @property
    def busy(self) -> bool:
        """A provider call is in flight."""
        return self.call_task is not None and not self.call_task.done()

    def blocked(self, action: str, now: float) -> bool:
        return self.state.blocked_action == action and now < self.state.blocked_until

    def expected(self) -> float:
        """Seconds from asking to a ready machine: the last joins', else the setting's."""
        return capacity.boot_and_join(self.state.joins, self.settings.boot_and_join)

    def learnt(self) -> capacity.Settings:
        """The settings as the joins and machines seen taught them: the expected boot-and-join
        (the schedule is read that far ahead; a machine on its way is late after
        ``capacity.late_after`` it) and, with ``learn_slices``, the slices a new machine brings."""
        settings = replace(self.settings, boot_and_join=self.expected())
        if self.learn_slices:
            learnt = capacity.learnt_slices(self.state.memory, settings.slices_per_machine)
            settings = replace(settings, slices_per_machine=learnt)
        return settings

    async def round(self) -> list[Decision]:
        """One round: read, decide, carry out, write. Returns the decisions."""
        nodes, tasks = await self.read_swarm()
        now = self.clock()
        hub_broker = self.broker_of()
        waiting = hub_broker.waiting() if hub_broker is not None else []
        state = self.state
        self._forget_given_up(now)
        seen = capacity.observe(
            now,
            nodes,
            tasks,
            state.memory,
            state.asked,
            self.settings.join_within,
            self.kind_prefix,
            state.given_up,
        )
        if state.last_round:
            state.used_slice_seconds += seen.used * min(max(now - state.last_round, 0), GAP_S)
        state.last_round = now
        state.memory, state.asked, state.given_up = seen.memory, seen.asked, seen.given_up
        for name, m in seen.left:
            end = m.since if m.state == "gone" else now
            self._ended(name, m.start, end, m.slices, m.fixed)
        for name, seconds in seen.joined:
            state.joins = (state.joins + [seconds])[-JOINS_KEPT:]
            self.log.info("GPU machine %s joined %.0f s after it was asked for", name, seconds)
        await self._forget_removed(now, nodes)
        settings = self.learnt()
        per_gpu = max(
            (n for node in nodes for n in gpu_kinds(node, self.kind_prefix).values()),
            default=settings.slices_per_machine,
        )
        # what each participant in line needs: a full GPU counts as that GPU's slices
        line = [(e.request.slices if e.request else None) or per_gpu for e in waiting]
        grow_blocked = state.blocked_until if state.blocked_action == "grow" else 0.0
        # when people came, for the margin kept in a rush: the line's joins on the broker's clock
        ago = time.monotonic()
        joined = [now - (ago - e.joined) for e in waiting]
        came = capacity.arrivals(tasks, joined, self.kind_prefix)
        decisions = capacity.decide(
            now, seen.machines, line, settings, grow_blocked, state.blocked_why, came
        )
        for decision in decisions:
            try:
                await self._carry_out(decision, now, seen)
            except Exception:
                self.log.exception("The fleet could not %s", decision.action)
        try:
            stop = await self._stop_idle(now, seen.machines, nodes, tasks, line, settings)
        except Exception:
            self.log.exception("The fleet could not stop idle servers")
            stop = None
        if stop is not None:
            decisions = [d for d in decisions if d.action != capacity.NOTHING] + [stop]
        self._ask_why(now)
        self.seen = seen.machines
        self.publish(now)
        return decisions

    async def _stop_idle(
        self,
        now: float,
        machines: list[Machine],
        nodes: list[dict],
        tasks: list[dict],
        line: list[int],
        settings: capacity.Settings,
    ) -> Decision | None:
        """The idle stop (``capacity.idle_stop``) of this round, carried out: the decision with
        the servers stopped, or None."""
        if settings.stop_idle_after <= 0 or self.hub_servers is None or self.stop_server is None:
            return None
        # a machine emptied stays counted as given back until it holds no server (the tasks
        # of the services just removed may still show), at most until it could have been
        live = {m.name: m for m in machines}
        self.emptied = {
            name: at
            for name, at in self.emptied.items()
            if name in live
            and live[name].servers
            and live[name].state == "ready"
            and now - at <= max(settings.empty_for, 3 * self.every)
        }
        names = {n.get("ID"): capacity.machine_name(n) for n in nodes}
        where = {  # each server's service: its machine, and since when its task runs
            t.get("ServiceID"): (
                names.get(t.get("NodeID")) or str(t.get("NodeID", ""))[:12],
                running_since(t),
            )
            for t in tasks
            if capacity.is_server(t)
        }
        by_name, idle_from, servers = {}, {}, []
        for s in self.hub_servers():
            if s.service_id not in where:
                continue
            machine, since = where[s.service_id]
            # JupyterHub writes a start's activity when the start begins, a wait in line
            # before it: a server is not idle before it runs
            seen = s.last_activity
            if seen is not None and since is not None:
                seen = max(seen, since)
            name = f"{s.user}/{s.server}" if s.server else s.user
            by_name[name], idle_from[name] = s, seen
            servers.append(capacity.Server(name, machine, seen))
        decision = capacity.idle_stop(now, machines, servers, line, settings, self.emptied)
        if decision is None:
            return None
        idle_since = now - settings.stop_idle_after
        # each participant reads why on their page (capacity.idle_stop_message)
        done = await asyncio.gather(
            *(
                self.stop_server(
                    by_name[n], idle_since, capacity.idle_stop_message(now, now - idle_from[n])
                )
                for n in decision.servers
            ),
            return_exceptions=True,
        )
        stopped = []
        for name, outcome in zip(decision.servers, done):
            if isinstance(outcome, BaseException):
                self.log.error("The fleet could not stop %s's idle server: %s", name, outcome)
            elif outcome:
                stopped.append(name)
        if not stopped:
            return None
        reason = decision.reason
        if len(stopped) < len(decision.servers):
            kept = sorted(set(decision.servers) - set(stopped))
            reason += f"; kept, active again or not stopped: {', '.join(kept)}"
        decision = replace(decision, reason=reason, servers=tuple(stopped))
        self.emptied[decision.machine] = now
        m = self.state.memory.get(decision.machine)
        if m is not None:
            self.state.memory[decision.machine] = replace(m, reason=reason)
        self._decided(now, decision)
        self.record(now, events.FLEET_STOP_IDLE, decision.machine, reason)
        self.log.info("Stopped idle servers on %s: %s", decision.machine, reason)
        return decision

    def _ended(self, name: str, start: float, end: float, slices: int, fixed=False) -> None:
        ended = {"name": name, "start": start, "end": end, "slices": slices}
        if fixed:
            ended["fixed"] = True  # not the group's: no part of its cost
        self.state.history = (self.state.history + [ended])[-HISTORY_KEPT:]

    def _forget_given_up(self, now: float) -> None:
        """A machine given up is counted in the group's size for ``join_within`` after it was
        given up, the time the organizer was given to remove it in the cloud's console; then
        the hub takes it to be gone."""
        kept = []
        for g in self.state.given_up:
            if now - g.at <= self.settings.join_within:
                kept.append(g)
                continue
            self._ended(g.name, g.asked, now, 0)
            self.log.info(
                "GPU machine %s, given up %.0f s ago, is no longer counted in the cloud's group",
                g.name,
                now - g.at,
            )
        self.state.given_up = kept

    async def _forget_removed(self, now: float, nodes: list[dict]) -> None:
        """Machines the provider removed whose node is down are removed from the swarm (not
        while the removal's call runs: a machine down before it was asked waits for the
        cloud's answer, and stays if the cloud said no)."""
        status = {n.get("ID"): (n.get("Status") or {}).get("State") for n in nodes}
        call = self.state.call or {}
        asked = call.get("machine") if call.get("action") == "remove" else None
        for name, m in list(self.state.memory.items()):
            if m.hub != "leaving" or status.get(m.node) != "down" or name == asked:
                continue
            try:
                await self.engine("remove_node", m.node, force=True)
            except Exception as e:
                self.log.warning("Could not remove the swarm's node of %s: %s", name, e)
                continue
            del self.state.memory[name]
            self._ended(name, m.start, now, m.slices)
            self.log.info("GPU machine %s is gone from the swarm", name)

    def _decided(self, now: float, decision: Decision) -> None:
        entry = {
            "at": now,
            "action": decision.action,
            "machine": decision.machine,
            "target": decision.target,
            "reason": decision.reason,
        }
        self.state.decisions = (self.state.decisions + [entry])[-DECISIONS_KEPT:]

    def record(self, now: float, kind: str, machine: str, reason: str, action: str = "") -> None:
        """An event for the dashboard; a failed write is logged, never raised."""
        try:
            journal = events.journal_for(str(self.dashboard_dir))
            journal.record(events.Event(now, kind, "", node=machine, reason=reason, action=action))
        except OSError:
            self.log.exception("Could not record the fleet's %s", kind)

    async def _carry_out(self, decision: Decision, now: float, seen: capacity.Seen) -> None:
        state, name = self.state, decision.machine
        if decision.action == capacity.GROW:
            if self.busy:
                return  # the next round asks again, once the provider answered
            # as decide counted it: those given up this round are leaving or given up by now
            size = group_size(state)
            asked_at = clock_time(now, self.settings.schedule.zone)
            new = []
            for _ in range(max(decision.target - size, 0)):
                state.asked_count += 1
                reason = f"asked at {asked_at}: {decision.reason}"
                new.append(Asked(f"asked-{state.asked_count}", now, reason))
            state.asked = state.asked + new
            self._decided(now, decision)
            self.record(now, events.FLEET_GROW, "", decision.reason)
            self.save()  # before the call: a restart during it never asks twice
            self._start(
                {"action": "grow", "at": now, "target": decision.target,
                 "asked": [a.name for a in new]},
                self.provider.grow(decision.target),
            )  # fmt: skip
        elif decision.action == capacity.GIVE_UP:
            kept = [a for a in state.asked if a.name != name]
            if len(kept) != len(state.asked):  # never seen by the swarm: the organizer's
                gone = next(a for a in state.asked if a.name == name)
                state.asked = kept
                reason = (
                    f"{decision.reason}. It is still in the cloud's group, counted in its size "
                    f"for {self.settings.join_within / 60:.0f} min more: remove it in the "
                    "cloud's console, the hub cannot name it (its /var/log/gpuhub-join.log says "
                    "why it did not join)"
                )
                state.given_up = state.given_up + [GivenUp(name, gone.at, now, reason)]
                self._decided(now, replace(decision, reason=reason))
                self.record(now, events.FLEET_GIVE_UP, name, reason)
            elif name in state.memory:
                await self._remove(decision, now)
        elif decision.action == capacity.DRAIN:
            m = state.memory[name]
            await self.set_availability(m.node, "pause")
            state.memory[name] = replace(
                m, state="draining", since=now, hub="paused", hub_at=now, reason=decision.reason
            )
            self._decided(now, decision)
            self.record(now, events.FLEET_DRAIN, name, decision.reason)
        elif decision.action == capacity.RESUME:
            await self._resume(name, now, decision.reason)
            self._decided(now, decision)
        elif decision.action == capacity.REMOVE:
            await self._remove(decision, now)

    async def _resume(self, name: str, now: float, reason: str) -> None:
        m = self.state.memory[name]
        await self.set_availability(m.node, "active")
        self.state.memory[name] = replace(
            m, state="ready", since=now, hub="", hub_at=now, reason=reason
        )
        self.record(now, events.FLEET_RESUME, name, reason)

    async def _remove(self, decision: Decision, now: float) -> None:
        """The provider removes ``decision.machine`` if, read again right now, it holds no
        server; one that got a server since the round's read is resumed instead. A machine
        down (``capacity.down_limit``) is removed whatever tasks Swarm still lists on it: the
        hub reported its servers stopped long ago; the call says since when it is down."""
        name = decision.machine
        if self.busy or self.blocked("remove", now):
            return
        m = self.state.memory[name]
        call = {"action": "remove", "at": now, "machine": name}
        if m.state == "gone":
            call["down_since"] = m.since
        elif capacity.servers_on(await self.engine("tasks", filters={"node": m.node}), m.node):
            reason = f"{name} got a server while it was being given back; it stays"
            await self._resume(name, now, reason)
            self._decided(now, Decision(capacity.RESUME, reason, machine=name))
            return
        self.state.memory[name] = replace(
            m, state="leaving", since=now, hub="leaving", hub_at=now, reason=decision.reason
        )
        self._decided(now, decision)
        self.save()
        self._start(call, self.provider.remove(name))

    def _ask_why(self, now: float) -> None:
        """The why command, while a machine asked for is later than expected."""
        why = getattr(getattr(self.provider, "commands", None), "why", "")
        late = [a for a in self.state.asked if now - a.at > self.expected()]
        if not why or not late or self.busy or self.blocked("grow", now):
            return
        if now - self.state.last_why < WHY_EVERY_S:
            return
        self.state.last_why = now
        self._start({"action": "why", "at": now}, self.provider.why())

    # ---- the provider's calls, beside the rounds ----

    def _start(self, call: dict, outcome: Awaitable[provider.Outcome]) -> None:
        self.state.call = call
        self.call_task = asyncio.ensure_future(self._call(call, outcome))
        asked = {key: value for key, value in call.items() if key != "at"}
        self.log.info("The fleet's provider is asked: %s", asked)

    async def _call(self, call: dict, outcome: Awaitable[provider.Outcome]) -> None:
        try:
            done = await outcome
        except Exception as e:  # the runner itself failed (not the command)
            self.log.exception("The fleet's provider call %s failed", call["action"])
            done = provider.Outcome(
                False, provider.UNKNOWN, None, f"{type(e).__name__}: {e}", 0.0, 1, call["action"]
            )
        try:
            self.finished(call, done)
        except Exception:
            self.log.exception("Could not record the fleet's provider call %s", call["action"])

    def finished(self, call: dict, outcome: provider.Outcome) -> None:
        """A provider call ended: its outcome written at once (state, snapshot, event, the
        line's words), its failure undone where the hub counted on it."""
        now, state, action = self.clock(), self.state, call["action"]
        state.call = None
        if action == "why" and outcome.ok:
            self.save()
            return
        machine, down_since = call.get("machine", ""), call.get("down_since")
        # a machine down that the cloud no longer has (a spot machine taken back): removed
        gone = down_since is not None and outcome.kind == provider.NOT_IN_GROUP
        told = f"{outcome.what}: already gone in the cloud" if gone else outcome.told()
        if down_since is not None and not (outcome.ok or gone):
            told += self._down_failed(now, machine, _number(down_since))
        state.last = {
            "action": action,
            "at": now,
            "ok": outcome.ok or gone,
            "kind": "" if gone else outcome.kind,
            "told": told,
            "output": provider.last_line(outcome.output),
        }
        if outcome.ok or gone:
            state.failures, state.blocked_until, state.line_note = 0, 0.0, ""
            state.blocked_action = state.blocked_why = ""
            if action == "remove":  # its node goes at the next round once it is down
                self.record(now, events.FLEET_REMOVE, machine, told)
            self.log.info("The fleet's provider: %s", told)
        else:
            state.failures += 1
            state.blocked_until = now + provider.backoff(outcome.kind, state.failures)
            state.blocked_action = "remove" if action == "remove" else "grow"
            state.blocked_why = outcome.kind
            state.line_note = provider.FOR_THE_LINE.get(outcome.kind, "").strip()
            if action == "grow":
                dropped = set(call.get("asked") or ())
                state.asked = [a for a in state.asked if a.name not in dropped]
            elif action == "why":
                state.asked = []  # the cloud says it cannot make them: not on their way
            elif machine in state.memory and down_since is None:
                # still paused: removed once the cloud lets it
                state.memory[machine] = replace(
                    state.memory[machine], state="draining", since=now, hub="paused", hub_at=now
                )
            self.record(now, events.FLEET_FAILED, machine, told, outcome.kind)
            self.log.warning("The fleet's provider: %s", told)
        self.publish(now)

    def _down_failed(self, now: float, machine: str, down_since: float) -> str:
        """The removal of ``machine``, down since ``down_since``, failed: it is down again, to
        be asked again once the back-off ends, for as long again as ``capacity.down_limit``;
        past that the hub stops counting it (its node goes at the next round) and the
        organizer is told, so that one the cloud took back in words the hub does not know is
        neither asked for nor counted in the group's size for ever. What the organizer reads
        after the failure."""
        m = self.state.memory.get(machine)
        if m is None:
            return ""
        if now - down_since <= 2 * capacity.down_limit(self.settings):
            down_again(self.state, machine, down_since)
            return f"; {machine} is down: asked again after the back-off"
        return (
            f"; {machine} has been down for {(now - down_since) / 60:.0f} min and is no longer "
            "counted in the cloud's group: if it is still there, remove it in the cloud's console"
        )

    # ---- what the others read ----

    def line_note(self, now: float) -> str:
        """What people in line read about the fleet now: machines of a grow the cloud has not
        answered yet are not on their way, they are being asked for."""
        refused = self.state.line_note if self.blocked("grow", now) else ""
        call = self.state.call or {}
        asking = call.get("action") == "grow"
        unanswered = set(call.get("asked") or ()) if asking else set()
        on_the_way = [
            Machine(a.name, "asked", a.at, asked=a.at)
            for a in self.state.asked
            if a.name not in unanswered
        ]
        on_the_way += [  # a fixed machine joining is not awaited (``capacity.arrival``)
            m for m in self.seen if m.state in capacity.ON_ITS_WAY and m.state != "asked"
        ]
        return capacity.for_the_line(now, on_the_way, self.expected(), refused, asking)

    def publish(self, now: float) -> None:
        """The state, the dashboard's snapshot and the line's words, as they are now."""
        self.save()
        hub_broker = self.broker_of()
        if hub_broker is not None:
            hub_broker.tell_fleet_note(self.line_note(now))
        made = snapshot(
            now,
            self.state,
            self.seen,
            self.learnt(),  # the floor as the round reads it
            self.expected(),
            self.busy,
            self.price_per_hour,
        )
        events.write_whole(self.dashboard_dir / SNAPSHOT_FILE, json.dumps(made, ensure_ascii=False))

    async def keep(self) -> None:
        """A round at once, then ``every`` seconds after each, and as soon as someone joins
        the line (at most one round a ``soonest``; ``periodic.keep``)."""
        await periodic.keep(
            self.round,
            self.every,
            self.log,
            "fleet round",
            wake=self.line_joined(),
            least=self.soonest,
        )


def clock_time(when: float, zone: str = "UTC") -> str:
    """``when`` as the organizer's wall clock shows it: "09:02"."""
    local = datetime.fromtimestamp(when, tz=timezone.utc).astimezone(ZoneInfo(zone))
    return local.strftime("%H:%M")


def forget_snapshot(dashboard_dir: str | os.PathLike) -> None:
    """The hub starts with the fleet off: a snapshot an earlier hub with it on left goes, or the
    dashboard would show that fleet, stale, for ever."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(dashboard_dir) / SNAPSHOT_FILE)


def install(
    settings: capacity.Settings,
    make_provider: Callable[[], provider.Provider],
    data_dir: str | os.PathLike,
    dashboard_dir: str | os.PathLike,
    *,
    learn_slices: bool = True,
    price_per_hour: float = 0.0,
) -> None:
    """Start the fleet keeper once JupyterHub has started (from the hub's config, with
    ``GPUHUB_FLEET=on``); ``make_provider()`` is called then (its runner may need the Docker
    client, which the config does not make)."""

    def start(hub) -> None:
        keeper = FleetKeeper(
            settings,
            make_provider(),
            data_dir,
            dashboard_dir,
            log=hub.log,
            learn_slices=learn_slices,
            price_per_hour=price_per_hour,
            hub_servers=lambda: internals.running_servers(hub),
            stop_server=lambda s, since, why: internals.stop_idle_server(
                hub, s.user, s.server, since, why
            ),
        )
        hub.gpuhub_fleet = keeper
        hub.gpuhub_fleet_task = asyncio.ensure_future(keeper.keep())

    internals.after_hub_start(start)
