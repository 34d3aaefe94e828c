"""The organizer's dashboard (``/services/dashboard/``) in Chromium on the bed: an admin opens
it from the hub's admin page and sees the bed's machines, the servers the test started under
their GPUs and their starts with durations, and plots drawn from Prometheus' data; it follows a
server that starts and stops without being reloaded. A participant is refused (403), the page
and its data alike."""

from __future__ import annotations

import time

import docker
import pytest

from .hub import ARTIFACTS, log_in
from .spawners import inventory

pytestmark = [pytest.mark.integration, pytest.mark.browser]

USERS = ["ci-dash-1", "ci-dash-2"]
LATE = "ci-dash-3"


def start(hub, user: str) -> None:
    hub.api("POST", f"/users/{user}")
    r = hub.api("POST", f"/users/{user}/server")
    assert r.status_code in (201, 202), r.text


def test_an_admin_follows_machines_servers_and_starts_live(hub, page):
    for user in USERS:
        start(hub, user)
    for user in USERS:
        hub.wait_ready(user)
    try:
        log_in(page, hub, "admin", hub.admin_password)
        page.wait_for_url("**/hub/**", timeout=30_000)
        page.goto(f"{hub.url}/hub/admin")
        page.click("#gpuhub-dashboard-link")  # linked from the admin page
        page.wait_for_url("**/services/dashboard/", timeout=30_000)
        page.wait_for_selector("[data-machine]", timeout=30_000)
        machines = page.locator("[data-machine]")
        shown = machines.evaluate_all("els => els.map(e => e.dataset.machine)")
        hosts = {n.attrs["Description"]["Hostname"] for n in docker.from_env().nodes.list()}
        assert set(shown) == hosts
        for user in USERS:
            # under the GPU its server holds, and among the recent starts with a duration
            page.locator(f'[data-machine] [data-user="{user}"]').wait_for(timeout=15_000)
            row = page.locator("#starts-table tr", has_text=user).first
            assert row.inner_text().split("\t")[2].endswith(" s"), row.inner_text()
        totals = page.inner_text("#totals")
        assert "GPU slices in use" in totals and "waiting in line" in totals

        # the plots, from Prometheus (scraping every 5 s here): the slices drawn per machine
        # add up to the slices in use now, over several points (now: read afresh each time,
        # as servers of earlier tests may still be going)
        deadline = time.monotonic() + 90
        while True:
            used = sum(g.used for g in inventory().values())
            drawn_now = page.evaluate(
                """() => {
                    const lines = [...document.querySelectorAll('[data-plot="slices"] polyline')];
                    return {
                        last: lines.reduce((sum, l) => sum + Number(l.dataset.last), 0),
                        points: lines.length ? Math.min(...lines.map(l => +l.dataset.points)) : 0,
                    };
                }"""
            )
            if drawn_now["last"] == used and drawn_now["points"] >= 2:
                break
            assert time.monotonic() < deadline, (used, drawn_now)
            time.sleep(1)
        drawn = page.locator('[data-plot="slices"] polyline').evaluate_all(
            "ls => ls.map(l => [l.dataset.series, l.getAttribute('points').split(' ').length])"
        )
        # every machine holding slices now is drawn (machines gone within the plots' 8 hours,
        # e.g. an earlier run's, keep their past line)
        holding = {g.node_name for g in inventory().values() if g.used}
        assert holding <= {name for name, _ in drawn}, drawn
        assert all(n >= 2 for _, n in drawn), drawn  # the drawn line has the points
        servers = page.locator('[data-plot="servers"] polyline[data-series="gpu"]')
        assert int(servers.get_attribute("data-points")) >= 2
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

        # live, without a reload: a server that starts appears, one that stops goes
        page.evaluate("window.notReloaded = true")
        start(hub, LATE)
        page.locator(f'[data-user="{LATE}"]').wait_for(timeout=60_000)
        hub.stop(USERS[0])
        page.locator(f'[data-machine] [data-user="{USERS[0]}"]').wait_for(
            state="detached", timeout=30_000
        )
        assert page.evaluate("window.notReloaded") is True
    finally:
        for user in [*USERS, LATE]:
            hub.stop(user)


def test_a_participant_is_refused_the_page_and_its_data(hub, page):
    hub.api("POST", f"/users/{USERS[1]}")
    log_in(page, hub, USERS[1])
    page.wait_for_url("**/hub/**", timeout=30_000)
    response = page.goto(f"{hub.url}/services/dashboard/")
    assert response.status == 403, (response.status, page.url)
    page.screenshot(path=str(ARTIFACTS / "dashboard-participant.png"))
    response = page.goto(f"{hub.url}/services/dashboard/api/state")
    assert response.status == 403 and '"machines"' not in page.content()
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_selector("#start", timeout=30_000)
    assert page.locator("#gpuhub-dashboard-link").count() == 0  # no link for participants
