"""Which of the GPUs NVML reports this machine may advertise: pure rules over ``GPUInfo``.

NVML answers what the driver, the GPU and, in a virtual machine, the hypervisor tell it, and
not every answer can become a slice the hub uses well. A GPU's UUID is the Swarm kind the hub
places on, the NVIDIA runtime's ``NVIDIA_VISIBLE_DEVICES`` and the guard's key for its readings;
its memory is the budget the guard holds each server to. So:

- **Refused** (the machine advertises none of its GPUs, with the fix): two GPUs or MIG instances
  with one UUID (some passthrough and vGPU setups), since neither the runtime nor the guard can
  tell them apart and a container would get either; and a UUID that cannot be a Swarm kind
  (other characters than letters, digits and dashes, as the ``MIG-GPU-<uuid>/1/0`` names of
  drivers before R470).
- **Skipped** (a warning naming it and the fix; the others are advertised): a GPU or MIG
  instance reporting less memory than one slice needs (0 MiB: a GPU mid-reset, or one whose
  driver lost it) or more than any GPU has (NVML's "not available", 2^64-1 bytes). Its slices
  would carry a budget of 0 MiB, which the guard takes for "unknown" and never enforces, or
  one nothing can exceed.

``screen`` applies them after ``gpus.advertised`` (MIG instances in place of their GPU).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from gpu_swarm_spawner.contract import KIND_PREFIXES

from .gpus import GPUInfo, advertised
from .slicing import MIN_SLICE_MB

#: More memory than any GPU has (the largest have 288 GB) by far: a GPU reporting this much
#: or more gives a garbage reading, e.g. NVML's "not available" (2^64-1 bytes).
MAX_MEMORY_MB = 4 * 1024 * 1024
#: A UUID the hub can place on: a kind prefix, then letters, digits and dashes (Swarm reads
#: node-generic-resources as ``kind=value`` separated by commas).
_UUID = re.compile(rf"^(?:{'|'.join(KIND_PREFIXES)})[0-9A-Za-z][0-9A-Za-z-]*$")


@dataclass
class Screened:
    """What ``screen`` made of the GPUs NVML reported."""

    #: What is advertised: whole GPUs and MIG instances.
    units: list[GPUInfo] = field(default_factory=list)
    #: One line for each GPU in MIG mode without instances (how an admin left it, not a fault).
    notes: list[str] = field(default_factory=list)
    #: One line for each GPU or MIG instance skipped for its memory, with the fix.
    skipped: list[str] = field(default_factory=list)
    #: Why none of the machine's GPUs may be advertised (one line with the fix), or "".
    refusal: str = ""


def screen(found: list[GPUInfo]) -> Screened:
    """What of ``found`` (``gpus.discover``'s GPUs) is advertised, skipped or refused."""
    units, notes = advertised(found)
    refusal = duplicate_uuids(found) or unusable_uuids(units)
    if refusal:
        return Screened(refusal=refusal)
    problems = {u.uuid: memory_problem(u) for u in units}
    kept = [u for u in units if not problems[u.uuid]]
    return Screened(kept, notes, [line for line in problems.values() if line])


def _all_units(found: list[GPUInfo]) -> list[GPUInfo]:
    return [unit for gpu in found for unit in (gpu, *gpu.mig_instances)]


def duplicate_uuids(found: list[GPUInfo]) -> str:
    """The refusal for GPUs (or MIG instances) sharing a UUID, naming the first such UUID and
    all that share it; "" when every UUID is its own."""
    holders: dict[str, list[GPUInfo]] = defaultdict(list)
    for unit in _all_units(found):
        holders[unit.uuid].append(unit)
    for uuid, units in holders.items():
        if len(units) > 1:
            which = " and ".join(
                f"MIG instance of GPU {u.index}" if u.is_mig else f"GPU {u.index}" for u in units
            )
            return (
                f"{which} report one UUID, {uuid}: the hub, the NVIDIA container runtime and the "
                "GPU guard know a GPU by its UUID, so a server there would get either GPU and its "
                "memory would be counted on both; give each GPU its own UUID (in a virtual "
                "machine: pass each GPU through as its own device, or give each vGPU its own "
                "profile and instance), then run this again"
            )
    return ""


def unusable_uuids(units: list[GPUInfo]) -> str:
    """The refusal for the first UUID of ``units`` (what is advertised) that the hub cannot
    place on; "" when there is none."""
    for unit in units:
        if _UUID.match(unit.uuid):
            continue
        where = f"MIG instance of GPU {unit.index}" if unit.is_mig else f"GPU {unit.index}"
        fix = (
            "drivers before R470 name MIG instances so: update the NVIDIA driver (470 or newer)"
            if unit.is_mig and "/" in unit.uuid
            else "check the driver with nvidia-smi -L, and update it"
        )
        return (
            f"{where} ({unit.name}) reports the UUID {unit.uuid!r}, which cannot name a GPU to "
            f"Swarm (it takes {' or '.join(KIND_PREFIXES)} and then letters, digits and dashes); "
            f"{fix}, then run this again"
        )
    return ""


def memory_problem(unit: GPUInfo) -> str:
    """The warning for a GPU or MIG instance whose memory cannot be sliced, naming it and the
    fix; "" when it can."""
    if MIN_SLICE_MB <= unit.memory_mb < MAX_MEMORY_MB:
        return ""
    what = (
        f"less than the {MIN_SLICE_MB} MiB one slice needs"
        if unit.memory_mb < MIN_SLICE_MB
        else "more than any GPU has"
    )
    i = unit.index
    check = f"nvidia-smi mig -i {i} -lgi" if unit.is_mig else f"nvidia-smi -i {i}"
    return (
        f"{unit.described} reports {unit.memory_mb} MiB of memory, {what}, so it is skipped "
        f"(its slices would get no usable memory budget); a GPU mid-reset or failing does this: "
        f"check it ({check}; dmesg | grep -i xid), reset it once nothing runs on it "
        f"(nvidia-smi -r -i {i}) or reboot the machine, then run this again"
    )
