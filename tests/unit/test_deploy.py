"""The deploy steps (deploy/), with Docker faked at the SDK's edge (tests/unit/fake_engine.py) and
`docker stack deploy` replaced by the fake's stand-in. Each step is run twice: the second run
changes nothing and says so."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deploy import __main__ as cli
from deploy import commands, console, registry, settings, stack, steps, tls
from deploy.console import DeployError, Log
from gpu_swarm_spawner import contract
from worker_setup import advertise, engine

from .config_lines import CORPUS, SECRET, Refused, expected, key_of
from .fake_engine import FakeDocker, FakeDockerCLI, node, running_task

REPO = Path(__file__).resolve().parents[2]


class Said:
    """A Log whose lines the test reads back, without their clock."""

    def __init__(self):
        self.buffer = io.StringIO()
        self.log = Log(out=self.buffer)

    def lines(self) -> list[str]:
        return [re.sub(r"^\[ *\d+s\] ", "", line) for line in self.buffer.getvalue().splitlines()]

    def clear(self):
        self.buffer.seek(0)
        self.buffer.truncate()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environ_for(tmp_path: Path, **values: str) -> dict[str, str]:
    """The environment of a deploy whose settings are the defaults with ``values``
    (GPUHUB_X=...), its state in tmp_path and a public base image (nothing built from
    Debian)."""
    return {
        "GPUHUB_CONFIG": "none",
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_BASE_IMAGE": "debian:bookworm",
        "GPUHUB_HTTP_PORT": str(free_port()),
        **values,
    }


def make_config(tmp_path: Path, mode: str | None = None, **values: str) -> settings.Config:
    return settings.read(mode, environ_for(tmp_path, **values))


@pytest.fixture
def said():
    return Said()


@pytest.fixture
def fake(monkeypatch):
    """The fake engine, reached by every step; waits take no time (a fake clock)."""
    docker = FakeDocker()
    monkeypatch.setattr(steps, "connect", lambda: docker)
    monkeypatch.setattr(stack, "run", docker.stack_deploy)
    now = [0.0]
    monkeypatch.setattr(console, "clock", lambda: now[0])
    monkeypatch.setattr(console, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return docker


# ---- swarm ----------------------------------------------------------------------------------


def test_a_swarm_is_initialised_once(fake, said):
    environ = {"GPUHUB_ADVERTISE_ADDR": "10.0.0.5"}
    assert steps.ensure_swarm(fake, said.log, environ) == "10.0.0.5"
    assert fake.changes == [("swarm init", "10.0.0.5")]
    # its networks hold thousands of servers (Docker's default /24: about 250)
    assert fake.swarm_init_options["subnet_size"] == 20
    assert said.lines() == ["initialising a swarm on 10.0.0.5"]
    said.clear()
    assert steps.ensure_swarm(fake, said.log, environ) == "10.0.0.5"
    assert fake.changes == [("swarm init", "10.0.0.5")]  # nothing more
    assert said.lines() == ["swarm: this machine manages it (10.0.0.5)"]


@pytest.mark.parametrize(
    "state, says",
    [
        ({"LocalNodeState": "active", "ControlAvailable": False}, "this machine is a swarm worker"),
        ({"LocalNodeState": "pending"}, "swarm state is 'pending'; wait for it, or run: docker"),
    ],
)
def test_a_swarm_this_machine_cannot_manage_stops_with_the_fix(fake, said, state, says):
    fake.swarm_state = state
    with pytest.raises(DeployError, match=says):
        steps.ensure_swarm(fake, said.log, {})
    assert fake.changes == []


def test_a_failing_swarm_init_names_the_setting_to_fix(fake, said):
    fake.swarm_init_fails = "could not choose an IP address to advertise"
    with pytest.raises(DeployError) as e:
        steps.ensure_swarm(fake, said.log, {"GPUHUB_ADVERTISE_ADDR": "10.0.0.5"})
    assert "could not choose an IP address" in str(e.value)
    assert str(e.value).endswith("set GPUHUB_ADVERTISE_ADDR to this machine's address")


# ---- GPU slices -----------------------------------------------------------------------------


class Advertiser:
    """worker_setup.advertise.main as the step calls it: prints, returns its exit status."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        status = self.statuses.pop(0)
        print("GPU 0: GPU-simulated-1 Simulated GPU 16384 MiB -> 3 slices (SIMULATED)")
        if status == 1:
            print(
                "NVML reports no GPU on this machine; pass --simulate-gpus N to test.",
                file=sys.stderr,
            )
        elif status == advertise.CHANGED:
            print("/etc/docker/daemon.json: updated; restart the Docker engine to apply")
        else:
            print("/etc/docker/daemon.json: already as wanted; nothing to change")
        return status


def test_gpu_slices_restart_the_engine_only_when_daemon_json_changed(tmp_path, said):
    config = make_config(tmp_path, GPUHUB_SLICES_PER_GPU="4", GPUHUB_NAMED_SLOTS="NVIDIA-GPU")
    advertiser, restarts = Advertiser([advertise.CHANGED, 0]), []
    environ = {"GPUHUB_DAEMON_JSON": "/bed/daemon.json"}
    run = dict(advertise_main=advertiser, restart=lambda: restarts.append(1), environ=environ)
    assert steps.ensure_gpu_slices(config, said.log, **run) is True
    assert restarts == [1]
    assert "GPU slices changed; restarting the Docker engine" in said.lines()
    said.clear()
    assert steps.ensure_gpu_slices(config, said.log, **run) is False
    assert restarts == [1]  # not again
    assert "      /etc/docker/daemon.json: already as wanted; nothing to change" in said.lines()
    assert advertiser.calls[0] == [
        "--slices-per-gpu",
        "4",
        "--simulate-if-no-gpu",
        "2",
        "--named-kind",
        "NVIDIA-GPU",
        "--daemon-json",
        "/bed/daemon.json",
    ]


def test_make_up_allows_a_manager_without_gpu(tmp_path, said):
    advertiser = Advertiser([0])
    config = make_config(tmp_path)
    steps.ensure_gpu_slices(config, said.log, optional=True, advertise_main=advertiser, environ={})
    assert "--none-if-no-gpu" in advertiser.calls[0]


def test_no_gpu_and_no_simulated_ones_stops_with_advertises_reason(tmp_path, said):
    config = make_config(tmp_path, GPUHUB_SIMULATE_IF_NO_GPU="0")
    with pytest.raises(DeployError, match="^NVML reports no GPU on this machine; pass"):
        steps.ensure_gpu_slices(config, said.log, advertise_main=Advertiser([1]), environ={})


# ---- the engine -----------------------------------------------------------------------------


