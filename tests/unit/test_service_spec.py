"""A server's Swarm service from its inputs alone (gpu_swarm_spawner/service_spec.py): no
spawner, no hub, no Docker."""

from gpu_swarm_spawner import contract
from gpu_swarm_spawner.service_spec import (
    Disk,
    Holding,
    Limits,
    Server,
    create_kwargs,
    gpu_env,
    mounts,
    with_gpu_slices,
)

UUID = "GPU-2f4c8a10-1111-2222-3333-444455556666"
VOLUMES = {
    "jy-home-{username}": {"bind": "/home/jovyan", "mode": "rw"},
    "/srv/tutorials": {"bind": "/srv/tutorials", "mode": "ro"},
}


def server(**changes) -> Server:
    values = dict(
        name="jy-ada",
        user="ada",
        image="gpu-jupyterhub/singleuser:latest",
        args=["start-singleuser"],
        env={"JUPYTERHUB_USER": "ada"},
        mounts=mounts(VOLUMES, labels={"stack": "gpuhub"}),
        network="gpuhub_jhub",
        holding=Holding(gpu=UUID, node="gpu-1", slices=1, total_slices=3, memory_mb=4096),
        limits=Limits(mem_limit=16 * 2**30, cpu_limit=4.0, pids_limit=4096),
        port=8888,
        extra_endpoint_spec={"mode": "dnsrr"},
    )
    values.update(changes)
    return Server(**values)


def test_a_server_on_a_slice_reserves_it_and_carries_what_the_guard_reads():
    spec = create_kwargs(server())
    task = spec["task_template"]
    assert spec["name"] == "jy-ada"
    assert task["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": UUID, "Value": 1}}
    ]
    assert task["Resources"]["Limits"] == {
        "MemoryBytes": 16 * 2**30,
        "NanoCPUs": 4_000_000_000,
        "Pids": 4096,
    }
    assert task["RestartPolicy"] == {"Condition": "on-failure"}
    assert task["Networks"] == [{"Target": "gpuhub_jhub"}]
    assert task["ContainerSpec"]["Labels"] == {
        contract.USER_LABEL: "ada",
        contract.GPU_LABEL: UUID,
        contract.SLICES_LABEL: "1",
        contract.BUDGET_LABEL: "4096",
    }
    assert spec["labels"][contract.GPU_LABEL] == UUID
    assert contract.CPU_ONLY_LABEL not in spec["labels"]
    assert spec["endpoint_spec"]["Mode"] == "dnsrr"
    assert "Ports" not in spec["endpoint_spec"]


def test_cpu_above_the_machines_cores_is_held_to_them_and_the_rest_is_left_alone():
    """Docker refuses a container whose CPU limit is above its machine's cores: a 32-core limit
    on a 16-core GPU machine failed every spawn there."""
    many = Limits(cpu_limit=32.0, cpu_guarantee=20.0)
    on_16 = Holding(gpu=UUID, node="gpu-1", slices=1, node_cores=16.0)
    resources = create_kwargs(server(limits=many, holding=on_16))["task_template"]["Resources"]
    assert resources["Limits"]["NanoCPUs"] == 16_000_000_000
    assert resources["Reservations"]["NanoCPUs"] == 16_000_000_000
    for limits, holding, nano in [
        (Limits(cpu_limit=4.0), on_16, 4_000_000_000),  # within the machine
        (many, Holding(gpu=UUID, node="gpu-1", slices=1), 32_000_000_000),  # cores unknown
    ]:
        made = create_kwargs(server(limits=limits, holding=holding))["task_template"]
        assert made["Resources"]["Limits"]["NanoCPUs"] == nano
    assert "NanoCPUs" not in create_kwargs(server(limits=Limits(), holding=on_16))["task_template"][
        "Resources"
    ].get("Limits", {})


def test_a_server_without_a_gpu_stays_on_its_machine_and_sees_no_device():
    holding = Holding(cpu_only=True, cpu_node="gpu-2")
    spec = create_kwargs(server(holding=holding, env=gpu_env(holding)))
    task = spec["task_template"]
    assert task["Placement"]["Constraints"] == ["node.hostname==gpu-2"]
    assert "GenericResources" not in task["Resources"].get("Reservations", {})
    assert task["ContainerSpec"]["Labels"] == {}
    assert task["ContainerSpec"]["Env"] == [
        "NVIDIA_VISIBLE_DEVICES=void",
        "CUDA_VISIBLE_DEVICES=",
        "GPU_MODE=none",
    ]
    assert spec["labels"][contract.CPU_ONLY_LABEL] == "1"


