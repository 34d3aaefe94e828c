"""The deployed stack on a real swarm: a user's server holds exactly one GPU slice."""

import json
import subprocess
import time
from pathlib import Path

import docker
import pytest
from docker.utils import parse_bytes

from gpu_swarm_spawner import contract, placement
from gpu_swarm_spawner.inventory import build_inventory

from .hub import REPO, container_env, container_of
from .spawners import inventory, stop_and_see_its_slices_free, wait_slices_free

pytestmark = pytest.mark.integration

USER = "ci-alice"
SERVICE = "jy-ci-2dalice"  # jy-<escaped username>; '-' is escaped as -2d


@pytest.fixture
def client():
    return docker.from_env()


def gpu_reservations(service) -> dict[str, int]:
    spec = service.attrs["Spec"]["TaskTemplate"]["Resources"]["Reservations"]
    return {
        r["DiscreteResourceSpec"]["Kind"]: r["DiscreteResourceSpec"]["Value"]
        for r in spec.get("GenericResources", [])
    }


WAL_MODE = (
    "import sqlite3, sys; "
    "print(sqlite3.connect(sys.argv[1]).execute('PRAGMA journal_mode').fetchone()[0])"
)


def test_hub_serves_its_api_and_login_page(hub):
    r = hub.api("GET", "/")
    assert r.status_code == 200 and "version" in r.json()
    page = hub.session.get(f"{hub.url}/hub/login", timeout=30)
    assert page.status_code == 200
    assert "simulated" in page.text, "the demo must say its GPU slices are simulated"
    # its database keeps a write-ahead log (hubdb.py): the mode is stored in the file
    mode = container_of(f"{hub.stack}_hub").exec_run(
        ["python3", "-c", WAL_MODE, "/srv/jupyterhub/data/jupyterhub.sqlite"]
    )
    assert mode.output.decode().strip() == "wal", mode.output


#: Run in the hub's image: what the stack runs from it imports, and what it must not hold.
HUB_IMAGE_IMPORTS = """
import importlib.util, json, sys
import deploy.settings, gpu_swarm_spawner.dashboard.app, gpu_swarm_spawner.spawner
import tutorial_sync.service
deploy.settings.from_environment()
print(json.dumps({m: bool(importlib.util.find_spec(m)) for m in sys.argv[1:]}))
"""


def test_the_hub_image_runs_the_hubs_code_and_holds_no_worker_code(hub):
    """images/hub/Dockerfile copies in the hub's code only (test_import_arrows.py reads its
    lines): in the image built from it, the hub's, the dashboard's, the settings' and the
    tutorial sync's modules import, and the GPU machines' code (worker_setup, nvidia-ml-py) and
    the organizer's CLI (deploy.steps) are not there."""
    absent = ("worker_setup", "pynvml", "deploy.steps")
    hub_container = container_of(f"{hub.stack}_hub")
    result = hub_container.exec_run(["python3", "-c", HUB_IMAGE_IMPORTS, *absent], workdir="/")
    assert result.exit_code == 0, result.output.decode()
    found = json.loads(result.output.decode().splitlines()[-1])
    assert found == dict.fromkeys(absent, False)


def test_stack_services_run_with_dnsrr_and_the_network_anchor(hub, hub_settings, client):
    services = {
        s.name: s
        for s in client.services.list(filters={"label": f"com.docker.stack.namespace={hub.stack}"})
    }
    names = ("hub", "proxy", "net-anchor", "tutorial-sync", "prometheus")
    assert set(services) == {f"{hub.stack}_{n}" for n in names}
    for service in services.values():
        assert service.attrs["Spec"]["EndpointSpec"]["Mode"] == "dnsrr"
    assert "Global" in services[f"{hub.stack}_net-anchor"].attrs["Spec"]["Mode"]
    # the servers' network, by its own name, in the range the settings give it
    network = client.networks.get(hub_settings["GPUHUB_NETWORK"])
    assert [c["Subnet"] for c in network.attrs["IPAM"]["Config"]] == ["10.213.0.0/22"]
    assert network.attrs["Driver"] == "overlay" and network.attrs["Attachable"]


