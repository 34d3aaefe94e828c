"""How many slices each GPU is split into: pure functions, no I/O.

Either a fixed count per GPU (``--slices-per-gpu 3``, the original workshop's choice) or a memory
budget per slice (``--slice-memory 4GiB``): a 12 GiB K80 then gives 3 slices, an 80 GiB H100 20.
A MIG instance (``MIG-...``) gets its own count instead (``--mig-slices``, 1): the hardware
partition is the slice.

``check_slices`` refuses what the hub could not use: more than ``MAX_SLICES_PER_GPU`` slices of
one GPU (the hub's own limit), or a slice of less than ``MIN_SLICE_MB``, whose memory budget no
CUDA program fits in.
"""

from __future__ import annotations

import math
import re

from gpu_swarm_spawner.contract import MAX_SLICES_PER_GPU, is_mig

#: The least GPU memory a slice may stand for, in MiB: a CUDA context alone takes about this
#: much, so a server with a smaller budget could not start a GPU program without being over it.
MIN_SLICE_MB = 256

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


def check_slices(gpus: list, slices: dict[str, int], option: str) -> None:
    """Raise ValueError (one line: the GPU, what the option gives it, what to give instead) when
    ``slices`` (``{uuid: slices}`` for ``gpus``, GPUInfo objects) gives one more slices than the
    hub uses, or slices of less than ``MIN_SLICE_MB``. ``option`` is how the count was asked
    for (``--slices-per-gpu 64``, ``--slice-memory 1GiB``); a MIG instance's comes from
    ``--mig-slices``."""
    for gpu in gpus:
        n = slices[gpu.uuid]
        asked = f"--mig-slices {n}" if is_mig(gpu.uuid) else option
        flag = asked.split()[0]
        by_memory = flag == "--slice-memory"
        if n > MAX_SLICES_PER_GPU:
            least = math.ceil(gpu.memory_mb / MAX_SLICES_PER_GPU)
            fix = (
                f"{flag} {least}MiB or more"
                if by_memory
                else f"{flag} {MAX_SLICES_PER_GPU} or less"
            )
            raise ValueError(
                f"{asked} gives {gpu.described} {n} slices, more than the hub's limit of "
                f"{MAX_SLICES_PER_GPU} slices a GPU; give {fix}"
            )
        if gpu.memory_mb // n < MIN_SLICE_MB:
            most = max(1, gpu.memory_mb // MIN_SLICE_MB)
            fix = f"{flag} {MIN_SLICE_MB}MiB or more" if by_memory else f"{flag} {most} or less"
            raise ValueError(
                f"{asked} leaves {gpu.described} {gpu.memory_mb // n} MiB a slice, less than the "
                f"{MIN_SLICE_MB} MiB a CUDA program needs to start; give {fix}"
            )