def test_every_server_carries_the_disk_watchs_labels_with_a_gpu_or_without():
    disk = Disk(budget_mb=20480, safety_percent=90)
    on_gpu = create_kwargs(server(disk=disk))["task_template"]["ContainerSpec"]["Labels"]
    assert on_gpu == {
        contract.USER_LABEL: "ada",
        contract.GPU_LABEL: UUID,
        contract.SLICES_LABEL: "1",
        contract.BUDGET_LABEL: "4096",
        contract.DISK_BUDGET_LABEL: "20480",
        contract.DISK_SAFETY_LABEL: "90",
    }
    cpu_only = Holding(cpu_only=True, cpu_node="gpu-2")
    spec = create_kwargs(server(holding=cpu_only, disk=disk))
    # whose it is, so the watch can name the participant; no GPU label: the guard leaves it be
    assert spec["task_template"]["ContainerSpec"]["Labels"] == {
        contract.USER_LABEL: "ada",
        contract.DISK_BUDGET_LABEL: "20480",
        contract.DISK_SAFETY_LABEL: "90",
    }


def test_a_disk_setting_of_0_leaves_its_label_out():
    def labels(disk, holding=None):
        holding = holding or Holding(cpu_only=True)
        return create_kwargs(server(holding=holding, disk=disk))["task_template"]["ContainerSpec"][
            "Labels"
        ]

    assert labels(Disk(budget_mb=0, safety_percent=90)) == {
        contract.USER_LABEL: "ada",
        contract.DISK_SAFETY_LABEL: "90",
    }
    assert labels(Disk(budget_mb=2560, safety_percent=0)) == {
        contract.USER_LABEL: "ada",
        contract.DISK_BUDGET_LABEL: "2560",
    }
    assert labels(Disk()) == {}
    with_gpu = labels(Disk(), Holding(gpu=UUID, slices=1))
    assert contract.DISK_BUDGET_LABEL not in with_gpu and contract.DISK_SAFETY_LABEL not in with_gpu
    assert contract.disk_budget_mib(2.5) == 2560 and contract.disk_budget_mib(20) == 20480


def test_the_gpu_environment_names_the_device_its_budget_and_its_share():
    env = gpu_env(Holding(gpu=UUID, node="gpu-1", slices=2, total_slices=3, memory_mb=8192))
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == UUID
    assert env["GPU_MEMORY_LIMIT_MB"] == "8192" and env["GPU_MEMORY_FRACTION"] == "0.667"
    assert env["GPU_ISOLATION"] == "shared" and env["GPU_NODE"] == "gpu-1"
    assert gpu_env(Holding()) == {}  # nothing said where nothing is held


def test_a_hub_without_internal_ips_publishes_the_servers_port():
    spec = create_kwargs(server(use_internal_ip=False, extra_endpoint_spec={}))
    assert spec["endpoint_spec"]["Ports"] == [
        {"Protocol": "tcp", "PublishedPort": None, "TargetPort": 8888}  # Swarm picks one
    ]


def test_another_reservation_of_the_gpus_kind_is_replaced_others_kept():
    generic = {UUID: 3, "fpga": 1}
    assert with_gpu_slices(generic, UUID, 1) == [
        {"DiscreteResourceSpec": {"Kind": "fpga", "Value": 1}},
        {"DiscreteResourceSpec": {"Kind": UUID, "Value": 1}},
    ]


def test_named_volumes_are_volumes_paths_are_binds_and_a_shared_home_replaces_the_volume():
    made = {m["Target"]: m for m in mounts(VOLUMES, labels={"stack": "gpuhub"})}
    assert made["/home/jovyan"]["Type"] == "volume"
    assert made["/home/jovyan"]["VolumeOptions"]["Labels"] == {"stack": "gpuhub"}
    assert made["/srv/tutorials"]["Type"] == "bind" and made["/srv/tutorials"]["ReadOnly"]
    shared = {m["Target"]: m for m in mounts(VOLUMES, home_folder="/srv/homes/ada")}
    assert shared["/home/jovyan"]["Type"] == "bind"
    assert shared["/home/jovyan"]["Source"] == "/srv/homes/ada"
