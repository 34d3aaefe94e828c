"""GPUSwarmSpawner logic that needs no Docker daemon: traits, env, state, the service spec."""

import asyncio
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import dockerspawner.dockerspawner as ds
import pytest
from jupyterhub.objects import Hub
from tornado import web
from traitlets import TraitError

from gpu_swarm_spawner import (
    GPUSwarmSpawner,
    NoGPUSliceAvailable,
    SpawnFailed,
    spawner_page,
    spawner_server,
)
from gpu_swarm_spawner import tasks as tasks_module
from gpu_swarm_spawner.errors import SliceTaken
from gpu_swarm_spawner.holding import Holding

from .clusters import node, task
from .fake_docker import FakeDockerSpawner, make_fake


def make_spawner(**kwargs):
    user = SimpleNamespace(name="alice-smith", id=1, url="/user/alice-smith/")
    return GPUSwarmSpawner(user=user, hub=Hub(), **kwargs)


@pytest.mark.parametrize(
    "trait, value, advice",
    [
        ("slices_per_server", 0, "slices_per_server must be 1 or more, got 0; every server"),
        ("placement_policy", "roundrobin", "spread, pack"),
        ("full_gpu_for", "everyone", "write one of: off, admins, all"),
        ("gpu_kind_prefix", " ", "must not be empty"),
        ("placement_attempts", 0, "placement_attempts must be 1 or more"),
        ("docker_api_threads", 0, "docker_api_threads must be 1 or more"),
        ("inventory_max_age", -1, "0 or more seconds"),
        ("disk_budget_gb", -1, "from 0 \\(no budget\\) to 100000, e.g. 20"),
        ("disk_budget_gb", 100001, "disk_budget_gb is 100001"),
        ("disk_safety_percent", 49, "from 50 to 99, e.g. 90, or 0 for no safety line"),
        ("disk_safety_percent", 100, "disk_safety_percent is 100"),
    ],
)
def test_bad_settings_are_refused_with_advice(trait, value, advice):
    with pytest.raises(TraitError, match=advice):
        make_spawner(**{trait: value})


def test_a_renamed_setting_still_works_under_its_old_name(caplog):
    spawner = make_spawner(gpu_slices=2)
    assert spawner.slices_per_server == 2
    assert "gpu_slices is deprecated" in caplog.text and "slices_per_server" in caplog.text


def test_service_name_is_jy_and_escaped_username():
    spawner = make_spawner()
    assert spawner.object_name == "jy-alice-2dsmith"
    assert spawner.extra_endpoint_spec == {"mode": "dnsrr"}
    assert spawner.use_internal_ip is True


def test_env_names_exactly_one_gpu():
    spawner = make_spawner()
    spawner.holding = Holding(gpu="GPU-simulated-ab-1", node="n1", slices=2)
    env = spawner.get_env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "GPU-simulated-ab-1"
    assert env["GPU_SLICES"] == "2"
    assert env["GPU_SIMULATED"] == "1"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "GPU_MEMORY_LIMIT_MB" not in env  # the node did not say how much memory the GPU has
    spawner.holding = replace(spawner.holding, memory_mb=8192)
    assert spawner.get_env()["GPU_MEMORY_LIMIT_MB"] == "8192"


def test_env_without_gpu_has_no_device():
    assert "NVIDIA_VISIBLE_DEVICES" not in make_spawner().get_env()


def test_state_round_trip_keeps_the_gpu():
    spawner = make_spawner()
    spawner.object_id = "svc123"
    spawner.holding = Holding(gpu="GPU-x", node="beta", slices=1, memory_mb=4096, node_cores=8)
    state = spawner.get_state()
    restored = make_spawner()
    restored.load_state(state)
    assert restored.holding == Holding(gpu="GPU-x", node="beta", slices=1, memory_mb=4096)
    restored.clear_state()
    assert restored.holding == Holding() and "gpu_uuid" not in restored.get_state()


