"""Choosing a server's GPU: the swarm's inventory through the broker, the reservation, the
refusals before anything is made, and the waiting line. Part of GPUSwarmSpawner (spawner.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable

from docker.errors import NotFound
from traitlets import HasTraits

from . import (
    broker,
    contract,
    inventory,
    line,
    placement,
    profiles,
    tasks,
)
from .errors import NoGPUSliceAvailable, SpawnFailed
from .holding import Holding
from .homes import away_message, machine_state
from .spawner_health import SHUTDOWN_POLL_S
from .spawner_page import render

#: How long a start waits for a leftover service of the same server to let go of its slices.
LEFTOVER_WAIT_S = 20.0


def usable(handed: broker.Reservation, request: broker.Request) -> bool:
    """A reservation made earlier for this spawn (the gate's) serves its start: the broker
    still counts it, and it was made for the same request."""
    return handed.stands() and handed.request == request


class GPUChoice(HasTraits):
    """GPUSwarmSpawner's choice of a GPU, its refusals and its waiting line."""

    # ---- before a start: refusals and leftovers ----------------------------------------------

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

    # ---- choosing a GPU ----------------------------------------------------------------------

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
        self,
        exclude: frozenset = frozenset(),
        may_wait: bool = True,
        handed: broker.Reservation | None = None,
    ) -> broker.Reservation:
        """Slices of one GPU claimed for this server, or a refusal people understand at once,
        or (``may_wait`` and the line on) slices given after a wait in line.

        ``exclude``: GPUs this spawn already lost a race for; they count as full. ``handed``:
        the gate's reservation for this spawn (``refusal_before_spawn``), taken as it is while
        it stands for the same request: the broker chooses once per spawn.
        """
        request = self.gpu_request()
        if handed is not None:
            if usable(handed, request):
                return await self._placed(request, handed)
            handed.forget()
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

    def _hold(self, reservation: broker.Reservation, attempt: int) -> None:
        """Take the reserved slices as this server's (create_object reads them)."""
        gpu = reservation.gpu
        self.attempt.reservation = reservation
        self.holding = Holding.of(reservation)
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

    async def _place_without_gpu(self) -> Holding:
        """What a server without a GPU holds: the machine it runs on (``cpu_node`` "" lets
        Swarm choose: no GPU machine here) and its cores; refuses when
        ``cpu_only_max_servers`` run already."""
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
        cores = next((g.cores for g in gpus if g.node_name == chosen), 0.0)
        if home and chosen != home:
            await self._tell_away_from_home(home, chosen)
        return Holding(cpu_only=True, cpu_node=chosen, node_cores=cores)

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
        return render(
            "refusal_offer.html",
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
        attempt = self.attempt
        attempt.line_joined = time.time()
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
        joined = attempt.line_joined
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
            attempt.cancelled_in_line = True
            raise
        finally:
            attempt.line_joined = 0
        attempt.waited = time.time() - joined
        self.log.info(
            "%s leaves the line after %.0f s for %s on %s",
            self.log_name,
            time.time() - joined,
            reservation.gpu.uuid,
            reservation.gpu.node_name,
        )
        self._report(15, "A GPU slice is free for you: starting your server")
        return reservation
