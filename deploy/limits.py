"""The ``auto`` limits of ``make demo``: each server's CPU, memory and tasks, sized by the
machine and the slices it advertises. Part of the settings' reader (deploy/settings.py).
Standard library only; ``auto_limits`` and ``servers_here`` are pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .envfile import Settings
from .values import GIB, MIB

#: The word that asks ``make demo`` to size a limit for its machine.
AUTO = "auto"

# ---- limits: "auto" -----------------------------------------------------------------------

LIMIT_KEYS = ("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT")
# What a JupyterLab with a kernel needs to start and work; "auto" never goes below these.
MEM_FLOOR = GIB
PIDS_FLOOR = 1024
# Memory kept for the hub, the proxy, the Docker engine and the system.
MEM_RESERVE = 2 * GIB
# Tasks (processes and threads) per core of the machine: OpenMP, BLAS and PyTorch start a
# thread per core they see, whatever the CPU limit.
PIDS_PER_CPU = 64


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory: int  # bytes
    gpus: int  # NVIDIA GPUs the driver lists (0: none)


def this_machine() -> Machine:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpus_dir = Path("/proc/driver/nvidia/gpus")
    gpus = len(list(gpus_dir.iterdir())) if gpus_dir.is_dir() else 0
    return Machine(cpus, memory, gpus)


def servers_here(settings: dict[str, str], machine: Machine) -> int:
    """How many servers this machine runs at once when every slice it advertises is taken:
    its GPUs (or GPUHUB_SIMULATE_IF_NO_GPU simulated ones) times GPUHUB_SLICES_PER_GPU, over
    GPUHUB_SLICES_PER_SERVER; at least 1."""
    try:
        gpus = machine.gpus or int(settings.get("GPUHUB_SIMULATE_IF_NO_GPU", "0"))
        slices = gpus * int(settings.get("GPUHUB_SLICES_PER_GPU", "1"))
        return max(1, slices // max(1, int(settings.get("GPUHUB_SLICES_PER_SERVER", "1"))))
    except ValueError:  # reported by problems()
        return 1


def auto_limits(machine: Machine, servers: int) -> dict[str, str]:
    """Per-server limits that let ``servers`` servers share ``machine``: its memory (less
    MEM_RESERVE) divided among them, never below what a JupyterLab needs, and PIDS_PER_CPU tasks
    per core. No CPU quota: every server's container has Docker's default CPU weight, so servers
    share the cores equally while they compete and one alone uses them all (a quota of cores /
    servers made a start on an idle machine take twice as long and was no fairer under load:
    docs/benchmarks.md, "CPU limits"); the hub's and the proxy's weight stays above theirs
    (priority.py)."""
    servers = max(1, servers)
    memory = max(MEM_FLOOR, (machine.memory - MEM_RESERVE) // servers)
    pids = max(PIDS_FLOOR, PIDS_PER_CPU * machine.cpus)
    return {
        "GPUHUB_CPU_LIMIT": "",
        "GPUHUB_MEM_LIMIT": f"{memory // MIB}M",
        "GPUHUB_PIDS_LIMIT": str(pids),
    }


def resolve_auto(settings: Settings, machine: Machine) -> Settings:
    """``auto`` limits replaced by auto_limits for this machine (servers of `make demo` run
    here)."""
    if not any(settings.values.get(k) == AUTO for k in LIMIT_KEYS):
        return settings
    limits = auto_limits(machine, servers_here(settings.values, machine))
    values = dict(settings.values)
    for key in LIMIT_KEYS:
        if values.get(key) == AUTO:
            values[key] = limits[key]
    return Settings(values, settings.origin)