def test_the_state_keeps_the_keys_running_hubs_have_in_their_databases():
    """What a hub's database holds for a running server: the keys servers have had since 0.1,
    read as they were written (a hub upgraded while servers run finds what they hold)."""
    spawner = make_spawner()
    spawner.holding = Holding(gpu="GPU-x", node="beta", slices=2, total_slices=3, memory_mb=8)
    state = spawner.get_state()
    held = {k: state[k] for k in ("gpu_uuid", "gpu_node", "gpu_slices", "gpu_memory_mb")}
    assert held == {"gpu_uuid": "GPU-x", "gpu_node": "beta", "gpu_slices": 2, "gpu_memory_mb": 8}
    written_by_an_older_hub = {"object_id": "s1", "gpu_uuid": "GPU-y", "gpu_slices": 1}
    restored = make_spawner()
    restored.load_state(written_by_an_older_hub)
    assert restored.holding == Holding(gpu="GPU-y", slices=1)


async def test_each_start_is_a_new_attempt_nothing_of_the_last_one_carries_over():
    spawner = make_fake(inventory_max_age=0, waiting_line="off")
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.tasks = [task("n1", {"GPU-a0": 3})]
    with pytest.raises(NoGPUSliceAvailable):
        await spawner.start()
    refused = spawner.attempt
    assert refused.refused and refused.reservation is None
    spawner.tasks = []
    spawner._report(10, "a message of the refused start")
    await asyncio.wait_for(spawner.start(), timeout=5)
    assert spawner.attempt is not refused and not spawner.attempt.refused
    assert spawner.attempt.reservation.gpu.uuid == "GPU-a0"
    assert "a message of the refused start" not in str(spawner.attempt.progress)
    assert set(spawner.attempt.phases) >= {"slices", "created"}


def test_the_home_machine_outlives_the_server_in_the_state():
    spawner = make_spawner()
    spawner.home_node = "beta"
    spawner.clear_state()  # the server stopped
    restored = make_spawner()
    restored.load_state(spawner.get_state())
    assert restored.home_node == "beta"


async def test_a_returning_user_goes_back_to_the_machine_with_their_home():
    spawner = FakeDockerSpawner(
        user=SimpleNamespace(name="bob", id=2, url="/user/bob/"), inventory_max_age=0
    )
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}), node("n2", "beta", {"GPU-b0": 3})]
    spawner.tasks = [task("n2", {"GPU-b0": 2})]  # spread alone would pick alpha
    spawner.home_node = "beta"
    assert (await spawner.reserve_gpu()).gpu.uuid == "GPU-b0"

    spawner.tasks = [task("n2", {"GPU-b0": 3})]  # beta is full: elsewhere, and the user is told
    spawner.attempt.progress.clear()
    assert (await spawner.reserve_gpu()).gpu.uuid == "GPU-a0"
    assert "your files stay on beta" in spawner.attempt.progress[-1]["message"]

    spawner.prefer_home_node = False
    spawner.tasks = [task("n2", {"GPU-b0": 2})]
    assert (await spawner.reserve_gpu()).gpu.uuid == "GPU-a0"


