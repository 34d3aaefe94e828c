"""The GPU inventory of a swarm, computed from what the Docker API reports.

Pure functions over the plain dicts that ``docker.APIClient.nodes()`` and
``docker.APIClient.tasks()`` return; no I/O here, so every cluster shape can be unit-tested.

How GPUs appear in Swarm (see worker_setup/ for the advertising side): every physical GPU of a
node is advertised as one *discrete* generic resource whose kind is the GPU's UUID and whose value
is the number of slices that GPU is split into, e.g. ``GPU-8d2c...=3`` in the node's
``node-generic-resources``; a GPU in MIG mode is advertised as its MIG instances instead, each
a kind of its own (``MIG-4b1e...=1``), and is placed on like any GPU. Swarm itself refuses to
place more reservations of a kind on a node than the node advertises, so the slice accounting
lives in Swarm; this module only reads it back to choose a GPU and to explain a refusal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from . import contract
from .contract import KIND_PREFIXES, MEMORY_LABEL, is_mig, is_simulated
from .tasks import is_live


@dataclass(frozen=True)
class GPU:
    """One physical (or simulated) GPU, or one MIG instance, and how many of its slices are
    taken."""

    uuid: str
    node_id: str
    node_name: str
    slices: int
    used: int
    memory_mb: int = 0  # total memory of the GPU; 0 when the node does not say
    cores: float = 0.0  # CPU cores of its machine; 0 when the node does not say

    @property
    def free(self) -> int:
        return max(self.slices - self.used, 0)

    @property
    def simulated(self) -> bool:
        return is_simulated(self.uuid)

    @property
    def mig(self) -> bool:
        """A MIG instance: its memory and compute are isolated in hardware."""
        return is_mig(self.uuid)

    def memory_budget_mb(self, slices: int) -> int:
        """The share of the GPU's memory that ``slices`` of its slices stand for (0: unknown)."""
        return self.memory_mb * slices // self.slices if self.slices else 0


#: One kind prefix (``"GPU-"``) or a tuple of them (``KIND_PREFIXES``: GPUs and MIG instances).
Prefixes = str | tuple[str, ...]


def gpu_kinds(node: dict, kind_prefix: Prefixes = KIND_PREFIXES) -> dict[str, int]:
    """The GPU (and MIG instance) kinds a node advertises, as ``{uuid: slices}`` (its spare
    units left out: ``contract.SWARM_SPARE``)."""
    description = node.get("Description", {})
    resources = description.get("Resources", {}) or {}
    labels = (description.get("Engine") or {}).get("Labels")
    return contract.advertised_slices(resources.get("GenericResources"), labels, kind_prefix)


def gpu_memory(node: dict, uuid: str) -> int:
    """A GPU's total memory in MiB from its node's engine labels; 0 (unknown) when not
    labelled, or labelled with something no GPU has (not a whole number, or below 1: a budget
    of it would put every server over)."""
    labels = node.get("Description", {}).get("Engine", {}).get("Labels") or {}
    try:
        return max(int(labels.get(MEMORY_LABEL + uuid, 0)), 0)
    except ValueError:
        return 0


def node_cores(node: dict) -> float:
    """The CPU cores a node's engine reports (``NanoCPUs``); 0 (unknown) when it does not."""
    resources = node.get("Description", {}).get("Resources", {}) or {}
    nano = resources.get("NanoCPUs")
    return nano / 1e9 if isinstance(nano, int) and nano > 0 else 0.0


def node_is_schedulable(node: dict) -> bool:
    """Ready and active: drained, paused or down nodes never get new servers."""
    return (
        node.get("Status", {}).get("State") == "ready"
        and node.get("Spec", {}).get("Availability") == "active"
    )


def task_reservations(task: dict, kind_prefix: Prefixes = KIND_PREFIXES) -> dict[str, int]:
    """The GPU slices a task reserves, as ``{uuid: slices}``."""
    resources = task.get("Spec", {}).get("Resources", {}) or {}
    reservations = resources.get("Reservations", {}) or {}
    return contract.kinds_in(reservations.get("GenericResources"), kind_prefix)


@dataclass(frozen=True)
class Claim:
    """Slices this hub has just asked Swarm for, on a GPU Swarm has not yet counted them on.

    Between a spawn choosing a GPU and Swarm placing that spawn's task (a few hundred
    milliseconds, seconds under a burst), the task list does not show the reservation yet; a
    spawn choosing in that window would aim at the same slice and lose the race. Claims fill
    the window. They only steer the choice: Swarm still enforces the slice count.
    ``service_id`` is empty until the service exists.
    """

    uuid: str
    slices: int
    service_id: str = ""


