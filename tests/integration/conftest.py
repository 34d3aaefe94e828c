import os
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from .hub import (
    BED,
    BED_HOST,
    REPO,
    Hub,
    deploy,
    dump_logs,
    hub_url,
    launch_chromium,
    settings,
    state_file,
)

# The stack under test never touches the demo's: its own name, port and network, whatever the
# caller's environment says (GPUHUB_TEST_STACK / _HTTP_PORT / _NETWORK choose others).
_TEST_STACK = {"STACK": "gpuhub-test", "HTTP_PORT": "18000", "NETWORK": "jhub-test"}
# servers of a machine that disappears are noticed within seconds, not the default 30
_TEST_STACK["POLL_INTERVAL"] = "5"
# the tutorial "GitHub": a bare repository served by git daemon on the bed's bridge
# (tests/integration/test_tutorials.py creates it), published twice: as gpu101, polled every 2 s,
# and as gpu101-hook, never polled (":webhook"), where only a webhook can bring a push
TUTORIAL_REMOTES = f"{BED['BED_DATA']}/test-remotes"
TUTORIAL_REMOTE = f"git://{BED_HOST}:9418/gpu101.git"
_TEST_STACK["TUTORIAL_REPOS"] = (
    f"gpu101={TUTORIAL_REMOTE} gpu101-hook={TUTORIAL_REMOTE}#main:webhook"
)
_TEST_STACK["TUTORIAL_POLL"] = "2"
# The folders servers mount live on the bed's shared storage (what the manager's NFS export is
# on an installed hub; every fresh machine has it mounted): the published tutorials, and a shared
# dataset cache, read-only in servers. HOMES: participants' homes, for the tests that deploy
# the stack with GPUHUB_HOMES_DIR (tests/integration/test_homes.py).
SHARED = Path(BED["BED_SHARED"])
_TEST_STACK["TUTORIALS_DIR"] = str(SHARED / "tutorials")
DATASETS = str(SHARED / "datasets")
_TEST_STACK["DATASETS_DIR"] = DATASETS
HOMES = str(SHARED / "homes")
# the waiting line as organizers get it (offered on the refusal), at most 6 waiting
_TEST_STACK["WAITING_LINE"] = "offer"
_TEST_STACK["LINE_MAX_LENGTH"] = "6"
# Prometheus scrapes every 5 s: the dashboard's plots have points within the test
_TEST_STACK["METRICS_INTERVAL"] = "5s"
# the servers' network in a range of its own (deploy/stack.subnet.yml)
_TEST_STACK["NETWORK_SUBNET"] = "10.213.0.0/22"
_TEST_STACK["CONFIG"] = "none"  # an organizer's ./config.env is not the test stack's
for _name, _value in _TEST_STACK.items():
    os.environ[f"GPUHUB_{_name}"] = os.environ.get(f"GPUHUB_TEST_{_name}", _value)


@pytest.fixture
def browser(hub_settings):
    """Debian's headless Chromium through Playwright (never a downloaded browser). Per test:
    Playwright's sync API keeps an event loop running while it is open, which the asyncio
    tests that follow could not start theirs beside.

    The bed's hub is plain HTTP on a bed address, which Chromium treats as insecure: it would
    not mark fetches (``Sec-Fetch-Mode``), so JupyterHub would skip the XSRF checks that an
    organizer's browser meets on HTTPS or on localhost. The hub's address is treated as secure,
    as those are (a dashboard that drew nothing in ``make demo`` passed on the bed without)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = launch_chromium(p, hub_url(hub_settings["GPUHUB_HTTP_PORT"]))
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page (own cookies) that accepts the self-signed certificate of the test's
    HTTPS gateway."""
    context = browser.new_context(ignore_https_errors=True)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="session")
def hub_settings():
    return settings()


@pytest.fixture(scope="session")
def hub(hub_settings):
    """The stack under test, deployed once for the session and removed afterwards. One that an
    interrupted run left behind (its servers holding slices, its users in the database, its
    plots' data) is removed first, unless it is kept on purpose (GPUHUB_TEST_KEEP_STACK=1)."""
    stack = hub_settings["GPUHUB_STACK"]
    client = docker.from_env()
    services = client.services
    left = [
        *services.list(filters={"label": f"com.docker.stack.namespace={stack}"}),
        *services.list(filters={"label": f"gpu-jupyterhub.stack={stack}"}),  # its servers
        # its volumes (the hub's database, Prometheus' data), also where its services went
        # without them (tests/bed/bed.sh up drops a killed run's services)
        *client.volumes.list(filters={"label": f"com.docker.stack.namespace={stack}"}),
    ]
    for service in services.list(filters={"label": f"gpu-jupyterhub.stack={stack}-direct"}):
        service.remove()  # servers a test made without the hub (spawners.py) and left
    keep = os.environ.get("GPUHUB_TEST_KEEP_STACK") == "1"
    if left and not keep:
        deploy("down", "--purge")
    if not (left and keep):  # the shared storage as a new stack finds it: empty
        empty_shared_storage()
    deploy("stack")
    port = hub_settings["GPUHUB_HTTP_PORT"]
    yield Hub(
        hub_url(port),
        token=state_file(hub_settings, "ops_token"),
        password=state_file(hub_settings, "demo_password"),
        admin_password=state_file(hub_settings, "admin_password"),
        stack=hub_settings["GPUHUB_STACK"],
    )
    if not keep:  # kept for a quicker next run
        deploy("down", "--purge")
        empty_shared_storage()


def empty_shared_storage() -> None:
    """What `down --purge` is to the state directory: the test stack's shared folders go."""
    for name in ("tutorials", "datasets", "homes"):
        shutil.rmtree(SHARED / name, ignore_errors=True)


@pytest.fixture(autouse=True)
def logs_on_failure(request):
    """A red integration test prints the hub log and the stack's service states."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "hub" in request.fixturenames:
        stack = request.getfixturevalue("hub_settings")["GPUHUB_STACK"]
        print(dump_logs(stack))


@pytest.fixture(scope="session")
def bed():
    """Drive tests/bed/bed.sh: bed("stop", "w1"), bed("up", "2")."""

    def run(*args):
        result = subprocess.run(
            ["bash", str(REPO / "tests/bed/bed.sh"), *args], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"bed.sh {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")

    return run