async def test_each_spawn_reserves_only_its_own_gpu():
    """A second spawn (a lost race, or the user's next server) must not keep the first GPU."""
    spawner = make_fake(
        extra_resources_spec={"generic_resources": {"fpga": 1}, "mem_limit": 1},
        extra_create_kwargs={"labels": {"course": "gpu101"}},
        cpu_limit=1.5,
        cmd=["jupyterhub-singleuser"],
    )
    for uuid, slices in [("GPU-a", 3), ("GPU-b", 1)]:
        spawner.holding = Holding(gpu=uuid, slices=slices)
        await spawner.create_object()
    created = spawner.created[-1]
    resources = created["task_template"]["Resources"]
    generic = {
        r["DiscreteResourceSpec"]["Kind"]: r["DiscreteResourceSpec"]["Value"]
        for r in resources["Reservations"]["GenericResources"]
    }
    assert generic == {"fpga": 1, "GPU-b": 1}
    assert resources["Limits"] == {"MemoryBytes": 1, "NanoCPUs": 1_500_000_000}
    labels = created["labels"]
    assert labels["course"] == "gpu101"
    assert (labels["gpu-jupyterhub.gpu"], labels["gpu-jupyterhub.slices"]) == ("GPU-b", "1")
    assert created["name"] == "jy-alice-2dsmith"
    assert created["endpoint_spec"]["Mode"] == "dnsrr"
    env = created["task_template"]["ContainerSpec"]["Env"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b" in env
    # the GPU guard on the machine reads the container's labels (a worker cannot read services)
    assert created["task_template"]["ContainerSpec"]["Labels"] == {
        "gpu-jupyterhub.user": "alice-smith",
        "gpu-jupyterhub.gpu": "GPU-b",
        "gpu-jupyterhub.slices": "1",
    }


def test_container_labels_carry_the_budget_and_nothing_without_a_gpu():
    spawner = make_spawner()
    assert spawner.container_labels() == {}
    spawner.holding = Holding(gpu="GPU-a", slices=2, memory_mb=8192)
    assert spawner.container_labels()["gpu-jupyterhub.gpu-memory-limit-mb"] == "8192"


def test_container_labels_carry_the_disk_budget_and_the_safety_line_with_or_without_a_gpu():
    spawner = make_spawner(disk_budget_gb=2.5, disk_safety_percent=90)
    assert spawner.container_labels() == {
        "gpu-jupyterhub.user": "alice-smith",
        "gpu-jupyterhub.disk-budget-mb": "2560",
        "gpu-jupyterhub.disk-safety-percent": "90",
    }
    spawner.holding = Holding(gpu="GPU-a", slices=1)
    assert spawner.container_labels()["gpu-jupyterhub.disk-budget-mb"] == "2560"
    assert make_spawner(disk_budget_gb=0, disk_safety_percent=0).container_labels() == {}


async def test_a_stop_for_the_disk_is_told_until_the_next_start_and_outlives_a_restart(tmp_path):
    from gpu_swarm_spawner import events

    spawner = make_fake("alice", dashboard_dir=str(tmp_path))
    spawner.stopped_for_disk("Stopped at 14:03 because w1's disk was full. Start again.", "w1")
    (recorded,) = events.read_events(events.tail(tmp_path / events.EVENTS_FILE))
    assert (recorded.kind, recorded.user, recorded.node) == ("disk stop", "alice", "w1")
    assert recorded.reason == "Stopped at 14:03 because w1's disk was full. Start again."
    assert spawner.failure_message == recorded.reason  # not running: their page says why
    assert spawner.failure_heading == "Your server was stopped."
    # JupyterHub's stop clears the state and writes it back: the reason stays, and a hub
    # restarted since still says it
    spawner.clear_state()
    again = make_fake("alice")
    again.load_state(spawner.get_state())
    assert again.failure_message == recorded.reason
    again.nodes, again.tasks = [node("n1", "alpha", {"GPU-a0": 3})], []
    await asyncio.wait_for(again.start(), 3)  # a new start forgets it
    assert "stopped_why" not in again.get_state()
    again._spawn_future = None
    assert again.failure_message == ""
    assert again.failure_heading == "Your server did not start."


def test_an_idle_stop_is_told_as_a_stop_and_a_reason_written_by_an_older_hub_is_read(tmp_path):
    from gpu_swarm_spawner import capacity, events

    spawner = make_fake("alice", dashboard_dir=str(tmp_path))
    why = capacity.idle_stop_message(1_800_000_000, 1200)
    spawner.stopped_by_hub(why)
    assert spawner.failure_message == why
    assert spawner.failure_heading == "Your server was stopped."
    # the fleet records its own event, one a machine: the spawner adds none
    assert not (tmp_path / events.EVENTS_FILE).exists()
    spawner.clear_state()
    again = make_fake("alice")
    again.load_state(spawner.get_state())
    assert (again.get_state()["stopped_why"], again.failure_message) == (why, why)
    # a server a hub of an earlier version stopped for the disk ("disk_stopped")
    older = make_fake("alice")
    older.load_state({"disk_stopped": "Stopped for the disk. Start again."})
    assert older.failure_message == "Stopped for the disk. Start again."


def test_mounts_use_volumes_for_names_and_binds_for_paths():
    spawner = make_spawner(
        volumes={
            "jy-home-{username}": "/home/jovyan",
            "/srv/tutorials": {"bind": "/t", "mode": "ro"},
        },
        service_labels={"gpu-jupyterhub.stack": "s"},
    )
    mounts = {m["Target"]: m for m in spawner.mounts}
    assert mounts["/home/jovyan"]["Type"] == "volume"
    assert mounts["/home/jovyan"]["Source"] == "jy-home-alice-2dsmith"
    assert mounts["/home/jovyan"]["VolumeOptions"]["Labels"] == {"gpu-jupyterhub.stack": "s"}
    assert mounts["/t"]["Type"] == "bind" and mounts["/t"]["ReadOnly"] is True


async def test_reserve_gpu_spreads_and_refuses_when_full():
    spawner = FakeDockerSpawner(
        user=SimpleNamespace(name="bob", id=2, url="/user/bob/"), inventory_max_age=0
    )
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3, "GPU-a1": 3})]
    spawner.tasks = [task("n1", {"GPU-a0": 1})]
    assert (await spawner.reserve_gpu()).gpu.uuid == "GPU-a1"

    spawner.tasks = [task("n1", {"GPU-a0": 3}), task("n1", {"GPU-a1": 3})]
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await spawner.reserve_gpu()
    assert refused.value.jupyterhub_message.startswith("All GPU slices are in use (6/6)")
    assert "alpha:GPU-a0=3/3" in str(refused.value)
    # an HTTP error JupyterHub passes through (page, REST), not "500 : Unhandled error"
    assert isinstance(refused.value, web.HTTPError) and refused.value.status_code == 503


