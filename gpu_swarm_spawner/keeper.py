"""The hub keeps the proxy's routes and Swarm's services in agreement with its own view.

``KeepingProxy`` is JupyterHub's proxy class for configurable-http-proxy run as a service of
its own (``deploy/stack.yml``), with two loops the hub runs from its first route check on:

- **routes**, every ``route_check_interval`` (2 s): the proxy's routes are read (one request)
  and compared with the routes of every server the hub has running (``reconcile.
  routes_to_mend``); what the proxy lacks or points elsewhere is put back by JupyterHub's own
  ``check_routes``. A proxy that restarted (its task killed, rescheduled, redeployed) has no
  routes at all: JupyterHub alone would put them back at its next periodic check, up to
  ``last_activity_interval`` (5 min) later, and meanwhile every participant's JupyterLab is
  cut off (jupyterhub/jupyterhub#2000). A server Swarm moved to a new address (``spawner.
  _follow_address``) gets its route moved the same way.
- **services**, every ``orphan_check_interval`` (10 s): services of participants' servers
  (this hub's ``server_labels``) that no server of the hub owns, running or starting, are
  removed once seen so for ``orphan_grace`` (30 s): their slices would otherwise be held
  forever by nobody the hub lists (a hub killed mid-spawn, a removal that failed while the
  manager was away).

Why the hub mends routes rather than a proxy whose routes outlive it (jupyterhub/traefik-proxy
with etcd or Consul, as the-littlest-jupyterhub chose): on Swarm the proxy is a task that may
be rescheduled to another machine, so a proxy-side store must itself be a replicated service
(a key-value cluster to run, secure and back up on the event day), and its routes still only
say what the hub last wrote. The hub is the one source of truth; reading the proxy's table
every 2 s costs one small request, brings routes back within seconds of the proxy answering,
and also mends routes that went stale for any other reason. Each action is logged, counted
and recorded for the dashboard (``healing.py``).

JupyterHub calls ``check_routes`` at start-up, after it has checked every server
(``init_spawners``); that first call starts the loops, so nothing is swept before the hub
knows which servers it has.
"""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import docker
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver
from docker.errors import NotFound
from jupyterhub.proxy import ConfigurableHTTPProxy
from traitlets import Dict, Float, Unicode

from . import contract, events, healing, internals, reconcile


