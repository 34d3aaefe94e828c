"""The GPU guard's command line: ``python -m worker_setup.guard`` (guard.py runs ``main``).

``parse_args`` reads the options (the policy's, shared with the join through
``guard_service.add_options``, and the loop's); ``main`` starts NVML, the engine's API, the
metrics and the loop, or with ``--once`` prints one round (``describe_round``) and changes
nothing. ``--help`` shows guard.py's account of a round.

It imports the loop (guard.py), the metrics (guard_metrics) and ``guard_notices.gb``; nothing
imports it but guard.py's ``__main__``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping

from . import guard, guard_service
from . import guard_policy as policy
from .engine_api import EngineAPI, EngineUnavailable
from .guard import Guard, Options, Round
from .guard_metrics import serve_metrics
from .guard_notices import gb

#: ``--help``'s description: guard.py's docstring without its last paragraph (its modules, for
#: whoever reads the code).
DESCRIPTION = guard.__doc__.rsplit("\n\n", 1)[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m worker_setup.guard",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    guard_service.add_options(parser)
    parser.add_argument(
        "--interval",
        type=float,
        default=Options.interval,
        metavar="S",
        help="seconds between rounds (%(default)g)",
    )
    parser.add_argument(
        "--kill-after",
        type=float,
        default=Options.kill_after,
        metavar="S",
        help="SIGKILL after SIGTERM (%(default)g)",
    )
    parser.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDR")
    parser.add_argument("--machine", default="", help="the machine's name in metrics (hostname)")
    parser.add_argument(
        "--once", action="store_true", help="print one round's reading and decision; change nothing"
    )
    args = parser.parse_args(argv)
    try:
        args.settings = policy.GuardSettings(
            args.mode, args.warn_percent, args.stop_percent, args.grace_seconds
        )
    except ValueError as e:
        parser.error(str(e))
    if args.interval <= 0 or args.kill_after < 0:
        parser.error("--interval must be above 0 and --kill-after at least 0 seconds")
    return args


def describe_round(done: Round) -> list[str]:
    """``--once``'s lines: the GPUs, the processes and whose, and the policy's actions."""
    lines = []
    for g in done.snapshot.gpus:
        used = "?" if g.memory_used_mb is None else gb(g.memory_used_mb)
        extra = [
            f"{g.utilization_percent}% busy" if g.utilization_percent is not None else "",
            f"{g.temperature_c} C" if g.temperature_c is not None else "",
            f"{g.power_w:.0f} W" if g.power_w is not None else "",
        ]
        if g.uuid in done.slices:
            held = sum(s.slices for s in done.servers.values() if s.gpu_uuid == g.uuid)
            extra.append(f"{held} of {done.slices[g.uuid]} slices held")
        lines.append(
            f"{g.uuid}  {g.name}  {used} of {gb(g.memory_total_mb)} in use  "
            + "  ".join(e for e in extra if e)
        )
    by_owner = {s.owner: s for s in done.servers.values()}
    for p in done.reading.processes if done.reading else ():
        server = by_owner.get(p.owner or "")
        whose = f"{server.owner} ({server.user})" if server else "no participant's"
        lines.append(f"  pid {p.pid:>7}  {gb(p.used_mb):>8}  on {p.gpu_uuid}  {whose}")
    if done.reading is None:
        lines.append("  (the engine did not answer: processes not attributed)")
    lines += [f"  error: {e}" for e in done.snapshot.errors]
    lines += [f"  would {type(a).__name__.lower()}: {a}" for a in done.actions]
    return lines


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    from .gpus import load_nvml

    nvml = load_nvml()
    try:
        engine = EngineAPI(environ)
    except EngineUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    options = Options(args.interval, args.kill_after, args.machine or socket.gethostname())
    guard = Guard(args.settings, nvml, engine, options)
    if args.once:
        print("\n".join(describe_round(guard.observe()[0])))
        return 0
    if args.metrics_port:
        try:
            serve_metrics(guard, args.metrics_addr, args.metrics_port)
        except OSError as e:
            print(
                f"error: cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {e}; "
                "choose another --metrics-port (0: none)",
                file=sys.stderr,
            )
            return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    guard.run(stop)
    return 0
