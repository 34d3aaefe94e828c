"""GPUSwarmSpawner: each user's server is a Swarm service holding slices of one GPU.

How a spawn runs, top-down (the methods appear in this order below):

0. ``refusal_before_spawn``: before JupyterHub's own work for a spawn, its spawn page and REST
   API ask it (``gate.py``). A participant no GPU has room for is refused there, with the same
   message as step 1 would give; a spawn let through claims its slices at once.
1. ``start`` (JupyterHub calls it): asks the hub's GPU broker (``broker.py``) for a GPU that
   fits, with the placement policy (``placement.py``) over the swarm's inventory
   (``inventory.py``); the broker claims the slices at once. No GPU fits: the participant is
   told so (``NoGPUSliceAvailable``, HTTP 503) before anything is created, or waits in the
   broker's line (``waiting_line``; ``line.py``) until slices are given to them.
2. ``SwarmSpawner.start`` (dockerspawner) then hops back into this class:
   ``create_object`` creates the service (the slices reserved as a generic resource of the
   chosen GPU's kind, its UUID in the environment), and ``start_object`` waits for its task:
   each task read is classified by ``tasks.read_task``; Swarm refusing to place it means
   another server took the slice first (``SliceTaken``: ``start`` tries the next GPU), a
   machine without the image fails at once, and the wait ends when the server listens.
3. JupyterHub asks ``get_ip_and_port`` where to connect: the task's address on the network.
4. Later, ``poll`` reports the server stopped when it is gone (``reconcile.verdict``), or
   away for longer than ``server_lost_after`` while Swarm tries to bring it back; a server
   Swarm replaced goes on at its new address. After a hub restart, ``get_url`` says where
   each server answers now.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable

import jinja2
from docker.errors import NotFound
from docker.types import (
    ContainerSpec,
    EndpointSpec,
    Mount,
    Placement,
    Resources,
    TaskTemplate,
)
from jupyterhub.spawner import SpawnException
from jupyterhub.utils import format_exception, url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import (
    Bool,
    Float,
    Integer,
    List,
    Unicode,
    default,
)

from . import (
    broker,
    contract,
    events,
    healing,
    inventory,
    line,
    naming,
    placement,
    profiles,
    reconcile,
    tasks,
)
from .homes import HOME_PATH, away_message, ensure_folder, folder_of, machine_state
from .reconcile import Health
from .tasks import Phase
from .traits import GPUSwarmSpawnerTraits

#: While a server shuts itself down: how long its shutdown request may take, and how often its
#: task is looked at (stop_object).
SHUTDOWN_REQUEST_S = 5.0
SHUTDOWN_POLL_S = 0.1
#: How long a start waits for a leftover service of the same server to let go of its slices.
LEFTOVER_WAIT_S = 20.0

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(os.path.dirname(__file__), "templates")),
    autoescape=True,
)


#: seconds between the spawner's TCP probes of a starting server's port (wait_for_port): a
#: refused connection costs the hub about 0.05 ms, and a server answers on average half this
#: later than it could
PORT_PROBE_S = 0.05


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
    """No GPU has room for the request: HTTP 503, with what the participant can do about it;
    ``offer``: HTML offering what they may do instead (wait in line), shown after the message
    on the pages that show HTML (JupyterHub's ``jupyterhub_html_message``)."""

    def __init__(self, message: str, log_message: str, offer: str = ""):
        super().__init__(message, log_message, reason="capacity", status_code=503)
        if offer:
            self.jupyterhub_html_message = offer


class SliceTaken(RuntimeError):
    """Swarm could not place the service: another server took the slice first."""


def with_gpu_slices(generic, kind: str, slices: int) -> list[dict]:
    """Generic resources to reserve: ``generic`` (as docker-py takes them, ``{kind: value}`` or
    the Engine API's list of ``{"DiscreteResourceSpec": {"Kind": ..., "Value": ...}}``) plus
    ``slices`` of the GPU ``kind``, which replace any entry of that kind. The Engine API's list.
    """
    # docker-py's own conversion (and checks) of the dict form
    listed = Resources(generic_resources=generic or [])["Reservations"]["GenericResources"]
    others = [entry for entry in listed if all(s.get("Kind") != kind for s in entry.values())]
    return [*others, {"DiscreteResourceSpec": {"Kind": kind, "Value": slices}}]


def _node_state(node: dict) -> str:
    """A node's state word ("ready", "down", ...; "unknown" when it reports none)."""
    return (node.get("Status") or {}).get("State") or "unknown"


def _line_writer(journal: events.Journal, log):
    """The broker's ``on_line_change``: the line as the dashboard reads it (``line.json``)."""

    def write(entries: list[line.Entry], held_gpu: str, held_for) -> None:
        wall, mono = time.time(), time.monotonic()
        waiting = [
            events.Waiting(
                user=e.owner.user.name,
                server=e.owner.name or "",
                joined=wall - (mono - e.joined),
                slices=e.request.slices,
                holds=held_gpu if e.owner is held_for else "",
            )
            for e in entries
        ]
        try:
            journal.line(waiting, wall)
        except OSError as e:
            log.warning("Could not write the waiting line for the dashboard: %s", e)

    return write


class GPUSwarmSpawner(GPUSwarmSpawnerTraits):
    """A ``dockerspawner.SwarmSpawner`` that gives every server slices of exactly one GPU.

    GPUs are advertised to Swarm by the worker setup as discrete generic resources, one kind per
    GPU (the kind is the GPU UUID, the value its number of slices). At start the spawner reads
    the swarm's inventory, picks a GPU with the placement policy, reserves ``slices_per_server``
    of that kind (or all of them, for a full GPU; Swarm enforces the count) and tells the
    container which device it holds. The module's docstring walks through a spawn; the
    settings (traits) are in ``traits.py``.
    """

    # What the running server holds; persisted in the hub database (get_state/load_state).
    gpu_uuid = Unicode("")
    gpu_node = Unicode("")
    slices_held = Integer(0)
    full_gpu_requested = Bool(False)  # this spawn's choice on the spawn page
    cpu_only_requested = Bool(False)  # ... or no GPU at all
    cpu_node = Unicode("")  # the machine a server without a GPU runs on (this spawn's)
    home_node = Unicode("")  # the machine of the user's last server (its home volume); kept
    gpu_memory_mb = Integer(0)  # the memory budget of the slices held (0: unknown)
    gpu_total_slices = Integer(0)  # the slices of the GPU held (this spawn's; not persisted)
    task_ip = Unicode("")  # the server's address on the network, once its task has one
    line_joined = Float(0)  # when (epoch s) this spawn joined the waiting line; 0: not in it
    line_lost = Float(0)  # loaded from the database: waiting since then when the hub stopped
    _configured_start_timeout = None  # start_timeout as configured (the server's own start)
    _cancelled_in_line = False  # this spawn ended in the line, cancelled (left, or hub stopping)
    _waited = None  # seconds this spawn waited in line before its slices (None: it did not)
    _refused = False  # this spawn was refused before any service was made (or left)
    _early_claim = None  # the claim refusal_before_spawn made, until start claims its own
    _away_since = None  # when (time.monotonic) poll first found the server away (recovering)
    _started_at = None  # when (time.monotonic) this start began
    _phases: dict = {}  # this start's marks (_phase), replaced by a new dict at each start

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

    # ---- the spawn path ---------------------------------------------------------------------

    async def stop(self, now=False):
        """dockerspawner's stop (the service removed); then the line looks at the GPUs at
        once, as this server's slices are free for whoever waits."""
        held = dict(gpu=self.gpu_uuid, node=self.gpu_node or self.cpu_node)  # cleared by stop
        try:
            await super().stop(now)
        finally:
            self.broker.nudge()
            self._record("stopped", **held)

    async def stop_object(self):
        """dockerspawner's hop before the service is removed (SwarmSpawner's does nothing):
        the server is asked to shut itself down, and its slices are free once it has.

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
        stopping = self.broker.stopping
        stopping.add(self.object_id)
        try:
            if len(stopping) > self.broker.threads:
                await self._ask_to_shut_down()
            else:
                await self._shut_down()
        finally:
            stopping.discard(self.object_id)

    async def _shut_down(self) -> None:
        """Ask the server to shut down, and wait until its task has ended (or the timeout)."""
        running = {t["ID"] for t in await self._service_tasks() if tasks.is_running(t)}
        if not running:
            return
        t0 = time.monotonic()
        if not await self._ask_to_shut_down():
            return
        deadline = t0 + self.server_shutdown_timeout
        # the running task only: a service made before the restart policy was on-failure gets
        # a replacement task, which the removal then ends before it starts
        while any(t["ID"] in running and tasks.is_live(t) for t in await self._service_tasks()):
            if time.monotonic() > deadline:
                self.log.warning(
                    "%s did not shut down within %s s (server_shutdown_timeout); removing its "
                    "service",
                    self.log_name,
                    self.server_shutdown_timeout,
                )
                return
            await asyncio.sleep(SHUTDOWN_POLL_S)
        self.log.info("%s shut down in %.1f s", self.log_name, time.monotonic() - t0)
        self.broker.nudge()  # its slices are free now, before the service is even removed

    async def _service_tasks(self) -> list[dict]:
        return await self.docker("tasks", filters={"service": self.object_id})

    async def _ask_to_shut_down(self) -> bool:
        """POST the server's ``/api/shutdown``; False when it refused or cannot be reached.

        The server's own token may do this (its scopes include access to itself). After a hub
        restart JupyterHub no longer has that token, so a short-lived one with only that
        scope is made, and deleted afterwards.
        """
        token, made = self.api_token, None
        if not token:
            scope = f"access:servers!server={self.user.name}/{self.name}"
            token = made = self.user.new_api_token(
                scopes=[scope], expires_in=120, note="gpu-jupyterhub: stopping the server"
            )
        url = url_path_join(self.server.url, "api/shutdown")
        request = HTTPRequest(
            url,
            method="POST",
            body=b"",
            headers={"Authorization": f"token {token}"},
            request_timeout=min(self.server_shutdown_timeout, SHUTDOWN_REQUEST_S),
        )
        try:
            await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code != 599:  # 599: the server closed the connection as it stopped
                self.log.warning(
                    "%s refused to shut down (%s %s); removing its service",
                    self.log_name,
                    e.code,
                    e.message,
                )
                return False
        except OSError as e:  # refused, unreachable: nothing listens there
            self.log.warning(
                "%s could not be asked to shut down (%s); removing its service",
                self.log_name,
                e,
            )
            return False
        finally:
            if made:
                self.delete_api_token(made)
        return True

    @property
    def ready(self):
        """JupyterHub's, except for a spawn cancelled in the line: JupyterHub records a server
        when a spawn begins, and a spawn cancelled by the hub stopping would otherwise be
        reported "ready" to the waiting participant's page, which then reloads into the
        stopping hub instead of waiting for it (spawn_pending.html)."""
        return False if self._cancelled_in_line else super().ready

    @property
    def without_gpu(self) -> bool:
        """A server starting or running without a GPU: the hub's home and spawn-pending pages
        say so. A running server is read from what it holds (``gpu_uuid`` outlives a hub
        restart); one starting, from the participant's choice."""
        if self.pending == "spawn":
            return self.cpu_only_requested
        return bool(self.ready) and not self.gpu_uuid

    def run_pre_spawn_hook(self):
        """JupyterHub's last call before ``start``, whose whole run it then bounds by
        ``start_timeout``: with the line on, that run includes the wait in line, so the line's
        longest wait is added for JupyterHub; the server's own start keeps the configured
        ``start_timeout`` (``server_start_timeout``)."""
        if self._configured_start_timeout is None:
            self._configured_start_timeout = self.start_timeout
        waiting = 0
        if self.waiting_line != "off":
            waiting = self.line_max_wait or 30 * 24 * 3600  # 0: no limit
        self.start_timeout = self._configured_start_timeout + waiting
        return super().run_pre_spawn_hook()

    @property
    def server_start_timeout(self) -> int:
        """Seconds the server's own start may take, once it has its slices."""
        if self._configured_start_timeout is None:
            return self.start_timeout
        return self._configured_start_timeout

    async def start(self):
        """Reserve slices of one GPU, then start the service there (module docstring)."""
        self._progress_events = []  # this spawn's stages (progress() reads them)
        self.line_lost = 0  # a new start: the message about a line lost to a restart goes
        self._cancelled_in_line = False
        self._waited = None
        self._refused = False
        self._away_since = None
        t0 = self._started_at = time.monotonic()
        self._phases = {}
        try:
            full = self.hub_disk_refusal()
            if full is not None:
                raise full
            await self._clear_leftover()
            if self.cpu_only_requested:
                started = await self._start_without_gpu()
            else:
                started = await self._start_on_a_gpu()
        except NoGPUSliceAvailable as e:
            self._refused_after(e, t0, "in the spawner")
            self._refused = not self.object_id  # no service made or left: poll knows it
            raise
        except Exception as e:
            message, _ = format_exception(e, only_jupyterhub=True)
            self._record("failed", reason=message or f"{type(e).__name__}: {e}"[:500])
            raise
        finally:
            self.broker.release(self)
        self._record(
            "started",
            seconds=round(time.monotonic() - t0 - (self._waited or 0), 2),
            waited=None if self._waited is None else round(self._waited, 1),
            gpu=self.gpu_uuid,
            node=self.gpu_node or self.cpu_node,
            phases=dict(self._phases) or None,
        )
        return started

    def _phase(self, name: str) -> None:
        """This start reached ``name`` (events.PHASES), now: its first time is kept, in seconds
        from the start (after the line: a wait in it is not the start's)."""
        if name not in self._phases and self._started_at is not None:
            since = time.monotonic() - self._started_at - (self._waited or 0)
            self._phases[name] = round(since, 3)

    def hub_disk_refusal(self) -> SpawnFailed | None:
        """The refusal every start meets while the hub's data folder (``hub_data_dir``) has
        less than ``hub_data_min_free_mb`` free: the hub could not record the server (its
        database refuses every write), and the participant would read "500: Unhandled error".
        None when there is room, or nothing to check."""
        if not self.hub_data_dir:
            return None
        try:
            found = os.statvfs(self.hub_data_dir)
        except OSError:
            return None
        free_mb = found.f_bavail * found.f_frsize // 2**20
        if free_mb >= self.hub_data_min_free_mb:
            return None
        return SpawnFailed(
            "The hub's disk is full, so no server can start right now. Please tell an "
            "organizer; servers already running go on.",
            f"The hub's data folder {self.hub_data_dir} has {free_mb} MiB free (fewer than "
            f"hub_data_min_free_mb, {self.hub_data_min_free_mb}): refusing {self.log_name}. "
            "Free space on the hub's data volume (`docker system df`, old files in "
            f"{self.hub_data_dir}), then servers start again",
            reason="disk",
            status_code=503,
        )

    async def _clear_leftover(self) -> None:
        """Remove a service of this server's name that still exists although the hub starts
        the server anew: the hub let it go while Swarm was restarting it (a hub older than
        ``server_lost_after``), its removal failed while the manager was away, or a hub killed
        mid-spawn left it. Its participant is then never refused for the slices their own
        earlier server holds; their files are in their home, which stays. Waits (up to
        ``LEFTOVER_WAIT_S``) until its task has let go of its slices."""
        try:
            service = await self.docker("inspect_service", self.service_name)
        except NotFound:
            return
        sid = service["ID"]
        self._report(5, "Your earlier server was still running: stopping it (your files stay)")
        with contextlib.suppress(NotFound):  # the hub's keeper removed it meanwhile
            await self.docker("remove_service", sid)
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while time.monotonic() < deadline:
            live = [t for t in await self.docker("tasks") if t.get("ServiceID") == sid]
            if not any(tasks.is_live(t) for t in live):
                break
            await asyncio.sleep(SHUTDOWN_POLL_S * 2)
        self.broker.forget_read()  # the next reservation sees its slices free
        self._healed(
            "leftover removed",
            f"{self.log_name}: its earlier service {service['Spec']['Name']} (id {sid[:7]}) "
            "still ran, which the hub did not count as running; removed before the new start",
        )

    def _refused_after(self, refusal: NoGPUSliceAvailable, t0: float, where: str) -> None:
        seconds = round(time.monotonic() - t0, 2)
        self.log.info("%s refused after %.2f s %s", self.log_name, seconds, where)
        self._record("refused", reason=refusal.jupyterhub_message, seconds=seconds)

    async def refusal_before_spawn(self, user_options: dict | None) -> SpawnFailed | None:
        """The refusal a start with ``user_options`` would meet at once, asked before
        JupyterHub does its own work for a spawn (``gate.py``). None when the spawn may go on:
        a GPU fits (its slices are claimed for this spawn from now, so the others asking in
        the same burst see them taken; ``start`` claims them anew, ``forget_early_claim``
        frees them if it never runs), the participant waits in line or starts without a GPU,
        or the options are not valid (JupyterHub's spawn then says what is wrong). The same
        inventory, claims and rules as ``reserve_gpu``."""
        t0 = time.monotonic()
        full = self.hub_disk_refusal()
        if full is not None:
            self.log.warning("%s", full.log_message)
            return full
        options = user_options
        if options is None:  # JupyterHub starts with the last start's options
            options = getattr(self.orm_spawner, "user_options", None) or {}
        try:
            profiles.check_line_choice(options)
            choice = profiles.gpu_choice(options, self.spawn_offer())
        except profiles.ChoiceError:
            return None
        if choice == profiles.NONE:
            return None
        request = self.gpu_request(full_gpu=choice == profiles.FULL)
        try:
            await self.broker.reserve(self, request, self._read_swarm)
        except broker.NoRoom as e:
            if self._joins_line(e.gpus, request, options):
                return None
            if reconcile.held_by_user(e.tasks, self.user.name):
                return None  # their own earlier server holds slices: start removes it first
            refusal = self._refusal(e, request, options)
            self.log.info("%s", refusal.log_message)
            self._refused_after(refusal, t0, "before JupyterHub's spawn")
            return refusal
        self._early_claim = self.broker.claim_of(self)
        return None

    def forget_early_claim(self) -> None:
        """The spawn ``refusal_before_spawn`` let through has claimed slices itself, or ended
        before it could (JupyterHub's limits, an error): the early claim goes."""
        if self._early_claim is not None:
            self.broker.forget(self, self._early_claim)
            self._early_claim = None

    async def _start_on_a_gpu(self):
        lost = set()
        for attempt in range(1, self.placement_attempts + 1):
            self._hold(await self.reserve_gpu(frozenset(lost)), attempt)
            try:
                # dockerspawner's start: create_object, then start_object (both below)
                started = await super().start()
                self.home_node = self.gpu_node
                return started
            except SliceTaken as e:
                lost.add(self.gpu_uuid)
                self.log.info("%s lost the race for %s: %s", self.log_name, self.gpu_uuid, e)
                self._report(15, f"{self.gpu_uuid} was taken a moment ago; trying another GPU")
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
            self.cpu_node = await self._choose_cpu_node()
            where = f" on {self.cpu_node}" if self.cpu_node else ""
            self.log.info("Starting %s without a GPU%s", self.log_name, where)
            self._report(20, f"Starting without a GPU{where}: CPU only, no GPU slice reserved")
            try:
                started = await super().start()
            except SliceTaken as e:
                await self._discard_service()
                raise SpawnFailed(
                    f"The machine {self.cpu_node or 'chosen'} has no room for another server "
                    f"right now ({e}). Please try again in a minute or ask an organizer.",
                    reason="capacity",
                    status_code=503,
                ) from None
            except Exception:
                await self._discard_service()
                raise
            self.home_node = self.cpu_node or self.home_node
            return started
        finally:
            starting.discard(self.service_name)

    async def _choose_cpu_node(self) -> str:
        """Where a server without a GPU runs ("" lets Swarm choose: no GPU machine here);
        refuses when ``cpu_only_max_servers`` run already."""
        if self.cpu_only_max_servers:
            running = await self.docker(
                "services", filters={"label": f"{contract.CPU_ONLY_LABEL}=1"}
            )
            names = {s["Spec"]["Name"] for s in running} | self.broker.cpu_only_starting
            others = names - {self.service_name}
            if len(others) >= self.cpu_only_max_servers:
                raise SpawnFailed(
                    f"All {self.cpu_only_max_servers} servers without a GPU this hub allows are "
                    "running. Please wait for a GPU slice instead, or try again later.",
                    f"{self.log_name}: cpu_only_max_servers ({self.cpu_only_max_servers}) reached",
                    reason="capacity",
                    status_code=503,
                )
        gpus = await self.gpu_inventory()
        home = self._home_to_prefer()
        chosen = placement.cpu_node(gpus, home)
        if home and chosen != home:
            await self._tell_away_from_home(home, chosen)
        return chosen

    def _hold(self, reservation: broker.Reservation, attempt: int) -> None:
        """Take the reserved slices as this server's (create_object reads them)."""
        gpu = reservation.gpu
        self.gpu_uuid, self.gpu_node = gpu.uuid, gpu.node_name
        self.slices_held = reservation.slices
        self.gpu_memory_mb = gpu.memory_budget_mb(reservation.slices)
        self.gpu_total_slices = gpu.slices
        self._phase("slices")
        kind = "SIMULATED GPU" if gpu.simulated else "MIG instance" if gpu.mig else "GPU"
        isolated = " (hardware-isolated)" if gpu.mig else ""
        self.log.info(
            "Reserving %d slice(s) of %s %s on %s for %s (%d/%d free, attempt %d)",
            reservation.slices,
            kind,
            gpu.uuid,
            gpu.node_name,
            self.log_name,
            gpu.free,
            gpu.slices,
            attempt,
        )
        self._report(
            20,
            f"Reserving {reservation.slices} slice(s) of {kind} {gpu.uuid} on {gpu.node_name}"
            + isolated,
        )

    async def create_object(self):
        """dockerspawner's hop: create the server's service; start_object then waits for it.

        SwarmSpawner's version builds the same spec from the same traits but then waits for the
        first task in 1-second sleeps, which adds about a second to nearly every spawn.
        """
        await self._ensure_home_folder()  # a bind mount's source must exist
        container = ContainerSpec(
            **{
                "image": self.image,
                "env": self.get_env(),
                "labels": self.container_labels(),
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
                "placement": self.service_placement(),
                # a server that shut itself down (stop_object, or the participant's File >
                # Shut Down) stays down and frees its slices; one that crashed is restarted
                # (with Swarm's own delay and attempts: docker-py's RestartPolicy sets them 0)
                "restart_policy": {"Condition": "on-failure"},
                **self.extra_task_spec,
            }
        )
        endpoint = dict(self.extra_endpoint_spec)
        if not self.use_internal_ip:
            endpoint.setdefault("ports", {None: (self.port, "tcp")})
        created = await self.docker(
            "create_service",
            **{
                "name": self.service_name,
                "task_template": task_template,
                "endpoint_spec": EndpointSpec(**endpoint),
                **self.extra_create_kwargs,
                "labels": self.service_labels_for_server(),
            },
        )
        self._phase("created")
        return created

    async def start_object(self):
        """dockerspawner's hop after create_object: wait until the server listens.

        Replaces SwarmSpawner's wait, which polls every 1-11 s and waits on an unplaceable
        task until the hub's start_timeout. Each task read is acted on by ``_follow``. As soon
        as Swarm has given the task its address on the network, the server's port is probed
        every 0.1 s alongside the task polls, so the spawn ends when the server listens rather
        than at the next (backed-off) task poll.
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
                reachable = reading.address or reading.phase is Phase.RUNNING
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
                delay = min(delay * 1.5, 2.0)
        finally:
            if probe is not None:
                probe.cancel()

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
                f"The GPU machine {self.gpu_node} cannot get the server image "
                f"({reading.detail}). Please tell an organizer: that machine must be "
                "joined with the --registry option of `make join-command`, or be given "
                "the image with --image-tar.",
                reason="image",
            )
        if reading.phase is Phase.NO_MOUNT:
            folder = reading.detail.rsplit(": ", 1)[-1]
            raise SpawnFailed(
                f"The GPU machine {self.gpu_node} lacks the shared folder {folder}, which "
                "every server mounts. Please tell an organizer: that machine must have the "
                "hub's shared storage (tutorials, datasets) mounted at the same paths as the "
                "other machines.",
                reason="mount",
            )
        if reading.phase is Phase.ENDED:
            raise RuntimeError(
                f"Service {self.service_name} did not start: task {reading.state}: {reading.detail}"
            )
        stage = reading.stage(self.gpu_node)  # none while Swarm retries a rejected task
        if stage:
            self._report(*stage)

    async def _check_network_room(self) -> None:
        """The server's task has had no address on the network for ``tasks.UNALLOCATED_S``
        (Swarm leaves it "new", without an error, when the network is out of addresses): fail
        with the organizer's fix when no address is left, else go on waiting (the manager may
        only be busy)."""
        network = await self.docker("inspect_network", self.network_name)
        subnets = [
            c["Subnet"] for c in network.get("IPAM", {}).get("Config") or [] if c.get("Subnet")
        ]
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

    async def get_ip_and_port(self):
        """JupyterHub's hop after start: where to connect to the server (``connect_address``)."""
        return await self.connect_address(self.task_ip)

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
        if self._refused and not self.object_id:
            return 0
        if self.poll_read_max_age and self.object_id:
            by_service, nodes = await self.broker.recent_read(
                self._read_swarm, self.poll_read_max_age
            )
            task = by_service.get(self.object_id)
            node = nodes.get((task or {}).get("NodeID") or "")
            if task and node:
                states = {node["ID"]: _node_state(node)}
                seen = reconcile.verdict([task], states, self.network_name)
                if seen.health is Health.RUNNING:
                    return self._judge(seen)
        seen, _ = await self._look()
        return self._judge(seen)

    async def _look(self) -> tuple[reconcile.Verdict, dict]:
        """The server's own calls: its service (by id, else by name: a hub killed during the
        spawn may not have saved the id), all its tasks, the node of the newest. Returns the
        verdict and the service ({} when it is gone)."""
        try:
            service = await self.docker("inspect_service", self.object_id or self.service_name)
        except NotFound:
            return reconcile.Verdict(Health.GONE, "its service is gone"), {}
        self.object_id = service["ID"]
        service_tasks = await self.docker("tasks", filters={"service": service["ID"]})
        node_id = (tasks.newest(service_tasks) or {}).get("NodeID") or ""
        states = {}
        if node_id:
            try:
                states[node_id] = _node_state(await self.docker("inspect_node", node_id))
            except NotFound:
                states[node_id] = "gone"
        return reconcile.verdict(service_tasks, states, self.network_name), service

    def _judge(self, seen: reconcile.Verdict):
        """``poll``'s answer for what was seen, with the time this server has been away."""
        now = time.monotonic()
        if seen.health is Health.RUNNING:
            if self._away_since is not None:
                self._healed(
                    "back",
                    f"{self.log_name} answers again after {now - self._away_since:.0f} s away",
                )
                self._away_since = None
            self._follow_address(seen.address)
            return None
        if seen.health is Health.GONE:
            return seen.reason
        if self.pending == "spawn":
            return None  # still starting: its start decides, not the grace
        if self._away_since is None:
            self._away_since = now
            self._healed(
                "kept",
                f"{self.log_name} is away ({seen.reason}); kept as running for up to "
                f"{self.server_lost_after:.0f} s while Swarm brings it back",
            )
        away = now - self._away_since
        if away < self.server_lost_after:
            return None
        self._healed(
            "lost",
            f"{self.log_name} was away for {away:.0f} s ({seen.reason}): "
            "reported stopped, so its participant can start again",
        )
        return f"{seen.reason}, for {away:.0f} s"

    def _follow_address(self, address: str) -> None:
        """A server Swarm gave a new container (its engine or machine restarted) runs at a new
        address: the hub's record of it follows, and the route keeper (``keeper.py``) points
        its route there within seconds."""
        self.task_ip = address or self.task_ip
        server = self.server
        by_address = self.use_internal_ip and not self.use_internal_hostname
        if not (address and by_address and server is not None):
            return
        if server.ip in (address, self.service_name):
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
        deadline = time.monotonic() + self.server_lost_after
        while True:
            seen, service = await self._look()
            if seen.health is not Health.RECOVERING or time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
        if seen.health is not Health.RUNNING:
            return await super().get_url()  # JupyterHub's check that it answers then decides
        self._adopt(service, seen)
        self.task_ip = seen.address
        host, port = await self.connect_address(seen.address)
        server = self.server
        return f"{server.proto}://{host}:{port}{server.base_url}"

    def _adopt(self, service: dict, seen: reconcile.Verdict) -> None:
        """Take back what a running server holds from its service's labels when the hub's
        database lost it (a hub killed after creating the service, before saving the state)."""
        labels = (service.get("Spec") or {}).get("Labels") or {}
        uuid = labels.get(contract.GPU_LABEL) or ""
        if self.gpu_uuid or not uuid:
            return
        self.gpu_uuid = uuid
        self.slices_held = int(labels.get(contract.SLICES_LABEL) or 0)
        self.log.info(
            "%s: its service holds %d slice(s) of %s; taken back into the hub's state",
            self.log_name,
            self.slices_held,
            uuid,
        )
        self._save_state()

    def _healed(self, action: str, message: str) -> None:
        healing.record(self.log, self._journal(), action, message, self.user.name, self.name)

    # ---- choosing a GPU --------------------------------------------------------------------

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

    async def reserve_gpu(
        self, exclude: frozenset = frozenset(), may_wait: bool = True
    ) -> broker.Reservation:
        """Slices of one GPU claimed for this server, or a refusal people understand at once,
        or (``may_wait`` and the line on) slices given after a wait in line.

        ``exclude``: GPUs this spawn already lost a race for; they count as full.
        """
        request = self.gpu_request()
        try:
            return await self._placed(
                request, await self.broker.reserve(self, request, self._read_swarm, exclude)
            )
        except broker.NoRoom as e:
            refused = e
        refusal = self._refusal(refused, request, self.user_options)
        if not (may_wait and self._joins_line(refused.gpus, request, self.user_options)):
            raise refusal
        self.log.info("%s; joining the line", refusal.log_message)
        return await self._placed(request, await self._wait_in_line(request))

    def _refusal(
        self, refused: broker.NoRoom, request: broker.Request, options: dict
    ) -> NoGPUSliceAvailable:
        """What the participant and the log are told when no GPU has room for ``request``."""
        used, total = inventory.totals(refused.gpus)
        detail = ", ".join(f"{g.node_name}:{g.uuid}={g.used}/{g.slices}" for g in refused.gpus)
        wanted = "a whole GPU" if request.slices is None else f"{request.slices} free slice(s)"
        log_message = (
            f"No GPU with {wanted} for {self.log_name}: "
            f"{used}/{total} slices in use on {len(refused.gpus)} GPU(s) ({detail or 'none'})"
        )
        offer = self._refusal_offer(refused.gpus, request, str(refused), options)
        return NoGPUSliceAvailable(str(refused), log_message, offer)

    async def _placed(
        self, request: broker.Request, reservation: broker.Reservation
    ) -> broker.Reservation:
        """The reservation, after telling a returning participant when it is not on their
        home machine."""
        home, gpu = request.prefer_node, reservation.gpu
        if home and gpu.node_name != home:
            await self._tell_away_from_home(home, gpu.node_name)
        return reservation

    async def _tell_away_from_home(self, home: str, here: str) -> None:
        """A returning participant starts on ``here``, not on ``home``, the machine whose
        volume holds their files (homes not shared): the spawn page says why and where their
        files are, from the swarm's latest read (the one the choice was made from)."""
        nodes, _ = await self.broker.read_swarm(self._read_swarm)
        state = machine_state(nodes, home)
        volume = self._home_volume()
        if state:
            self.log.warning(
                "%s: their home machine %s is %s; starting on %s with another home (their "
                "files are in %s there)",
                self.log_name,
                home,
                state,
                here or "a machine Swarm chooses",
                volume,
            )
        else:
            self.log.info("%s: no room on %s (their home), starting elsewhere", self.log_name, home)
        self._report(18, away_message(home, state, here or "another machine", volume))

    # ---- the waiting line --------------------------------------------------------------------

    def _joins_line(
        self, gpus: list[inventory.GPU], request: broker.Request, options: dict
    ) -> bool:
        """This participant waits in line: the line is on (``auto``, or ``offer`` and they
        asked to in ``options``), and some GPU could ever hold the request."""
        asked = self.waiting_line == "auto" or (
            self.waiting_line == "offer" and options.get("line") == profiles.JOIN
        )
        return asked and line.can_ever_fit(gpus, request.slices)

    def _refusal_offer(
        self, gpus: list[inventory.GPU], request: broker.Request, refusal: str, options: dict
    ) -> str:
        """The refusal as HTML with what the participant may do instead: wait in line, start
        without a GPU; "" when neither is offered."""
        line_offered = self.waiting_line == "offer" and line.can_ever_fit(gpus, request.slices)
        if not (line_offered or self.cpu_only_servers):
            return ""
        kept = {"opt-image": options["image"]} if options.get("image") else {}
        gpu = options.get("gpu", profiles.SLICE)
        return _TEMPLATES.get_template("refusal_offer.html").render(
            message=refusal,
            spawn_url=self._spawn_url(),
            line_query={"opt-line": profiles.JOIN, "opt-gpu": gpu, **kept}
            if line_offered
            else None,
            cpu_query={"opt-gpu": profiles.NONE, **kept} if self.cpu_only_servers else None,
            waiting=len(self.broker.waiting()),
        )

    def _spawn_url(self) -> str:
        """This server's spawn URL on the hub (``/hub/spawn/<user>[/<server>]``)."""
        base = getattr(self.hub, "base_url", "/hub/")
        path = f"{base.rstrip('/')}/spawn/{getattr(self.user, 'escaped_name', self.user.name)}"
        return f"{path}/{self.name}" if self.name else path

    async def _wait_in_line(self, request: broker.Request) -> broker.Reservation:
        """In the line until slices are given to this server; the participant reads their
        place on the spawn page all along. The hub's database says they are waiting, so a
        hub restart that empties the line can tell them (``failure_message``)."""
        self.line_joined = time.time()
        self._save_state()
        self.log.info("%s joined the waiting line", self.log_name)
        self._journal()  # the dashboard's copy of the line is written from now on
        placed = []

        def told(position: int, waiting: int, eta: float | None, held: bool) -> None:
            if not placed:  # the first place told: in the line (not refused as full)
                placed.append(position)
                self._record("joined line")
            held = held and request.slices != 1  # a GPU emptying for a full-GPU request
            self._report(10, line.waiting_message(position, waiting, eta, held))

        wait = self.broker.wait_in_line(self, request, self._read_swarm, told, self.line_max_length)
        joined = self.line_joined
        try:
            reservation = await asyncio.wait_for(wait, timeout=self.line_max_wait or None)
        except broker.LineFull as e:
            raise NoGPUSliceAvailable(
                f"All GPU slices are in use, and the waiting line is full ({e}). Please try "
                "again later or ask an organizer.",
                f"{self.log_name}: the line is full ({e})",
            ) from None
        except asyncio.TimeoutError:
            raise NoGPUSliceAvailable(
                f"You waited {line.about(self.line_max_wait)} in line and no GPU slice freed "
                "up, which is as long as this hub lets anyone wait. Please try again later "
                "or ask an organizer.",
                f"{self.log_name} left the line after {self.line_max_wait} s (line_max_wait)",
            ) from None
        except asyncio.CancelledError:
            self.log.info("%s left the waiting line", self.log_name)
            self._record("left line", waited=round(time.time() - joined, 1))
            self._cancelled_in_line = True
            raise
        finally:
            self.line_joined = 0
        self._waited = time.time() - joined
        self.log.info(
            "%s leaves the line after %.0f s for %s on %s",
            self.log_name,
            time.time() - joined,
            reservation.gpu.uuid,
            reservation.gpu.node_name,
        )
        self._report(15, "A GPU slice is free for you: starting your server")
        return reservation

    # ---- what the organizer's dashboard reads (events.py) --------------------------------------

    def _journal(self) -> events.Journal | None:
        """This hub's journal in ``dashboard_dir`` (None: none is kept). The broker's line is
        written there too from the first call on."""
        if not self.dashboard_dir:
            return None
        journal = events.journal_for(self.dashboard_dir)
        if self.broker.on_line_change is None:
            self.broker.on_line_change = _line_writer(journal, self.log)
        return journal

    def _record(self, kind: str, **fields) -> None:
        """An event for the dashboard; a failed write is logged, never raised."""
        journal = self._journal()
        if journal is None:
            return
        event = events.Event(time.time(), kind, self.user.name, self.name or "", **fields)
        try:
            journal.record(event)
        except OSError as e:
            self.log.warning("Could not record '%s' of %s: %s", kind, self.log_name, e)

    def _forget_one_off_choices(self) -> None:
        """JupyterHub keeps a start's options for the next start without options ("Start My
        Server"). Waiting in line and starting without a GPU answer the moment (the GPUs were
        full): the next start asks for a GPU again, and is offered both again if it must."""
        saved = dict(getattr(self.orm_spawner, "user_options", None) or {})
        kept = profiles.without_one_off_choices(saved)
        if kept != saved:
            self.write_row_now(user_options=kept)

    def _save_state(self) -> None:
        """Write this spawner's state to the hub's database now (JupyterHub itself writes it
        only once a start or stop has finished)."""
        self.write_row_now(state=self.get_state())

    # ---- the spawn page ------------------------------------------------------------------------

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
                choice = profiles.gpu_choice(user_options, offered)
                spawner.full_gpu_requested = choice == profiles.FULL
                spawner.cpu_only_requested = choice == profiles.NONE
                profiles.check_line_choice(user_options)
            except profiles.ChoiceError as e:
                raise web.HTTPError(400, str(e)) from None
            spawner._forget_one_off_choices()

        return apply

    # ---- progress ---------------------------------------------------------------------------

    # this spawn's stages, newest last: {"progress": percent, "message": text}
    _progress_events = List()

    def _report(self, progress: int, message: str) -> None:
        """Record a stage of the spawn for the progress bar (and the log)."""
        events = self._progress_events
        if events and events[-1]["message"] == message:
            return
        events.append({"progress": progress, "message": message})
        self.log.debug("Spawn progress of %s: %s%% %s", self.log_name, progress, message)

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
        if self.line_lost and not self.active:
            since = time.strftime("%H:%M", time.localtime(self.line_lost))
            return (
                f"You were waiting in line for a GPU (since {since}) when the hub restarted, "
                "and the line was emptied. Nothing of yours was lost: start your server again "
                "to take a new place in line."
            )
        error = self.last_start_error
        if not error:
            return ""
        message, _ = format_exception(error, only_jupyterhub=True)
        return message or f"The server could not start: {error}"

    # ---- what goes into the service ----------------------------------------------------------

    def service_placement(self) -> Placement:
        """The configured placement; a server without a GPU is kept on its chosen machine."""
        spec = dict(self.extra_placement_spec)
        if self.cpu_only_requested and self.cpu_node:
            spec["constraints"] = [*spec.get("constraints", []), f"node.hostname=={self.cpu_node}"]
        return Placement(**spec)

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
                    configured.get("generic_resources"), self.gpu_uuid, self.slices_held
                )
                if self.gpu_uuid
                else configured.get("generic_resources"),
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
            contract.SLICES_LABEL: str(self.slices_held),
            **({contract.CPU_ONLY_LABEL: "1"} if self.cpu_only_requested else {}),
        }

    def container_labels(self) -> dict:
        """Labels of the server's container, for the GPU guard on its machine: whose it is,
        which GPU, how many slices and the budget in MiB; none without a GPU."""
        if not self.gpu_uuid:
            return {}
        labels = {
            contract.USER_LABEL: self.user.name,
            contract.GPU_LABEL: self.gpu_uuid,
            contract.SLICES_LABEL: str(self.slices_held),
        }
        if self.gpu_memory_mb:
            labels[contract.BUDGET_LABEL] = str(self.gpu_memory_mb)
        return labels

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
                    "GPU_SLICES": str(self.slices_held),
                    "GPU_NODE": self.gpu_node,
                    "GPU_SIMULATED": "1" if contract.is_simulated(self.gpu_uuid) else "0",
                    # a MIG instance's memory and compute are its own; a GPU's slices share both
                    "GPU_ISOLATION": "mig" if contract.is_mig(self.gpu_uuid) else "shared",
                    # TensorFlow otherwise grabs all memory of the GPU it shares with others
                    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
                }
            )
            if self.gpu_memory_mb:
                # the budget the GPU guard holds the server to (frameworks are capped below it)
                env["GPU_MEMORY_LIMIT_MB"] = str(self.gpu_memory_mb)
            if self.gpu_total_slices:
                # the share of the GPU's (or MIG instance's) memory the slices held stand for,
                # for frameworks that take a fraction (JAX, PyTorch)
                fraction = min(self.slices_held / self.gpu_total_slices, 1)
                env["GPU_MEMORY_FRACTION"] = f"{fraction:.3f}"
        elif self.cpu_only_requested:
            # no GPU at all, whatever the image or the machine's default runtime would give
            env.update({"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""})
            env["GPU_MODE"] = "none"  # gpu-info: a server started without a GPU
        return env

    @property
    def mounts(self):
        """Absolute sources are bind mounts; plain names are (labelled) named volumes; with
        ``homes_dir``, the participant's folder there is the home.

        The base class makes every entry of ``volumes`` a bind mount, which cannot express the
        per-user named volume a home directory needs. Volume names longer than Docker allows
        are shortened (``naming.fit``); ``jy-home-<user>`` of every GitHub login fits as it is.
        """
        mounts = []
        if self.homes_dir:
            mounts.append(Mount(HOME_PATH, self.home_folder, type="bind"))
        for source, vol in self.volume_binds.items():
            if self.homes_dir and vol["bind"] == HOME_PATH:
                continue  # the shared home takes the place of a volume there
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

    # ---- the home ---------------------------------------------------------------------------

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

    # ---- state ----------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.home_node:
            state["home_node"] = self.home_node  # outlives the server (clear_state keeps it)
        if self.line_joined:
            state["line_joined"] = self.line_joined  # waiting: the spawn has not ended
        if self.line_lost:
            # kept through the stop JupyterHub makes at its start for a spawn that was pending
            # ("appears to have stopped while the Hub was down"), until the next start
            state["line_lost"] = self.line_lost
        if self.gpu_uuid:
            state.update(
                gpu_uuid=self.gpu_uuid,
                gpu_node=self.gpu_node,
                gpu_slices=self.slices_held,  # the key servers running since 0.1 have
                gpu_memory_mb=self.gpu_memory_mb,
            )
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_uuid = state.get("gpu_uuid", "")
        self.gpu_node = state.get("gpu_node", "")
        self.slices_held = state.get("gpu_slices", 0)
        self.gpu_memory_mb = state.get("gpu_memory_mb", 0)
        self.home_node = state.get("home_node", "")
        # only a hub that stopped while this spawn waited finds it in the database
        self.line_lost = state.get("line_joined") or state.get("line_lost", 0)

    def clear_gpu(self):
        self.gpu_uuid = ""
        self.gpu_node = ""
        self.slices_held = 0
        self.gpu_memory_mb = 0
        self.task_ip = ""

    def clear_state(self):
        super().clear_state()
        self.clear_gpu()
