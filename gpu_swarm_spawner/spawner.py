"""GPUSwarmSpawner: each user's server is a Swarm service holding slices of one GPU."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import jinja2
from docker.types import ContainerSpec, EndpointSpec, Mount, Placement, Resources, TaskTemplate
from dockerspawner import SwarmSpawner
from jupyterhub.spawner import SpawnException
from jupyterhub.utils import format_exception
from tornado import web
from traitlets import (
    Bool,
    Dict,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    validate,
)

from . import contract, inventory, naming, placement, profiles

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=True,
)


class SpawnFailed(SpawnException):
    """A start that failed for a reason the participant should read, on whichever page they are.

    JupyterHub shows ``jupyterhub_message`` on the error page (a failure within the spawn's
    first second), the spawn-pending page (later), the spawn form and the REST API's JSON body;
    any other exception raised in the first second becomes "500 : Unhandled error starting
    server". The log gets ``log_message``, with the details an organizer needs.
    """

    def __init__(self, message: str, log_message: str = "", *, reason="error", status_code=500):
        super().__init__(message, reason=reason, log_message=log_message, status_code=status_code)
        self.jupyterhub_message = message


class NoGPUSliceAvailable(SpawnFailed):
    """No GPU has room for the request: HTTP 503, with what the participant can do about it."""

    def __init__(self, message: str, log_message: str):
        super().__init__(message, log_message, reason="capacity", status_code=503)


def task_address(task: dict, network_name: str) -> str:
    """The task's IP address on ``network_name``, or "" when it has none there."""
    for attachment in task.get("NetworksAttachments") or []:
        if attachment.get("Network", {}).get("Spec", {}).get("Name") == network_name:
            addresses = attachment.get("Addresses") or [""]
            return addresses[0].split("/", 1)[0]
    return ""


def with_gpu_slices(generic, kind: str, slices: int) -> list[dict]:
    """Generic resources to reserve: ``generic`` (as docker-py takes them, ``{kind: value}`` or
    the Engine API's list of ``{"DiscreteResourceSpec": {"Kind": ..., "Value": ...}}``) plus
    ``slices`` of the GPU ``kind``, which replace any entry of that kind. The Engine API's list.
    """
    # docker-py's own conversion (and checks) of the dict form
    listed = Resources(generic_resources=generic or [])["Reservations"]["GenericResources"]
    others = [entry for entry in listed if all(s.get("Kind") != kind for s in entry.values())]
    return [*others, {"DiscreteResourceSpec": {"Kind": kind, "Value": slices}}]


class SliceTaken(RuntimeError):
    """Swarm could not place the service: another server took the slice first."""


#: Swarm's words for a task it cannot place (e.g. "no suitable node (insufficient resources
#: on 3 nodes)"); the task then stays pending until something frees up.
UNPLACEABLE = "no suitable node"


def unplaceable(status: dict) -> bool:
    """A task status saying Swarm cannot place the task (no node has the resources)."""
    return status["State"].lower() == "pending" and UNPLACEABLE in status.get("Err", "")


#: Swarm's words for a task whose machine has not got the image and cannot pull it. Swarm would
#: retry it every few seconds until the start timeout, so the spawn fails at once instead.
NO_IMAGE = "No such image"


def image_missing(status: dict) -> bool:
    return status["State"].lower() == "rejected" and NO_IMAGE in status.get("Err", "")


#: Task states on the way to running, and what the participant is told about each.
STAGES = {
    "new": (35, "Waiting for Swarm to place the server"),
    "pending": (35, "Waiting for Swarm to place the server"),
    "assigned": (40, "Swarm assigned the server to {node}"),
    "accepted": (45, "{node} accepted the server"),
    "preparing": (55, "Preparing the container on {node} (pulling the image if it is missing)"),
    "ready": (65, "Container ready on {node}"),
    "starting": (75, "Container starting on {node}"),
    "running": (90, "Container running on {node}"),
}


