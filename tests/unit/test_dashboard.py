"""The organizer's dashboard: the guards' metrics reader (``guards.read_metrics``) and the
page's state (``dashboard/model.py``), from plain Docker API dicts, metrics text and events.
The page itself, admins-only, is tested in Chromium on the bed."""

from __future__ import annotations

import contextlib
import json

import pytest

from gpu_swarm_spawner import guards
from gpu_swarm_spawner.dashboard import model
from gpu_swarm_spawner.events import Event, Waiting

from .clusters import node, task

GB = 1024**3

GUARD_TEXT = f"""\
# TYPE gpuhub_gpu_utilization_percent gauge
gpuhub_gpu_utilization_percent{{machine="gpu-1",gpu="GPU-a0"}} 87.0
# TYPE gpuhub_gpu_memory_used_bytes gauge
gpuhub_gpu_memory_used_bytes{{machine="gpu-1",gpu="GPU-a0"}} {12 * GB}
# TYPE gpuhub_gpu_memory_total_bytes gauge
gpuhub_gpu_memory_total_bytes{{machine="gpu-1",gpu="GPU-a0"}} {24 * GB}
# TYPE gpuhub_participant_gpu_memory_used_bytes gauge
gpuhub_participant_gpu_memory_used_bytes{{machine="gpu-1",gpu="GPU-a0",user="alice"}} {10 * GB}
gpuhub_participant_gpu_memory_used_bytes{{machine="gpu-1",gpu="GPU-a0",user="bob"}} {2 * GB}
# TYPE gpuhub_participant_gpu_memory_budget_bytes gauge
gpuhub_participant_gpu_memory_budget_bytes{{machine="gpu-1",gpu="GPU-a0",user="alice"}} {8 * GB}
# TYPE gpuhub_participant_warnings counter
gpuhub_participant_warnings_total{{machine="gpu-1",user="alice",gpu="GPU-a0"}} 3.0
# TYPE gpuhub_participant_stops counter
gpuhub_participant_stops_total{{machine="gpu-1",user="alice",gpu="GPU-a0"}} 1.0
"""


def test_the_guards_metrics_are_read_and_a_broken_text_is_skipped():
    figures = guards.read_metrics([GUARD_TEXT, "this is { not metrics", ""])
    assert figures.gpus == {"GPU-a0": {"util": 87.0, "used": 12 * GB, "total": 24 * GB}}
    assert figures.participants == {
        ("alice", "GPU-a0"): (10 * GB, 8 * GB),
        ("bob", "GPU-a0"): (2 * GB, None),
    }
    assert figures.warnings == {("alice", "GPU-a0"): 3.0}
    assert figures.stops == {("alice", "GPU-a0"): 1.0}


def service(service_id: str, user: str) -> dict:
    return {
        "ID": service_id,
        "Spec": {"Name": f"jy-{user}", "Labels": {"gpu-jupyterhub.user": user}},
    }


def a_swarm():
    nodes = [
        {
            **node("n1", "gpu-1", {"GPU-a0": 3, "GPU-a1": 3}),
            "Status": {"State": "ready", "Addr": "10.0.0.1"},
        },
        node("n2", "gpu-2", {"GPU-b0": 3}, availability="pause"),
        node("m", "manager", {}, role="manager"),
    ]
    tasks = [
        {**task("n1", {"GPU-a0": 2}, service_id="s-alice"), "ID": "t1"},
        {**task("n1", {"GPU-a0": 1}, service_id="s-bob"), "ID": "t2"},
        {**task("n2", {"GPU-b0": 1}, service_id="s-carol"), "ID": "t3"},
        {**task("n2", {}, service_id="s-dan"), "ID": "t4"},  # without a GPU
        {**task("n1", {"GPU-a1": 1}, state="shutdown", service_id="s-old"), "ID": "t5"},
    ]
    services = [service(f"s-{u}", u) for u in ("alice", "bob", "carol", "dan", "old")]
    return nodes, tasks, services


def build(**overrides):
    nodes, tasks, services = a_swarm()
    arguments = dict(
        nodes=nodes,
        tasks=tasks,
        services=services,
        figures=guards.read_metrics([GUARD_TEXT]),
        silent=(),
        guard_expected=lambda n: n["ID"] == "n1",
        events=[],
        line=[],
        now=10_000.0,
    )
    arguments.update(overrides)
    return model.build(**arguments)


