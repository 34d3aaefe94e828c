"""After the start: a server's health (poll's verdict, a server Swarm moved, the hub's restart)
and its shutdown.

Pure functions over what was seen (``judge``, ``moved``, ``held_by_service``), the looks at
Docker given the call to make them with (``look``, ``settled``), and one small object for the
stop (``Shutdown``): GPUSwarmSpawner (spawner.py) calls them from JupyterHub's hooks (``poll``,
``get_url``, ``stop_object``) with explicit arguments, so nothing here reads the spawner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from docker.errors import NotFound
from jupyterhub.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from . import (
    contract,
    reconcile,
    tasks,
)
from .holding import Holding
from .reconcile import Health

if TYPE_CHECKING:
    from .broker import Docker, GPUBroker

#: While a server shuts itself down: how long its shutdown request may take, and how often its
#: task is looked at (stop_object).
SHUTDOWN_REQUEST_S = 5.0
SHUTDOWN_POLL_S = 0.1


def node_state(node: dict) -> str:
    """A node's state word ("ready", "down", ...; "unknown" when it reports none)."""
    return (node.get("Status") or {}).get("State") or "unknown"


# ---- poll's verdict and recovery ---------------------------------------------------------------


async def look(docker: Docker, service: str, network: str) -> tuple[reconcile.Verdict, dict]:
    """A server's own calls: its service (``service``: its id, else its name: a hub killed
    during the spawn may not have saved the id), all its tasks, the node of the newest.
    Returns the verdict and the service ({} when it is gone)."""
    try:
        found = await docker("inspect_service", service)
    except NotFound:
        return reconcile.Verdict(Health.GONE, "its service is gone"), {}
    service_tasks = await docker("tasks", filters={"service": found["ID"]})
    node_id = (tasks.newest(service_tasks) or {}).get("NodeID") or ""
    states = {}
    if node_id:
        try:
            states[node_id] = node_state(await docker("inspect_node", node_id))
        except NotFound:
            states[node_id] = "gone"
    return reconcile.verdict(service_tasks, states, network), found


@dataclass(frozen=True)
class Judgement:
    """``poll``'s answer for one look (None: running; else why it stopped), when the server was
    first found away since (``away_since``, time.monotonic; None: it is not away), and what the
    hub put right to say so (``healed``: (action, message) pairs, ``healing.py``)."""

    answer: str | None
    away_since: float | None
    healed: tuple[tuple[str, str], ...] = ()


def judge(
    seen: reconcile.Verdict,
    now: float,
    away_since: float | None,
    starting: bool,
    lost_after: float,
    name: str,
) -> Judgement:
    """``poll``'s answer for what was ``seen`` ``now`` (time.monotonic) of the server ``name``,
    away since ``away_since``: a server away (Swarm bringing it back) counts as running for
    ``lost_after`` seconds; one still ``starting`` is left to its start."""
    if seen.health is Health.RUNNING:
        if away_since is None:
            return Judgement(None, None)
        back = f"{name} answers again after {now - away_since:.0f} s away"
        return Judgement(None, None, (("back", back),))
    if seen.health is Health.GONE:
        return Judgement(seen.reason, away_since)
    if starting:
        return Judgement(None, away_since)  # still starting: its start decides, not the grace
    healed = ()
    if away_since is None:
        away_since = now
        kept = (
            f"{name} is away ({seen.reason}); kept as running for up to "
            f"{lost_after:.0f} s while Swarm brings it back"
        )
        healed = (("kept", kept),)
    away = now - away_since
    if away < lost_after:
        return Judgement(None, away_since, healed)
    lost = (
        f"{name} was away for {away:.0f} s ({seen.reason}): "
        "reported stopped, so its participant can start again"
    )
    return Judgement(f"{seen.reason}, for {away:.0f} s", away_since, (*healed, ("lost", lost)))


def moved(address: str, recorded: str, service_name: str, by_address: bool) -> bool:
    """Whether the hub's record of a server (``recorded``: the address it connects to) must
    follow it to ``address``, where Swarm's new container for it runs (its engine or machine
    restarted): only when the hub connects by address (``by_address``)."""
    return bool(address and by_address) and recorded not in (address, service_name)


