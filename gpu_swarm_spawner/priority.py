"""The hub first on the CPU: its and the proxy's containers' weight on a machine they share
with participants' servers, and its garbage collector's pauses.

On a manager that has GPUs too (``make demo``, a small course), the hub's container, the proxy's
and the servers' each get a CPU group of Docker's default weight. While 18 JupyterLabs started
at once on a 2-core machine, the hub's thread had about a twentieth of the CPU: its event loop
stalled for 2-8 s, and the participants refused in that burst waited as long to be told.

Swarm has no CPU weight for a service (its CPU reservation only places tasks), so the hub sets
one on the containers of its stack's ``hub`` and ``proxy`` services that run on its own engine
(the hub's Docker socket), ``cpu_shares`` each, as ``docker update --cpu-shares`` does. It
looks again every ``interval`` seconds: a service's restarted task is a new container with
Docker's default weight. A weight only matters while the CPU is short; the servers keep every
cycle the hub does not use. A proxy on another manager is out of reach and keeps its weight.

The hub's own thread also stopped for Python's garbage collector: the hub makes many objects
per request (a spawner for each start, the database's rows), so in a burst of 500 starts at once
a full collection of everything it held came about twice a second, each 0.2-0.28 s (measured
with ``gc.callbacks`` on a hub outside Docker: 0.43-0.53 s of GC in a 1-1.5 s burst). Once the
hub is up, ``tune_gc`` moves what it made while starting (modules, classes, configuration, which
live as long as it does) out of the collector's sight and lets ``gc_threshold`` objects
accumulate before the youngest generation is collected instead of Python's 700. Garbage without
reference cycles is freed at once as always; cyclic garbage waits a little longer.

``CPUPriority.install`` (called by ``jupyterhub_config.py``) does both once the hub is up:
JupyterHub has no hook for work of its own.
"""

from __future__ import annotations

import asyncio
import gc

from traitlets import Float, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from . import internals
from .contract import DOCKER_SERVICE_LABEL, DOCKER_STACK_LABEL

#: Docker's weight for a container created without one (HostConfig.CpuShares 0).
DOCKER_DEFAULT_SHARES = 1024


def ours(summaries: list[dict], stack: str, services: list[str]) -> list[dict]:
    """The containers (as ``docker.APIClient.containers()`` lists them) of the stack's
    ``services`` (Swarm names a stack's service ``<stack>_<service>``)."""
    names = {f"{stack}_{service}" for service in services}
    return [c for c in summaries if (c.get("Labels") or {}).get(DOCKER_SERVICE_LABEL) in names]


def needs_shares(inspected: dict, shares: int) -> bool:
    """Whether an inspected container's CPU weight is not ``shares`` yet."""
    current = (inspected.get("HostConfig") or {}).get("CpuShares") or DOCKER_DEFAULT_SHARES
    return current != shares


class CPUPriority(LoggingConfigurable):
    """Keeps the hub's and the proxy's containers at a CPU weight above the servers'."""

    cpu_shares = Integer(
        16384,
        min=0,
        max=262144,
        config=True,
        help="""CPU weight (``docker run --cpu-shares``) of the hub's and the proxy's containers
        on the hub's machine; servers have Docker's default, 1024. 16384 lets the hub go 16
        times before a server under cgroup v1 (about 6 times under cgroup v2, through Docker's
        conversion). 0: leave Docker's default (the hub weighs as one server).""",
    )
    stack = Unicode(
        "gpuhub",
        config=True,
        help="The Swarm stack whose services' containers are raised (GPUHUB_STACK).",
    )
    services = List(
        Unicode(),
        ["hub", "proxy"],
        config=True,
        help="The stack's services (deploy/stack.yml) whose containers are raised.",
    )
    interval = Float(
        60,
        min=1,
        config=True,
        help="Seconds between looks for containers to raise (a restarted task's is new).",
    )
    gc_threshold = Integer(
        50_000,
        min=0,
        config=True,
        help="""Objects the hub may allocate (less those freed) before Python collects its
        youngest generation (Python's default: 700); 0: Python's default and no freeze.""",
    )

    def __init__(self, client_factory=None, **kwargs):
        super().__init__(**kwargs)
        self._client_factory = client_factory or _docker_client
        self._client = None
        self._last_error = ""

    def raise_once(self) -> list[str]:
        """Give the stack's containers on this engine ``cpu_shares``; the names of those it
        changed. Blocking (Docker calls): run it in a thread."""
        if self._client is None:
            self._client = self._client_factory()
        client = self._client
        summaries = client.containers(filters={"label": f"{DOCKER_STACK_LABEL}={self.stack}"})
        changed = []
        for summary in ours(summaries, self.stack, self.services):
            if needs_shares(client.inspect_container(summary["Id"]), self.cpu_shares):
                client.update_container(summary["Id"], cpu_shares=self.cpu_shares)
                changed.append(summary["Labels"][DOCKER_SERVICE_LABEL])
        return changed

    async def check(self) -> None:
        """One look, off the event loop; what it changed or why it could not, in the log (an
        error once, until it changes)."""
        try:
            changed = await asyncio.to_thread(self.raise_once)
        except Exception as e:  # the hub works without it: say so, and how to fix it
            if str(e) != self._last_error:
                self._last_error = str(e)
                self.log.warning(
                    "Could not give the hub's containers CPU weight %i: %s. The hub works, but "
                    "on a machine that also runs servers it answers slowly while they start. "
                    "The hub needs the Docker socket (deploy/stack.yml); "
                    "GPUHUB_HUB_CPU_SHARES=0 turns this off.",
                    self.cpu_shares,
                    e,
                )
            return
        self._last_error = ""
        for name in changed:
            self.log.info(
                "CPU weight of %s's container: %i shares (servers: Docker's default %i)",
                name,
                self.cpu_shares,
                DOCKER_DEFAULT_SHARES,
            )

    async def keep(self) -> None:
        """Look now and every ``interval`` seconds, for the hub's lifetime."""
        while True:
            await self.check()
            await asyncio.sleep(self.interval)

    def tune_gc(self) -> None:
        """Freeze what the hub holds now and raise the youngest generation's threshold to
        ``gc_threshold`` (the older generations' stay Python's)."""
        if not self.gc_threshold:
            return
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(self.gc_threshold, older, oldest)
        self.log.info(
            "Garbage collector: %i objects frozen, collections after %i allocations",
            gc.get_freeze_count(),
            self.gc_threshold,
        )

    @classmethod
    def install(cls) -> None:
        """When JupyterHub has started, tune its garbage collector and start ``keep``
        (configured from the hub's config, as ``c.CPUPriority``; ``keep`` does not run when
        ``cpu_shares`` is 0). Idempotent."""
        internals.after_hub_start(cls.start_keeping)

    @classmethod
    def start_keeping(cls, hub) -> None:
        keeper = cls(parent=hub)
        keeper.tune_gc()
        if keeper.cpu_shares:
            hub.gpuhub_priority = asyncio.ensure_future(keeper.keep())


def _docker_client():
    import docker

    return docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