def cpu_shares_in_the_kernel(container) -> int:
    """The weight the kernel gives the container's CPU group (cgroup v1), found through its
    first process (an engine's --cgroup-parent does not show in the container's HostConfig)."""
    pid = container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return int(Path("/sys/fs/cgroup/cpu", group.lstrip("/"), "cpu.shares").read_text())
    raise AssertionError(f"no cpu controller in /proc/{pid}/cgroup")


def test_the_hub_and_the_proxy_go_first_on_the_managers_cpu(hub, hub_settings, client):
    """The hub gives its own container and the proxy's GPUHUB_HUB_CPU_SHARES (priority.py) soon
    after it starts; the stack's other containers keep Docker's default weight, 1024."""
    wanted = int(hub_settings["GPUHUB_HUB_CPU_SHARES"])
    assert wanted > 1024

    def of(service):
        label = f"{contract.DOCKER_SERVICE_LABEL}={hub.stack}_{service}"
        (container,) = client.containers.list(filters={"label": label})
        return container

    deadline = time.monotonic() + 30
    while of("proxy").attrs["HostConfig"]["CpuShares"] != wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    for service in ("hub", "proxy"):
        container = of(service)
        assert container.attrs["HostConfig"]["CpuShares"] == wanted, service
        assert cpu_shares_in_the_kernel(container) == wanted, service
    assert cpu_shares_in_the_kernel(of("prometheus")) == 1024