class KeepingProxy(ConfigurableHTTPProxy):
    route_check_interval = Float(
        2.0,
        config=True,
        help="""
        Seconds between the hub's reads of the proxy's routes; routes of running servers that
        the proxy lacks (it restarted) or that point elsewhere (a server Swarm moved) are put
        back at once. 0: only JupyterHub's own check, every ``last_activity_interval``.
        """,
    )
    orphan_check_interval = Float(
        10.0,
        config=True,
        help="""
        Seconds between the hub's looks for services of participants' servers (with
        ``server_labels``) that no server of the hub owns. 0: never.
        """,
    )
    orphan_grace = Float(
        30.0,
        config=True,
        help="""
        Seconds a service no server of the hub owns is left before it is removed (counted from
        when this hub first saw it so, so a hub that just restarted gives every service the
        whole grace after it answers).
        """,
    )
    server_labels = Dict(
        config=True,
        help="""
        Labels every service of this hub's servers carries (``GPUSwarmSpawner.service_labels``,
        e.g. the stack's name), so that the hub never touches another hub's servers. Without
        them the look for services nobody owns is off.
        """,
    )
    dashboard_dir = Unicode(
        "",
        config=True,
        help="Where the dashboard's events are written (``GPUSwarmSpawner.dashboard_dir``).",
    )

    _keeping: asyncio.Task | None = None

    async def check_routes(self, user_dict, service_dict, routes=None):
        """JupyterHub's check; its first call (at the hub's start) starts the keeper's loops."""
        await super().check_routes(user_dict, service_dict, routes)
        if self._keeping is None:
            self._users, self._services = user_dict, service_dict
            self._sightings = reconcile.Sightings()
            self._last_wanted: dict[str, str] = {}
            self._failing = ""
            self._keeping = asyncio.ensure_future(self._keep())

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self.orphan_check_interval
        while self.route_check_interval or self.orphan_check_interval:
            try:
                if self.route_check_interval:
                    await self.mend_routes()
                if self.orphan_check_interval and loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.orphan_check_interval
                    await self.sweep_services()
            except Exception as e:  # the proxy or the manager away: said once, tried again
                failing = f"{type(e).__name__}: {e}"
                if failing != self._failing:
                    self.log.warning("The hub's keeper could not check (%s); trying again", e)
                self._failing = failing
            else:
                if self._failing:
                    self.log.info("The hub's keeper checks again")
                self._failing = ""
            await asyncio.sleep(self.route_check_interval or self.orphan_check_interval)

    # ---- routes ----------------------------------------------------------------------------

    def wanted_routes(self) -> dict[str, str]:
        """{routespec: target} of the hub and every server and service that has a route."""
        wanted = {self.app.hub.routespec: self.hub.host}
        for user in self._users.values():
            for spawner in list(user.spawners.values()):
                if spawner.ready:
                    wanted[spawner.proxy_spec] = spawner.server.host
        for service in self._services.values():
            if service.server is not None:
                wanted[service.proxy_spec] = service.server.host
        return wanted

    async def mend_routes(self) -> None:
        """Put back the routes the proxy lacks, of servers that were running at the last
        check too (a server that just started has its route added by its spawn)."""
        wanted = self.wanted_routes()
        steady = {spec: t for spec, t in wanted.items() if self._last_wanted.get(spec) == t}
        self._last_wanted = wanted
        routes = await self.get_all_routes()
        mend = reconcile.routes_to_mend(routes, steady)
        if not mend:
            return
        await super().check_routes(self._users, self._services, routes)
        shown = ", ".join(mend[:5]) + (f" and {len(mend) - 5} more" if len(mend) > 5 else "")
        healing.record(
            self.log,
            self._journal(),
            "routes restored",
            f"the proxy lacked {len(mend)} route(s) of running servers (or they pointed "
            f"elsewhere); put back: {shown}",
            count=len(mend),
        )

    # ---- services nobody owns --------------------------------------------------------------

    def owned_services(self) -> set[str]:
        """The service names of every server the hub has running, starting or stopping."""
        owned = set()
        for user in list(self._users.values()):
            for name, orm_spawner in list(internals.server_rows(user).items()):
                spawner = user.spawners.get(name) if orm_spawner.server is None else None
                if orm_spawner.server is not None or (spawner is not None and spawner.pending):
                    owned.add(user.spawners[name].service_name)
        return owned

    async def sweep_services(self) -> None:
        """Remove the services of this hub's servers that no server owns, past the grace."""
        if not self.server_labels:
            return
        labels = [f"{k}={v}" for k, v in self.server_labels.items()] + [contract.USER_LABEL]
        services = await self._docker("services", filters={"label": labels})
        owned = self.owned_services()
        due = self._sightings.due(services, owned, time.monotonic(), self.orphan_grace)
        for orphan in due:
            self._sightings.removed(orphan.service_id)
            try:
                await self._docker("remove_service", orphan.service_id)
            except NotFound:  # removed meanwhile (its participant's new start clears it too)
                continue
            healing.record(
                self.log,
                self._journal(),
                "orphan removed",
                f"service {orphan.name} (id {orphan.service_id[:7]}) of {orphan.user} ran for "
                f"{orphan.seen_for:.0f} s with no server of the hub owning it; removed, its "
                "slices free",
                user=orphan.user,
            )

    _executor: ThreadPoolExecutor | None = None
    _client = None

    async def _docker(self, method: str, *args, **kwargs):
        """A call of the Docker API (the hub's engine: the manager's socket) on a thread of
        the keeper's own."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="keeper-docker")

        def call():
            if self._client is None:
                self._client = docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
            return getattr(self._client, method)(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _journal(self) -> events.Journal | None:
        return events.journal_for(self.dashboard_dir) if self.dashboard_dir else None


class FreshResolver(AbstractResolver):
    """Names looked up the way every other program here does (``getaddrinfo``, which asks
    Docker's DNS each time), for the hub's own HTTP client (``JupyterHubHTTPClient``).

    That client (aiohttp) looks names up with c-ares (aiodns) by default, whose cache keeps an
    answer for its TTL, and Docker's DNS answers with a TTL of 600 s. A proxy whose task Swarm
    restarted has a new address, but the hub went on calling the old one for up to ten
    minutes, and neither its routes nor the keeper's could reach it. Made in the hub's
    configuration, before the event loop runs, so aiohttp's ``ThreadedResolver`` (which takes
    the running loop when made) is made at the first lookup, and asked for each.
    """

    def __init__(self) -> None:
        self.threaded: ThreadedResolver | None = None

    async def resolve(self, host: str, port: int = 0, family=socket.AF_INET):
        if self.threaded is None:
            self.threaded = ThreadedResolver()
        return await self.threaded.resolve(host, port, family)

    async def close(self) -> None:
        if self.threaded is not None:
            await self.threaded.close()