@pytest.mark.skipif(
    Path("/run/systemd/system").is_dir(), reason="this machine starts Docker through systemd"
)
def test_an_engine_that_does_not_start_points_at_its_log(tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {
        "docker": "exit 1",
        "dockerd": "echo 'failed to start daemon: boom' >&2; exit 1",
    }.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "dockerd.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUHUB_ENGINE_WAIT", "1")
    monkeypatch.setenv("GPUHUB_DOCKERD_LOG", str(log))
    monkeypatch.setenv("GPUHUB_DOCKERD_PIDFILE", str(tmp_path / "docker.pid"))
    monkeypatch.delenv("GPUHUB_DOCKERD_CMD", raising=False)
    assert cli.main(["images"], environ_for(tmp_path)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: the Docker engine did not start within 1 s; read {log} (or journalctl -u docker)"
    ]
    assert "boom" in log.read_text()


# ---- images ---------------------------------------------------------------------------------


def test_images_are_built_and_a_second_run_changes_nothing(tmp_path, fake, said):
    config = make_config(tmp_path)
    steps.ensure_images(fake, config, said.log)
    assert fake.changes == [
        ("build", "gpu-jupyterhub/singleuser:latest"),
        ("build", "gpu-jupyterhub/hub:latest"),
    ]
    assert [b["buildargs"] for b in fake.builds] == [{"BASE_IMAGE": "debian:bookworm"}] * 2
    assert [b["dockerfile"] for b in fake.builds] == [
        "images/singleuser/Dockerfile",
        "images/hub/Dockerfile",
    ]
    assert said.lines()[1].startswith("      built (sha256:")
    said.clear()
    steps.ensure_images(fake, config, said.log)
    assert len(fake.changes) == 2
    assert said.lines()[1].startswith("      unchanged (sha256:")


def test_a_failed_build_shows_the_end_of_its_log(tmp_path, fake, said):
    fake.build_fails.add("gpu-jupyterhub/hub:latest")
    with pytest.raises(DeployError) as e:
        steps.ensure_images(fake, make_config(tmp_path), said.log)
    assert str(e.value) == "building gpu-jupyterhub/hub:latest failed (output above)"
    shown = e.value.output.splitlines()
    assert len(shown) == 30 and shown[-1] == "The command '/bin/sh -c pip install' returned 1"


def test_environment_images_are_built_here_or_found_or_pulled(tmp_path, fake, said):
    envs = "A=gpu-jupyterhub/standin:latest B=quay.io/x/here:1 C=quay.io/x/pull:2"
    config = make_config(tmp_path, GPUHUB_ENVIRONMENTS=envs)
    fake.pullable = {"quay.io/x/here:1", "quay.io/x/pull:2"}
    fake.images.pull("quay.io/x/here:1")  # here already
    fake.changes.clear()
    steps.ensure_environment_images(fake, config, said.log)
    assert fake.changes == [
        ("build", "gpu-jupyterhub/standin:latest"),
        ("pull", "quay.io/x/pull:2"),
    ]
    assert fake.builds[-1]["buildargs"] == {"SINGLEUSER_IMAGE": config.singleuser_image}
    assert "image quay.io/x/here:1: here" in said.lines()
    steps.ensure_environment_images(fake, config, said.log)
    assert len(fake.changes) == 2  # built the same, pulled already


def test_an_environment_image_neither_here_nor_pullable_is_named(tmp_path, fake, said):
    config = make_config(tmp_path, GPUHUB_ENVIRONMENTS="A=quay.io/x/missing:1")
    with pytest.raises(DeployError, match=r"image quay.io/x/missing:1 is neither here nor pull"):
        steps.ensure_environment_images(fake, config, said.log)


# ---- secrets, roster ------------------------------------------------------------------------


def test_secrets_are_generated_once(tmp_path, said):
    config = make_config(tmp_path)
    made = steps.ensure_secrets(config, said.log)
    assert made == list(steps.GENERATED)
    state = Path(config.state_dir)
    assert state.stat().st_mode & 0o777 == 0o700
    first = {name: (state / name).read_text() for name in made}
    for name, text in first.items():
        digits = 64 if name == "crypt_key" else 32  # auth_state's key: 32 bytes, in hex
        assert re.fullmatch(rf"[0-9a-f]{{{digits}}}\n", text), name
        assert (state / name).stat().st_mode & 0o777 == 0o600
    assert len(set(first.values())) == len(first)
    assert steps.ensure_secrets(config, said.log) == []
    assert {name: (state / name).read_text() for name in made} == first
    assert said.lines()[-1] == f"secrets: kept those in {state}"


def test_the_roster_is_checked_and_its_usernames_written_where_the_hub_reads_them(tmp_path, said):
    roster = tmp_path / "roster.txt"
    roster.write_text("# the form\n@Ada\nhttps://github.com/grace\n")
    config = make_config(tmp_path, GPUHUB_ROSTER=str(roster))
    assert steps.ensure_roster(config, said.log) == "/srv/jupyterhub/roster/roster.txt"
    copied = Path(config.state_dir, "roster", "roster.txt")
    assert copied.read_text().splitlines()[1:] == ["ada", "grace"]
    assert said.lines() == ["roster: 2 GitHub usernames"]
    roster.write_text("ada\nnot a name!\n")
    with pytest.raises(DeployError, match="^GPUHUB_ROSTER: .*line 2"):
        steps.ensure_roster(config, said.log)
    assert copied.read_text().splitlines()[1:] == ["ada", "grace"]  # the hub keeps the good one


# ---- ports ----------------------------------------------------------------------------------


def test_a_taken_port_is_named_with_the_fix(tmp_path, fake, said):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        config = make_config(tmp_path, GPUHUB_HTTP_PORT=str(port))
        with pytest.raises(DeployError) as e:
            steps.ensure_ports_free(fake, config, ["GPUHUB_HTTP_PORT"], said.log)
        assert str(e.value) == (
            f"port {port} (GPUHUB_HTTP_PORT) is already in use by another program; free it or "
            "set another port: GPUHUB_HTTP_PORT=..."
        )
        # ... unless the stack holds it: a re-run
        fake.stack_deploy(["docker", "stack", "deploy", "gpuhub"], "", "", env=config.values)
        steps.ensure_ports_free(fake, config, ["GPUHUB_HTTP_PORT"], said.log)
        assert said.lines() == [f"ports: {port} stack gpuhub's"]


def test_a_free_port_passes(tmp_path, fake, said):
    config = make_config(tmp_path)
    steps.ensure_ports_free(fake, config, ["GPUHUB_HTTP_PORT"], said.log)
    assert said.lines() == [f"ports: {config.http_port} free"]


# ---- TLS and the GitHub secret ----------------------------------------------------------------


