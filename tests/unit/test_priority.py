"""The hub and the proxy first on their machine's CPU (gpu_swarm_spawner/priority.py)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from jupyterhub.app import JupyterHub
from traitlets.config import Config, Configurable

from gpu_swarm_spawner import contract, priority
from gpu_swarm_spawner.contract import DOCKER_SERVICE_LABEL, DOCKER_STACK_LABEL
from gpu_swarm_spawner.priority import CPUPriority


class Engine:
    """The containers one Docker engine runs, as its API lists, inspects and updates them."""

    def __init__(self):
        self.running: dict[str, dict] = {}
        self.updates: list[tuple[str, int]] = []
        self.fail = ""

    def run(self, cid: str, stack: str, service: str, shares: int = 0) -> None:
        labels = {DOCKER_STACK_LABEL: stack, DOCKER_SERVICE_LABEL: f"{stack}_{service}"}
        if service.startswith("jy-"):  # a server: a service of the hub's, not of the stack
            labels = {DOCKER_SERVICE_LABEL: service, contract.STACK_LABEL: stack}
        self.running[cid] = {"Labels": labels, "CpuShares": shares}

    def containers(self, filters):
        if self.fail:
            raise RuntimeError(self.fail)
        key, _, value = filters["label"].partition("=")
        return [
            {"Id": cid, "Labels": dict(c["Labels"])}
            for cid, c in self.running.items()
            if c["Labels"].get(key) == value
        ]

    def inspect_container(self, cid):
        return {"Id": cid, "HostConfig": {"CpuShares": self.running[cid]["CpuShares"]}}

    def update_container(self, cid, cpu_shares):
        self.updates.append((cid, cpu_shares))
        self.running[cid]["CpuShares"] = cpu_shares


@pytest.fixture
def engine():
    e = Engine()
    e.run("h1", "gpuhub", "hub")
    e.run("p1", "gpuhub", "proxy")
    e.run("d1", "gpuhub", "prometheus")
    e.run("s1", "gpuhub", "jy-alice")
    e.run("o1", "other", "hub")  # another stack's hub on the same engine
    return e


def keeper(engine, **traits) -> CPUPriority:
    return CPUPriority(client_factory=lambda: engine, **traits)


def test_the_hub_and_the_proxy_of_its_stack_are_raised_and_nothing_else(engine):
    changed = keeper(engine, stack="gpuhub", cpu_shares=16384).raise_once()

    assert sorted(changed) == ["gpuhub_hub", "gpuhub_proxy"]
    assert sorted(engine.updates) == [("h1", 16384), ("p1", 16384)]
    for other in ("d1", "s1", "o1"):
        assert engine.running[other]["CpuShares"] == 0


def test_a_second_look_changes_nothing(engine):
    k = keeper(engine, stack="gpuhub")
    k.raise_once()
    engine.updates.clear()

    assert k.raise_once() == []
    assert engine.updates == []


def test_a_restarted_proxy_is_raised_at_the_next_look(engine):
    k = keeper(engine, stack="gpuhub", cpu_shares=8192)
    k.raise_once()
    del engine.running["p1"]
    engine.run("p2", "gpuhub", "proxy")  # Swarm's new task: Docker's default weight

    assert k.raise_once() == ["gpuhub_proxy"]
    assert engine.running["p2"]["CpuShares"] == 8192


@pytest.mark.parametrize(
    "current, wanted, needed",
    [(0, 16384, True), (1024, 16384, True), (16384, 16384, False), (0, 1024, False)],
)
def test_docker_default_weight_is_1024(current, wanted, needed):
    assert priority.needs_shares({"HostConfig": {"CpuShares": current}}, wanted) is needed


def test_an_engine_error_is_logged_once_with_the_fix_then_again_after_a_success(engine, caplog):
    k = keeper(engine, stack="gpuhub")
    engine.fail = "permission denied on /var/run/docker.sock"
    with caplog.at_level(logging.INFO):
        asyncio.run(k.check())
        asyncio.run(k.check())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "permission denied" in warnings[0] and "GPUHUB_HUB_CPU_SHARES=0" in warnings[0]

    engine.fail = ""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        asyncio.run(k.check())
    assert any("gpuhub_hub's container: 16384 shares" in r.getMessage() for r in caplog.records)
    engine.fail = "permission denied on /var/run/docker.sock"
    with caplog.at_level(logging.INFO):
        asyncio.run(k.check())
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


@pytest.mark.parametrize("shares, raised", [(16384, True), (0, False)])
def test_install_starts_the_keeper_once_the_hub_started(engine, monkeypatch, shares, raised):
    started = []

    async def start(hub):
        started.append(hub)

    monkeypatch.setattr(JupyterHub, "start", start)
    monkeypatch.setattr(priority, "_docker_client", lambda: engine)
    CPUPriority.install()
    CPUPriority.install()  # idempotent: wrapped once
    tuned = []  # the test process's garbage collector stays as it is (tune_gc: below)
    monkeypatch.setattr(CPUPriority, "tune_gc", lambda keeper: tuned.append(keeper.gc_threshold))
    traits = {"cpu_shares": shares, "stack": "gpuhub", "gc_threshold": 1234}
    hub = Configurable(config=Config({"CPUPriority": traits}))

    async def run():
        await JupyterHub.start(hub)
        for _ in range(50):
            if engine.updates:
                break
            await asyncio.sleep(0.01)
        task = getattr(hub, "gpuhub_priority", None)
        if task:
            task.cancel()
        return task

    task = asyncio.run(run())
    assert started == [hub] and tuned == [1234]
    assert (task is not None) is raised
    assert sorted(engine.updates) == ([("h1", shares), ("p1", shares)] if raised else [])


@pytest.fixture
def python_gc():
    """The test process's garbage collector as it was, afterwards."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_the_garbage_collector_waits_longer_and_skips_what_the_hub_made_at_start(python_gc):
    gc.unfreeze()
    CPUPriority(gc_threshold=50_000).tune_gc()
    assert gc.get_threshold()[0] == 50_000
    assert gc.get_freeze_count() > 1000  # the modules and classes loaded so far


def test_gc_threshold_0_leaves_python_s_collector_alone(python_gc):
    gc.unfreeze()
    before = gc.get_threshold()
    CPUPriority(gc_threshold=0).tune_gc()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
