"""``python -m worker_setup`` (what worker_setup/setup.sh runs): the join checklist and --leave,
with the Docker engine faked at its one edge (``DockerCLI``'s methods) and everything else
real: daemon.json in tmp_path, the manager's swarm port a listening socket here, the manager's
registry a local HTTP server, GPUs from fake-NVML fixtures or simulated."""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_swarm_spawner import capacity, contract
from tests.fakes.nvml import imported, shim_env
from worker_setup import engine, join, shared_folders
from worker_setup.__main__ import main, parse_args
from worker_setup.docker_cli import DockerCLI

from .clusters import node_from_daemon_json
from .nvml_failures import FIXTURES, K80X2

TOKEN = "SWMTKN-1-3pu6hszjas19xyp7ghgosyx9k8atbfcr8p2is99znpy26u2lkl-1awxwuwd3z9j1z3puu7rcgdbx"
IMAGE = "gpu-jupyterhub/singleuser:latest"
OWN = {"log-driver": "json-file", "log-opts": {"max-size": "10m"}}  # the administrator's
WATCH = ("run", "watch --port 9446")  # the disk watch


class FakeEngine:
    """The Docker engine as DockerCLI shows it, in memory. ``changes`` records every call that
    would change the machine, in order."""

    def __init__(self, up=True, swarm="inactive", managers=(), images=None, servers=()):
        self.up, self.swarm, self.managers = up, swarm, list(managers)
        self.images = dict(images or {})  # name -> id
        self.servers = list(servers)  # Swarm service names of the running containers
        self.pullable: dict[str, str] = {}  # what a pull gets: name -> id
        self.tar: tuple[str, str] = (IMAGE, "sha256:" + "b" * 64)  # what a load gets
        self.join_error = ""
        self.node_id = "w7node" if swarm != "inactive" else ""
        self.log = ""  # what the engine logged lately
        self.leave_errors: list[str] = []  # what its next leaves answer
        self.containers: dict[str, dict] = {}  # name -> what `docker container inspect` says
        self.runs: list[list[str]] = []  # each `docker run`'s arguments
        self.run_errors: dict[str, str] = {}  # what `docker run --name NAME` answers
        self.changes: list[tuple] = []

    def running(self):
        return self.up

    def ensure_running(self, log):
        self.changes.append(("start",))
        self.up = True
        return True

    def restart(self):
        self.changes.append(("restart",))

    def info(self):
        if not self.up:
            return {}
        managers = [{"NodeID": "m1", "Addr": a} for a in self.managers] or None
        swarm = {"LocalNodeState": self.swarm, "RemoteManagers": managers, "NodeID": self.node_id}
        return {"Name": "gpu-7", "Swarm": swarm}

    def recent_log(self):
        return self.log

    def server_version(self):
        return "20.10.24"

    def image_id(self, image):
        return self.images.get(image, "")

    def service_containers(self):
        return [*self.servers, "gpuhub_net-anchor"]

    def container(self, name):
        return self.containers.get(name)

    def run_container(self, *args):
        """``docker run``: a detached, named container is kept (its labels, image and
        environment as inspect shows them); a --rm one only recorded, as ("run", what its image
        runs: the words after it)."""
        words = list(args)
        image = next(i for i, w in enumerate(words) if w.startswith("--entrypoint=")) + 1
        self.changes.append(("run", " ".join(words[image + 1 :])))
        self.runs.append(words)
        values = lambda flag: [words[i + 1] for i, w in enumerate(words) if w == flag]  # noqa: E731
        error = self.run_errors.get((values("--name") or [""])[0])
        if error:
            return error
        if "--detach" in words:
            self.containers[values("--name")[0]] = {
                "Config": {
                    "Image": words[image],
                    "Labels": dict(v.split("=", 1) for v in values("--label")),
                    "Env": values("--env"),
                },
                "State": {"Running": True},
            }
        return ""

    def remove_container(self, name):
        self.changes.append(("rm", name))
        self.containers.pop(name, None)
        return ""

    def swarm_join(self, token, manager, advertise_addr=""):
        self.changes.append(("join", manager, advertise_addr))
        if self.join_error:
            return self.join_error
        self.swarm, self.managers = "active", [manager]
        return ""

    def swarm_leave(self):
        self.changes.append(("leave",))
        if self.leave_errors:
            return self.leave_errors.pop(0)
        self.swarm, self.servers = "inactive", []
        return ""

    def load(self, tar):
        self.changes.append(("load", tar))
        self.images[self.tar[0]] = self.tar[1]
        return ""

    def pull(self, image):
        self.changes.append(("pull", image))
        if image not in self.pullable:
            return f"Error response from daemon: pull access denied for {image}"
        self.images[image] = self.pullable[image]
        return ""


@pytest.fixture
def manager():
    """The manager's swarm port: something listens on it."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield f"127.0.0.1:{listening.getsockname()[1]}"


@pytest.fixture
def nobody():
    """An address where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def guard_files(tmp_path, monkeypatch):
    """The GPU guard's pid file and log in tmp_path (never this machine's /var/run)."""
    files = {
        "GPUHUB_GUARD_PIDFILE": str(tmp_path / "guard.pid"),
        "GPUHUB_GUARD_LOG": str(tmp_path / "guard.log"),
    }
    for key, value in files.items():
        monkeypatch.setenv(key, value)
    return files


@pytest.fixture
def daemon_json(tmp_path):
    path = tmp_path / "etc" / "daemon.json"
    path.parent.mkdir()
    path.write_text(json.dumps(OWN, indent=2) + "\n")
    return path


def setup(engine, daemon_json, manager, *args, simulate=True, nvml=None):
    """``python -m worker_setup --manager ... --token ... ARGS``; its exit status. ``nvml``: a
    fixture, NVML the fake over it, for the join here and the guard it starts (shim_env)."""
    line = ["--manager", manager, "--token", TOKEN, "--nvidia-runtime", "off", "--machine-id", "t"]
    line += ["--image", IMAGE]
    if simulate:
        line += ["--simulate-gpus", "2"]
    environ = {"GPUHUB_DAEMON_JSON": str(daemon_json)}
    # the guard it starts talks to the engine the test names, never this machine's own
    passed_on = ("GPUHUB_GUARD_", "DOCKER_HOST")
    environ.update((k, v) for k, v in os.environ.items() if k.startswith(passed_on))
    if not nvml:
        return main([*line, *args], docker=engine, environ=environ)
    with imported(nvml):
        return main([*line, *args], docker=engine, environ=shim_env(nvml, environ))


