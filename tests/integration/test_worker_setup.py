"""worker_setup/setup.sh on a fresh machine of the test bed (namespace w3, its own dockerd).

The tests run in order on one machine: bad input first (nothing may change), then a dry run,
the join, a placement there, a second run that changes nothing, and --leave.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import docker
import pytest

from gpu_swarm_spawner.inventory import MEMORY_LABEL, build_inventory

from .hub import REPO, engine_of
from .spawners import make_spawner, remove_services

pytestmark = pytest.mark.integration

MACHINE, ADDRESS = "w3", "10.199.0.13"
DAEMON_JSON = Path(f"/etc/docker/{MACHINE}.json")
PIDFILE = Path(f"/var/run/docker-{MACHINE}.pid")
WORKERS = f"{REPO}/tests/bed/workers.sh"
JOIN = ["--advertise-addr", ADDRESS, "--simulate-gpus", "2", "--machine-id", f"bed-{MACHINE}"]


def workers(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", WORKERS, *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode:
        raise AssertionError(f"workers.sh {' '.join(args)}:\n{result.stdout}{result.stderr}")
    return result


def setup(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    """setup.sh on the machine, with the swarm's address and token unless args override."""
    return workers("setup", MACHINE, *args, check=check)


def node_of_machine() -> dict | None:
    client = docker.from_env()
    nodes = [n for n in client.api.nodes() if n["Description"]["Hostname"] == MACHINE]
    # a machine that joined again has a new node; the old one stays "down" until removed
    nodes.sort(key=lambda n: n["Status"]["State"] != "ready")
    return nodes[0] if nodes else None


def machine_gpus() -> list:
    client = docker.from_env()
    return [
        g for g in build_inventory(client.api.nodes(), client.api.tasks()) if g.node_name == MACHINE
    ]


@pytest.fixture(scope="module")
def machine(hub):
    """A fresh machine: its own engine in namespace w3, not in the swarm; removed afterwards."""
    workers("remove", MACHINE, check=False)
    workers("machine", MACHINE)
    yield
    workers("remove", MACHINE, check=False)


@pytest.fixture(scope="module")
def image_tar(tmp_path_factory, hub_settings):
    tar = tmp_path_factory.mktemp("image") / "singleuser.tar"
    subprocess.run(
        f"docker save {hub_settings['GPUHUB_SINGLEUSER_IMAGE']} > {tar}", shell=True, check=True
    )
    return str(tar)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    return lines[0]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--token", "SWMTKN-1-" + "0" * 50 + "-" + "a" * 25], "joining the swarm"),
        (["--token", "not-a-token"], "does not look like a swarm join token"),
        (["--manager", "10.199.0.1:2999"], "cannot reach the manager at 10.199.0.1:2999"),
    ],
)
def test_bad_input_stops_with_one_line_and_changes_nothing(machine, args, says):
    before = DAEMON_JSON.read_bytes()
    error = one_line_error(setup(*JOIN, *args))
    assert says in error
    assert DAEMON_JSON.read_bytes() == before
    assert engine_state() == "inactive"


def test_corrupt_daemon_json_is_refused_and_left_alone(machine):
    original = DAEMON_JSON.read_bytes()
    try:
        DAEMON_JSON.write_text('{"data-root": "/var/lib/docker-w3",')
        error = one_line_error(setup(*JOIN))
        assert "not valid JSON" in error and "Nothing was changed" in error
        assert DAEMON_JSON.read_text() == '{"data-root": "/var/lib/docker-w3",'
    finally:
        DAEMON_JSON.write_bytes(original)
    assert engine_state() == "inactive"


def engine_state() -> str:
    return docker.DockerClient(f"unix:///var/run/docker-{MACHINE}.sock").info()["Swarm"][
        "LocalNodeState"
    ]