async def test_the_failure_message_is_what_the_last_failed_start_told_the_participant():
    spawner = make_fake()
    assert spawner.failure_message == ""
    loop = asyncio.get_running_loop()
    spawner._spawn_future = loop.create_future()
    assert spawner.failure_message == ""  # still starting
    spawner._spawn_future.set_exception(NoGPUSliceAvailable("All GPU slices are in use", "log"))
    assert spawner.failure_message == "All GPU slices are in use"
    spawner._spawn_future = loop.create_future()
    spawner._spawn_future.set_exception(ValueError("boom"))
    assert spawner.failure_message == "The server could not start: boom"
    spawner._spawn_future = loop.create_future()
    spawner._spawn_future.set_result(None)
    assert spawner.failure_message == ""


def test_task_address_is_read_from_the_attachment_on_the_servers_network():
    from gpu_swarm_spawner.tasks import task_address

    task = {
        "NetworksAttachments": [
            {"Network": {"Spec": {"Name": "ingress"}}, "Addresses": ["10.255.0.9/16"]},
            {"Network": {"Spec": {"Name": "jhub"}}, "Addresses": ["10.0.8.5/24"]},
        ]
    }
    assert task_address(task, "jhub") == "10.0.8.5"
    assert task_address(task, "other") == ""
    assert task_address({}, "jhub") == ""


async def test_the_hub_reaches_the_server_at_its_task_address():
    spawner = make_fake()
    spawner.task_ip = "10.0.8.5"
    assert await spawner.get_ip_and_port() == ("10.0.8.5", 8888)


async def test_spawns_share_a_recent_read_of_the_swarm():
    reads = []

    class Counting(FakeDockerSpawner):
        async def _read_swarm(self):
            reads.append(1)
            return self.nodes, self.tasks

    user = SimpleNamespace(name="u", id=3, url="/user/u/")
    spawner = Counting(user=user, hub=Hub(), inventory_max_age=30)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.gpu_inventory()
    await spawner.gpu_inventory()
    assert len(reads) == 1
    other = Counting(user=SimpleNamespace(name="v", id=4, url="/user/v/"), hub=Hub())
    other.nodes = spawner.nodes
    await other.gpu_inventory()  # another server of the same hub shares it too
    assert len(reads) == 1