def subject_alt_name(cert: Path) -> str:
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()[-1].strip()


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")
def test_a_self_signed_certificate_is_made_once_per_hostname(tmp_path, said):
    def versions(host):
        config = make_config(tmp_path, GPUHUB_TLS="self-signed", GPUHUB_HOSTNAME=host)
        return tls.ensure_tls(config, said.log)

    cert = tmp_path / "state" / "tls" / "cert.pem"
    first = versions("10.0.0.5")
    assert subject_alt_name(cert) == "IP Address:10.0.0.5"
    assert versions("10.0.0.5") == first  # kept: the secrets' names do not change
    assert said.lines()[-1].startswith("TLS: the self-signed certificate for 10.0.0.5 (kept")
    assert versions("hub.example.org") != first
    assert subject_alt_name(cert) == "DNS:hub.example.org"
    assert (tmp_path / "state" / "tls" / "key.pem").stat().st_mode & 0o077 == 0


def test_provided_certificate_files_are_used(tmp_path, said):
    (tmp_path / "mine.pem").write_text("CERT\n")
    (tmp_path / "mine.key").write_text("KEY\n")
    config = make_config(
        tmp_path,
        GPUHUB_TLS="files",
        GPUHUB_HOSTNAME="hub.example.org",
        GPUHUB_TLS_CERT=str(tmp_path / "mine.pem"),
        GPUHUB_TLS_KEY=str(tmp_path / "mine.key"),
    )
    versions = tls.ensure_tls(config, said.log)
    assert (tmp_path / "state" / "tls" / "cert.pem").read_text() == "CERT\n"
    assert (tmp_path / "state" / "tls" / "key.pem").read_text() == "KEY\n"
    assert versions["GPUHUB_TLS_CERT_VERSION"] == tls.content_version(tmp_path / "mine.pem")
    assert tls.ensure_tls(config, said.log) == versions


def test_the_github_secret_file_loses_its_line_end_and_is_never_logged(tmp_path, said):
    (tmp_path / "secret").write_text(f"{SECRET}\n")
    config = make_config(
        tmp_path, GPUHUB_AUTH="github", GPUHUB_GITHUB_CLIENT_SECRET_FILE=str(tmp_path / "secret")
    )
    version = tls.ensure_github_secret(config, said.log)
    assert Path(config.state_dir, "github_client_secret").read_text() == SECRET
    assert tls.ensure_github_secret(config, said.log) == version
    assert said.lines()[-1].startswith("GitHub client secret: unchanged")
    assert SECRET not in said.buffer.getvalue()


# ---- the registry's names ---------------------------------------------------------------------


def test_registry_names_are_a_pure_function_of_the_settings(tmp_path):
    config = make_config(
        tmp_path,
        GPUHUB_ENVIRONMENTS="PyTorch=gpu-jupyterhub/pytorch:latest Other=quay.io/org/img:2",
    )
    published = registry.publication(config, "10.0.0.5:5000")
    assert published.images == {
        "gpu-jupyterhub/singleuser:latest": "10.0.0.5:5000/gpu-jupyterhub/singleuser:latest",
        "gpu-jupyterhub/pytorch:latest": "10.0.0.5:5000/gpu-jupyterhub/pytorch:latest",
        "quay.io/org/img:2": "10.0.0.5:5000/org/img:2",
    }
    assert published.stack_values() == {
        "GPUHUB_SINGLEUSER_IMAGE": "10.0.0.5:5000/gpu-jupyterhub/singleuser:latest",
        "GPUHUB_ENVIRONMENTS": "PyTorch=10.0.0.5:5000/gpu-jupyterhub/pytorch:latest "
        "Other=10.0.0.5:5000/org/img:2",
    }
    # the settings themselves are left as they were
    assert config.singleuser_image == "gpu-jupyterhub/singleuser:latest"
    assert config.environments["PyTorch"] == "gpu-jupyterhub/pytorch:latest"


# ---- convergence ------------------------------------------------------------------------------

SERVICE = {
    "ID": "s1",
    "Spec": {"Name": "gpuhub_hub", "TaskTemplate": {"ContainerSpec": {"Image": "hub:2"}}},
}
OLD = {"ContainerSpec": {"Image": "hub:1"}}


def task(state="running", desired="running", spec=None, err=""):
    t = running_task(SERVICE, state, desired, spec)
    if err:
        t["Status"]["Err"] = err
    return t


@pytest.mark.parametrize(
    "tasks, converged, seen",
    [
        ([task()], True, "running"),
        # the engine writes Runtime into the service's spec, not the task's
        ([task(spec={**SERVICE["Spec"]["TaskTemplate"], "Runtime": "container"})], True, "running"),
        ([task(spec=OLD)], False, "running (old spec)"),  # the update has not begun
        ([task(spec=OLD, desired="shutdown"), task("pending")], False, "running, stopping"),
        ([task("starting")], False, "starting"),
        ([task(), task("starting")], False, "running; starting"),  # a second replica
        ([task(), task("running", "shutdown", OLD)], False, "running; running, stopping (old"),
        ([task("failed", "shutdown", err="task: non-zero exit (1)"), task()], True, "running"),
        ([task("failed", "shutdown", err="task: non-zero exit (1)")], False, "non-zero exit"),
        ([], False, "no task"),
    ],
)
def test_convergence(tasks, converged, seen):
    done, text = stack.convergence(SERVICE, tasks)
    assert done is converged
    assert seen in text


def test_an_update_in_progress_is_not_converged():
    service = dict(SERVICE, UpdateStatus={"State": "updating", "Message": "update in progress"})
    done, text = stack.convergence(service, [task()])
    assert not done and "update updating: update in progress" in text
    # an update an earlier deploy left paused: its tasks tell
    service = dict(SERVICE, UpdateStatus={"State": "paused", "Message": "update paused"})
    assert stack.convergence(service, [task()]) == (True, "running; update paused: update paused")


def test_wait_converged_until_the_new_task_runs(fake):
    fake.services["gpuhub_hub"] = SERVICE
    fake.task_script["gpuhub_hub"] = [
        [task(spec=OLD)],
        [task(spec=OLD, desired="shutdown"), task("pending")],
        [task("shutdown", "shutdown", OLD), task("starting")],
        [task("shutdown", "shutdown", OLD), task()],
    ]
    stack.wait_converged(fake, "gpuhub_hub")
    assert fake.task_reads["gpuhub_hub"] == 4


def test_a_service_that_never_converges_says_what_it_last_saw(fake):
    fake.services["gpuhub_hub"] = SERVICE
    stuck = "no suitable node (insufficient resources on 1 node)"
    fake.task_script["gpuhub_hub"] = [[task("pending", err=stuck)]]
    with pytest.raises(DeployError) as e:
        stack.wait_converged(fake, "gpuhub_hub", timeout=120)
    assert str(e.value) == (
        f"service gpuhub_hub did not converge within 120 s (last seen: pending: {stuck}); "
        "see: docker service ps gpuhub_hub"
    )
    assert console.clock() >= 120


