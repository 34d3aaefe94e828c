"""What the server's command (``start-singleuser``) does before JupyterLab, in one Python process.

Each Python process a server starts pays for an interpreter and ``gpu_caps.pth`` under the
server's CPU limit; three of them ran before JupyterLab (issue 31). Now one does, in order:

1. one copy of the server at a time (``one_copy``, on the lock file the command holds open as
   descriptor FD; no FD: the home could not hold it);
2. the published tutorials brought into the home (``tutorial_sync.start_hook``), when the
   share is there (``TUTORIALS_SHARE``, default /srv/tutorials);
3. JAX's share of the GPU (``gpu_caps.xla_fraction``) when the server has a memory budget and
   the participant did not set ``XLA_PYTHON_CLIENT_MEM_FRACTION`` themselves.

The fraction is the one line written to standard output (empty: none), for the command to
export; what the steps say goes to standard error, the server's log. A step that fails says so
and the next one runs: the server always starts. Standard library only (and the image's own
modules).

Usage: ``python3 -m server_start [FD]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

XLA_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def step(what: str, run: Callable[[], object], failed: str) -> object:
    """``run()``'s result; None, with one line saying ``failed``, when it raises or returns a
    non-zero exit status."""
    try:
        result = run()
    except Exception as e:  # never a traceback before a server starts: one line, and on
        print(f"{what}: {type(e).__name__}: {e}; {failed}", file=sys.stderr, flush=True)
        return None
    if isinstance(result, int) and result:
        print(f"{what}: {failed}", file=sys.stderr, flush=True)
        return None
    return result


def one_copy_step(fd: str) -> int:
    import one_copy

    return one_copy.main([fd])


def tutorials_step() -> int:
    from tutorial_sync import start_hook

    return start_hook.main([])


def xla_step() -> str:
    import gpu_caps

    return gpu_caps.xla_fraction()


def main(argv: list[str], environ=os.environ) -> int:
    if len(argv) > 1 or (argv and not argv[0].isdigit()):
        print("usage: python3 -m server_start [FD]", file=sys.stderr)
        return 2
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the steps print (the start hook's summary) is the log's
    if argv:
        step("one copy", lambda: one_copy_step(argv[0]), "the check failed; starting")
    if os.path.isdir(environ.get("TUTORIALS_SHARE", "/srv/tutorials")):
        step("tutorials", tutorials_step, "the server starts without updates")
    fraction = ""
    if environ.get("GPU_MEMORY_LIMIT_MB") and XLA_FRACTION not in environ:
        fraction = step("JAX's memory share", xla_step, "JAX is not capped") or ""
    print(fraction, file=answer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
