from gpu_swarm_spawner import contract, inventory
from gpu_swarm_spawner.inventory import GPU, build_inventory, totals

from .clusters import node, task

A0, A1, B0 = "GPU-aaaa-0", "GPU-aaaa-1", "GPU-bbbb-0"


def by_uuid(gpus):
    return {g.uuid: g for g in gpus}


def test_counts_live_reservations_per_gpu():
    nodes = [node("n1", "alpha", {A0: 3, A1: 3}), node("n2", "beta", {B0: 4})]
    tasks = [task("n1", {A0: 1}), task("n1", {A0: 1}), task("n2", {B0: 3})]
    gpus = by_uuid(build_inventory(nodes, tasks))
    assert (gpus[A0].used, gpus[A0].free) == (2, 1)
    assert (gpus[A1].used, gpus[A1].free) == (0, 3)
    assert (gpus[B0].used, gpus[B0].free) == (3, 1)
    assert gpus[B0].node_name == "beta" and gpus[B0].node_id == "n2"


def test_non_gpu_kinds_are_ignored():
    gpus = build_inventory([node("n1", "alpha", {A0: 3})], [task("n1", {"fpga": 1})])
    assert [g.uuid for g in gpus] == [A0]
    assert gpus[0].used == 0


def test_finished_and_unplaced_tasks_hold_nothing_but_stopping_ones_do():
    tasks = [
        task("n1", {A0: 1}, state="running", desired="shutdown"),  # being removed: still held
        task("n1", {A0: 1}, state="complete", desired="shutdown"),
        task("n1", {A0: 1}, state="failed", desired="shutdown"),
        task("n1", {A0: 1}, state="rejected"),
        task("", {A0: 1}, state="pending"),  # not placed: Swarm has not reserved anything
        task("n1", {A0: 1}, state="starting"),
    ]
    (gpu,) = build_inventory([node("n1", "alpha", {A0: 3})], tasks)
    assert gpu.used == 2


def test_drained_paused_and_down_nodes_are_left_out():
    nodes = [
        node("n1", "drained", {A0: 3}, availability="drain"),
        node("n2", "paused", {A1: 3}, availability="pause"),
        node("n3", "down", {B0: 3}, state="down"),
        node("n4", "ok", {"GPU-cccc-0": 2}),
    ]
    assert [g.node_name for g in build_inventory(nodes, [])] == ["ok"]


def test_heterogeneous_slices_and_stable_order():
    nodes = [node("n2", "zulu", {B0: 7}), node("n1", "alpha", {A1: 2, A0: 3})]
    gpus = build_inventory(nodes, [])
    assert [(g.node_name, g.uuid, g.slices) for g in gpus] == [
        ("alpha", A0, 3),
        ("alpha", A1, 2),
        ("zulu", B0, 7),
    ]
    assert totals(gpus) == (0, 12)


def test_overcommitted_gpu_reports_no_free_slices():
    gpu = GPU(A0, "n1", "alpha", slices=3, used=5)
    assert gpu.free == 0
    assert totals([gpu]) == (3, 3)


def test_node_without_resources_has_no_gpus():
    bare = {"ID": "n9", "Spec": {"Availability": "active"}, "Status": {"State": "ready"}}
    assert build_inventory([bare], []) == []


def test_custom_kind_prefix():
    nodes = [node("n1", "alpha", {"MIG-1": 1, A0: 3})]
    assert [g.uuid for g in build_inventory(nodes, [], kind_prefix="MIG-")] == ["MIG-1"]


def test_simulated_uuids_are_marked_and_stable():
    uuid = contract.simulated_uuid("3d1219c7aa55", 1)
    assert uuid == contract.simulated_uuid("3d1219c7aa55", 1)
    assert uuid.startswith("GPU-simulated-") and uuid.endswith("-1")
    assert contract.simulated_uuid("w1", 0) != contract.simulated_uuid("w2", 0)
    assert contract.is_simulated(uuid)
    assert not contract.is_simulated("GPU-8d2c6f1e-1b7a-4c55-9d3e-000000000000")
    assert GPU(uuid, "n", "h", 3, 0).simulated


