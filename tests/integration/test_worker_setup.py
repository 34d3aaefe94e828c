"""worker_setup/setup.sh on a *fresh machine* of the test bed (tests/bed/bed.sh fresh).

The machine is a container with its own root filesystem and its own Docker engine (not started
until setup.sh starts it), a clean copy of the repository (no .venv, no build outputs), no
internet (pip finds nvidia-ml-py in a local wheel directory) and the manager only over the
bed's bridge. The tests run in order on it: bad input first (nothing may change), then a dry
run, the join with the line `make join-command` prints, a placement there, a second run that
changes nothing, and --leave.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import docker
import pytest

from gpu_swarm_spawner.inventory import MEMORY_LABEL, build_inventory

from .hub import BED as BED_ENV
from .hub import BED_MANAGER, BED_RUN, REPO, engine_of
from .spawners import make_spawner, remove_services

pytestmark = pytest.mark.integration

MACHINE = "fresh1"
ROOT = BED_RUN / f"{MACHINE}.root"  # the machine's root filesystem, seen from here
DAEMON_JSON = ROOT / "etc/docker/daemon.json"
PIDFILE = ROOT / "run/docker.pid"
BED = f"{REPO}/tests/bed/bed.sh"
# what the machine's administrator configured before: setup.sh must keep it
OWN_SETTINGS = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}}
# this machine has no GPU: the join line plus simulated ones
SIMULATE = ["--simulate-gpus", "2"]


def bed(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", BED, *args], capture_output=True, text=True, timeout=600)
    if check and result.returncode:
        raise AssertionError(f"bed.sh {' '.join(args)}:\n{result.stdout}{result.stderr}")
    return result


def on_machine(command: str) -> subprocess.CompletedProcess:
    """A shell command on the machine, as root in its copy of the repository (like ssh)."""
    return bed("on", MACHINE, command, check=False)


def setup(*args: str) -> subprocess.CompletedProcess:
    """setup.sh on the machine with the manager's address and token (args may override)."""
    token = docker.from_env().swarm.attrs["JoinTokens"]["Worker"]
    line = ["./worker_setup/setup.sh", "--manager", f"{BED_MANAGER}:2377", "--token", token]
    return on_machine(shlex.join([*line, *args]))


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


def swarm_state(machine: str = MACHINE) -> str:
    """The fresh machine's engine's swarm state; "no engine" before setup.sh started it."""
    try:
        client = docker.DockerClient(f"unix://{BED_RUN / machine}.sock", timeout=10)
        return client.info()["Swarm"]["LocalNodeState"]
    except docker.errors.DockerException:
        return "no engine"


@pytest.fixture(scope="module")
def machine(hub):
    """The fresh machine, with its administrator's own daemon.json; removed afterwards."""
    bed("fresh", MACHINE)
    DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
    DAEMON_JSON.write_text(json.dumps(OWN_SETTINGS, indent=2) + "\n")
    yield
    bed("remove", MACHINE, check=False)


@pytest.fixture(scope="module")
def image_tar(machine):
    """`make image-tar` on the manager, the file copied to the machine (the join line's advice)."""
    return bed("image-tar", MACHINE).stdout.strip().splitlines()[-1]


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    return lines[0]


def test_the_machine_is_fresh(machine):
    """Its own files: no repository venv, no build outputs, no project packages, no engine."""
    assert on_machine("test ! -e .venv && test ! -e test-artifacts").returncode == 0
    assert on_machine("test -e worker_setup/setup.sh && test -e Makefile").returncode == 0
    for module in ("jinja2", "dockerspawner", "docker"):  # the hub's packages are not here
        assert on_machine(f"cd / && python3 -c 'import {module}'").returncode != 0, module
    assert swarm_state() == "no engine"
    assert not ROOT.joinpath(str(REPO).lstrip("/")).exists(), "this machine's files are not there"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--token", "SWMTKN-1-" + "0" * 50 + "-" + "a" * 25], "joining the swarm"),
        (["--token", "not-a-token"], "does not look like a swarm join token"),
        (
            ["--manager", f"{BED_MANAGER}:2999"],
            f"cannot reach the manager at {BED_MANAGER}:2999",
        ),
    ],
)
def test_bad_input_stops_with_one_line_and_changes_nothing(machine, args, says):
    before = DAEMON_JSON.read_bytes()
    error = one_line_error(setup(*SIMULATE, *args))
    assert says in error
    assert DAEMON_JSON.read_bytes() == before
    assert swarm_state() in ("inactive", "no engine")


