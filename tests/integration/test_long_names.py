"""The longest GitHub logins get a server and a home, through the real hub.

GitHub logins have up to 39 letters, digits and single hyphens; dockerspawner escapes each
hyphen to three characters, so ``jy-<login>`` of a hyphen-heavy login is longer than Swarm's
63-character service names (tests/unit/test_naming.py has the rule's cases).
"""

import asyncio
import contextlib
import re
import time
from types import SimpleNamespace

import docker
import pytest

from gpu_swarm_spawner import GPUSwarmSpawner, naming

from .hub import engine_of
from .spawners import make_spawner, remove_services, services_of, wait_slices_free

pytestmark = pytest.mark.integration

HYPHENS = "-".join("abcdefghijklmnopqrst")  # 39 characters, 19 hyphens: escaped, 77
LOGINS = [
    HYPHENS,
    HYPHENS[:-1] + "u",  # the same but for the last character
    "9" * 39,
]
DNS_LABEL = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$")


@pytest.fixture
def stack(hub, hub_settings):
    remove_services(hub.stack)
    wait_slices_free()
    yield hub_settings
    remove_services(hub.stack)


def service_of(client, user: str):
    """The user's service, found by its label (not by the name under test)."""
    services = client.services.list(filters={"label": f"gpu-jupyterhub.user={user}"})
    assert len(services) == 1, [s.name for s in services]
    return services[0]


def running_node(service) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = [t for t in service.tasks() if t["Status"]["State"] == "running"]
        if running:
            return running[0]["NodeID"]
        time.sleep(0.5)
    raise TimeoutError(f"{service.name}: no running task: {[t['Status'] for t in service.tasks()]}")


def remove_volume(engine, name: str, timeout: float = 30) -> None:
    """Remove a home volume once the stopped server's container has let go of it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            engine.volumes.get(name).remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:  # 409: still in use by the exiting container
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_the_longest_logins_get_a_server_and_a_home_through_the_hub(hub, stack):
    client = docker.from_env()
    for user in LOGINS:
        assert hub.api("POST", f"/users/{user}").status_code in (201, 409)
    for user in LOGINS:  # at once, as participants arriving together
        r = hub.api("POST", f"/users/{user}/server")
        assert r.status_code in (201, 202), (user, r.status_code, r.text)

    homes = []
    try:
        names = set()
        for user in LOGINS:
            hub.wait_ready(user)
            escaped = GPUSwarmSpawner._escape(user)
            service = service_of(client, user)
            assert DNS_LABEL.match(service.name) and len(service.name) <= 63, service.name
            assert service.name == naming.service_name(f"jy-{escaped}")
            names.add(service.name)

            engine = engine_of(running_node(service))
            home = engine.volumes.get(f"jy-home-{escaped}")  # raises NotFound if missing
            assert (home.attrs.get("Labels") or {}).get("gpu-jupyterhub.stack") == hub.stack
            homes.append((engine, home.name))

            status = hub.session.get(f"{hub.url}/user/{user}/api/status", timeout=30)
            assert status.status_code == 200, (user, status.text)
        assert len(names) == len(LOGINS), names

        for user in LOGINS:
            hub.stop(user)
            gone = client.services.list(filters={"label": f"gpu-jupyterhub.user={user}"})
            assert gone == [], [s.name for s in gone]
    finally:
        for user in LOGINS:
            hub.api("DELETE", f"/users/{user}/server")
        for engine, name in homes:
            with contextlib.suppress(docker.errors.APIError):  # the home of a failed run
                remove_volume(engine, name)


async def test_named_servers_of_the_longest_logins_get_their_own_services(stack):
    """The hub does not enable named servers; the spawner names them, driven directly."""
    server = "-".join("server") + "-with-a-long-name"
    spawners = [make_spawner(HYPHENS, stack)] + [
        make_spawner(user, stack, orm_spawner=SimpleNamespace(name=server, server=None, state=None))
        for user in LOGINS
    ]
    await asyncio.gather(*(s.start() for s in spawners))
    names = [s.object_name for s in spawners]
    assert len(set(names)) == len(names), names
    assert all(DNS_LABEL.match(n) and len(n) <= 63 for n in names), names
    assert {s.name for s in services_of(stack["GPUHUB_STACK"])} >= set(names)
