"""GPUSwarmSpawner: each user's server is a Swarm service holding slices of one GPU.

How a spawn runs, top-down (the methods appear in this order below):

0. ``refusal_before_spawn``: before JupyterHub's own work for a spawn, its spawn page and REST
   API ask it (``gate.py``). A participant no GPU has room for is refused there, with the same
   message as step 1 would give. For a spawn let through, the hub's GPU broker (``broker.py``)
   chooses a GPU with the placement policy (``placement.py``) over the swarm's inventory
   (``inventory.py``) and claims its slices at once: it hands back the spawn's one
   ``broker.Reservation`` (what it holds, where, its release), kept for ``start``.
1. ``start`` (JupyterHub calls it) begins a new ``Attempt`` (``attempt.py``: this start's
   marks, progress, wait and refusal) and takes the gate's reservation as it is while it stands
   (``reserve_gpu``): the broker chooses once per spawn. Without one, it reserves itself. No
   GPU fits: the participant is told so (``NoGPUSliceAvailable``, HTTP 503) before anything is
   created, or waits in the broker's line (``waiting_line``; ``line.py``) until slices are
   given to them. What the server then holds is one record, ``holding`` (``holding.py``),
   persisted in the hub's database (``get_state``) and emptied in ``clear_gpu``.
2. ``SwarmSpawner.start`` (dockerspawner) then hops back into this class:
   ``create_object`` creates the service (the slices reserved as a generic resource of the
   chosen GPU's kind, its UUID in the environment), and ``start_object`` waits for its task:
   each task read is classified by ``tasks.read_task``; Swarm refusing to place it means
   another server took the slice first (``SliceTaken``: ``start`` reserves anew without that
   GPU), a machine without the image fails at once, and the wait ends when the server listens.
3. JupyterHub asks ``get_ip_and_port`` where to connect: the task's address on the network.
4. Later, ``poll`` reports the server stopped when it is gone (``reconcile.verdict``), or
   away for longer than ``server_lost_after`` while Swarm tries to bring it back; a server
   Swarm replaced goes on at its new address. After a hub restart, ``get_url`` says where
   each server answers now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from jupyterhub.utils import format_exception
from traitlets import Bool, Float, Instance, Unicode

from . import (
    broker,
    inventory,
    profiles,
    reconcile,
    service_spec,
    tasks,
)
from .attempt import Attempt
from .errors import NoGPUSliceAvailable, SliceTaken, SpawnFailed
from .holding import Holding
from .reconcile import Health
from .spawner_gpu import GPUChoice, LineRules, Spawn, hub_disk_refusal
from .spawner_health import ServerHealth, node_state
from .spawner_page import SpawnPage
from .spawner_server import ServerSpec
from .tasks import Phase
from .traits import GPUSwarmSpawnerTraits

__all__ = ["GPUSwarmSpawner", "NoGPUSliceAvailable", "SliceTaken", "SpawnFailed"]


class GPUSwarmSpawner(SpawnPage, ServerHealth, ServerSpec, GPUSwarmSpawnerTraits):
    """A ``dockerspawner.SwarmSpawner`` that gives every server slices of exactly one GPU.

    GPUs are advertised to Swarm by the worker setup as discrete generic resources, one kind per
    GPU (the kind is the GPU UUID, the value its number of slices). At start the spawner reads
    the swarm's inventory, picks a GPU with the placement policy, reserves ``slices_per_server``
    of that kind (or all of them, for a full GPU; Swarm enforces the count) and tells the
    container which device it holds. The module's docstring walks through a spawn; the
    settings (traits) are in ``traits.py``.
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
    # why the hub stopped the server for the disk of its machine (disk.py), as its participant
    # reads it on their page until their next start; persisted
    disk_stopped = Unicode("")
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

    # ---- the GPU choice, a collaborator (spawner_gpu.py) -------------------------------------

    def gpu_choice(self) -> GPUChoice:
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
        return await self.gpu_choice().reserve(
            self.gpu_request(), self.user_options, self.attempt, exclude, may_wait, handed
        )

    def _hold(self, reservation: broker.Reservation, attempt: int) -> None:
        """Take the reserved slices as this server's (create_object reads them)."""
        self.attempt.reservation = reservation
        self.holding = self.gpu_choice().hold(reservation, attempt)
        self._phase("slices")

    async def _place_without_gpu(self) -> Holding:
        """What a server without a GPU holds (``GPUChoice.place_without_gpu``)."""
        return await self.gpu_choice().place_without_gpu(self._home_to_prefer())

    def _joined_line(self, attempt: Attempt) -> None:
        """This spawn joined the line: the hub's database says so, and the dashboard's copy of
        the line is written from now on."""
        self._save_state()
        self._journal()

    def _spawn_url(self) -> str:
        """This server's spawn URL on the hub (``/hub/spawn/<user>[/<server>]``)."""
        base = getattr(self.hub, "base_url", "/hub/")
        path = f"{base.rstrip('/')}/spawn/{getattr(self.user, 'escaped_name', self.user.name)}"
        return f"{path}/{self.name}" if self.name else path

    # ---- JupyterHub's questions before a start -----------------------------------------------

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
        gpus = self.gpu_choice()
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
        self.disk_stopped = ""  # ... and the one about a stop for the disk
        self._away_since = None
        gpus = self.gpu_choice()
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

    def _phase(self, name: str) -> None:
        """This start reached ``name`` (events.PHASES), now: its first time is kept, in seconds
        from the start (after the line: a wait in it is not the start's)."""
        self.attempt.mark(name)

    async def _start_on_a_gpu(self, handed: broker.Reservation | None = None):
        """``handed``: the gate's reservation for this spawn; the first try takes it while it
        stands, the next ones (a race lost) reserve anew without the GPU lost."""
        lost = set()
        for attempt in range(1, self.placement_attempts + 1):
            self._hold(await self.reserve_gpu(frozenset(lost), handed=handed), attempt)
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

    # ---- 2. dockerspawner's hops: the service, until it answers ------------------------------

    async def create_object(self):
        """dockerspawner's hop: create the server's service; start_object then waits for it.

        SwarmSpawner's version builds the same spec from the same traits but then waits for the
        first task in 1-second sleeps, which adds about a second to nearly every spawn.
        """
        await self._ensure_home_folder()  # a bind mount's source must exist
        spec = service_spec.create_kwargs(await self.server_spec())
        created = await self.docker("create_service", **spec)
        self._phase("created")
        return created

    async def start_object(self):
        """dockerspawner's hop after create_object: wait until the server listens.

        Replaces SwarmSpawner's wait, which polls every 1-11 s and waits on an unplaceable
        task until the hub's start_timeout. Each task read is acted on by ``_follow``. Once the
        task runs, the server's port is probed (every ``spawner_server.PORT_PROBE_S``)
        alongside the task polls, so the spawn ends when the server listens rather than at the
        next (backed-off) task poll.
        """
        self.broker.created(self, self.object_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.server_start_timeout
        delay = self.task_poll_interval
        probe, probed_task = None, ""
        unallocated_check = loop.time() + tasks.UNALLOCATED_S
        try:
            while True:
                reading = tasks.read_task(await self._current_task(), self.network_name)
                self._follow(reading)
                if reading.state != "new":
                    unallocated_check = None
                elif unallocated_check is not None and loop.time() > unallocated_check:
                    unallocated_check = None
                    await self._check_network_room()
                new_task = bool(reading.task_id) and reading.task_id != probed_task
                # probed once the container runs: dialled earlier, before the container had
                # joined the overlay, the address answered about 0.25 s late on the bed's
                # machines (its first answer after the server listened; docs/benchmarks.md)
                reachable = reading.phase is Phase.RUNNING
                if self.probe_server and new_task and reachable:
                    if probe is not None:
                        probe.cancel()
                    probe = asyncio.ensure_future(self.wait_for_port(reading.address))
                    probed_task = reading.task_id
                if reading.phase is Phase.RUNNING:
                    if probe is not None:
                        self._report(95, "Waiting for JupyterLab to answer")
                        # a server that never listens is left to the hub's own check
                        await asyncio.wait({probe}, timeout=self.http_timeout)
                        if probe.done():
                            probe.result()  # a probe that failed (no published port) fails
                    return
                if loop.time() > deadline:
                    raise TimeoutError(
                        f"Service {self.service_name} still {reading.state} after "
                        f"{self.server_start_timeout} s: {reading.detail}"
                    )
                if probe is None:
                    await asyncio.sleep(delay)
                elif (await asyncio.wait({probe}, timeout=delay))[0]:
                    probe.result()  # a probe that failed (no published port) fails the start
                    self._report(95, "JupyterLab is answering")
                    return
                # backed off while Swarm places the task or its machine pulls the image; read
                # often once the container is about to run, when the probe begins
                about_to_run = reading.state in ("ready", "starting")
                delay = self.task_poll_interval if about_to_run else min(delay * 1.5, 2.0)
        finally:
            if probe is not None:
                probe.cancel()

    # ---- 3. where the hub connects -----------------------------------------------------------

    async def get_ip_and_port(self):
        """JupyterHub's hop after start: where to connect to the server (``connect_address``)."""
        return await self.connect_address(self.task_ip)

    # ---- 4. poll, and the stop ---------------------------------------------------------------

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

    async def stop(self, now=False):
        """dockerspawner's stop (the service removed); then the line looks at the GPUs at
        once, as this server's slices are free for whoever waits."""
        held = dict(gpu=self.holding.gpu, node=self.holding.machine)  # cleared by stop
        try:
            await super().stop(now)
        finally:
            self.broker.nudge()
            self._record("stopped", **held)

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
        if self.disk_stopped:
            state["disk_stopped"] = self.disk_stopped  # kept through the stop, as line_lost
        state.update(self.holding.state())  # under the keys servers running since 0.1 have
        return state

    def load_state(self, state):
        super().load_state(state)
        self.holding = Holding.from_state(state)
        self.home_node = state.get("home_node", "")
        # only a hub that stopped while this spawn waited finds it in the database
        self.line_lost = state.get("line_joined") or state.get("line_lost", 0)
        self.disk_stopped = state.get("disk_stopped", "")

    def clear_gpu(self):
        """The server holds nothing now (the one place its holding is emptied)."""
        self.holding = Holding()
        self.task_ip = ""

    def clear_state(self):
        super().clear_state()
        self.clear_gpu()
