"""``python -m deploy VERB``: the manager's deploy (deploy/bootstrap.sh runs it for `make VERB`).

The Makefile's verbs:

    demo                 a single-machine hub (local login, simulated GPU slices without a GPU)
    up                   the production hub from the organizer's config file
    down [--purge]       remove the servers and the stack (--purge: also volumes and secrets)
    status               the GPU machines, slices and servers
    roster               check the roster file and hand it to the running hub
    join-command         print the line that adds a GPU machine
    pause-node NODE      no new servers on NODE (running ones stay); resume-node NODE undoes it
    image-tar            save the single-user image to a file for GPU machines
    images               build the base, single-user and hub images

and the steps the tests and the test bed use on their own:

    stack                secrets, ports free, the stack deployed, the hub answering
    gpu-slices           this machine's GPUs advertised (engine restarted when that changed)
    swarm                a swarm initialised here
    settings [KEY ...]   the checked settings as export lines, or the values of KEYs (--json)
    check VERB           read and check the settings VERB needs; print only the problems

Errors print ``error: ...`` (how to fix it) and exit with status 1. ``check`` and ``settings``
need only the standard library: the bootstrap runs them with the system python3 before
anything on the machine changes; the other verbs import the Docker SDK when they run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping

from . import settings
from .console import DeployError, Log, report

#: The settings checks each verb runs (settings.read's mode); the others only read them.
MODES = {"up": "up", "demo": "demo"}
NO_CONFIG = (
    "no config file: cp deploy/config.example.env config.env, edit it, then run: sudo make up "
    "(or: make up CONFIG=FILE)"
)


#: Every verb ``check`` knows (the bootstrap checks these before it makes the venv).
VERBS = (
    "demo",
    "up",
    "down",
    "status",
    "roster",
    "join-command",
    "pause-node",
    "resume-node",
    "image-tar",
    "images",
    "stack",
    "gpu-slices",
    "swarm",
    "settings",
)


def read_settings(verb: str, environ: Mapping[str, str] = os.environ) -> settings.Config:
    """The settings for ``verb``, with every check of its mode; raises SettingsError."""
    if verb not in VERBS:
        raise DeployError(f"unknown verb {verb!r}; make help lists them")
    if verb == "up" and not settings.config_file(environ):
        raise DeployError(NO_CONFIG)
    return settings.read(MODES.get(verb), environ)


def report_settings(error: settings.SettingsError, environ: Mapping[str, str]) -> None:
    for problem in error.problems:
        print(f"error: {problem}", file=sys.stderr)
    config = settings.config_file(environ)
    where = f" in {config}" if config else ""
    print(f"error: fix the settings above{where} and run this again", file=sys.stderr)


def print_settings(config: settings.Config, keys: list[str], as_json: bool) -> None:
    # values are bytes to bash: write them back as they came (LANG=C included)
    sys.stdout.reconfigure(encoding="utf-8", errors="surrogateescape")
    unknown = [k for k in keys if k not in config.values]
    if unknown:
        raise DeployError(f"not settings: {' '.join(unknown)}; deploy/settings.env lists them")
    values = {k: config.values[k] for k in keys} if keys else config.values
    if as_json:
        print(json.dumps(values, indent=1))
    elif keys:
        for key in keys:
            print(values[key])
    else:
        for key, value in values.items():
            print(f"export {key}={shlex.quote(value)}")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m deploy",
        description="The manager's deploy: the Makefile's verbs, and the steps the tests use.",
    )
    verbs = top.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, text in [
        ("demo", "a single-machine hub: local login, simulated GPU slices without a GPU"),
        ("up", "the production hub from the organizer's config file"),
        ("roster", "check the roster file (GPUHUB_ROSTER) and hand it to the running hub"),
        ("join-command", "print the line that adds a GPU machine to this swarm"),
        ("image-tar", "save the single-user image to a file (GPUHUB_IMAGE_TAR)"),
        ("images", "build the base, single-user and hub images"),
        ("stack", "secrets, ports free, the stack deployed and the hub answering"),
        ("swarm", "a swarm initialised on this machine's engine"),
    ]:
        verbs.add_parser(name, help=text)
    down = verbs.add_parser("down", help="remove the user servers and the stack")
    down.add_argument("--purge", action="store_true", help="also the volumes and secrets")
    status = verbs.add_parser("status", help="GPU machines, slices and servers")
    status.add_argument("args", nargs=argparse.REMAINDER, help="deploy.status's options")
    for name, text in [
        ("pause-node", "no new servers on NODE; running ones stay"),
        ("resume-node", "NODE takes new servers again"),
    ]:
        node = verbs.add_parser(name, help=text)
        node.add_argument("node", nargs="?", default="", metavar="NODE")
    slices = verbs.add_parser("gpu-slices", help="advertise this machine's GPUs as slices")
    slices.add_argument(
        "--optional", action="store_true", help="no GPU here: no slices rather than an error"
    )
    show = verbs.add_parser("settings", help="print the checked settings")
    show.add_argument("keys", nargs="*", metavar="KEY", help="print only these values")
    show.add_argument("--json", action="store_true", help="as one JSON object")
    show.add_argument("--mode", choices=("up", "demo"), help="with every check of that mode")
    check = verbs.add_parser("check", help="check the settings a verb needs")
    check.add_argument("for_verb", metavar="VERB")
    return top


def run(args, environ: Mapping[str, str]) -> None:
    """One verb, with the settings it needs; raises on failure."""
    verb = args.verb
    if verb == "check":
        read_settings(args.for_verb, environ)
        return
    if verb == "settings":
        config = settings.read(args.mode, environ)
        print_settings(config, args.keys, args.json)
        return
    if verb == "status":
        from . import status

        code = status.main(args.args)
        if code:
            raise SystemExit(code)
        return
    config = read_settings(verb, environ)
    log = Log()
    from docker.errors import DockerException

    from . import commands, steps

    try:
        if verb == "demo":
            commands.demo(config, log, environ)
        elif verb == "up":
            commands.up(config, log, environ)
        elif verb == "images":
            commands.images(config, log)
        elif verb == "roster":
            commands.roster(config, log)
        elif verb == "stack":
            commands.deploy(config, log, environ)
        elif verb == "down":
            commands.down(config, log, purge=args.purge)
        elif verb == "gpu-slices":
            steps.ensure_gpu_slices(config, log, optional=args.optional, environ=environ)
        elif verb == "swarm":
            steps.ensure_swarm(steps.connect(), log, environ)
        elif verb == "join-command":
            steps.print_join_command(steps.connect(), config)
        elif verb in ("pause-node", "resume-node"):
            availability = "pause" if verb == "pause-node" else "active"
            steps.set_node_availability(steps.connect(), args.node, availability, log)
        elif verb == "image-tar":
            steps.save_image_tar(steps.connect(), config, log, environ)
        else:  # pragma: no cover - argparse knows every verb
            raise DeployError(f"unknown verb {verb}")
    except DockerException as e:
        raise commands.as_deploy_error(e) from None


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    args = parser().parse_args(argv)
    from worker_setup.engine import EngineError

    try:
        run(args, environ)
    except settings.SettingsError as e:
        report_settings(e, environ)
        return 1
    except (DeployError, EngineError) as e:
        report(e)
        return 1
    except KeyboardInterrupt:
        print(
            "error: interrupted; run it again to finish (every step is safe to repeat)",
            file=sys.stderr,
        )
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
