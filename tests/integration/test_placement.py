"""Placement on the multi-node bed (manager + 2 workers, 2 simulated GPUs x 3 slices each)."""

import asyncio
import copy
import time
from collections import Counter
from types import SimpleNamespace

import docker
import pytest

from gpu_swarm_spawner import NoGPUSliceAvailable

from .hub import container_env, container_of
from .spawners import inventory, make_spawner, remove_services, services_of, wait_slices_free

pytestmark = pytest.mark.integration


@pytest.fixture
def stack(hub, hub_settings):
    """The test stack's network exists; every service a test made is gone afterwards."""
    remove_services(hub.stack)
    wait_slices_free()  # servers of earlier tests may still be shutting down
    yield hub_settings
    remove_services(hub.stack)


def gpus_with_room(slices=1):
    return [g for g in inventory().values() if g.free >= slices]


async def start_all(spawners):
    return await asyncio.gather(*(s.start() for s in spawners))


def held(spawners):
    return [(s.holding.node, s.holding.gpu) for s in spawners]


def test_the_bed_has_several_nodes_with_several_gpus(stack):
    per_node = Counter(g.node_name for g in inventory().values())
    assert len(per_node) >= 3 and all(n >= 2 for n in per_node.values()), per_node
    assert all(g.slices == 3 for g in inventory().values())


async def test_spread_puts_the_first_users_on_distinct_gpus(stack):
    count = len(gpus_with_room())
    spawners = [make_spawner(f"ci-spread-{i}", stack) for i in range(count)]
    for spawner in spawners:  # participants arriving one after another
        await spawner.start()
    uuids = [s.holding.gpu for s in spawners]
    assert len(set(uuids)) == count, held(spawners)
    # what Swarm accounts matches what the spawner chose
    assert all(inventory()[u].used == 1 for u in uuids)


async def test_pack_fills_one_gpu_then_the_next_on_the_same_node(stack):
    spawners = [make_spawner(f"ci-pack-{i}", stack, placement_policy="pack") for i in range(4)]
    for spawner in spawners:  # one after the other: pack is about order
        await spawner.start()
    first, second = spawners[0].holding.gpu, spawners[3].holding.gpu
    assert [s.holding.gpu for s in spawners[:3]] == [first] * 3
    assert second != first
    assert spawners[3].holding.node == spawners[0].holding.node, held(spawners)


async def test_full_gpu_profile_gets_all_slices_of_one_gpu(stack):
    full = make_spawner("ci-full", stack, slices_per_server=3)
    await full.start()
    gpu = inventory()[full.holding.gpu]
    assert (gpu.used, gpu.free) == (3, 0)
    env = container_env(container_of(full.object_name))
    assert env["NVIDIA_VISIBLE_DEVICES"] == full.holding.gpu and env["GPU_SLICES"] == "3"


async def test_a_machine_updated_keeps_the_server_on_its_full_gpu(stack):
    """Swarm's constraint enforcer, at each update of a node (the manager's engine restarted,
    a machine reconnected, a label or its availability changed), rejected the task holding the
    last free unit of a GPU: a server on a full GPU was killed. With the spare unit every GPU
    is advertised with (contract.SWARM_SPARE), the server runs on, in the same task."""
    full = make_spawner("ci-full-kept", stack, slices_per_server=3)
    await full.start()
    client = docker.from_env()
    service = client.services.get(full.object_id)
    (running,) = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    node = client.nodes.get(running["NodeID"])
    spec = copy.deepcopy(node.attrs["Spec"])
    spec.setdefault("Labels", {})["ci-probe"] = "1"
    node.update(spec)  # as `docker node update --label-add ci-probe=1 <machine>`
    try:
        time.sleep(5)  # the enforcer acts within a second of the update
        tasks = {t["ID"]: t["Status"] for t in service.tasks()}
        assert list(tasks) == [running["ID"]], tasks
        assert tasks[running["ID"]]["State"] == "running", tasks
    finally:
        node.reload()
        spec = copy.deepcopy(node.attrs["Spec"])
        spec.get("Labels", {}).pop("ci-probe", None)
        node.update(spec)


def only_gpu(node: dict, uuid: str) -> dict:
    """``node`` as if it advertised the GPU ``uuid`` alone."""
    node = copy.deepcopy(node)
    resources = node["Description"]["Resources"]
    resources["GenericResources"] = [
        r for r in resources["GenericResources"] if r["DiscreteResourceSpec"]["Kind"] == uuid
    ]
    return node