# ---- the hub answering ------------------------------------------------------------------------


class Hub(http.server.BaseHTTPRequestHandler):
    status = 200
    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.path, self.headers["Host"]))
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b'{"version": "6.1.1"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_server():
    Hub.seen = []
    Hub.status = 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_hub_is_asked_by_its_public_name_at_the_engines_address(tmp_path, hub_server):
    port = hub_server.server_address[1]
    config = make_config(tmp_path, GPUHUB_HOSTNAME="hub.example.org", GPUHUB_HTTP_PORT=str(port))
    environ = {"GPUHUB_ENGINE_ADDR": "127.0.0.1"}
    assert stack.hub_answers(config, environ)
    assert Hub.seen == [("/hub/api/", f"hub.example.org:{port}")]
    Hub.status = 503
    assert not stack.hub_answers(config, environ)
    assert not stack.hub_answers(config, {"GPUHUB_ENGINE_ADDR": "127.0.0.9"})  # nobody there


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")
def test_https_sends_the_public_name_and_takes_any_certificate(tmp_path, said):
    config = make_config(tmp_path, GPUHUB_TLS="self-signed", GPUHUB_HOSTNAME="10.0.0.5")
    tls.ensure_tls(config, said.log)  # a certificate for another name than the one asked
    Hub.status, Hub.seen = 200, []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    state = Path(config.state_dir, "tls")
    context.load_cert_chain(state / "cert.pem", state / "key.pem")
    names = []
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        port = server.server_address[1]
        config = make_config(
            tmp_path,
            GPUHUB_TLS="self-signed",
            GPUHUB_HOSTNAME="hub.example.org",
            GPUHUB_HTTPS_PORT=str(port),
        )
        assert stack.hub_answers(config, {"GPUHUB_ENGINE_ADDR": "127.0.0.1"})
        assert names == ["hub.example.org"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "values, url",
    [
        ({}, "http://127.0.0.1:8000"),
        (
            {"GPUHUB_HTTP_PORT": "80", "GPUHUB_HOSTNAME": "hub.example.org"},
            "http://hub.example.org",
        ),
        ({"GPUHUB_TLS": "acme", "GPUHUB_HOSTNAME": "hub.example.org"}, "https://hub.example.org"),
        ({"GPUHUB_TLS": "files", "GPUHUB_HTTPS_PORT": "8443"}, "https://127.0.0.1:8443"),
        # the name in the one form browsers send, an IPv6 address in brackets
        (
            {"GPUHUB_HTTP_PORT": "80", "GPUHUB_HOSTNAME": "Hub.Uni.Example"},
            "http://hub.uni.example",
        ),
        (
            {"GPUHUB_HTTP_PORT": "80", "GPUHUB_HOSTNAME": "[2001:DB8:0::5]"},
            "http://[2001:db8::5]",
        ),
    ],
)
def test_the_public_url_leaves_out_the_schemes_own_port(tmp_path, values, url):
    config = make_config(tmp_path, **{"GPUHUB_HTTP_PORT": "8000", **values})
    assert stack.public_url(config) == url


# ---- the stack --------------------------------------------------------------------------------


def test_the_stack_gets_the_checked_settings_and_what_the_deploy_filled_in(tmp_path, fake, said):
    config = make_config(tmp_path, GPUHUB_TUTORIAL_REPOS="t=https://h/t.git", GPUHUB_STACK="mine")
    steps.ensure_images(fake, config, said.log)
    environ = {"PATH": "/bin", "DOCKER_HOST": "unix:///x.sock", "GPUHUB_ROGUE": "x"}
    deployed = stack.deploy_stack(fake, config, said.log, environ=environ)
    (deploy,) = fake.deploys
    env = deploy["env"]
    assert deploy["command"][:6] == [
        "docker",
        "stack",
        "deploy",
        "--prune",
        "--resolve-image",
        "never",
    ]
    assert deploy["command"][-1] == "mine" and deploy["files"] == ["stack.yml", "stack.http.yml"]
    assert env["GPUHUB_STACK"] == "mine" and env["PATH"] == "/bin"
    assert "GPUHUB_ROGUE" not in env  # only the checked settings
    assert env["GPUHUB_HUB_IMAGE_ID"] == fake.images.get("gpu-jupyterhub/hub:latest").id
    assert env["GPUHUB_SIMULATED_GPUS"] == "1"  # the fake's node advertises simulated GPUs
    assert env["GPUHUB_TUTORIAL_SYNC_REPLICAS"] == "1"
    assert env["GPUHUB_DOCKER_SOCKET"] == "/x.sock"
    assert env["GPUHUB_PUBLIC_URL"] == f"http://127.0.0.1:{config.http_port}"
    assert deployed.public_url == env["GPUHUB_PUBLIC_URL"] and deployed.simulated_gpus
    assert config.public_url == ""  # the settings read are left as they were
    assert Path(config.tutorials_dir).is_dir()
    assert said.lines()[-1] == "      new: mine_hub mine_net-anchor mine_proxy mine_tutorial-sync"
    stack.deploy_stack(
        fake, config, said.log, environ={"PATH": "/bin", "DOCKER_HOST": "unix:///x.sock"}
    )
    assert (
        said.lines()[-1]
        == "      unchanged: mine_hub mine_net-anchor mine_proxy mine_tutorial-sync"
    )


def test_old_versions_of_the_hashed_secrets_are_removed(fake):
    names = ["gpuhub_tls_cert_aaa", "gpuhub_tls_cert_bbb", "gpuhub_proxy_token", "other_tls_cert_a"]
    fake.secrets = [{"ID": n, "Spec": {"Name": n, "Labels": {}}} for n in names]
    fake.secrets_in_use = {"gpuhub_tls_cert_bbb"}
    stack.remove_unused_secrets(fake, "gpuhub")
    assert fake.changes == [("secret rm", "gpuhub_tls_cert_aaa")]


def test_a_failed_stack_deploy_shows_all_its_output(tmp_path, fake, said, monkeypatch):
    def failing(command, failed, fix, lines=20, env=None, show=None):
        return console.run(
            ["sh", "-c", "seq 1 40; echo 'service hub: bad mount'; exit 1"], failed, fix, lines, env
        )

    monkeypatch.setattr(stack, "run", failing)
    config = make_config(tmp_path)
    steps.ensure_images(fake, config, said.log)
    with pytest.raises(DeployError) as e:
        stack.deploy_stack(fake, config, said.log, environ={"PATH": os.environ["PATH"]})
    assert str(e.value) == (
        "docker stack deploy failed (output above); remove what exists with: make down"
    )
    assert e.value.output.splitlines() == [str(n) for n in range(1, 41)] + [
        "service hub: bad mount"
    ]


