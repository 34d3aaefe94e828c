"""A workshop's first minute through the real hub: more participants than GPU slices.

On the bed (3 nodes x 2 simulated GPUs x 3 slices = 18 slices), 20 participants start at once.
The same servers then live through a hub restart and the loss of a worker machine.
"""

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import docker
import pytest

from .hub import container_env, container_of
from .spawners import inventory, remove_services, wait_slices_free

pytestmark = pytest.mark.integration

CROWD = [f"ci-crowd-{i:02d}" for i in range(20)]
REFUSAL = "All GPU slices are in use"


def request_server(hub, user):
    t0 = time.monotonic()
    r = hub.api("POST", f"/users/{user}/server")
    return user, r.status_code, time.monotonic() - t0, r.json().get("message", "") if r.text else ""


def servers_by_service(stack):
    """{service name: (node hostname, GPU, slices, container id)} of the stack's user servers;
    the GPU and slices are what the service reserves in Swarm (not the spawner's labels)."""
    client = docker.from_env()
    out = {}
    for service in client.services.list(filters={"label": f"gpu-jupyterhub.stack={stack}"}):
        resources = service.attrs["Spec"]["TaskTemplate"]["Resources"]
        (reserved,) = [
            r["DiscreteResourceSpec"] for r in resources["Reservations"]["GenericResources"]
        ]
        (task,) = [t for t in service.tasks() if t["DesiredState"] == "running"]
        node = client.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]
        container = task["Status"].get("ContainerStatus", {}).get("ContainerID", "")
        out[service.name] = (node, reserved["Kind"], reserved["Value"], container)
    return out


def hub_container(stack):
    """The id of the hub's running container."""
    service = docker.from_env().services.get(f"{stack}_hub")
    (task,) = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    return task["Status"]["ContainerStatus"]["ContainerID"]


@pytest.fixture(scope="module")
def crowd(hub):
    remove_services(hub.stack)
    wait_slices_free()  # servers of earlier tests may still be shutting down
    r = hub.api("POST", "/users", json={"usernames": CROWD})
    assert r.status_code in (201, 409), r.text
    capacity = sum(g.free for g in inventory().values())
    with ThreadPoolExecutor(len(CROWD)) as pool:
        answers = list(pool.map(lambda u: request_server(hub, u), CROWD))
    ready, refused = [], []
    for user, status, _, message in answers:
        if status in (201, 202):
            hub.wait_ready(user, timeout=180)
            ready.append(user)
        else:
            refused.append((user, status, message))
    yield {"capacity": capacity, "ready": ready, "refused": refused, "answers": answers}
    for user in CROWD:
        hub.api("DELETE", f"/users/{user}/server")
    for user in CROWD:
        hub.wait_stopped(user, timeout=120)


def test_twenty_at_once_fill_every_slice_and_never_oversubscribe(hub, crowd):
    capacity = crowd["capacity"]
    assert capacity == 18, "the bed has 3 nodes x 2 GPUs x 3 slices"
    assert len(crowd["ready"]) == capacity, crowd["refused"]
    assert len(crowd["refused"]) == len(CROWD) - capacity
    for _, status, message in crowd["refused"]:
        assert status == 503 and REFUSAL in message, (status, message)

    servers = servers_by_service(hub.stack)
    assert len(servers) == capacity
    per_gpu = Counter()
    for _, uuid, slices, _ in servers.values():
        per_gpu[uuid] += slices
    gpus = inventory()
    assert all(per_gpu[u] <= gpus[u].slices for u in per_gpu), per_gpu
    # and each container sees exactly the GPU its service reserved
    for name, (_, uuid, _, _) in servers.items():
        assert container_env(container_of(name))["NVIDIA_VISIBLE_DEVICES"] == uuid


def test_one_more_participant_is_refused_in_under_two_seconds(hub, crowd):
    user = "ci-crowd-late"
    hub.api("POST", f"/users/{user}")
    _, status, elapsed, message = request_server(hub, user)
    assert status == 503 and REFUSAL in message, (status, message)
    assert elapsed < 2, f"refusal took {elapsed:.2f} s"
    assert hub.server(user) is None
    services = docker.from_env().services.list(filters={"name": "jy-ci-2dcrowd-2dlate"})
    assert services == []


def test_servers_survive_a_hub_restart(hub, crowd):
    before = servers_by_service(hub.stack)
    hub_before = hub_container(hub.stack)
    service = docker.from_env().services.get(f"{hub.stack}_hub")
    service.force_update()
    time.sleep(2)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the new hub answers and has loaded every server
        try:
            if all(hub.server(u) and hub.server(u)["ready"] for u in crowd["ready"]):
                break
        except Exception:  # the hub is restarting
            pass
        time.sleep(1)
    else:
        pytest.fail("the restarted hub did not report every server ready")
    assert hub_container(hub.stack) != hub_before, "the hub did not restart"
    # same node, GPU, slices and container: no server moved, restarted or vanished
    assert servers_by_service(hub.stack) == before
    for user in crowd["ready"]:
        r = hub.session.get(f"{hub.url}/user/{user}/api/status", timeout=30)
        assert r.status_code == 200, (user, r.status_code)


def test_servers_of_a_vanished_worker_are_reported_stopped(hub, crowd, bed):
    servers = servers_by_service(hub.stack)
    on_w1 = {
        n.split("jy-", 1)[1].replace("-2d", "-")
        for n, (node, _, _, _) in servers.items()
        if node == "w1"
    }
    assert on_w1, servers
    others = set(crowd["ready"]) - on_w1
    bed("stop", "w1")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(hub.server(u) is None for u in on_w1):
                break
            time.sleep(2)
        else:
            pytest.fail(f"servers on w1 still reported running: {on_w1}")
        assert all(hub.server(u) and hub.server(u)["ready"] for u in others)
    finally:
        bed("up", "2")
