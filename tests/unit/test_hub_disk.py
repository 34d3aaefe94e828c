"""The hub's data volume full: every start is refused with a message that says so, before
JupyterHub writes anything for it (the participant read "500: Unhandled error" and the
database refused every write)."""

from __future__ import annotations

import pytest

from gpu_swarm_spawner.spawner import SpawnFailed

from .clusters import node
from .fake_docker import make_fake


def spawner_on(tmp_path, min_free_mb):
    spawner = make_fake(hub_data_dir=str(tmp_path), hub_data_min_free_mb=min_free_mb)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    return spawner


async def test_a_full_hub_disk_refuses_every_start_with_what_to_do(tmp_path):
    spawner = spawner_on(tmp_path, min_free_mb=2**40)  # more than any disk has
    refusal = await spawner.refusal_before_spawn({})
    assert isinstance(refusal, SpawnFailed) and refusal.status_code == 503
    assert refusal.jupyterhub_message.startswith("The hub's disk is full")
    assert str(tmp_path) in refusal.log_message and "MiB free" in refusal.log_message
    with pytest.raises(SpawnFailed) as raised:
        await spawner.start()
    assert raised.value.jupyterhub_message == refusal.jupyterhub_message
    assert spawner.called("create_service") == []  # nothing was made


async def test_with_room_on_the_hub_disk_or_nothing_to_check_starts_go_on(tmp_path):
    assert await spawner_on(tmp_path, min_free_mb=0).refusal_before_spawn({}) is None
    unchecked = make_fake()
    unchecked.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    assert unchecked.hub_disk_refusal() is None
    await unchecked.start()
    assert unchecked.called("create_service")
