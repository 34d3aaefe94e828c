"""The waiting line on the bed (18 slices: 3 machines x 2 simulated GPUs x 3), with real
participants' servers started through the hub and, where a participant is involved, Chromium.

18 participants fill every slice; then 7 more want a server: w1, w2, w4, w6 and w7 ask through
the REST API with the offer's answer (``line=join``), w3 and w5 in Chromium, where the refusal
comes at once with its "Wait in line" button. w4 leaves the line, w5 closes the browser, and an
8th finds the line full (GPUHUB_LINE_MAX_LENGTH=6). Servers are then stopped one at a time: each
time the next in line (w4 skipped) gets the freed slice, w3's page goes on into JupyterLab, and
w5 finds a running server when coming back. No GPU ever holds more than its slices; nothing is
left afterwards. Last, a hub restart empties the line, and the participant waiting sees why.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .hub import ARTIFACTS, container_env, container_of, deploy, log_in, open_dashboard
from .spawners import (
    inventory,
    remove_services,
    service_of,
    services_of,
    stop_and_see_its_slices_free,
    wait_slices_free,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

RUNNING = [f"ci-line-{i:02}" for i in range(1, 19)]
W = {i: f"ci-line-w{i}" for i in range(1, 9)}


def no_gpu_over_its_slices() -> None:
    gpus = inventory()
    assert all(g.used <= g.slices for g in gpus.values()), gpus


def _stream(hub, user: str, done: threading.Event, heard) -> None:
    """``heard(message)`` for each message of the user's progress stream, from its first,
    until the stream ends or ``done`` is set. The reader closes the stream itself: a close from
    another thread waits until this one's read returns, which is at the hub's next keep-alive
    (every 8 s) when no message comes."""
    with hub.api("GET", f"/users/{user}/server/progress", stream=True) as r:
        for line in r.iter_lines(decode_unicode=True):
            if done.is_set():
                return
            if line.startswith("data:"):
                heard(json.loads(line[5:])["message"])


def progress(hub, user: str, seconds: float = 2.0) -> list[str]:
    """The messages of the user's spawn-pending page so far (its progress stream), as read
    for ``seconds``."""
    messages: list[str] = []
    done = threading.Event()

    def read():
        with contextlib.suppress(Exception):  # no stream (not pending), or cut off
            _stream(hub, user, done, messages.append)

    threading.Thread(target=read, daemon=True).start()
    done.wait(seconds)
    done.set()
    return list(messages)


class PageWatch:
    """The user's spawn-pending page as a browser keeps it open, from before the spawn asked
    for is pending until ``stop()``: ``seen`` is each message of the progress stream with the
    time it arrived (epoch seconds). A stream that ends or is not there yet is opened again;
    the messages it repeats (each opening sends the spawn's stages from the first) are not
    counted twice."""

    def __init__(self, hub, user: str):
        self.seen: list[tuple[float, str]] = []
        self.done = threading.Event()
        threading.Thread(target=self._watch, args=(hub, user), daemon=True).start()

    def _watch(self, hub, user: str) -> None:
        while not self.done.is_set():
            with contextlib.suppress(Exception):
                _stream(hub, user, self.done, self._heard())
            self.done.wait(0.1)

    def _heard(self):
        """What one opening of the stream hears: its first messages are those seen before."""
        count = 0

        def heard(message: str) -> None:
            nonlocal count
            count += 1
            if count > len(self.seen):
                self.seen.append((time.time(), message))

        return heard

    def first(self, text: str) -> float | None:
        """When a message with ``text`` first arrived; None while none has."""
        return next((at for at, m in self.seen if text in m), None)

    def stop(self) -> None:
        self.done.set()


def place(hub, user: str) -> str:
    """The latest "You are Nth in line (M waiting)" the user's page shows."""
    found = [m for m in progress(hub, user) if " in line (" in m]
    assert found, f"{user} is not told a place in line: {progress(hub, user)}"
    return re.search(r"You are \d+\w+ in line \(\d+ waiting\)", found[-1]).group(0)


def wait_place(hub, user: str, expected: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (shown := place(hub, user)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert shown == expected, (user, shown)


def join(hub, user: str) -> None:
    r = hub.api("POST", f"/users/{user}/server", json={"line": "join"})
    assert r.status_code == 202, (r.status_code, r.text)  # pending: in line


def join_in_browser(page, hub, user: str) -> float:
    """Log in, read the refusal and click its "Wait in line"; seconds from login to refusal."""
    t0 = time.monotonic()
    log_in(page, hub, user)
    button = page.locator("#gpuhub-join-line")
    try:
        button.wait_for(timeout=15_000)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"line-{user}-no-offer.png"))
        raise AssertionError(
            f"{user} sees no offer at {page.url}: {page.inner_text('body')}"
        ) from None
    refused_after = time.monotonic() - t0
    assert "All GPU slices are in use (18/18)" in page.inner_text("body")
    button.click()
    page.wait_for_selector("#progress-message", timeout=10_000)
    return refused_after


def stop(hub, user: str) -> None:
    hub.stop(user)


@pytest.fixture(scope="module")
def full_hub(hub):
    remove_services(hub.stack)
    wait_slices_free()
    for user in RUNNING + list(W.values()):
        hub.api("POST", f"/users/{user}")
    with ThreadPoolExecutor(18) as pool:
        for r in pool.map(lambda u: hub.api("POST", f"/users/{u}/server"), RUNNING):
            assert r.status_code in (201, 202), r.text
        list(pool.map(lambda u: hub.wait_ready(u, timeout=180), RUNNING))
    assert all(g.free == 0 for g in inventory().values()), inventory()
    yield
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: hub.stop(u), [*RUNNING, *W.values(), "ci-line-cpu", "admin"]))
        # the 27 participants go too: later tests (the admin page's first page) never see them
        list(
            pool.map(
                lambda u: hub.api("DELETE", f"/users/{u}"), [*RUNNING, *W.values(), "ci-line-cpu"]
            )
        )
    remove_services(hub.stack)


