"""``python -m worker_setup``: join this GPU machine to the hub's swarm, or leave it.

worker_setup/setup.sh runs it with a python that has nvidia-ml-py; the steps are in join.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from gpu_swarm_spawner import contract

from . import advertise, guard_service, join, shared_folders
from .docker_cli import DockerCLI

DAEMON_JSON = "/etc/docker/daemon.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="worker_setup/setup.sh",
        usage="sudo ./worker_setup/setup.sh --manager ADDR[:2377] --token SWMTKN-... "
        "[options]\n       sudo ./worker_setup/setup.sh --leave [--wait SECONDS] [--force] "
        "[--dry-run]",
        description=join.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    joining = parser.add_argument_group("joining (the line 'make join-command' prints)")
    joining.add_argument("--manager", metavar="ADDR[:PORT]", help="the swarm's manager (:2377)")
    joining.add_argument("--token", metavar="SWMTKN-...", help="the swarm's worker join token")
    joining.add_argument(
        "--advertise-addr", default="", metavar="ADDR", help="this machine's swarm address"
    )
    joining.add_argument(
        "--image",
        default=contract.SINGLEUSER_IMAGE,
        metavar="NAME",
        help="the single-user image by the hub's name (GPUHUB_SINGLEUSER_IMAGE; default: "
        "%(default)s)",
    )
    joining.add_argument(
        "--image-tar",
        default="",
        metavar="FILE",
        help="the single-user image, from 'make image-tar'",
    )
    joining.add_argument(
        "--fleet-group",
        action="store_true",
        help="mark this machine as one of the cloud's group that the hub grows and gives back "
        "(GPUHUB_FLEET=on; the start-up script of deploy/cloud_init.py adds it); a machine "
        "joined without it is fixed: its slices count, the hub never gives it back",
    )
    shared = parser.add_argument_group("the hub's shared storage")
    shared.add_argument(
        "--shared-folder",
        action="append",
        type=shared_folders.parse,
        metavar="PATH=ID",
        help="a folder the hub mounts into servers, from the manager's shared storage, and the "
        "id its marker holds; checked before anything changes (repeated: one per folder)",
    )
    shared.add_argument(
        "--shared-folders-warn-only",
        action="store_true",
        help="a shared folder that is missing or not the manager's is a warning, not a stop",
    )
    advertise.add_gpu_arguments(parser.add_argument_group("GPUs and daemon.json"))
    guard_service.add_options(
        parser.add_argument_group("the GPU guard (worker_setup/guard.py)"), prefix="guard-"
    )
    leaving = parser.add_argument_group("leaving")
    leaving.add_argument("--leave", action="store_true", help="take this machine out again")
    leaving.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait this long for participants' servers here to stop",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="stop participants' servers here (engine restart, --leave) instead of refusing",
    )
    parser.add_argument(
        "--no-firewall",
        action="store_true",
        help="keep no rules for this machine's containers (worker_setup/host_firewall.py; "
        "removed if kept before): only with GPUHUB_EGRESS=off, for an image without "
        "gpuhub-firewall (make join-command adds it then)",
    )
    parser.add_argument(
        "--no-disk-watch",
        action="store_true",
        help="run no disk watch here (worker_setup/disk_watch.py; removed if run before): only "
        "with GPUHUB_EGRESS=off, for an image without gpuhub-disk (make join-command adds it "
        "then)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    # what only the manager's own advertising uses (python -m worker_setup.advertise)
    parser.set_defaults(simulate_if_no_gpu=0, none_if_no_gpu=False)
    args = parser.parse_args(argv)
    advertise.check_gpu_arguments(parser, args)
    try:
        contract.GuardSettings(
            args.guard_mode,
            args.guard_warn_percent,
            args.guard_stop_percent,
            args.guard_grace_seconds,
        )
    except ValueError as e:
        # the setting's name as this command line spells it
        parser.error(
            re.sub(
                r"GPUHUB_GUARD_(\w+)", lambda k: "--guard-" + k[1].lower().replace("_", "-"), str(e)
            )
        )
    return args


def main(
    argv: list[str] | None = None, docker=None, environ: Mapping[str, str] = os.environ
) -> int:
    args = parse_args(argv)
    machine = join.Machine(
        args=args,
        docker=docker or DockerCLI(environ),
        daemon_json=Path(environ.get("GPUHUB_DAEMON_JSON") or DAEMON_JSON),
        guard=guard_service.Service(environ),
        environ=environ,
    )
    return join.run(machine)


if __name__ == "__main__":
    sys.exit(main())