def test_dry_run_prints_the_plan_and_the_diff_and_changes_nothing(machine, image_tar):
    before = DAEMON_JSON.read_bytes()
    result = setup(*JOIN, "--image-tar", image_tar, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "would join the swarm of 10.199.0.1:2377" in out
    assert f"would load {image_tar}" in out
    assert '+    "GPU-simulated-' in out and "gpu-jupyterhub.gpu-count=2" in out
    assert "dry run: nothing was changed" in out
    assert DAEMON_JSON.read_bytes() == before
    assert engine_state() == "inactive"


def join_command() -> list[str]:
    """The arguments of the line `make join-command` prints for the organizer."""
    out = subprocess.run(
        ["make", "-s", "join-command"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("sudo ./worker_setup/setup.sh ")]
    return line.split()[2:]


def test_join_makes_the_slices_usable(machine, image_tar):
    args = join_command()
    assert args[:2] == ["--manager", "10.199.0.1:2377"] and args[2] == "--token"
    t0 = time.monotonic()
    result = setup(*args, *JOIN, "--image-tar", image_tar)
    assert result.returncode == 0, result.stdout + result.stderr
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(machine_gpus()) < 2:
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    gpus = machine_gpus()
    assert [g.slices for g in gpus] == [3, 3], f"slices seen by the spawner: {gpus}"
    assert all(g.simulated and g.free == 3 for g in gpus)
    node = node_of_machine()
    assert node["Status"]["State"] == "ready"
    labels = node["Description"]["Engine"]["Labels"]
    assert labels["gpu-jupyterhub.gpu-count"] == "2"
    assert labels["gpu-jupyterhub.slices-per-gpu"] == "3"
    assert labels["gpu-jupyterhub.simulated"] == "true"
    assert all(labels[MEMORY_LABEL + g.uuid] == "16384" for g in gpus)
    for step in ("checks", "engine", "swarm", "image", "daemon.json", "restart"):
        assert f"\n  {step} " in result.stdout, f"summary row {step} missing:\n{result.stdout}"
    print(f"setup.sh join -> slices usable: {elapsed:.1f} s")


SERVER = "jy-ci-2dnewmachine"


async def test_a_server_can_be_placed_on_the_new_machine(machine, hub, hub_settings):
    spawner = make_spawner("ci-newmachine", hub_settings)
    real_inventory = spawner.gpu_inventory

    async def only_the_new_machine():
        return [g for g in await real_inventory() if g.node_name == MACHINE]

    spawner.gpu_inventory = only_the_new_machine
    await spawner.start()  # it keeps running: the pause and --leave tests need a user there
    assert spawner.gpu_node == MACHINE and spawner.object_name == SERVER
    (container,) = server_containers()
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == spawner.gpu_uuid
    assert env["GPU_MEMORY_LIMIT_MB"] == str(16384 // 3)


def server_containers() -> list:
    client = engine_of(node_of_machine()["ID"])
    return client.containers.list(filters={"label": f"com.docker.swarm.service.name={SERVER}"})


def test_second_run_changes_nothing(machine, image_tar):
    mtime, pid = DAEMON_JSON.stat().st_mtime, PIDFILE.read_text()
    result = setup(*JOIN, "--image-tar", image_tar)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nothing to change: this machine is already set up" in result.stdout
    assert DAEMON_JSON.stat().st_mtime == mtime
    assert PIDFILE.read_text() == pid, "the engine was restarted"


def test_pause_node_keeps_running_servers_and_takes_no_new_ones(machine):
    (before,) = server_containers()
    subprocess.run(["make", "-s", "pause-node", f"NODE={MACHINE}"], cwd=REPO, check=True)
    try:
        assert node_of_machine()["Spec"]["Availability"] == "pause"
        assert machine_gpus() == [], "the spawner must not choose a paused machine"
        time.sleep(3)
        (after,) = server_containers()
        assert after.id == before.id and after.status == "running"
    finally:
        subprocess.run(["make", "-s", "resume-node", f"NODE={MACHINE}"], cwd=REPO, check=True)
    assert len(machine_gpus()) == 2


def test_leave_lists_running_servers_and_stops(machine, hub):
    error = one_line_error(setup("--leave"))
    assert SERVER in error and f"make pause-node NODE={MACHINE}" in error
    assert engine_state() == "active", "nothing changed"
    remove_services(hub.stack)


def test_leave_takes_the_machine_out_and_removes_the_gpu_settings(machine):
    result = setup("--leave")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left the swarm" in result.stdout
    assert engine_state() == "inactive"
    config = json.loads(DAEMON_JSON.read_text())
    assert "node-generic-resources" not in config and "labels" not in config
    assert config["data-root"] == "/var/lib/docker-w3", "the machine's own settings stay"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and machine_gpus():
        time.sleep(0.5)
    assert machine_gpus() == [], "the spawner must not see the machine's GPUs any more"
    again = setup("--leave")
    assert again.returncode == 0 and "not in a swarm" in again.stdout