def test_the_line_serves_in_order_skips_who_left_and_keeps_who_closed_the_page(
    hub, full_hub, browser
):
    ARTIFACTS.mkdir(exist_ok=True)
    w3_page = browser.new_context().new_page()
    w5_context = browser.new_context()
    w5_page = w5_context.new_page()

    join(hub, W[1])
    join(hub, W[2])
    refused_after = join_in_browser(w3_page, hub, W[3])
    print(f"login -> refusal with the offer on w3's page: {refused_after:.1f} s")
    join(hub, W[4])
    join_in_browser(w5_page, hub, W[5])
    join(hub, W[6])
    # the places, on the pages and in their progress streams
    wait_place(hub, W[6], "You are 6th in line (6 waiting)")
    assert "You are 3rd in line (6 waiting)" in w3_page.inner_text("#progress-message")
    w3_page.screenshot(path=str(ARTIFACTS / "line-w3-waiting.png"))
    assert not services_of(hub.stack) or all(
        s.name.removeprefix("jy-ci-2dline-2d") in {u.removeprefix("ci-line-") for u in RUNNING}
        for s in services_of(hub.stack)
    ), "someone in line holds a service"

    # w4 leaves: everyone behind moves up; w5 closes the browser and keeps the place
    stop(hub, W[4])
    wait_place(hub, W[6], "You are 5th in line (5 waiting)")
    w5_context.close()
    join(hub, W[7])
    wait_place(hub, W[7], "You are 6th in line (6 waiting)")
    # the organizer's view: make status lists the line in order
    status = deploy("status").split("Waiting line (6)", 1)[1].splitlines()
    assert [row.split()[1] for row in status[2:8]] == [W[i] for i in (1, 2, 3, 5, 6, 7)], status
    # the line is full: the next is told so at once
    t0 = time.monotonic()
    r = hub.api("POST", f"/users/{W[8]}/server", json={"line": "join"})
    elapsed = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert "the waiting line is full (6 are waiting)" in r.json()["message"], r.text
    assert elapsed < 2, f"line-full refusal took {elapsed:.2f} s"
    # the dashboard shows the line too, with the 18 servers under their GPUs, every slice used
    dashboard = open_dashboard(browser, hub)
    rows = dashboard.locator("#line-table tbody tr")
    rows.nth(5).wait_for(timeout=15_000)
    shown = rows.evaluate_all("rows => rows.map(r => r.cells[1].innerText)")
    assert shown == [W[i] for i in (1, 2, 3, 5, 6, 7)], shown
    assert dashboard.locator("[data-machine] [data-user]").count() == 18
    assert "18 / 18" in dashboard.inner_text("#totals")
    # ... and the refusal, with what the 8th was told
    refusal = dashboard.locator("#problems-table tbody tr", has_text=W[8]).first
    refusal.wait_for(timeout=15_000)
    assert "the waiting line is full" in refusal.inner_text(), refusal.inner_text()
    dashboard.screenshot(path=str(ARTIFACTS / "dashboard-line.png"), full_page=True)
    dashboard.context.close()

    # servers stop one by one: the next in line starts each time, in order
    for stopped, served in zip(RUNNING, [W[1], W[2], W[3], W[5], W[6], W[7]]):
        t0 = time.monotonic()
        stop(hub, stopped)
        hub.wait_ready(served, timeout=120)
        print(f"{stopped} stopped -> {served} ready: {time.monotonic() - t0:.1f} s")
        no_gpu_over_its_slices()
        still = [u for u in (W[1], W[2], W[3], W[5], W[6], W[7]) if hub.server(u)]
        ready = [u for u in still if hub.server(u)["ready"]]
        assert served in ready
        if served == W[3]:  # her page goes on into JupyterLab by itself
            w3_page.wait_for_selector(".jp-LabShell", timeout=120_000)
    assert hub.server(W[4]) is None, "w4 left the line but got a server"
    # w5 comes back: the server is there
    back = browser.new_context().new_page()
    log_in(back, hub, W[5])
    back.wait_for_selector(".jp-LabShell", timeout=120_000)
    assert f"/user/{W[5]}/lab" in back.url


