"""What a Swarm task says about a server: one reader of the task dicts the Docker API returns.

Pure: ``read_task`` turns a task (as ``docker.APIClient.tasks()`` returns it, or None before
Swarm has made one) into a ``TaskReading``: which phase the start is in, what the participant
is told, where the server can be reached. The spawner's wait loop and its ``poll`` act on
readings; the inventory counts slices of the tasks in ``LIVE_STATES``.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timezone

#: Task states on the way to running, and what the participant is told about each. A task in
#: one of these states holds (or is about to hold) its reservation on its node.
STAGES = {
    "new": (35, "Waiting for Swarm to place the server"),
    "pending": (35, "Waiting for Swarm to place the server"),
    "assigned": (40, "Swarm assigned the server to {node}"),
    "accepted": (45, "{node} accepted the server"),
    "preparing": (55, "Preparing the container on {node} (pulling the image if it is missing)"),
    "ready": (65, "Container ready on {node}"),
    "starting": (75, "Container starting on {node}"),
    "running": (90, "Container running on {node}"),
}
LIVE_STATES = frozenset(STAGES)

#: Swarm's words for a task it cannot place (e.g. "no suitable node (insufficient resources
#: on 3 nodes)"); the task then stays pending until something frees up.
UNPLACEABLE = "no suitable node"
#: Swarm's words for a task whose machine has not got the image and cannot pull it. Swarm would
#: retry it every few seconds until the start timeout, so the spawn fails at once instead.
NO_IMAGE = "No such image"
#: Swarm's words for a task whose bind mount's folder is missing on its machine (the shared
#: storage for tutorials or datasets not mounted there); retried like the image, so the same.
NO_MOUNT = "bind source path does not exist"


class Phase(enum.Enum):
    STARTING = "starting"  # on its way (a live state other than running)
    RUNNING = "running"
    UNPLACEABLE = "unplaceable"  # no node has the resources: another server took the slice
    NO_IMAGE = "no image"  # its machine has not got the image and cannot pull it
    NO_MOUNT = "no mount"  # its machine lacks a folder the server mounts (shared storage)
    RETRYING = "retrying"  # rejected: Swarm makes a new task (Docker 20.10's network bug)
    ENDED = "ended"  # failed, shutdown, complete, orphaned, remove: it will not come up


@dataclass(frozen=True)
class TaskReading:
    phase: Phase
    state: str  # Swarm's state word, lower case ("new" before the task exists)
    detail: str  # Swarm's error, else its message
    task_id: str = ""
    node_id: str = ""  # set once Swarm has placed the task
    address: str = ""  # the task's address on the network asked about, once it has one

    @property
    def placed(self) -> bool:
        """Swarm has decided: the task is on a node (its slices count there) or refused."""
        return bool(self.node_id) or self.phase is Phase.UNPLACEABLE

    def stage(self, node: str) -> tuple[int, str] | None:
        """(percent, message) for the progress bar, or None outside the way to running."""
        if self.state not in STAGES:
            return None
        progress, message = STAGES[self.state]
        return progress, message.format(node=node)


def task_address(task: dict, network_name: str) -> str:
    """The task's IP address on ``network_name``, or "" when it has none there."""
    for attachment in task.get("NetworksAttachments") or []:
        if attachment.get("Network", {}).get("Spec", {}).get("Name") == network_name:
            addresses = attachment.get("Addresses") or [""]
            return addresses[0].split("/", 1)[0]
    return ""


def _phase(state: str, error: str) -> Phase:
    if state == "pending" and UNPLACEABLE in error:
        return Phase.UNPLACEABLE
    if state == "rejected":
        if NO_IMAGE in error:
            return Phase.NO_IMAGE
        return Phase.NO_MOUNT if NO_MOUNT in error else Phase.RETRYING
    if state == "running":
        return Phase.RUNNING
    return Phase.STARTING if state in LIVE_STATES else Phase.ENDED


def read_task(task: dict | None, network_name: str = "") -> TaskReading:
    """What ``task`` (None: not created yet) says about the server."""
    if not task:
        return TaskReading(Phase.STARTING, "new", "")
    status = task.get("Status") or {}
    state = status.get("State", "new").lower()
    error = status.get("Err") or ""
    return TaskReading(
        phase=_phase(state, error),
        state=state,
        detail=error or status.get("Message") or "",
        task_id=task.get("ID", ""),
        node_id=task.get("NodeID") or "",
        address=task_address(task, network_name),
    )


def newest(tasks: list[dict]) -> dict | None:
    """The task that speaks for a service now: the newest of those meant to run, else the
    newest of all (a service whose tasks all ended)."""
    if not tasks:
        return None
    return max(tasks, key=lambda t: (t.get("DesiredState") == "running", t.get("CreatedAt", "")))


def is_running(task: dict) -> bool:
    """A task whose container runs (the server may be listening)."""
    return task.get("Status", {}).get("State") == "running"


def swarm_time(stamp) -> float | None:
    """Epoch seconds of a time as the Engine API writes it ("2026-11-28T09:05:12.123456789Z":
    UTC, up to nine digits of a second, trailing zeros dropped); None when it is not one.
    Read so on Python 3.9 too, whose ``fromisoformat`` takes neither the Z nor other than three
    or six digits."""
    if not isinstance(stamp, str):
        return None
    whole, dot, rest = stamp.replace("Z", "+00:00").partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        whole += "." + rest[: min(digits, 6)].ljust(6, "0") + rest[digits:]
    try:
        when = datetime.fromisoformat(whole)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def running_since(task: dict) -> float | None:
    """When (epoch seconds) ``task``'s container started running, as Swarm's status says (its
    last change); None when it is not running or the time cannot be read."""
    status = task.get("Status") or {}
    return swarm_time(status.get("Timestamp")) if status.get("State") == "running" else None


def is_live(task: dict) -> bool:
    """A task that Swarm still counts against its node's resources.

    What counts is the task's actual state, not the desired one: the task of a service that
    was just removed keeps its reservation until its container has really stopped.
    """
    return bool(task.get("NodeID")) and task.get("Status", {}).get("State") in LIVE_STATES


#: A task Swarm has made but not given its network addresses stays "new". After this long the
#: spawner asks whether the servers' network has addresses left (``addresses_left``).
UNALLOCATED_S = 10.0

#: Addresses of an overlay network Swarm keeps for itself: the network's own, its broadcast
#: address and its gateway.
RESERVED_ADDRESSES = 3


def addresses_left(subnets: list[str], tasks: list[dict], network_name: str, nodes: int) -> int:
    """Addresses of ``subnets`` (the network's ranges) that no task on ``network_name`` holds
    (a task that has not ended keeps its address, placed or not), less those Swarm keeps: its
    own three per range and one per node (each node's endpoint on the network). 0 or less: no
    other server can join the network."""
    size = sum(ipaddress.ip_network(s, strict=False).num_addresses for s in subnets)
    held = sum(
        1
        for t in tasks
        if t.get("Status", {}).get("State") in LIVE_STATES and task_address(t, network_name)
    )
    return size - RESERVED_ADDRESSES * len(subnets) - nodes - held