def test_machines_show_their_gpus_participants_and_whether_they_take_servers():
    state = build(silent=["n2"])
    gpu1, gpu2, manager = state["machines"]
    assert (gpu1["name"], gpu1["accepting"], gpu1["guard"]) == ("gpu-1", True, "ok")
    # a paused machine is the one an organizer must notice
    assert (gpu2["accepting"], gpu2["availability"], gpu2["guard"]) == (False, "pause", "no answer")
    assert manager["guard"] == "no GPUs" and manager["gpus"] == []
    a0, a1 = gpu1["gpus"]
    assert (a0["used"], a0["slices"], a0["utilization"], a0["memory_total"]) == (
        3,
        3,
        87.0,
        24 * GB,
    )
    alice, bob = a0["participants"]
    assert (alice["user"], alice["slices"], alice["over"]) == ("alice", 2, True)
    assert (alice["memory_used"], alice["memory_budget"]) == (10 * GB, 8 * GB)
    assert (bob["over"], bob["memory_budget"]) == (False, None)
    assert a1["used"] == 0 and a1["participants"] == []  # a stopped server holds nothing
    assert gpu2["cpu_only"] == ["dan"]
    totals = state["totals"]
    assert (totals["slices"], totals["slices_used"]) == (9, 4)
    assert (totals["servers"], totals["cpu_only"], totals["accepting"]) == (4, 1, 1)


def test_the_line_recent_starts_problems_and_the_guards_counts():
    events = [
        Event(9_000.0, "started", "alice", seconds=3.0, gpu="GPU-a0", node="gpu-1"),
        Event(9_100.0, "refused", "eve", reason="All GPU slices are in use (9/9)"),
        Event(9_200.0, "started", "bob", seconds=5.0, waited=120.0, gpu="GPU-a0", node="gpu-1"),
        Event(9_300.0, "failed", "carol", server="big", reason="gpu-2 lacks the image"),
        Event(1_000.0, "started", "old", seconds=99.0),  # over an hour ago: not in p50/p95
        Event(9_400.0, "stopped", "alice"),
        Event(9_500.0, "healed", "-", action="routes restored", reason="put back: /user/a/"),
        Event(9_600.0, "healed", "eve", action="orphan removed", reason="jy-eve removed"),
        Event(9_700.0, "disk stop", "dan", node="gpu-2", reason="Stopped: the disk was full."),
    ]
    line = [Waiting("w1", "", 9_940.0, 1), Waiting("admin", "big", 9_970.0, None, "GPU-b0")]
    state = build(events=events, line=line)
    assert [(w["place"], w["user"], w["waited"]) for w in state["line"]] == [
        (1, "w1", 60.0),
        (2, "admin/big", 30.0),
    ]
    assert state["line"][1]["full_gpu"] and state["line"][1]["holds"] == "GPU-b0"
    assert [e["user"] for e in state["starts"]] == ["old", "bob", "alice"]  # newest first
    assert [(e["kind"], e["user"]) for e in state["problems"]] == [
        ("failed", "carol/big"),
        ("refused", "eve"),
    ]
    assert [(e["action"], e["user"], e["reason"]) for e in state["healed"]] == [
        ("orphan removed", "eve", "jy-eve removed"),
        ("routes restored", "-", "put back: /user/a/"),
    ]
    assert [(e["user"], e["node"], e["reason"]) for e in state["disk_stops"]] == [
        ("dan", "gpu-2", "Stopped: the disk was full.")
    ]
    totals = state["totals"]
    assert (totals["spawn_p50"], totals["starts_counted"], totals["waiting"]) == (4.0, 2, 2)
    assert 4.0 < totals["spawn_p95"] <= 5.0
    assert state["guard"] == [{"user": "alice", "gpu": "GPU-a0", "warnings": 3, "stops": 1}]


def test_an_empty_hub_has_a_state_too():
    state = build(nodes=[], tasks=[], services=[], figures=guards.read_metrics([]))
    assert state["machines"] == [] and state["line"] == [] and state["starts"] == []
    assert state["totals"]["spawn_p50"] is None and state["totals"]["slices"] == 0


def test_only_machines_with_real_gpus_and_an_address_are_scraped():
    real = {**node("n1", "gpu-1", {"GPU-a0": 3}), "Status": {"State": "ready", "Addr": "10.0.0.1"}}
    simulated = {
        **node("n2", "gpu-2", {"GPU-simulated-0": 3}),
        "Status": {"State": "ready", "Addr": "10.0.0.2"},
    }
    no_address = node("n3", "gpu-3", {"GPU-c0": 3})
    assert [guards.guarded(n) for n in (real, simulated, no_address)] == [True, False, False]
    assert guards.scrape([simulated, no_address], port=9445) == ([], ())


