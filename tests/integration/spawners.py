"""GPUSwarmSpawner instances driven directly against the real swarm (no hub in between).

Their services run ``sleep`` instead of a notebook server: placement, reservations and the
container environment are what these tests look at.
"""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import docker
from jupyterhub.objects import Hub

from gpu_swarm_spawner import GPUSwarmSpawner
from gpu_swarm_spawner.contract import STACK_LABEL, USER_LABEL
from gpu_swarm_spawner.inventory import build_inventory
from gpu_swarm_spawner.tasks import is_live

_ids = itertools.count(1000)


#: The stack label of servers made here carries this after the stack's name: the test stack's
#: hub removes services of its own label that none of its servers owns (keeper.py), as it would
#: leave another hub's alone.
DIRECT = "-direct"


def make_spawner(name: str, settings: dict, **traits) -> GPUSwarmSpawner:
    user = SimpleNamespace(name=name, id=next(_ids), url=f"/user/{name}/")
    traits.setdefault("network_name", settings["GPUHUB_NETWORK"])
    return GPUSwarmSpawner(
        user=user,
        hub=Hub(),
        api_token="unused",
        image=settings["GPUHUB_SINGLEUSER_IMAGE"],
        # extra arguments (--port=...) land in $1.. of sh and are ignored
        cmd=["sh", "-c", "exec sleep infinity", "sleep"],
        probe_server=False,  # nothing listens, and the host cannot resolve service names
        service_labels={STACK_LABEL: settings["GPUHUB_STACK"] + DIRECT},
        **traits,
    )


def inventory():
    client = docker.from_env()
    return {g.uuid: g for g in build_inventory(client.api.nodes(), client.api.tasks())}


def services_of(stack: str) -> list:
    """The servers' services of ``stack``: its hub's and those made here."""
    client = docker.from_env()
    return [
        service
        for value in (stack, stack + DIRECT)
        for service in client.services.list(filters={"label": f"{STACK_LABEL}={value}"})
    ]


def wait_slices_free(timeout: float = 120, on=all) -> None:
    """Until no task holds a GPU slice (``on=any``: on some GPU): servers stopped just before
    have really gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on(g.used == 0 for g in inventory().values()):
            return
        time.sleep(0.3)
    raise TimeoutError(f"GPU slices still held after {timeout} s: {inventory()}")


def service_of(stack: str, user: str):
    """The service of ``user``'s server (default server) in ``stack``."""
    (service,) = [
        s for s in services_of(stack) if s.attrs["Spec"]["Labels"].get(USER_LABEL) == user
    ]
    return service


def stop_and_see_its_slices_free(hub, user: str) -> float:
    """Stop ``user``'s server through the hub's API; once the hub has answered, its slices
    must be free already: the server shut itself down before its service was removed
    (``GPUSwarmSpawner.stop_object``). Removed while running, its task would go on holding
    them for about 3 s. Returns the seconds the stop took."""
    client = docker.from_env()
    service = service_of(hub.stack, user)
    ids = {t["ID"] for t in service.tasks() if t["Status"]["State"] == "running"}
    assert ids, f"{user}'s server is not running: {service.tasks()}"
    t0 = time.monotonic()
    r = hub.api("DELETE", f"/users/{user}/server")
    took = time.monotonic() - t0
    assert r.status_code == 204, (r.status_code, r.text)  # done (202: still stopping)
    holding = [t["Status"] for t in client.api.tasks() if t["ID"] in ids and is_live(t)]
    assert not holding, f"{user}'s stopped server still holds its slices: {holding}"
    assert service.id not in {s.id for s in services_of(hub.stack)}, "its service is left"
    return took


def remove_services(stack: str, timeout: float = 60) -> None:
    """Remove the stack's user services and wait until their tasks have stopped.

    Until then Swarm still counts their slices, and so does the inventory.
    """
    client = docker.from_env()
    removed = {service.id for service in services_of(stack)}
    for service in services_of(stack):
        service.remove()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [t for t in client.api.tasks() if t["ServiceID"] in removed]
        if not any(t["Status"]["State"] in ("running", "starting", "preparing") for t in left):
            return
        time.sleep(0.3)
    raise TimeoutError(f"tasks of removed services still running after {timeout} s")