async def settled(
    look_now: Callable[[], Awaitable[tuple[reconcile.Verdict, dict]]], wait: float
) -> tuple[reconcile.Verdict, dict]:
    """``look_now()``'s answer once the server is no longer recovering, looking every second
    for up to ``wait`` seconds (then the last answer)."""
    deadline = time.monotonic() + wait
    while True:
        seen, service = await look_now()
        if seen.health is not Health.RECOVERING or time.monotonic() >= deadline:
            return seen, service
        await asyncio.sleep(1.0)


def held_by_service(service: dict) -> Holding | None:
    """What a server's service holds (its GPU and slices), read from its labels
    (``contract.py``); None when it holds no GPU."""
    labels = (service.get("Spec") or {}).get("Labels") or {}
    uuid = labels.get(contract.GPU_LABEL) or ""
    if not uuid:
        return None
    return Holding(gpu=uuid, slices=int(labels.get(contract.SLICES_LABEL) or 0))


# ---- the stop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shutdown:
    """A running server asked to shut itself down before its service is removed, so that its
    slices are free once it has (``GPUSwarmSpawner.stop_object`` says why and makes this with
    what the server is: its service, where it answers, its token, its owner).

    ``token`` is the server's own token ("" after a hub restart: a short-lived one with access
    to this server alone is made through ``user`` and deleted with ``delete_token``);
    ``timeout`` bounds the whole."""

    docker: Docker
    broker: GPUBroker
    service_id: str
    url: str
    token: str
    user: Any
    server_name: str
    delete_token: Callable[[str], None]
    timeout: float
    log: logging.Logger
    log_name: str

    async def run(self) -> None:
        """While more servers stop than the hub has threads for Docker calls (the end of a
        workshop), the server is asked and not waited for: the looks at their tasks would
        crowd out the calls that remove the services."""
        stopping = self.broker.stopping
        stopping.add(self.service_id)
        try:
            if len(stopping) > self.broker.threads:
                await self.ask()
            else:
                await self.wait()
        finally:
            stopping.discard(self.service_id)

    async def wait(self) -> None:
        """Ask the server to shut down, and wait until its task has ended (or the timeout)."""
        running = {t["ID"] for t in await self.service_tasks() if tasks.is_running(t)}
        if not running:
            return
        t0 = time.monotonic()
        if not await self.ask():
            return
        deadline = t0 + self.timeout
        # the running task only: a service made before the restart policy was on-failure gets
        # a replacement task, which the removal then ends before it starts
        while any(t["ID"] in running and tasks.is_live(t) for t in await self.service_tasks()):
            if time.monotonic() > deadline:
                self.log.warning(
                    "%s did not shut down within %s s (server_shutdown_timeout); removing its "
                    "service",
                    self.log_name,
                    self.timeout,
                )
                return
            await asyncio.sleep(SHUTDOWN_POLL_S)
        self.log.info("%s shut down in %.1f s", self.log_name, time.monotonic() - t0)
        self.broker.nudge()  # its slices are free now, before the service is even removed

    async def service_tasks(self) -> list[dict]:
        return await self.docker("tasks", filters={"service": self.service_id})

    async def ask(self) -> bool:
        """POST the server's ``/api/shutdown``; False when it refused or cannot be reached.

        The server's own token may do this (its scopes include access to itself). After a hub
        restart JupyterHub no longer has that token, so a short-lived one with only that
        scope is made, and deleted afterwards.
        """
        token, made = self.token, None
        if not token:
            scope = f"access:servers!server={self.user.name}/{self.server_name}"
            token = made = self.user.new_api_token(
                scopes=[scope], expires_in=120, note="gpu-jupyterhub: stopping the server"
            )
        request = HTTPRequest(
            url_path_join(self.url, "api/shutdown"),
            method="POST",
            body=b"",
            headers={"Authorization": f"token {token}"},
            request_timeout=min(self.timeout, SHUTDOWN_REQUEST_S),
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
                self.delete_token(made)
        return True
