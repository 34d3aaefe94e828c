"""What a participant reaches from inside their server, as uid 1000 in a shell there
(docs/participants.md): the hub's public paths through the proxy, and nothing else of the stack,
the swarm's machines, the other participants' servers or the cloud's metadata address.

Each address is tried from two places on the same machine: the participant's server, and a
container there without the server's firewall (the stack's net-anchor, which runs the same
image on the same network): where the second reaches an address and the first does not, the
firewall is what stands between, not a missing listener. The bed plays the cloud's instance
metadata service: 169.254.169.254 on its bridge, answering HTTP as a cloud's does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from gpu_swarm_spawner.contract import DISK_WATCH_PORT

from .hub import BED, container_of, engine_of
from .spawners import make_spawner, service_of, wait_slices_free

pytestmark = pytest.mark.integration

METADATA = "169.254.169.254"
USERS = ("reach-ann", "reach-bob")

#: tried from inside a container: each HOST:PORT's answer, as JSON (a name it cannot look up,
#: a connection refused or rejected, none in time, or open)
PROBE = """
import json, socket, sys
seen = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        seen[target] = "open"
    except socket.gaierror:
        seen[target] = "no name"
    except TimeoutError:
        seen[target] = "timeout"
    except OSError as e:
        seen[target] = "refused" if e.errno else str(e)
    finally:
        s.close()
print(json.dumps(seen))
"""


#: /proc/PID/status of the server's own process (jupyterhub-singleuser's), printed
SERVER_STATUS = """
import pathlib
for proc in sorted(pathlib.Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
    try:
        if b"jupyterhub-singleuser" in (proc / "cmdline").read_bytes():
            print((proc / "status").read_text())
            break
    except OSError:
        pass
"""


@pytest.fixture(scope="module")
def metadata_service():
    """The cloud's instance metadata service, as the bed's machines reach it: 169.254.169.254
    on the bed's bridge (their default route), port 80."""
    bridge = BED["BED_BRIDGE"]
    subprocess.run(["ip", "addr", "add", f"{METADATA}/32", "dev", bridge], check=False)
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", METADATA, "80"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).parent,
    )
    time.sleep(0.5)
    yield f"{METADATA}:80"
    server.terminate()
    server.wait(10)
    subprocess.run(["ip", "addr", "del", f"{METADATA}/32", "dev", bridge], check=False)


def probe(container, targets: list[str], user: str) -> dict[str, str]:
    result = container.exec_run(["python3", "-c", PROBE, *targets], user=user)
    assert result.exit_code == 0, result.output.decode()
    return json.loads(result.output.decode().splitlines()[-1])


def anchor_beside(container, stack: str):
    """The stack's net-anchor container on the same machine as ``container``."""
    engine = engine_of(container_node(container))
    (anchor,) = engine.containers.list(
        filters={"label": f"com.docker.swarm.service.name={stack}_net-anchor"}
    )
    return anchor


def container_node(container) -> str:
    return container.labels["com.docker.swarm.node.id"]


def task_address(service, network: str) -> str:
    (task,) = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    for attachment in task["NetworksAttachments"]:
        if attachment["Network"]["Spec"]["Name"] == network:
            return attachment["Addresses"][0].split("/")[0]
    raise AssertionError(f"{service.name} has no address on {network}")


def machine_addresses() -> list[str]:
    """The addresses of the swarm's machines that are up."""
    nodes = [n for n in docker.from_env().nodes.list() if n.attrs["Status"]["State"] == "ready"]
    return sorted({n.attrs["Status"]["Addr"] for n in nodes} - {"0.0.0.0"})


@pytest.fixture(scope="module")
def servers(hub, hub_settings):
    """ann's and bob's servers, started through the hub, and two more made by the spawner
    directly (running ``sleep`` behind the same firewall), one on the manager and one on a GPU
    machine, so that both kinds of machine are tried whatever the placement gave ann."""
    wait_slices_free()
    for user in USERS:
        assert hub.api("POST", f"/users/{user}").status_code in (201, 202, 409)
        r = hub.api("POST", f"/users/{user}/server")
        assert r.status_code in (201, 202), r.text
    for user in USERS:
        hub.wait_ready(user)
    direct = {name: placed_on(name, hostname, hub_settings) for name, hostname in PLACED.items()}
    yield {
        **{user: service_of(hub.stack, user) for user in USERS},
        **{name: docker.from_env().services.get(s.object_id) for name, s in direct.items()},
    }
    for spawner in direct.values():
        asyncio.run(spawner.stop(now=True))
    for user in USERS:
        hub.stop(user)


