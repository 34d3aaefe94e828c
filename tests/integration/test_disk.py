"""A participant's disk, on the bed: their budget, and a disk that never fills
(docs/participants.md#disk).

Every machine that runs servers has its disk watch (``gpuhub-disk``, started by the join and
the tests' deploy). Here, as participants do it, from inside their servers as uid 1000:

- the stack deployed with homes on shared storage that is small (a tmpfs of ``SHARE_MB``), a
  budget of 50 MB and a safety line of 60%: a participant over the budget sees the warning on
  their JupyterLab page; one writing into their home without end is stopped before the
  storage fills, told why on their page, and their files are kept, while the others' servers
  keep answering; the organizer's dashboard lists the stop;
- a machine's own disk: a server writing into ``/tmp`` (its container's writable layer) past
  a line set just above the disk's fill now is paused, and the other server on that machine
  and its engine keep answering.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import docker
import pytest
import requests

from gpu_swarm_spawner import contract

from .aftermath import token_of
from .hub import ARTIFACTS, BED, deploy, engine_of, log_in, open_dashboard

pytestmark = pytest.mark.integration

SHARE_MB = 512
#: how fast bob writes: from the 60% line to a full storage (205 MB) takes him 25 s, more than
#: two rounds of the watch (the room docs/organizer.md#disk asks the organizer to leave)
BOB_MB_S = 8
SMALL = Path(BED["BED_RUN"]) / "small" / "disk-homes"
ANN, BOB, CY = "disk-ann", "disk-bob", "disk-cy"

#: run as uid 1000 in a server: write ``MB`` megabytes in 4 MB pieces into the file ``$1``, at
#: most ``RATE`` MB/s, printing how far it got; a full disk ends it with "full at N"
WRITER = """
import os, sys, time
path, total, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
piece = os.urandom(4 << 20)
written = 0
with open(path, "wb") as f:
    while written < total:
        try:
            f.write(piece); f.flush(); os.fsync(f.fileno())
        except OSError as e:
            print("full at", written, e, flush=True); sys.exit(3)
        written += 4
        print(written, flush=True)
        time.sleep(4 / rate)
print("done", written, flush=True)
"""


@pytest.fixture(scope="module")
def small_homes(hub):
    """The stack with homes on a small file system of their own, a 50 MB budget and a 60%
    safety line; the suite's own stack again afterwards."""
    SMALL.mkdir(parents=True, exist_ok=True)
    subprocess_run(["mountpoint", "-q", str(SMALL)]) or subprocess_run(
        ["mount", "-t", "tmpfs", "-o", f"size={SHARE_MB}m,mode=0755", "gjbed-disk", str(SMALL)]
    )
    settings = {
        "GPUHUB_HOMES_DIR": str(SMALL),
        "GPUHUB_DISK_BUDGET_GB": "0.05",
        "GPUHUB_DISK_SAFETY_PERCENT": "60",
    }
    os.environ.update(settings)
    try:
        deploy("stack")
        yield SMALL
    finally:
        for user in (ANN, BOB, CY):
            hub.stop(user)
        for key in settings:
            del os.environ[key]
        deploy("stack")
        subprocess_run(["umount", str(SMALL)])


def subprocess_run(command: list[str]) -> bool:
    return subprocess.run(command, capture_output=True).returncode == 0


def start(hub, user: str) -> None:
    """``user``'s server running (started unless it runs)."""
    assert hub.api("POST", f"/users/{user}").status_code in (201, 409)
    r = hub.api("POST", f"/users/{user}/server")
    assert r.status_code in (201, 202, 400), r.text  # 400: running already
    hub.wait_ready(user, timeout=180)


def server_container(hub, user: str):
    """The running container of ``user``'s server, on whichever machine runs it."""
    client = docker.from_env()
    (service,) = client.services.list(
        filters={"label": [f"{contract.USER_LABEL}={user}", f"{contract.STACK_LABEL}={hub.stack}"]}
    )
    (task,) = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    engine = engine_of(task["NodeID"])
    return engine, engine.containers.get(task["Status"]["ContainerStatus"]["ContainerID"])


