"""MIG on the bed: a fresh machine whose (fake, explicitly selected) NVML reports a mixed
machine joins with the line `make join-command` prints; its MIG instances become slices of
their own, and a server placed on one sees exactly that instance.

tests/fixtures/nvml/mixed-mig.json: GPU 0 whole (MIG off), GPU 1 in MIG mode with two
3g.40gb instances (slot 1 empty), GPU 2 in MIG mode with none created.
"""

from __future__ import annotations

import copy
import shlex

import docker
import pytest

from gpu_swarm_spawner.contract import MIG_PREFIX
from gpu_swarm_spawner.inventory import build_inventory
from tests.fakes.nvml import shim_words

from .hub import BED_MANAGER, container_of
from .spawners import make_spawner, remove_services
from .test_worker_setup import bed

pytestmark = pytest.mark.integration

MACHINE = "fresh2"
FIXTURE = "tests/fixtures/nvml/mixed-mig.json"  # in the machine's copy of the repository
WHOLE = "GPU-4d8e2b6a-9c1f-4a3e-b7d5-000000000000"
INSTANCES = ["MIG-8b2c5e1f-6a4d-4b9c-a3e7-000000000000", "MIG-8b2c5e1f-6a4d-4b9c-a3e7-000000000002"]


def machine_gpus() -> dict:
    client = docker.from_env()
    gpus = build_inventory(client.api.nodes(), client.api.tasks())
    return {g.uuid: g for g in gpus if g.node_name == MACHINE}


@pytest.fixture(scope="module")
def joined(hub):
    """fresh2 joined with the printed line, the image file and the mixed MIG fixture."""
    bed("fresh", MACHINE)
    try:
        tar = bed("image-tar", MACHINE).stdout.strip().splitlines()[-1]
        token = docker.from_env().swarm.attrs["JoinTokens"]["Worker"]
        line = ["./worker_setup/setup.sh", "--manager", f"{BED_MANAGER}:2377", "--token", token]
        line += ["--image-tar", tar]
        yield bed("on", MACHINE, f"{shim_words(FIXTURE)} {shlex.join(line)}", check=False)
    finally:
        remove_services(hub.stack)
        bed("remove", MACHINE, check=False)


def test_each_mig_instance_is_advertised_as_its_own_kind_and_the_parents_are_not(joined):
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "is in MIG mode but has no MIG instances" in joined.stdout + joined.stderr
    gpus = machine_gpus()
    assert {uuid: g.slices for uuid, g in gpus.items()} == {
        WHOLE: 3,  # --slices-per-gpu 3 of the join line
        INSTANCES[0]: 1,  # --mig-slices' default: the hardware partition is the slice
        INSTANCES[1]: 1,
    }
    assert gpus[INSTANCES[0]].memory_mb == 40192  # the instance's own memory, not the GPU's


def only_mig(node: dict) -> dict:
    node = copy.deepcopy(node)
    resources = node["Description"]["Resources"]
    resources["GenericResources"] = [
        r
        for r in resources["GenericResources"]
        if r["DiscreteResourceSpec"]["Kind"].startswith(MIG_PREFIX)
    ]
    return node


async def test_a_server_on_a_mig_instance_sees_that_instance_as_hardware_isolated(
    joined, hub_settings
):
    assert joined.returncode == 0, joined.stdout + joined.stderr
    spawner = make_spawner("ci-mig", hub_settings)
    real_read = spawner._read_swarm

    async def only_the_instances():  # the bed's other machines have room too
        nodes, tasks = await real_read()
        mine = [n for n in nodes if n["Description"]["Hostname"] == MACHINE]
        return [only_mig(n) for n in mine], tasks

    spawner._read_swarm = only_the_instances
    await spawner.start()
    assert spawner.holding.gpu in INSTANCES and spawner.holding.node == MACHINE
    assert any("(hardware-isolated)" in e["message"] for e in spawner.attempt.progress)
    assert machine_gpus()[spawner.holding.gpu].used == 1  # Swarm counts it on the instance's kind
    # (exec does not work in a fresh machine's nested engine: the container's configuration)
    container = container_of(spawner.object_name)
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == spawner.holding.gpu
    assert (env["GPU_ISOLATION"], env["GPU_SLICES"], env["GPU_MEMORY_FRACTION"]) == (
        "mig",
        "1",
        "1.000",
    )
    assert env["GPU_MEMORY_LIMIT_MB"] == "40192"