def test_a_server_without_a_gpu_starts_while_the_gpus_are_full_and_its_home_stays(
    hub, full_hub, page
):
    """After the line test every slice is taken again. cpu clicks "Start without a GPU now" on
    the refusal, writes a file, stops; later, with a slice free on that machine, starts with a
    GPU and finds the file."""
    user = "ci-line-cpu"
    hub.api("POST", f"/users/{user}")
    assert all(g.free == 0 for g in inventory().values()), inventory()
    log_in(page, hub, user)
    page.locator("#gpuhub-cpu-only").click(timeout=10_000)
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    container = server_container(hub, user)
    env = container_env(container)
    assert env["GPU_MODE"] == "none" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "GPU_UUID" not in env
    info = container.exec_run(["gpu-info"], user="jovyan").output.decode()
    assert "This server runs without a GPU (CPU only)" in info, info
    no_gpu_over_its_slices()
    assert all(g.free == 0 for g in inventory().values())  # it took no slice
    assert container.exec_run(["sh", "-c", "echo mine > ~/mine.txt"], user="jovyan").exit_code == 0
    machine = hub.api("GET", f"/users/{user}").json()["servers"][""]["state"]["home_node"]
    hub.stop(user)
    # a slice frees on that machine; the restart with a GPU goes there, home and all
    users = hub.api("GET", "/users?state=active").json()
    on_it = [u["name"] for u in users if node_of(u) == machine]
    hub.stop(on_it[0])
    wait_slices_free_on(machine)
    r = hub.api("POST", f"/users/{user}/server")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(user)
    state = hub.api("GET", f"/users/{user}").json()["servers"][""]["state"]
    assert state["gpu_node"] == machine and state["gpu_uuid"]
    home = server_container(hub, user).exec_run(["cat", "/home/jovyan/mine.txt"], user="jovyan")
    assert home.output.decode().strip() == "mine"


def node_of(user_model: dict) -> str:
    state = (user_model["servers"].get("") or {}).get("state") or {}
    return state.get("gpu_node", "")


def server_container(hub, user: str):
    return container_of(service_of(hub.stack, user).name)


def wait_slices_free_on(machine: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(g.free for g in inventory().values() if g.node_name == machine):
            return
        time.sleep(0.5)
    raise AssertionError(f"no slice freed on {machine}: {inventory()}")


def test_after_the_line_nothing_is_left(hub, full_hub):
    everyone = [*RUNNING, *W.values(), "ci-line-cpu"]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: hub.stop(u), everyone))
    wait_slices_free()
    assert services_of(hub.stack) == []
    assert all(hub.server(u) is None for u in everyone)