def fill_percent(path: Path) -> float:
    v = os.statvfs(path)
    used = (v.f_blocks - v.f_bfree) * v.f_frsize
    return 100.0 * used / (used + v.f_bavail * v.f_frsize)


def answers(hub, user: str, token: str) -> bool:
    try:
        r = requests.get(
            f"{hub.url}/user/{user}/api/status",
            headers={"Authorization": f"token {token}"},
            timeout=5,
        )
    except requests.RequestException:
        return False
    return r.status_code == 200


def test_over_the_budget_the_participant_is_warned_on_their_page(small_homes, hub, page):
    start(hub, ANN)
    _, container = server_container(hub, ANN)
    result = container.exec_run(
        ["python3", "-c", WRITER, "/home/jovyan/dataset.bin", "60", "1000"], user="1000"
    )
    assert result.exit_code == 0, result.output.decode()
    log_in(page, hub, ANN)
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    t0 = time.monotonic()
    warning = page.locator(".Toastify__toast", has_text="Disk use over your budget")
    warning.first.wait_for(timeout=45_000)  # a round of the watch (10 s), a poll of the page
    print(f"over budget -> warning on her page: {time.monotonic() - t0:.1f} s")
    warning.first.get_by_role("button", name="Read all").click()
    text = page.locator(".gpuhub-notices-details").inner_text()
    assert "your budget is 51 MB" in text and "home 60 MB" in text, text
    # back within it: told so
    assert container.exec_run(["rm", "/home/jovyan/dataset.bin"], user="1000").exit_code == 0
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        notices = container.exec_run(["cat", "/tmp/gpuhub-guard/disk-notices.json"]).output
        if b"within your budget again" in notices:
            break
        time.sleep(2)
    else:
        raise AssertionError(f"never told she is within her budget again: {notices!r}")


def test_a_participant_filling_the_homes_storage_is_stopped_and_told_and_the_others_go_on(
    small_homes, hub, browser
):
    for user in (ANN, BOB, CY):
        start(hub, user)
    tokens = {user: token_of(hub, user) for user in (ANN, CY)}
    engine, bob = server_container(hub, BOB)
    bob_node = bob.labels["com.docker.swarm.node.id"]
    # without end: more than the whole storage
    writer = bob.exec_run(
        ["python3", "-c", WRITER, "/home/jovyan/fill.bin", str(2 * SHARE_MB), str(BOB_MB_S)],
        user="1000",
        stream=True,
    )
    progress: list[str] = []
    threading.Thread(
        target=lambda: progress.extend(c.decode() for c in writer.output), daemon=True
    ).start()

    t0, fullest, silent = time.monotonic(), 0.0, []
    while hub.server(BOB) is not None:
        assert time.monotonic() - t0 < 180, f"bob still running; wrote {progress[-3:]}"
        fullest = max(fullest, fill_percent(small_homes))
        silent += [user for user, token in tokens.items() if not answers(hub, user, token)]
        time.sleep(0.5)
    stopped_after = time.monotonic() - t0
    print(f"bob writing -> his server stopped by the hub: {stopped_after:.1f} s; storage at "
          f"most {fullest:.0f}% full")  # fmt: skip
    assert fullest < 100, f"the storage filled: {progress[-3:]}"
    assert not any("full at" in line for line in progress), progress[-3:]
    assert silent == [], f"servers that did not answer while bob wrote: {silent}"
    for user, token in tokens.items():
        assert answers(hub, user, token), f"{user}'s server does not answer after bob's stop"
    assert engine_of(bob_node).ping()
    # his files kept
    (folder,) = [p for p in small_homes.iterdir() if "bob" in p.name]
    assert (folder / "fill.bin").stat().st_size > SHARE_MB * 0.5 * 2**20

    # told why, on his page: where his JupyterLab's tab goes when he reloads it (the hub's
    # "not running" page; a login without it would start his server again, where the hub's
    # spawn page has no choices to offer)
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/login?next=/user/{BOB}/lab")
    page.fill("#username_input", BOB)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    told = page.locator("#last-start-failed")
    told.wait_for(timeout=30_000)
    text = told.inner_text()
    assert "Your server was stopped at" in text, text
    assert f"the shared storage of the homes ({small_homes}) was" in text, text
    assert "safety line of 60%" in text and "Your files are kept" in text, text
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "disk-stop.png"))
    page.goto(f"{hub.url}/hub/home")  # and his hub home page, headed as a stop
    assert told.inner_text().startswith("Your server was stopped."), told.inner_text()
    page.context.close()

    # the organizer's dashboard lists it
    dashboard = open_dashboard(browser, hub)
    row = dashboard.locator("#disk-stops-table tr", has_text=BOB).first
    row.wait_for(timeout=30_000)
    assert "Your server was stopped at" in row.inner_text()
    dashboard.context.close()