#: the servers made directly, by the machine they must run on
PLACED = {"reach-on-manager": "manager", "reach-on-w1": "w1"}


def placed_on(name: str, hostname: str, hub_settings):
    """A server of the spawner's own making (spawners.make_spawner), on ``hostname``."""
    spawner = make_spawner(name, hub_settings)
    real_read = spawner._read_swarm

    async def only_that_machine():
        nodes, tasks = await real_read()
        return [n for n in nodes if n["Description"]["Hostname"] == hostname], tasks

    spawner._read_swarm = only_that_machine
    asyncio.run(spawner.start())
    assert spawner.holding.node == hostname
    return spawner


def targets_of(hub_settings, servers, metadata: str) -> list[str]:
    """Every address the issue names, as HOST:PORT, from ann's server's point of view."""
    network = hub_settings["GPUHUB_NETWORK"]
    bob = task_address(servers["reach-bob"], network)
    return [
        metadata,
        f"{bob}:8888",  # another participant's server
        "hub:8081",  # the hub's own port (its API, without the proxy)
        "proxy:8001",  # the proxy's API
        "proxy:8000",  # the proxy's public port: the one way in
        "prometheus:9090",
        f"{BED['BED_MANAGER_ADDR']}:2377",  # the manager's Swarm port
        *(f"{addr}:7946" for addr in machine_addresses()),  # every machine's Swarm gossip
        *watches(),  # every machine's disk watch (the hub reads it)
    ]


def watches() -> list[str]:
    """Every machine's disk watch, HOST:PORT (worker_setup/disk_watch.py)."""
    return [f"{addr}:{DISK_WATCH_PORT}" for addr in machine_addresses()]


#: what the stack's containers reach over the servers' network, where only the server's own
#: firewall stops a participant
OVERLAY = ("8888", "hub:8081", "proxy:8001")


def on_machine(targets: list[str]) -> list[str]:
    """The targets that leave the container through its machine (the metadata address and the
    machines' own ports), where the machine's rules stop every container."""
    return [
        t
        for t in targets
        if not t.endswith((*OVERLAY, f":{DISK_WATCH_PORT}")) and not t.startswith(("proxy", "prom"))
    ]


def keeper_of(container):
    """The firewall's keeper on ``container``'s machine (worker_setup/host_firewall.py)."""
    return engine_of(container_node(container)).containers.get("gpuhub-firewall")


@pytest.mark.parametrize("who", ["reach-ann", *PLACED])
def test_a_participant_reaches_the_proxy_and_nothing_else(
    hub, hub_settings, servers, metadata_service, who
):
    """From a participant's shell (ann's, and one on each kind of machine): the proxy's public
    port, nothing else. Beside it on the same machine, a container without the server's
    firewall (net-anchor) reaches the stack's ports over the servers' network, so the server's
    firewall is what stops the participant there; the machine's own rules stop both at the
    metadata address and the machines' ports, which the machine itself reaches (its firewall's
    keeper shares its network)."""
    ann = container_of(servers[who].name)
    targets = targets_of(hub_settings, servers, metadata_service)
    server = probe(ann, targets, "jovyan")
    beside = probe(anchor_beside(ann, hub.stack), targets, "root")
    machine = probe(keeper_of(ann), on_machine(targets), "root")
    assert server.pop("proxy:8000") == beside.pop("proxy:8000") == "open"
    assert all(answer != "open" for answer in server.values()), server
    assert server["prometheus:9090"] == beside["prometheus:9090"] == "no name"
    for target in targets:
        if target.endswith(OVERLAY):
            assert beside[target] == "open", (target, beside)
    for target in on_machine(targets):
        assert beside[target] != "open", (target, beside)
        assert machine[target] == "open", (target, machine)
    # the disk watches answer the machines (the hub reads them from the manager), not her
    assert set(probe(keeper_of(ann), watches(), "root").values()) == {"open"}


