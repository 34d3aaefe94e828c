"""Choosing a server's GPU: the swarm's inventory through the broker, the reservation, the
refusals before anything is made, and the waiting line.

A collaborator of GPUSwarmSpawner (spawner.py), given its inputs: ``GPUChoice`` is made by the
spawner whenever it needs one (``GPUSwarmSpawner.gpu_chooser``; it keeps no state of its own,
so each is the same choice) from the hub's broker, the spawn's
``Spawn`` (who it is for, where its home is), the hub's ``LineRules`` (the settings the line
and servers without a GPU follow) and callbacks for what the spawner does with the outcome
(the spawn page's progress, the dashboard's events, the hub's database). It never reads the
spawner itself. ``hub_disk_refusal`` is a plain function of the hub's data folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from docker.errors import NotFound

from . import (
    broker,
    contract,
    inventory,
    line,
    placement,
    profiles,
    tasks,
)
from .attempt import Attempt
from .errors import NoGPUSliceAvailable, SpawnFailed
from .holding import Holding
from .homes import away_message, machine_state
from .spawner_health import SHUTDOWN_POLL_S
from .spawner_page import render

#: How long a start waits for a leftover service of the same server to let go of its slices.
LEFTOVER_WAIT_S = 20.0


def hub_disk_refusal(data_dir: str, min_free_mb: int, log_name: str) -> SpawnFailed | None:
    """The refusal every start meets while the hub's data folder (``data_dir``) has less than
    ``min_free_mb`` free: the hub could not record the server (its database refuses every
    write), and the participant would read "500: Unhandled error". None when there is room,
    or nothing to check."""
    if not data_dir:
        return None
    try:
        found = os.statvfs(data_dir)
    except OSError:
        return None
    free_mb = found.f_bavail * found.f_frsize // 2**20
    if free_mb >= min_free_mb:
        return None
    return SpawnFailed(
        "The hub's disk is full, so no server can start right now. Please tell an "
        "organizer; servers already running go on.",
        f"The hub's data folder {data_dir} has {free_mb} MiB free (fewer than "
        f"hub_data_min_free_mb, {min_free_mb}): refusing {log_name}. "
        "Free space on the hub's data volume (`docker system df`, old files in "
        f"{data_dir}), then servers start again",
        reason="disk",
        status_code=503,
    )


def usable(handed: broker.Reservation, request: broker.Request) -> bool:
    """A reservation made earlier for this spawn (the gate's) serves its start: the broker
    still counts it, and it was made for the same request."""
    return handed.stands() and handed.request == request


@dataclass(frozen=True)
class LineRules:
    """The hub's settings (traits.py) the choice follows: the waiting line's
    (``waiting_line``, ``line_max_wait`` in seconds, 0: no limit; ``line_max_length``, 0: no
    limit) and those of servers without a GPU (``cpu_only_servers``, ``cpu_only_max_servers``,
    0: no limit), and whether the fleet keeper asks the cloud for machines (``fleet``)."""

    waiting_line: str = "off"
    line_max_wait: float = 0
    line_max_length: int = 0
    cpu_only_servers: bool = False
    cpu_only_max_servers: int = 0
    fleet: bool = False  # the fleet keeper brings machines for people waiting (GPUHUB_FLEET)


@dataclass(frozen=True)
class Spawn:
    """Who the choice is for: ``owner`` (the broker's key: the spawner), its names in the log
    and in Swarm, its spawn page's URL, and its participant's home volume's name."""

    owner: Hashable
    log_name: str
    service_name: str
    spawn_url: str
    home_volume: str


class GPUChoice:
    """One spawn's choice of a GPU, its refusals and its waiting line.

    ``read_swarm``: the spawner's read of the swarm (the broker shares it); ``docker``: its
    Docker calls; ``report(percent, message)``: the spawn page's progress; ``record(kind,
    **fields)``: the dashboard's events; ``healed(action, message)``: the hub healing itself;
    ``joined_line(attempt)``: the spawn joined the line (the spawner writes its state)."""

    def __init__(
        self,
        broker_: broker.GPUBroker,
        spawn: Spawn,
        rules: LineRules,
        *,
        read_swarm: broker.ReadSwarm,
        docker: broker.Docker,
        log: logging.Logger | logging.LoggerAdapter,
        report: Callable[[int, str], None],
        record: Callable[..., None],
        healed: Callable[[str, str], None],
        joined_line: Callable[[Attempt], None],
    ):
        self.broker = broker_
        self.spawn = spawn
        self.rules = rules
        self.read_swarm = read_swarm
        self.docker = docker
        self.log = log
        self.report = report
        self.record = record
        self.healed = healed
        self.joined_line = joined_line

    # ---- before a start: leftovers and refusals ----------------------------------------------

    async def clear_leftover(self) -> None:
        """Remove a service of this server's name that still exists although the hub starts
        the server anew: the hub let it go while Swarm was restarting it (a hub older than
        ``server_lost_after``), its removal failed while the manager was away, or a hub killed
        mid-spawn left it. Its participant is then never refused for the slices their own
        earlier server holds; their files are in their home, which stays. Waits (up to
        ``LEFTOVER_WAIT_S``) until its task has let go of its slices."""
        try:
            service = await self.docker("inspect_service", self.spawn.service_name)
        except NotFound:
            return
        sid = service["ID"]
        self.report(5, "Your earlier server was still running: stopping it (your files stay)")
        with contextlib.suppress(NotFound):  # the hub's keeper removed it meanwhile
            await self.docker("remove_service", sid)
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while time.monotonic() < deadline:
            live = [t for t in await self.docker("tasks") if t.get("ServiceID") == sid]
            if not any(tasks.is_live(t) for t in live):
                break
            await asyncio.sleep(SHUTDOWN_POLL_S * 2)
        self.broker.forget_read()  # the next reservation sees its slices free
        self.healed(
            "leftover removed",
            f"{self.spawn.log_name}: its earlier service {service['Spec']['Name']} (id "
            f"{sid[:7]}) still ran, which the hub did not count as running; removed before "
            "the new start",
        )

    def refused_after(self, refusal: NoGPUSliceAvailable, t0: float, where: str) -> None:
        seconds = round(time.monotonic() - t0, 2)
        self.log.info("%s refused after %.2f s %s", self.spawn.log_name, seconds, where)
        self.record("refused", reason=refusal.jupyterhub_message, seconds=seconds)

    # ---- choosing a GPU ----------------------------------------------------------------------

    async def reserve(
        self,
        request: broker.Request,
        options: dict,
        attempt: Attempt,
        exclude: frozenset = frozenset(),
        may_wait: bool = True,
        handed: broker.Reservation | None = None,
    ) -> broker.Reservation:
        """Slices of one GPU claimed for ``request``, or a refusal people understand at once,
        or (``may_wait`` and the line on for ``options``) slices given after a wait in line.

        ``exclude``: GPUs this spawn already lost a race for; they count as full. ``handed``:
        the gate's reservation for this spawn, taken as it is while it stands for the same
        request: the broker chooses once per spawn.
        """
        if handed is not None:
            if usable(handed, request):
                return await self._placed(request, handed)
            handed.forget()
        owner = self.spawn.owner
        try:
            return await self._placed(
                request, await self.broker.reserve(owner, request, self.read_swarm, exclude)
            )
        except broker.NoRoom as e:
            refused = e
        refusal = self.refusal(refused, request, options)
        if not (may_wait and self.joins_line(refused.gpus, request, options)):
            raise refusal
        self.log.info("%s; joining the line", refusal.log_message)
        return await self._placed(request, await self._wait_in_line(request, attempt))

    def refusal(
        self, refused: broker.NoRoom, request: broker.Request, options: dict
    ) -> NoGPUSliceAvailable:
        """What the participant and the log are told when no GPU has room for ``request``."""
        used, total = inventory.totals(refused.gpus)
        detail = ", ".join(f"{g.node_name}:{g.uuid}={g.used}/{g.slices}" for g in refused.gpus)
        wanted = "a whole GPU" if request.slices is None else f"{request.slices} free slice(s)"
        log_message = (
            f"No GPU with {wanted} for {self.spawn.log_name}: "
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
        nodes, _ = await self.broker.read_swarm(self.read_swarm)
        state = machine_state(nodes, home)
        volume, name = self.spawn.home_volume, self.spawn.log_name
        if state:
            self.log.warning(
                "%s: their home machine %s is %s; starting on %s with another home (their "
                "files are in %s there)",
                name,
                home,
                state,
                here or "a machine Swarm chooses",
                volume,
            )
        else:
            self.log.info("%s: no room on %s (their home), starting elsewhere", name, home)
        self.report(18, away_message(home, state, here or "another machine", volume))

    def hold(self, reservation: broker.Reservation, try_number: int) -> Holding:
        """What the server holds with ``reservation`` (its ``try_number``-th try), said in the
        log and on the spawn page."""
        gpu = reservation.gpu
        kind = "SIMULATED GPU" if gpu.simulated else "MIG instance" if gpu.mig else "GPU"
        isolated = " (hardware-isolated)" if gpu.mig else ""
        self.log.info(
            "Reserving %d slice(s) of %s %s on %s for %s (%d/%d free, attempt %d)",
            reservation.slices,
            kind,
            gpu.uuid,
            gpu.node_name,
            self.spawn.log_name,
            gpu.free,
            gpu.slices,
            try_number,
        )
        self.report(
            20,
            f"Reserving {reservation.slices} slice(s) of {kind} {gpu.uuid} on {gpu.node_name}"
            + isolated,
        )
        return Holding.of(reservation)

    async def place_without_gpu(self, home: str) -> Holding:
        """What a server without a GPU holds: the machine it runs on (``cpu_node`` "" lets
        Swarm choose: no GPU machine here; ``home`` first) and its cores; refuses when
        ``cpu_only_max_servers`` run already."""
        cap, name = self.rules.cpu_only_max_servers, self.spawn.log_name
        if cap:
            running = await self.docker(
                "services", filters={"label": f"{contract.CPU_ONLY_LABEL}=1"}
            )
            names = {s["Spec"]["Name"] for s in running} | self.broker.cpu_only_starting
            others = names - {self.spawn.service_name}
            if len(others) >= cap:
                raise SpawnFailed(
                    f"All {cap} servers without a GPU this hub allows are running. Please wait "
                    "for a GPU slice instead, or try again later.",
                    f"{name}: cpu_only_max_servers ({cap}) reached",
                    reason="capacity",
                    status_code=503,
                )
        gpus = await self.broker.inventory(self.read_swarm)
        chosen = placement.cpu_node(gpus, home)
        cores = next((g.cores for g in gpus if g.node_name == chosen), 0.0)
        if home and chosen != home:
            await self._tell_away_from_home(home, chosen)
        return Holding(cpu_only=True, cpu_node=chosen, node_cores=cores)

    # ---- the waiting line --------------------------------------------------------------------

    def joins_line(self, gpus: list[inventory.GPU], request: broker.Request, options: dict) -> bool:
        """This participant waits in line: the line is on (``auto``, or ``offer`` and they
        asked to in ``options``), and some GPU could ever hold the request."""
        mode = self.rules.waiting_line
        asked = mode == "auto" or (mode == "offer" and options.get("line") == profiles.JOIN)
        return asked and self.line_worth_joining(gpus, request)

    def line_worth_joining(self, gpus: list[inventory.GPU], request: broker.Request) -> bool:
        """Some GPU could ever hold the request: one of the swarm's, or one of a machine the
        fleet keeper will ask the cloud for (a new machine's GPUs are as big as any request,
        GPUHUB_SLICES_PER_SERVER being at most GPUHUB_SLICES_PER_GPU)."""
        return self.rules.fleet or line.can_ever_fit(gpus, request.slices)

    def _refusal_offer(
        self, gpus: list[inventory.GPU], request: broker.Request, refusal: str, options: dict
    ) -> str:
        """The refusal as HTML with what the participant may do instead: wait in line, start
        without a GPU; "" when neither is offered."""
        rules = self.rules
        line_offered = rules.waiting_line == "offer" and self.line_worth_joining(gpus, request)
        if not (line_offered or rules.cpu_only_servers):
            return ""
        kept = {"opt-image": options["image"]} if options.get("image") else {}
        gpu = options.get("gpu", profiles.SLICE)
        return render(
            "refusal_offer.html",
            message=refusal,
            spawn_url=self.spawn.spawn_url,
            line_query={"opt-line": profiles.JOIN, "opt-gpu": gpu, **kept}
            if line_offered
            else None,
            cpu_query={"opt-gpu": profiles.NONE, **kept} if rules.cpu_only_servers else None,
            waiting=len(self.broker.waiting()),
        )

    async def _wait_in_line(self, request: broker.Request, attempt: Attempt) -> broker.Reservation:
        """In the line until slices are given to this server; the participant reads their
        place on the spawn page all along. The hub's database says they are waiting, so a
        hub restart that empties the line can tell them (``failure_message``)."""
        name, max_wait = self.spawn.log_name, self.rules.line_max_wait
        attempt.line_joined = time.time()
        self.joined_line(attempt)
        self.log.info("%s joined the waiting line", name)
        placed = []

        def told(position: int, waiting: int, eta: float | None, held: bool) -> None:
            if not placed:  # the first place told: in the line (not refused as full)
                placed.append(position)
                self.record("joined line")
            held = held and request.slices != 1  # a GPU emptying for a full-GPU request
            note = self.broker.fleet_note  # a GPU machine on its way (fleet.py)
            self.report(10, line.waiting_message(position, waiting, eta, held, note))

        wait = self.broker.wait_in_line(
            self.spawn.owner, request, self.read_swarm, told, self.rules.line_max_length
        )
        joined = attempt.line_joined
        try:
            reservation = await asyncio.wait_for(wait, timeout=max_wait or None)
        except broker.LineFull as e:
            raise NoGPUSliceAvailable(
                f"All GPU slices are in use, and the waiting line is full ({e}). Please try "
                "again later or ask an organizer.",
                f"{name}: the line is full ({e})",
            ) from None
        except asyncio.TimeoutError:
            raise NoGPUSliceAvailable(
                f"You waited {line.about(max_wait)} in line and no GPU slice freed up, which "
                "is as long as this hub lets anyone wait. Please try again later or ask an "
                "organizer.",
                f"{name} left the line after {max_wait} s (line_max_wait)",
            ) from None
        except asyncio.CancelledError:
            self.log.info("%s left the waiting line", name)
            self.record("left line", waited=round(time.time() - joined, 1))
            attempt.cancelled_in_line = True
            raise
        finally:
            attempt.line_joined = 0
        attempt.waited = time.time() - joined
        self.log.info(
            "%s leaves the line after %.0f s for %s on %s",
            name,
            time.time() - joined,
            reservation.gpu.uuid,
            reservation.gpu.node_name,
        )
        self.report(15, "A GPU slice is free for you: starting your server")
        return reservation
