"""One copy of a participant's server at a time in their home.

When a GPU machine is cut off from the manager, Swarm starts a replacement for each of its
servers' tasks; the replacement can only run where the server's GPU is, so it starts when the
machine is back, while the machine is still stopping the old copy (Swarm does not wait for a
task on a machine it could not reach). For those seconds both copies would run: two Jupyter
servers saving the same notebooks, the start hook copying tutorials twice, the GPU's memory
used twice.

The server's command (``start-singleuser``) opens ``LOCK_NAME`` in the home and keeps it open
until the server ends; this module, run on that open file, takes an exclusive lock on it
(``flock``), waiting while an earlier copy holds it, then leaves: the lock belongs to the open
file, which the server's command goes on holding, and the kernel lets go of it when the last
process holding it ends, however it ends. A second copy therefore waits until the first has
stopped, at most ``WAIT_S`` (a lock a lost machine held on a network file system is only
let go when its lease runs out, about 90 s for NFS; a server is never kept from starting for
that long). Standard library only; never stops the server from starting.

Usage: ``python3 -m one_copy FD`` (FD: the lock file, open for writing).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from collections.abc import Callable

#: the lock file, in the home
LOCK_NAME = ".gpuhub-server.lock"
#: the longest a copy waits for an earlier one to stop (Swarm gives a stopping task 10 s)
WAIT_S = 20.0
#: how often a waiting copy tries again
RETRY_S = 0.2


def holder(fd: int) -> str:
    """What the lock file says about the copy that took it last ("" when it says nothing)."""
    try:
        with open(f"/proc/self/fd/{fd}", encoding="utf-8", errors="replace") as f:
            return f.read(200).strip()
    except OSError:
        return ""


def mark(fd: int, who: str) -> None:
    """Write ``who`` into the lock file (for the next copy's message)."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{who}\n".encode())
    except OSError:
        pass


def hold(
    fd: int,
    wait_s: float = WAIT_S,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Take the lock on ``fd``: "free" (nobody held it), "waited N.N s" (an earlier copy let
    go), "timed out" (it did not within ``wait_s``: starting anyway) or "no lock (...)" (the
    file system cannot lock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "free"
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            return f"no lock ({e.strerror})"
    earlier = holder(fd)
    say(
        "An earlier copy of this server is still stopping"
        + (f" ({earlier})" if earlier else "")
        + f": waiting up to {wait_s:.0f} s for it to end before starting"
    )
    t0 = clock()
    while clock() - t0 < wait_s:
        sleep(RETRY_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue
        return f"waited {clock() - t0:.1f} s"
    say(f"The earlier copy did not end within {wait_s:.0f} s: starting anyway")
    return "timed out"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python3 -m one_copy FD", file=sys.stderr)
        return 2
    fd = int(argv[0])
    outcome = hold(fd)
    if outcome == "free" or outcome.startswith("waited"):
        mark(fd, f"container {socket.gethostname()}, since {time.strftime('%H:%M:%S')}")
    if outcome.startswith("waited"):
        print(f"The earlier copy ended ({outcome}): starting", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