def test_a_server_filling_its_machine_disk_is_paused_and_the_machine_goes_on(hub, hub_settings):
    """On a GPU machine's own disk (the bed's workers keep their engines' data on this
    machine's disk): a server writing into /tmp past a line set 1.5 GB above the disk's fill
    now. Two services made here with a server's labels (the watch knows servers by them), the
    single-user image running sleep; not the hub's, so the hub stops neither."""
    client = docker.from_env()
    node = next(
        n for n in client.nodes.list()
        if n.attrs["Spec"].get("Role") == "worker" and n.attrs["Status"]["State"] == "ready"
    )  # fmt: skip
    hostname = node.attrs["Description"]["Hostname"]
    engine = engine_of(node.id)
    root = engine.info()["DockerRootDir"]
    v = os.statvfs(root)
    used = (v.f_blocks - v.f_bfree) * v.f_frsize
    usable = used + v.f_bavail * v.f_frsize
    line = 100.0 * (used + 1.5e9) / usable
    services = []
    try:
        for name in ("disk-writer", "disk-quiet"):
            services.append(
                client.services.create(
                    hub_settings["GPUHUB_SINGLEUSER_IMAGE"],
                    ["sleep", "infinity"],
                    name=f"{hub.stack}-{name}",
                    constraints=[f"node.hostname=={hostname}"],
                    container_labels={
                        contract.USER_LABEL: name,
                        contract.DISK_SAFETY_LABEL: f"{line:.3f}",
                    },
                )
            )
        containers = {}
        deadline = time.monotonic() + 120
        while len(containers) < 2 and time.monotonic() < deadline:
            for name in ("disk-writer", "disk-quiet"):
                found = engine.containers.list(filters={"label": f"{contract.USER_LABEL}={name}"})
                if found:
                    containers[name] = found[0]
            time.sleep(1)
        assert len(containers) == 2, "the two services did not start"
        time.sleep(12)  # one round of the watch that knows them before the writing
        writer = containers["disk-writer"].exec_run(
            ["python3", "-c", WRITER, "/tmp/fill.bin", "4000", "150"], user="1000", stream=True
        )
        progress: list[str] = []
        threading.Thread(
            target=lambda: progress.extend(c.decode() for c in writer.output), daemon=True
        ).start()
        t0 = time.monotonic()
        while not containers["disk-writer"].attrs["State"]["Paused"]:
            assert time.monotonic() - t0 < 90, f"not paused; wrote {progress[-2:]}"
            time.sleep(1)
            containers["disk-writer"].reload()
        print(f"writing /tmp -> paused: {time.monotonic() - t0:.1f} s, at {progress[-1:]} MB")
        assert not any(line.startswith("done") for line in progress), progress[-2:]
        quiet = containers["disk-quiet"]
        quiet.reload()
        assert quiet.status == "running" and not quiet.attrs["State"]["Paused"]
        assert quiet.exec_run(["true"]).exit_code == 0
        assert engine.ping()
        report = fetch_report(node.attrs["Status"]["Addr"])
        (writer_row,) = [s for s in report["servers"] if s["user"] == "disk-writer"]
        assert (
            f"the disk of the machine your server ran on ({hostname}, {root})"
            in (writer_row["stopped"]["reason"])
        )
    finally:
        for service in services:
            service.remove()


def fetch_report(address: str) -> dict:
    """The machine's disk report, as the hub fetches it."""
    r = requests.get(f"http://{address}:{contract.DISK_WATCH_PORT}/disk", timeout=10)
    r.raise_for_status()
    return r.json()