async def test_a_lost_race_moves_on_to_another_gpu_and_leaves_nothing_pending(stack):
    # fill every GPU but one with full-GPU servers
    gpus = list(inventory().values())
    fillers = [
        make_spawner(f"ci-fill-{i}", stack, slices_per_server=3) for i in range(len(gpus) - 1)
    ]
    await start_all(fillers)
    (free_gpu,) = gpus_with_room()
    full_gpu = fillers[0].holding.gpu

    # a spawner whose first look at the swarm is stale: it sees a full GPU as empty, and asks
    # for all of it (Swarm keeps a spare unit on each GPU, contract.SWARM_SPARE: one slice
    # would fit beside the filler)
    late = make_spawner("ci-late", stack, slices_per_server=3)
    real_read = late._read_swarm
    reads = []

    async def stale_then_real():
        reads.append(1)
        nodes, tasks = await real_read()
        if len(reads) == 1:  # only the full GPU, without the tasks holding it: it looks empty
            tasks = [t for t in tasks if full_gpu not in str(t.get("Spec", {}))]
            nodes = [only_gpu(n, full_gpu) for n in nodes if full_gpu in str(n["Description"])]
        return nodes, tasks

    late._read_swarm = stale_then_real
    t0 = time.monotonic()
    await late.start()
    elapsed = time.monotonic() - t0
    assert late.holding.gpu == free_gpu.uuid
    assert elapsed < 5, f"recovering from a lost race took {elapsed:.1f} s"
    assert any("was taken" in e["message"] for e in late.attempt.progress)
    states = [t["Status"]["State"] for s in services_of(stack["GPUHUB_STACK"]) for t in s.tasks()]
    assert "pending" not in states


async def test_capacity_plus_one_is_refused_at_once_without_leftovers(stack):
    gpus = list(inventory().values())
    await start_all(
        [make_spawner(f"ci-cap-{i}", stack, slices_per_server=3) for i in range(len(gpus))]
    )
    assert gpus_with_room() == []
    before = {s.name for s in services_of(stack["GPUHUB_STACK"])}

    extra = make_spawner("ci-cap-extra", stack)
    t0 = time.monotonic()
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await extra.start()
    assert time.monotonic() - t0 < 2
    total = sum(g.slices for g in gpus)
    assert refused.value.jupyterhub_message.startswith(
        f"All GPU slices are in use ({total}/{total})"
    )
    assert {s.name for s in services_of(stack["GPUHUB_STACK"])} == before


async def test_per_user_cpu_and_memory_limits_reach_the_service(stack):
    def memory_for(spawner):  # callables are allowed, as in dockerspawner
        return "768M" if spawner.user.name.endswith("big") else "256M"

    spawner = make_spawner("ci-limits-big", stack, mem_limit=memory_for, cpu_limit=1.5)
    await spawner.start()
    client = docker.from_env()
    limits = client.services.get(spawner.object_name).attrs["Spec"]["TaskTemplate"]["Resources"]
    assert limits["Limits"] == {"MemoryBytes": 768 * 1024**2, "NanoCPUs": 1_500_000_000}


async def test_a_cpu_limit_above_the_machines_cores_is_held_to_them(stack):
    """Docker refuses a container whose CPU limit is above its machine's cores ("Range of CPUs
    is from 0.01 to N"): the server gets every core of its machine instead, and runs."""
    client = docker.from_env()
    spawner = make_spawner("ci-many-cores", stack, cpu_limit=64.0)
    await spawner.start()
    service = client.services.get(spawner.object_name)
    (running,) = service.tasks(filters={"desired-state": "running"})
    assert running["Status"]["State"] == "running"
    cores = client.nodes.get(running["NodeID"]).attrs["Description"]["Resources"]["NanoCPUs"]
    assert 0 < cores < 64 * 10**9
    assert service.attrs["Spec"]["TaskTemplate"]["Resources"]["Limits"]["NanoCPUs"] == cores


async def test_named_servers_get_their_own_service(stack):
    default = make_spawner("ci-named", stack)
    named = make_spawner(
        "ci-named", stack, orm_spawner=SimpleNamespace(name="gpu2", server=None, state=None)
    )
    await asyncio.gather(default.start(), named.start())
    assert (default.object_name, named.object_name) == ("jy-ci-2dnamed", "jy-ci-2dnamed--gpu2")
    names = {s.name for s in services_of(stack["GPUHUB_STACK"])}
    assert {"jy-ci-2dnamed", "jy-ci-2dnamed--gpu2"} <= names
