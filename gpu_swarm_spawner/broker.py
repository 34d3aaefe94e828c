"""The GPU broker: what all spawners of one hub share about the swarm's GPU slices.

One broker per hub (per event loop): the thread pool for Docker API calls, the latest read of
the swarm's nodes and tasks (shared by spawns for ``max_age`` seconds, or while in flight), and
the *claims*: slices a spawn has chosen that Swarm does not show as taken yet. Its API is the
life of one reservation, one object from the choice to the end of the spawn:

    reservation = await broker.reserve(spawner, request, read)   # choose a GPU, claim slices
    reservation.stands()                  # still claimed for its spawn (the start may use it)
    broker.created(spawner, service_id)   # the service exists: a task of it counts instead
    broker.placed(spawner)                # Swarm placed (or refused) it: Swarm counts it now
    broker.release(spawner)               # the spawn ended, however it ended (the start's
                                          # finally; reservation.release() for one of them)
    reservation.forget()                  # ... or never began (the gate let it through)

Participants who do not fit may wait in the *line* (``line.py`` decides who gets what):

    reservation = await broker.wait_in_line(spawner, request, read, told)  # told(position...)

Each newcomer to the line sets the hub's ``line_joined()`` event, which the fleet keeper
(fleet.py) waits on between its rounds: a machine is asked for at once, not at the next round.
While the line is not empty the broker reads the swarm every ``line_interval`` seconds (and at
once when ``nudge()`` says a server stopped) and gives freed slices to the line in its order,
as claims like any other; newcomers' ``reserve`` serves the line first, so nobody jumps it.

The invariant that makes claims work: between building the inventory a GPU is chosen from and
recording the claim, no other spawn of the hub may choose. ``reserve`` awaits only the read;
choosing and claiming happen in one plain (non-async) method, ``_choose_and_claim``, which
builds the inventory from the read *and the claims as they are at that moment*, so it cannot
be interleaved with another spawn's choice (asyncio switches tasks only at an ``await``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from . import inventory, line, placement
from .contract import KIND_PREFIXES
from .inventory import GPU, Claim
from .placement import Request
from .tasks import newest

#: Reads the swarm: ``(nodes, tasks)`` as ``docker.APIClient.nodes()`` / ``.tasks()`` return them.
ReadSwarm = Callable[[], Awaitable[tuple[list[dict], list[dict]]]]
#: A Docker API call as the spawner makes it on the broker's threads:
#: ``await docker("tasks", filters=...)``.
Docker = Callable[..., Awaitable[Any]]


@dataclass(eq=False)
class Reservation:
    """One spawn's slices of one GPU: what it holds (``gpu``, ``slices``), where (``node``),
    and its end (``release``, ``forget``). Made by the broker, which counts its ``claim``
    until Swarm counts the task; it *stands* while the broker still does. Compared by
    identity: the same GPU and slices reserved again are another reservation."""

    gpu: GPU  # as the inventory saw it when it was chosen
    slices: int  # how many of its slices the server reserves
    owner: Hashable = None  # the spawn it is for (its spawner)
    request: Request | None = None  # what that spawn asked for
    broker: GPUBroker | None = field(default=None, repr=False)
    #: what the broker counts for it; its service_id set once the service exists (created)
    claim: Claim = field(init=False)

    def __post_init__(self):
        self.claim = Claim(self.gpu.uuid, self.slices)

    @property
    def node(self) -> str:
        """The machine of its GPU."""
        return self.gpu.node_name

    def stands(self) -> bool:
        """Its slices are still claimed for its owner by this reservation (not released,
        forgotten, placed, or replaced by a newer one of the same owner)."""
        return self.broker is not None and self.broker.reservation_of(self.owner) is self

    def release(self) -> None:
        """The spawn ended, however it ended: its slices are no longer claimed (the next
        reservation reads the swarm afresh, as after ``placed``). Nothing when it no longer
        stands: a newer reservation of the same owner stays."""
        if self.stands():
            self.broker.placed(self.owner)

    def forget(self) -> None:
        """Its spawn never used it (the gate let a spawn through that did not start): its
        claim goes, if it still stands."""
        if self.broker is not None:
            self.broker.forget(self)


class NoRoom(Exception):
    """No GPU fits the request; ``gpus`` is the inventory it was refused from, ``tasks`` the
    swarm's tasks as read for it."""

    def __init__(self, gpus: list[GPU], request: Request, tasks: list[dict] | None = None):
        super().__init__(placement.refusal_message(gpus, request.slices))
        self.gpus = gpus
        self.request = request
        self.tasks = tasks or []