def test_server_holds_exactly_one_gpu_slice_and_is_removed_on_stop(hub, hub_settings, client):
    wait_slices_free()  # servers of earlier tests may still be shutting down
    assert hub.api("POST", f"/users/{USER}").status_code in (201, 409)
    r = hub.api("POST", f"/users/{USER}/server")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER)

    (service,) = client.services.list(filters={"name": SERVICE})
    assert service.name == SERVICE
    held = gpu_reservations(service)
    assert len(held) == 1, f"one GPU kind reserved, got {held}"
    ((uuid, slices),) = held.items()
    assert slices == 1
    assert service.attrs["Spec"]["Labels"]["gpu-jupyterhub.stack"] == hub.stack
    # the demo's limits (auto: sized by this machine and its slices) reach the service
    limits = service.attrs["Spec"]["TaskTemplate"]["Resources"]["Limits"]
    cores = hub_settings["GPUHUB_CPU_LIMIT"]  # auto: "" (no quota)
    assert limits.get("NanoCPUs", 0) == (int(float(cores) * 1e9) if cores else 0), limits
    assert limits["MemoryBytes"] == parse_bytes(hub_settings["GPUHUB_MEM_LIMIT"]), limits
    assert limits["Pids"] == int(hub_settings["GPUHUB_PIDS_LIMIT"]) > 0, limits

    # Swarm counts the slice against that GPU
    gpus = {g.uuid: g for g in build_inventory(client.api.nodes(), client.api.tasks())}
    assert gpus[uuid].used >= 1

    # inside the container: exactly that GPU, and nothing else
    env = container_env(container_of(SERVICE))
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_VISIBLE_DEVICES"] == uuid
    assert env["GPU_UUID"] == uuid and env["GPU_SLICES"] == "1"
    assert env["GPU_SIMULATED"] == ("1" if uuid.startswith("GPU-simulated-") else "0")
    assert gpus[uuid].memory_mb > 0, "the worker setup labels every GPU with its memory"
    assert env["GPU_MEMORY_LIMIT_MB"] == str(gpus[uuid].memory_budget_mb(1))
    other_gpus = [g for g in gpus if g != uuid and any(g in v for v in env.values())]
    assert not other_gpus, f"container env mentions other GPUs: {other_gpus}"
    info = container_of(SERVICE).exec_run(["gpu-info"])
    assert info.exit_code == 0 and uuid in info.output.decode()
    assert f"memory budget: {env['GPU_MEMORY_LIMIT_MB']} MiB" in info.output.decode()

    # the organizer's view lists it, on its machine, with its GPU
    status = subprocess.run(["make", "-s", "status"], cwd=REPO, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    (line,) = [x for x in status.stdout.splitlines() if x.split()[:1] == [SERVICE]]
    assert line.split()[1:2] == [USER] and uuid in line

    # the server answers through the proxy
    status = hub.session.get(f"{hub.url}/user/{USER}/api/status", timeout=30)
    assert status.status_code == 200, status.text

    # stopped, it shuts itself down: its slice is free when the hub answers, and no service
    stop_and_see_its_slices_free(hub, USER)
    assert client.services.list(filters={"name": SERVICE}) == []


def test_a_server_restarted_at_once_is_reachable(hub):
    """Stop and start again within a second: Docker's DNS may still name the old task, so
    the hub must reach the new server by its address (it used to wait 60 s and give up)."""
    user = "ci-restart"
    hub.api("POST", f"/users/{user}")
    for _ in range(2):
        r = hub.api("POST", f"/users/{user}/server")
        assert r.status_code in (201, 202), r.text
        # it used to wait the hub's 60 s http_timeout and give up: well under that now
        elapsed = hub.wait_ready(user, timeout=90)
        assert elapsed < 30, f"the restarted server took {elapsed:.1f} s to be reachable"
        status = hub.session.get(f"{hub.url}/user/{user}/api/status", timeout=30)
        assert status.status_code == 200, status.text
        r = hub.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
        hub.wait_stopped(user)


def test_a_returning_user_goes_back_to_the_machine_with_their_home(hub, client):
    """Home volumes are local to a machine: a restarted server goes back there (when a GPU has
    room) even when spread alone would pick another machine, and finds its files."""
    user, service = "ci-home", "jy-ci-2dhome"
    hub.api("POST", f"/users/{user}")
    assert hub.api("POST", f"/users/{user}/server").status_code in (201, 202)
    hub.wait_ready(user)
    container = container_of(service)
    assert container.exec_run(["sh", "-c", "echo kept > ~/notes.txt"]).exit_code == 0
    (task,) = [t for t in client.services.get(service).tasks() if t["Status"]["State"] == "running"]
    home = client.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
    hub.stop(user)
    wait_slices_free()

    # one slice of each GPU of the home machine taken: spread alone would now go elsewhere
    fillers = [
        client.services.create(
            container.image.tags[0],
            ["sleep", "infinity"],
            name=f"ci-filler-{n}",
            labels={"gpu-jupyterhub.stack": hub.stack},
            resources=docker.types.Resources(generic_resources={uuid: 1}),
        )
        for n, uuid in enumerate(u for u, g in inventory().items() if g.node_name == home)
    ]
    try:
        deadline = time.monotonic() + 60
        while sum(g.used for g in inventory().values()) < len(fillers):
            assert time.monotonic() < deadline, "the fillers did not start"
            time.sleep(0.5)
        # the set-up discriminates: spread alone (no home preference) would go elsewhere now
        gpus = list(inventory().values())
        assert placement.choose(gpus, 1, "spread", seed=user).node_name != home, gpus
        assert hub.api("POST", f"/users/{user}/server").status_code in (201, 202)
        hub.wait_ready(user)
        running = [
            t for t in client.services.get(service).tasks() if t["Status"]["State"] == "running"
        ]
        node = client.nodes.get(running[0]["NodeID"]).attrs["Description"]["Hostname"]
        assert node == home
        assert container_of(service).exec_run(["cat", "/home/jovyan/notes.txt"]).output == b"kept\n"
        hub.stop(user)
    finally:
        for filler in fillers:
            filler.remove()