def leave(engine, daemon_json, *args, **machine):
    parsed = parse_args(["--leave", *args])
    m = join.Machine(parsed, engine, daemon_json, **machine)
    return join.run(m)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def summary(out: str) -> dict[str, str]:
    """The summary table's rows: {step: result}."""
    table = out.split("\n  step         result\n", 1)[1].split("\n\n", 1)[0]
    return {line[2:14].strip(): line[15:] for line in table.splitlines()}


# ---- joining --------------------------------------------------------------------------------


def test_a_fresh_machine_joins_and_a_second_run_changes_nothing(daemon_json, manager, capsys):
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    assert setup(engine, daemon_json, manager) == 0
    out = capsys.readouterr().out
    assert engine.changes == [
        ("start",),
        ("join", manager, ""),
        ("pull", IMAGE),
        ("restart",),
        ("run", "host"),  # the firewall's keeper
        WATCH,
    ]
    assert summary(out) == {
        "checks": f"root, python3, {daemon_json}, manager {manager} answers",
        "shared": "no shared folders named in the join line",
        "engine": "started (20.10.24)",
        "gpus": "2 GPU(s): 2 Simulated GPU 16384 MiB -> 3 slices (SIMULATED)",
        "swarm": f"joined the swarm of {manager}",
        "image": f"pulled {IMAGE}",
        "daemon.json": "slices and labels written (backup kept)",
        "restart": "engine restarted",
        "guard": "not running (simulated GPUs: no NVML to read)",
        "firewall": "started gpuhub-firewall (containers here reach no metadata address, "
        "manager or port of this machine)",
        "disk": "started gpuhub-disk (servers' homes and writable layers measured; its report "
        "on port 9446)",
    }
    assert out.endswith(
        "\n\ndone: this machine's GPU slices are available to the hub in a few seconds\n"
    )
    assert "[  0s] swarm: joined the swarm of" in out  # each step's timed log line
    config = json.loads(daemon_json.read_text())
    assert {k: config[k] for k in OWN} == OWN
    assert len(config["node-generic-resources"]) == 2
    assert len(list(daemon_json.parent.glob("daemon.json.bak-*"))) == 1

    written, engine.changes = daemon_json.stat().st_mtime_ns, []
    assert setup(engine, daemon_json, manager) == 0
    out = capsys.readouterr().out
    assert engine.changes == []
    assert daemon_json.stat().st_mtime_ns == written
    rows = summary(out)
    assert rows["engine"] == "running (20.10.24)" and "restart" not in rows
    assert rows["swarm"] == f"already joined ({manager})"
    assert rows["image"] == f"{IMAGE} present" and rows["daemon.json"] == "already as wanted"
    assert out.endswith("\n\nnothing to change: this machine is already set up\n")
    assert f"      {daemon_json}: already as wanted; nothing to change\n" in out


def test_dry_run_prints_the_plan_and_the_diff_and_changes_nothing(daemon_json, manager, capsys):
    before = daemon_json.read_text()
    engine = FakeEngine(up=False)
    assert setup(engine, daemon_json, manager, "--dry-run") == 0
    out = capsys.readouterr().out
    assert engine.changes == []
    assert daemon_json.read_text() == before
    assert not list(daemon_json.parent.glob("daemon.json.bak-*"))
    assert summary(out) == {
        "checks": f"root, python3, {daemon_json}, manager {manager} answers",
        "shared": "no shared folders named in the join line",
        "engine": "would install docker.io if missing and start it",
        "gpus": "2 GPU(s): 2 Simulated GPU 16384 MiB -> 3 slices (SIMULATED)",
        "swarm": f"would join the swarm of {manager}",
        "image": f"would pull {IMAGE}",
        "daemon.json": "would change (diff above)",
        "guard": "not running (simulated GPUs: no NVML to read)",
        "firewall": "would start its keeper gpuhub-firewall (containers here reach no "
        "metadata address, manager or port of this machine)",
        "disk": "would start gpuhub-disk (servers' homes and writable layers measured; its "
        "report on port 9446)",
    }
    assert f"      {daemon_json} would change:\n" in out
    assert '      +    "GPU-simulated-' in out and "gpu-jupyterhub.gpu-count=2" in out
    assert out.endswith("\n\ndry run: nothing was changed\n")


@pytest.mark.parametrize(
    "token, says",
    [
        ("not-a-token", "--token does not look like a swarm join token (SWMTKN-1-...)"),
        ("", "--token is missing; run 'make join-command' on the manager for the full line"),
    ],
)
def test_a_malformed_token_stops_before_any_change(daemon_json, manager, capsys, token, says):
    before = daemon_json.read_text()
    engine = FakeEngine(up=False)
    args = ["--manager", manager, "--token", token, "--simulate-gpus", "1"]
    assert main(args, docker=engine, environ={"GPUHUB_DAEMON_JSON": str(daemon_json)}) == 1
    assert says in one_error_line(capsys)
    assert engine.changes == [] and daemon_json.read_text() == before


def test_an_unreachable_manager_stops_before_any_change(daemon_json, nobody, capsys):
    engine = FakeEngine(up=False)
    assert setup(engine, daemon_json, nobody) == 1
    line = one_error_line(capsys)
    assert f"cannot reach the manager at {nobody}; check the address" in line
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


def test_the_default_swarm_port_is_added():
    assert join.with_port("10.0.0.5") == "10.0.0.5:2377"
    assert join.with_port("10.0.0.5:2400") == "10.0.0.5:2400"
    assert join.with_port("[fd00::5]") == "[fd00::5]:2377"
    assert join.with_port("[fd00::5]:2400") == "[fd00::5]:2400"


def test_a_token_the_swarm_refuses_stops_before_daemon_json_changes(daemon_json, manager, capsys):
    engine = FakeEngine()
    engine.join_error = (
        "Error response from daemon: rpc error: code = InvalidArgument desc = A valid join\n"
        "token is necessary to join this cluster"
    )
    assert setup(engine, daemon_json, manager) == 1
    line = one_error_line(capsys)
    assert line == (
        f"error: joining the swarm at {manager} failed: A valid join token is necessary to join "
        "this cluster; run 'make join-command' on the manager for a fresh token. Nothing else was "
        "changed."
    )
    assert engine.changes == [("join", manager, "")]
    assert json.loads(daemon_json.read_text()) == OWN


