"""Participants' homes: a folder each on shared storage, or a volume on one machine.

With ``GPUSwarmSpawner.homes_dir`` (``GPUHUB_HOMES_DIR``) every participant's home is the folder
``<homes_dir>/<escaped username>``, bind-mounted at ``/home/jovyan``: the storage is shared by
every machine at the same path (NFS, EFS), so a participant whose machine is gone starts again
on another with every file. The hub sees the folder at the same path (deploy/stack.homes.yml)
and makes it before the server's service is created (a bind mount's source must exist).

Without it the home is the volume ``jy-home-<user>`` on the machine that ran the server; a
returning participant goes back there when a GPU there has room, and is told plainly where
their files are when that machine is full or unavailable (``away_message``).

``folder_of``, ``machine_state`` and ``away_message`` are pure; ``ensure_folder`` does the I/O
(the spawner runs it on a thread).
"""

from __future__ import annotations

import os

from . import naming

#: Where the home is mounted in every server.
HOME_PATH = "/home/jovyan"
#: The owner of a new home folder: ``jovyan`` (uid 1000) in this project's images and in the
#: Jupyter Docker Stacks, whose group there is ``users`` (gid 100).
OWNER_UID = 1000
OWNER_GID = 100
#: Only the participant (and root) may read it: all servers run as uid 1000, but each mounts its
#: own folder only, so the mode keeps out other local users of the machines mounting the share.
FOLDER_MODE = 0o700


def folder_of(homes_dir: str, escaped_name: str) -> str:
    """The home folder of the participant whose escaped username is ``escaped_name``
    (dockerspawner's escaping: lower-case letters, digits and ``-XX``, so never ``.``-first
    and never a path), fitted into a file name."""
    return os.path.join(homes_dir, naming.volume_name(escaped_name))


def ensure_folder(path: str, uid: int = OWNER_UID, gid: int = OWNER_GID) -> bool:
    """The home folder exists (made empty, owned by ``uid:gid``, ``FOLDER_MODE``, when it did
    not; one that exists is left as its participant left it). True when made now.

    The shared folder above it must exist: a hub that does not see it (not mounted in the hub's
    container) fails here with FileNotFoundError instead of making a local folder nobody else
    sees."""
    try:
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(f"{path} exists but is not a folder") from None
        return False
    try:
        os.chown(path, uid, gid)
    except OSError:
        os.rmdir(path)  # not left half made: the next start tries again
        raise
    return True


# ---- the home machine, without shared homes ------------------------------------------------

#: ``machine_state``'s words: the machine is in the swarm and takes servers ("").
AVAILABLE = ""
GONE = "gone"
DOWN = "down"
PAUSED = "paused"
DRAINED = "drained"


def machine_state(nodes: list[dict], hostname: str) -> str:
    """What became of machine ``hostname`` in a read of the swarm's nodes (as
    ``docker.APIClient.nodes()`` returns them): AVAILABLE (ready and active), PAUSED or
    DRAINED (an organizer took it out of service), DOWN (the manager does not hear from it),
    or GONE (not in the swarm). A machine that joined again has a second node, the old one
    left down: the best of them counts."""
    found = [n for n in nodes if (n.get("Description") or {}).get("Hostname") == hostname]
    if not found:
        return GONE
    ready = [n for n in found if (n.get("Status") or {}).get("State") == "ready"]
    if not ready:
        return DOWN
    availability = {(n.get("Spec") or {}).get("Availability", "active") for n in ready}
    if "active" in availability:
        return AVAILABLE
    return PAUSED if "pause" in availability else DRAINED


_UNAVAILABLE = {
    GONE: "which is no longer part of this hub",
    DOWN: "which is not answering",
    PAUSED: "which takes no new servers now (an organizer paused it)",
    DRAINED: "which takes no new servers now (an organizer drained it)",
}


def away_message(home: str, state: str, here: str, volume: str) -> str:
    """What a participant reads when their server starts on ``here`` instead of ``home``, the
    machine whose volume ``volume`` holds their files from last time, in ``state``
    (``machine_state``)."""
    if state == AVAILABLE:  # there, but no GPU of it has room
        return (
            f"No GPU on {home}, where your files from last time are, has room: this server "
            f"starts on {here} with the home there (your files stay on {home})"
        )
    return (
        f"Your files from last time are on the machine {home}, {_UNAVAILABLE[state]}. This "
        f"server starts on {here} with an empty home (or the one you had there before). Your "
        f"files are not lost: an organizer can copy them from {home}'s Docker volume {volume}; "
        "with GPUHUB_HOMES_DIR (homes on shared storage) every machine has them"
    )
