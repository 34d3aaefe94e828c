"""A start that fails leaves nothing behind: no service (Swarm would retry it and hold its
slices, and JupyterHub does not stop a server whose start failed), no claim, no GPU in the
state. Driven through ``start()`` against the fake Docker client; the assertions are on the
calls the spawner made and on the services left."""

import asyncio

import pytest

from gpu_swarm_spawner import NoGPUSliceAvailable

from .clusters import node
from .fake_docker import RUNNING, UNPLACEABLE, make_fake


def reserved_gpu(created: dict) -> str:
    """The GPU kind a created service reserves."""
    generic = created["task_template"]["Resources"]["Reservations"]["GenericResources"]
    (kind,) = [e["DiscreteResourceSpec"]["Kind"] for e in generic if "DiscreteResourceSpec" in e]
    return kind


def assert_nothing_left(spawner):
    assert spawner.services == {}, "a service of the failed start is left"
    assert spawner.broker.claimed() == {}, "a claim of the failed start is left"
    assert (spawner.holding.gpu, spawner.holding.slices, spawner.object_id) == ("", 0, "")


async def test_a_lost_race_removes_its_service_and_tries_the_next_gpu():
    spawner = make_fake(inventory_max_age=0)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3, "GPU-a1": 3})]
    spawner.task_states = [UNPLACEABLE, RUNNING]  # another server took the first slice

    await asyncio.wait_for(spawner.start(), timeout=5)

    first, second = (reserved_gpu(c) for c in spawner.created)
    assert first != second
    assert spawner.called("remove_service") == [("svc1",)]
    # removed as soon as the race was lost, before the next GPU was chosen
    methods = [method for method, _, _ in spawner.calls]
    assert methods.index("remove_service") < methods.index("nodes", methods.index("tasks"))
    assert list(spawner.services) == ["svc2"]  # only the server that runs
    assert (spawner.object_id, spawner.holding.gpu) == ("svc2", second)
    assert spawner.broker.claimed() == {}
    assert any("was taken a moment ago" in e["message"] for e in spawner.attempt.progress)


async def test_a_lost_race_for_the_last_free_slice_removes_its_service_and_refuses():
    spawner = make_fake(inventory_max_age=0)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.task_states = [UNPLACEABLE]

    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(spawner.start(), timeout=5)

    assert refused.value.jupyterhub_message.startswith("All GPU slices are in use")
    assert spawner.called("remove_service") == [("svc1",)]
    assert_nothing_left(spawner)


FAILURES = {
    "task failed": (
        [{"State": "failed", "Err": "starting container failed: OCI runtime create failed"}],
        {},
        "did not start: task failed",
    ),
    "no image": (
        [{"State": "rejected", "Err": "No such image: gpu-jupyterhub/singleuser:latest"}],
        {},
        "cannot get the server image",
    ),
    "start timeout": ([{"State": "preparing"}], {"start_timeout": 0}, "still preparing after"),
}


@pytest.mark.parametrize("failure", FAILURES)
async def test_any_other_failure_during_start_removes_the_service(failure):
    states, traits, message = FAILURES[failure]
    spawner = make_fake(inventory_max_age=0, **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3, "GPU-a1": 3})]
    spawner.task_states = states

    with pytest.raises(Exception, match=message):
        await asyncio.wait_for(spawner.start(), timeout=5)

    assert len(spawner.created) == 1, "no other GPU is tried after a failure that is no race"
    assert spawner.called("remove_service") == [("svc1",)]
    assert_nothing_left(spawner)


async def test_it_gives_up_after_placement_attempts_with_a_clear_message():
    spawner = make_fake(inventory_max_age=0, placement_attempts=2)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3, "GPU-a1": 3, "GPU-a2": 3})]
    spawner.task_states = [UNPLACEABLE] * 3  # every slice chosen is taken first

    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(spawner.start(), timeout=5)

    assert refused.value.jupyterhub_message.startswith("Many servers are starting at this moment")
    assert "gave up after 2 lost slice races" in str(refused.value)
    assert len(spawner.created) == 2
    assert len({reserved_gpu(c) for c in spawner.created}) == 2, "each attempt another GPU"
    assert spawner.called("remove_service") == [("svc1",), ("svc2",)]
    assert_nothing_left(spawner)
