"""Keeping three views of who runs a server in agreement: the rules, pure.

The hub's database says which servers run, Swarm's services and tasks say what runs where, and
the proxy's routes say where a participant's requests go. On the event day any of them can
restart or fall behind the others (the manager's engine restarted, the proxy rescheduled, the
hub killed mid-spawn, a GPU machine cut off), and the hub brings them back together itself:

- ``verdict``: what one look at a server's tasks says: running (and where), recovering (Swarm
  is replacing its container: its engine restarted, its machine is briefly unreachable) or
  gone. The spawner's ``poll`` reports a server stopped only when it is gone, or has been
  recovering for longer than ``server_lost_after``: a server Swarm brings back is never taken
  for a stopped one, and so its participant is never refused for the slices it holds.
- ``Sightings``: services that hold a participant's server (this hub's labels) but that no
  server of the hub owns, each removed once it has been seen so for a grace period.
- ``routes_to_mend``: the servers whose route the proxy lacks or points elsewhere (a proxy
  that restarted has none).

Everything here takes the Docker API's dicts (or plain values) and returns plain values;
``keeper.py`` and ``spawner.py`` do the I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import contract
from .tasks import LIVE_STATES, Phase, newest, read_task


class Health(enum.Enum):
    RUNNING = "running"
    RECOVERING = "recovering"  # Swarm is bringing it back; not stopped (yet)
    GONE = "gone"  # it will not come back: the hub should take it as stopped


@dataclass(frozen=True)
class Verdict:
    health: Health
    reason: str = ""  # why it is not running ("" when it is)
    address: str = ""  # running: its task's address on the servers' network
    node_id: str = ""  # the node of the task that speaks for the service, when placed


#: Phases in which Swarm is still trying to run the task: a container being made, a task
#: rejected and retried, an image or a shared folder the machine lacks (a machine that came
#: back without its NFS mount): the server may come back, for a while.
_RETRIED = (Phase.STARTING, Phase.RETRYING, Phase.NO_IMAGE, Phase.NO_MOUNT)


def verdict(service_tasks: list[dict], node_states: Mapping[str, str], network: str) -> Verdict:
    """What a server's service's tasks (all of them, as ``docker.APIClient.tasks`` returns
    them; [] when the service is gone) say, given the state ("ready", "down", ...) of the nodes
    known (a node missing from ``node_states`` is taken as ready: the caller asks for the one
    that matters, the newest task's)."""
    if not service_tasks:
        return Verdict(Health.GONE, "its service is gone")
    task = newest(service_tasks)
    reading = read_task(task, network)
    node = reading.node_id
    if reading.phase is Phase.RUNNING:
        state = node_states.get(node, "ready") if node else "ready"
        if state != "ready":
            return Verdict(Health.RECOVERING, f"its machine is {state}", node_id=node)
        return Verdict(Health.RUNNING, address=reading.address, node_id=node)
    if reading.phase in _RETRIED:
        return Verdict(
            Health.RECOVERING,
            f"Swarm is restarting it (task {reading.state}{_detail(reading.detail)})",
            node_id=node,
        )
    if reading.phase is Phase.UNPLACEABLE:
        if any(t.get("NodeID") for t in service_tasks):
            # it ran: its machine is away (its GPU with it), or a restart raced for the slices
            return Verdict(Health.RECOVERING, f"Swarm cannot place it again yet ({reading.detail})")
        return Verdict(Health.GONE, f"cannot be placed: {reading.detail}")
    if task.get("DesiredState") == "running":
        # a task that failed while Swarm still wants it: its replacement comes next
        return Verdict(Health.RECOVERING, f"Swarm is replacing it (task {reading.state})")
    return Verdict(Health.GONE, f"task {reading.state}: {reading.detail}")


def _detail(detail: str) -> str:
    return f": {detail}" if detail else ""


def held_by_user(all_tasks: Iterable[dict], user: str) -> int:
    """Slices that live tasks of ``user``'s servers hold (their containers' labels), in a read
    of every task of the swarm."""
    held = 0
    for task in all_tasks:
        labels = ((task.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels") or {}
        state = (task.get("Status") or {}).get("State", "")
        if labels.get(contract.USER_LABEL) == user and state in LIVE_STATES:
            held += int(labels.get(contract.SLICES_LABEL) or 0)
    return held


# ---- services no server of the hub owns -----------------------------------------------------


@dataclass(frozen=True)
class Orphan:
    service_id: str
    name: str
    user: str
    seen_for: float  # seconds it has been seen without an owner


class Sightings:
    """When each service without an owner was first seen (one per hub, in its memory).

    A hub that restarts starts counting afresh, so every service gets the full grace after the
    hub answers again: one whose spawn was under way when the hub stopped is adopted or stopped
    by the hub's own start-up checks first."""

    def __init__(self) -> None:
        self.first_seen: dict[str, float] = {}

    def due(
        self, services: Iterable[dict], owned: set[str], now: float, grace: float
    ) -> list[Orphan]:
        """The services of participants' servers (``services``: as ``docker.APIClient.services``
        returns them, already filtered to this hub's) whose name is not in ``owned`` (the
        service names of every server the hub has running or starting) and that have been
        seen so for ``grace`` seconds or more. Those seen owned again are forgotten."""
        due, unowned = [], set()
        for service in services:
            spec = service.get("Spec") or {}
            name, labels = spec.get("Name", ""), spec.get("Labels") or {}
            user = labels.get(contract.USER_LABEL)
            if not user or name in owned:
                continue
            sid = service.get("ID", "")
            unowned.add(sid)
            first = self.first_seen.setdefault(sid, now)
            if now - first >= grace:
                due.append(Orphan(sid, name, user, now - first))
        self.first_seen = {sid: t for sid, t in self.first_seen.items() if sid in unowned}
        return due

    def removed(self, service_id: str) -> None:
        self.first_seen.pop(service_id, None)


# ---- the proxy's routes ------------------------------------------------------------------------


def routes_to_mend(routes: Mapping[str, dict], wanted: Mapping[str, str]) -> list[str]:
    """The route specs of ``wanted`` ({routespec: target URL}: every running server's, the
    hub's) that ``routes`` (the proxy's, as ``Proxy.get_all_routes`` returns them: {routespec:
    {"target": ...}}) lacks or points at another target, in ``wanted``'s order."""
    return [
        spec for spec, target in wanted.items() if (routes.get(spec) or {}).get("target") != target
    ]
