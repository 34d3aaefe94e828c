"""The quick faults of the fault suite (issue 29), with participants' servers running and a
marker file in each home: the proxy's task killed, and Prometheus stopped. The goals: every
server still running answers through the proxy within 30 s of the proxy and the hub answering;
no service holds GPU slices for a participant the hub lists no server for; no marker is lost;
the dashboard's live part keeps working without Prometheus and its plots say what is missing.

The other faults (engines restarted, the hub killed mid-burst, a machine lost or cut off, a
full disk) take minutes each: `make bench-faults` (tests/bench/faults.py) measures them.
"""

from __future__ import annotations

import re
import time

import docker
import pytest
import requests

from gpu_swarm_spawner.contract import DOCKER_SERVICE_LABEL

from .aftermath import (
    Participant,
    hub_answers,
    listed,
    marker_kept,
    orphans,
    server_answers,
    token_of,
    write_marker,
)
from .hub import open_dashboard
from .spawners import remove_services, wait_slices_free

pytestmark = pytest.mark.integration

PEOPLE = [f"ci-fault-{i}" for i in range(4)]
#: the goal: within this many seconds of the proxy and the hub answering again
ANSWER_S = 30


@pytest.fixture(scope="module")
def running(hub):
    """Participants' servers running, each with a marker file in its home."""
    remove_services(hub.stack)
    wait_slices_free()  # servers of earlier tests may still be shutting down
    r = hub.api("POST", "/users", json={"usernames": PEOPLE})
    assert r.status_code in (201, 409), r.text
    people = [Participant(name, token_of(hub, name)) for name in PEOPLE]
    for p in people:
        r = p.session.post(f"{hub.url}/hub/api/users/{p.name}/server", timeout=60)
        assert r.status_code in (201, 202), (p.name, r.status_code, r.text)
    for p in people:
        hub.wait_ready(p.name)
        write_marker(hub, p)
    yield people
    for p in people:
        hub.stop(p.name)


@pytest.fixture(scope="module")
def admin(hub):
    """The admin's API session (the dashboard's data; the proxy's routes)."""
    session = requests.Session()
    session.headers["Authorization"] = f"token {token_of(hub, 'admin', hub.admin_password)}"
    return session


def container_of(hub, service: str):
    """The running container of the stack's ``service`` (on the manager)."""
    name = f"{hub.stack}_{service}"
    client = docker.from_env()
    (container,) = client.containers.list(filters={"label": f"{DOCKER_SERVICE_LABEL}={name}"})
    return container


@pytest.fixture(scope="module")
def proxy_killed(hub, running, admin):
    """The proxy's container killed (Swarm starts another): when the hub answered again, when
    each server answered through the proxy (seconds after the hub; within ANSWER_S + 15 s, or
    never), and then, with every route in place (mended through the hub's API where it was
    not), the markers and the orphans."""
    t0 = time.monotonic()
    container_of(hub, "proxy").kill("SIGKILL")
    while not hub_answers(hub):
        assert time.monotonic() - t0 < 120, "the hub did not answer through a new proxy"
        time.sleep(0.2)
    hub_at = time.monotonic()
    answered: dict[str, float] = {}
    while len(answered) < len(running) and time.monotonic() - hub_at < ANSWER_S + 15:
        for p in running:
            if p.name not in answered and server_answers(hub, p):
                answered[p.name] = time.monotonic() - hub_at
        time.sleep(0.5)
    record = {"hub_s": hub_at - t0, "answered": answered}
    if len(answered) < len(running):
        mend_routes(hub, admin, running)  # the markers are read through them, and later tests
    record["markers"] = {p.name: marker_kept(hub, p) for p in running}
    record["listed"] = sorted(set(listed(hub)) & set(PEOPLE))
    record["orphans"] = orphans(hub, hub.stack)
    print(f"proxy killed: {record}")
    return record


def mend_routes(hub, admin, running) -> None:
    """Every route back in the proxy: through the hub's API (JupyterHub's own check of the
    routes), or where the hub cannot reach the proxy either, by restarting the hub (which adds
    every route as it starts)."""
    try:
        mended = admin.post(f"{hub.url}/hub/api/proxy", timeout=90).status_code == 200
    except requests.RequestException:
        mended = False
    if not mended:
        docker.from_env().services.get(f"{hub.stack}_hub").force_update()
        time.sleep(5)
    deadline = time.monotonic() + 180
    while not all(server_answers(hub, p) for p in running):
        assert time.monotonic() < deadline, "the routes did not come back"
        time.sleep(2)