def test_each_layer_holds_without_the_other(hub, hub_settings, servers, metadata_service):
    """With the machine's rules taken out (the keeper stopped, its rules removed), the server's
    own firewall still stops ann at the metadata address and the machines; the container beside
    her then reaches them. Started again, the keeper puts the rules back."""
    ann = container_of(servers["reach-ann"].name)
    anchor = anchor_beside(ann, hub.stack)
    keeper = keeper_of(ann)
    machine = on_machine(targets_of(hub_settings, servers, metadata_service))
    env = dict(e.split("=", 1) for e in keeper.attrs["Config"]["Env"] if "=" in e)
    keeper.stop(timeout=5)
    try:
        removed = keeper.client.containers.run(
            keeper.attrs["Config"]["Image"],
            ["host-remove"],
            entrypoint="gpuhub-firewall",
            environment={k: env[k] for k in ("GPUHUB_HOST_RULES", "GPUHUB_HOST_HOOKS")},
            network_mode="host",
            cap_add=["NET_ADMIN"],
            user="0",
            remove=True,
            stderr=True,
        )
        assert b"removed" in removed, removed
        assert probe(anchor, machine, "root") == dict.fromkeys(machine, "open")
        server = probe(ann, machine, "jovyan")
        assert all(answer != "open" for answer in server.values()), server
    finally:
        keeper.start()
    deadline = time.monotonic() + 30
    while probe(anchor, machine[:1], "root")[machine[0]] == "open":
        assert time.monotonic() < deadline, "the keeper did not put the rules back"
        time.sleep(1)


def test_both_layers_are_back_after_the_machines_engine_restarts(
    hub, hub_settings, servers, metadata_service, bed
):
    """The engine of ann's machine restarted (as an upgrade or a reboot does): her server comes
    back with its firewall, the keeper with the machine's rules."""
    ann = container_of(servers["reach-ann"].name)
    engine = engine_of(container_node(ann))
    name = engine.info()["Name"]
    bed("restart", name)
    deadline = time.monotonic() + 180
    while True:
        try:
            ann = container_of(servers["reach-ann"].name)
            keeper = keeper_of(ann)
            if keeper.status == "running" and ann.id:
                break
        except (AssertionError, docker.errors.DockerException, ValueError):
            pass
        assert time.monotonic() < deadline, f"ann's server did not come back on {name}"
        time.sleep(2)
    hub.wait_ready("reach-ann", timeout=120)
    targets = targets_of(hub_settings, servers, metadata_service)
    server = probe(ann, targets, "jovyan")
    assert server.pop("proxy:8000") == "open"
    assert all(answer != "open" for answer in server.values()), server
    deadline = time.monotonic() + 30
    beside = {}
    while time.monotonic() < deadline:  # the keeper writes the rules as it starts
        beside = probe(anchor_beside(ann, hub.stack), on_machine(targets), "root")
        if all(answer != "open" for answer in beside.values()):
            break
        time.sleep(1)
    assert all(answer != "open" for answer in beside.values()), beside


def test_a_participant_cannot_change_their_servers_firewall(servers):
    """The server runs as uid 1000 with no capabilities, none left in its bounding set and no
    way to gain any: its rules cannot be changed or flushed from a shell there."""
    ann = container_of(servers["reach-ann"].name)
    status = ann.exec_run(["python3", "-c", SERVER_STATUS]).output.decode()
    lines = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert lines["Uid"].split()[0] == "1000", lines["Uid"]
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        assert int(lines[cap].strip(), 16) == 0, (cap, lines[cap])
    assert lines["NoNewPrivs"].strip() == "1"
    for command in (["iptables", "-F"], ["iptables", "-P", "OUTPUT", "ACCEPT"]):
        tried = ann.exec_run(command, user="jovyan")
        assert tried.exit_code != 0, (command, tried.output)
    rules = ann.exec_run(["iptables", "-S", "OUTPUT"], user="root").output.decode()
    assert f"-d {METADATA.rsplit('.', 2)[0]}.0.0/16 -j REJECT" in rules, rules
