"""Test helpers: deploy the stack under test, talk to its hub, inspect Swarm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import requests

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"  # screenshots of browser tests


def _bed_settings() -> dict[str, str]:
    """tests/bed/bed.env: the bed's names and addresses, shared with tests/bed/bed.sh."""
    lines = (REPO / "tests/bed/bed.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith("BED_"))


BED = _bed_settings()
#: this machine on the bed's bridge: the tests' git daemon and fake GitHub listen here, and
#: containers on every bed machine reach it
BED_HOST = BED["BED_HOST_ADDR"]
#: the bed's swarm manager, in a network namespace of its own: ports the stack publishes are here
BED_MANAGER = BED["BED_MANAGER_ADDR"]
#: /run/gpu-jupyterhub-bed: NAME.sock is bed machine NAME's engine, NAME.root a fresh machine's /
BED_RUN = Path(BED["BED_RUN"])


#: where this machine (and its browser) reaches the ports the stack under test publishes: the
#: bed's manager (tests/bed/bed.sh env sets it, for the deploy's check that the hub answers too)
ENGINE_ADDR = os.environ.get("GPUHUB_ENGINE_ADDR", "127.0.0.1")


def hub_url(port: int | str, scheme: str = "http") -> str:
    """The URL of a port the stack under test publishes."""
    return f"{scheme}://{ENGINE_ADDR}:{port}"


def deploy(*args: str) -> str:
    """``python -m deploy ARGS`` with the test settings (this process's environment, which the
    integration conftest points at the stack under test); its output, shown on failure."""
    result = subprocess.run(
        [sys.executable, "-m", "deploy", *args], cwd=REPO, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"python -m deploy {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        )
    return result.stdout


def settings() -> dict[str, str]:
    """The checked settings (deploy/settings.env with the environment's overrides), as the
    deploy sees them."""
    return json.loads(deploy("settings", "--json"))


class Hub:
    """The hub's REST API, authenticated with the operations token."""

    def __init__(
        self,
        url: str,
        token: str,
        password: str,
        stack: str,
        verify: str | bool = True,
        admin_password: str = "",
    ):
        self.url = url
        self.password = password  # the participants' shared password (GPUHUB_AUTH=local)
        self.admin_password = admin_password  # the admins' own
        self.stack = stack
        self.verify = verify  # a CA file: the certificate of the stack's HTTPS gateway
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        # verify per request: a session's verify loses to REQUESTS_CA_BUNDLE
        url = f"{self.url}/hub/api{path}"
        return self.session.request(method, url, timeout=30, verify=self.verify, **kwargs)

    def server(self, user: str) -> dict | None:
        r = self.api("GET", f"/users/{user}")
        r.raise_for_status()
        return r.json()["servers"].get("")

    def wait_ready(self, user: str, timeout: float = 120) -> float:
        """Seconds until the user's server is ready; the last state goes into the error."""
        start = time.monotonic()
        delay = 0.2
        server = None
        while time.monotonic() - start < timeout:
            server = self.server(user)
            if server and server["ready"]:
                return time.monotonic() - start
            time.sleep(delay)
            delay = min(delay * 1.5, 2)
        raise TimeoutError(f"server of {user} not ready after {timeout} s; last state {server}")

    def wait_stopped(self, user: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server(user) is None:
                return
            time.sleep(0.5)
        raise TimeoutError(f"server of {user} still there after {timeout} s: {self.server(user)}")

    def stop(self, user: str) -> None:
        r = self.api("DELETE", f"/users/{user}/server")
        # 400: not running; 404: no such user (a test that failed before its user started)
        assert r.status_code in (202, 204, 400, 404), r.text
        if r.status_code != 404:
            self.wait_stopped(user)


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


def launch_chromium(playwright, secure: str):
    """Debian's headless Chromium (never a downloaded browser), treating the hub's plain-HTTP
    address ``secure`` as secure (the browser fixture in conftest.py says why)."""
    args = [*CHROMIUM_ARGS, f"--unsafely-treat-insecure-origin-as-secure={secure}"]
    return playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=args)


def log_in(page, hub: Hub, user: str, password: str | None = None) -> None:
    """Log in on the hub's login page (the demo's shared password unless ``password``)."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password or hub.password)
    page.click("#login_submit")


def open_dashboard(browser, hub: Hub):
    """A page of its own, logged in as the admin, showing the organizer's dashboard."""
    page = browser.new_context(ignore_https_errors=True).new_page()
    log_in(page, hub, "admin", hub.admin_password)
    page.wait_for_url("**/hub/**", timeout=30_000)
    page.goto(f"{hub.url}/services/dashboard/")
    page.wait_for_selector("[data-machine]", timeout=30_000)
    return page


def dump_logs(stack: str) -> str:
    """What a red test needs: hub log, and the state of every service of this stack."""
    client = docker.from_env()
    parts = []
    for service in client.services.list():
        labels = service.attrs["Spec"].get("Labels", {})
        ours = labels.get("com.docker.stack.namespace") == stack or (
            labels.get("gpu-jupyterhub.stack") in (stack, stack + "-direct")  # spawners.DIRECT
        )
        if not ours:
            continue
        tasks = [(t["Status"]["State"], t["Status"].get("Err", "")) for t in service.tasks()]
        parts.append(f"--- service {service.name}: tasks {tasks}")
        logs = b"".join(service.logs(stdout=True, stderr=True, tail=60))
        parts.append(logs.decode(errors="replace"))
    return "\n".join(parts)


def engine_of(node_id: str) -> docker.DockerClient:
    """The engine of a swarm node: the bed's manager, a worker's or a fresh machine's
    (tests/bed/bed.sh)."""
    client = docker.from_env()
    hostname = client.nodes.get(node_id).attrs["Description"]["Hostname"]
    socket = BED_RUN / f"{hostname}.sock"
    if socket.exists():
        return docker.DockerClient(base_url=f"unix://{socket}")
    return client


def container_of(service_name: str) -> docker.models.containers.Container:
    """The running container of a single-task service, on whichever node runs it."""
    client = docker.from_env()
    (service,) = client.services.list(filters={"name": service_name})
    running = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    assert len(running) == 1, f"{service_name}: tasks {[t['Status'] for t in service.tasks()]}"
    container_id = running[0]["Status"]["ContainerStatus"]["ContainerID"]
    return engine_of(running[0]["NodeID"]).containers.get(container_id)


def container_env(container) -> dict[str, str]:
    result = container.exec_run(["env"])
    assert result.exit_code == 0, result.output
    return dict(line.split("=", 1) for line in result.output.decode().splitlines() if "=" in line)


def state_file(settings: dict[str, str], name: str) -> str:
    return Path(settings["GPUHUB_STATE_DIR"], name).read_text().strip()


def in_ci() -> bool:
    return bool(os.environ.get("CI"))
