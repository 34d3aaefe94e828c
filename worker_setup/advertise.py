"""Advertise this machine's GPUs (or simulated ones) as Swarm slices in daemon.json.

    python -m worker_setup.advertise [--slices-per-gpu 3]
        [--simulate-gpus N | --simulate-if-no-gpu N]
        [--daemon-json /etc/docker/daemon.json] [--dry-run]

Exit status: 0 nothing changed, 3 daemon.json changed (restart the Docker engine to apply),
1 error (one line on stderr saying how to fix it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from . import daemon_config, gpus

CHANGED = 3
#: The named generic resource of the original workshop's stock SwarmSpawner setup.
NAMED_KIND = "NVIDIA-GPU"


def choose_gpus(args) -> list[gpus.GPUInfo]:
    machine = args.machine_id or gpus.machine_id()
    if args.simulate_gpus:
        return gpus.simulated(args.simulate_gpus, machine)
    try:
        found = gpus.discover(gpus.load_nvml())
    except gpus.NVMLUnavailable as e:
        if args.simulate_if_no_gpu:
            print(f"no NVIDIA GPU usable here ({e}); advertising SIMULATED GPUs")
            return gpus.simulated(args.simulate_if_no_gpu, machine)
        raise SystemExit(
            f"{e}. Install the NVIDIA driver, or pass --simulate-gpus N for a test machine."
        ) from None
    if not found:
        if args.simulate_if_no_gpu:
            return gpus.simulated(args.simulate_if_no_gpu, machine)
        raise SystemExit("NVML reports no GPU on this machine; pass --simulate-gpus N to test.")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices-per-gpu", type=int, default=3)
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--simulate-if-no-gpu", type=int, default=0, metavar="N")
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
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.slices_per_gpu < 1:
        parser.error(f"--slices-per-gpu must be 1 or more, got {args.slices_per_gpu}")

    path = Path(args.daemon_json)
    try:
        current = daemon_config.parse(path.read_text() if path.exists() else "", str(path))
    except daemon_config.InvalidDaemonConfig as e:
        print(e, file=sys.stderr)
        return 1
    found = choose_gpus(args)
    entries = daemon_config.slice_resources(
        [g.uuid for g in found], args.slices_per_gpu, args.named_kind
    )
    labels = daemon_config.engine_labels(found, args.slices_per_gpu)
    wanted = daemon_config.merge(current, entries, named_kind=NAMED_KIND, labels=labels)
    for g in found:
        tag = " (SIMULATED)" if g.simulated else ""
        slices = args.slices_per_gpu
        print(f"GPU {g.index}: {g.uuid} {g.name} {g.memory_mb} MiB -> {slices} slices{tag}")
    if wanted == current:
        print(f"{path}: already advertises these slices; nothing to change")
        return 0
    if args.dry_run:
        print(f"{path} would become:\n{daemon_config.render(wanted)}")
        return CHANGED
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d%H%M%S')}")
        shutil.copy2(path, backup)
        print(f"{path}: previous version saved as {backup}")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(daemon_config.render(wanted))
    tmp.replace(path)
    print(f"{path}: updated; restart the Docker engine to apply")
    return CHANGED


if __name__ == "__main__":
    sys.exit(main())