@pytest.mark.parametrize(
    "state, says, fix",
    [
        ("active", "already in another swarm (managers: 10.9.9.9:2377)", "--leave' first"),
        (
            "pending",
            "stuck joining another swarm (state pending, managers: 10.9.9.9:2377)",
            "--leave --force' first",
        ),
    ],
)
def test_a_machine_in_another_swarm_is_left_alone(state, says, fix, daemon_json, manager, capsys):
    engine = FakeEngine(swarm=state, managers=["10.9.9.9:2377"])
    assert setup(engine, daemon_json, manager) == 1
    line = one_error_line(capsys)
    assert says in line
    assert fix in line
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


@pytest.mark.parametrize("state", ["pending", "error"])
@pytest.mark.parametrize("ours", [True, False], ids=["its-managers-ours", "no-managers"])
def test_a_machine_stuck_in_a_swarm_it_is_no_member_of_joins_afresh(
    state, ours, daemon_json, manager, capsys
):
    """Its node removed on the manager (a sick machine that came back): Docker says "pending"
    and refuses to join ("already part of a swarm") until the state is forgotten."""
    engine = FakeEngine(swarm=state, managers=[manager] if ours else [], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager) == 0
    out = capsys.readouterr().out
    assert engine.changes[:2] == [("leave",), ("join", manager, "")]
    assert engine.swarm == "active"
    assert f"swarm: forgot the stuck state of a swarm it is no member of ({state})" in out
    assert f"swarm: joined the swarm of {manager}" in out


#: what the engine of a machine removed on the manager logs every few seconds (Docker 20.10)
REMOVED_LOG = (
    'time="2026-11-26T08:04:07.970568688Z" level=error msg="agent: session failed" '
    'backoff=100ms error="rpc error: code = PermissionDenied desc = Permission denied: '
    "unauthorized peer role: rpc error: code = PermissionDenied desc = Permission denied: node "
    '{} was removed from swarm" module=node/agent node.id={}\n'
)