async def test_a_machine_without_the_shared_storage_fails_the_spawn_at_once_with_advice():
    """Found on the bed: a fresh GPU machine without the tutorials' shared folder had every
    spawn there rejected by Swarm, retried until the start timeout."""
    spawner = make_fake(start_timeout=120)
    spawner.holding = Holding(gpu="GPU-a", node="fresh3")
    spawner.object_id = "svc1"
    error = (
        'invalid mount config for type "bind": bind source path does not exist: '
        "/var/lib/gpu-jupyterhub/hub/tutorials"
    )

    async def current_task():
        return {"ID": "t1", "NodeID": "n1", "Status": {"State": "rejected", "Err": error}}

    spawner._current_task = current_task
    with pytest.raises(SpawnFailed) as failed:
        await asyncio.wait_for(spawner.start_object(), timeout=5)
    assert failed.value.jupyterhub_message.startswith(
        "The GPU machine fresh3 lacks the shared folder /var/lib/gpu-jupyterhub/hub/tutorials,"
    )
    assert "shared storage" in failed.value.jupyterhub_message


async def test_a_machine_without_the_image_fails_the_spawn_at_once_with_advice():
    spawner = make_fake(start_timeout=120)
    spawner.holding = Holding(gpu="GPU-a", node="w1")
    spawner.object_id = "svc1"
    status = {"State": "rejected", "Err": "No such image: 10.0.0.5:5000/x/singleuser:latest"}

    async def current_task():
        return {"ID": "t1", "NodeID": "n1", "Status": status}

    spawner._current_task = current_task
    with pytest.raises(SpawnFailed) as failed:
        await asyncio.wait_for(spawner.start_object(), timeout=5)
    # what the participant reads on the page, not "500 : Unhandled error"
    assert re.search(
        r"w1 cannot get the server image .*--registry", failed.value.jupyterhub_message
    )


def test_a_read_of_the_task_ends_the_start_only_where_the_task_will_not_come_up():
    """``spawner_server.task_failure`` on plain readings: no spawner, no swarm."""
    Phase = tasks_module.Phase

    missing = 'invalid mount config for type "bind": bind source path does not exist: /srv/data'

    def failure(phase, state="rejected", detail=missing):
        reading = tasks_module.TaskReading(phase, state, detail)
        return spawner_server.task_failure(reading, "beta", "jy-alice")

    for phase, state in [(Phase.STARTING, "starting"), (Phase.RETRYING, "rejected")]:
        assert failure(phase, state) is None
    assert failure(Phase.RUNNING, "running") is None
    assert isinstance(failure(Phase.UNPLACEABLE, "pending"), SliceTaken)
    no_image = failure(Phase.NO_IMAGE)
    assert no_image.reason == "image" and "beta cannot get the server image" in str(no_image)
    no_mount = failure(Phase.NO_MOUNT)
    assert no_mount.reason == "mount" and "lacks the shared folder /srv/data" in str(no_mount)
    ended = failure(Phase.ENDED, "complete", "finished")
    assert str(ended) == "Service jy-alice did not start: task complete: finished"


def test_the_home_page_says_why_the_server_is_not_running_most_telling_first():
    """``spawner_page.failure_message`` on plain values: the stop for the disk, then the line
    a hub restart emptied, then the last start's error; none of it while the server runs."""
    error = SpawnFailed("All GPU slices are in use (3/3).")
    message = spawner_page.failure_message
    assert message("The disk of beta is full.", 1.0, False, error) == "The disk of beta is full."
    assert "waiting in line for a GPU" in message("", 1.0, False, error)
    assert message("", 0, False, error) == "All GPU slices are in use (3/3)."
    assert message("The disk of beta is full.", 1.0, True, None) == ""
    assert message("", 0, False, None) == ""
    assert spawner_page.failure_heading("The disk of beta is full.", False) == (
        "Your server was stopped."
    )
    assert spawner_page.failure_heading("", False) == "Your server did not start."


