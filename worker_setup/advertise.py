"""Advertise this machine's GPUs (or simulated ones) as Swarm slices in daemon.json.

    python -m worker_setup.advertise [--slices-per-gpu 3 | --slice-memory 4GiB] [--mig-slices 1]
        [--simulate-gpus N | --simulate-if-no-gpu N]
        [--nvidia-runtime auto|off|PATH] [--daemon-json /etc/docker/daemon.json]
        [--dry-run] [--remove]

Writes the GPU slices (``node-generic-resources``), the ``gpu-jupyterhub.*`` engine labels and,
when the NVIDIA container runtime is installed, that runtime as the default. Every other key of
daemon.json is kept, and the previous file is backed up next to it. A GPU in MIG mode is
advertised as its MIG instances (each its own kind, ``MIG-...``, of ``--mig-slices`` slices),
never as itself; one in MIG mode without instances advertises nothing and says how to fix it.
What NVML reports is screened first (worker_setup/usable.py): a GPU or MIG instance without
usable memory (0 MiB: mid-reset) is skipped with a warning, GPUs sharing a UUID stop it; and no
GPU gets more slices than the hub uses (``contract.MAX_SLICES_PER_GPU``), or slices of less than
``slicing.MIN_SLICE_MB`` (worker_setup/slicing.py).

Exit status: 0 nothing changed, 3 daemon.json changed (or would, with --dry-run: restart the
Docker engine to apply), 1 error (one line on stderr saying how to fix it).

The worker setup (``python -m worker_setup``) uses the same steps as functions: ``plan`` works
out the GPUs and the wanted daemon.json without writing anything, ``write`` writes it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_swarm_spawner.contract import (
    FLEET_GROUP,
    FLEET_LABEL,
    KIND_PREFIXES,
    MAX_SLICES_PER_GPU,
    MIG_PROFILE_LABEL,
)

from . import daemon_config, gpus, slicing, usable

CHANGED = 3
#: The named generic resource of the original workshop's stock SwarmSpawner setup.
NAMED_KIND = "NVIDIA-GPU"
#: The binary of the NVIDIA Container Toolkit's runtime.
NVIDIA_RUNTIME = "nvidia-container-runtime"


class PlanError(Exception):
    """daemon.json cannot be planned: it is unreadable, this machine has no usable GPU, or the
    slices asked for do not fit its GPUs. The message is one line saying why and how to fix it."""


@dataclass
class Plan:
    """What advertising does to daemon.json: the GPUs found, their slices, the file as it is
    and as it should be. Nothing is written until ``write``."""

    path: Path
    current: dict
    exists: bool
    wanted: dict
    gpus: list[gpus.GPUInfo] = field(default_factory=list)
    slices: dict[str, int] = field(default_factory=dict)
    #: The NVIDIA runtime made Docker's default ("": none).
    runtime: str = ""
    #: One warning for each GPU or MIG instance NVML reported that is not advertised.
    skipped: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return self.wanted != self.current

    def diff(self) -> str:
        """The change as a unified diff of daemon.json ("" when there is none)."""
        old = self.current if self.exists else None
        return daemon_config.diff(old, self.wanted, str(self.path))

    def gpu_lines(self) -> list[str]:
        return [
            f"GPU {g.index}{' MIG' if g.is_mig else ''}: {g.uuid} {describe(g, self.slices)}"
            for g in self.gpus
        ]

    def runtime_lines(self) -> list[str]:
        if self.runtime:
            return [f"NVIDIA container runtime: {self.runtime} (made Docker's default runtime)"]
        if self.gpus and not any(g.simulated for g in self.gpus):
            return [
                f"warning: {NVIDIA_RUNTIME} not found; containers will not get the GPU "
                "(install the NVIDIA Container Toolkit, then run this again)"
            ]
        return []


def describe(gpu: gpus.GPUInfo, slices: dict[str, int]) -> str:
    """``Tesla K80 11441 MiB -> 3 slices`` (and ``(SIMULATED)``, or for a MIG instance
    ``(MIG, hardware-isolated)``)."""
    tag = " (SIMULATED)" if gpu.simulated else " (MIG, hardware-isolated)" if gpu.is_mig else ""
    return f"{gpu.name} {gpu.memory_mb} MiB -> {slices[gpu.uuid]} slices{tag}"


def summary(found: list[gpus.GPUInfo], slices: dict[str, int], skipped: int = 0) -> str:
    """``2 GPU(s): 2 NVIDIA A10 24576 MiB -> 3 slices``: the GPUs by kind, as the join's gpus
    row and ``make gpu-check`` say them; and how many were ``skipped``."""
    kinds = Counter(describe(g, slices) for g in found)
    each = "; ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    left_out = (
        f"; {skipped} skipped (see the warning{'s' if skipped > 1 else ''})" if skipped else ""
    )
    return f"{len(found)} GPU(s): {each}{left_out}"


def find_gpus(args, say: Callable[[str], None] = print) -> tuple[list[gpus.GPUInfo], list[str]]:
    """This machine's GPUs (MIG instances in place of a GPU in MIG mode), or simulated ones as
    the options say, and a warning for each GPU or MIG instance skipped (worker_setup/usable.py).
    ``say`` tells where they came from, names each GPU in MIG mode that has no instances and
    gives each warning (skipped; the others are advertised). Raises PlanError when there is no
    usable GPU and the options want one."""
    machine = args.machine_id or gpus.machine_id()
    memory = slicing.parse_size_mb(args.simulated_memory)
    if args.simulate_gpus:
        return gpus.simulated(args.simulate_gpus, machine, memory), []
    try:
        found, reason, failed = gpus.discover(gpus.load_nvml()), "", None
    except gpus.NVMLUnavailable as e:
        found, reason, failed = [], str(e), e
    if found:
        screened = usable.screen(found)
        if screened.units:
            for note in screened.notes:
                say(note)
            for line in screened.skipped:
                say(f"warning: {line}")
            return screened.units, screened.skipped
        # GPUs sharing a UUID; or every GPU skipped, or in MIG mode without instances
        reason = screened.refusal or "; ".join(screened.notes + screened.skipped)
    # No usable GPU: simulated ones, none at all, or stop (in that order of the options). One
    # failed GPU makes the whole machine unusable: its fix (a reboot or GPU reset) stops every
    # server here, so it is done before participants arrive, not under them.
    if args.simulate_if_no_gpu:
        if reason:
            say(f"no NVIDIA GPU usable here ({reason}); advertising SIMULATED GPUs")
        return gpus.simulated(args.simulate_if_no_gpu, machine, memory), []
    if args.none_if_no_gpu:
        why = f"no NVIDIA GPU usable here ({reason})" if reason else "NVML reports no GPU here"
        say(f"{why}; this machine advertises no GPU slices")
        return [], []
    test_machine = "For a test machine without a working GPU, pass --simulate-gpus N instead."
    if isinstance(failed, gpus.GPUFailed):
        raise PlanError(
            f"{reason}. Until then this machine advertises none of its GPUs, not even the "
            "working ones: the fix stops every server here, so it belongs before participants "
            f"start, not under them. {test_machine}"
        )
    if reason:
        raise PlanError(f"{reason}. {test_machine}")
    raise PlanError("NVML reports no GPU on this machine; pass --simulate-gpus N to test.")


def nvidia_runtime(setting: str) -> str:
    """The runtime binary to make the default, or "" for none."""
    if setting == "off":
        return ""
    if setting == "auto":
        return shutil.which(NVIDIA_RUNTIME) or ""
    if not Path(setting).exists():
        raise PlanError(f"--nvidia-runtime {setting}: no such file; give its path, auto or off")
    return setting


def read_config(path: Path) -> tuple[dict, bool]:
    """daemon.json as it is (``{}`` when missing), and whether it exists."""
    exists = path.exists()
    try:
        return daemon_config.parse(path.read_text() if exists else "", str(path)), exists
    except daemon_config.InvalidDaemonConfig as e:
        raise PlanError(str(e)) from None
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror}; run as root") from None


def plan(args, path: Path | str, remove: bool = False, say=print) -> Plan:
    """What daemon.json at ``path`` should hold for this machine's GPUs (``args``: the options
    of ``add_gpu_arguments``), or without any GPU settings (``remove``). Writes nothing."""
    path = Path(path)
    current, exists = read_config(path)
    found, skipped = ([], []) if remove else find_gpus(args, say)
    if not found:
        wanted = daemon_config.merge(current, [], KIND_PREFIXES, NAMED_KIND, labels=[])
        return Plan(path, current, exists, wanted, skipped=skipped)
    mig_slices = getattr(args, "mig_slices", 1)
    slices = slicing.slices_per_gpu(found, args.slices_per_gpu, args.slice_memory_mb, mig_slices)
    asked = (
        f"--slice-memory {args.slice_memory}"
        if args.slice_memory_mb
        else f"--slices-per-gpu {args.slices_per_gpu}"
    )
    try:
        slicing.check_slices(found, slices, asked)
    except ValueError as e:
        raise PlanError(f"{e}. Nothing was changed.") from None
    entries = daemon_config.slice_resources(slices, args.named_kind)
    labels = daemon_config.engine_labels(found, slices) + [
        f"{MIG_PROFILE_LABEL}{g.uuid}={g.profile}" for g in found if g.is_mig and g.profile
    ]
    if getattr(args, "fleet_group", False):  # the join's --fleet-group (the start-up script's)
        labels.append(f"{FLEET_LABEL}={FLEET_GROUP}")
    wanted = daemon_config.merge(current, entries, KIND_PREFIXES, NAMED_KIND, labels=labels)
    if args.registry:
        wanted = daemon_config.with_insecure_registry(wanted, args.registry)
    runtime = nvidia_runtime(args.nvidia_runtime)
    if runtime:
        wanted = daemon_config.with_nvidia_runtime(wanted, runtime)
    return Plan(path, current, exists, wanted, found, slices, runtime, skipped)


def write(path: Path, config: dict) -> Path | None:
    """Write atomically, keeping the previous version next to it; returns that backup."""
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d%H%M%S')}")
        shutil.copy2(path, backup)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(daemon_config.render(config))
    tmp.replace(path)
    return backup


def add_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that say which GPUs this machine advertises and how (shared with
    ``python -m worker_setup``); ``check_gpu_arguments`` completes them after parsing."""
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--slices-per-gpu",
        type=int,
        metavar="N",
        help=f"slices per GPU (3; at most {MAX_SLICES_PER_GPU}, the hub's limit)",
    )
    size.add_argument("--slice-memory", metavar="SIZE", help="or: GPU memory per slice, e.g. 4GiB")
    parser.add_argument(
        "--mig-slices",
        type=int,
        default=1,
        metavar="N",
        help="slices per MIG instance of a GPU in MIG mode (1: the instance is the slice)",
    )
    parser.add_argument(
        "--simulate-gpus", type=int, default=0, metavar="N", help="advertise N simulated GPUs"
    )
    parser.add_argument(
        "--simulated-memory", default="16GiB", metavar="SIZE", help="of each simulated GPU"
    )
    parser.add_argument(
        "--machine-id",
        default="",
        help="seed for simulated GPU UUIDs (default: /etc/machine-id); differs per machine",
    )
    parser.add_argument(
        "--named-kind",
        default="",
        metavar="KIND",
        help=f"also advertise each slice as a named {NAMED_KIND} slot, for a stock "
        "SwarmSpawner asking for {'generic_resources': {'" + NAMED_KIND + "': 1}}",
    )
    parser.add_argument(
        "--nvidia-runtime",
        default="auto",
        metavar="auto|off|PATH",
        help=f"make the NVIDIA runtime Docker's default (auto: when {NVIDIA_RUNTIME} exists)",
    )
    parser.add_argument(
        "--registry",
        default="",
        metavar="HOST:PORT",
        help="the manager's image registry (plain HTTP): added to insecure-registries",
    )


