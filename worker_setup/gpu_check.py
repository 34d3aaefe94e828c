"""`make gpu-check`: on a GPU machine, what NVML finds, the slices the join would advertise and
the GPU guard's reading. Changes nothing; needs neither Docker nor root.

    python -m worker_setup.gpu_check [--slices-per-gpu N | --slice-memory SIZE] [--mig-slices N]
        [--no-allocation]

It prints

1. the NVIDIA driver's and NVML's versions;
2. every GPU: index, UUID, name, memory, MIG mode and its MIG instances (UUID, profile, memory);
3. the slices the join (worker_setup/setup.sh) would advertise for them, worked out as
   ``python -m worker_setup.advertise`` does, without daemon.json;
4. one reading of the GPU guard (worker_setup.telemetry): each GPU's utilisation, memory,
   temperature and power, and the GPU processes with their memory;
5. with torch or cupy importable (and no ``--no-allocation``): 256 MiB allocated on cuda:0 by
   this process, NVML read again, and the memory NVML reports for this process's pid beside
   the 256 MiB; that figure (the CUDA context included) is what the guard holds against a
   participant's budget. The memory is freed before it ends.

Exit status: 0 NVML works and the join would advertise these GPUs; 1 NVML cannot start (one
line saying how to fix it), or a GPU failed or none can be advertised (the join stops there
too; everything that could be read is printed first, the last line says why).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable

from . import advertise, gpus, slicing, telemetry, usable

#: What is allocated on cuda:0 to see NVML count it for this process.
ALLOCATION_MIB = 256
#: The CUDA frameworks tried for the allocation, in this order.
FRAMEWORKS = ("torch", "cupy")
MIB = 1024 * 1024


class CheckFailed(Exception):
    """NVML cannot be used here, or the join would stop: one line saying why and the fix."""


def start_nvml():
    """NVML (worker_setup.gpus.load_nvml), started; CheckFailed when it cannot be."""
    try:
        nvml = gpus.load_nvml()
    except gpus.NVMLUnavailable as e:
        raise CheckFailed(str(e)) from None
    try:
        nvml.nvmlInit()
    except Exception as e:  # pynvml's NVMLError, whatever the library's state
        reason = gpus.nvml_reason(e)
        fix = gpus.fix_for(reason, "is the NVIDIA driver installed? (nvidia-smi)")
        raise CheckFailed(f"NVML cannot start: {reason}; {fix}") from None
    return nvml


def versions(nvml) -> str:
    """``NVIDIA driver 550.54.15, NVML 12.550.54.15`` (``?`` and the reason for one that fails)."""
    found = []
    for what, call in (
        ("NVIDIA driver", nvml.nvmlSystemGetDriverVersion),
        ("NVML", nvml.nvmlSystemGetNVMLVersion),
    ):
        try:
            found.append(f"{what} {gpus.nvml_text(call())}")
        except nvml.NVMLError as e:
            found.append(f"{what} ? ({gpus.nvml_reason(e)})")
    return ", ".join(found)


def read_gpus(nvml) -> list[gpus.GPUInfo | gpus.GPUFailed]:
    """Every GPU as the join reads it (worker_setup.gpus), or how it failed, by index."""
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        reason = gpus.nvml_reason(e)
        raise CheckFailed(
            f"NVML could not count the GPUs: {reason}; {gpus.fix_for(reason, gpus.GPU_FIX)}"
        ) from None
    found: list[gpus.GPUInfo | gpus.GPUFailed] = []
    for index in range(count):
        try:
            found.append(gpus.read_gpu(nvml, index))
        except gpus.GPUFailed as e:
            found.append(e)
    return found


def gpu_lines(found: list[gpus.GPUInfo | gpus.GPUFailed]) -> list[str]:
    lines = []
    for gpu in found:
        if isinstance(gpu, gpus.GPUFailed):
            lines.append(f"  {gpu}")
            continue
        if not gpu.mig_mode:
            mig = "MIG off"
        elif gpu.mig_instances:
            mig = f"MIG on, {len(gpu.mig_instances)} instance(s):"
        else:
            mig = "MIG on, no instances"
        lines.append(f"  GPU {gpu.index}: {gpu.uuid}  {gpu.name}  {gpu.memory_mb} MiB  {mig}")
        lines += [
            f"    {m.uuid}  {m.profile or m.name}  {m.memory_mb} MiB" for m in gpu.mig_instances
        ]
    return lines


def slice_lines(found: list[gpus.GPUInfo], args) -> tuple[list[str], int]:
    """What the join would advertise for ``found`` (GPUs read without failing), as its gpus
    step says it, with what it would skip or refuse (worker_setup/usable.py and the slice
    checks); and the slices in all (0: the join stops)."""
    screened = usable.screen(found)
    if args.slice_memory_mb:
        how = f"{args.slice_memory_mb} MiB of GPU memory a slice"
        asked = f"--slice-memory {args.slice_memory}"
    else:
        how = f"{args.slices_per_gpu} a GPU"
        asked = f"--slices-per-gpu {args.slices_per_gpu}"
    lines = [f"Slices the join would advertise ({how}, {args.mig_slices} a MIG instance):"]
    units = screened.units
    said = [*screened.notes, *(f"warning: {line}" for line in screened.skipped)]
    if screened.refusal:
        said = [screened.refusal]
    if not units:
        return lines + [f"  {line}" for line in said] + ["  none"], 0
    slices = slicing.slices_per_gpu(
        units, args.slices_per_gpu, args.slice_memory_mb, args.mig_slices
    )
    try:
        slicing.check_slices(units, slices, asked)
    except ValueError as e:
        return lines + [f"  {e}", "  none"], 0
    lines.append(f"  {advertise.summary(units, slices, len(screened.skipped))}")
    lines += [
        f"  GPU {g.index}{' MIG' if g.is_mig else ''}: {g.uuid} -> {slices[g.uuid]} slices"
        for g in units
    ]
    lines += [f"  {line}" for line in said]
    return lines, sum(slices.values())


def reading_lines(snapshot: telemetry.Snapshot) -> list[str]:
    """One reading of the guard: each GPU (and MIG instance) with its processes."""
    by_gpu: dict[str, list[telemetry.ProcessUse]] = {}
    for p in snapshot.processes:
        by_gpu.setdefault(p.gpu_uuid, []).append(p)
    lines = []
    for g in snapshot.gpus:
        used = "?" if g.memory_used_mb is None else g.memory_used_mb
        figures = [
            f"{g.utilization_percent}% busy" if g.utilization_percent is not None else "",
            f"{g.temperature_c} C" if g.temperature_c is not None else "",
            f"{g.power_w:.0f} W" if g.power_w is not None else "",
        ]
        where = f"GPU {g.index}{' MIG' if g.parent_uuid else ''}"
        parts = [f"{where}: {g.uuid}", g.name, f"{used} of {g.memory_total_mb} MiB used"]
        lines.append("  " + "  ".join(part for part in parts + figures if part))
        for p in by_gpu.get(g.uuid, []):
            mb = "? MiB (NVML cannot say)" if p.used_mb is None else f"{p.used_mb} MiB"
            lines.append(f"    pid {p.pid}: {mb}")
    if not snapshot.gpus:
        lines.append("  no GPU")
    lines += [f"  error: {e}" for e in snapshot.errors]
    return lines


def cuda_framework(names: tuple[str, ...] = FRAMEWORKS):
    """The first of ``names`` that imports (a module), or None."""
    for name in names:
        try:
            return importlib.import_module(name)
        except (ImportError, OSError):  # OSError: a CUDA library it needs is missing
            continue
    return None


def _allocate(framework, size: int):
    """``size`` bytes on cuda:0 with ``framework`` (torch or cupy): the buffer, and what
    gives its memory back once the buffer is dropped."""
    if framework.__name__ == "cupy":
        framework.cuda.Device(0).use()
        buffer = framework.empty(size, dtype=framework.uint8)
        return buffer, framework.get_default_memory_pool().free_all_blocks
    if not framework.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False (no CUDA device, or a CPU torch)")
    buffer = framework.empty(size, dtype=framework.uint8, device="cuda:0")
    return buffer, framework.cuda.empty_cache


def check_allocation(
    framework, nvml, mib: int = ALLOCATION_MIB, say: Callable[[str], None] = print
) -> bool:
    """Allocate ``mib`` MiB on cuda:0 in this process with ``framework`` (the torch or cupy
    module), read NVML (started) before and after, say what NVML reports for this process's
    pid beside what was allocated, and free it. False when nothing could be allocated or NVML
    does not list this process."""
    name, pid = framework.__name__, os.getpid()
    before = telemetry.read(nvml)
    try:
        buffer, free = _allocate(framework, mib * MIB)
    except Exception as e:  # no device, out of memory, a broken install: said, not raised
        say(f"  {name} could not allocate {mib} MiB on cuda:0: {e}")
        return False
    try:
        after = telemetry.read(nvml)
    finally:
        del buffer
        free()
    say(f"  allocated {mib} MiB on cuda:0 with {name} in this process (pid {pid}), freed again")
    mine = [p for p in after.processes if p.pid == pid]
    if not mine:
        say(
            f"  warning: NVML lists no GPU process with pid {pid}, so the guard could not see "
            "this memory (in a container NVML gives the host's pids: run this on the host)"
        )
        return False
    used_before = {g.uuid: g.memory_used_mb for g in before.gpus}
    for p in mine:
        held = "? MiB (NVML cannot say)" if p.used_mb is None else f"{p.used_mb} MiB"
        say(
            f"  NVML: pid {pid} holds {held} on {p.gpu_uuid}, for {mib} MiB allocated (the "
            "CUDA context counts too: this is what the guard holds against a budget)"
        )
        gpu = next((g for g in after.gpus if g.uuid == p.gpu_uuid), None)
        if gpu is not None:
            was = used_before.get(gpu.uuid)
            say(
                f"  {gpu.uuid}: {'?' if was is None else was} MiB in use before, "
                f"{'?' if gpu.memory_used_mb is None else gpu.memory_used_mb} MiB with it"
            )
    return True


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"write a whole number, 1 or more, not {text!r}")
    return n


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m worker_setup.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--slices-per-gpu", type=_at_least_one, metavar="N", help="as given to the join (3)"
    )
    size.add_argument("--slice-memory", metavar="SIZE", help="or: GPU memory per slice, e.g. 4GiB")
    parser.add_argument(
        "--mig-slices", type=_at_least_one, default=1, metavar="N", help="slices per MIG instance"
    )
    parser.add_argument(
        "--no-allocation",
        action="store_true",
        help=f"do not allocate {ALLOCATION_MIB} MiB on cuda:0 (a machine in use)",
    )
    args = parser.parse_args(argv)
    try:
        args.slice_memory_mb = (
            slicing.parse_size_mb(args.slice_memory) if args.slice_memory else None
        )
    except ValueError as e:
        parser.error(str(e))
    if args.slice_memory_mb is None and args.slices_per_gpu is None:
        args.slices_per_gpu = 3
    return args


def allocate(nvml, args, found: list) -> None:
    """``check_allocation`` with the first CUDA framework here, or the line saying why not."""
    if args.no_allocation:
        print("  skipped (--no-allocation)")
        return
    if not found:
        print("  skipped: no GPU")
        return
    framework = cuda_framework()
    if framework is None:
        print(
            f"  skipped: neither {' nor '.join(FRAMEWORKS)} can be imported by {sys.executable}"
            " (with one installed, this allocates on cuda:0 and compares NVML's figure)"
        )
        return
    check_allocation(framework, nvml)


def check(nvml, args) -> str:
    """Print what NVML, the join and the guard see; the last line (success). CheckFailed
    when the join would stop, after everything that could be read is printed."""
    print(versions(nvml))
    found = read_gpus(nvml)
    print(f"\nGPUs (NVML): {len(found)}")
    print("\n".join(gpu_lines(found)))
    failed = [g for g in found if isinstance(g, gpus.GPUFailed)]
    if failed:
        lines = ["Slices the join would advertise: none, while a GPU has failed"]
        total = 0
    else:
        lines, total = slice_lines(found, args)
    print("\n" + "\n".join(lines))
    print("\nThe GPU guard's reading (one round, as every 5 s):")
    print("\n".join(reading_lines(telemetry.read(nvml))))
    print(f"\nAllocation ({ALLOCATION_MIB} MiB on cuda:0, read back from NVML):")
    allocate(nvml, args, found)
    if failed:
        raise CheckFailed(
            f"{failed[0]}. The join would stop there too: this machine advertises none of its "
            "GPUs until it is fixed"
        )
    if not total:
        why = "NVML reports no GPU" if not found else "no GPU of this machine can be advertised"
        raise CheckFailed(f"{why}; the join would stop there (see above)")
    return f"GPU check: NVML works; the join would advertise {total} slices"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        nvml = start_nvml()
    except CheckFailed as e:
        print(e, file=sys.stderr)
        return 1
    try:
        done = check(nvml, args)
    except CheckFailed as e:
        print(f"GPU check failed: {e}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    print(f"\n{done}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
