"""Advertise this machine's GPUs (or simulated ones) as Swarm slices in daemon.json.

    python -m worker_setup.advertise [--slices-per-gpu 3 | --slice-memory 4GiB]
        [--simulate-gpus N | --simulate-if-no-gpu N | --nvml-fixture FILE]
        [--nvidia-runtime auto|off|PATH] [--daemon-json /etc/docker/daemon.json]
        [--dry-run] [--remove]

Writes the GPU slices (``node-generic-resources``), the ``gpu-jupyterhub.*`` engine labels and,
when the NVIDIA container runtime is installed, that runtime as the default. Every other key of
daemon.json is kept, and the previous file is backed up next to it.

Exit status: 0 nothing changed, 3 daemon.json changed (or would, with --dry-run: restart the
Docker engine to apply), 1 error (one line on stderr saying how to fix it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from . import daemon_config, gpus, slicing
from .fake_nvml import FakeNVML

CHANGED = 3
#: The named generic resource of the original workshop's stock SwarmSpawner setup.
NAMED_KIND = "NVIDIA-GPU"
#: The binary of the NVIDIA Container Toolkit's runtime.
NVIDIA_RUNTIME = "nvidia-container-runtime"


def choose_gpus(args) -> list[gpus.GPUInfo]:
    machine = args.machine_id or gpus.machine_id()
    memory = slicing.parse_size_mb(args.simulated_memory)
    if args.simulate_gpus:
        return gpus.simulated(args.simulate_gpus, machine, memory)
    try:
        if args.nvml_fixture:
            print(f"FAKE NVML: GPUs from the fixture {args.nvml_fixture}, not from a driver")
            nvml = FakeNVML.from_file(args.nvml_fixture)
        else:
            nvml = gpus.load_nvml()
        found, reason, failed = gpus.discover(nvml), "", None
    except gpus.NVMLUnavailable as e:
        found, reason, failed = [], str(e), e
    if found:
        return found
    # No usable GPU: simulated ones, none at all, or stop (in that order of the options). One
    # failed GPU makes the whole machine unusable: its fix (a reboot or GPU reset) stops every
    # server here, so it is done before participants arrive, not under them.
    if args.simulate_if_no_gpu:
        if reason:
            print(f"no NVIDIA GPU usable here ({reason}); advertising SIMULATED GPUs")
        return gpus.simulated(args.simulate_if_no_gpu, machine, memory)
    if args.none_if_no_gpu:
        why = f"no NVIDIA GPU usable here ({reason})" if reason else "NVML reports no GPU here"
        print(f"{why}; this machine advertises no GPU slices")
        return []
    test_machine = "For a test machine without a working GPU, pass --simulate-gpus N instead."
    if isinstance(failed, gpus.GPUFailed):
        raise SystemExit(
            f"{reason}. Until then this machine advertises none of its GPUs, not even the "
            "working ones: the fix stops every server here, so it belongs before participants "
            f"start, not under them. {test_machine}"
        )
    if reason:
        raise SystemExit(f"{reason}. {test_machine}")
    raise SystemExit("NVML reports no GPU on this machine; pass --simulate-gpus N to test.")


def nvidia_runtime(setting: str) -> str:
    """The runtime binary to make the default, or "" for none."""
    if setting == "off":
        return ""
    if setting == "auto":
        return shutil.which(NVIDIA_RUNTIME) or ""
    if not Path(setting).exists():
        raise SystemExit(f"--nvidia-runtime {setting}: no such file; give its path, auto or off")
    return setting


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--slices-per-gpu", type=int, metavar="N", help="slices per GPU (3)")
    size.add_argument("--slice-memory", metavar="SIZE", help="or: GPU memory per slice, e.g. 4GiB")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    source.add_argument(
        "--nvml-fixture", metavar="FILE", help="read GPUs from a fake NVML fixture (tests)"
    )
    parser.add_argument("--simulate-if-no-gpu", type=int, default=0, metavar="N")
    parser.add_argument(
        "--none-if-no-gpu",
        action="store_true",
        help="a machine without a usable GPU advertises no slices instead of stopping "
        "(a manager that only runs the hub)",
    )
    parser.add_argument("--simulated-memory", default="16GiB", metavar="SIZE")
    parser.add_argument("--daemon-json", default="/etc/docker/daemon.json")
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
    parser.add_argument("--remove", action="store_true", help="take the GPU settings out again")
    parser.add_argument("--dry-run", action="store_true", help="print the change, write nothing")
    args = parser.parse_args(argv)
    if args.slices_per_gpu is not None and args.slices_per_gpu < 1:
        parser.error(f"--slices-per-gpu must be 1 or more, got {args.slices_per_gpu}")
    try:
        args.slice_memory_mb = (
            slicing.parse_size_mb(args.slice_memory) if args.slice_memory else None
        )
        slicing.parse_size_mb(args.simulated_memory)
    except ValueError as e:
        parser.error(str(e))
    if args.slice_memory_mb is None and args.slices_per_gpu is None:
        args.slices_per_gpu = 3
    return args


def wanted_config(args, current: dict) -> dict:
    if args.remove:
        return daemon_config.merge(current, [], named_kind=NAMED_KIND, labels=[])
    found = choose_gpus(args)
    if not found:
        return daemon_config.merge(current, [], named_kind=NAMED_KIND, labels=[])
    slices = slicing.slices_per_gpu(found, args.slices_per_gpu, args.slice_memory_mb)
    for g in found:
        tag = " (SIMULATED)" if g.simulated else ""
        print(f"GPU {g.index}: {g.uuid} {g.name} {g.memory_mb} MiB -> {slices[g.uuid]} slices{tag}")
    entries = daemon_config.slice_resources(slices, args.named_kind)
    labels = daemon_config.engine_labels(found, slices)
    wanted = daemon_config.merge(current, entries, named_kind=NAMED_KIND, labels=labels)
    if args.registry:
        wanted = daemon_config.with_insecure_registry(wanted, args.registry)
    runtime = nvidia_runtime(args.nvidia_runtime)
    if runtime:
        print(f"NVIDIA container runtime: {runtime} (made Docker's default runtime)")
        wanted = daemon_config.with_nvidia_runtime(wanted, runtime)
    elif not any(g.simulated for g in found):
        print(
            f"warning: {NVIDIA_RUNTIME} not found; containers will not get the GPU "
            "(install the NVIDIA Container Toolkit, then run this again)"
        )
    return wanted


def write(path: Path, config: dict) -> None:
    """Write atomically, keeping the previous version next to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d%H%M%S')}")
        shutil.copy2(path, backup)
        print(f"{path}: previous version saved as {backup}")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(daemon_config.render(config))
    tmp.replace(path)


def main(argv=None) -> int:
    args = parse_args(argv)
    path = Path(args.daemon_json)
    exists = path.exists()
    try:
        current = daemon_config.parse(path.read_text() if exists else "", str(path))
    except daemon_config.InvalidDaemonConfig as e:
        print(e, file=sys.stderr)
        return 1
    except OSError as e:
        print(f"cannot read {path}: {e.strerror}; run as root", file=sys.stderr)
        return 1
    wanted = wanted_config(args, current)
    if wanted == current:
        print(f"{path}: already as wanted; nothing to change")
        return 0
    if args.dry_run:
        change = daemon_config.diff(current if exists else None, wanted, str(path))
        print(f"{path} would change:\n{change}")
        return CHANGED
    write(path, wanted)
    print(f"{path}: updated; restart the Docker engine to apply")
    return CHANGED


if __name__ == "__main__":
    sys.exit(main())
