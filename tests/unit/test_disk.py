"""The hub's side of the disk watch (gpu_swarm_spawner/disk.py): the one reader of a watch's
report, fed real and broken ones; the decision without a hub; then the check against a
stand-in hub (its users, spawners and proxy) reading reports from a local HTTP server."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpu_swarm_spawner import disk

CONTAINER = "a" * 64
REASON = (
    "Your server was stopped at 14:03 because the disk of w1 was 91% full and your server "
    "wrote the most to it. Your files are kept."
)
REPORT = {
    "version": 1,
    "machine": "w1",
    "time": 1732350000.5,
    "every_s": 10,
    "filesystems": [
        {"path": "/var/lib/docker", "total": 1000, "used": 900, "line_percent": 90.0, "past": True}
    ],
    "servers": [
        {"service": "jy-alice", "user": "alice", "container": CONTAINER, "home": 123,
         "scratch": 456, "budget": 20971520000, "over": False,
         "stopped": {"time": 1732349990.0, "reason": REASON}},
        {"service": "jy-bob", "user": "bob", "container": "b" * 64, "home": None,
         "scratch": 7, "budget": None, "over": True, "stopped": None},
    ],
    "problems": ["/srv/homes: not measured (permission denied)"],
}  # fmt: skip


# ---- the reader ------------------------------------------------------------------------------


def test_a_report_is_read_whole():
    report = disk.read_report(json.dumps(REPORT))
    assert (report.machine, report.version, report.time, report.every_s) == (
        "w1", 1, 1732350000.5, 10.0)  # fmt: skip
    assert report.filesystems == (disk.FileSystem("/var/lib/docker", 1000, 900, 90.0, True),)
    alice, bob = report.servers
    assert alice == disk.ServerDisk(
        "jy-alice", "alice", CONTAINER, 123, 456, 20971520000, False,
        disk.Stopped(1732349990.0, REASON),
    )  # fmt: skip
    assert (bob.home, bob.budget, bob.over, bob.stopped) == (None, None, True, None)
    assert report.problems == ("/srv/homes: not measured (permission denied)",)
    assert disk.read_report(json.dumps(REPORT).encode()) == report  # the body as bytes


@pytest.mark.parametrize(
    "body, says",
    [
        ("", "not a JSON report"),
        ("<html>502 Bad Gateway</html>", "not a JSON report"),
        (b"\xff\xfe{", "not a JSON report"),
        ('{"servers": [', "not a JSON report"),  # cut short
        ("[1, 2]", "not a JSON object"),
        ("null", "not a JSON object"),
    ],
)
def test_an_answer_that_is_no_report_reads_as_a_report_of_nothing(body, says):
    report = disk.read_report(body, machine="w2")
    assert report.machine == "w2" and report.servers == () and report.filesystems == ()
    assert report.problems == (f"the answer is {says}",)


def test_unusable_entries_and_fields_are_left_out_and_said():
    broken = {
        "version": "1",
        "time": "yesterday",
        "filesystems": {"path": "/"},
        "servers": [
            "jy-x",
            {"user": "nobody"},  # no service: whose server is it?
            {"service": 7},
            {"service": "jy-alice", "home": "big", "scratch": -5, "budget": True,
             "over": "yes", "stopped": {"reason": 42}},
            {"service": "jy-bob", "home": float("inf"), "stopped": "yes"},
        ],
        "problems": ["one", 2, None],
    }  # fmt: skip
    report = disk.read_report(json.dumps(broken), machine="w3")
    assert (report.machine, report.version, report.time) == ("w3", None, None)
    assert report.filesystems == ()
    alice, bob = report.servers
    assert alice == disk.ServerDisk("jy-alice", stopped=disk.Stopped(0.0, ""))
    assert bob == disk.ServerDisk("jy-bob")
    assert report.problems == (
        "one",
        "'filesystems' is not a list; left out",
        "3 entry(ies) of 'servers' unusable; left out",
    )
    assert disk.read_report("{}") == disk.Report()


# ---- the decision ----------------------------------------------------------------------------


def report_of(*servers, machine="w1") -> disk.Report:
    return disk.Report(machine=machine, servers=tuple(servers))


def stopped(service, at=100.0, reason=REASON, container=CONTAINER) -> disk.ServerDisk:
    return disk.ServerDisk(service, container=container, stopped=disk.Stopped(at, reason))


def test_only_servers_a_watch_stopped_and_the_hub_runs_are_stopped_each_once():
    running = {
        "jy-alice": disk.Running("alice", started=50.0),
        "jy-bob--gpu": disk.Running("bob", "gpu"),
        "jy-carl": disk.Running("carl"),
    }
    reports = [
        report_of(stopped("jy-alice"), disk.ServerDisk("jy-carl", over=True)),
        report_of(stopped("jy-bob--gpu", reason=""), stopped("jy-gone"), machine="w2"),
        report_of(stopped("jy-alice")),  # the same stop, said twice
    ]
    chosen = disk.to_stop(reports, running)
    assert [(s.service, s.user, s.server, s.machine) for s in chosen] == [
        ("jy-alice", "alice", "", "w1"),
        ("jy-bob--gpu", "bob", "gpu", "w2"),
    ]
    assert chosen[0].reason == f"{REASON[:-1]}. {disk.ADVICE}"
    assert chosen[1].reason == f"{disk.NO_REASON[:-1]}. {disk.ADVICE}"
    assert chosen[0].key == ("jy-alice", CONTAINER, 100.0)
    # answered already: not again
    assert disk.to_stop(reports, running, {s.key for s in chosen}) == []


def test_a_server_starting_or_stopping_or_started_after_the_stop_is_left_alone():
    reports = [report_of(stopped("jy-alice", at=100.0))]
    assert disk.to_stop(reports, {"jy-alice": disk.Running("alice", pending="spawn")}) == []
    assert disk.to_stop(reports, {"jy-alice": disk.Running("alice", pending="stop")}) == []
    # the report is of the container before this start: old news
    assert disk.to_stop(reports, {"jy-alice": disk.Running("alice", started=101.0)}) == []
    assert disk.to_stop(reports, {"jy-alice": disk.Running("alice", started=99.0)}) != []


def test_the_participant_is_told_what_to_do_once():
    said = "Your server was stopped. Free some space and start your server again."
    assert disk.for_participant(said) == said
    assert disk.for_participant("  Stopped:\n the disk was full  ").endswith(
        "Stopped: the disk was full. " + disk.ADVICE
    )
    long = disk.for_participant("x" * 5000)
    assert long == "x" * disk.REASON_MAX + ". " + disk.ADVICE


def test_the_watches_are_asked_on_ready_machines_at_their_own_address():
    def node(name, addr, state="ready", manager=None):
        made = {"ID": f"id-{name}", "Status": {"State": state, "Addr": addr}}
        if name:
            made["Description"] = {"Hostname": name}
        if manager:
            made["ManagerStatus"] = {"Addr": manager}
        return made

    nodes = [
        node("w1", "10.0.0.5"),
        node("w2", "10.0.0.6", state="down"),
        node("mgr", "0.0.0.0", manager="10.0.0.2:2377"),
        node("", "0.0.0.0"),  # nowhere to ask
        node("v6", "0.0.0.0", manager="[fd00::2]:2377"),
    ]
    assert disk.machine_addresses(nodes) == [
        ("w1", "10.0.0.5"),
        ("mgr", "10.0.0.2"),
        ("v6", "fd00::2"),
    ]
    assert disk._url("fd00::2", 9446) == "http://[fd00::2]:9446/disk"


# ---- the check against a stand-in hub ---------------------------------------------------------


class Spawner:
    def __init__(self, service, started=None, pending=None):
        self.service_name, self.pending, self.active = service, pending, True
        self.orm_spawner = SimpleNamespace(started=started)
        self.told = []

    def stopped_for_disk(self, reason, machine):
        self.told.append((reason, machine))


class User:
    def __init__(self, name, **servers):
        self.name = name
        self.spawners = {"" if key == "default" else key: s for key, s in servers.items()}
        self.stopped = []
        self.failing = False

    async def stop(self, server_name=""):
        if self.failing:
            raise RuntimeError("the service could not be removed")
        self.stopped.append(server_name)
        self.spawners[server_name].active = False


class Hub:
    def __init__(self, *users):
        self.users = {u.name: u for u in users}
        self.log = logging.getLogger("test-disk")
        self.routes_removed = []

        async def delete_user(user, server_name):
            self.routes_removed.append((user.name, server_name))

        self.proxy = SimpleNamespace(delete_user=delete_user)


@pytest.fixture
async def watch():
    """A disk watch on 127.0.0.1 serving ``watch.body`` at /disk; 127.0.0.2 has none."""
    served = SimpleNamespace(body=json.dumps(REPORT), asked=0, status=200)

    class Report(web.RequestHandler):
        def get(self):
            served.asked += 1
            self.set_status(served.status)
            self.finish(served.body)

    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(web.Application([("/disk", Report)]))
    server.add_sockets(sockets)
    served.port = sockets[0].getsockname()[1]
    yield served
    server.stop()


def ready(name, address):
    return {
        "ID": name,
        "Description": {"Hostname": name},
        "Status": {"State": "ready", "Addr": address},
    }


def check_of(hub, port, machines):
    check = disk.DiskCheck(hub, port=port)
    check.timeout = 1.0

    async def nodes():
        return machines

    check.nodes = nodes
    return check


NOW = datetime.now(timezone.utc)
EARLIER = datetime.fromtimestamp(1732349000, timezone.utc).replace(tzinfo=None)  # naive UTC


async def test_a_server_its_watch_stopped_is_stopped_by_the_hub_and_its_participant_told(
    watch, caplog
):
    alice = User("alice", default=Spawner("jy-alice", started=EARLIER))
    bob = User("bob", default=Spawner("jy-bob"))
    hub = Hub(alice, bob)
    check = check_of(hub, watch.port, [ready("w1", "127.0.0.1")])
    with caplog.at_level(logging.INFO, "test-disk"):
        (made,) = await check.check()
    assert made.service == "jy-alice"
    assert hub.routes_removed == [("alice", "")] and alice.stopped == [""]  # route, then stop
    assert bob.stopped == []  # over budget: warned by the watch, never stopped for that
    reason = f"{REASON[:-1]}. {disk.ADVICE}"
    assert alice.spawners[""].told == [(reason, "w1")]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "test-disk"]
    assert line == f"Stopped the server of alice for the disk of w1 (files kept): {reason}"
    # the watch says it again until the container is gone: the hub stops it once
    alice.spawners[""].active = True
    assert await check.check() == [] and alice.stopped == [""] and watch.asked == 2


async def test_a_watch_that_does_not_answer_is_said_once_and_stops_nobody(watch, caplog):
    alice = User("alice", default=Spawner("jy-alice"))
    hub = Hub(alice)
    machines = [ready("w1", "127.0.0.1"), ready("w9", "127.0.0.2")]  # nothing listens on .2
    check = check_of(hub, watch.port, machines)
    watch.body = json.dumps({**REPORT, "servers": []})
    with caplog.at_level(logging.INFO, "test-disk"):
        assert await check.check() == []
        assert await check.check() == []
    said = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("The disk watch of w9 (http://127.0.0.2:")
    assert "nobody there is stopped for the disk by the hub until it does" in said[0]
    assert set(check.silent) == {"w9"}
    # it answers again (here: the machine's address changed to one that answers)
    machines[1] = ready("w9", "127.0.0.1")
    with caplog.at_level(logging.INFO, "test-disk"):
        await check.check()
    assert "The disk watch of w9 answers again" in caplog.text and check.silent == {}
    assert alice.stopped == []


async def test_a_broken_answer_or_an_error_stops_nobody_and_the_round_goes_on(watch, caplog):
    alice = User("alice", default=Spawner("jy-alice"))
    hub = Hub(alice)
    check = check_of(hub, watch.port, [ready("w1", "127.0.0.1")])
    watch.body = "<html>oops</html>"
    assert await check.check() == [] and alice.stopped == []
    # an answer of another kind (an older watch without /disk, a failing one) is no report,
    # however it reads
    watch.status = 404
    watch.body = json.dumps(REPORT)
    with caplog.at_level(logging.INFO, "test-disk"):
        assert await check.check() == [] and alice.stopped == []
    assert check.silent == {"w1": "HTTP 404"} and "does not answer: HTTP 404" in caplog.text
    watch.status = 200
    # a stop that fails is logged, tried again at the next round, and others still stopped
    carl = User("carl", gpu=Spawner("jy-carl--gpu"))
    hub.users["carl"] = carl
    alice.failing = True
    two = [stopped("jy-alice"), stopped("jy-carl--gpu", container="c" * 64)]
    entries = [
        {"service": s.service, "container": s.container, "stopped": vars(s.stopped)} for s in two
    ]
    watch.body = json.dumps({"machine": "w1", "servers": entries})
    with caplog.at_level(logging.INFO, "test-disk"):
        made = await check.check()
    assert [s.service for s in made] == ["jy-carl--gpu"] and carl.stopped == ["gpu"]
    assert "Could not stop jy-alice for the disk of w1" in caplog.text
    alice.failing = False
    assert [s.service for s in await check.check()] == ["jy-alice"]


async def test_the_check_starts_with_the_hub():
    hub = Hub()
    rounds = []

    async def check_once():
        rounds.append(1)

    disk.start(hub)
    hub.gpuhub_disk_check.check = check_once
    await asyncio.sleep(0.01)
    assert rounds == [1]  # at once, then every EVERY_S
    assert hub.gpuhub_disk_check.every == disk.EVERY_S == 10.0
    hub.gpuhub_disk_task.cancel()
