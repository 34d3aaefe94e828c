"""Fixtures for every unit test."""

import sys

import pytest


@pytest.fixture(autouse=True)
def fresh_spawner_class_state(monkeypatch):
    """Each test starts without the state GPUSwarmSpawner shares among a hub's spawners on the
    class (slice claims, the shared read of the swarm, the Docker thread pool), so no test's
    result depends on which tests ran before it. A session that has not imported the spawner
    has none to reset (and the pure modules' tests stay free of its imports)."""
    module = sys.modules.get("gpu_swarm_spawner.spawner")
    if module is None:
        yield
        return
    cls = module.GPUSwarmSpawner
    monkeypatch.setattr(cls, "_claims", {})
    monkeypatch.setattr(cls, "_swarm_read", None)
    monkeypatch.setattr(cls, "_gpu_executor", None)
    yield
    if cls._gpu_executor is not None:
        cls._gpu_executor.shutdown(wait=False)