# ---- the dashboard's metrics and its plots ----------------------------------------------------


def test_the_dashboards_metrics_are_what_prometheus_reads_back():
    from prometheus_client.parser import text_string_to_metric_families

    nodes, tasks, services = a_swarm()
    nodes[0]["Description"]["Hostname"] = 'gpu-"1"'  # a label value Prometheus must escape
    state = build(nodes=nodes, line=[Waiting("w1", "", 9_990.0, 1)])
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(model.metrics_text(state))
        for s in family.samples
    }
    assert samples[("gpuhub_slices_used", (("machine", 'gpu-"1"'),))] == 3
    assert samples[("gpuhub_slices_total", (("machine", "gpu-2"),))] == 3
    assert samples[("gpuhub_machine_taking_servers", (("machine", "gpu-2"),))] == 0  # paused
    assert samples[("gpuhub_servers", (("kind", "cpu_only"),))] == 1
    assert samples[("gpuhub_servers", (("kind", "gpu"),))] == 3
    assert samples[("gpuhub_line_length", ())] == 1
    assert not [k for k in samples if ("machine", "manager") in k[1]]  # no GPUs: not plotted


def matrix(*results):
    return {"status": "success", "data": {"resultType": "matrix", "result": list(results)}}


def test_plots_take_prometheus_answers_name_their_series_and_drop_gaps():
    slices, spawn = model.PLOTS[0], next(p for p in model.PLOTS if p.id == "spawn")
    answer = matrix(
        {"metric": {"machine": "gpu-2"}, "values": [[100, "1"], [115, "2"]]},
        {"metric": {"machine": "gpu-1"}, "values": [[100, "3"], [115, "NaN"], [130, "x"]]},
    )
    drawn = model.plot_series(slices, [answer])
    assert [(s["name"], s["points"]) for s in drawn["series"]] == [
        ("gpu-1", [[100.0, 3.0]]),
        ("gpu-2", [[100.0, 1.0], [115.0, 2.0]]),
    ]
    nothing_yet = matrix({"metric": {}, "values": [[100, "NaN"]]})
    quantiles = model.plot_series(
        spawn, [matrix({"metric": {}, "values": [[1, "2.5"]]}), nothing_yet]
    )
    assert [s["name"] for s in quantiles["series"]] == ["p50"]  # p95 had no number yet
    assert model.plot_series(slices, [None])["series"] == []  # Prometheus did not answer
    assert model.plot_series(slices, [{"status": "error"}])["series"] == []


def test_the_plots_span_what_prometheus_holds_at_its_scrape_interval():
    assert model.duration_seconds("15s") == 15 and model.duration_seconds("1h30m") == 5400
    for odd in ("", "15", "fast", "15 s", "-1m"):
        assert model.duration_seconds(odd) == 15
    assert model.plot_span(now=10_000, span_s=8 * 3600, lowest=9_400) == 600  # 10 min of data
    assert model.plot_span(now=10_000, span_s=3600, lowest=1) == 3600
    assert model.plot_span(now=10_000, span_s=3600, lowest=9_990) == 60  # at least a minute
    assert model.plot_span(now=10_000, span_s=3600, lowest=None) == 3600
    assert model.step_for(600, least=5) == 5 and model.step_for(8 * 3600, least=5) == 120


@contextlib.contextmanager
def dashboard_served(metrics_token=""):
    """The dashboard's app on a loopback port; yields its base URL."""
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from gpu_swarm_spawner.dashboard.app import make_app

    class Reader:
        async def state(self):
            return build()

    server = HTTPServer(make_app(Reader(), "/services/dashboard/", None, metrics_token))
    (sock,) = bind_sockets(0, "127.0.0.1")
    server.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/services/dashboard/"
    finally:
        server.stop()


async def test_the_metrics_need_the_metrics_token():
    """Participants' servers share the hub's network: without the token, no figures."""
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    client = AsyncHTTPClient()
    with dashboard_served("s3cret") as base:
        url = base + "metrics"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            with pytest.raises(HTTPClientError) as refused:
                await client.fetch(url, headers=headers)
            assert refused.value.code == 403
        answer = await client.fetch(url, headers={"Authorization": "Bearer s3cret"})
        assert b"gpuhub_slices_used" in answer.body