@dataclass(frozen=True)
class TaskUsage:
    """What the live tasks of one read of the swarm hold: ``used``, slices by GPU UUID, and
    ``services``, the services with a live task (their claims are counted in ``used``)."""

    used: dict[str, int]
    services: frozenset


def task_usage(tasks: list[dict], kind_prefix: Prefixes = KIND_PREFIXES) -> TaskUsage:
    """The slices ``tasks`` hold while live, on any node. The costly part of an inventory
    (every task of the swarm), so a read shared by many spawns is counted once."""
    used: dict[str, int] = {}
    services = set()
    for task in tasks:
        if not is_live(task):
            continue
        services.add(task.get("ServiceID"))
        for uuid, count in task_reservations(task, kind_prefix).items():
            used[uuid] = used.get(uuid, 0) + count
    return TaskUsage(used, frozenset(services))


def used_slices(
    tasks: list[dict],
    kind_prefix: Prefixes = KIND_PREFIXES,
    claims: Iterable[Claim] = (),
    usage: TaskUsage | None = None,
) -> dict[str, int]:
    """``{uuid: slices}`` held by live tasks and by ``claims``, on any node; ``usage``:
    ``task_usage(tasks)`` when already counted.

    Kinds are GPU UUIDs, so each lives on exactly one node. A claim whose service already has
    a live task in ``tasks`` is not counted twice.
    """
    usage = usage or task_usage(tasks, kind_prefix)
    used = dict(usage.used)
    for claim in claims:
        if not claim.service_id or claim.service_id not in usage.services:
            used[claim.uuid] = used.get(claim.uuid, 0) + claim.slices
    return used


def _advertised(nodes: list[dict], kind_prefix: Prefixes) -> list[tuple[dict, str, dict[str, int]]]:
    """``(node, its name, {uuid: slices})`` for each schedulable node, its kinds read once."""
    return [
        (node, node.get("Description", {}).get("Hostname") or node["ID"][:12],
         gpu_kinds(node, kind_prefix))
        for node in nodes
        if node_is_schedulable(node)
    ]  # fmt: skip


def _shared(advertised: list[tuple[dict, str, dict[str, int]]]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for _node, name, kinds in advertised:
        for uuid in kinds:
            seen.setdefault(uuid, []).append(name)
    return {uuid: names for uuid, names in seen.items() if len(names) > 1}


def kinds_on_several_nodes(
    nodes: list[dict], kind_prefix: Prefixes = KIND_PREFIXES
) -> dict[str, list[str]]:
    """``{uuid: [machine names]}`` for every GPU kind that more than one schedulable machine
    advertises. Real GPUs never share a UUID; machines cloned from one image (one
    /etc/machine-id: one set of simulated GPUs) or hand-written advertisements can. Swarm may
    then place a server that asks for that kind on any of those machines, not on the one the
    spawner chose, so the hub uses none of them (``build_inventory``)."""
    return _shared(_advertised(nodes, kind_prefix))


def build_inventory(
    nodes: list[dict],
    tasks: list[dict],
    kind_prefix: Prefixes = KIND_PREFIXES,
    claims: Iterable[Claim] = (),
    usage: TaskUsage | None = None,
) -> list[GPU]:
    """Every GPU on a schedulable node, with the slices live tasks (and ``claims``) hold on it
    (``usage``: ``task_usage(tasks)`` when already counted); not those whose UUID another
    schedulable node advertises too (``kinds_on_several_nodes``).

    Sorted by node name then UUID, so callers get a stable order.
    """
    used = used_slices(tasks, kind_prefix, claims, usage)
    advertised = _advertised(nodes, kind_prefix)
    shared = _shared(advertised)
    gpus = []
    for node, name, kinds in advertised:
        for uuid, slices in kinds.items():
            if uuid in shared:
                continue  # Swarm could place its servers on another machine
            memory = gpu_memory(node, uuid)
            cores = node_cores(node)
            gpus.append(GPU(uuid, node["ID"], name, slices, used.get(uuid, 0), memory, cores))
    gpus.sort(key=lambda g: (g.node_name, g.uuid))
    return gpus


def totals(gpus: list[GPU]) -> tuple[int, int]:
    """(slices in use, slices in all) over an inventory."""
    return sum(min(g.used, g.slices) for g in gpus), sum(g.slices for g in gpus)