def check_gpu_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Refuse, with what to write instead, the counts and sizes the hub could not use: more
    slices than its limit of MAX_SLICES_PER_GPU a GPU, a slice of less than MIN_SLICE_MB."""
    for option, value in (
        ("--slices-per-gpu", args.slices_per_gpu),
        ("--mig-slices", args.mig_slices),
    ):
        if value is not None and value < 1:
            parser.error(f"{option} must be 1 or more, got {value}")
        if value is not None and value > MAX_SLICES_PER_GPU:
            parser.error(
                f"{option} {value} is more than the hub's limit of {MAX_SLICES_PER_GPU} slices "
                f"a GPU; give {MAX_SLICES_PER_GPU} or less"
            )
    sizes = {"--slice-memory": args.slice_memory, "--simulated-memory": args.simulated_memory}
    for option, text in sizes.items():
        try:
            mb = slicing.parse_size_mb(text) if text else None
        except ValueError as e:
            parser.error(f"{option}: {e}")
        if mb is not None and mb < slicing.MIN_SLICE_MB:
            parser.error(
                f"{option} {text} is less than the {slicing.MIN_SLICE_MB} MiB a CUDA program "
                f"needs to start; give {slicing.MIN_SLICE_MB}MiB or more"
            )
        if option == "--slice-memory":
            args.slice_memory_mb = mb
    if args.slice_memory_mb is None and args.slices_per_gpu is None:
        args.slices_per_gpu = 3


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_gpu_arguments(parser)
    parser.add_argument("--simulate-if-no-gpu", type=int, default=0, metavar="N")
    parser.add_argument(
        "--none-if-no-gpu",
        action="store_true",
        help="a machine without a usable GPU advertises no slices instead of stopping "
        "(a manager that only runs the hub)",
    )
    parser.add_argument("--daemon-json", default="/etc/docker/daemon.json")
    parser.add_argument("--remove", action="store_true", help="take the GPU settings out again")
    parser.add_argument("--dry-run", action="store_true", help="print the change, write nothing")
    args = parser.parse_args(argv)
    check_gpu_arguments(parser, args)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        planned = plan(args, args.daemon_json, remove=args.remove)
    except PlanError as e:
        print(e, file=sys.stderr)
        return 1
    for line in planned.gpu_lines() + planned.runtime_lines():
        print(line)
    path = planned.path
    if not planned.changes:
        print(f"{path}: already as wanted; nothing to change")
        return 0
    if args.dry_run:
        print(f"{path} would change:\n{planned.diff()}")
        return CHANGED
    backup = write(path, planned.wanted)
    if backup:
        print(f"{path}: previous version saved as {backup}")
    print(f"{path}: updated; restart the Docker engine to apply")
    return CHANGED


if __name__ == "__main__":
    sys.exit(main())
