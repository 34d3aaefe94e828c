"""The machine's disk watch: what participants' servers write here, measured (docs/organizer.md).

Nothing else bounds what a server writes: its home (a volume of this engine, or a folder on
shared storage) and its container's writable layer can fill the machine's disk. The single-user
image's ``gpuhub-disk watch`` (images/singleuser/gpuhub_disk.py) measures both for every server
here, warns a participant over the disk budget, pauses the biggest writer when a file system
passes its safety line (the servers' labels, gpu_swarm_spawner/contract.py) and answers the
hub's ``GET /disk`` on this machine's address at ``DISK_WATCH_PORT``.

It runs as a container of the machine's engine (``WATCH``, restart policy ``always``, as the
firewall's keeper: keepers.py), as root, with the host's network and processes, the engine's
socket (to find the servers and pause one) and the host's root file system read-only under
/host (to measure the paths the engine names; a home is read through its server's first
process). ``watch_args`` is pure; the join and the deploy run ``ensure``/``remove`` through the
engine.
"""

from __future__ import annotations

import hashlib

from gpu_swarm_spawner.contract import DISK_WATCH, DISK_WATCH_PORT, LABEL_PREFIX

from . import keepers

WATCH = DISK_WATCH
#: the watch's label holding a digest of how it runs (its image and arguments)
DIGEST_LABEL = LABEL_PREFIX + "disk-watch"
#: where the watch finds its machine's engine's socket (engine.docker_socket: the host's path)
ENGINE_SOCKET = "/var/run/docker.sock"
WHAT = f"servers' homes and writable layers measured; its report on port {DISK_WATCH_PORT}"
WATCHES = "the disk watch"


#: the watch's restart policy, network, user and limits; the host's processes, and the right
#: to read a server's files through its first process (``/proc/PID/root``: a server's home as it
#: sees it, a shared folder mounted after the watch started included)
LIMITS = (
    "--restart=always",
    "--network=host",
    "--pid=host",
    "--cap-add=SYS_PTRACE",
    "--security-opt=apparmor=unconfined",
    "--user=0",
    "--memory=128m",
    "--log-opt=max-size=1m",
)


def _runs(image: str, socket: str) -> list[str]:
    """What the watch sees of the host, and what it runs."""
    mounts = ["-v", f"{socket}:{ENGINE_SOCKET}", "-v", "/:/host:ro"]
    return [*mounts, "--entrypoint=gpuhub-disk", image, "watch", "--port", str(DISK_WATCH_PORT)]


def digest(image: str, socket: str) -> str:
    """What the watch's label holds: a digest of all its other arguments."""
    whole = "\n".join([*LIMITS, *_runs(image, socket)])
    return hashlib.sha256(whole.encode()).hexdigest()[:16]


def watch_args(image: str, socket: str) -> list[str]:
    """``docker run`` arguments of the watch: ``image``'s gpuhub-disk, with the engine's socket
    at ``socket`` on the host."""
    label = f"{DIGEST_LABEL}={digest(image, socket)}"
    return ["--detach", "--name", WATCH, *LIMITS, "--label", label, *_runs(image, socket)]


def ensure(docker, image: str, socket: str, dry_run=False) -> tuple:
    """The watch runs here from ``image`` with the engine's socket ``socket``: (changed, what it
    says). ``docker`` is a DockerCLI (container, run_container, remove_container). Raises
    keepers.KeeperError."""
    args = watch_args(image, socket)
    done = keepers.keep(docker, WATCH, DIGEST_LABEL, digest(image, socket), args, WATCHES, dry_run)
    if done == "kept":
        return False, f"kept ({WHAT})"
    return not dry_run, f"{done} {WATCH} ({WHAT})"


def remove(docker, dry_run=False) -> tuple:
    """No watch here: (changed, what it says). Raises keepers.KeeperError."""
    now = keepers.remove(docker, WATCH, WATCHES, dry_run)
    if now is None:
        return False, "no disk watch here"
    return not dry_run, f"would remove {WATCH}" if dry_run else f"removed {WATCH}"
