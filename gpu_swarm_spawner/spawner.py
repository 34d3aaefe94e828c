"""GPUSwarmSpawner: each user's server is a Swarm service holding slices of one GPU.

How a spawn runs, top-down (the methods appear in this order below). JupyterHub's spawn page
shows ``options_form`` (what ``spawn_offer`` lets this user choose) and reads the posted form
with ``options_from_form``; its spawn handler then asks the gate (step 0) before anything else.
The names this class takes from dockerspawner: ``self.docker(method, ...)`` (Docker calls
that change something, on the broker's thread pool: ``executor``; the swarm's reads go on the
broker's reading thread, ``docker_read``), ``service_name``, ``object_id`` (the service's
id once created), ``network_name``; what it takes from JupyterHub through the one door,
``internals.SpawnerInternals``: ``log_name``, ``saved_user_options``, ``write_row_now``,
``server_start_timeout`` and the ``ready``/``start_timeout`` hooks (docs/internals.md).

0. ``refusal_before_spawn``: before JupyterHub's own work for a spawn, its spawn page and REST
   API ask it (``gate.py``). A participant no GPU has room for is refused there, with the same
   message as step 1 would give. For a spawn let through, the hub's GPU broker (``broker.py``)
   chooses a GPU with the placement policy (``placement.py``) over the swarm's inventory
   (``inventory.py``) and claims its slices at once: it hands back the spawn's one
   ``broker.Reservation`` (what it holds, where, its release), kept for ``start``.
1. JupyterHub's ``User.spawn`` applies the options (``apply_user_options``: a whole GPU, or
   none), adds the line's longest wait to ``start_timeout`` (``time_before_server_start``, in
   ``internals.SpawnerInternals.run_pre_spawn_hook``), then calls ``start``, which begins a new
   ``Attempt`` (``attempt.py``: this start's marks, progress, wait and refusal), removes a
   service of the same name left from an earlier server (``GPUChoice.clear_leftover``) and
   takes the gate's reservation as it is while it stands (``reserve_gpu``): the broker chooses
   once per spawn, unless a race is lost (below). Without one, it reserves itself. No GPU
   fits: the participant is told so (``NoGPUSliceAvailable``, HTTP 503) before anything is
   created, or waits in the broker's line (``waiting_line``; ``line.py``) until slices are
   given to them. What the server then holds is one record, ``holding`` (``holding.py``),
   persisted in the hub's database (``get_state``) and emptied in ``clear_gpu``.
2. ``start`` calls dockerspawner's ``DockerSpawner.start`` (SwarmSpawner has none of its
   own): it checks the image against ``allowed_images``, finds no service of the name (start
   removed any leftover; ``remove`` stays False), and hops back into this class:
   ``create_object`` creates the service from ``server_spec`` (the slices of ``holding`` as a
   generic resource of its GPU's kind, its UUID in the environment), and ``start_object``
   waits for its task: each task read is classified by ``tasks.read_task``; Swarm refusing to
   place it means another server took the slice first (``SliceTaken``: ``start`` reserves
   anew without that GPU), a machine without the image fails at once, and the wait ends when
   the server listens.
3. ``DockerSpawner.start`` then asks ``get_ip_and_port`` where to connect (the task's address
   on the network) and returns it from ``start``; JupyterHub records it, checks the server
   answers (its ``/api``) and adds the proxy's route.
4. Later, ``poll`` reports the server stopped when it is gone (``reconcile.verdict``), or
   away for longer than ``server_lost_after`` while Swarm tries to bring it back; a server
   Swarm replaced goes on at its new address. After a hub restart, ``get_url`` says where
   each server answers now. ``stop`` asks the server to shut down, then removes its service.

Each step's details are a call away, with explicit arguments: ``spawner_gpu.py`` (the choice
of a GPU, its refusals, the line: ``GPUChoice``, made by ``gpu_chooser`` from this
spawner's current inputs whenever needed; it keeps no state of its own),
``spawner_server.py`` (the home, the firewall's inputs, the task until the server answers),
``spawner_health.py`` (poll's verdict, the stop) and ``spawner_page.py`` (the spawn page,
progress, the dashboard's records) are functions and small objects that never read this
class. What they are handed of the spawn is its data objects: the ``Reservation``, the
``Holding`` and the ``Attempt``. The spawner itself is only the broker's key for its
reservation and place in line (``Spawn.owner``); the line's journal names each entry by its
owner's user and server name.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from docker.types import Resources
from jupyterhub.utils import format_exception
from traitlets import Bool, Float, Instance, Unicode, default

from . import (
    broker,
    contract,
    egress,
    events,
    inventory,
    profiles,
    reconcile,
    service_spec,
    spawner_health,
    spawner_page,
    spawner_server,
    tasks,
)
from .attempt import Attempt
from .errors import NoGPUSliceAvailable, SliceTaken, SpawnFailed
from .holding import Holding
from .homes import folder_of
from .reconcile import Health
from .spawner_gpu import GPUChoice, LineRules, Spawn, hub_disk_refusal
from .spawner_health import node_state
from .tasks import Phase
from .traits import GPUSwarmSpawnerTraits

__all__ = ["GPUSwarmSpawner", "NoGPUSliceAvailable", "SliceTaken", "SpawnFailed"]


class GPUSwarmSpawner(GPUSwarmSpawnerTraits):
    """A ``dockerspawner.SwarmSpawner`` that gives every server slices of exactly one GPU.

    GPUs are advertised to Swarm by the worker setup as discrete generic resources, one kind per
    GPU (the kind is the GPU UUID, the value its number of slices). At start the spawner reads
    the swarm's inventory, picks a GPU with the placement policy, reserves ``slices_per_server``
    of that kind (or all of them, for a full GPU; Swarm enforces the count) and tells the
    container which device it holds. The module's docstring walks through a spawn; the
    settings (traits) are in ``traits.py``.

    JupyterHub's and dockerspawner's hooks are methods of this class; each hands what it
    needs, explicitly, to a pure function or small object of ``spawner_gpu.py`` (the choice of
    a GPU), ``spawner_server.py`` (the server, its home, its task), ``spawner_health.py``
    (poll's verdict, the stop) or ``spawner_page.py`` (the spawn page, progress, the
    dashboard's records), none of which reads the spawner.
    """

    #: What the server holds (holding.py): its GPU slices, or the machine of a server without
    #: a GPU; persisted in the hub database (get_state/load_state), emptied by clear_gpu.
    holding = Instance(Holding, args=())
    #: The latest start (attempt.py): made new by each start, kept after it ends.
    attempt = Instance(Attempt, args=())
    full_gpu_requested = Bool(False)  # this spawn's choice on the spawn page
    cpu_only_requested = Bool(False)  # ... or no GPU at all
    home_node = Unicode("")  # the machine of the user's last server (its home volume); kept
    task_ip = Unicode("")  # the server's address on the network, once its task has one
    line_lost = Float(0)  # loaded from the database: waiting since then when the hub stopped
    # why the hub stopped the server (``stopped_by_hub``: for its machine's disk, or idle so
    # that its machine could be given back), as its participant reads it on their page until
    # their next start; persisted
    stopped_why = Unicode("")
    #: the reservation refusal_before_spawn made, until start takes it (or the gate forgets it)
    _gate_reservation: broker.Reservation | None = None
    _away_since = None  # when (time.monotonic) poll first found the server away (recovering)

    # ---- what every server of the hub shares -------------------------------------------------

    @property
    def broker(self) -> broker.GPUBroker:
        """What all servers of this hub share: the Docker thread pool, the read of the swarm
        and the slices claimed but not yet placed (``broker.py``)."""
        prefixes = tuple(self.gpu_kind_prefixes)
        return broker.of_hub(
            self.docker_api_threads, prefixes, self.inventory_max_age, self.line_interval
        )

    @property
    def executor(self):
        """The broker's thread pool, for every Docker call (dockerspawner's has 1 thread)."""
        return self.broker.executor

    def docker_read(self, method: str, *args, **kwargs) -> Awaitable:
        """A Docker call that only reads, on the broker's reading thread (``docker`` queues
        behind the creations and removals of a burst)."""
        return self.broker.read(self.docker_call, method, *args, **kwargs)

    async def _read_swarm(self) -> tuple[list[dict], list[dict]]:
        nodes = await self.docker_read("nodes")
        # all tasks: those of a service being removed still hold their slices until they stop
        all_tasks = await self.docker_read("tasks")
        return nodes, all_tasks

    async def gpu_inventory(self) -> list[inventory.GPU]:
        """The swarm's GPUs and their used slices (this hub's claims included).

        Spawns share a read that is in flight or younger than ``inventory_max_age``: under a
        burst of 50 spawns the manager answers a few reads instead of 50, and participants who
        do not fit are told so without waiting for another read behind the burst's own calls.
        """
        return await self.broker.inventory(self._read_swarm)

    # ---- the spawn page, and JupyterHub's questions about a server (spawner_page.py) ---------

    def spawn_offer(self) -> profiles.Offer:
        """What this user may choose: the environments of ``allowed_images``, a full GPU, no
        GPU."""
        images = self.allowed_images_now()
        return profiles.offer(
            images if isinstance(images, dict) else {},
            self.image,
            self.slices_per_server,
            self.full_gpu_for,
            is_admin=bool(getattr(self.user, "admin", False)),
            cpu_only=self.cpu_only_servers,
        )

    @default("options_form")
    def _spawn_page_form(self):
        def form(spawner):
            return spawner_page.spawn_form(spawner.spawn_offer())

        return form

    @default("options_from_form")
    def _spawn_page_form_reader(self):
        return profiles.options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        def apply(spawner, user_options):
            full, none = spawner_page.read_choice(user_options, spawner.spawn_offer())
            spawner.full_gpu_requested, spawner.cpu_only_requested = full, none
            spawner.forget_one_off_choices()

        return apply

    def forget_one_off_choices(self) -> None:
        """JupyterHub keeps a start's options for the next start without options ("Start My
        Server"). Waiting in line and starting without a GPU answer the moment (the GPUs were
        full): the next start asks for a GPU again, and is offered both again if it must."""
        saved = dict(self.saved_user_options())
        kept = profiles.without_one_off_choices(saved)
        if kept != saved:
            self.write_row_now(user_options=kept)

    @property
    def ready_withheld(self) -> bool:
        """JupyterHub's ``ready`` is answered False for a spawn cancelled in the line
        (``internals.SpawnerInternals.ready``): JupyterHub records a server when a spawn
        begins, and a spawn cancelled by the hub stopping would otherwise be reported "ready"
        to the waiting participant's page, which then reloads into the stopping hub instead
        of waiting for it (spawn_pending.html)."""
        return self.attempt.cancelled_in_line

    @property
    def without_gpu(self) -> bool:
        """A server starting or running without a GPU: the hub's home and spawn-pending pages
        say so. A running server is read from what it holds (``holding`` outlives a hub
        restart); one starting, from the participant's choice."""
        if self.pending == "spawn":
            return self.cpu_only_requested
        return bool(self.ready) and not self.holding.gpu

    def time_before_server_start(self) -> int:
        """JupyterHub bounds the whole run of ``start`` by ``start_timeout``: with the line on,
        that run includes the wait in line, so the line's longest wait is added for JupyterHub
        (``internals.SpawnerInternals.run_pre_spawn_hook``); the server's own start, once it
        has its slices, keeps the configured ``start_timeout`` (``server_start_timeout``)."""
        if self.waiting_line == "off":
            return 0
        return self.line_max_wait or 30 * 24 * 3600  # 0: no limit

    # ---- 0. before JupyterHub's spawn work (gate.py) -----------------------------------------

    async def refusal_before_spawn(self, user_options: dict | None) -> SpawnFailed | None:
        """The refusal a start with ``user_options`` would meet at once, asked before
        JupyterHub does its own work for a spawn (``gate.py``). None when the spawn may go on:
        a GPU fits (its slices are reserved for this spawn from now, so the others asking in
        the same burst see them taken; ``start`` takes that reservation as its own,
        ``forget_gate_reservation`` frees it if it never runs), the participant waits in line
        or starts without a GPU, or the options are not valid (JupyterHub's spawn then says
        what is wrong). The same inventory, claims and rules as ``reserve_gpu``."""
        t0 = time.monotonic()
        full = self.hub_disk_refusal()
        if full is not None:
            self.log.warning("%s", full.log_message)
            return full
        options = user_options
        if options is None:  # JupyterHub starts with the last start's options
            options = self.saved_user_options()
        try:
            profiles.check_line_choice(options)
            offered = self.spawn_offer()
            profiles.check_environment(options, offered)  # before any slice is claimed
            choice = profiles.gpu_choice(options, offered)
        except profiles.ChoiceError:
            return None
        if choice == profiles.NONE:
            return None
        request = self.gpu_request(full_gpu=choice == profiles.FULL)
        gpus = self.gpu_chooser()
        try:
            reservation = await self.broker.reserve(self, request, self._read_swarm)
        except broker.NoRoom as e:
            if gpus.joins_line(e.gpus, request, options):
                return None
            if reconcile.held_by_user(e.tasks, self.user.name):
                return None  # their own earlier server holds slices: start removes it first
            refusal = gpus.refusal(e, request, options)
            self.log.info("%s", refusal.log_message)
            gpus.refused_after(refusal, t0, "before JupyterHub's spawn")
            return refusal
        self._gate_reservation = reservation
        return None

    def forget_gate_reservation(self) -> None:
        """The spawn ``refusal_before_spawn`` let through has ended, or JupyterHub's part of it
        has: a reservation its ``start`` has not taken (JupyterHub's limits, an error before
        the start) is freed. One the start took is the start's to release."""
        reservation, self._gate_reservation = self._gate_reservation, None
        if reservation is not None:
            reservation.forget()

    # ---- 1. start ----------------------------------------------------------------------------

    async def start(self):
        """Reserve slices of one GPU, then start the service there (module docstring)."""
        # a new attempt: nothing of the last start's marks, wait, refusal or messages stays;
        # it takes the reservation the gate made for this spawn, if it made one
        handed, self._gate_reservation = self._gate_reservation, None
        attempt = self.attempt = Attempt.begin(handed)
        self.line_lost = 0  # a new start: the message about a line lost to a restart goes
        self.stopped_why = ""  # ... and the one about a stop the hub made
        self._away_since = None
        gpus = self.gpu_chooser()
        try:
            full = self.hub_disk_refusal()
            if full is not None:
                raise full
            await gpus.clear_leftover()
            if self.cpu_only_requested:
                started = await self._start_without_gpu()
            else:
                started = await self._start_on_a_gpu(handed)
        except NoGPUSliceAvailable as e:
            gpus.refused_after(e, attempt.started_at, "in the spawner")
            attempt.refused = not self.object_id  # no service made or left: poll knows it
            raise
        except Exception as e:
            message, _ = format_exception(e, only_jupyterhub=True)
            self._record("failed", reason=message or f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            # whichever reservation it ended with, or the gate's when it took none (a server
            # without a GPU): Swarm counts the slices of a server that runs
            self.broker.release(self)
        self._record(
            "started",
            seconds=round(attempt.seconds(), 2),
            waited=None if attempt.waited is None else round(attempt.waited, 1),
            gpu=self.holding.gpu,
            node=self.holding.machine,
            phases=dict(attempt.phases) or None,
        )
        return started

    async def _start_on_a_gpu(self, handed: broker.Reservation | None = None):
        """``handed``: the gate's reservation for this spawn; the first try takes it while it
        stands, the next ones (a race lost) reserve anew without the GPU lost."""
        lost = set()
        for try_number in range(1, self.placement_attempts + 1):
            self._hold(await self.reserve_gpu(frozenset(lost), handed=handed), try_number)
            handed = None
            try:
                # dockerspawner's start: create_object, then start_object (both below)
                started = await super().start()
                self.home_node = self.holding.node
                return started
            except SliceTaken as e:
                gpu = self.holding.gpu
                lost.add(gpu)
                self.log.info("%s lost the race for %s: %s", self.log_name, gpu, e)
                self._report(15, f"{gpu} was taken a moment ago; trying another GPU")
                await self._discard_service()
            except Exception:
                # the hub does not stop a server whose start failed: its service would stay,
                # retried by Swarm and holding its slices
                await self._discard_service()
                raise
        # Every attempt lost a race. If the GPUs are now full, reserve_gpu says so; otherwise
        # many servers are starting at this very moment.
        await self.reserve_gpu(may_wait=False)
        raise NoGPUSliceAvailable(
            "Many servers are starting at this moment and the GPU slices chosen for yours were "
            "taken first. Please try again in a few seconds.",
            f"{self.log_name}: gave up after {self.placement_attempts} lost slice races "
            f"({', '.join(sorted(lost))})",
        )

    async def _start_without_gpu(self):
        """A server without a GPU (the participant's choice): no slice, no GPU in the
        container; on the machine with their home, else on the GPU machine with most room."""
        self.clear_gpu()
        starting = self.broker.cpu_only_starting
        starting.add(self.service_name)
        try:
            held = self.holding = await self._place_without_gpu()
            where = f" on {held.cpu_node}" if held.cpu_node else ""
            self.log.info("Starting %s without a GPU%s", self.log_name, where)
            self._report(20, f"Starting without a GPU{where}: CPU only, no GPU slice reserved")
            try:
                started = await super().start()
            except SliceTaken as e:
                await self._discard_service()
                raise SpawnFailed(
                    f"The machine {held.cpu_node or 'chosen'} has no room for another server "
                    f"right now ({e}). Please try again in a minute or ask an organizer.",
                    reason="capacity",
                    status_code=503,
                ) from None
            except Exception:
                await self._discard_service()
                raise
            self.home_node = held.cpu_node or self.home_node
            return started
        finally:
            starting.discard(self.service_name)

    # ---- 1a. the GPU choice, a collaborator (spawner_gpu.py) ---------------------------------

    def gpu_chooser(self) -> GPUChoice:
        """This spawn's choice of a GPU, given what it needs of this spawner: the broker, who
        the spawn is for, the line's settings, and what to do with progress and events."""
        return GPUChoice(
            self.broker,
            Spawn(
                owner=self,
                log_name=self.log_name,
                service_name=self.service_name,
                spawn_url=self._spawn_url(),
                home_volume=self._home_volume(),
            ),
            LineRules(
                waiting_line=self.waiting_line,
                line_max_wait=self.line_max_wait,
                line_max_length=self.line_max_length,
                cpu_only_servers=self.cpu_only_servers,
                cpu_only_max_servers=self.cpu_only_max_servers,
                fleet=self.fleet,
            ),
            read_swarm=self._read_swarm,
            docker=self.docker,
            log=self.log,
            report=self._report,
            record=self._record,
            healed=self._healed,
            joined_line=self._joined_line,
        )

    def gpu_request(self, full_gpu: bool | None = None) -> broker.Request:
        """What this spawn asks the broker for (a whole GPU: ``full_gpu``, by default what the
        participant chose for this start)."""
        full_gpu = self.full_gpu_requested if full_gpu is None else full_gpu
        return broker.Request(
            slices=None if full_gpu else self.slices_per_server,
            policy=self.placement_policy,
            seed=self.user.name,
            prefer_node=self._home_to_prefer(),
        )

    def hub_disk_refusal(self) -> SpawnFailed | None:
        """The refusal every start meets while the hub's data folder is nearly full
        (``spawner_gpu.hub_disk_refusal``); None when there is room."""
        return hub_disk_refusal(self.hub_data_dir, self.hub_data_min_free_mb, self.log_name)

    async def reserve_gpu(
        self,
        exclude: frozenset = frozenset(),
        may_wait: bool = True,
        handed: broker.Reservation | None = None,
    ) -> broker.Reservation:
        """Slices of one GPU for this start's request (``GPUChoice.reserve``): ``handed``, the
        gate's reservation, while it stands; else the broker's choice, or a wait in line."""
        return await self.gpu_chooser().reserve(
            self.gpu_request(), self.user_options, self.attempt, exclude, may_wait, handed
        )

    def _hold(self, reservation: broker.Reservation, try_number: int) -> None:
        """Take the reserved slices as this server's (create_object reads them)."""
        self.attempt.reservation = reservation
        self.holding = self.gpu_chooser().hold(reservation, try_number)
        self.attempt.mark("slices")

    async def _place_without_gpu(self) -> Holding:
        """What a server without a GPU holds (``GPUChoice.place_without_gpu``)."""
        return await self.gpu_chooser().place_without_gpu(self._home_to_prefer())

    def _joined_line(self, attempt: Attempt) -> None:
        """This spawn joined the line: the hub's database says so, and the dashboard's copy of
        the line is written from now on."""
        self._save_state()
        self.reporter.journal()

    def _spawn_url(self) -> str:
        """This server's spawn URL on the hub (``/hub/spawn/<user>[/<server>]``)."""
        base = getattr(self.hub, "base_url", "/hub/")
        path = f"{base.rstrip('/')}/spawn/{getattr(self.user, 'escaped_name', self.user.name)}"
        return f"{path}/{self.name}" if self.name else path

    # ---- 2. dockerspawner's hops: the service, until it answers (spawner_server.py) ----------

    async def create_object(self):
        """dockerspawner's hop: create the server's service; start_object then waits for it.

        SwarmSpawner's version builds the same spec from the same traits but then waits for the
        first task in 1-second sleeps, which adds about a second to nearly every spawn.
        """
        await self._ensure_home_folder()  # a bind mount's source must exist
        spec = service_spec.create_kwargs(await self.server_spec())
        created = await self.docker("create_service", **spec)
        self.attempt.mark("created")
        return created

    async def start_object(self):
        """dockerspawner's hop after create_object: wait until the server listens.

        Replaces SwarmSpawner's wait, which polls every 1-11 s and waits on an unplaceable
        task until the hub's start_timeout. Each task read is acted on by ``_follow``; reads
        back off while Swarm places the task or its machine pulls the image, and come often
        once the container is about to run. At the first read of a running task the server's
        port is probed (every ``spawner_server.PORT_PROBE_S``, for at most ``http_timeout``:
        a server that never listens is left to the hub's own check), so the spawn ends when the
        server listens rather than at the next task poll.
        """
        self.broker.created(self, self.object_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.server_start_timeout
        delay = self.task_poll_interval
        unallocated_check = loop.time() + tasks.UNALLOCATED_S
        while True:
            reading = tasks.read_task(await self._current_task(), self.network_name)
            self._follow(reading)
            if reading.state != "new":
                unallocated_check = None
            elif unallocated_check is not None and loop.time() > unallocated_check:
                unallocated_check = None
                await self._check_network_room()
            if reading.phase is Phase.RUNNING:
                # probed once the container runs: dialled earlier, before the container had
                # joined the overlay, the address answered about 0.25 s late on the bed's
                # machines (its first answer after the server listened; docs/benchmarks.md)
                if self.probe_server:
                    await self._wait_until_it_listens(reading.address)
                return
            if loop.time() > deadline:
                raise TimeoutError(
                    f"Service {self.service_name} still {reading.state} after "
                    f"{self.server_start_timeout} s: {reading.detail}"
                )
            await asyncio.sleep(delay)
            about_to_run = reading.state in ("ready", "starting")
            delay = self.task_poll_interval if about_to_run else min(delay * 1.5, 2.0)

    async def _wait_until_it_listens(self, address: str) -> None:
        """The running server's port probed for at most ``http_timeout``; a probe that failed
        (no published port) fails the start."""
        self._report(95, "Waiting for JupyterLab to answer")
        probe = asyncio.ensure_future(self.wait_for_port(address))
        try:
            done, _ = await asyncio.wait({probe}, timeout=self.http_timeout)
            if done:
                probe.result()
                self._report(95, "JupyterLab is answering")
        finally:
            probe.cancel()

    def _follow(self, reading: tasks.TaskReading) -> None:
        """Act on one read of the server's task: the broker told once Swarm has placed it, the
        participant told the stage, and the start ended where the task will not come up
        (``spawner_server.task_failure``)."""
        if reading.placed:
            self.broker.placed(self)  # Swarm counts the slices itself now (or refused them)
            self.attempt.mark("placed")
        if reading.phase is Phase.RUNNING:
            self.attempt.mark("running")
        self.task_ip = reading.address or self.task_ip
        failure = spawner_server.task_failure(reading, self.holding.node, self.service_name)
        if failure is not None:
            raise failure
        stage = reading.stage(self.holding.node)  # none while Swarm retries a rejected task
        if stage:
            self._report(*stage)

    async def _current_task(self) -> dict | None:
        return await spawner_server.current_task(self.docker, self.object_id)

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
        full = spawner_server.network_full(subnets, left, self.network_name, self.log_name)
        if full is not None:
            raise full

    async def wait_for_port(self, address: str) -> None:
        """Until the server accepts connections where the hub will connect to it (the caller
        bounds the wait); ``address`` is the task's address on the network, or "".

        The hub's own readiness check backs off up to a second between tries, and its first
        tries come before the service name resolves on the overlay; cheap TCP probes every
        ``spawner_server.PORT_PROBE_S`` let its first check succeed instead. They dial what
        ``get_ip_and_port`` hands the hub (``connect_address``), by default the task's
        address: a name not yet registered would fall through to the upstream DNS and block a
        resolver thread for seconds.
        """
        await spawner_server.wait_for_port(*await self.connect_address(address))
        self.attempt.mark("answered")

    async def _discard_service(self) -> None:
        if self.object_id:
            await self.remove_object()
            self.object_id = ""
        self.clear_gpu()

    # ---- 2a. what the service is made of (service_spec.py) -----------------------------------

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
            holding=held,
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

    async def firewall_rules(self) -> str:
        """The server's own firewall (``spawner_server.firewall_rules``); "" with ``egress``
        off (nothing read then)."""
        policy = egress.read_egress(self.egress)
        if policy.mode == egress.OFF:
            return ""
        subnets = await self._servers_subnets()
        nodes = await spawner_server.known_nodes(self.broker, self.docker_read)
        return spawner_server.firewall_rules(
            policy, subnets, self.hub_connect_url, self.port, nodes
        )

    async def _servers_subnets(self) -> list[str]:
        return await spawner_server.servers_subnets(self.broker, self.docker, self.network_name)

    # what create_kwargs gives the service, for readers of one part (the tests of the hub's
    # config and of the labels): create_object builds them from server_spec itself
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

    # ---- 2b. the home ------------------------------------------------------------------------

    @property
    def home_folder(self) -> str:
        """The participant's home on shared storage (``homes_dir``); "" without it."""
        return folder_of(self.homes_dir, self.escaped_name) if self.homes_dir else ""

    async def _ensure_home_folder(self) -> None:
        await spawner_server.ensure_home_folder(self.home_folder, self.log, self.log_name)

    def _home_volume(self) -> str:
        named = self.format_volume_name(contract.HOME_VOLUME, self)
        return spawner_server.home_volume(self.volume_binds, named)

    def _home_to_prefer(self) -> str:
        return spawner_server.home_to_prefer(self.homes_dir, self.prefer_home_node, self.home_node)

    # ---- 3. where the hub connects -----------------------------------------------------------

    async def get_ip_and_port(self):
        """dockerspawner's hop at the end of its start: where the hub connects to the server
        (``connect_address``), which ``start`` returns to JupyterHub."""
        return await self.connect_address(self.task_ip)

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
        return spawner_server.published_address(service, self.port, self.host_ip, self.service_name)

    # ---- 4. poll, and the stop (spawner_health.py) -------------------------------------------

    async def poll(self):
        """Running (None), or why not: what the server's tasks say (``reconcile.verdict``).

        A server Swarm is bringing back (its container being replaced after its engine
        restarted, its machine not answering the manager, its new task not placed yet) is
        *away*: it counts as running for ``server_lost_after`` seconds, so the hub neither
        drops its route nor lets its participant be refused for the slices it holds; back at a
        new address, the hub's record follows it (``_follow_address``). Away for longer, or
        gone (its service removed, its task ended for good), it is reported stopped, and the
        hub removes its service so that its participant can start again elsewhere.

        A recent read of the swarm shared by all servers (``poll_read_max_age``) answers
        "running" without a Docker call of this server's own; any other answer is checked
        with its own calls (``_look``). A refused spawn has no service: JupyterHub's clean-up
        polls it, and the answer needs no Docker call (which would wait behind the calls of
        the servers that did fit).
        """
        if self.attempt.refused and not self.object_id:
            return 0
        if self.poll_read_max_age and self.object_id:
            by_service, nodes = await self.broker.recent_read(
                self._read_swarm, self.poll_read_max_age
            )
            task = by_service.get(self.object_id)
            node = nodes.get((task or {}).get("NodeID") or "")
            if task and node:
                states = {node["ID"]: node_state(node)}
                seen = reconcile.verdict([task], states, self.network_name)
                if seen.health is Health.RUNNING:
                    return self._judge(seen)
        seen, _ = await self._look()
        return self._judge(seen)

    async def _look(self) -> tuple[reconcile.Verdict, dict]:
        """The server's own calls (``spawner_health.look``): the verdict, and its service ({}
        when it is gone), whose id is kept."""
        seen, service = await spawner_health.look(
            self.docker, self.object_id or self.service_name, self.network_name
        )
        if service:
            self.object_id = service["ID"]
        return seen, service

    def _judge(self, seen: reconcile.Verdict):
        """``poll``'s answer for what was seen (``spawner_health.judge``), with the time this
        server has been away; running, the hub's record follows its address."""
        judged = spawner_health.judge(
            seen,
            time.monotonic(),
            self._away_since,
            self.pending == "spawn",
            self.server_lost_after,
            self.log_name,
        )
        self._away_since = judged.away_since
        for action, message in judged.healed:
            self._healed(action, message)
        if seen.health is Health.RUNNING:
            self._follow_address(seen.address)
        return judged.answer

    def _follow_address(self, address: str) -> None:
        """A server Swarm gave a new container (its engine or machine restarted) runs at a new
        address: the hub's record of it follows, and the route keeper (``keeper.py``) points
        its route there within seconds."""
        self.task_ip = address or self.task_ip
        server = self.server
        by_address = self.use_internal_ip and not self.use_internal_hostname
        if server is None or not spawner_health.moved(
            address, server.ip, self.service_name, by_address
        ):
            return
        was, server.ip = server.ip, address
        self.write_row_now()
        self._healed(
            "moved",
            f"Swarm replaced the container of {self.log_name}: now at {address} (was {was}); "
            "its route follows",
        )

    async def get_url(self):
        """Where the server answers now: JupyterHub asks after a restart of its own, for every
        server ``poll`` calls running, and records what this returns.

        While the hub was away Swarm may have replaced a server's container (the manager's
        engine restarted with it): it answers at a new address, or will in a moment, so this
        waits up to ``server_lost_after`` for it to run. A hub killed in the middle of a spawn
        may not have saved what the server holds: it is taken back from the service's labels.
        """
        seen, service = await spawner_health.settled(self._look, self.server_lost_after)
        if seen.health is not Health.RUNNING:
            return await super().get_url()  # JupyterHub's check that it answers then decides
        held = spawner_health.held_by_service(service)
        if held is not None and not self.holding.gpu:  # the hub's database lost it: taken back
            self.holding = held
            self.log.info(
                "%s: its service holds %d slice(s) of %s; taken back into the hub's state",
                self.log_name,
                held.slices,
                held.gpu,
            )
            self._save_state()
        self.task_ip = seen.address
        host, port = await self.connect_address(seen.address)
        server = self.server
        return f"{server.proto}://{host}:{port}{server.base_url}"

    async def stop(self, now=False):
        """dockerspawner's stop (the service removed); then the line looks at the GPUs at
        once, as this server's slices are free for whoever waits."""
        held = dict(gpu=self.holding.gpu, node=self.holding.machine)  # cleared by stop
        try:
            await super().stop(now)
        finally:
            self.broker.nudge()
            self._record("stopped", **held)

    async def stop_object(self):
        """dockerspawner's hop before the service is removed (SwarmSpawner's does nothing):
        the server is asked to shut itself down, and its slices are free once it has
        (``spawner_health.Shutdown``).

        Removed while it runs, a server's task waits 2 s in Swarm (its "gossip converge" delay
        for any task on an overlay network) before the server is even signalled, and its slices
        count until its container has exited: about 4 s in all on the test bed, during which
        the next in line waits. Asked through its own API (``/api/shutdown``), it ends in about
        a second and its task completes (the restart policy is ``on-failure``), which frees the
        slices at once; the service is then removed as before. A server that refuses or does not
        answer is removed at once, as SwarmSpawner does. ``server_shutdown_timeout`` bounds the
        whole; 0 skips it.

        While more servers stop than the hub has threads for Docker calls (the end of a
        workshop), each is asked to shut down and removed without waiting for its task to
        end: their looks at their tasks would crowd out the calls that remove the services,
        and so many stops free slices for any waiting participant anyway.
        """
        if not self.server_shutdown_timeout or not self.object_id or self.server is None:
            return
        await spawner_health.Shutdown(
            docker=self.docker,
            broker=self.broker,
            service_id=self.object_id,
            url=self.server.url,
            token=self.api_token,
            user=self.user,
            server_name=self.name,
            delete_token=self.delete_api_token,
            timeout=self.server_shutdown_timeout,
            log=self.log,
            log_name=self.log_name,
        ).run()

    # ---- what the participant and the organizer are told (spawner_page.py) -------------------

    async def progress(self):
        """The stages of this spawn, as they happen (JupyterHub stops reading at the end)."""
        async for stage in spawner_page.progress(lambda: self.attempt.progress):
            yield stage

    @property
    def failure_heading(self) -> str:
        """The heading of ``failure_message`` on the hub's home page."""
        return spawner_page.failure_heading(self.stopped_why, self.active)

    @property
    def failure_message(self) -> str:
        """What the participant reads on the hub's home page (templates/hub) about this
        server's latest start, or the hub's stop of it (``spawner_page.failure_message``)."""
        return spawner_page.failure_message(
            self.stopped_why, self.line_lost, self.active, self.last_start_error
        )

    def stopped_by_hub(self, reason: str) -> None:
        """The hub, not its participant, is stopping this server (for its machine's disk,
        ``stopped_for_disk``; idle, so that its GPU machine can be given back, fleet.py's idle
        stop through ``internals.stop_idle_server``): its participant reads ``reason`` on their
        page until their next start, after a hub restart too. Called before JupyterHub's stop,
        which writes the state."""
        self.stopped_why = reason

    def stopped_for_disk(self, reason: str, machine: str) -> None:
        """The hub is stopping this server for the disk of ``machine`` (``disk.py``): its
        participant is told ``reason`` (``stopped_by_hub``), and the dashboard lists the
        stop."""
        self.stopped_by_hub(reason)
        self._record(events.DISK_STOP, node=machine, reason=reason)

    @property
    def reporter(self) -> spawner_page.Reporter:
        """What tells this server's stages (progress bar) and events (dashboard)."""
        return spawner_page.Reporter(
            log=self.log,
            log_name=self.log_name,
            user=self.user.name,
            server=self.name or "",
            dashboard_dir=self.dashboard_dir,
            broker=self.broker,
            attempt=self.attempt,
        )

    def _report(self, progress: int, message: str) -> None:
        """Record a stage of the spawn for the progress bar (and the log)."""
        self.reporter.report(progress, message)

    def _record(self, kind: str, **fields) -> None:
        """An event for the dashboard; a failed write is logged, never raised."""
        self.reporter.record(kind, **fields)

    def _healed(self, action: str, message: str) -> None:
        self.reporter.healed(action, message)

    # ---- state (the hub's database) ----------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.home_node:
            state["home_node"] = self.home_node  # outlives the server (clear_state keeps it)
        if self.attempt.line_joined:
            state["line_joined"] = self.attempt.line_joined  # waiting: the spawn has not ended
        if self.line_lost:
            # kept through the stop JupyterHub makes at its start for a spawn that was pending
            # ("appears to have stopped while the Hub was down"), until the next start
            state["line_lost"] = self.line_lost
        if self.stopped_why:
            state["stopped_why"] = self.stopped_why  # kept through the stop, as line_lost
        state.update(self.holding.state())  # under the keys servers running since 0.1 have
        return state

    def load_state(self, state):
        super().load_state(state)
        self.holding = Holding.from_state(state)
        self.home_node = state.get("home_node", "")
        # only a hub that stopped while this spawn waited finds it in the database
        self.line_lost = state.get("line_joined") or state.get("line_lost", 0)
        # (written as "disk_stopped" before the idle stop said why too)
        self.stopped_why = state.get("stopped_why") or state.get("disk_stopped", "")

    def _save_state(self) -> None:
        """Write this spawner's state to the hub's database now (JupyterHub itself writes it
        only once a start or stop has finished)."""
        self.write_row_now(state=self.get_state())

    def clear_gpu(self):
        """The server holds nothing now (the one place its holding is emptied)."""
        self.holding = Holding()
        self.task_ip = ""

    def clear_state(self):
        super().clear_state()
        self.clear_gpu()