def test_down_removes_servers_and_stack_and_keeps_the_data(tmp_path, fake, said):
    config = make_config(tmp_path)
    fake.swarm_state = {
        "LocalNodeState": "active",
        "ControlAvailable": True,
        "NodeAddr": "10.0.0.5",
    }
    fake.stack_deploy(["docker", "stack", "deploy", "gpuhub"], "", "", env=dict(config.values))
    fake.user_services = [
        {"ID": "u1", "Spec": {"Name": "jy-ada", "Labels": {"gpu-jupyterhub.stack": "gpuhub"}}},
        {"ID": "u2", "Spec": {"Name": "jy-bob", "Labels": {"gpu-jupyterhub.stack": "other"}}},
    ]
    fake.network_lingers = 2  # accepted twice before it goes
    fake.volumes = [{"Name": "gpuhub_hub-data", "Labels": {"com.docker.stack.namespace": "gpuhub"}}]
    fake.changes.clear()
    stack.remove_stack(fake, config, said.log)
    removed = [c[1] for c in fake.changes]
    assert removed[0] == "jy-ada" and "jy-bob" not in removed
    assert {"gpuhub_hub", "gpuhub_proxy", "gpuhub_tutorial-sync", "gpuhub_net-anchor"} <= set(
        removed
    )
    assert removed.count("jhub") == 3 and fake.networks == [] and fake.secrets == []
    assert fake.volumes  # kept
    assert said.lines()[:2] == ["removing user servers: jy-ada", "removing stack gpuhub"]
    assert "waiting for the stack's tasks to stop (network jhub still there)" in said.lines()
    fake.changes.clear()
    said.clear()
    stack.remove_stack(fake, config, said.log)
    assert fake.changes == [] and said.lines() == ["stack gpuhub: not deployed"]


def test_purge_removes_the_volumes_and_generated_secrets(tmp_path, fake, said):
    config = make_config(tmp_path)
    steps.ensure_secrets(config, said.log)
    fake.volumes = [
        {"Name": "gpuhub_hub-data", "Labels": {"com.docker.stack.namespace": "gpuhub"}},
        {"Name": "jy-home-ada", "Labels": {"gpu-jupyterhub.stack": "gpuhub"}},
        {"Name": "jy-home-eve", "Labels": {"gpu-jupyterhub.stack": "other"}},
    ]
    fake.volume_busy = 3  # containers still going
    stack.purge_stack_data(fake, config, said.log)
    assert [v["Name"] for v in fake.volumes] == ["jy-home-eve"]
    assert not Path(config.state_dir).exists()
    assert said.lines()[-2:] == [
        "removed volumes: gpuhub_hub-data jy-home-ada",
        f"removed generated secrets in {config.state_dir}",
    ]


# ---- the verbs end to end on the fake -----------------------------------------------------------


@pytest.fixture
def machine(fake, monkeypatch):
    """Everything `make demo` and `make up` touch, faked: the engine runs, advertising finds
    simulated GPUs, the hub answers, the registry takes pushes."""
    monkeypatch.setattr(engine, "ensure_running", lambda log, env=None: False)
    monkeypatch.setattr(engine, "restart", lambda env=None: pytest.fail("no restart expected"))
    monkeypatch.setattr(advertise, "main", Advertiser([0] * 10))
    monkeypatch.setattr(stack, "hub_answers", lambda config, environ: True)
    monkeypatch.setattr(registry, "registry_answers", lambda url: True)
    monkeypatch.setattr(steps, "DockerCLI", FakeDockerCLI(fake))

    def digest(base, repository, version):
        return fake.registry.get(f"{repository}:{version}", "")

    monkeypatch.setattr(registry, "registry_digest", digest)
    return fake


def test_make_demo_twice(tmp_path, machine, capsys):
    environ = environ_for(tmp_path, GPUHUB_ADVERTISE_ADDR="10.0.0.5")
    assert cli.main(["demo"], environ) == 0
    out = capsys.readouterr().out
    state = tmp_path / "state"
    port = environ["GPUHUB_HTTP_PORT"]
    config = settings.read("demo", environ)
    cpu, mem, pids = (config.values[f"GPUHUB_{k}_LIMIT"] for k in ("CPU", "MEM", "PIDS"))
    assert config.mem_limit == settings.typed.memory(mem)  # as written, e.g. 4096M
    assert cpu == ""  # auto: no quota
    limits = f"cores shared equally (no quota), memory {mem}, tasks {pids}"
    demo, admin = (
        (state / name).read_text().strip() for name in ("demo_password", "admin_password")
    )
    assert out.endswith(
        f"""
  GPU JupyterHub is running: http://127.0.0.1:{port}/
    log in with any username and the demo password: {demo}
    admin user: admin, with the admin password: {admin}
    limits per server: {limits}
    GPU slices: SIMULATED (no NVIDIA GPU on this machine), 3 per GPU
  Stop and remove it with: make down

"""
    )
    assert f"hub answers at http://127.0.0.1:{port}" in out
    # what the environment gave (the tests' port, state folder...) is said, once
    (given,) = [line for line in out.splitlines() if "from the environment, over" in line]
    assert f"GPUHUB_HTTP_PORT={port}" in given and "unset GPUHUB_HTTP_PORT" in given
    changed = list(machine.changes)
    assert ("swarm init", "10.0.0.5") in changed
    # the manager's own rules for its containers, as a GPU machine's join keeps them
    assert ("docker run", "gpuhub-firewall", "host") in changed
    assert "firewall: started gpuhub-firewall" in out
    # its hub reads the manager's own disk watch, through the manager's rules
    assert ("docker run", "gpuhub-disk", "watch --port 9446") in changed
    assert "disk watch: started gpuhub-disk (" in out
    keeper = machine.containers_running["gpuhub-firewall"].kwargs
    rules = dict(e.split("=", 1) for e in keeper["env"])["GPUHUB_HOST_RULES"]
    assert "-A GPUHUB-INPUT -p tcp --dport 9446 -j RETURN" in rules
    assert cli.main(["demo"], environ) == 0
    again = capsys.readouterr().out
    assert machine.changes == changed  # nothing changed the second time
    for says in [
        "Docker engine: running",
        "swarm: this machine manages it (10.0.0.5)",
        f"ports: {port} free",
        "unchanged: gpuhub_hub",
        "secrets: kept those",
        "firewall: kept (",
        "disk watch: kept (",
    ]:
        assert says in again


