"""What the provider's settings may be (GPUHUB_FLEET_GROW_COMMAND, ..._REMOVE_COMMAND,
GPUHUB_FLEET_IMAGE, GPUHUB_FLEET_MOUNTS, GPUHUB_FLEET_ENV: docs/autoscaling.md), read once: the
settings' check before `make up` (deploy/settings.py) and the hub's provider (``provider.py``,
which uses these) take the same functions. Pure, standard library only: the deploy tool runs it
with a bare python3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def command_problems(grow: str, remove: str, timeout: float = 120.0, attempts: int = 1):
    """What is wrong with the provider's commands, as (which: "grow", "remove" or "timeout",
    what to write instead); none when ``Commands`` takes them. The one check of them: the
    settings' check (deploy/settings.py) names the setting of each."""
    found = []
    if not grow.strip():
        found.append(
            (
                "grow",
                "the grow command is empty; write the command that makes the cloud's group "
                "{count} machines (ready recipes in docs/providers/)",
            )
        )
    elif "{count}" not in grow:
        found.append(
            (
                "grow",
                "the grow command must say where the group's new size goes: {count}, e.g. "
                "aws autoscaling set-desired-capacity --auto-scaling-group-name NAME "
                "--desired-capacity {count}",
            )
        )
    if not remove.strip():
        found.append(
            (
                "remove",
                "the remove command is empty; write the command that takes machine "
                "{machine} out of the cloud's group (ready recipes in docs/providers/)",
            )
        )
    elif "{machine}" not in remove:
        found.append(
            (
                "remove",
                "the remove command must say where the machine's name goes: {machine}, "
                "e.g. gcloud compute instance-groups managed delete-instances NAME --zone ZONE "
                "--instances {machine}",
            )
        )
    if timeout <= 0 or attempts < 1:
        found.append(
            (
                "timeout",
                f"a command needs a time limit above 0 s and at least 1 try, not "
                f"{timeout} s and {attempts}",
            )
        )
    return found


#: The engine's socket where Docker puts it: never mounted into a command's container.
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
#: A variable's name the shell takes as one (``$GROUP``).
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A Docker image reference: [HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST], the path in lower case.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
_MOUNT_EXAMPLE = "/root/.aws:/root/.aws:ro"


@dataclass(frozen=True)
class Mount:
    """A folder of the manager a command's container sees (GPUHUB_FLEET_MOUNTS)."""

    host: str
    container: str
    read_only: bool = False

    def written(self) -> str:
        return f"{self.host}:{self.container}{':ro' if self.read_only else ''}"

    def engine(self) -> dict:
        """The mount as the engine's API takes it (HostConfig.Mounts): a bind of the folder."""
        return {
            "Type": "bind",
            "Source": self.host,
            "Target": self.container,
            "ReadOnly": self.read_only,
        }


def _inside(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or inside it."""
    folder = folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def _absolute(path: str) -> bool:
    return path.startswith("/") and not any(part in (".", "..") for part in path.split("/"))


def read_mounts(text: str) -> tuple[Mount, ...]:
    """GPUHUB_FLEET_MOUNTS: space-separated ``HOSTDIR:CONTAINERDIR[:ro]``, absolute paths;
    never the engine's socket, nor a folder holding it. A ``ValueError`` says what to write."""
    mounts: list[Mount] = []
    for entry in text.split():
        parts = entry.split(":")
        read_only = len(parts) == 3 and parts[2] == "ro"
        if len(parts) not in (2, 3) or (len(parts) == 3 and not read_only):
            raise ValueError(
                f"{entry!r} is not HOSTDIR:CONTAINERDIR or HOSTDIR:CONTAINERDIR:ro; write "
                f"entries such as {_MOUNT_EXAMPLE!r}, separated by spaces"
            )
        host, container = parts[0], parts[1]
        if not (_absolute(host) and _absolute(container)) or "/" in (host, container):
            raise ValueError(
                f"{entry!r}: write both folders as absolute paths below /, without . or .., "
                f"e.g. {_MOUNT_EXAMPLE!r}"
            )
        if any(_inside(sock, host) for sock in DOCKER_SOCKETS):
            raise ValueError(
                f"{entry!r} would hand the provider's commands the Docker engine's socket (all "
                "of the manager); mount only the folders the cloud's tool reads"
            )
        if any(m.container == container for m in mounts):
            raise ValueError(f"{entry!r}: {container} is mounted twice; keep one of them")
        mounts.append(Mount(host, container, read_only))
    return tuple(mounts)


def read_env(text: str) -> dict[str, str]:
    """GPUHUB_FLEET_ENV: space-separated ``NAME=VALUE`` (what the commands read as ``$NAME``),
    in the order written. A ``ValueError`` says what to write."""
    found: dict[str, str] = {}
    for entry in text.split():
        name, equals, value = entry.partition("=")
        if not equals or not _ENV_NAME.match(name):
            raise ValueError(
                f"{entry!r} is not NAME=VALUE with a name the shell takes (letters, digits and _, "
                "not starting with a digit); write e.g. 'GROUP=gpu-workshop ZONE=europe-west4-a'"
            )
        if name in found:
            raise ValueError(f"{name} is given twice; keep one of them")
        found[name] = value
    return found
