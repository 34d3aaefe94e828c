"""Polling running servers (``GPUSwarmSpawner.poll``): a recent read of the swarm shared by all
servers answers "running" without Docker calls of each server's own; anything else is checked
with the server's own calls. Against the fake swarm of tests/unit/fake_docker.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gpu_swarm_spawner import spawner_health
from gpu_swarm_spawner.holding import Holding
from gpu_swarm_spawner.reconcile import Health, Verdict

from .clusters import node
from .fake_docker import make_fake

OWN_CALLS = ("inspect_service", "inspect_node")


async def running_server(**kwargs):
    """A spawner whose server's service runs on node n1 (ready), as after its start."""
    spawner = make_fake(**kwargs)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.holding = Holding(gpu="GPU-a0", slices=1)
    spawner.object_id = (await spawner.create_object())["ID"]
    spawner.server = SimpleNamespace(ip=spawner.task_address)
    spawner.calls.clear()
    return spawner


def own_calls(spawner) -> list:
    """Calls about this server alone: its service, its node, its tasks by service."""
    return [
        (name, args, kwargs)
        for name, args, kwargs in spawner.calls
        if name in OWN_CALLS or (name == "tasks" and (kwargs.get("filters") or {}).get("service"))
    ]


async def test_running_servers_are_polled_from_one_shared_read():
    spawner = await running_server()
    for _ in range(5):
        assert await spawner.poll() is None
    assert own_calls(spawner) == []
    assert len(spawner.called("tasks")) == 1 and len(spawner.called("nodes")) == 1


async def test_without_the_shared_read_each_poll_makes_its_own_calls():
    spawner = await running_server(poll_read_max_age=0)
    for _ in range(3):
        assert await spawner.poll() is None
    assert len(own_calls(spawner)) >= 3 * 2  # its service, its tasks, its node: every time
    assert spawner.called("nodes") == []


async def test_a_read_without_the_server_is_not_taken_for_its_answer():
    """A read from before the service existed does not list its task: the server's own calls
    answer, not "stopped"."""
    spawner = await running_server()
    (service_id,) = spawner.services
    service = spawner.services.pop(service_id)
    await spawner.broker.read_swarm(spawner._read_swarm)
    spawner.services[service_id] = service
    spawner.calls.clear()
    assert await spawner.poll() is None
    assert [name for name, _, _ in own_calls(spawner)][:1] == ["inspect_service"]


async def test_a_server_whose_task_ended_is_checked_with_its_own_calls():
    spawner = await running_server(poll_read_max_age=0.05)
    assert await spawner.poll() is None
    (service,) = spawner.services.values()
    service["task"]["Status"] = {"State": "complete", "Message": "finished"}
    service["task"]["DesiredState"] = "shutdown"  # it shut itself down: Swarm lets it be
    await asyncio.sleep(0.1)  # the shared read is too old now
    assert await spawner.poll() == "task complete: finished"
    assert [name for name, _, _ in own_calls(spawner)][:1] == ["inspect_service"]


async def test_a_task_swarm_replaces_is_not_a_stopped_server_until_it_has_been_away_too_long():
    """The event day's fault: the manager's engine restarted, Swarm replaced every server's
    container, and the hub took 5 of 7 for stopped while it did (they went on holding their
    slices, and their participants were refused for them)."""
    spawner = await running_server(poll_read_max_age=0, server_lost_after=0.3)
    (service,) = spawner.services.values()
    service["task"]["Status"] = {"State": "failed", "Err": "task: non-zero exit (137)"}
    assert await spawner.poll() is None  # Swarm still wants it: its replacement comes next
    service["task"]["Status"] = {"State": "starting"}  # the replacement
    assert await spawner.poll() is None
    await asyncio.sleep(0.35)
    status = await spawner.poll()
    assert status.startswith("Swarm is restarting it (task starting)"), status
    assert status.endswith("for 0 s")


async def test_a_server_back_within_the_grace_goes_on_and_its_record_follows_its_address():
    spawner = await running_server(poll_read_max_age=0)
    (service,) = spawner.services.values()
    service["task"]["Status"] = {"State": "preparing"}
    assert await spawner.poll() is None
    service["task"]["Status"] = {"State": "running"}
    service["task"]["NetworksAttachments"][0]["Addresses"] = ["10.0.8.77/24"]
    assert await spawner.poll() is None
    assert spawner.server.ip == "10.0.8.77" and spawner.task_ip == "10.0.8.77"
    assert spawner._away_since is None  # a later absence gets the whole grace again


