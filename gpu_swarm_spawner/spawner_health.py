"""After the start: a server's health (poll's verdicts, a server Swarm moved, the hub's restart)
and its shutdown. Part of GPUSwarmSpawner (spawner.py).
"""

from __future__ import annotations

import asyncio
import time

from docker.errors import NotFound
from jupyterhub.utils import url_path_join
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import HasTraits

from . import (
    contract,
    healing,
    reconcile,
    tasks,
)
from .holding import Holding
from .reconcile import Health

#: While a server shuts itself down: how long its shutdown request may take, and how often its
#: task is looked at (stop_object).
SHUTDOWN_REQUEST_S = 5.0
SHUTDOWN_POLL_S = 0.1


def node_state(node: dict) -> str:
    """A node's state word ("ready", "down", ...; "unknown" when it reports none)."""
    return (node.get("Status") or {}).get("State") or "unknown"


class ServerHealth(HasTraits):
    """GPUSwarmSpawner after the start: health, recovery, shutdown."""

    # ---- poll's verdicts and recovery --------------------------------------------------------

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
                states[node_id] = node_state(await self.docker("inspect_node", node_id))
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
        if self.holding.gpu or not uuid:
            return
        self.holding = Holding(gpu=uuid, slices=int(labels.get(contract.SLICES_LABEL) or 0))
        self.log.info(
            "%s: its service holds %d slice(s) of %s; taken back into the hub's state",
            self.log_name,
            self.holding.slices,
            uuid,
        )
        self._save_state()

    def _healed(self, action: str, message: str) -> None:
        healing.record(self.log, self._journal(), action, message, self.user.name, self.name)

    # ---- the stop ----------------------------------------------------------------------------

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
