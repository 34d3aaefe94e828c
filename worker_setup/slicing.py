"""How many slices each GPU is split into: pure functions, no I/O.

Either a fixed count per GPU (``--slices-per-gpu 3``, the original workshop's choice) or a memory
budget per slice (``--slice-memory 4GiB``): a 12 GiB K80 then gives 3 slices, an 80 GiB H100 20.
A MIG instance (``MIG-...``) gets its own count instead (``--mig-slices``, 1): the hardware
partition is the slice.
"""

from __future__ import annotations

import re

from gpu_swarm_spawner.contract import is_mig

_UNITS_MB = {"": 1, "m": 1, "mb": 1, "mib": 1, "g": 1024, "gb": 1024, "gib": 1024}


def parse_size_mb(text: str) -> int:
    """A memory size such as ``4GiB``, ``4G``, ``4096MiB`` or ``4096`` (MiB), in MiB."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS_MB:
        raise ValueError(
            f"cannot read {text!r} as a memory size; write it like 4GiB, 4096MiB or 4096 (MiB)"
        )
    size = int(float(match.group(1)) * _UNITS_MB[unit])
    if size < 1:
        raise ValueError(f"a slice needs some memory, not {text!r}")
    return size


def slices_per_gpu(
    gpus: list, fixed: int | None = None, slice_memory_mb: int | None = None, mig_slices: int = 1
) -> dict[str, int]:
    """``{uuid: slices}`` for ``gpus`` (objects with ``uuid`` and ``memory_mb``).

    Exactly one of ``fixed`` and ``slice_memory_mb`` is given. With a memory budget, every
    GPU gets as many whole slices as fit, and at least one. MIG instances get ``mig_slices``
    each, whichever is given.
    """
    if (fixed is None) == (slice_memory_mb is None):
        raise ValueError("give either a number of slices per GPU or a memory size per slice")
    if mig_slices < 1:
        raise ValueError(f"slices per MIG instance must be 1 or more, got {mig_slices}")
    if fixed is not None:
        if fixed < 1:
            raise ValueError(f"slices per GPU must be 1 or more, got {fixed}")
        per_gpu = dict.fromkeys((g.uuid for g in gpus), fixed)
    else:
        if slice_memory_mb < 1:
            raise ValueError(f"memory per slice must be at least 1 MiB, got {slice_memory_mb}")
        per_gpu = {g.uuid: max(1, g.memory_mb // slice_memory_mb) for g in gpus}
    return {uuid: mig_slices if is_mig(uuid) else n for uuid, n in per_gpu.items()}