#: After a server of the hub stopped, the line looks every SOON_INTERVAL_S for SOON_S seconds:
#: the stopped task ends within a few seconds, and its slices are free only then.
SOON_S = 15.0
SOON_INTERVAL_S = 0.25


class LineFull(Exception):
    """The line has as many participants as it may hold."""


#: told(position, waiting, estimate_s or None, held): the participant's place, when it changes
Told = Callable[[int, int, "float | None", bool], None]


class GPUBroker:
    def __init__(self, threads: int = 4, kind_prefix=KIND_PREFIXES, max_age: float = 1.0):
        self.kind_prefix = kind_prefix
        self.max_age = max_age
        #: the thread pool for every blocking Docker call of the hub's spawners
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="docker-api")
        self.threads = threads
        #: the reads of the swarm's state have a thread of their own: a read (which every
        #: refusal in a burst shares) never waits behind the service creations and removals
        #: queued on the others (not shown to shorten the slow bursts on the bed, whose cause
        #: was the hub's share of the CPU: priority.py)
        self.read_executor = ThreadPoolExecutor(1, thread_name_prefix="docker-read")
        #: the reservations whose slices Swarm does not count yet, by owner
        self._claims: dict[Hashable, Reservation] = {}
        self._read: asyncio.Future | None = None
        self._read_started = 0.0
        self._polled: tuple | None = None  # (the read, its tasks by service, its nodes by ID)
        self._usage: tuple | None = None  # (the tasks of a read, what they hold)
        #: network name -> its address ranges, read once (a network's ranges never change;
        #: `make down` removes it with the hub)
        self.network_ranges: dict[str, list[str]] = {}
        #: the swarm's nodes as the latest read gave them (None before the first)
        self.last_nodes: list[dict] | None = None
        # the waiting line
        self.line_interval = 2.0  # seconds between reads of the swarm while anyone waits
        self._line: list[line.Entry] = []
        self._turns: dict[Hashable, asyncio.Future] = {}  # owner -> its Reservation, once due
        self._told: dict[Hashable, Told] = {}
        self._held: line.Pass | None = None  # the last pass: the GPU held for whom
        self._line_since = 0.0  # when the line last began (time.monotonic)
        self._served: list[float] = []  # when participants left the line with a GPU
        self._line_task: asyncio.Task | None = None
        self._nudged: asyncio.Event | None = None
        self._line_read: ReadSwarm | None = None
        #: told (the line, head first; the GPU held; for whom) whenever that changes
        self.on_line_change: Callable[[list[line.Entry], str, Hashable | None], None] | None = None
        self._line_key: tuple = ((), "", None)
        self.line_error = ""  # why the line's last look at the swarm failed ("" when it did not)
        #: what the fleet keeper (fleet.py) tells those in line beside their place: a GPU
        #: machine on its way, or the cloud's refusal; "" for nothing
        self.fleet_note = ""
        #: services of servers without a GPU being started (they count towards the cap before
        #: their service exists)
        self.cpu_only_starting: set[str] = set()
        #: services of servers being stopped
        self.stopping: set[str] = set()

    # ---- reading the swarm ----------------------------------------------------------------

    def _shared_read(
        self, loop: asyncio.AbstractEventLoop, max_age: float
    ) -> asyncio.Future | None:
        """A read of the swarm (a future) a caller may share: one in flight, or one that
        succeeded less than ``max_age`` ago; None when a new read is needed."""
        read = self._read
        if read is None or not read.done():
            return read
        if read.cancelled() or read.exception() or loop.time() - self._read_started >= max_age:
            return None
        return read

    async def read_swarm(
        self, read: ReadSwarm, max_age: float | None = None
    ) -> tuple[list[dict], list[dict]]:
        """Nodes and tasks: a shared read when there is one (in flight, or younger than
        ``max_age``; the broker's own by default), else ``read()`` (then shared)."""
        loop = asyncio.get_running_loop()
        shared = self._shared_read(loop, self.max_age if max_age is None else max_age)
        if shared is None:
            shared = self._read = asyncio.ensure_future(read())
            self._read_started = loop.time()
        # shielded: a spawn cancelled while waiting does not cancel the read others share
        result = await asyncio.shield(shared)
        self.last_nodes = result[0]
        return result

    def forget_read(self) -> None:
        """The swarm changed in a way the next reservation must see (a service removed and
        its task ended): the next read is a new one."""
        self._read = None

    async def recent_read(
        self, read: ReadSwarm, max_age: float
    ) -> tuple[dict[str, dict], dict[str, dict]]:
        """The servers' view for polling: ``({service ID: its newest task}, {node ID: node})``
        from the latest read of the swarm when it began less than ``max_age`` seconds ago,
        else from a new (shared) read. Indexed once per read, however many servers poll."""
        result = await self.read_swarm(read, max_age)
        if self._polled is None or self._polled[0] is not result:
            nodes, all_tasks = result
            by_service: dict[str, list[dict]] = {}
            for task in all_tasks:
                by_service.setdefault(task.get("ServiceID", ""), []).append(task)
            latest_tasks = {sid: newest(found) for sid, found in by_service.items()}
            self._polled = (result, latest_tasks, {n["ID"]: n for n in nodes})
        return self._polled[1], self._polled[2]

    def _inventory(self, nodes: list[dict], tasks: list[dict]) -> list[GPU]:
        claims = [r.claim for r in self._claims.values()]
        # counted once per read: a burst of 500 refusals builds 500 inventories from one read
        if self._usage is None or self._usage[0] is not tasks:
            self._usage = (tasks, inventory.task_usage(tasks, self.kind_prefix))
        usage = self._usage[1]
        return inventory.build_inventory(nodes, tasks, self.kind_prefix, claims, usage)

    async def inventory(self, read: ReadSwarm) -> list[GPU]:
        """The swarm's GPUs with the slices live tasks and this hub's claims hold."""
        return self._inventory(*await self.read_swarm(read))

    # ---- one reservation's life -----------------------------------------------------------

    async def reserve(
        self,
        owner: Hashable,
        request: Request,
        read: ReadSwarm,
        exclude: frozenset = frozenset(),
    ) -> Reservation:
        """Choose a GPU for ``request`` and claim its slices for ``owner``; raises ``NoRoom``.

        ``exclude``: GPUs this spawn already lost a race for; they count as full. A spawn
        reserves once: the gate's reservation is the start's while it stands
        (``Reservation.stands``); this runs again only for a race lost, or a GPU gone.
        """
        nodes, tasks = await self.read_swarm(read)
        return self._choose_and_claim(owner, request, nodes, tasks, exclude)

    def _choose_and_claim(self, owner, request, nodes, tasks, exclude) -> Reservation:
        # Not async, on purpose: no other spawn can choose between the inventory built here
        # (with every claim recorded so far) and the claim recorded below.
        self._claims.pop(owner, None)  # a new attempt replaces its earlier claim
        self._serve_line(nodes, tasks)  # those waiting first: a newcomer never jumps the line
        gpus = [
            replace(g, used=g.slices) if g.uuid in exclude else g
            for g in self._inventory(nodes, tasks)
        ]
        # what the line could not use is free to take, but not the GPU held for its earliest
        usable = [g for g in gpus if g.uuid != self._held_gpu()]
        gpu = placement.choose(
            usable, request.slices, request.policy, request.seed, request.prefer_node
        )
        if gpu is None:
            raise NoRoom(gpus, request, tasks)
        return self._claim(owner, request, gpu, placement.slices_taken(gpu, request.slices))

    def _claim(self, owner: Hashable, request: Request, gpu: GPU, slices: int) -> Reservation:
        reservation = Reservation(gpu, slices, owner, request, self)
        self._claims[owner] = reservation
        return reservation

    def created(self, owner: Hashable, service_id: str) -> None:
        """The owner's service exists: once a read shows its task, the task counts instead."""
        reservation = self._claims.get(owner)
        if reservation is not None:
            reservation.claim = replace(reservation.claim, service_id=service_id)

    def reservation_of(self, owner: Hashable) -> Reservation | None:
        """The reservation standing for ``owner`` now (None: nothing claimed)."""
        return self._claims.get(owner)

    def forget(self, reservation: Reservation) -> None:
        """Forget ``reservation`` if it still stands: a later ``reserve`` of the same owner
        replaced it with its own, which stays."""
        if self._claims.get(reservation.owner) is reservation:
            del self._claims[reservation.owner]

    def placed(self, owner: Hashable) -> None:
        """Swarm placed the owner's task (or refused it): Swarm counts its slices now."""
        if self._claims.pop(owner, None) is not None:
            # a read from before may not show the placed task: the next spawn reads again
            self._read = None

    def release(self, owner: Hashable) -> None:
        """The owner's spawn ended (started, failed or cancelled): nothing is claimed for it."""
        self.placed(owner)

    # ---- the waiting line -----------------------------------------------------------------

    async def wait_in_line(
        self,
        owner: Hashable,
        request: Request,
        read: ReadSwarm,
        told: Told,
        max_length: int = 0,
    ) -> Reservation:
        """Wait in the line until slices are given to ``owner``; ``told`` hears its place
        whenever it changes. Raises ``LineFull`` when ``max_length`` (0: no limit) are waiting.
        However the wait ends (served, cancelled: the participant left, timed out), ``owner``
        is no longer in the line; a reservation given but not taken is released."""
        if max_length and len(self._line) >= max_length:
            raise LineFull(f"{len(self._line)} are waiting")
        loop = asyncio.get_running_loop()
        if not self._line:
            self._line_since = time.monotonic()
        self._line.append(line.Entry(owner, request, time.monotonic()))
        turn = self._turns[owner] = loop.create_future()
        self._told[owner] = told
        self._line_read = read
        self._tell()
        line_joined().set()
        if self._line_task is None or self._line_task.done():
            self._nudged = asyncio.Event()
            self._line_task = asyncio.ensure_future(self._keep_line())
        try:
            return await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.release(owner)  # given slices as the participant left: free them
            raise
        finally:
            self._leave(owner)

    def _leave(self, owner: Hashable) -> None:
        was = len(self._line)
        self._line = [e for e in self._line if e.owner != owner]
        self._turns.pop(owner, None)
        self._told.pop(owner, None)
        if len(self._line) != was:
            self._tell()

    def nudge(self) -> None:
        """Something may have freed slices (a server stopped): the next reservation reads the
        swarm afresh (a participant pressing Start right after a server stopped was refused
        on a read from before), and the line looks now."""
        self.forget_read()
        if self._nudged is not None:
            self._nudged.set()

    def waiting(self) -> list[line.Entry]:
        """The line now, head first (a copy)."""
        return list(self._line)

    def _held_gpu(self) -> str:
        return self._held.held_gpu if self._held is not None else ""

    async def _keep_line(self) -> None:
        """While anyone waits: read the swarm, serve the line, tell everyone their place. After
        a server stopped, its task takes a few seconds to end (its slices count until then):
        for ``SOON_S`` the line looks every ``SOON_INTERVAL_S`` instead of ``line_interval``."""
        loop = asyncio.get_running_loop()
        soon_until = 0.0
        while self._line:
            try:
                self._serve_line(*await self.read_swarm(self._line_read))
            except Exception as e:  # the manager did not answer: the next look tries again
                self.line_error = f"{type(e).__name__}: {e}"
            else:
                self.line_error = ""
            interval = self.line_interval
            if loop.time() < soon_until:
                interval = min(interval, SOON_INTERVAL_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._nudged.wait(), timeout=interval)
            if self._nudged.is_set():
                self._nudged.clear()
                self._read = None  # a server stopped: read the swarm afresh
                soon_until = loop.time() + SOON_S

    def _serve_line(self, nodes: list[dict], tasks: list[dict]) -> None:
        """One pass of the line over the swarm as read, with every claim: those who fit get
        their slices claimed and their turn. Not async (see ``_choose_and_claim``)."""
        if not self._line:
            self._held = None
            return
        done = line.assign(self._line, self._inventory(nodes, tasks), self._held)
        requests = {e.owner: e.request for e in self._line}
        for a in done.assigned:
            reservation = self._claim(a.owner, requests.get(a.owner), a.gpu, a.slices)
            self._served.append(time.monotonic())
            turn = self._turns.pop(a.owner, None)
            if turn is not None and not turn.done():
                turn.set_result(reservation)
        served = {a.owner for a in done.assigned}
        self._line = [e for e in self._line if e.owner not in served]
        self._held = done
        self._served = self._served[-200:]
        self._tell()

    def tell_fleet_note(self, note: str) -> None:
        """The fleet keeper's words for the line (``fleet_note``); when they change, everyone in
        line hears them at once instead of at the line's next look."""
        if note != self.fleet_note:
            self.fleet_note = note
            self._tell()

    def _tell(self) -> None:
        """Everyone in the line hears their place (the spawner drops repeats), and so does
        ``on_line_change`` when the line or its held GPU changed."""
        now = time.monotonic()
        for number, entry in enumerate(self._line, start=1):
            told = self._told.get(entry.owner)
            if told is not None:
                eta = line.estimate(number, self._served, now, self._line_since)
                held = self._held is not None and self._held.held_for == entry.owner
                told(number, len(self._line), eta, held)
        held = self._held or line.Pass()
        key = (tuple(e.owner for e in self._line), held.held_gpu, held.held_for)
        if self.on_line_change is not None and key != self._line_key:
            self._line_key = key
            self.on_line_change(list(self._line), held.held_gpu, held.held_for)

    def claimed(self) -> dict[Hashable, Claim]:
        """The claims now, by owner (a copy)."""
        return {owner: r.claim for owner, r in self._claims.items()}

    # ---- Docker calls ---------------------------------------------------------------------

    def call(self, client, method: str, *args, **kwargs) -> Awaitable:
        """``client.<method>(*args, **kwargs)`` on the broker's threads."""
        call = functools.partial(getattr(client, method), *args, **kwargs)
        return asyncio.wrap_future(self.executor.submit(call))

    def read(self, function: Callable, *args, **kwargs) -> Awaitable:
        """``function(*args, **kwargs)``, a read of the swarm, on the broker's reading thread."""
        call = functools.partial(function, *args, **kwargs)
        return asyncio.wrap_future(self.read_executor.submit(call))

    def close(self) -> None:
        self.executor.shutdown(wait=False)
        self.read_executor.shutdown(wait=False)