def test_egress_off_runs_no_firewall_or_disk_watch_on_the_manager(tmp_path, machine, capsys):
    """GPUHUB_EGRESS=off: the servers' image has neither gpuhub-firewall nor gpuhub-disk (the
    bench's stand-in); what ran before goes."""
    environ = environ_for(tmp_path, GPUHUB_ADVERTISE_ADDR="10.0.0.5")
    assert cli.main(["demo"], environ) == 0
    assert "gpuhub-disk" in machine.containers_running
    capsys.readouterr()
    assert cli.main(["demo"], {**environ, "GPUHUB_EGRESS": "off"}) == 0
    out = capsys.readouterr().out
    assert "disk watch: removed gpuhub-disk (GPUHUB_EGRESS=off)" in out
    assert "firewall: removed gpuhub-firewall and its rules (GPUHUB_EGRESS=off)" in out
    assert not {"gpuhub-disk", "gpuhub-firewall"} & set(machine.containers_running)
    assert cli.main(["demo"], {**environ, "GPUHUB_EGRESS": "off"}) == 0
    assert "disk watch: no disk watch here (GPUHUB_EGRESS=off)" in capsys.readouterr().out


def test_a_network_subnet_setting_deploys_the_subnet_overlay(tmp_path, machine):
    environ = environ_for(
        tmp_path, GPUHUB_ADVERTISE_ADDR="10.0.0.5", GPUHUB_NETWORK_SUBNET="10.120.0.0/20"
    )
    assert cli.main(["demo"], environ) == 0
    (deploy,) = machine.deploys
    assert deploy["files"] == ["stack.yml", "stack.http.yml", "stack.subnet.yml"]
    assert deploy["env"]["GPUHUB_NETWORK_SUBNET"] == "10.120.0.0/20"
    overlay = (REPO / "deploy" / "stack.subnet.yml").read_text()
    assert "subnet: ${GPUHUB_NETWORK_SUBNET}" in overlay


def test_make_demo_that_stops_after_deploying_says_how_to_remove_it(
    tmp_path, machine, monkeypatch, capsys
):
    monkeypatch.setattr(stack, "hub_answers", lambda config, environ: False)
    environ = environ_for(tmp_path, GPUHUB_ADVERTISE_ADDR="10.0.0.5")
    assert cli.main(["demo"], environ) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "--- gpuhub_proxy: running"
    assert err[-2].startswith("error: the hub did not answer at http://127.0.0.1:")
    assert err[-1] == commands.STOPPED_DEMO


def test_make_up_publishes_the_images_under_the_registrys_names(tmp_path, machine, capsys):
    config_file = tmp_path / "config.env"
    config_file.write_text(
        "GPUHUB_HOSTNAME=10.0.0.5\nGPUHUB_TLS=off\nGPUHUB_AUTH=local\nGPUHUB_ADMIN_USERS=ada\n"
        "GPUHUB_CPU_LIMIT=1\nGPUHUB_MEM_LIMIT=1G\nGPUHUB_PIDS_LIMIT=1024\n"
        "GPUHUB_ENVIRONMENTS=Standin=gpu-jupyterhub/standin:latest\n"
    )
    environ = environ_for(
        tmp_path, GPUHUB_CONFIG=str(config_file), GPUHUB_ADVERTISE_ADDR="10.0.0.5"
    )
    assert cli.main(["up"], environ) == 0
    out = capsys.readouterr().out
    (deploy,) = machine.deploys
    assert deploy["files"] == ["stack.yml", "stack.http.yml", "stack.registry.yml"]
    assert (
        deploy["env"]["GPUHUB_SINGLEUSER_IMAGE"] == "10.0.0.5:5000/gpu-jupyterhub/singleuser:latest"
    )
    assert (
        deploy["env"]["GPUHUB_ENVIRONMENTS"]
        == "Standin=10.0.0.5:5000/gpu-jupyterhub/standin:latest"
    )
    pushed = [c for c in machine.changes if c[0] in ("push", "run", "remove container")]
    # through the registry's writer on the manager's loopback (the registry itself is read-only)
    assert pushed == [
        ("run", "gpuhub-registry-push"),
        ("push", "127.0.0.1:5001/gpu-jupyterhub/singleuser:latest"),
        ("push", "127.0.0.1:5001/gpu-jupyterhub/standin:latest"),
        ("remove container", "gpuhub-registry-push"),
    ]
    (run,) = [kw for name, kw in machine.runs if name == "gpuhub-registry-push"]
    assert run["network_mode"] == "host"
    assert run["environment"] == {"REGISTRY_HTTP_ADDR": "127.0.0.1:5001"}
    assert machine.registry_writers == set()  # nothing takes pushes afterwards
    assert machine.images.get("10.0.0.5:5000/gpu-jupyterhub/singleuser:latest")  # tagged here
    assert f"settings checked: {config_file}" in out
    assert "GPU JupyterHub is up: http://10.0.0.5:" in out
    assert "    GPU machines pull the servers' images from 10.0.0.5:5000/\n" in out
    assert "    environments: Standin=gpu-jupyterhub/standin:latest; full GPU: admins\n" in out
    assert out.rstrip().endswith(
        "sudo ./worker_setup/setup.sh --manager 10.0.0.5:2377 --token SWMTKN-1-worker "
        "--slices-per-gpu 3 --registry 10.0.0.5:5000"
    )
    changed = list(machine.changes)
    assert cli.main(["up"], environ) == 0
    again = capsys.readouterr().out
    assert [c for c in machine.changes[len(changed) :] if c[0] != "tag"] == []
    assert "gpu-jupyterhub/singleuser:latest: in the registry already" in again


def test_a_failed_push_after_the_deploy_says_how_to_remove_it(tmp_path, machine, capsys):
    config_file = tmp_path / "config.env"
    config_file.write_text(
        "GPUHUB_HOSTNAME=10.0.0.5\nGPUHUB_TLS=off\nGPUHUB_AUTH=local\nGPUHUB_ADMIN_USERS=ada\n"
        "GPUHUB_CPU_LIMIT=1\nGPUHUB_MEM_LIMIT=1G\nGPUHUB_PIDS_LIMIT=1024\n"
    )
    machine.push_fails.add("127.0.0.1:5001/gpu-jupyterhub/singleuser:latest")
    environ = environ_for(
        tmp_path, GPUHUB_CONFIG=str(config_file), GPUHUB_ADVERTISE_ADDR="10.0.0.5"
    )
    assert cli.main(["up"], environ) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: docker push 127.0.0.1:5001/gpu-jupyterhub/singleuser:latest failed: "
        "denied: not allowed",
        commands.STOPPED_UP,
    ]