class GPUSwarmSpawner(SwarmSpawner):
    """A ``dockerspawner.SwarmSpawner`` that gives every server slices of exactly one GPU.

    GPUs are advertised to Swarm by the worker setup as discrete generic resources, one kind per
    GPU (the kind is the GPU UUID, the value its number of slices). At start the spawner reads
    the swarm's inventory, picks a GPU with the placement policy, reserves ``gpu_slices`` of that
    kind (Swarm enforces the count) and tells the container which device it holds.
    """

    gpu_slices = Integer(
        1,
        config=True,
        help="""
        How many slices of one GPU each server reserves. A GPU advertised as 3 slices holds
        three 1-slice servers, or one 3-slice ("full GPU") server. All slices of a server
        always come from the same GPU. Example: ``c.GPUSwarmSpawner.gpu_slices = 1``.
        """,
    )

    prefer_home_node = Bool(
        True,
        config=True,
        help="""
        Start a returning user's server on the machine that ran their previous one when a GPU
        there has room: home volumes (``jy-home-<user>``) are local to a machine, so elsewhere
        the user would find an empty home. Turn off when homes are on shared storage.
        """,
    )

    full_gpu_slices = Integer(
        0,
        config=True,
        help="""
        The slices of a whole GPU (the GPU machines' slices per GPU, e.g. 3). When it is more
        than ``gpu_slices``, the spawn page offers a "full GPU" that reserves all of them on
        one GPU (to ``full_gpu_for``). 0: no such choice.
        """,
    )

    full_gpu_for = Unicode(
        "admins",
        config=True,
        help="""
        Who may choose a full GPU on the spawn page: ``admins`` or ``all``.
        """,
    )

    gpu_kind_prefix = Unicode(
        contract.KIND_PREFIX,
        config=True,
        help="""
        Generic-resource kinds that start with this are GPUs; the rest of the kind is ignored
        for matching and the whole kind is the GPU UUID handed to the container.
        The worker setup advertises kinds like ``GPU-8d2c6f1e-...=3``. Default: ``GPU-``.
        """,
    )

    @validate("gpu_kind_prefix")
    def _validate_gpu_kind_prefix(self, proposal):
        if not proposal.value.strip():
            raise TraitError(
                "GPUSwarmSpawner.gpu_kind_prefix must not be empty: it selects which "
                "generic resources are GPUs; leave it at the default 'GPU-'"
            )
        return proposal.value

    placement_policy = Unicode(
        "spread",
        config=True,
        help="""
        How a GPU is chosen for a new server: ``spread`` (the GPU with most free slices, so each
        participant shares a GPU with as few others as possible) or ``pack`` (the busiest GPU
        that still fits, so whole machines can be emptied and switched off).
        """,
    )

    # the settings that take one of a few words, and those words
    _CHOICES = {"placement_policy": placement.POLICIES, "full_gpu_for": profiles.FULL_GPU_FOR}

    @validate(*_CHOICES)
    def _validate_choice(self, proposal):
        choices = self._CHOICES[proposal.trait.name]
        if proposal.value not in choices:
            raise TraitError(
                f"GPUSwarmSpawner.{proposal.trait.name} is {proposal.value!r}; "
                f"write one of: {', '.join(choices)}"
            )
        return proposal.value

    placement_attempts = Integer(
        5,
        config=True,
        help="""
        How many GPUs a spawn tries when it loses the race for a slice (another server took it
        between reading the inventory and Swarm placing the service) before it gives up with
        the "no slice free" message. Each lost race costs about the task poll interval.
        """,
    )

    task_poll_interval = Float(
        0.2,
        config=True,
        help="""
        Seconds between the first checks of a new service's task (the delay then grows by half
        each time, up to 2 s). Small values notice a lost slice race or a started container
        sooner, at the cost of more Docker API calls. Default 0.2.
        """,
    )

    docker_api_threads = Integer(
        4,
        config=True,
        help="""
        Threads for blocking Docker API calls, shared by all servers of the hub
        (dockerspawner gives each spawner class one thread). A few threads keep one slow call
        (a busy manager, a large listing) from holding up every other participant's spawn;
        many threads mostly add load on the manager. On the 3-node test bed 1, 2, 4 and 16
        threads gave the same figures for 50 simultaneous spawns (see ``make bench``).
        Takes effect at hub start.
        """,
    )

    inventory_max_age = Float(
        1.0,
        config=True,
        help="""
        Seconds a read of the swarm's nodes and tasks is reused by other spawns (reads in
        flight are always shared). Under a burst this keeps refusals instant and the manager
        unloaded; a slice freed within that time is seen by the next read. 0: a read per spawn
        unless one is in flight. Default 1.
        """,
    )

    probe_server = Bool(
        True,
        config=True,
        help="""
        After the container runs, wait until the server accepts connections where the hub will
        connect to it (``get_ip_and_port``: the task's address on the overlay network; the
        service name with ``use_internal_hostname``; ``host_ip`` and the published port with
        ``use_internal_ip = False``) before handing it to the hub (probes every 0.1 s, at most
        ``http_timeout``). Spawns then finish as soon as the server listens, instead of after
        the hub's backed-off checks. Turn off only where the hub cannot reach that address.
        """,
    )

    service_labels = Dict(
        config=True,
        help="""
        Labels put on every user service and home volume, e.g.
        ``{"gpu-jupyterhub.stack": "gpuhub"}``; ``make down`` finds what to remove by them.
        """,
    )

    pids_limit = Integer(
        0,
        config=True,
        help="""
        The most processes (and threads) a server may run at once, e.g. ``2048``: a fork bomb
        or a runaway data loader then stops there instead of exhausting the machine that other
        participants share. 0: no limit. Needs Docker 20.10 (API 1.41) on the swarm's
        managers and GPU machines. Leave room for the frameworks: every thread counts, and
        PyTorch's data loaders start a process per worker.
        """,
    )

    # the number settings with a least value: {trait: (least, "... or more", advice)}
    _MINIMUMS = {
        "gpu_slices": (1, "1 or more", "every server needs a slice (use 1 for a shared GPU)"),
        "placement_attempts": (1, "1 or more", ""),
        "docker_api_threads": (1, "1 or more", ""),
        "inventory_max_age": (0, "0 or more seconds", ""),
        "pids_limit": (0, "0 (no limit) or more", "write a number of processes such as 2048"),
    }

    @validate(*_MINIMUMS)
    def _validate_minimum(self, proposal):
        least, expected, advice = self._MINIMUMS[proposal.trait.name]
        if proposal.value < least:
            raise TraitError(
                f"GPUSwarmSpawner.{proposal.trait.name} must be {expected}, got {proposal.value}"
                + (f"; {advice}" if advice else "")
            )
        return proposal.value

    @default("prefix")
    def _default_prefix(self):
        # services are named jy-<escaped username>[--<server name>]
        return contract.SERVICE_PREFIX

    @default("object_name")
    def _object_name_default(self):
        """dockerspawner's name (``jy-<escaped user>[--<server>]``) fitted into a Swarm service
        name: unchanged where it fits (so running servers are found again), else cut and ended
        with a hash of the whole name (``naming.fit``). dockerspawner calls this again when the
        image changes."""
        return naming.service_name(super()._object_name_default())

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        # the hub sits on the same attachable overlay and reaches servers at their task's address
        return True

    @default("extra_endpoint_spec")
    def _default_extra_endpoint_spec(self):
        # DNS round robin: works without IPVS and is all a single-task service needs. A port
        # published for a hub that does not use internal IPs needs the routing mesh's virtual
        # IP instead: Swarm refuses ingress ports with dnsrr.
        return {"mode": "dnsrr"} if self.use_internal_ip else {}

    # What the running server holds; persisted in the hub database (get_state/load_state).
    gpu_uuid = Unicode("")
    gpu_node = Unicode("")
    gpu_slices_held = Integer(0)
    gpu_slices_wanted = Integer(0)  # this spawn's choice (spawn page); 0: gpu_slices
    home_node = Unicode("")  # the machine of the user's last server (its home volume); kept
    gpu_memory_mb = Integer(0)  # the memory budget of the slices held (0: unknown)
    task_ip = Unicode("")  # the server's address on the network, once its task has one

    _gpu_executor = None

    @property
    def executor(self):
        """One thread pool for the Docker calls of all servers (dockerspawner's has 1 thread)."""
        cls = GPUSwarmSpawner
        if cls._gpu_executor is None:
            cls._gpu_executor = ThreadPoolExecutor(
                self.docker_api_threads, thread_name_prefix="docker-api"
            )
        return cls._gpu_executor

    # ---- progress ---------------------------------------------------------------------------

    # this spawn's stages, newest last: {"progress": percent, "message": text}
    _progress_events = List()

    def _report(self, progress: int, message: str) -> None:
        """Record a stage of the spawn for the progress bar (and the log)."""
        events = self._progress_events
        if events and events[-1]["message"] == message:
            return
        events.append({"progress": progress, "message": message})
        self.log.debug("Spawn progress of %s: %s%% %s", self._log_name, progress, message)

    async def progress(self):
        """The stages of this spawn, as they happen (JupyterHub stops reading at the end)."""
        seen = 0
        while True:
            events = self._progress_events
            while seen < len(events):
                yield events[seen]
                seen += 1
            await asyncio.sleep(0.2)

    @property
    def failure_message(self) -> str:
        """What the participant was told when this server's latest start failed; "" when it
        did not fail (or a new start began). The hub's home page shows it (templates/hub)."""
        error = self._failed
        if not error:
            return ""
        message, _ = format_exception(error, only_jupyterhub=True)
        return message or f"The server could not start: {error}"

    # ---- choosing a GPU --------------------------------------------------------------------

    # Slices spawns of this hub have asked for that Swarm does not show as placed yet, by
    # spawner (see inventory.Claim); shared by all spawners of the hub process.
    _claims: dict[int, inventory.Claim] = {}
    # The latest read of the swarm, shared by spawns: (loop, future, started at loop time)
    _swarm_read: tuple | None = None

    async def _read_swarm(self) -> tuple[list[dict], list[dict]]:
        nodes = await self.docker("nodes")
        # all tasks: those of a service being removed still hold their slices until they stop
        tasks = await self.docker("tasks")
        return nodes, tasks

    async def gpu_inventory(self) -> list[inventory.GPU]:
        """The swarm's GPUs and their used slices, read from the Docker API.

        Spawns share a read that is in flight or younger than ``inventory_max_age``: under a
        burst of 50 spawns the manager answers a few reads instead of 50, and participants who
        do not fit are told so without waiting for another read behind the burst's own calls.
        Claims are added after the read, so a shared read still counts every slice this hub
        has asked for; Swarm stays the authority on what fits.
        """
        loop = asyncio.get_running_loop()
        read = self._shared_read(loop)
        if read is None:
            read = asyncio.ensure_future(self._read_swarm())
            GPUSwarmSpawner._swarm_read = (loop, read, loop.time())
        nodes, tasks = await asyncio.shield(read)
        return inventory.build_inventory(
            nodes, tasks, self.gpu_kind_prefix, claims=list(self._claims.values())
        )

    def _shared_read(self, loop) -> asyncio.Future | None:
        """The read of the swarm a spawn may share: one in flight, or one that succeeded less
        than ``inventory_max_age`` ago; None when a new read is needed."""
        if GPUSwarmSpawner._swarm_read is None:
            return None
        read_loop, read, started = GPUSwarmSpawner._swarm_read
        if read_loop is not loop:
            return None
        if not read.done():
            return read
        if read.cancelled() or read.exception() or loop.time() - started >= self.inventory_max_age:
            return None
        return read

    def _claim(self, claim: inventory.Claim | None) -> None:
        """Record (or, given None, drop) the slices this spawn has asked Swarm for."""
        if claim is None:
            if self._claims.pop(id(self), None) is not None:
                # Swarm placed (or refused) it: a read from before may not show it, so the
                # next spawn reads again rather than reuse that read
                GPUSwarmSpawner._swarm_read = None
        else:
            self._claims[id(self)] = claim

    async def reserve_gpu(self, exclude: frozenset = frozenset()) -> inventory.GPU:
        """Pick the GPU for this server, or refuse at once with a message people understand.

        ``exclude``: GPUs this spawn already lost a race for; they count as full.
        """
        gpus = [
            dataclasses.replace(g, used=g.slices) if g.uuid in exclude else g
            for g in await self.gpu_inventory()
        ]
        slices = self.slices_wanted
        home = self.home_node if self.prefer_home_node else ""
        gpu = placement.choose(
            gpus, slices, self.placement_policy, seed=self.user.name, prefer_node=home
        )
        if gpu is not None and home and gpu.node_name != home:
            self.log.info(
                "%s: no room on %s (their home), starting elsewhere", self._log_name, home
            )
            self._report(
                18,
                f"No GPU on {home}, where your files from last time are, has room: this server "
                f"starts on {gpu.node_name} with the home there (your files stay on {home})",
            )
        if gpu is not None:
            # no await since the inventory was built: no other spawn of this hub chose meanwhile
            self._claim(inventory.Claim(gpu.uuid, slices))
        else:
            used, total = inventory.totals(gpus)
            detail = ", ".join(f"{g.node_name}:{g.uuid}={g.used}/{g.slices}" for g in gpus)
            raise NoGPUSliceAvailable(
                placement.refusal_message(gpus, slices),
                f"No GPU with {slices} free slice(s) for {self._log_name}: "
                f"{used}/{total} slices in use on {len(gpus)} GPU(s) ({detail or 'none'})",
            )
        return gpu

    # ---- the spawn page ------------------------------------------------------------------------

    @property
    def slices_wanted(self) -> int:
        return self.gpu_slices_wanted or self.gpu_slices

    def spawn_offer(self) -> profiles.Offer:
        """What this user may choose: the environments of ``allowed_images``, a full GPU."""
        images = self._get_allowed_images()
        return profiles.offer(
            images if isinstance(images, dict) else {},
            self.image,
            self.gpu_slices,
            self.full_gpu_slices,
            self.full_gpu_for,
            is_admin=bool(getattr(self.user, "admin", False)),
        )

    @default("options_form")
    def _default_options_form(self):
        def form(spawner):
            offered = spawner.spawn_offer()
            if not offered.has_choices:
                return ""  # nothing to choose: the server starts at once
            return _TEMPLATES.get_template("spawn_options.html").render(offer=offered)

        return form

    @default("options_from_form")
    def _default_options_from_form(self):
        return profiles.options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        def apply(spawner, user_options):
            # the environment (user_options["image"]) is applied by DockerSpawner.start
            try:
                offered = spawner.spawn_offer()
                spawner.gpu_slices_wanted = profiles.slices_for(user_options, offered)
            except profiles.ChoiceError as e:
                raise web.HTTPError(400, str(e)) from None

        return apply

    async def start(self):
        self._progress_events = []  # this spawn's stages (progress() reads them)
        try:
            return await self._start_on_a_gpu()
        finally:
            self._claim(None)

    async def _start_on_a_gpu(self):
        lost = set()
        for attempt in range(1, self.placement_attempts + 1):
            gpu = await self.reserve_gpu(frozenset(lost))
            self.gpu_uuid, self.gpu_node = gpu.uuid, gpu.node_name
            self.gpu_slices_held = self.slices_wanted
            self.gpu_memory_mb = gpu.memory_budget_mb(self.slices_wanted)
            kind = "SIMULATED GPU" if gpu.simulated else "GPU"
            self.log.info(
                "Reserving %d slice(s) of %s %s on %s for %s (%d/%d free, attempt %d)",
                self.slices_wanted,
                kind,
                gpu.uuid,
                gpu.node_name,
                self._log_name,
                gpu.free,
                gpu.slices,
                attempt,
            )
            self._report(
                20,
                f"Reserving {self.slices_wanted} slice(s) of {kind} {gpu.uuid} on {gpu.node_name}",
            )
            try:
                started = await super().start()
                self.home_node = gpu.node_name
                return started
            except SliceTaken as e:
                lost.add(gpu.uuid)
                self.log.info("%s lost the race for %s: %s", self._log_name, gpu.uuid, e)
                self._report(15, f"{gpu.uuid} was taken a moment ago; trying another GPU")
                await self._discard_service()
            except Exception:
                # the hub does not stop a server whose start failed: its service would stay,
                # retried by Swarm and holding its slices
                await self._discard_service()
                raise
        # Every attempt lost a race. If the GPUs are now full, reserve_gpu says so; otherwise
        # many servers are starting at this very moment.
        await self.reserve_gpu()
        raise NoGPUSliceAvailable(
            "Many servers are starting at this moment and the GPU slices chosen for yours were "
            "taken first. Please try again in a few seconds.",
            f"{self._log_name}: gave up after {self.placement_attempts} lost slice races "
            f"({', '.join(sorted(lost))})",
        )

    async def _discard_service(self) -> None:
        if self.object_id:
            await self.remove_object()
            self.object_id = ""
        self.clear_gpu()

    async def _current_task(self) -> dict | None:
        """The service's newest task (one API call; SwarmSpawner.get_task makes two)."""
        tasks = await self.docker("tasks", filters={"service": self.object_id})
        if not tasks:
            return None
        return max(tasks, key=lambda t: (t.get("DesiredState") == "running", t["CreatedAt"]))

    async def start_object(self):
        """Wait until the server listens; a task Swarm cannot place means a lost race.

        Replaces SwarmSpawner's wait, which polls every 1-11 s and waits on an unplaceable
        task until the hub's start_timeout. As soon as Swarm has given the task its address on
        the network, the server's port is probed every 0.1 s alongside the task polls, so the
        spawn ends when the server listens rather than at the next (backed-off) task poll.
        """
        self._claim(inventory.Claim(self.gpu_uuid, self.gpu_slices_held, self.object_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        delay = self.task_poll_interval
        probe, probed_task = None, None
        try:
            while True:
                task = await self._current_task()
                status = task["Status"] if task else {"State": "new"}  # not created yet
                state = status["State"].lower()
                if task and (task.get("NodeID") or unplaceable(status)):
                    self._claim(None)  # Swarm counts the slices itself now (or refused them)
                if unplaceable(status):
                    raise SliceTaken(status["Err"])
                if image_missing(status):
                    raise SpawnFailed(
                        f"The GPU machine {self.gpu_node} cannot get the server image "
                        f"({status['Err']}). Please tell an organizer: that machine must be "
                        "joined with the --registry option of `make join-command`, or be given "
                        "the image with --image-tar.",
                        reason="image",
                    )
                if state not in STAGES and state != "rejected":
                    # failed, shutdown, complete, orphaned, remove: it will not come up
                    raise RuntimeError(
                        f"Service {self.service_name} did not start: task {state}: "
                        f"{status.get('Err') or status.get('Message')}"
                    )
                # "rejected" is retried by Swarm with a new task (Docker 20.10 network bug)
                if state in STAGES:
                    progress, message = STAGES[state]
                    self._report(progress, message.format(node=self.gpu_node))
                address = task_address(task, self.network_name) if task else ""
                self.task_ip = address or self.task_ip
                new_task = bool(task) and task["ID"] != probed_task
                if self.probe_server and new_task and (address or state == "running"):
                    if probe is not None:
                        probe.cancel()
                    probe = asyncio.ensure_future(self.wait_for_port(address))
                    probed_task = task["ID"]
                if state == "running":
                    if probe is not None:
                        self._report(95, "Waiting for JupyterLab to answer")
                        # a server that never listens is left to the hub's own check
                        await asyncio.wait({probe}, timeout=self.http_timeout)
                        if probe.done():
                            probe.result()  # a probe that failed (no published port) fails
                    return
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"Service {self.service_name} still {state} after "
                        f"{self.start_timeout} s: {status.get('Err') or status.get('Message')}"
                    )
                if probe is None:
                    await asyncio.sleep(delay)
                elif (await asyncio.wait({probe}, timeout=delay))[0]:
                    probe.result()  # a probe that failed (no published port) fails the start
                    self._report(95, "JupyterLab is answering")
                    return
                delay = min(delay * 1.5, 2.0)
        finally:
            if probe is not None:
                probe.cancel()

    async def wait_for_port(self, address: str) -> None:
        """Until the server accepts connections where the hub will connect to it (the caller
        bounds the wait); ``address`` is the task's address on the network, or "".

        The hub's own readiness check backs off up to a second between tries, and its first
        tries come before the service name resolves on the overlay; cheap TCP probes every
        0.1 s let its first check succeed instead. They dial what ``get_ip_and_port`` hands the
        hub (``connect_address``), by default the task's address: a name not yet registered
        would fall through to the upstream DNS and block a resolver thread for seconds. Before
        the container exists the address does not answer at all, hence the short connect
        timeout.
        """
        host, port = await self.connect_address(address)
        while True:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=0.5)
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.1)
                continue
            writer.close()
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

    async def get_ip_and_port(self):
        """Where the hub connects to the server: see ``connect_address``."""
        return await self.connect_address(self.task_ip)

    async def poll(self):
        """Running, or why not: a server whose node is gone counts as stopped.

        Swarm leaves the task of a vanished node "running" and queues a replacement that can
        never be placed (its GPU lived on that node); both mean the user should start again.
        """
        task = await self.get_task()
        if not task:
            return 0
        status = task["Status"]
        state = status["State"].lower()
        if unplaceable(status):
            return f"cannot be placed: {status['Err']}"
        if state not in STAGES:
            return f"task {state}: {status.get('Err') or status.get('Message')}"
        address = task_address(task, self.network_name)
        routed = self.server.ip if self.server else ""
        by_address = self.use_internal_ip and not self.use_internal_hostname
        if by_address and address and routed and routed not in (address, self.service_name):
            # Swarm replaced the container (it crashed): the hub's route points at the old one
            return f"the server's container was replaced (now at {address}, routed to {routed})"
        if task.get("NodeID"):
            node = await self.docker("inspect_node", task["NodeID"])
            node_state = node.get("Status", {}).get("State")
            if node_state != "ready":
                self.log.warning(
                    "Server %s is on node %s, which is %s: reporting it stopped",
                    self._log_name,
                    node.get("Description", {}).get("Hostname", task["NodeID"][:7]),
                    node_state,
                )
                return f"node {node_state}"
        return None

    # ---- what goes into the service ----------------------------------------------------------

    def service_resources(self) -> Resources:
        """CPU/memory/pids limits and reservations, plus this server's slices of its GPU."""
        configured = self.extra_resources_spec
        resources = Resources(
            **{
                "mem_limit": self.mem_limit,
                "mem_reservation": self.mem_guarantee,
                "cpu_limit": int(self.cpu_limit * 1e9) if self.cpu_limit else None,
                "cpu_reservation": int(self.cpu_guarantee * 1e9) if self.cpu_guarantee else None,
                **configured,
                "generic_resources": with_gpu_slices(
                    configured.get("generic_resources"), self.gpu_uuid, self.gpu_slices_held
                ),
            }
        )
        if self.pids_limit:
            # Engine API 1.41+; docker-py's Resources has no argument for it
            resources.setdefault("Limits", {})["Pids"] = self.pids_limit
        return resources

    def service_labels_for_server(self) -> dict:
        """Labels of the service: configured ones plus who holds which GPU slices."""
        return {
            **self.service_labels,
            **(self.extra_create_kwargs.get("labels") or {}),
            contract.USER_LABEL: self.user.name,
            contract.GPU_LABEL: self.gpu_uuid,
            contract.SLICES_LABEL: str(self.gpu_slices_held),
        }

    async def create_object(self):
        """Create the server's service; start_object then waits for its task.

        SwarmSpawner's version builds the same spec from the same traits but then waits for the
        first task in 1-second sleeps, which adds about a second to nearly every spawn.
        """
        container = ContainerSpec(
            **{
                "image": self.image,
                "env": self.get_env(),
                "args": await self.get_command(),
                "mounts": self.mounts,
                **self.extra_container_spec,
            }
        )
        task_template = TaskTemplate(
            **{
                "container_spec": container,
                "resources": self.service_resources(),
                "networks": [self.network_name] if self.network_name else [],
                "placement": Placement(**self.extra_placement_spec),
                **self.extra_task_spec,
            }
        )
        endpoint = dict(self.extra_endpoint_spec)
        if not self.use_internal_ip:
            endpoint.setdefault("ports", {None: (self.port, "tcp")})
        return await self.docker(
            "create_service",
            **{
                "name": self.service_name,
                "task_template": task_template,
                "endpoint_spec": EndpointSpec(**endpoint),
                **self.extra_create_kwargs,
                "labels": self.service_labels_for_server(),
            },
        )

    def get_env(self):
        env = super().get_env()
        if self.gpu_uuid:
            env.update(
                {
                    # the NVIDIA container runtime exposes only this device to the container
                    "NVIDIA_VISIBLE_DEVICES": self.gpu_uuid,
                    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                    # CUDA accepts UUIDs too, so this stays right with or without the runtime
                    "CUDA_VISIBLE_DEVICES": self.gpu_uuid,
                    "GPU_UUID": self.gpu_uuid,
                    "GPU_SLICES": str(self.gpu_slices_held),
                    "GPU_NODE": self.gpu_node,
                    "GPU_SIMULATED": "1" if contract.is_simulated(self.gpu_uuid) else "0",
                    # TensorFlow otherwise grabs all memory of the GPU it shares with others
                    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
                }
            )
            if self.gpu_memory_mb:
                # not enforced (yet): a budget for notebooks, gpu-info and frameworks to respect
                env["GPU_MEMORY_LIMIT_MB"] = str(self.gpu_memory_mb)
        return env

    @property
    def mounts(self):
        """Absolute sources are bind mounts; plain names are (labelled) named volumes.

        The base class makes every entry of ``volumes`` a bind mount, which cannot express the
        per-user named volume a home directory needs. Volume names longer than Docker allows
        are shortened (``naming.fit``); ``jy-home-<user>`` of every GitHub login fits as it is.
        """
        mounts = []
        for source, vol in self.volume_binds.items():
            read_only = vol["mode"] == "ro"
            if os.path.isabs(source):
                mounts.append(Mount(vol["bind"], source, type="bind", read_only=read_only))
            else:
                mounts.append(
                    Mount(
                        vol["bind"],
                        naming.volume_name(source),
                        type="volume",
                        read_only=read_only,
                        labels=dict(self.service_labels),
                        driver_config=self.mount_driver_config,
                    )
                )
        return mounts

    # ---- state ----------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.home_node:
            state["home_node"] = self.home_node  # outlives the server (clear_state keeps it)
        if self.gpu_uuid:
            state.update(
                gpu_uuid=self.gpu_uuid,
                gpu_node=self.gpu_node,
                gpu_slices=self.gpu_slices_held,
                gpu_memory_mb=self.gpu_memory_mb,
            )
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_uuid = state.get("gpu_uuid", "")
        self.gpu_node = state.get("gpu_node", "")
        self.gpu_slices_held = state.get("gpu_slices", 0)
        self.gpu_memory_mb = state.get("gpu_memory_mb", 0)
        self.home_node = state.get("home_node", "")

    def clear_gpu(self):
        self.gpu_uuid = ""
        self.gpu_node = ""
        self.gpu_slices_held = 0
        self.gpu_memory_mb = 0
        self.task_ip = ""

    def clear_state(self):
        super().clear_state()
        self.clear_gpu()
