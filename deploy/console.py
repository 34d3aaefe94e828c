"""What the deploy prints, and how it fails: ``[ 12s] ...`` log lines, one error type whose
message says how to fix the problem, commands whose output is shown only when they fail, and
waits with growing delays and a deadline.

Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Callable, TextIO

#: The seconds since the epoch when `make VERB` started (deploy/bootstrap.sh exports it), so the
#: log's clock runs on across the bootstrap and Python.
CLOCK_START = "DEPLOY_T0"

# The wait loops' clock and sleep, replaced by the unit tests.
clock: Callable[[], float] = time.monotonic
sleep: Callable[[float], None] = time.sleep


class DeployError(RuntimeError):
    """A step failed. The message is one line saying what and how to fix it; ``output`` is
    what a failed command printed (shown above the message), ``hint`` a line shown below it
    (what to do about a deploy that stopped half-way)."""

    def __init__(self, message: str, output: str = "", hint: str = ""):
        super().__init__(message)
        self.output = output
        self.hint = hint


def report(error: BaseException, err: TextIO | None = None) -> None:
    """``error: ...`` on stderr, with a DeployError's output above and its hint below."""
    err = err or sys.stderr
    output = getattr(error, "output", "")
    if output:
        print(output.rstrip("\n"), file=err)
    print(f"error: {error}", file=err)
    hint = getattr(error, "hint", "")
    if hint:
        print(hint, file=err)


class Log:
    """``log("message")`` prints ``[ 12s] message``: seconds since `make VERB` started."""

    def __init__(self, out: TextIO | None = None, environ: Mapping[str, str] = os.environ):
        self.out = out
        try:
            self.start = float(environ[CLOCK_START])
        except (KeyError, ValueError):
            self.start = time.time()

    def __call__(self, message: str) -> None:
        seconds = int(time.time() - self.start)
        print(f"[{seconds:3d}s] {message}", file=self.out or sys.stdout, flush=True)

    def detail(self, text: str) -> None:
        """Lines a step passes on (what a tool it ran printed), indented under its log line."""
        for line in text.rstrip("\n").splitlines():
            print(f"      {line}", file=self.out or sys.stdout, flush=True)


def tail(text: str, lines: int | None) -> str:
    """The last ``lines`` lines of ``text`` (all of them for None)."""
    kept = text.rstrip("\n").splitlines()
    return "\n".join(kept if lines is None else kept[-lines:])


def run(
    command: Sequence[str],
    failed: str,
    fix: str,
    lines: int | None = 20,
    env: Mapping[str, str] | None = None,
    show: Callable[[str], None] | None = None,
) -> str:
    """Run ``command`` with its output captured and return it. When it fails, raise DeployError
    ``FAILED (output above); FIX`` with the last ``lines`` lines of the output (all of them for
    None). ``show`` gets each line as it comes (for long steps), and a failure then repeats none
    of them."""
    try:
        process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise DeployError(f"{failed}: {command[0]} is not installed; {fix}") from None
    output = []
    with process:
        for line in process.stdout:
            output.append(line)
            if show:
                show(line)
    if process.returncode != 0:
        shown = "" if show else tail("".join(output), lines)
        raise DeployError(f"{failed} (output above); {fix}", output=shown)
    return "".join(output)


def waits(timeout: float, first: float = 0.2, most: float = 2.0) -> Iterator[float]:
    """Yield the seconds waited so far: at once, then after growing delays (``first`` up to
    ``most``) until ``timeout`` has passed, the last time at the deadline. The caller checks
    on each and raises, with the last state it saw, when the loop ends."""
    start = clock()
    delay = first
    while True:
        waited = clock() - start
        yield waited
        if waited >= timeout:
            return
        sleep(min(delay, timeout - waited))
        delay = min(delay * 1.5, most)