def test_make_down_twice_and_with_purge(tmp_path, machine, capsys, monkeypatch):
    monkeypatch.setattr(engine, "running", lambda env=None: True)
    environ = environ_for(tmp_path, GPUHUB_ADVERTISE_ADDR="10.0.0.5")
    assert cli.main(["demo"], environ) == 0
    capsys.readouterr()
    assert cli.main(["down"], environ) == 0
    out = capsys.readouterr().out
    assert "removing stack gpuhub" in out
    # no servers run here any more: the firewall's keeper and its rules go too
    assert "firewall: removed gpuhub-firewall and its rules" in out
    assert ("docker run", "(one-off)", "host-remove") in machine.changes
    assert "gpuhub-firewall" not in machine.containers_running
    assert "disk watch: removed gpuhub-disk" in out
    assert ("docker rm", "gpuhub-disk") in machine.changes
    assert "gpuhub-disk" not in machine.containers_running
    assert (
        "kept the hub database and user homes (volumes); remove them too with: make down PURGE=1"
        in out
    )
    assert (tmp_path / "state" / "demo_password").exists()
    assert cli.main(["down", "--purge"], environ) == 0
    out = capsys.readouterr().out
    assert "stack gpuhub: not deployed" in out and "removed generated secrets in" in out
    assert not (tmp_path / "state").exists()
    assert out.splitlines()[-1].endswith(
        "stack gpuhub removed. The swarm, the Docker engine and the images stay."
    )


def test_make_down_without_a_swarm_has_nothing_to_remove(tmp_path, fake, monkeypatch, capsys):
    monkeypatch.setattr(engine, "running", lambda env=None: True)
    fake.services["gpuhub_hub"] = SERVICE  # what a swarm left would hold: never asked for
    assert cli.main(["down"], environ_for(tmp_path)) == 0
    assert capsys.readouterr().out.endswith(
        "no swarm on this machine: nothing deployed to remove\n"
    )
    assert fake.changes == []


def test_make_down_without_an_engine_has_nothing_to_remove(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engine, "running", lambda env=None: False)
    assert cli.main(["down"], environ_for(tmp_path)) == 0
    assert capsys.readouterr().out.endswith(
        "the Docker engine is not running: nothing deployed to remove\n"
    )


# ---- machines: join line, pause, image file -----------------------------------------------------


def test_the_join_line_keeps_no_firewall_or_disk_watch_only_when_the_servers_have_none():
    """GPUHUB_EGRESS=off: an image without our programs, gpuhub-firewall and gpuhub-disk."""
    line = steps.join_command("10.0.0.5", "T", 3, contract.SINGLEUSER_IMAGE, firewall=False)
    assert line.endswith("--slices-per-gpu 3 --no-firewall --no-disk-watch")
    line = steps.join_command("10.0.0.5", "T", 3, contract.SINGLEUSER_IMAGE)
    assert "--no-firewall" not in line and "--no-disk-watch" not in line


def test_the_join_line_names_the_registry_when_the_stack_runs_one():
    assert steps.join_command("10.0.0.5", "SWMTKN-1-x", 3, "gpu-jupyterhub/singleuser:latest") == (
        "# On each GPU machine, as root, in a checkout of this repository (add --image-tar FILE,\n"
        "# made by 'make image-tar' here, when the machine cannot pull "
        "gpu-jupyterhub/singleuser:latest):\n"
        "sudo ./worker_setup/setup.sh --manager 10.0.0.5:2377 --token SWMTKN-1-x --slices-per-gpu 3"
    )
    with_registry = steps.join_command(
        "10.0.0.5", "T", 4, contract.SINGLEUSER_IMAGE, registry="10.0.0.5:5000"
    )
    assert with_registry.endswith("--slices-per-gpu 4 --registry 10.0.0.5:5000")
    assert "pulls the\n# single-user image from this machine's registry" in with_registry


def test_the_join_line_names_the_single_user_image_when_it_is_not_the_default():
    """The GPU machine reads no settings of its own: the image it joins for is the line's."""
    line = steps.join_command("10.0.0.5", "T", 3, "uni.example:5000/course/su:7", "10.0.0.5:5000")
    assert line.endswith("--registry 10.0.0.5:5000 --image uni.example:5000/course/su:7")
    defaults = settings.read_defaults(str(REPO / "deploy" / "settings.env"))
    assert defaults["GPUHUB_SINGLEUSER_IMAGE"][0] == contract.SINGLEUSER_IMAGE  # one default


def test_join_command_on_a_machine_that_is_no_manager(tmp_path, fake):
    with pytest.raises(DeployError, match="not a swarm manager; run 'make demo'"):
        steps.print_join_command(fake, make_config(tmp_path))


def test_pause_and_resume_a_machine(fake, said):
    fake.node_list = [node("gpu1", [])]
    steps.set_node_availability(fake, "gpu1", "pause", said.log)
    steps.set_node_availability(fake, "gpu1", "pause", said.log)
    assert [c[:2] for c in fake.changes] == [("node update", "gpu1")]
    assert fake.changes[0][2]["Availability"] == "pause"
    assert said.lines() == [
        "gpu1 takes no new servers; its running servers stay. "
        "On gpu1: sudo ./worker_setup/setup.sh --leave --wait 600",
        "gpu1: paused already; nothing to change",
    ]
    steps.set_node_availability(fake, "gpu1", "active", said.log)
    assert said.lines()[-1] == "gpu1 takes new servers again"
    with pytest.raises(DeployError, match="no machine 'gpu9' in this swarm"):
        steps.set_node_availability(fake, "gpu9", "pause", said.log)
    with pytest.raises(DeployError, match=r"^name the machine: make resume-node NODE=<hostname>$"):
        steps.set_node_availability(fake, "", "active", said.log)


def test_the_image_file_keeps_the_images_name(tmp_path, fake, said):
    config = make_config(tmp_path)
    steps.ensure_images(fake, config, said.log)
    # `make up` tags it for the registry too (first in the engine's list): the file must still
    # hold the name the GPU machines look for
    image = fake.images.get(config.singleuser_image)
    tags = dict(fake.tags)
    fake.tags.clear()
    fake.tags["10.0.0.5:5000/gpu-jupyterhub/singleuser:latest"] = image
    fake.tags.update(tags)
    tar = tmp_path / "out" / "su.tar"
    steps.save_image_tar(fake, config, said.log, {"GPUHUB_IMAGE_TAR": str(tar)})
    assert tar.read_bytes() == f"tar of {image.id} as {config.singleuser_image}".encode()
    assert said.lines()[-1] == (
        f"copy {tar} to each GPU machine and add --image-tar su.tar to the join command"
    )


# ---- settings: one reader, as deployed ----------------------------------------------------------