def test_claims_count_until_swarm_counts_the_task_itself():
    nodes = [node("n1", "alpha", {A0: 3, A1: 3})]
    claims = [
        inventory.Claim(A0, 1),  # service being created
        inventory.Claim(A0, 2, "s-pending"),  # created, task not placed yet
        inventory.Claim(A1, 1, "s-placed"),  # Swarm placed it: counted from the task only
    ]
    tasks = [
        task("", {A0: 2}, state="pending", service_id="s-pending"),
        task("n1", {A1: 1}, state="assigned", service_id="s-placed"),
    ]
    gpus = by_uuid(build_inventory(nodes, tasks, claims=claims))
    assert (gpus[A0].used, gpus[A1].used) == (3, 1)
    assert build_inventory(nodes, [], claims=[inventory.Claim(B0, 1)])[0].used == 0
    # the tasks counted beforehand (a read shared by many spawns): the same inventory
    usage = inventory.task_usage(tasks)
    assert usage.services == {"s-placed"}  # the pending task is not on a node yet
    assert build_inventory(nodes, tasks, claims=claims, usage=usage) == list(gpus.values())


def test_gpu_memory_comes_from_the_engine_labels():
    labelled = node("n1", "alpha", {A0: 3, A1: 4})
    labelled["Description"]["Engine"] = {
        "Labels": {f"{contract.MEMORY_LABEL}{A0}": "12288", f"{contract.MEMORY_LABEL}{A1}": "x"}
    }
    gpus = by_uuid(build_inventory([labelled], []))
    assert gpus[A0].memory_mb == 12288
    assert gpus[A0].memory_budget_mb(1) == 4096 and gpus[A0].memory_budget_mb(3) == 12288
    assert gpus[A1].memory_mb == 0 and gpus[A1].memory_budget_mb(2) == 0  # unknown stays 0


def test_a_memory_label_no_gpu_has_reads_as_unknown():
    """A negative memory (a hand-edited daemon.json) would give each server a negative budget,
    over which the guard finds everyone: unknown instead, as without a label."""
    labelled = node("n1", "alpha", {A0: 3})
    labelled["Description"]["Engine"] = {"Labels": {f"{contract.MEMORY_LABEL}{A0}": "-1"}}
    (gpu,) = build_inventory([labelled], [])
    assert gpu.memory_mb == 0 and gpu.memory_budget_mb(1) == 0


def test_a_gpu_two_machines_advertise_is_used_on_neither():
    """Machines cloned from one image: one UUID on two machines. Swarm could place a server
    that asks for it on either, so the hub places none there, and says which."""
    nodes = [
        node("n1", "alpha", {A0: 3, A1: 3}),
        node("n2", "clone", {A0: 3}),
        node("n3", "drained", {A1: 3}, availability="drain"),  # takes no servers: no matter
    ]
    assert inventory.kinds_on_several_nodes(nodes) == {A0: ["alpha", "clone"]}
    assert [(g.node_name, g.uuid) for g in build_inventory(nodes, [])] == [("alpha", A1)]


def test_the_spare_unit_swarm_is_given_is_no_slice():
    """A machine advertises one unit per GPU beyond its slices and says so in an engine label
    (contract.SWARM_SPARE): its GPU is full when its slices are held. A machine joined
    before the spare (no label) counts every unit; a label no number reads as none."""
    spare = {contract.SPARE_LABEL: str(contract.SWARM_SPARE)}
    joined = node("n1", "alpha", {A0: 3 + contract.SWARM_SPARE})
    joined["Description"]["Engine"] = {"Labels": spare}
    older = node("n2", "beta", {B0: 3})
    gpus = by_uuid(build_inventory([joined, older], [task("n1", {A0: 3}), task("n2", {B0: 2})]))
    assert (gpus[A0].slices, gpus[A0].used, gpus[A0].free) == (3, 3, 0)
    assert (gpus[B0].slices, gpus[B0].free) == (3, 1)
    generic = joined["Description"]["Resources"]["GenericResources"]
    listed = [f"{contract.SPARE_LABEL}=1", "rack=7"]  # an engine's /info lists its labels
    assert contract.advertised_slices(generic, listed) == {A0: 3}
    for odd in ({contract.SPARE_LABEL: "one"}, [f"{contract.SPARE_LABEL}=-1"], None):
        assert contract.advertised_slices(generic, odd) == {A0: 4}
