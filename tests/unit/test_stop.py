"""Stopping a server (``GPUSwarmSpawner.stop_object``): it is asked to shut itself down through
its own API, so its task completes and frees its slices before the service is removed (removed
while running, Swarm holds them for about 3 s more). A stand-in single-user server listens on
loopback and answers as the cases need; the swarm is the in-memory fake."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Server
from tornado import httpserver, netutil, web

from gpu_swarm_spawner import internals

from .clusters import node, task
from .fake_docker import make_fake
from .waiting import until


class Shutdown(web.RequestHandler):
    """``POST /user/<name>/api/shutdown`` as the server under test answers it (``how``):
    "ok" ends the task a moment later and answers 200, as jupyter_server does; "close" ends the
    task and drops the connection unanswered (its loop stopped first); "refuse" answers 403;
    "hang" answers 200 and never ends."""

    def initialize(self, stand_in):
        self.stand_in = stand_in

    async def post(self):
        stand_in = self.stand_in
        stand_in.requests.append(self.request.headers.get("Authorization", ""))
        if stand_in.how == "refuse":
            raise web.HTTPError(403)
        if stand_in.how in ("ok", "close"):
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, stand_in.end_task)
        if stand_in.how == "close":
            self.request.connection.close()
            return
        self.finish()


class StandIn:
    """A single-user server on loopback for ``spawner``'s running service."""

    def __init__(self, spawner, how: str):
        self.spawner, self.how = spawner, how
        self.requests: list[str] = []
        app = web.Application([(r"/user/[^/]+/api/shutdown", Shutdown, {"stand_in": self})])
        self.http = httpserver.HTTPServer(app)
        (self.socket,) = netutil.bind_sockets(0, "127.0.0.1")
        self.http.add_sockets([self.socket])
        self.port = self.socket.getsockname()[1]

    def end_task(self):
        for service in self.spawner.services.values():
            service["task"]["Status"]["State"] = "complete"

    def stop(self):
        self.http.stop()