def fill(hub) -> dict[str, list[str]]:
    """All 18 slices held by RUNNING participants; who is on which GPU."""
    wait_slices_free()  # the servers stopped just before have gone
    with ThreadPoolExecutor(18) as pool:
        for r in pool.map(lambda u: hub.api("POST", f"/users/{u}/server"), RUNNING):
            assert r.status_code in (201, 202), r.text
        list(pool.map(lambda u: hub.wait_ready(u, timeout=180), RUNNING))
    on: dict[str, list[str]] = {}
    for user in hub.api("GET", "/users?state=active").json():
        state = (user["servers"].get("") or {}).get("state") or {}
        if state.get("gpu_uuid"):
            on.setdefault(state["gpu_uuid"], []).append(user["name"])
    return on


def test_a_full_gpu_request_in_line_holds_one_gpu_and_blocks_no_one_elsewhere(hub, full_hub):
    """The rule (docs/line.md, line.py): the admin's full-GPU request, first in line, holds the GPU
    closest to empty (all equal here: the first by machine name, then UUID); a 1-slice request
    behind it gets a slice freed elsewhere, but not one freed on the held GPU, which the admin
    gets once it is empty."""
    on = fill(hub)
    gpus = inventory()
    held = min(gpus.values(), key=lambda g: (g.node_name, g.uuid)).uuid
    other = next(uuid for uuid in on if uuid != held)
    join_full = hub.api("POST", "/users/admin/server", json={"gpu": "full", "line": "join"})
    assert join_full.status_code == 202, join_full.text
    join(hub, W[1])
    wait_place(hub, W[1], "You are 2nd in line (2 waiting)")
    assert "a GPU is being kept free for you" in progress(hub, "admin")[-1]
    hub.stop(on[other][0])  # a slice frees elsewhere: the 1-slice request behind gets it
    hub.wait_ready(W[1])
    assert hub.api("GET", f"/users/{W[1]}").json()["servers"][""]["state"]["gpu_uuid"] == other
    hub.stop(on[held][0])  # a slice frees on the held GPU: kept for the admin
    time.sleep(6)  # three of the line's looks
    assert inventory()[held].used == 2 and not hub.server("admin")["ready"]
    for user in on[held][1:]:
        hub.stop(user)
    hub.wait_ready("admin")
    state = hub.api("GET", "/users/admin").json()["servers"][""]["state"]
    assert (state["gpu_uuid"], state["gpu_slices"]) == (held, 3)
    no_gpu_over_its_slices()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(hub.stop, [*RUNNING, W[1], "admin"]))


def test_a_hub_restart_empties_the_line_and_the_waiting_participant_reads_why(
    hub, full_hub, page, browser
):
    """Last: the hub full again, one participant waits in Chromium, and the hub is restarted
    (as `make up` does when its settings change)."""
    fill(hub)
    join_in_browser(page, hub, W[1])
    page.wait_for_function(
        "document.querySelector('#progress-message').innerText.includes('in line')"
    )
    # another waits, then changes her mind: leaves the line and starts without a GPU
    other = browser.new_context().new_page()
    join_in_browser(other, hub, W[2])
    other.locator("#gpuhub-cpu-instead").click(timeout=15_000)
    other.wait_for_selector(".jp-LabShell", timeout=120_000)
    assert container_env(server_container(hub, W[2]))["GPU_MODE"] == "none"
    wait_place(hub, W[1], "You are 1st in line (1 waiting)")
    subprocess.run(
        ["docker", "service", "update", "--force", "--detach", f"{hub.stack}_hub"],
        check=True,
        capture_output=True,
    )
    notice = page.locator("#last-start-failed")
    notice.wait_for(timeout=180_000)
    text = notice.inner_text()
    assert "You were waiting in line for a GPU" in text and "when the hub restarted" in text
    page.screenshot(path=str(ARTIFACTS / "line-hub-restarted.png"))
    assert hub.server(W[1]) is None  # no service, no slice: the line was in the hub's memory
    # servers started before the restart still shut themselves down when stopped (the hub no
    # longer has their tokens: it makes a short-lived one)
    stop_and_see_its_slices_free(hub, RUNNING[0])
