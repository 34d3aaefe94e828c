"""The GPU broker: what all spawners of one hub share about the swarm's GPU slices.

One broker per hub (per event loop): the thread pool for Docker API calls, the latest read of
the swarm's nodes and tasks (shared by spawns for ``max_age`` seconds, or while in flight), and
the *claims*: slices a spawn has chosen that Swarm does not show as taken yet. Its API is the
life of one reservation:

    reservation = await broker.reserve(spawner, request, read)   # choose a GPU, claim slices
    broker.created(spawner, service_id)   # the service exists: a task of it counts instead
    broker.placed(spawner)                # Swarm placed (or refused) it: Swarm counts it now
    broker.release(spawner)               # the spawn ended, however it ended

The invariant that makes claims work: between building the inventory a GPU is chosen from and
recording the claim, no other spawn of the hub may choose. ``reserve`` awaits only the read;
choosing and claiming happen in one plain (non-async) method, ``_choose_and_claim``, which
builds the inventory from the read *and the claims as they are at that moment*, so it cannot
be interleaved with another spawn's choice (asyncio switches tasks only at an ``await``).
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from . import inventory, placement
from .contract import KIND_PREFIXES
from .inventory import GPU, Claim

#: Reads the swarm: ``(nodes, tasks)`` as ``docker.APIClient.nodes()`` / ``.tasks()`` return them.
ReadSwarm = Callable[[], Awaitable[tuple[list[dict], list[dict]]]]


@dataclass(frozen=True)
class Request:
    """What a spawn asks for."""

    slices: int | None  # slices of one GPU; None: a whole GPU, all of its own slices
    policy: str = "spread"
    seed: str = ""  # the user's name: ties between GPUs break differently per user
    prefer_node: str = ""  # the machine of the user's home volume, when it has room


@dataclass(frozen=True)
class Reservation:
    gpu: GPU  # as the inventory saw it when it was chosen
    slices: int  # how many of its slices the server reserves


class NoRoom(Exception):
    """No GPU fits the request; ``gpus`` is the inventory it was refused from."""

    def __init__(self, gpus: list[GPU], request: Request):
        super().__init__(placement.refusal_message(gpus, request.slices))
        self.gpus = gpus
        self.request = request


class GPUBroker:
    def __init__(self, threads: int = 4, kind_prefix=KIND_PREFIXES, max_age: float = 1.0):
        self.kind_prefix = kind_prefix
        self.max_age = max_age
        #: the thread pool for every blocking Docker call of the hub's spawners
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="docker-api")
        self._claims: dict[Hashable, Claim] = {}
        self._read: asyncio.Future | None = None
        self._read_started = 0.0

    # ---- reading the swarm ----------------------------------------------------------------

    def _shared_read(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future | None:
        """A read of the swarm a spawn may share: one in flight, or one that succeeded less
        than ``max_age`` ago; None when a new read is needed."""
        read = self._read
        if read is None or not read.done():
            return read
        if read.cancelled() or read.exception() or loop.time() - self._read_started >= self.max_age:
            return None
        return read

    async def read_swarm(self, read: ReadSwarm) -> tuple[list[dict], list[dict]]:
        """Nodes and tasks: a shared read when there is one, else ``read()`` (then shared)."""
        loop = asyncio.get_running_loop()
        shared = self._shared_read(loop)
        if shared is None:
            shared = self._read = asyncio.ensure_future(read())
            self._read_started = loop.time()
        # shielded: a spawn cancelled while waiting does not cancel the read others share
        return await asyncio.shield(shared)

    def _inventory(self, nodes: list[dict], tasks: list[dict]) -> list[GPU]:
        claims = list(self._claims.values())
        return inventory.build_inventory(nodes, tasks, self.kind_prefix, claims=claims)

    async def inventory(self, read: ReadSwarm) -> list[GPU]:
        """The swarm's GPUs with the slices live tasks and this hub's claims hold."""
        return self._inventory(*await self.read_swarm(read))

    # ---- one reservation's life -----------------------------------------------------------

    async def reserve(
        self, owner: Hashable, request: Request, read: ReadSwarm, exclude: frozenset = frozenset()
    ) -> Reservation:
        """Choose a GPU for ``request`` and claim its slices for ``owner``; raises ``NoRoom``.

        ``exclude``: GPUs this spawn already lost a race for; they count as full.
        """
        nodes, tasks = await self.read_swarm(read)
        return self._choose_and_claim(owner, request, nodes, tasks, exclude)

    def _choose_and_claim(self, owner, request, nodes, tasks, exclude) -> Reservation:
        # Not async, on purpose: no other spawn can choose between the inventory built here
        # (with every claim recorded so far) and the claim recorded below.
        self._claims.pop(owner, None)  # a new attempt replaces this owner's earlier claim
        gpus = [
            replace(g, used=g.slices) if g.uuid in exclude else g
            for g in self._inventory(nodes, tasks)
        ]
        gpu = placement.choose(
            gpus, request.slices, request.policy, request.seed, request.prefer_node
        )
        if gpu is None:
            raise NoRoom(gpus, request)
        slices = placement.slices_taken(gpu, request.slices)
        self._claims[owner] = Claim(gpu.uuid, slices)
        return Reservation(gpu, slices)

    def created(self, owner: Hashable, service_id: str) -> None:
        """The owner's service exists: once a read shows its task, the task counts instead."""
        claim = self._claims.get(owner)
        if claim is not None:
            self._claims[owner] = replace(claim, service_id=service_id)

    def placed(self, owner: Hashable) -> None:
        """Swarm placed the owner's task (or refused it): Swarm counts its slices now."""
        if self._claims.pop(owner, None) is not None:
            # a read from before may not show the placed task: the next spawn reads again
            self._read = None

    def release(self, owner: Hashable) -> None:
        """The owner's spawn ended (started, failed or cancelled): nothing is claimed for it."""
        self.placed(owner)

    def claimed(self) -> dict[Hashable, Claim]:
        """The claims now, by owner (a copy)."""
        return dict(self._claims)

    # ---- Docker calls ---------------------------------------------------------------------

    def call(self, client, method: str, *args, **kwargs) -> Awaitable:
        """``client.<method>(*args, **kwargs)`` on the broker's threads."""
        call = functools.partial(getattr(client, method), *args, **kwargs)
        return asyncio.wrap_future(self.executor.submit(call))

    def close(self) -> None:
        self.executor.shutdown(wait=False)


#: one broker per event loop (a hub has one; each test has its own)
_BROKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_NO_LOOP = asyncio.AbstractEventLoop  # the key used outside a running loop


def of_hub(threads: int, kind_prefix, max_age: float) -> GPUBroker:
    """The broker of the hub running in this event loop, created by its first spawner."""
    try:
        key = asyncio.get_running_loop()
    except RuntimeError:
        key = _NO_LOOP
    broker = _BROKERS.get(key)
    if broker is None:
        broker = _BROKERS[key] = GPUBroker(threads, kind_prefix, max_age)
        weakref.finalize(broker, broker.executor.shutdown, wait=False)
    return broker