async def test_data_calls_without_a_login_get_a_json_403_not_the_login_redirect(monkeypatch):
    """The page is sent to the hub's login; its data calls (fetches) must not be, or a fetch
    whose cookie is not accepted follows redirects in circles and the page draws nothing."""
    from tornado.httpclient import AsyncHTTPClient

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-dashboard")
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:1/hub/api")
    client = AsyncHTTPClient()
    with dashboard_served() as base:
        page = await client.fetch(base, follow_redirects=False, raise_error=False)
        assert page.code == 302 and "/hub/api/oauth2/authorize" in page.headers["Location"]
        for call in ("api/state", "api/series?hours=8"):
            answer = await client.fetch(
                base + call,
                headers={"Sec-Fetch-Mode": "cors", "Cookie": "jupyterhub-services-dashboard=x"},
                follow_redirects=False,
                raise_error=False,
            )
            assert answer.code == 403, call
            assert "reload the page" in json.loads(answer.body)["error"]


async def test_an_error_answer_names_the_reason_phrase_tornado_gives_the_status_line():
    """The data calls' JSON error without a message of its own is the reason phrase, read as
    tornado makes it for the status line (not from tornado's private attribute)."""
    from tornado import web
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from gpu_swarm_spawner.dashboard import app

    errors = {
        "forbidden": web.HTTPError(403),
        "own": web.HTTPError(400, reason="Bad Hours"),
        "crash": RuntimeError("boom"),
        "odd": web.HTTPError(599),
    }
    seen = {}

    class Answering(web.RequestHandler):
        def get(self, case):
            raise errors[case]

        def write_error(self, status_code, **kwargs):
            exc = kwargs["exc_info"][1]
            seen[status_code] = (app.reason_phrase(status_code, exc, kwargs), self._reason)

    sock, port = bind_unused_port()
    server = HTTPServer(web.Application([(r"/(\w+)", Answering)]))
    server.add_sockets([sock])
    try:
        for case in errors:
            await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/{case}", raise_error=False)
    finally:
        server.stop()
    assert seen[403][0] == "Forbidden" and seen[400][0] == "Bad Hours"
    assert all(ours == tornados for ours, tornados in seen.values()), seen
    assert set(seen) == {403, 400, 500, 599}


# ---- the fleet of GPU machines the hub drives (fleet.json) --------------------------------------


class FakeAPI:
    """The manager's Docker API as the dashboard's reader asks it (``a_swarm``)."""

    def __init__(self):
        self.nodes_, self.tasks_, self.services_ = a_swarm()

    def nodes(self):
        return self.nodes_

    def tasks(self):
        return self.tasks_

    def services(self):
        return self.services_


def read_state(folder):
    """The dashboard's state as its reader makes it from ``folder`` (the hub's journal)."""
    from types import SimpleNamespace

    from gpu_swarm_spawner.dashboard.app import Reader

    reader = Reader(str(folder), 0, "jy", docker_client=SimpleNamespace(api=FakeAPI()))
    return json.loads(json.dumps(reader._read()))  # as the data call sends it


def test_the_keepers_snapshot_reaches_the_pages_state(tmp_path, monkeypatch):
    from .fleet_snapshots import AT, NOT_SNAPSHOTS, text

    monkeypatch.setattr("time.time", lambda: AT + 3)
    assert read_state(tmp_path)["fleet"] is None  # the fleet off: nothing of it
    (tmp_path / "fleet.json").write_text(text())
    fleet = read_state(tmp_path)["fleet"]
    assert [(m["name"], m["words"]) for m in fleet["machines"]][:2] == [
        ("gpu-2", "taking servers"),
        ("gpu-3", "paused (given back if it stays empty)"),
    ]
    last = fleet["provider"]["last"]
    assert (last["failed"], last["kind"]) == (True, "quota exceeded")
    assert "Quota 'NVIDIA_T4_GPUS' exceeded" in last["output"]
    assert fleet["cost"]["line"].endswith("about $31.25 at $2.5 an hour")
    assert fleet["age"] == 3 and not fleet["stale"]
    monkeypatch.setattr("time.time", lambda: AT + 61)
    assert read_state(tmp_path)["fleet"]["stale"]
    for case, content in NOT_SNAPSHOTS.items():  # never an error page
        if content is not None:
            path = tmp_path / "fleet.json"
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
            state = read_state(tmp_path)
            assert state["fleet"] is None, case
            assert state["machines"], case  # the rest of the page is there


