"""The server itself: its home, its firewall's inputs, its task until it answers, and where the
hub connects to it. (Its service's spec is ``service_spec.py``.)

Pure functions over plain values, and the few reads of Docker and the network given the call
to make them with: GPUSwarmSpawner (spawner.py) calls them from dockerspawner's hops
(``create_object``, ``start_object``, ``get_ip_and_port``) with explicit arguments, so nothing
here reads the spawner.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import (
    egress,
    naming,
    tasks,
)
from .errors import SliceTaken, SpawnFailed
from .homes import HOME_PATH, ensure_folder
from .tasks import Phase

if TYPE_CHECKING:
    from .broker import Docker, GPUBroker

#: seconds between the spawner's TCP probes of a starting server's port (wait_for_port): a
#: refused connection costs the hub about 0.05 ms, and a server answers on average half this
#: later than it could
PORT_PROBE_S = 0.05


def subnets_of(network: dict) -> list[str]:
    """The address ranges of a network as the Engine API inspects it."""
    return [c["Subnet"] for c in network.get("IPAM", {}).get("Config") or [] if c.get("Subnet")]


# ---- the home ----------------------------------------------------------------------------------


def home_to_prefer(homes_dir: str, prefer_home_node: bool, home_node: str) -> str:
    """The machine a server goes to first: ``home_node``, the one holding the participant's
    home volume (with ``prefer_home_node``); none with ``homes_dir``, which every machine has."""
    if homes_dir or not prefer_home_node:
        return ""
    return home_node


def home_volume(volume_binds: dict, named: str) -> str:
    """The name of the participant's home volume on a machine (``jy-home-<user>``): the named
    volume dockerspawner's ``volumes`` mount as the home, else ``named`` (the default home
    volume's name, formatted for this participant)."""
    for source, vol in volume_binds.items():
        if vol["bind"] == HOME_PATH and not os.path.isabs(source):
            return naming.volume_name(source)
    return naming.volume_name(named)


async def ensure_home_folder(path: str, log: logging.Logger, log_name: str) -> None:
    """The participant's folder ``path`` on the shared storage (``homes_dir``; "": none) exists
    before their service is created (made on a thread: the shared storage may be slow to
    answer), or the start fails saying so."""
    if not path:
        return
    try:
        made = await asyncio.to_thread(ensure_folder, path)
    except OSError as e:
        raise SpawnFailed(
            "The hub could not make your home folder on the shared storage. Please tell "
            "an organizer.",
            f"{log_name}: making the home folder {path} failed ({e}); the hub's "
            "container must have GPUHUB_HOMES_DIR mounted at the same path, writable by "
            "root (NFS: export it to the manager with no_root_squash)",
            reason="home",
        ) from None
    if made:
        log.info("Made the home folder %s for %s", path, log_name)


# ---- the firewall's and the network's inputs -----------------------------------------------------


async def known_nodes(broker: GPUBroker, docker_read: Docker) -> list[dict]:
    """The swarm's nodes as the broker last read them (the reservation's read), without a call
    of the server's own unless there was no read yet."""
    if broker.last_nodes is None:
        return await docker_read("nodes")
    return broker.last_nodes


async def servers_subnets(broker: GPUBroker, docker: Docker, network: str) -> list[str]:
    """The address ranges of the servers' network, read once per hub (the broker keeps them)."""
    known = broker.network_ranges.get(network)
    if known is None:
        known = broker.network_ranges[network] = subnets_of(
            await docker("inspect_network", network)
        )
    return known


def firewall_rules(
    policy: egress.Egress, subnets: list[str], hub_connect_url: str, port: int, nodes: list[dict]
) -> str:
    """A server's own firewall (``egress.server_rules``) under ``policy``: the servers'
    network's ranges (``subnets``), the proxy's port there (``hub_connect_url``'s), the
    server's ``port`` and the swarm's machines (``nodes``); "" with egress off."""
    if policy.mode == egress.OFF:
        return ""
    net = egress.ServerNetwork(
        subnets=tuple(subnets),
        proxy_port=urlsplit(hub_connect_url or "http://proxy:8000").port or 80,
        server_port=port,
        machines=egress.machine_addresses(nodes),
    )
    return egress.server_rules(policy, net)


def network_full(subnets: list[str], left: int, network: str, log_name: str) -> SpawnFailed | None:
    """The failure of a start whose task has had no address on ``network`` for a while, when
    no address is ``left`` there (Swarm leaves the task "new", without an error); None while
    some are (the manager may only be busy)."""
    if left > 0:
        return None
    ranges = ", ".join(subnets)
    return SpawnFailed(
        f"The hub's network has no address left for another server ({network}: {ranges}). "
        "Please tell an organizer: set GPUHUB_NETWORK_SUBNET to a larger private range "
        '(docs/organizer.md, "Large courses"), or stop servers nobody uses.',
        f"{log_name}: network {network} ({ranges}) is full",
        reason="network",
        status_code=503,
    )


# ---- the server's task until it answers --------------------------------------------------------


async def current_task(docker: Docker, service_id: str) -> dict | None:
    """The service's newest task (one API call; SwarmSpawner.get_task makes two)."""
    return tasks.newest(await docker("tasks", filters={"service": service_id}))


def task_failure(reading: tasks.TaskReading, node: str, service_name: str) -> Exception | None:
    """Why a start ends at this read of its task (on the GPU machine ``node``), where the task
    will not come up; None while it may."""
    if reading.phase is Phase.UNPLACEABLE:
        return SliceTaken(reading.detail)
    if reading.phase is Phase.NO_IMAGE:
        return SpawnFailed(
            f"The GPU machine {node} cannot get the server image "
            f"({reading.detail}). Please tell an organizer: that machine must be "
            "joined with the --registry option of `make join-command`, or be given "
            "the image with --image-tar.",
            reason="image",
        )
    if reading.phase is Phase.NO_MOUNT:
        folder = reading.detail.rsplit(": ", 1)[-1]
        return SpawnFailed(
            f"The GPU machine {node} lacks the shared folder {folder}, which "
            "every server mounts. Please tell an organizer: that machine must have the "
            "hub's shared storage (tutorials, datasets) mounted at the same paths as the "
            "other machines.",
            reason="mount",
        )
    if reading.phase is Phase.ENDED:
        return RuntimeError(
            f"Service {service_name} did not start: task {reading.state}: {reading.detail}"
        )
    return None


async def wait_for_port(host: str, port: int) -> None:
    """Until a server accepts connections at ``host``:``port`` (the caller bounds the wait),
    probing every PORT_PROBE_S; before the container exists the address does not answer at
    all, hence the short connect timeout."""
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(PORT_PROBE_S)
            continue
        writer.close()
        return


def published_address(service: dict, port: int, host_ip: str, name: str) -> tuple[str, int]:
    """Where the hub connects to a server reached through the port Swarm published for its
    ``port`` (``use_internal_ip`` off): ``host_ip`` and that port, from the ``service`` as
    the Engine API inspects it (named ``name``)."""
    published = (service.get("Endpoint") or {}).get("Ports") or []
    for entry in published:
        if entry.get("TargetPort") == port and entry.get("PublishedPort"):
            return host_ip, entry["PublishedPort"]
    raise RuntimeError(
        f"Service {name} publishes no port for the server's port {port} "
        f"(published: {published}); with use_internal_ip = False the hub connects to "
        "host_ip and that published port"
    )