def test_corrupt_daemon_json_is_refused_and_left_alone(machine):
    original = DAEMON_JSON.read_bytes()
    try:
        DAEMON_JSON.write_text('{"log-driver": "json-file",')
        error = one_line_error(setup(*SIMULATE))
        assert "not valid JSON" in error and "Nothing was changed" in error
        assert DAEMON_JSON.read_text() == '{"log-driver": "json-file",'
    finally:
        DAEMON_JSON.write_bytes(original)
    assert swarm_state() in ("inactive", "no engine")


def test_dry_run_prints_the_plan_and_the_diff_and_changes_nothing(machine, image_tar):
    before = DAEMON_JSON.read_bytes()
    result = setup(*SIMULATE, "--image-tar", image_tar, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"would join the swarm of {BED_MANAGER}:2377" in out
    assert f"would load {image_tar}" in out
    assert '+    "GPU-simulated-' in out and "gpu-jupyterhub.gpu-count=2" in out
    assert "dry run: nothing was changed" in out
    assert DAEMON_JSON.read_bytes() == before
    assert swarm_state() in ("inactive", "no engine")


def join_line() -> str:
    """The line `make join-command` prints for the organizer, run here against the manager."""
    out = subprocess.run(
        ["make", "-s", "join-command"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("sudo ./worker_setup/setup.sh ")]
    assert "--image-tar FILE" in out, "the advice this test follows"
    return line


def test_join_with_the_printed_line_makes_the_slices_usable(machine, image_tar):
    line = join_line()
    assert line.split()[2:5] == ["--manager", f"{BED_MANAGER}:2377", "--token"]
    t0 = time.monotonic()
    # exactly the printed line, plus what it says to add and this machine's simulated GPUs
    result = on_machine(f"{line} --image-tar {image_tar} {shlex.join(SIMULATE)}")
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
    assert node["Status"]["Addr"] == f"{BED_ENV['BED_NET']}.31"  # bed.sh's fresh_addr of fresh1
    labels = node["Description"]["Engine"]["Labels"]
    assert labels["gpu-jupyterhub.gpu-count"] == "2"
    assert labels["gpu-jupyterhub.slices-per-gpu"] == "3"
    assert labels["gpu-jupyterhub.simulated"] == "true"
    assert all(labels[MEMORY_LABEL + g.uuid] == "16384" for g in gpus)
    for step in ("checks", "engine", "swarm", "image", "daemon.json", "restart", "firewall"):
        assert f"\n  {step} " in result.stdout, f"summary row {step} missing:\n{result.stdout}"
    # the machine's own rules for its containers (issue 39), in its own iptables: kept by a
    # container of its engine that comes back with it
    keeper = on_machine(
        "docker inspect -f '{{.State.Running}} {{.HostConfig.RestartPolicy.Name}}' gpuhub-firewall"
    )
    assert keeper.stdout.split() == ["true", "always"], keeper.stdout + keeper.stderr
    deadline = time.monotonic() + 30
    while "GPUHUB-FORWARD" not in (rules := on_machine("iptables -S DOCKER-USER").stdout):
        assert time.monotonic() < deadline, rules
        time.sleep(1)
    forward = on_machine("iptables -S GPUHUB-FORWARD").stdout
    assert "-d 169.254.0.0/16 -j REJECT" in forward, forward
    assert f"-d {BED_MANAGER}/32 -j REJECT" in forward, forward
    # the GPU step ran in a venv of its own holding nvidia-ml-py (and the guard's
    # prometheus-client) only
    packages = on_machine("/opt/gpu-jupyterhub/worker-venv/bin/pip list --format=freeze")
    names = {p.split("==")[0].lower().replace("_", "-") for p in packages.stdout.split()}
    assert names - {"pip", "setuptools"} == {"nvidia-ml-py", "prometheus-client"}, packages.stdout
    print(f"setup.sh join -> slices usable: {elapsed:.1f} s")


SERVER = "jy-ci-2dnewmachine"


async def test_a_server_can_be_placed_on_the_new_machine(machine, hub, hub_settings):
    spawner = make_spawner("ci-newmachine", hub_settings)
    real_read = spawner._read_swarm

    async def only_the_new_machine():
        nodes, tasks = await real_read()
        return [n for n in nodes if n["Description"]["Hostname"] == MACHINE], tasks

    spawner._read_swarm = only_the_new_machine
    await spawner.start()  # it keeps running: the pause and --leave tests need a user there
    assert spawner.holding.node == MACHINE and spawner.object_name == SERVER
    (container,) = server_containers()
    env = dict(line.split("=", 1) for line in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == spawner.holding.gpu
    assert env["GPU_MEMORY_LIMIT_MB"] == str(16384 // 3)


def server_containers() -> list:
    client = engine_of(node_of_machine()["ID"])
    return client.containers.list(filters={"label": f"com.docker.swarm.service.name={SERVER}"})


def test_second_run_changes_nothing(machine, image_tar):
    mtime, pid = DAEMON_JSON.stat().st_mtime, PIDFILE.read_text()
    result = setup(*SIMULATE, "--image-tar", image_tar)
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
    assert swarm_state() == "active", "nothing changed"
    remove_services(hub.stack)


def test_leave_takes_the_machine_out_and_removes_the_gpu_settings(machine):
    result = setup("--leave")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left the swarm" in result.stdout
    assert swarm_state() == "inactive"
    config = json.loads(DAEMON_JSON.read_text())
    assert "node-generic-resources" not in config and "labels" not in config
    assert {k: config.get(k) for k in OWN_SETTINGS} == OWN_SETTINGS, "the machine's own settings"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and machine_gpus():
        time.sleep(0.5)
    assert machine_gpus() == [], "the spawner must not see the machine's GPUs any more"
    # the firewall's keeper and its rules are gone too
    assert "removed gpuhub-firewall and its rules" in result.stdout
    assert on_machine("docker inspect gpuhub-firewall").returncode != 0
    assert "GPUHUB" not in on_machine("iptables -S").stdout
    again = setup("--leave")
    assert again.returncode == 0 and "not in a swarm" in again.stdout


@pytest.mark.parametrize("engine", ["down", "running"])
def test_a_machine_removed_on_the_manager_joins_again_with_the_same_line(
    machine, image_tar, engine
):
    """A sick machine taken out on the manager (`docker node rm --force`) joins again with the
    line it was given, whether it comes back (a reboot: its engine starts again from its old
    state, "pending" in a swarm that no longer knows it) or its engine ran all along (it still
    says "active", and only its log says the manager refuses it). Docker alone refuses the
    first ("already part of a swarm") and takes the second for joined."""
    line = f"{join_line()} --image-tar {image_tar} {shlex.join(SIMULATE)}"
    assert on_machine(line).returncode == 0
    old = node_of_machine()["ID"]
    if engine == "down":
        assert on_machine("kill -9 $(cat /run/docker.pid)").returncode == 0  # it goes down
    docker.from_env().api.remove_node(old, force=True)
    if engine == "running":  # its engine tries the manager again within seconds
        said = f"grep -q 'node {old} was removed from swarm' /var/log/gpu-jupyterhub-dockerd.log"
        deadline = time.monotonic() + 60
        while on_machine(said).returncode != 0:
            assert time.monotonic() < deadline, "the engine never logged its removal"
            time.sleep(2)
        assert swarm_state() == "active"  # what Docker says
    result = on_machine(line)
    assert result.returncode == 0, result.stdout + result.stderr
    stuck = "pending" if engine == "down" else "removed on the manager"
    assert f"forgot the stuck state of a swarm it is no member of ({stuck})" in result.stdout
    node = node_of_machine()
    assert node["ID"] != old and node["Status"]["State"] == "ready"
    assert swarm_state() == "active"