@pytest.mark.browser
def test_the_page_draws_the_fleet_tells_a_refusal_at_the_next_refresh_and_hides_when_off(
    tmp_path, monkeypatch
):
    """The page itself in Debian's headless Chromium, its data calls answered with the state
    the reader makes of the keeper's snapshots: the machines in words, the cost, and the
    cloud's refusal above everything within one refresh of the snapshot that tells it."""
    import os

    if not os.path.exists("/usr/bin/chromium"):
        pytest.skip("Debian's chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tornado.template import Loader

    from gpu_swarm_spawner.dashboard.app import TEMPLATES
    from tests.integration.hub import CHROMIUM_ARGS

    from .fleet_snapshots import AT, SNAPSHOT, text

    monkeypatch.setattr("time.time", lambda: AT + 3)
    worked = {"busy": True, "last": {"action": "grow", "at": AT - 400, "ok": True, "kind": ""}}
    (tmp_path / "fleet.json").write_text(text(provider=worked))
    html = Loader(str(TEMPLATES)).load("dashboard.html").generate(user="admin", xsrf="x")

    def answer(route):
        url = route.request.url
        if url.endswith("/api/state"):
            route.fulfill(json=read_state(tmp_path))  # the file as it is at this refresh
        elif "/api/series" in url:
            route.fulfill(json={"error": "No Prometheus is configured for the plots."})
        else:
            route.fulfill(body=html, content_type="text/html")

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page()
            page.route("**/*", answer)
            page.goto("http://dashboard.test/services/dashboard/")
            page.wait_for_selector("#fleet-table")
            rows = page.locator("#fleet-table tbody tr").all_inner_texts()
            assert [r.split("\t")[:2] for r in rows][:3] == [
                ["gpu-2", "taking servers"],
                ["gpu-3", "paused (given back if it stays empty)"],
                ["gpu-4", "being given back"],
            ]
            assert rows[0].split("\t")[3:] == ["3", "0 / 3", "asked at 09:02 for 4 people in line"]
            assert rows[4].split("\t")[4] == "unknown / unknown"  # booting: not known yet
            kept = [r.split("\t")[:2] for r in rows if r.startswith(("own-1", "asked-3"))]
            assert kept == [
                ["own-1", "taking servers (fixed: yours, never given back)"],
                ["asked-3", "given up (never joined; still in the cloud's group)"],
            ]
            summary = page.inner_text("#fleet-summary")
            assert "Cost so far: 12.5 machine-hours, 20.1 of 37.5 slice-hours used" in summary
            assert "The cloud's group: 6 machine(s), as the hub counts it; 1 fixed" in summary
            assert "3 machine(s) on their way, ready in about 4 minutes" in summary
            assert "A provider command is running." in summary
            assert page.locator("#fleet-alert").is_hidden()  # the last call worked
            decisions = page.locator("#fleet-decisions-table tbody tr").all_inner_texts()
            assert decisions[0].split("\t")[1:4] == ["grow", "–", "4"]

            # the keeper's next round tells the cloud's refusal: shown at the next refresh (2 s)
            (tmp_path / "fleet.json").write_text(text())
            page.wait_for_selector("#fleet-alert:not([hidden])", timeout=3_000)
            alert = page.inner_text("#fleet-alert")
            assert "The cloud's provider failed: quota exceeded" in alert
            assert "What to do: the cloud's quota for these machines is used up" in alert
            assert "Its last output line: ERROR: (gcloud.compute.instance-groups" in alert
            assert "The hub asks the cloud again after" in alert
            assert page.locator("#fleet-stale").is_hidden()

            monkeypatch.setattr("time.time", lambda: AT + 120)  # the keeper stopped writing
            page.wait_for_selector("#fleet-stale:not([hidden])", timeout=3_000)
            assert "snapshot is 2 minutes old" in page.inner_text("#fleet-stale")

            (tmp_path / "fleet.json").unlink()  # the fleet off: nothing of it
            page.wait_for_selector("#fleet", state="hidden", timeout=3_000)
            assert page.locator("#fleet-alert").is_hidden()
            assert page.locator("[data-machine]").count() == 3  # the swarm's machines stay
        finally:
            browser.close()
    assert SNAPSHOT["provider"]["last"]["ok"] is False  # the fixture was not changed
