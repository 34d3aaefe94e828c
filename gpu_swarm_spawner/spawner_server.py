"""The server itself: its service's spec (service_spec.py), its home, and its task until it
answers. Part of GPUSwarmSpawner (spawner.py).
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

from docker.types import Resources
from traitlets import HasTraits

from . import (
    contract,
    egress,
    naming,
    service_spec,
    tasks,
)
from .errors import SliceTaken, SpawnFailed
from .homes import HOME_PATH, ensure_folder, folder_of
from .tasks import Phase

#: seconds between the spawner's TCP probes of a starting server's port (wait_for_port): a
#: refused connection costs the hub about 0.05 ms, and a server answers on average half this
#: later than it could
PORT_PROBE_S = 0.05


def subnets_of(network: dict) -> list[str]:
    """The address ranges of a network as the Engine API inspects it."""
    return [c["Subnet"] for c in network.get("IPAM", {}).get("Config") or [] if c.get("Subnet")]


class ServerSpec(HasTraits):
    """GPUSwarmSpawner's server: the service's spec, the home, the task."""

    # ---- what goes into the service ----------------------------------------------------------

    def disk(self) -> service_spec.Disk:
        """What the disk watch of the server's machine holds it to (its container's labels)."""
        return service_spec.Disk(
            budget_mb=contract.disk_budget_mib(self.disk_budget_gb),
            safety_percent=self.disk_safety_percent,
        )

    def limits(self) -> service_spec.Limits:
        return service_spec.Limits(
            mem_limit=self.mem_limit,
            mem_guarantee=self.mem_guarantee,
            cpu_limit=self.cpu_limit,
            cpu_guarantee=self.cpu_guarantee,
            pids_limit=self.pids_limit or 0,
        )

    async def server_spec(self) -> service_spec.Server:
        """Everything this server's service is made from (service_spec.create_kwargs)."""
        cores = self.limits().cpu_limit
        held = self.holding
        if service_spec.within_machine(cores, held.node_cores) != cores:
            self.log.info(
                "%s: cpu_limit of %g cores is more than the %g of %s; limited to those",
                self.log_name,
                cores,
                held.node_cores,
                held.machine,
            )
        return service_spec.Server(
            name=self.service_name,
            user=self.user.name,
            image=self.image,
            args=await self.get_command(),
            env=self.get_env(),
            mounts=self.mounts,
            network=self.network_name,
            holding=self.holding,
            limits=self.limits(),
            port=self.port,
            use_internal_ip=self.use_internal_ip,
            service_labels=dict(self.service_labels),
            extra_container_spec=self.extra_container_spec,
            extra_task_spec=self.extra_task_spec,
            extra_resources_spec=self.extra_resources_spec,
            extra_placement_spec=self.extra_placement_spec,
            extra_endpoint_spec=self.extra_endpoint_spec,
            extra_create_kwargs=self.extra_create_kwargs,
            firewall=await self.firewall_rules(),
            disk=self.disk(),
        )

    async def firewall_rules(self) -> str:
        """The server's own firewall (``egress.server_rules``): the servers' network's ranges,
        the proxy's port there (``hub_connect_url``'s), this server's port and the swarm's
        machines as the latest read of the swarm has them; "" with ``egress`` off."""
        policy = egress.read_egress(self.egress)
        if policy.mode == egress.OFF:
            return ""
        net = egress.ServerNetwork(
            subnets=tuple(await self._servers_subnets()),
            proxy_port=urlsplit(self.hub_connect_url or "http://proxy:8000").port or 80,
            server_port=self.port,
            machines=egress.machine_addresses(await self._known_nodes()),
        )
        return egress.server_rules(policy, net)

    async def _known_nodes(self) -> list[dict]:
        """The swarm's nodes as the broker last read them (the reservation's read), without a
        call of this server's own unless there was no read yet."""
        if self.broker.last_nodes is None:
            return await self.docker_read("nodes")
        return self.broker.last_nodes

    async def _servers_subnets(self) -> list[str]:
        """The address ranges of the servers' network, read once per hub (the broker's)."""
        known = self.broker.network_ranges.get(self.network_name)
        if known is None:
            network = await self.docker("inspect_network", self.network_name)
            known = self.broker.network_ranges[self.network_name] = subnets_of(network)
        return known

    def service_resources(self) -> Resources:
        return service_spec.resources(self.limits(), self.extra_resources_spec, self.holding)

    def container_labels(self) -> dict:
        return service_spec.container_labels(self.user.name, self.holding, self.disk())

    def get_env(self):
        return {**super().get_env(), **service_spec.gpu_env(self.holding)}

    @property
    def mounts(self):
        """The server's mounts (service_spec.mounts): dockerspawner's ``volumes`` as bind
        mounts and named volumes, and with ``homes_dir`` the participant's folder there as the
        home."""
        return service_spec.mounts(
            self.volume_binds, self.home_folder, self.service_labels, self.mount_driver_config
        )

    # ---- the home ----------------------------------------------------------------------------

    @property
    def home_folder(self) -> str:
        """The participant's home on shared storage (``homes_dir``); "" without it."""
        return folder_of(self.homes_dir, self.escaped_name) if self.homes_dir else ""

    async def _ensure_home_folder(self) -> None:
        """With ``homes_dir``: the participant's folder there exists before their service is
        created (made on a thread: the shared storage may be slow to answer), or the start
        fails saying so."""
        path = self.home_folder
        if not path:
            return
        try:
            made = await asyncio.to_thread(ensure_folder, path)
        except OSError as e:
            raise SpawnFailed(
                "The hub could not make your home folder on the shared storage. Please tell "
                "an organizer.",
                f"{self.log_name}: making the home folder {path} failed ({e}); the hub's "
                "container must have GPUHUB_HOMES_DIR mounted at the same path, writable by "
                "root (NFS: export it to the manager with no_root_squash)",
                reason="home",
            ) from None
        if made:
            self.log.info("Made the home folder %s for %s", path, self.log_name)

    def _home_volume(self) -> str:
        """The name of the participant's home volume on a machine (``jy-home-<user>``)."""
        for source, vol in self.volume_binds.items():
            if vol["bind"] == HOME_PATH and not os.path.isabs(source):
                return naming.volume_name(source)
        return naming.volume_name(self.format_volume_name(contract.HOME_VOLUME, self))

    def _home_to_prefer(self) -> str:
        """The machine this server goes to first: the one holding the participant's home
        volume (``prefer_home_node``); none with ``homes_dir``, which every machine has."""
        if self.homes_dir or not self.prefer_home_node:
            return ""
        return self.home_node

    # ---- the server's task until it answers --------------------------------------------------

    def _follow(self, reading: tasks.TaskReading) -> None:
        """Act on one read of the server's task: the broker told once Swarm has placed it, the
        participant told the stage, and the start ended where the task will not come up."""
        if reading.placed:
            self.broker.placed(self)  # Swarm counts the slices itself now (or refused them)
            self._phase("placed")
        if reading.phase is Phase.RUNNING:
            self._phase("running")
        self.task_ip = reading.address or self.task_ip
        if reading.phase is Phase.UNPLACEABLE:
            raise SliceTaken(reading.detail)
        if reading.phase is Phase.NO_IMAGE:
            raise SpawnFailed(
                f"The GPU machine {self.holding.node} cannot get the server image "
                f"({reading.detail}). Please tell an organizer: that machine must be "
                "joined with the --registry option of `make join-command`, or be given "
                "the image with --image-tar.",
                reason="image",
            )
        if reading.phase is Phase.NO_MOUNT:
            folder = reading.detail.rsplit(": ", 1)[-1]
            raise SpawnFailed(
                f"The GPU machine {self.holding.node} lacks the shared folder {folder}, which "
                "every server mounts. Please tell an organizer: that machine must have the "
                "hub's shared storage (tutorials, datasets) mounted at the same paths as the "
                "other machines.",
                reason="mount",
            )
        if reading.phase is Phase.ENDED:
            raise RuntimeError(
                f"Service {self.service_name} did not start: task {reading.state}: {reading.detail}"
            )
        stage = reading.stage(self.holding.node)  # none while Swarm retries a rejected task
        if stage:
            self._report(*stage)

    async def _check_network_room(self) -> None:
        """The server's task has had no address on the network for ``tasks.UNALLOCATED_S``
        (Swarm leaves it "new", without an error, when the network is out of addresses): fail
        with the organizer's fix when no address is left, else go on waiting (the manager may
        only be busy)."""
        subnets = await self._servers_subnets()
        if not subnets:
            return
        nodes, all_tasks = await self.broker.read_swarm(self._read_swarm)
        left = tasks.addresses_left(subnets, all_tasks, self.network_name, len(nodes))
        self.log.warning(
            "%s has had no address on %s (%s) for %.0f s; %d address(es) left there",
            self.log_name,
            self.network_name,
            ", ".join(subnets),
            tasks.UNALLOCATED_S,
            left,
        )
        if left > 0:
            return
        raise SpawnFailed(
            f"The hub's network has no address left for another server ({self.network_name}: "
            f"{', '.join(subnets)}). Please tell an organizer: set GPUHUB_NETWORK_SUBNET to a "
            'larger private range (docs/organizer.md, "Large courses"), or stop servers nobody '
            "uses.",
            f"{self.log_name}: network {self.network_name} ({', '.join(subnets)}) is full",
            reason="network",
            status_code=503,
        )

    async def _current_task(self) -> dict | None:
        """The service's newest task (one API call; SwarmSpawner.get_task makes two)."""
        return tasks.newest(await self.docker("tasks", filters={"service": self.object_id}))

    async def _discard_service(self) -> None:
        if self.object_id:
            await self.remove_object()
            self.object_id = ""
        self.clear_gpu()

    async def wait_for_port(self, address: str) -> None:
        """Until the server accepts connections where the hub will connect to it (the caller
        bounds the wait); ``address`` is the task's address on the network, or "".

        The hub's own readiness check backs off up to a second between tries, and its first
        tries come before the service name resolves on the overlay; cheap TCP probes every
        PORT_PROBE_S let its first check succeed instead. They dial what ``get_ip_and_port``
        hands the hub (``connect_address``), by default the task's address: a name not yet
        registered would fall through to the upstream DNS and block a resolver thread for
        seconds. Before the container exists the address does not answer at all, hence the
        short connect timeout.
        """
        host, port = await self.connect_address(address)
        while True:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(PORT_PROBE_S)
                continue
            writer.close()
            self._phase("answered")
            return

    async def connect_address(self, task_ip: str) -> tuple[str, int]:
        """Where the hub connects to the server (dockerspawner's options), given the task's
        address on the network (or ""):

        - ``use_internal_hostname`` (dockerspawner turns it on with ``internal_ssl``): the
          service name, which the server's certificate is made for (``ssl_alt_names``);
        - ``use_internal_ip`` (the default here): the task's address, or the service name while
          the task has none. Right after a server of the same name stopped, Docker's DNS can go
          on answering with the old task's address for a while (a participant who restarted
          within seconds got "server never showed up" after a minute); the address needs no DNS;
        - neither: ``host_ip`` and the port Swarm published for the server's port.
        """
        if self.use_internal_hostname:
            return self.internal_hostname, self.port
        if self.use_internal_ip:
            return task_ip or self.service_name, self.port
        service = await self.docker("inspect_service", self.object_id or self.service_name)
        published = (service.get("Endpoint") or {}).get("Ports") or []
        for entry in published:
            if entry.get("TargetPort") == self.port and entry.get("PublishedPort"):
                return self.host_ip, entry["PublishedPort"]
        raise RuntimeError(
            f"Service {self.service_name} publishes no port for the server's port {self.port} "
            f"(published: {published}); with use_internal_ip = False the hub connects to "
            "host_ip and that published port"
        )