def test_the_hub_answers_again_soon_after_the_proxy_is_killed(proxy_killed):
    assert proxy_killed["hub_s"] < 30, proxy_killed


def test_every_server_answers_through_the_proxy_within_30_s_of_the_hub(proxy_killed, running):
    late = {p.name: proxy_killed["answered"].get(p.name) for p in running}
    assert all(s is not None and s <= ANSWER_S for s in late.values()), late


def test_nothing_is_lost_when_the_proxy_is_killed(proxy_killed):
    assert proxy_killed["listed"] == sorted(PEOPLE), proxy_killed
    assert all(proxy_killed["markers"].values()), proxy_killed["markers"]
    assert proxy_killed["orphans"] == [], proxy_killed["orphans"]


def test_the_restored_routes_are_counted_in_the_hubs_metrics(hub, admin, proxy_killed):
    r = admin.get(f"{hub.url}/hub/metrics", timeout=30)
    assert r.status_code == 200, r.text
    (line,) = [
        x
        for x in r.text.splitlines()
        if x.startswith("gpuhub_healed_total{") and 'action="routes restored"' in x
    ]
    assert float(line.split()[-1]) >= 1, line


@pytest.mark.browser
def test_the_organizer_sees_the_restored_routes_on_the_dashboard(hub, browser, proxy_killed):
    page = open_dashboard(browser, hub)
    rows = page.locator("#healed tr", has_text="routes restored")
    rows.first.wait_for(timeout=30_000)
    shown = " ".join(rows.all_inner_texts())
    lacked = re.search(r"the proxy lacked (\d+) route\(s\) of running servers", shown)
    assert lacked and int(lacked[1]) >= len(PEOPLE) and "/user/ci-fault-0/" in shown, shown


@pytest.fixture(scope="module")
def prometheus_down(hub):
    """Prometheus scaled to nothing (until its container has gone); started again after."""
    client = docker.from_env()
    service = client.services.get(f"{hub.stack}_prometheus")
    service.scale(0)
    name = f"{hub.stack}_prometheus"
    deadline = time.monotonic() + 60
    while client.containers.list(filters={"label": f"{DOCKER_SERVICE_LABEL}={name}"}):
        assert time.monotonic() < deadline, "Prometheus' container did not stop"
        time.sleep(0.5)
    yield
    service.reload()
    service.scale(1)


def dashboard(hub, admin, path: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    r = admin.get(f"{hub.url}/services/dashboard/{path}", timeout=30)
    return r.status_code, r.json(), time.monotonic() - t0


def test_the_dashboards_live_part_works_without_prometheus_and_its_plots_say_so(
    hub, running, admin, prometheus_down
):
    for _ in range(5):
        status, state, took = dashboard(hub, admin, "api/state")
        assert status == 200 and state.get("machines"), (status, state)
        shown = str(state["machines"])
        assert all(p.name in shown for p in running), shown
        assert took < 2, f"the live state took {took:.2f} s"
        time.sleep(1)
    # the plots: what is missing, once their 10-second cache of earlier answers has expired
    deadline = time.monotonic() + 30
    while True:
        status, series, took = dashboard(hub, admin, "api/series")
        if status != 200 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status == 503, (status, series)
    assert "Prometheus" in series.get("error", ""), series
    assert took < 10, f"the plots' answer took {took:.2f} s"
    # and the participants' servers do not notice
    assert all(server_answers(hub, p) for p in running)


@pytest.mark.browser
def test_the_dashboard_page_says_the_plots_lack_prometheus(hub, browser, prometheus_down):
    page = open_dashboard(browser, hub)
    page.wait_for_function(
        "document.getElementById('plots-note').textContent.includes('Prometheus')",
        timeout=60_000,
    )
    assert page.locator("#lost").is_hidden()  # the live part still reads the swarm


def test_the_plots_come_back_with_prometheus(hub, admin, prometheus_down):
    docker.from_env().services.get(f"{hub.stack}_prometheus").scale(1)
    deadline = time.monotonic() + 120
    while True:
        status, series, _ = dashboard(hub, admin, "api/series")
        if status == 200 and series.get("plots"):
            break
        assert time.monotonic() < deadline, (status, series)
        time.sleep(2)
