"""Whose each GPU process is: the GPU guard's attribution of processes to participants.

A GPU process's cgroup (``/proc/PID/cgroup``) names its container (``container_of``); the
container carries the labels the spawner sets, read into a ``Server`` each (``servers_from``:
user, GPU, slices, budget in MiB); ``attribute`` joins the two into the policy's reading, and
``budgets_of`` gives the policy each server's budget. ``Proc`` is this machine's /proc, read for
the cgroups, the start times that tell a process from a later one with its pid, and what a
participant knows a process by (``ProcessInfo``).

It imports the policy (``guard_policy``), ``telemetry``'s reading and the contract's labels;
nothing of the rest of the guard (guard.py, guard_notices, guard_metrics, guard_command), which
import it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_swarm_spawner import contract

from . import guard_policy as policy
from . import telemetry

_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def container_of(cgroup: str) -> str | None:
    """The container id in a process's ``/proc/PID/cgroup`` text, None for a host process.

    cgroup v1 (``…:/docker/<id>``), v2 with cgroupfs (``0::/docker/<id>``) or systemd
    (``0::/system.slice/docker-<id>.scope``), nested engines (the last id is the innermost)."""
    found = _CONTAINER_ID.findall(cgroup)
    return found[-1] if found else None


@dataclass(frozen=True)
class Server:
    """A participant's server running here, from its container's labels."""

    container: str
    owner: str  # its service, jy-<user>[--<server>]: the policy's key
    user: str
    gpu_uuid: str
    slices: int
    budget_mb: int | None


def servers_from(containers: Iterable[Mapping]) -> tuple[dict[str, Server], list[str]]:
    """The participants' servers among the engine's containers (its list API's objects), by
    container id; and a line for each container whose labels are not usable."""
    servers, problems = {}, []
    for container in containers:
        labels = container.get("Labels") or {}
        ident = str(container.get("Id", ""))
        owner = labels.get("com.docker.swarm.service.name") or _name(container) or ident[:12]
        user, gpu = labels.get(contract.USER_LABEL), labels.get(contract.GPU_LABEL)
        if not user or not gpu:
            continue  # a server without a GPU: nothing to guard
        try:
            slices = int(labels.get(contract.SLICES_LABEL, "1"))
            budget = labels.get(contract.BUDGET_LABEL)
            budget_mb = int(budget) if budget else None
        except ValueError:
            problems.append(
                f"{owner}: labels {contract.SLICES_LABEL}/{contract.BUDGET_LABEL} "
                "are not whole numbers; its processes count as nobody's"
            )
            continue
        servers[ident] = Server(ident, owner, user, gpu, slices, budget_mb)
    return servers, problems


def _name(container: Mapping) -> str:
    names = container.get("Names") or []
    return names[0].lstrip("/") if names else ""


def budgets_of(servers: Iterable[Server]) -> dict[str, policy.Budget]:
    return {
        s.owner: policy.Budget(s.gpu_uuid, s.budget_mb) for s in servers if s.budget_mb is not None
    }


def attribute(
    snapshot: telemetry.Snapshot,
    containers: Mapping[int, str | None],
    servers: Mapping[str, Server],
) -> policy.Reading:
    """The policy's reading: each process with the server it belongs to (None: nobody's).
    A process whose memory NVML cannot tell counts as 0 MiB."""
    processes = []
    for p in snapshot.processes:
        server = servers.get(containers.get(p.pid) or "")
        owner = server.owner if server else None
        processes.append(policy.GPUProcess(p.pid, p.gpu_uuid, p.used_mb or 0, owner))
    return policy.Reading(frozenset(g.uuid for g in snapshot.gpus), tuple(processes))


@dataclass(frozen=True)
class ProcessInfo:
    """What the participant knows a process by: its pid inside their server, its command."""

    pid_inside: int | None
    command: str

    def describe(self, pid: int) -> str:
        inside = self.pid_inside if self.pid_inside is not None else pid
        return f"pid {inside} in your server ({self.command})" if self.command else f"pid {inside}"


# ---- the machine: /proc -------------------------------------------------------------------


class Proc:
    """This machine's processes, as /proc shows them (the guard runs in the host's PID
    namespace, where NVML's pids are)."""

    def __init__(self, root: str = "/proc"):
        self.root = Path(root)

    def _read(self, pid: int, name: str) -> str:
        return (self.root / str(pid) / name).read_text(errors="replace")

    def cgroup(self, pid: int) -> str | None:
        try:
            return self._read(pid, "cgroup")
        except OSError:
            return None  # gone

    def start_time(self, pid: int) -> int | None:
        """Field 22 of /proc/PID/stat: tells a process from a later one with its pid."""
        try:
            stat = self._read(pid, "stat")
            return int(stat.rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return None

    def info(self, pid: int) -> ProcessInfo:
        inside = None
        try:
            for line in self._read(pid, "status").splitlines():
                if line.startswith("NSpid:"):
                    inside = int(line.split()[-1])
            command = " ".join(self._read(pid, "cmdline").split("\0")).strip()
        except (OSError, ValueError):
            command = ""
        return ProcessInfo(inside, command[:80] + ("..." if len(command) > 80 else ""))