def settings_out(capsys, argv, environ) -> tuple[int, str, str]:
    code = cli.main(argv, environ)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_settings_from_the_environment_win(tmp_path, capsys):
    config_file = tmp_path / "config.env"
    config_file.write_text("GPUHUB_STACK=fromfile\nGPUHUB_HTTP_PORT=8080\n")
    environ = {"GPUHUB_CONFIG": str(config_file), "GPUHUB_STACK": "mystack"}
    code, out, _ = settings_out(
        capsys, ["settings", "GPUHUB_STACK", "GPUHUB_HTTP_PORT", "GPUHUB_STATE_DIR"], environ
    )
    assert code == 0
    assert out.split() == ["mystack", "8080", "/var/lib/gpu-jupyterhub/mystack"]
    code, out, _ = settings_out(capsys, ["settings", "--json"], environ)
    assert json.loads(out)["GPUHUB_STACK"] == "mystack"


def test_any_value_survives_the_way_to_the_shell():
    """``python -m deploy settings`` prints export lines that bash (tests/bed/bed.sh) evals."""
    secret = "a'b\"c$d`e\\f g\n#h ~i é"
    environ = {"PATH": os.environ["PATH"], "GPUHUB_CONFIG": "none"}
    printed = subprocess.run(
        [sys.executable, "-m", "deploy", "settings"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**environ, "GPUHUB_GITHUB_CLIENT_SECRET": secret},
        check=True,
    ).stdout
    result = subprocess.run(  # a shell without the value in its environment
        ["bash", "-c", 'set -e; eval "$1"; printf %s "$GPUHUB_GITHUB_CLIENT_SECRET"', "-", printed],
        capture_output=True,
        text=True,
        env=environ,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == secret


@pytest.mark.parametrize("line, value", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_each_odd_line_reaches_the_stack_as_meant_or_stops_the_deploy(
    tmp_path, fake, capsys, line, value, monkeypatch
):
    key = key_of(line)
    config_file = tmp_path / "config.env"
    config_file.write_text(f"# the organizer's file\n{line}\n", newline="")
    config_file.chmod(0o600)
    monkeypatch.setattr(steps, "DockerCLI", FakeDockerCLI(fake))
    monkeypatch.setattr(stack, "hub_answers", lambda config, environ: True)
    steps.ensure_images(fake, make_config(tmp_path), Log(out=io.StringIO()))
    # a hostname for the lines that turn HTTPS on
    environ = environ_for(tmp_path, GPUHUB_CONFIG=str(config_file), GPUHUB_HOSTNAME="10.0.0.5")
    code = cli.main(["stack"], environ)
    captured = capsys.readouterr()
    assert SECRET not in captured.err + captured.out
    if isinstance(value, Refused):
        assert code == 1
        assert "config.env line 2: " in captured.err and value.says in captured.err
        assert fake.deploys == []  # stopped before the deploy
    else:
        assert code == 0, captured.err
        (deploy,) = fake.deploys
        # the value meant, in the one written form the checked setting has (org-a,org-b)
        meant = expected(line, value)
        if key in settings.WRITTEN:
            meant = settings.WRITTEN[key](settings.CONVERTERS[key](meant))
        assert deploy["env"][key] == meant


def test_check_knows_the_verbs_of_the_cli(capsys):
    (verbs,) = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(verbs.choices) - {"check"} == set(cli.VERBS)
    assert cli.main(["check", "frobnicate"], {"GPUHUB_CONFIG": "none"}) == 1
    assert capsys.readouterr().err == "error: unknown verb 'frobnicate'; make help lists them\n"


# ---- the shared folders ---------------------------------------------------------------------


def test_the_shared_folders_are_marked_and_named_in_the_join_line(tmp_path, fake, said, capsys):
    shared = tmp_path / "nfs"
    config = make_config(
        tmp_path,
        GPUHUB_TUTORIAL_REPOS="t=https://h/t.git",
        GPUHUB_TUTORIALS_DIR=str(shared / "tutorials"),
        GPUHUB_DATASETS_DIR=str(shared / "datasets"),
        GPUHUB_HOMES_DIR=str(shared / "homes"),
        GPUHUB_GUARD_MODE="enforce",
    )
    steps.ensure_images(fake, config, said.log)
    umask = os.umask(0o077)  # an organizer's strict umask: the markers are readable anyway
    try:
        stack.deploy_stack(fake, config, said.log, environ={"PATH": "/bin"})
    finally:
        os.umask(umask)
    share_id = (tmp_path / "state" / "share_id").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{16}", share_id)
    folders = [str(shared / n) for n in ("tutorials", "datasets", "homes")]
    for folder in folders:
        marker = Path(folder, ".gpuhub-share")
        assert marker.read_text().splitlines()[0] == share_id
        assert oct(marker.stat().st_mode & 0o777) == "0o644"  # root-squashed readers too
        assert f"shared folder {folder}: marked as this hub's (.gpuhub-share)" in said.lines()
    # the join line names each with its id; nothing is written again
    said.clear()
    fake.swarm.init(advertise_addr="10.0.0.5")
    steps.print_join_command(fake, config, said.log)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("sudo ")]
    shared = "".join(f" --shared-folder {f}={share_id}" for f in folders)
    assert line.endswith(f"{shared} --guard-mode enforce")  # the guard's options last
    assert said.lines() == []
    # a marker changed since (a participant of a writable dataset cache) is put back
    Path(folders[1], ".gpuhub-share").write_text("changed\n")
    assert steps.ensure_share_marks(config, said.log) == dict.fromkeys(folders, share_id)
    assert Path(folders[1], ".gpuhub-share").read_text().startswith(f"{share_id}\n")
    assert said.lines() == [f"shared folder {folders[1]}: marked as this hub's (.gpuhub-share)"]


def test_without_tutorial_repositories_or_other_shared_folders_the_line_names_none(
    tmp_path, fake, said, capsys
):
    config = make_config(tmp_path)
    fake.swarm.init(advertise_addr="10.0.0.5")
    steps.print_join_command(fake, config, said.log)
    assert "--shared-folder" not in capsys.readouterr().out
    assert steps.shared_folders(config) == []


def test_a_marker_that_cannot_be_written_stops_the_deploy_with_the_fix(tmp_path, said):
    homes = tmp_path / "nfs" / "homes"
    (homes / ".gpuhub-share.tmp").mkdir(parents=True)  # in the way, even of root
    config = make_config(tmp_path, GPUHUB_HOMES_DIR=str(homes))
    with pytest.raises(DeployError) as refused:
        steps.ensure_share_marks(config, said.log)
    assert str(refused.value).startswith(f"cannot write {homes}/.gpuhub-share (Is a directory)")
    assert "export it to the manager with no_root_squash" in str(refused.value)
