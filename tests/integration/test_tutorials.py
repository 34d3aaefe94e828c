"""Tutorials from git into running servers: the sync service in the stack, the read-only share,
the start hook in a real container. The "GitHub" remote is a bare repository served by
git daemon on the bed's bridge (this machine's address there, BED_HOST)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.sync.gitrepos import ServedRemote, signed_push

from .conftest import DATASETS, TUTORIAL_REMOTE, TUTORIAL_REMOTES
from .hub import BED_HOST, container_of, state_file

pytestmark = pytest.mark.integration

# a new user per run: a home volume left on a worker by an earlier run holds its own record
USER = f"ci-tut{os.getpid()}"
SERVICE = f"jy-{USER.replace('-', '-2d')}"
FILE = "/srv/tutorials/gpu101"
# the same remote, never polled (conftest's TUTORIAL_REPOS): only a webhook publishes a push there
HOOKED = "/srv/tutorials/gpu101-hook"


@pytest.fixture(scope="module")
def author(hub):
    """The bare remote gpu101.git, an author's clone of it, and git daemon serving it."""
    remote = ServedRemote(Path(TUTORIAL_REMOTES), "gpu101", address=BED_HOST)
    remote.author.write("01-intro.ipynb", '{"cells": [], "v": 1}')
    remote.author.commit_and_push("first")
    yield remote.author
    remote.close()


def sync_status(hub) -> dict:
    r = hub.session.get(f"{hub.url}/services/tutorial-sync/status", timeout=10)
    r.raise_for_status()
    return {s["name"]: s for s in r.json()["repos"]}


def wait(condition, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - t0


def send_push(hub, hub_settings, secret: str = ""):
    """GitHub's signed push event for the remote's main branch, through the hub's proxy."""
    body, headers = signed_push(
        TUTORIAL_REMOTE,
        secret or state_file(hub_settings, "webhook_secret"),
        delivery=f"ci-{time.time()}",
    )
    return hub.session.post(f"{hub.url}/services/tutorial-sync/webhook", data=body, headers=headers)


@pytest.fixture(scope="module")
def server(hub, hub_settings, author):
    # the share may still hold an earlier run's tutorials: wait for this remote's commit, polled
    # into gpu101; gpu101-hook (never polled) gets it from a webhook
    head = author.git("rev-parse", "HEAD")
    wait(lambda: sync_status(hub)["gpu101"]["commit"] == head, 30, "first publish")
    # 200: synced; 202: still syncing when GitHub's patience would end (webhook_wait)
    assert send_push(hub, hub_settings).status_code in (200, 202)
    wait(lambda: sync_status(hub)["gpu101-hook"]["commit"] == head, 30, "first webhook publish")
    hub.api("POST", f"/users/{USER}")
    r = hub.api("POST", f"/users/{USER}/server")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(USER)
    yield container_of(SERVICE)
    hub.stop(USER)


def read(container, path: str, user: str = "jovyan") -> str | None:
    result = container.exec_run(["cat", path], user=user)
    return result.output.decode() if result.exit_code == 0 else None


def test_the_server_starts_with_the_tutorials_in_its_home(server):
    log = server.logs().decode(errors="replace")
    assert "tutorials: 2 copy" in log, f"the start hook did not copy the tutorials:\n{log[-3000:]}"
    assert read(server, "/home/jovyan/tutorials/gpu101/01-intro.ipynb") == '{"cells": [], "v": 1}'
    assert read(server, "/home/jovyan/tutorials/gpu101-hook/01-intro.ipynb") == (
        '{"cells": [], "v": 1}'
    )
    assert read(server, f"{FILE}/01-intro.ipynb") == '{"cells": [], "v": 1}'


def test_root_in_the_container_cannot_write_or_remount_the_share(server):
    for command in (
        ["touch", f"{FILE}/hacked"],
        ["sh", "-c", f"echo x > {FILE}/01-intro.ipynb"],
        ["mount", "-o", "remount,rw", "/srv/tutorials"],
    ):
        result = server.exec_run(command, user="root")
        assert result.exit_code != 0, f"{command} succeeded as root: {result.output}"
    assert read(server, f"{FILE}/01-intro.ipynb") == '{"cells": [], "v": 1}'


def test_a_signed_webhook_makes_a_push_readable_in_the_server_within_5_s(
    hub, hub_settings, author, server
):
    """Measured on gpu101-hook, which is never polled: the webhook alone brings the push there
    (the polling test below checks that premise)."""
    assert sync_status(hub)["gpu101-hook"]["polled"] is False
    author.write("02-new.ipynb", '{"v": "webhook"}')
    new = author.commit_and_push("via webhook")
    t0 = time.monotonic()
    r = send_push(hub, hub_settings)
    assert r.status_code == 200 and sorted(r.json()["synced"]) == ["gpu101", "gpu101-hook"], r.text
    wait(lambda: read(server, f"{HOOKED}/02-new.ipynb") == '{"v": "webhook"}', 5, "webhook push")
    print(f"push -> readable in the server (webhook): {time.monotonic() - t0:.2f} s")
    assert sync_status(hub)["gpu101-hook"]["commit"] == new

    bad = send_push(hub, hub_settings, secret="not the webhook's secret")
    assert bad.status_code == 401


def test_polling_makes_a_push_readable_within_the_interval_plus_2_s(hub, author, server):
    author.write("03-polled.ipynb", '{"v": "poll"}')
    author.commit_and_push("via polling")
    elapsed = wait(
        lambda: read(server, f"{FILE}/03-polled.ipynb") == '{"v": "poll"}', 2 + 2, "polled push"
    )
    print(f"push -> readable in the server (polling every 2 s): {elapsed:.2f} s")
    status = sync_status(hub)
    assert status["gpu101"]["commit"] == author.git("rev-parse", "HEAD")
    assert status["gpu101"]["last_error"] == ""
    # two more polls: the webhook-only gpu101-hook (the webhook test's measure) still lacks it
    time.sleep(2 * 2)
    assert sync_status(hub)["gpu101-hook"]["commit"] == author.git("rev-parse", "HEAD~1")
    assert read(server, f"{HOOKED}/03-polled.ipynb") is None


def test_the_shared_dataset_cache_is_mounted_read_only(server):
    Path(DATASETS, "mnist.csv").write_text("label,pixels\n")
    assert read(server, "/srv/datasets/mnist.csv") == "label,pixels\n"
    result = server.exec_run(["touch", "/srv/datasets/mine.csv"], user="root")
    assert result.exit_code != 0, "GPUHUB_DATASETS_MODE=ro: not writable, not even by root"