async def test_a_server_on_a_node_that_is_down_or_gone_is_checked_with_its_own_calls():
    for nodes, expected in (
        ([node("n1", "alpha", {"GPU-a0": 3}, state="down")], "its machine is down, for 0 s"),
        ([], None),  # gone from the read: its own inspect_node is asked (the fake still has it)
    ):
        spawner = await running_server(server_lost_after=0)
        listed = spawner.nodes
        spawner.nodes = nodes
        await spawner.broker.read_swarm(spawner._read_swarm)
        spawner.nodes = nodes or listed
        assert await spawner.poll() == expected
        assert "inspect_node" in [name for name, _, _ in own_calls(spawner)]


async def test_a_server_on_a_machine_that_is_down_is_kept_for_the_grace():
    """A GPU machine cut off from the manager for a moment (or its engine restarting) is not
    the end of its servers; one gone for good is, after ``server_lost_after``."""
    spawner = await running_server(poll_read_max_age=0, server_lost_after=0.3)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}, state="down")]
    assert await spawner.poll() is None
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    assert await spawner.poll() is None  # back
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}, state="down")]
    assert await spawner.poll() is None  # away again: the grace starts afresh
    await asyncio.sleep(0.35)
    assert await spawner.poll() == "its machine is down, for 0 s"


async def test_a_stopped_server_makes_no_shared_read():
    spawner = await running_server()
    spawner.object_id = ""  # stopped: the hub may still poll it
    spawner.services.clear()
    assert await spawner.poll() == "its service is gone"
    assert spawner.called("nodes") == []


async def test_a_refused_spawn_is_polled_without_docker_calls():
    """JupyterHub polls a spawn that failed before it answers the participant: for a refusal
    that poll must not wait behind the Docker calls of the servers that did fit."""
    import pytest

    from gpu_swarm_spawner.spawner import NoGPUSliceAvailable

    from .clusters import task

    spawner = make_fake(inventory_max_age=0)  # the second start reads the swarm afresh
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 1})]
    spawner.tasks = [task("n1", {"GPU-a0": 1})]  # its one slice is taken
    with pytest.raises(NoGPUSliceAvailable):
        await spawner.start()
    spawner.calls.clear()
    assert await spawner.poll() == 0
    assert spawner.calls == []
    # the next start is a new spawn: a service it makes is polled as any other
    spawner.tasks = []
    await spawner.start()
    assert await spawner.poll() is None


async def test_a_node_that_reports_no_state_is_not_taken_for_ready():
    spawner = await running_server(poll_read_max_age=0, server_lost_after=0)
    spawner.nodes = [{"ID": "n1", "Description": {"Hostname": "alpha"}}]
    assert await spawner.poll() == "its machine is unknown, for 0 s"


def test_the_verdict_keeps_an_away_server_for_the_grace_then_calls_it_stopped():
    """``spawner_health.judge`` on plain values: no spawner, no swarm."""
    away = Verdict(Health.RECOVERING, "its machine is down")

    def judge(now, since, starting=False):
        judged = spawner_health.judge(away, now, since, starting, 60.0, "alice")
        return judged.answer, judged.away_since, [action for action, _ in judged.healed]

    assert judge(100.0, None) == (None, 100.0, ["kept"])  # first seen away: the grace begins
    assert judge(159.0, 100.0) == (None, 100.0, [])
    assert judge(160.0, 100.0) == ("its machine is down, for 60 s", 100.0, ["lost"])
    assert judge(100.0, None, starting=True) == (None, None, [])  # its start decides
    back = spawner_health.judge(Verdict(Health.RUNNING), 130.0, 100.0, False, 60.0, "alice")
    assert (back.answer, back.away_since) == (None, None)
    assert back.healed == (("back", "alice answers again after 30 s away"),)
    gone = spawner_health.judge(
        Verdict(Health.GONE, "its service is gone"), 1.0, None, True, 60, "a"
    )
    assert gone.answer == "its service is gone"


def test_the_hubs_record_follows_a_moved_server_only_when_it_connects_by_address():
    assert spawner_health.moved("10.0.8.77", "10.0.8.5", "jupyter-alice", by_address=True)
    assert not spawner_health.moved("10.0.8.77", "10.0.8.5", "jupyter-alice", by_address=False)
    assert not spawner_health.moved("10.0.8.77", "10.0.8.77", "jupyter-alice", by_address=True)
    assert not spawner_health.moved("10.0.8.77", "jupyter-alice", "jupyter-alice", True)
    assert not spawner_health.moved("", "10.0.8.5", "jupyter-alice", by_address=True)