async def test_a_server_never_given_an_address_on_a_full_network_fails_with_the_organizer_s_fix(
    monkeypatch,
):
    """Swarm leaves such a task "new", without an error, until the start times out."""
    monkeypatch.setattr(tasks_module, "UNALLOCATED_S", 0.05)
    spawner = make_fake("erin", start_timeout=120, inventory_max_age=0, network_name="hubnet")
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.task_states = [{"State": "new", "Message": "created"}]
    spawner.subnets = ["10.9.0.0/29"]  # 8: 3 Swarm's own, 1 node's, 4 servers
    spawner.tasks = [
        {**task("n1", {}, service_id=f"s{i}"), "NetworksAttachments": attached(f"10.9.0.{i + 2}")}
        for i in range(4)
    ]
    with pytest.raises(SpawnFailed) as failed:
        await asyncio.wait_for(spawner.start(), timeout=5)
    assert "GPUHUB_NETWORK_SUBNET" in failed.value.jupyterhub_message
    assert "10.9.0.0/29" in failed.value.jupyterhub_message
    assert spawner.services == {}  # its service is gone, and its slice with it


async def test_a_server_waiting_for_an_address_on_a_network_with_room_waits_on(monkeypatch):
    monkeypatch.setattr(tasks_module, "UNALLOCATED_S", 0.05)
    spawner = make_fake("erin", start_timeout=120, inventory_max_age=0, network_name="hubnet")
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.task_states = [{"State": "new", "Message": "created"}]

    async def allocate_later():
        await asyncio.sleep(0.3)
        (service,) = spawner.services.values()
        service["task"].update(NodeID="n1", Status={"State": "running"})

    later = asyncio.ensure_future(allocate_later())
    await asyncio.wait_for(spawner.start(), timeout=5)
    await later
    assert spawner.called("inspect_network")  # it looked, found room, and waited


@pytest.mark.parametrize("cpu_only", [False, True])
async def test_a_cpu_limit_above_the_machines_cores_is_held_to_them(caplog, cpu_only):
    """GPUHUB_CPU_LIMIT=32 on 16-core GPU machines: Docker would refuse every server there."""
    caplog.set_level(logging.INFO)
    spawner = make_fake("erin", inventory_max_age=0, cpu_limit=32.0)
    spawner.cpu_only_requested = cpu_only
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}, cores=16)]
    await asyncio.wait_for(spawner.start(), timeout=5)
    (created,) = spawner.created
    assert created["task_template"]["Resources"]["Limits"]["NanoCPUs"] == 16_000_000_000
    assert "cpu_limit of 32 cores is more than the 16 of alpha; limited to those" in caplog.text


def attached(address: str) -> list[dict]:
    return [{"Network": {"Spec": {"Name": "hubnet"}}, "Addresses": [f"{address}/29"]}]


def test_the_docker_client_is_made_once_when_the_pool_s_threads_ask_at_once(monkeypatch):
    """dockerspawner makes its client on first use with no lock; the broker's threads asking
    at once each made one (and CPython crashed replacing them)."""
    made = []

    def slow_client(**kwargs):
        time.sleep(0.05)  # as the real one, which asks the engine for its API version
        made.append(object())
        return made[-1]

    monkeypatch.setattr(ds.docker, "APIClient", slow_client)
    monkeypatch.setattr(GPUSwarmSpawner, "_client", None)
    spawner = make_spawner()
    threads = 8
    together = threading.Barrier(threads)

    def ask(_):
        together.wait()
        return spawner.client

    with ThreadPoolExecutor(threads) as pool:
        clients = list(pool.map(ask, range(threads)))
    assert len(made) == 1, f"{len(made)} clients made"
    assert all(c is made[0] for c in clients)
    assert spawner.client is made[0]


def test_the_gpu_choice_follows_the_spawners_line_settings_and_the_fleet():
    """What the hub's config sets (GPUHUB_FLEET among them) is what the GPU choice follows: a
    fleet with no machine lets its first participant wait for one (test_spawner_gpu.py)."""
    rules = make_spawner(waiting_line="auto", line_max_wait=600, fleet=True).gpu_chooser().rules
    assert (rules.waiting_line, rules.line_max_wait, rules.fleet) == ("auto", 600, True)
    assert not make_spawner().gpu_chooser().rules.fleet  # off by default
