"""The shared folders a GPU machine must have before it joins: those the hub mounts into every
server (the tutorials, the datasets, the homes), from the manager's shared storage (NFS, EFS)
at the same path.

A folder missing here makes every server placed here fail to start; worse, an empty local
folder of the same name (made by hand, or by a mount that did not happen at boot) lets servers
start with no tutorials, no datasets and an empty home whose files no other machine sees. The
manager writes ``contract.SHARE_MARKER`` into each of its folders with the stack's share id, and
the join line names each folder with that id (``--shared-folder PATH=ID``): the join checks
both before it changes anything on the machine.

Standard library only; ``parse``, ``problems`` and ``refusal`` are pure, ``read_marker`` reads.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from gpu_swarm_spawner.contract import SHARE_MARKER

#: ``read_marker``'s answer for a folder that is not there.
NO_FOLDER = None


def parse(value: str) -> tuple[str, str]:
    """``--shared-folder PATH=ID`` as (path, id); argparse's error for anything else."""
    path, equals, share_id = value.rpartition("=")
    if not equals or not path.startswith("/") or not share_id.strip():
        raise argparse.ArgumentTypeError(
            f"{value!r} is not /PATH=ID; copy the line 'make join-command' prints on the manager"
        )
    return os.path.normpath(path), share_id.strip()


def read_marker(folder: str) -> str | None:
    """The share id in ``folder``'s marker: NO_FOLDER when the folder is not there, "" when it
    holds no marker (or one that cannot be read)."""
    if not os.path.isdir(folder):
        return NO_FOLDER
    try:
        with open(os.path.join(folder, SHARE_MARKER), encoding="utf-8") as f:
            return f.readline().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def problems(
    folders: list[tuple[str, str]], read: Callable[[str], str | None] = read_marker
) -> list[str]:
    """What is wrong with each shared folder here, one phrase each naming it ([] when each is
    there and the manager's)."""
    found = []
    for folder, share_id in folders:
        seen = read(folder)
        if seen is NO_FOLDER:
            found.append(f"{folder} is missing")
        elif not seen:
            found.append(
                f"{folder} is not the manager's (no {SHARE_MARKER} in it: a local folder, "
                "the shared storage not mounted)"
            )
        elif seen != share_id:
            found.append(
                f"{folder} is another hub's shared storage (its {SHARE_MARKER} holds {seen}, "
                f"not {share_id})"
            )
    return found


def refusal(found: list[str], manager_host: str) -> str:
    """One line: what is wrong and how to fix it (the shared storage mounted at each path)."""
    first = found[0].split(" ", 1)[0]
    label = "shared folder" if len(found) == 1 else "shared folders:"
    return (
        f"{label} {'; '.join(found)}; servers here would not see the hub's files. Mount "
        f"the manager's shared storage at the same path (e.g. NFS: mount -t nfs4 "
        f"{manager_host}:{first} {first}, and a line in /etc/fstab; AWS EFS: mount -t efs "
        f"fs-ID:/ {first}; see docs/homes.md), then run this again (or add "
        "--shared-folders-warn-only to join anyway)"
    )
