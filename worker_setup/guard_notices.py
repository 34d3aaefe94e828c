"""What goes into a participant's container: the GPU guard's notices and usage figures.

A participant is told in JupyterLab (images/singleuser/gpuhub_notices reads the files these
functions fill): a warning when they go over their GPU memory budget (``warn_notice``), the
process stopped (``stop_notice``), back within budget (``ok_notice``), each kept in
``NOTICES_FILE``; and their own GPU figures in ``USAGE_FILE`` (``usage_record``, written again
when ``usage_changed``). ``write_into`` writes either file into the container's file system
without following a link the participant planted.

It imports the policy's actions and settings (``guard_policy``), ``telemetry``'s figures and
``guard_attribution``'s ``Server``; nothing of the guard's loop (guard.py), its metrics or its
command, which import it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping

from . import guard_policy as policy
from . import telemetry
from .guard_attribution import Server

#: Where a participant's notices go, inside their container (JupyterLab reads it there).
NOTICES_FILE = "/tmp/gpuhub-guard/notices.json"
#: How many notices the file keeps.
NOTICES_KEPT = 20
#: Where a participant's own GPU figures go, beside the notices (their JupyterLab status bar
#: and gpu-info read it; images/singleuser/gpuhub_notices/usage.py is its reader).
USAGE_FILE = "/tmp/gpuhub-guard/usage.json"
#: The figures are written again at least this often (the page tells fresh from stale by it),
#: and at once when they change by more than these steps.
USAGE_REFRESH_S = 30.0
USAGE_STEP_MB = 64
USAGE_STEP_PERCENT = 5


def gb(mb: float) -> str:
    """MiB as a participant reads them: ``12.2 GB``."""
    return f"{mb / 1024:.1f} GB"


def warn_notice(
    w: policy.Warn,
    server: Server,
    gpu_name: str,
    settings: policy.GuardSettings,
    wall_now: float,
    now: float,
    top: str,
) -> dict:
    """The notice for a participant over their budget; ``top``: their biggest process."""
    share = f"{server.slices} slice{'s' if server.slices != 1 else ''} of {gpu_name}"
    text = (
        f"Your processes use {gb(w.used_mb)} of GPU memory; your budget is {gb(w.budget_mb)} "
        f"({share}), and the others on this GPU need theirs. Free some (del tensors you no "
        "longer need, torch.cuda.empty_cache()) or restart a kernel."
    )
    if w.stop_at is not None:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(wall_now + (w.stop_at - now)))
        stop_line = w.budget_mb * settings.stop_percent / 100
        text += (
            f" If you still use more than {gb(stop_line)} at {when}, the process holding the "
            f"most ({top}) will be stopped."
        )
    return {
        "id": f"warn-{w.owner}-{int(wall_now - (now - w.over_since))}",
        "level": "warning",
        "time": wall_now,
        "title": "GPU memory over your budget",
        "message": text,
    }


def stop_notice(
    s: policy.Stop, settings: policy.GuardSettings, wall_now: float, process: str
) -> dict:
    text = (
        f"The GPU guard stopped {process}, which held {gb(s.process_mb)} of GPU memory: your "
        f"processes used {gb(s.used_mb)}, above {gb(s.stop_line_mb)} ({settings.stop_percent:g}%"
        f" of your {gb(s.budget_mb)} budget) for more than {settings.grace_seconds:g} s. Your "
        "server, your files and your other processes are untouched; restart the kernel and use "
        "less GPU memory (a smaller batch or model)."
    )
    return {
        "id": f"stop-{s.owner}-{s.pid}-{int(wall_now)}",
        "level": "error",
        "time": wall_now,
        "title": "A process of yours was stopped: too much GPU memory",
        "message": text,
    }


def ok_notice(owner: str, wall_now: float) -> dict:
    return {
        "id": f"ok-{owner}-{int(wall_now)}",
        "level": "info",
        "time": wall_now,
        "title": "GPU memory back within your budget",
        "message": "Thank you: your processes are within your GPU memory budget again.",
    }


def usage_record(
    server: Server, reading: policy.Reading, gpus: Mapping[str, telemetry.GPUStats], now: float
) -> dict:
    """What ``USAGE_FILE`` says to the participant of ``server``: their processes' GPU memory
    against their budget, and their GPU's figures (shared by the holders of its slices)."""
    used = sum(
        p.used_mb
        for p in reading.processes
        if p.owner == server.owner and p.gpu_uuid == server.gpu_uuid
    )
    gpu = gpus.get(server.gpu_uuid)
    return {
        "time": now,
        "gpu": server.gpu_uuid,
        "used_mb": used,
        "budget_mb": server.budget_mb,
        "gpu_utilization": gpu.utilization_percent if gpu else None,
        "gpu_memory_used_mb": gpu.memory_used_mb if gpu else None,
        "gpu_memory_total_mb": gpu.memory_total_mb if gpu else None,
    }


def usage_changed(last: dict | None, new: dict) -> bool:
    """Whether ``new`` is worth writing over ``last`` (the previous one written)."""
    if last is None or new["time"] - last["time"] >= USAGE_REFRESH_S:
        return True
    if (last["gpu"], last["budget_mb"]) != (new["gpu"], new["budget_mb"]):
        return True
    if abs(new["used_mb"] - last["used_mb"]) >= USAGE_STEP_MB:
        return True
    before, now = last["gpu_utilization"], new["gpu_utilization"]
    if before is None or now is None:
        return (before is None) != (now is None)  # the figure appeared or went away
    return abs(now - before) >= USAGE_STEP_PERCENT


def write_into(root: str, text: str, path: str = NOTICES_FILE) -> None:
    """Write ``text`` to ``path`` under a container's root (``/proc/PID/root``), atomically.

    The participant owns that file system: every step below its root is opened relative to the
    last without following symbolic links, so a link they plant (``/tmp/gpuhub-guard`` pointing
    at the host's /etc, say) fails the write instead of redirecting it."""
    folder_path, name = os.path.split(path)
    directory = os.O_RDONLY | os.O_DIRECTORY
    fds = [os.open(root, directory)]  # the magic link: followed on purpose, into the container
    try:
        for part in folder_path.strip("/").split("/"):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fds[-1])
            fds.append(os.open(part, directory | os.O_NOFOLLOW, dir_fd=fds[-1]))
        temporary = f"{name}.{os.getpid()}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=fds[-1])
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o644, dir_fd=fds[-1]), "w") as f:
            f.write(text)
        os.rename(temporary, name, src_dir_fd=fds[-1], dst_dir_fd=fds[-1])
    finally:
        for fd in reversed(fds):
            os.close(fd)