def test_a_machine_removed_on_the_manager_while_its_engine_ran_joins_afresh(
    daemon_json, manager, capsys
):
    """``docker node rm --force`` on the manager: the machine's engine still says "active",
    with no error, and only its log says the manager refuses it."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.log = "starting up\n" + REMOVED_LOG.format(engine.node_id, engine.node_id) * 3
    assert setup(engine, daemon_json, manager) == 0
    out = capsys.readouterr().out
    assert engine.changes[:2] == [("leave",), ("join", manager, "")]
    assert "swarm: forgot the stuck state of a swarm it is no member of (removed on the " in out


def test_a_leave_that_times_out_right_after_the_removal_is_tried_again(
    daemon_json, manager, capsys, monkeypatch
):
    assert join.LEAVE_RETRY_S == (0, 2, 5, 10)
    monkeypatch.setattr(join, "LEAVE_RETRY_S", (0, 0, 0, 0))  # the test does not wait them
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.log = REMOVED_LOG.format(engine.node_id, engine.node_id)
    timeout = "Error response from daemon: context deadline exceeded"
    engine.leave_errors = [timeout, timeout]  # as a fresh machine's engine answered on the bed
    assert setup(engine, daemon_json, manager) == 0
    assert engine.changes[:4] == [("leave",)] * 3 + [("join", manager, "")]
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.log = REMOVED_LOG.format(engine.node_id, engine.node_id)
    engine.leave_errors = [timeout] * 4  # never: stops, saying why
    assert setup(engine, daemon_json, manager) == 1
    assert "forgetting the stuck swarm state (removed on the manager) failed: " in (
        one_error_line(capsys)
    )
    assert ("join", manager, "") not in engine.changes


def test_a_removal_of_an_earlier_membership_leaves_a_joined_machine_alone(
    daemon_json, manager, capsys
):
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.log = REMOVED_LOG.format("oldnode", "oldnode")  # then it joined again as w7node
    assert setup(engine, daemon_json, manager) == 0
    assert f"already joined ({manager})" in capsys.readouterr().out
    assert ("leave",) not in engine.changes


def test_a_dry_run_on_a_stuck_machine_changes_nothing(daemon_json, manager, capsys):
    engine = FakeEngine(swarm="pending", managers=[manager])
    assert setup(engine, daemon_json, manager, "--dry-run") == 0
    assert "would forget its stuck swarm state (pending) and join" in capsys.readouterr().out
    assert engine.changes == []


@pytest.mark.parametrize("fixture", ["h100x4-gpu1-lost.json", "no-driver.json"])
def test_an_nvml_failure_stops_outside_the_swarm(daemon_json, manager, capsys, fixture):
    engine = FakeEngine()
    assert setup(engine, daemon_json, manager, simulate=False, nvml=FIXTURES / fixture) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--simulate-gpus N instead" in err
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


def test_real_gpus_are_summed_up_by_model(daemon_json, manager, capsys):
    engine = FakeEngine(images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager, "--dry-run", simulate=False, nvml=K80X2) == 0
    out = capsys.readouterr().out
    assert summary(out)["gpus"] == "2 GPU(s): 2 Tesla K80 11441 MiB -> 3 slices"
    assert "\n      warning: nvidia-container-runtime not found; containers will not" in out


def test_a_gpu_reporting_0_mib_is_skipped_and_the_summary_says_so(daemon_json, manager, capsys):
    engine = FakeEngine(images={IMAGE: "sha256:1"})
    nvml = FIXTURES / "h100x4-gpu2-zero-memory.json"
    assert (
        setup(engine, daemon_json, manager, "--guard-mode", "off", simulate=False, nvml=nvml) == 0
    )
    out = capsys.readouterr().out
    assert summary(out)["gpus"] == (
        "3 GPU(s): 3 NVIDIA H100 80GB HBM3 81559 MiB -> 3 slices; 1 skipped (see the warning)"
    )
    assert "\n      warning: GPU 2 (GPU-0a6f3c91-7d2e-4b58-a1c4-000000000002, NVIDIA H100" in out
    resources = json.loads(daemon_json.read_text())["node-generic-resources"]
    assert len(resources) == 3 and not any(
        r.startswith("GPU-0a6f3c91-7d2e-4b58-a1c4-000000000002") for r in resources
    )


def test_a_mig_instance_reporting_0_mib_is_skipped_and_its_siblings_joined(
    daemon_json, manager, capsys
):
    engine = FakeEngine(images={IMAGE: "sha256:1"})
    nvml = FIXTURES / "a100-mig-instance-zero-memory.json"
    assert (
        setup(engine, daemon_json, manager, "--guard-mode", "off", simulate=False, nvml=nvml) == 0
    )
    out = capsys.readouterr().out
    assert summary(out)["gpus"].endswith("; 1 skipped (see the warning)")
    assert "\n      warning: MIG instance MIG-c41a9e27-5d3b-4f80-a6e2-000000000002 of GPU 0" in out
    resources = json.loads(daemon_json.read_text())["node-generic-resources"]
    kinds = sorted(r.split("=")[0] for r in resources)
    assert kinds == [
        "MIG-c41a9e27-5d3b-4f80-a6e2-000000000000",
        "MIG-c41a9e27-5d3b-4f80-a6e2-000000000001",
    ]


def test_gpus_sharing_a_uuid_stop_the_join_outside_the_swarm(daemon_json, manager, capsys):
    engine = FakeEngine()
    nvml = FIXTURES / "t4x2-passthrough-same-uuid.json"
    assert setup(engine, daemon_json, manager, simulate=False, nvml=nvml) == 1
    line = one_error_line(capsys)
    assert line.startswith("error: GPU 0 and GPU 1 report one UUID, GPU-5f8c2e61-")
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


def test_more_slices_than_the_hub_uses_stop_the_join_line(daemon_json, manager, capsys):
    engine = FakeEngine()
    with pytest.raises(SystemExit):
        setup(engine, daemon_json, manager, "--slices-per-gpu", "1000")
    assert "--slices-per-gpu 1000 is more than the hub's limit of 64" in capsys.readouterr().err
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


def test_a_corrupt_daemon_json_is_refused_and_left_alone(daemon_json, manager, capsys):
    daemon_json.write_text('{"log-driver": "json-file",')
    engine = FakeEngine(up=False)
    assert setup(engine, daemon_json, manager) == 1
    line = one_error_line(capsys)
    assert "is not valid JSON" in line and "Nothing was changed" in line
    assert daemon_json.read_text() == '{"log-driver": "json-file",' and engine.changes == []


def test_the_image_is_the_join_lines_or_the_default_one():
    """The join line names the hub's single-user image when it is not the default
    (`make join-command`, deploy/steps.py); the GPU machine reads no settings of its own."""
    assert parse_args(["--manager", "m", "--token", TOKEN]).image == contract.SINGLEUSER_IMAGE
    named = parse_args(["--manager", "m", "--token", TOKEN, "--image", "example.org/su:7"])
    assert named.image == "example.org/su:7"


def test_the_start_up_scripts_machine_carries_the_groups_mark_and_one_joined_by_hand_none(
    daemon_json, manager, capsys
):
    """--fleet-group (deploy/cloud_init.py's start-up script adds it) puts the engine label the
    hub's fleet keeper counts the cloud group's machines by; the same machine joined again with
    the printed line alone is fixed, the mark gone with it."""
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    mark = f"{contract.FLEET_LABEL}={contract.FLEET_GROUP}"
    assert setup(engine, daemon_json, manager, "--fleet-group") == 0
    config = json.loads(daemon_json.read_text())
    assert mark in config["labels"]
    seen = capacity.observe(0.0, [node_from_daemon_json(config)], [], {}, [])
    assert [m.fixed for m in seen.machines] == [False]
    capsys.readouterr()
    assert setup(engine, daemon_json, manager) == 0
    config = json.loads(daemon_json.read_text())
    assert mark not in config["labels"] and config["labels"]
    seen = capacity.observe(0.0, [node_from_daemon_json(config)], [], {}, [])
    assert [m.fixed for m in seen.machines] == [True]


def test_servers_running_here_keep_the_engine_from_restarting(daemon_json, manager, capsys):
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.servers = ["jy-alice", "jy-alice", "jy-bob--gpu"]
    assert setup(engine, daemon_json, manager) == 1
    line = one_error_line(capsys)
    assert "would stop the servers running here: jy-alice jy-bob--gpu; run this again" in line
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN
    assert setup(engine, daemon_json, manager, "--force") == 0
    assert engine.changes == [("restart",), ("run", "host"), WATCH]


def test_the_firewalls_keeper_holds_the_managers_address_and_is_replaced_only_on_change(
    daemon_json, manager, capsys
):
    """The keeper runs the single-user image's gpuhub-firewall with the host's network, after
    every restart of the engine (restart always), with rules that close the metadata range, the
    manager and this machine; a second join keeps it, a new image replaces it, a leave takes
    it and its rules out."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager) == 0
    capsys.readouterr()
    keeper = engine.containers["gpuhub-firewall"]
    env = dict(e.split("=", 1) for e in keeper["Config"]["Env"])
    address = manager.split(":")[0]
    assert f"-A GPUHUB-FORWARD -d {address}/32 -j REJECT" in env["GPUHUB_HOST_RULES"]
    assert "-A GPUHUB-FORWARD -d 169.254.0.0/16 -j REJECT" in env["GPUHUB_HOST_RULES"]
    assert env["GPUHUB_HOST_HOOKS"].splitlines() == [
        "DOCKER-USER -i docker_gwbridge -j GPUHUB-FORWARD",
        "INPUT -i docker_gwbridge -j GPUHUB-INPUT",
    ]
    assert keeper["Config"]["Image"] == IMAGE

    engine.changes = []
    assert setup(engine, daemon_json, manager) == 0
    assert engine.changes == []
    assert summary(capsys.readouterr().out)["firewall"].startswith("kept (")

    engine.images["example.org/su:8"] = "sha256:2"
    assert setup(engine, daemon_json, manager, "--image", "example.org/su:8") == 0
    assert engine.changes[-4:] == [
        ("rm", "gpuhub-firewall"),
        ("run", "host"),
        ("rm", "gpuhub-disk"),
        WATCH,
    ]
    assert summary(capsys.readouterr().out)["firewall"].startswith("replaced gpuhub-firewall")
    assert engine.containers["gpuhub-firewall"]["Config"]["Image"] == "example.org/su:8"


def test_no_firewall_keeps_none_and_takes_out_a_kept_one(daemon_json, manager, capsys):
    """--no-firewall (GPUHUB_EGRESS=off, an image without gpuhub-firewall): no keeper; one kept
    before is removed with its rules."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager, "--no-firewall") == 0
    assert summary(capsys.readouterr().out)["firewall"] == "no rules of ours here (--no-firewall)"
    assert "gpuhub-firewall" not in engine.containers
    assert setup(engine, daemon_json, manager) == 0
    assert "gpuhub-firewall" in engine.containers
    capsys.readouterr()
    engine.changes = []
    assert setup(engine, daemon_json, manager, "--no-firewall") == 0
    assert engine.changes == [("rm", "gpuhub-firewall"), ("run", "host-remove")]
    assert summary(capsys.readouterr().out)["firewall"] == (
        "removed gpuhub-firewall and its rules (--no-firewall)"
    )


def test_the_disk_watch_sees_the_engine_and_the_host_and_is_replaced_only_on_change(
    daemon_json, manager, capsys
):
    """The watch runs the single-user image's gpuhub-disk as root with the host's network, the
    engine's socket (DOCKER_HOST's, the test bed's) and the host's root read-only; a second join
    keeps it, a new image replaces it."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    socket = "/run/gpu-jupyterhub-bed/w1.sock"
    line = ["--manager", manager, "--token", TOKEN, "--simulate-gpus", "2", "--image", IMAGE]
    environ = {"GPUHUB_DAEMON_JSON": str(daemon_json), "DOCKER_HOST": f"unix://{socket}"}
    assert main(line, docker=engine, environ=environ) == 0
    (args,) = [a for a in engine.runs if "--name" in a and "gpuhub-disk" in a]
    label = engine.containers["gpuhub-disk"]["Config"]["Labels"]["gpu-jupyterhub.disk-watch"]
    assert args == [
        "--detach",
        "--name",
        "gpuhub-disk",
        "--restart=always",
        "--network=host",
        "--pid=host",
        "--cap-add=SYS_PTRACE",
        "--security-opt=apparmor=unconfined",
        "--user=0",
        "--memory=128m",
        "--log-opt=max-size=1m",
        "--label",
        f"gpu-jupyterhub.disk-watch={label}",
        "-v",
        f"{socket}:/var/run/docker.sock",
        "-v",
        "/:/host:ro",
        "--entrypoint=gpuhub-disk",
        IMAGE,
        "watch",
        "--port",
        str(contract.DISK_WATCH_PORT),
    ]
    capsys.readouterr()

    engine.changes = []
    assert main(line, docker=engine, environ=environ) == 0
    assert engine.changes == []
    assert summary(capsys.readouterr().out)["disk"].startswith("kept (")

    engine.images["example.org/su:8"] = "sha256:2"
    assert main([*line, "--image", "example.org/su:8"], docker=engine, environ=environ) == 0
    assert engine.changes[-2:] == [("rm", "gpuhub-disk"), WATCH]
    assert summary(capsys.readouterr().out)["disk"].startswith("replaced gpuhub-disk (")
    assert engine.containers["gpuhub-disk"]["Config"]["Image"] == "example.org/su:8"

    engine.changes = []  # another engine's socket: another watch
    environ["DOCKER_HOST"] = "unix:///run/gpu-jupyterhub-bed/w2.sock"
    assert main([*line, "--image", "example.org/su:8"], docker=engine, environ=environ) == 0
    assert engine.changes == [("rm", "gpuhub-disk"), WATCH]


def test_the_disk_watch_finds_dockers_own_socket_without_a_unix_docker_host():
    for environ in ({}, {"DOCKER_HOST": "tcp://10.0.0.5:2375"}):
        assert engine.docker_socket(environ) == "/var/run/docker.sock"
    assert engine.docker_socket({"DOCKER_HOST": "unix:///run/d.sock"}) == "/run/d.sock"


def test_a_disk_watch_that_does_not_start_stops_the_join_and_names_its_log(
    daemon_json, manager, capsys
):
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    engine.run_errors["gpuhub-disk"] = "docker: Error response from daemon: no space left"
    assert setup(engine, daemon_json, manager) == 1
    assert one_error_line(capsys) == (
        "error: the disk watch did not start: docker: Error response from daemon: no space "
        "left; see: docker logs gpuhub-disk"
    )


def test_no_disk_watch_runs_none_and_removes_a_running_one(daemon_json, manager, capsys):
    """--no-disk-watch (GPUHUB_EGRESS=off, an image without gpuhub-disk): no watch; one that
    ran before is removed, also in a dry run only said."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager, "--no-disk-watch") == 0
    assert summary(capsys.readouterr().out)["disk"] == "no disk watch here (--no-disk-watch)"
    assert "gpuhub-disk" not in engine.containers
    assert setup(engine, daemon_json, manager) == 0
    assert "gpuhub-disk" in engine.containers
    capsys.readouterr()
    engine.changes = []
    assert setup(engine, daemon_json, manager, "--no-disk-watch", "--dry-run") == 0
    assert summary(capsys.readouterr().out)["disk"] == "would remove gpuhub-disk (--no-disk-watch)"
    assert engine.changes == []
    assert setup(engine, daemon_json, manager, "--no-disk-watch") == 0
    assert engine.changes == [("rm", "gpuhub-disk")]
    assert summary(capsys.readouterr().out)["disk"] == "removed gpuhub-disk (--no-disk-watch)"


def test_a_gpu_machines_containers_do_not_reach_its_disk_watch(daemon_json, manager, capsys):
    """Only the manager's hub reads a machine's report from inside that machine; on a GPU
    machine the hub comes from the manager, and the machine's own containers stay out."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager) == 0
    env = dict(e.split("=", 1) for e in engine.containers["gpuhub-firewall"]["Config"]["Env"])
    assert f"--dport {contract.DISK_WATCH_PORT}" not in env["GPUHUB_HOST_RULES"]


# ---- the single-user image: --image-tar, or every image of the manager's registry ------------


def image_tar(path: Path, image_id: str, layout: str = "oci") -> str:
    """A ``docker save`` file's manifest (the layers left out: only the manifest is read)."""
    digest = image_id.split(":", 1)[1]
    config = f"blobs/sha256/{digest}" if layout == "oci" else f"{digest}.json"
    manifest = json.dumps([{"Config": config, "RepoTags": [IMAGE], "Layers": []}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in (("oci-layout", b"{}"), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("layout", ["oci", "legacy"])
def test_the_image_id_is_read_from_a_saved_image(tmp_path, layout):
    image_id = "sha256:" + "c" * 64
    assert join.tar_image_id(image_tar(tmp_path / "image.tar", image_id, layout)) == image_id
    (tmp_path / "other.tar").write_bytes(b"not a tar")
    assert join.tar_image_id(str(tmp_path / "other.tar")) == ""


def test_an_image_tar_is_loaded_only_when_it_holds_another_build(
    daemon_json, manager, tmp_path, capsys
):
    old, new = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: old})
    tar = image_tar(tmp_path / "singleuser-image.tar", new)
    engine.tar = (IMAGE, new)

    assert setup(engine, daemon_json, manager, "--image-tar", tar, "--dry-run") == 0
    assert summary(capsys.readouterr().out)["image"] == f"would load {tar}"
    assert engine.changes == []

    assert setup(engine, daemon_json, manager, "--image-tar", tar) == 0
    assert summary(capsys.readouterr().out)["image"] == f"loaded {IMAGE} from {tar}"
    assert engine.changes[0] == ("load", tar)

    engine.changes = []
    assert setup(engine, daemon_json, manager, "--image-tar", tar) == 0
    out = capsys.readouterr().out
    assert summary(out)["image"] == f"{IMAGE} present (same as {tar})"
    assert engine.changes == [] and "nothing to change" in out


def test_an_image_tar_that_is_missing_or_holds_another_image_stops(
    daemon_json, manager, tmp_path, capsys
):
    engine = FakeEngine(swarm="active", managers=[manager])
    assert setup(engine, daemon_json, manager, "--image-tar", str(tmp_path / "no.tar")) == 1
    assert one_error_line(capsys) == f"error: --image-tar {tmp_path / 'no.tar'}: no such file"
    tar = image_tar(tmp_path / "other.tar", "sha256:" + "d" * 64)
    engine.tar = ("someone/else:1", "sha256:" + "d" * 64)
    assert setup(engine, daemon_json, manager, "--image-tar", tar) == 1
    assert f"{tar} does not hold {IMAGE}; make it on the manager" in one_error_line(capsys)
    assert json.loads(daemon_json.read_text()) == OWN


def test_an_image_that_cannot_be_pulled_asks_for_the_tar(daemon_json, manager, capsys):
    engine = FakeEngine(swarm="active", managers=[manager])
    assert setup(engine, daemon_json, manager) == 1
    line = one_error_line(capsys)
    assert f"the single-user image {IMAGE} is not here and cannot be pulled" in line
    assert "'make image-tar'" in line and "--image-tar FILE" in line
    assert json.loads(daemon_json.read_text()) == OWN


@pytest.fixture
def registry():
    """The manager's registry: its catalog and tag lists (the Registry HTTP API v2)."""
    answers = {
        "/v2/_catalog": {"repositories": ["gpu-jupyterhub/pytorch", "gpu-jupyterhub/singleuser"]},
        "/v2/gpu-jupyterhub/pytorch/tags/list": {"tags": ["latest", "2.3"]},
        "/v2/gpu-jupyterhub/singleuser/tags/list": {"tags": ["latest"]},
    }

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):
            answer = answers.get(self.path.split("?")[0])
            body = json.dumps(answer or {"errors": [{"code": "NAME_UNKNOWN"}]}).encode()
            self.send_response(200 if answer else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_with_a_registry_every_image_of_it_is_pulled_after_the_engine_trusts_it(
    daemon_json, manager, registry, capsys
):
    names = [f"{registry}/gpu-jupyterhub/{n}" for n in ("pytorch:latest", "pytorch:2.3")]
    names.append(f"{registry}/{IMAGE}")
    assert join.registry_images(registry) == names
    engine = FakeEngine(swarm="active", managers=[manager])
    engine.pullable = {name: f"sha256:{i}" for i, name in enumerate(names)}

    assert setup(engine, daemon_json, manager, "--registry", registry) == 0
    out = capsys.readouterr().out
    pulls = [("pull", name) for name in names]
    assert engine.changes == [("restart",), *pulls, ("run", "host"), WATCH]
    assert summary(out)["image"] == f"pulled from the manager's registry: {' '.join(names)}"
    assert json.loads(daemon_json.read_text())["insecure-registries"] == [registry]

    engine.changes = []
    assert setup(engine, daemon_json, manager, "--registry", registry) == 0
    out = capsys.readouterr().out
    assert engine.changes == [("pull", name) for name in names]  # pulled again: a no-op
    assert summary(out)["image"] == f"up to date: {' '.join(names)}"
    assert out.endswith("nothing to change: this machine is already set up\n")

    engine.pullable[names[0]] = "sha256:rebuilt"
    assert setup(engine, daemon_json, manager, "--registry", registry) == 0
    assert summary(capsys.readouterr().out)["image"] == (
        f"pulled from the manager's registry: {names[0]}"
    )


def test_a_registry_without_the_image_stops_with_what_to_check(
    daemon_json, manager, nobody, capsys
):
    engine = FakeEngine(swarm="active", managers=[manager])
    assert join.registry_images(nobody, timeout=5) == []
    assert setup(engine, daemon_json, manager, "--registry", nobody) == 1
    line = one_error_line(capsys)
    assert f"cannot find {nobody}/{IMAGE} in the manager's registry {nobody}" in line
    assert f"TCP {nobody.split(':')[1]} to it is open" in line


def test_an_image_tar_beats_the_registry_and_keeps_its_own_name(
    daemon_json, manager, registry, tmp_path, capsys
):
    engine = FakeEngine(swarm="active", managers=[manager])
    tar = image_tar(tmp_path / "image.tar", engine.tar[1])
    assert setup(engine, daemon_json, manager, "--registry", registry, "--image-tar", tar) == 0
    assert summary(capsys.readouterr().out)["image"] == f"loaded {IMAGE} from {tar}"
    assert engine.changes == [("restart",), ("load", tar), ("run", "host"), WATCH]


# ---- leaving ------------------------------------------------------------------------------


@pytest.fixture
def joined(daemon_json, manager, capsys):
    """A machine that joined (the fake engine) with its slices in daemon.json."""
    engine = FakeEngine(swarm="active", managers=[manager], images={IMAGE: "sha256:1"})
    assert setup(engine, daemon_json, manager) == 0
    capsys.readouterr()
    engine.changes = []
    return engine


def test_leave_with_servers_running_refuses_and_names_pause_node(joined, daemon_json, capsys):
    joined.servers = ["jy-alice", "jy-bob--gpu"]
    written = daemon_json.read_text()
    assert leave(joined, daemon_json) == 1
    line = one_error_line(capsys)
    assert line.startswith("error: participants' servers still run here: jy-alice jy-bob--gpu;")
    assert "'make pause-node NODE=gpu-7'" in line and "--wait SECONDS" in line
    assert "--force" in line
    assert joined.changes == [] and daemon_json.read_text() == written


def test_leave_waits_for_the_servers_to_stop(joined, daemon_json, capsys):
    joined.servers = ["jy-alice"]
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 10:
            joined.servers = []  # alice stopped her server

    assert leave(joined, daemon_json, "--wait", "60", sleep=sleep, clock=lambda: now[0]) == 0
    out = capsys.readouterr().out
    assert out.count("waiting for 1 server(s) to stop: jy-alice") == 2
    assert joined.changes == [
        ("leave",),
        ("rm", "gpuhub-firewall"),
        ("run", "host-remove"),
        ("rm", "gpuhub-disk"),
        ("restart",),
    ]
    rows = summary(out)
    assert rows["swarm"] == "left the swarm"
    assert rows["daemon.json"] == "GPU slices and labels taken out (backup kept)"
    assert json.loads(daemon_json.read_text()) == OWN
    assert out.endswith(
        "The Docker engine and the single-user image stay. On the manager, "
        "'docker node rm gpu-7' removes it from the node list.\n"
    )

    assert leave(joined, daemon_json) == 0
    rows = summary(capsys.readouterr().out)
    assert rows == {
        "swarm": "not in a swarm",
        "guard": "not running (leaving)",
        "firewall": "no rules of ours here",
        "disk": "no disk watch here",
        "daemon.json": "no GPU settings left",
    }
    assert joined.changes == [
        ("leave",),
        ("rm", "gpuhub-firewall"),
        ("run", "host-remove"),
        ("rm", "gpuhub-disk"),
        ("restart",),
    ]


def test_leave_gives_up_waiting_after_wait_seconds(joined, daemon_json, capsys):
    joined.servers = ["jy-alice"]
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    assert leave(joined, daemon_json, "--wait", "12", sleep=sleep, clock=lambda: now[0]) == 1
    assert now[0] == 15  # three waits of 5 s
    assert "still run here: jy-alice;" in capsys.readouterr().err
    assert joined.changes == []


def test_leave_with_force_stops_them(joined, daemon_json, capsys):
    joined.servers = ["jy-alice"]
    assert leave(joined, daemon_json, "--force") == 0
    assert summary(capsys.readouterr().out)["swarm"] == "left the swarm (stopped jy-alice)"
    assert joined.changes == [
        ("leave",),
        ("rm", "gpuhub-firewall"),
        ("run", "host-remove"),
        ("rm", "gpuhub-disk"),
        ("restart",),
    ]


def test_leave_dry_run_changes_nothing(joined, daemon_json, capsys):
    written = daemon_json.read_text()
    assert leave(joined, daemon_json, "--dry-run", "--force") == 0
    out = capsys.readouterr().out
    assert summary(out) == {
        "swarm": "would leave the swarm",
        "guard": "not running (leaving)",
        "firewall": "would remove gpuhub-firewall and its rules",
        "disk": "would remove gpuhub-disk",
        "daemon.json": "would take the GPU settings out",
    }
    assert f"      {daemon_json} would change:\n" in out and '      -    "GPU-simulated-' in out
    assert joined.changes == [] and daemon_json.read_text() == written


def test_leave_needs_the_engine_running(daemon_json, capsys):
    assert leave(FakeEngine(up=False), daemon_json) == 1
    assert one_error_line(capsys) == "error: the Docker engine is not running here; start it first"


# ---- the engine's edge: the docker CLI's JSON ----------------------------------------------

DOCKER = """#!/bin/sh
echo "$*" >>"$(dirname "$0")/calls"
case "$*" in
  "info --format {{json .}}") echo '{"Name": "w1", "Swarm": {"LocalNodeState": "active"}}' ;;
  "image inspect --format {{json .Id}} here:1") echo '"sha256:abc"' ;;
  "ps --filter label=com.docker.swarm.service.name --format"*)
    printf '"jy-alice"\\n"gpuhub_net-anchor"\\n' ;;
  "swarm join"*) echo "Error response from daemon: rpc error: code = Unavailable" >&2
    echo "desc = connection error" >&2; exit 1 ;;
  *) echo "Error: No such object" >&2; exit 1 ;;
esac
"""


def test_the_docker_cli_is_read_as_json(tmp_path):
    stub = tmp_path / "docker"
    stub.write_text(DOCKER)
    stub.chmod(0o755)
    docker = DockerCLI({"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert docker.info() == {"Name": "w1", "Swarm": {"LocalNodeState": "active"}}
    assert docker.image_id("here:1") == "sha256:abc"
    assert docker.image_id("gone:1") == ""
    assert docker.server_version() == "unknown"
    assert docker.service_containers() == ["jy-alice", "gpuhub_net-anchor"]
    assert docker.swarm_join("SWMTKN-1-a-b", "10.0.0.5:2377", "10.0.0.7") == (
        "Error response from daemon: rpc error: code = Unavailable desc = connection error"
    )
    assert docker.pull("x:1") == "Error: No such object"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "swarm join --token SWMTKN-1-a-b --advertise-addr 10.0.0.7 10.0.0.5:2377" in calls
    assert "pull -q x:1" in calls


def test_a_machine_without_docker_yet_reads_as_an_engine_without_anything(tmp_path):
    """Before the engine step installs it (and in a dry run, which never does)."""
    docker = DockerCLI({"PATH": str(tmp_path)})
    assert docker.info() == {} and docker.image_id(IMAGE) == ""
    assert docker.service_containers() == []
    assert docker.pull(IMAGE) == "docker: command not found"


# ---- the GPU guard --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def guard_pid(guard_files) -> int | None:
    try:
        pid = int(Path(guard_files["GPUHUB_GUARD_PIDFILE"]).read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").is_dir() else None


def test_the_join_starts_the_guard_restarts_it_for_new_settings_and_leave_removes_it(
    daemon_json, manager, capsys, guard_files, monkeypatch
):
    """A real guard process (its engine unreachable here: it says so and keeps running)."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    port = str(free_port())
    port_line = ["--guard-metrics-port", port]
    try:
        assert setup(engine, daemon_json, manager, *port_line, simulate=False, nvml=K80X2) == 0
        rows = summary(capsys.readouterr().out)
        pidfile = guard_files["GPUHUB_GUARD_PIDFILE"]
        assert rows["guard"] == f"started (warn mode, metrics on :{port}; pid file {pidfile})"
        first = guard_pid(guard_files)
        assert first and "worker_setup.guard" in Path(f"/proc/{first}/cmdline").read_text()
        assert setup(engine, daemon_json, manager, *port_line, simulate=False, nvml=K80X2) == 0
        assert (
            summary(capsys.readouterr().out)["guard"] == f"running (warn mode, metrics on :{port})"
        )
        assert guard_pid(guard_files) == first
        enforce = [*port_line, "--guard-mode", "enforce", "--guard-grace-seconds", "30"]
        assert setup(engine, daemon_json, manager, *enforce, simulate=False, nvml=K80X2) == 0
        assert summary(capsys.readouterr().out)["guard"].startswith("restarted (enforce mode")
        second = guard_pid(guard_files)
        assert second and second != first and guard_pid(guard_files) == second
        args = Path(f"/proc/{second}/cmdline").read_text().split("\0")
        assert args[args.index("--mode") + 1] == "enforce"
        assert args[args.index("--grace-seconds") + 1] == "30"
        assert not [a for a in args if "fixture" in a]  # the fake is no option of the guard's
        log = Path(guard_files["GPUHUB_GUARD_LOG"]).read_text()
        # the join's environment took the fake to the guard: its shim said so in the log
        assert f"FAKE NVML: GPUs from the fixture {K80X2}, not a driver" in log
        assert "no decisions until it answers" in log
        assert leave(engine, daemon_json) == 0
        assert summary(capsys.readouterr().out)["guard"] == "stopped and removed (leaving)"
        assert guard_pid(guard_files) is None and not Path(f"/proc/{second}").exists()
    finally:
        join_guard = join.guard_service.Service(os.environ)
        join_guard.stop()


def test_a_dry_run_says_it_would_start_the_guard_and_starts_nothing(
    daemon_json, manager, capsys, guard_files
):
    engine = FakeEngine(up=False)
    assert setup(engine, daemon_json, manager, "--dry-run", simulate=False, nvml=K80X2) == 0
    row = summary(capsys.readouterr().out)["guard"]
    assert row.startswith("would start the GPU guard (warn mode, metrics on :9445; pid file ")
    assert guard_pid(guard_files) is None


def test_guard_mode_off_runs_no_guard(daemon_json, manager, capsys, guard_files):
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    assert (
        setup(engine, daemon_json, manager, "--guard-mode", "off", simulate=False, nvml=K80X2) == 0
    )
    assert summary(capsys.readouterr().out)["guard"] == "not running (--guard-mode off)"
    assert guard_pid(guard_files) is None


def test_bad_guard_settings_stop_the_join_before_anything_changes(daemon_json, manager, capsys):
    engine = FakeEngine(up=False)
    with pytest.raises(SystemExit):
        setup(engine, daemon_json, manager, "--guard-stop-percent", "90")
    err = capsys.readouterr().err
    assert "--guard-stop-percent is 90, below --guard-warn-percent (100); write at least 100" in err
    assert engine.changes == []


# ---- the hub's shared folders ---------------------------------------------------------------

SHARE_ID = "5f0c1a2b3c4d5e6f"


def shared_folder(tmp_path: Path, name: str, marker: str | None = SHARE_ID) -> str:
    """A folder as the manager's shared storage shows it (its marker holding ``marker``), or
    an empty local folder of the same name (``marker=None``)."""
    folder = tmp_path / "mnt" / name
    folder.mkdir(parents=True)
    if marker is not None:
        (folder / contract.SHARE_MARKER).write_text(f"{marker}\n# gpu-jupyterhub: ...\n")
    return str(folder)


def test_shared_folders_are_read_from_the_join_line():
    assert shared_folders.parse("/srv/homes/=ab12") == ("/srv/homes", "ab12")
    assert shared_folders.parse("/srv/a=b=ab12") == ("/srv/a=b", "ab12")
    for bad in ("/srv/homes", "srv/homes=ab12", "/srv/homes="):
        with pytest.raises(argparse.ArgumentTypeError, match="make join-command"):
            shared_folders.parse(bad)


def test_each_shared_folder_must_be_there_and_the_managers(tmp_path):
    ours = shared_folder(tmp_path, "tutorials")
    local = shared_folder(tmp_path, "homes", marker=None)
    other = shared_folder(tmp_path, "datasets", marker="0000aaaa0000aaaa")
    missing = str(tmp_path / "mnt" / "scratch")
    folders = [(f, SHARE_ID) for f in (ours, local, other, missing)]
    assert shared_folders.problems(folders) == [
        f"{local} is not the manager's (no .gpuhub-share in it: a local folder, the shared "
        "storage not mounted)",
        f"{other} is another hub's shared storage (its .gpuhub-share holds 0000aaaa0000aaaa, "
        f"not {SHARE_ID})",
        f"{missing} is missing",
    ]
    assert shared_folders.problems([(ours, SHARE_ID)]) == []


def test_the_join_stops_before_any_change_naming_the_folder_and_the_fix(
    daemon_json, manager, capsys, tmp_path
):
    ours, local = shared_folder(tmp_path, "tutorials"), shared_folder(tmp_path, "homes", None)
    engine = FakeEngine(up=False)
    line = ["--shared-folder", f"{ours}={SHARE_ID}", "--shared-folder", f"{local}={SHARE_ID}"]
    assert setup(engine, daemon_json, manager, *line) == 1
    error = one_error_line(capsys)
    assert error.startswith(f"error: shared folder {local} is not the manager's")
    assert f"mount -t nfs4 127.0.0.1:{local} {local}" in error and "docs/homes.md" in error
    assert "--shared-folders-warn-only" in error
    assert engine.changes == [] and json.loads(daemon_json.read_text()) == OWN


def test_with_its_shared_folders_mounted_the_machine_joins(daemon_json, manager, capsys, tmp_path):
    folders = [shared_folder(tmp_path, name) for name in ("tutorials", "homes")]
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    line = [a for f in folders for a in ("--shared-folder", f"{f}={SHARE_ID}")]
    assert setup(engine, daemon_json, manager, *line) == 0
    assert summary(capsys.readouterr().out)["shared"] == f"the manager's: {' '.join(folders)}"
    assert ("join", manager, "") in engine.changes


def test_warn_only_joins_anyway_and_says_what_is_wrong(daemon_json, manager, capsys, tmp_path):
    missing = str(tmp_path / "srv" / "homes")
    engine = FakeEngine(up=False)
    engine.pullable[IMAGE] = "sha256:" + "a" * 64
    line = ["--shared-folder", f"{missing}={SHARE_ID}", "--shared-folders-warn-only"]
    assert setup(engine, daemon_json, manager, *line) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(f"warning: shared folder {missing} is missing;")
    assert summary(captured.out)["shared"] == f"WARNING, joining anyway: {missing} is missing"
    assert ("join", manager, "") in engine.changes