#: one broker per event loop (a hub has one; each test has its own)
_BROKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_LOOP = asyncio.AbstractEventLoop  # the key used outside a running loop
#: one ``line_joined`` event per event loop
_JOINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hub_key():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return _NO_LOOP


def line_joined() -> asyncio.Event:
    """Set whenever someone joins the line of the hub running in this event loop; the fleet
    keeper waits on it between rounds (``periodic.keep``'s ``wake``). It is the hub's, not its
    broker's: the keeper may wait on it before the first spawner made the broker, as on a hub
    just started whose first participant finds no GPU machine."""
    key = _hub_key()
    event = _JOINED.get(key)
    if event is None:
        event = _JOINED[key] = asyncio.Event()
    return event


def of_hub_if_made() -> GPUBroker | None:
    """The broker of the hub running in this event loop once its first spawner made it; None
    before (the hub's other keepers read it without making it with settings of their own)."""
    return _BROKERS.get(_hub_key())


def of_hub(threads: int, kind_prefix, max_age: float, line_interval: float = 2.0) -> GPUBroker:
    """The broker of the hub running in this event loop, created by its first spawner."""
    key = _hub_key()
    broker = _BROKERS.get(key)
    if broker is None:
        broker = _BROKERS[key] = GPUBroker(threads, kind_prefix, max_age)
        broker.line_interval = line_interval
        weakref.finalize(broker, broker.close)
    return broker