async def running(how: str, **traits):
    """A started server (fake swarm) with a stand-in answering its shutdown request ``how``;
    every ``remove_service`` records the task states it found."""
    traits.setdefault("inventory_max_age", 0)
    spawner = make_fake("alice", api_token="the-servers-token", **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.start()
    stand_in = StandIn(spawner, how)
    spawner.server = Server(ip="127.0.0.1", port=stand_in.port, base_url="/user/alice/")
    spawner.states_at_removal = []
    fake_docker = spawner.docker

    async def docker(method, *args, **kwargs):
        if method == "remove_service":
            tasks = [s["task"]["Status"]["State"] for s in spawner.services.values()]
            spawner.states_at_removal.append(tasks)
        return await fake_docker(method, *args, **kwargs)

    spawner.docker = docker
    return spawner, stand_in


async def timed_stop(spawner) -> float:
    t0 = time.monotonic()
    await spawner.stop()
    return time.monotonic() - t0


async def test_a_stopped_server_shuts_itself_down_before_its_service_is_removed():
    spawner, stand_in = await running("ok")
    nudged = []
    spawner.broker.nudge = lambda: nudged.append(True)
    await timed_stop(spawner)
    assert stand_in.requests == ["token the-servers-token"]
    assert spawner.states_at_removal == [["complete"]]  # its slices were free already
    assert spawner.services == {} and nudged  # the line looked at once
    stand_in.stop()


async def test_a_server_that_drops_the_connection_as_it_stops_is_waited_for():
    """jupyter_server stops its loop inside the request: the answer may never come."""
    spawner, stand_in = await running("close")
    await timed_stop(spawner)
    assert spawner.states_at_removal == [["complete"]]
    stand_in.stop()


@pytest.mark.parametrize("how", ["refuse", "nothing listens"])
async def test_a_server_that_refuses_or_does_not_answer_is_removed_at_once(how, caplog):
    spawner, stand_in = await running(how, server_shutdown_timeout=30)
    if how == "nothing listens":
        stand_in.stop()
    with caplog.at_level(logging.WARNING):
        took = await timed_stop(spawner)
    assert spawner.states_at_removal == [["running"]] and spawner.services == {}
    assert took < 10, "it waited for a server that will not stop"
    expected = "refused to shut down (403" if how == "refuse" else "could not be asked"
    assert expected in caplog.text
    stand_in.stop()


async def test_a_server_that_does_not_end_is_removed_after_server_shutdown_timeout(caplog):
    spawner, stand_in = await running("hang", server_shutdown_timeout=0.5)
    with caplog.at_level(logging.WARNING):
        took = await timed_stop(spawner)
    assert 0.5 <= took < 5
    assert spawner.states_at_removal == [["running"]] and spawner.services == {}
    assert "did not shut down within 0.5 s (server_shutdown_timeout)" in caplog.text
    stand_in.stop()


async def test_server_shutdown_timeout_0_removes_the_service_at_once():
    spawner, stand_in = await running("ok", server_shutdown_timeout=0)
    await timed_stop(spawner)
    assert stand_in.requests == [] and spawner.states_at_removal == [["running"]]
    stand_in.stop()


async def test_after_a_hub_restart_a_short_lived_token_for_that_server_alone_is_made(
    monkeypatch,
):
    """JupyterHub keeps no server token over a restart (``api_token`` is empty then)."""
    spawner, stand_in = await running("ok")
    spawner.api_token = ""
    made, deleted = [], []
    spawner.user.new_api_token = lambda **kwargs: made.append(kwargs) or "short-lived"
    spawner.user.db = SimpleNamespace(delete=deleted.append, commit=lambda: None)
    tokens = {"short-lived": "the orm row"}
    monkeypatch.setattr(
        internals.orm.APIToken, "find", classmethod(lambda cls, db, t: tokens.get(t))
    )
    await timed_stop(spawner)
    assert stand_in.requests == ["token short-lived"]
    (kwargs,) = made
    assert kwargs["scopes"] == ["access:servers!server=alice/"]
    assert 0 < kwargs["expires_in"] <= 300
    assert deleted == ["the orm row"]
    assert spawner.states_at_removal == [["complete"]]
    stand_in.stop()


async def test_servers_are_restarted_by_swarm_only_when_they_fail():
    """A server that shut itself down must stay down (its slices free); a crash restarts."""
    spawner = make_fake("alice", inventory_max_age=0)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.start()
    (created,) = spawner.created
    assert created["task_template"]["RestartPolicy"] == {"Condition": "on-failure"}


async def test_a_stop_among_many_asks_the_server_to_shut_down_and_does_not_wait():
    among, stand_in = await running("ok")
    others = {f"other-{i}" for i in range(40)}  # 40 more servers stopping (10 per thread)
    among.broker.stopping.update(others)
    started = len(among.calls)
    await among.stop()
    assert among.broker.stopping == others  # its own entry is gone
    assert stand_in.requests == ["token the-servers-token"]  # asked all the same
    assert [name for name, _, _ in among.calls[started:]] == ["remove_service"]  # no looks
    assert among.states_at_removal == [["running"]] and among.services == {}
    stand_in.stop()


async def test_a_stop_moves_the_waiting_line_at_once():
    """The stop tells the hub's GPU broker (``broker.nudge``): the participant waiting for the
    slices it frees starts now, not at the line's next look (``line_interval``: 60 s here).
    With ``server_shutdown_timeout = 0`` the stop's own word is the only one the broker gets."""
    alice, stand_in = await running("ok", server_shutdown_timeout=0, line_interval=60)
    bob = make_fake("bob", inventory_max_age=0, waiting_line="auto")
    assert bob.broker is alice.broker  # one broker per hub
    bob.nodes = alice.nodes
    # the swarm as bob's reads see it: alice's server holds all 3 slices until it is removed
    bob.tasks = [task("n1", {"GPU-a0": 3}, service_id=alice.object_id)]
    remove = alice.docker

    async def docker(method, *args, **kwargs):
        if method == "remove_service":
            bob.tasks = []
        return await remove(method, *args, **kwargs)

    alice.docker = docker
    waiting = asyncio.ensure_future(bob.start())
    await until(lambda: bob.broker.waiting())
    await alice.stop()
    await asyncio.wait_for(waiting, 3)  # the line's next look would be 60 s away
    assert bob.holding.gpu == "GPU-a0" and len(bob.created) == 1
    stand_in.stop()
