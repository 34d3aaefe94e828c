"""Containers of a machine's engine that keep something going there for as long as it runs
participants' servers: the firewall's keeper (host_firewall.py) and the disk watch
(disk_watch.py).

Each is one named container with restart policy ``always`` and a label holding a digest of what
it runs: ``keep`` leaves a running one with the same digest alone and replaces any other, so a
second join or deploy changes nothing and a new image or new arguments take effect at once.
"""

from __future__ import annotations


class KeeperError(Exception):
    """A container of the machine did not start, or did not go; the message says why."""


def keep(
    docker, name: str, label: str, digest: str, args: list[str], what: str, dry_run=False
) -> str:
    """The container ``name`` runs, made by ``docker run ARGS`` (which give it ``label`` =
    ``digest``). ``docker`` is a DockerCLI (container, run_container, remove_container). Says
    what happened: "kept", "started" or "replaced" ("would start", "would replace" with
    ``dry_run``). Raises KeeperError, which names ``what`` (the machine's firewall) and the
    container's log."""
    now = docker.container(name)
    labels = ((now or {}).get("Config") or {}).get("Labels") or {}
    if ((now or {}).get("State") or {}).get("Running") and labels.get(label) == digest:
        return "kept"
    verb, done = ("replace", "replaced") if now else ("start", "started")
    if dry_run:
        return f"would {verb}"
    if now:
        remove(docker, name, what)
    error = docker.run_container(*args)
    if error:
        raise KeeperError(f"{what} did not start: {error}; see: docker logs {name}")
    return done


def remove(docker, name: str, what: str, dry_run=False) -> dict | None:
    """The container ``name`` gone (still there with ``dry_run``): what it was (``docker
    container inspect``), None when there was none. Raises KeeperError, which names
    ``what``."""
    now = docker.container(name)
    if now is not None and not dry_run:
        error = docker.remove_container(name)
        if error:
            raise KeeperError(f"{what} ({name}) was not removed: {error}")
    return now
