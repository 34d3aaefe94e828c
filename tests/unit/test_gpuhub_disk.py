"""The machine's disk watch (images/singleuser/gpuhub_disk.py): its decision, its measuring, the
notices it puts into containers, its engine calls and its report. The bed runs it for real
(tests/integration/test_disk.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import socket
import socketserver
import sys
import tarfile
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler

import pytest

from gpu_swarm_spawner import contract, homes

from .start_command import SINGLEUSER


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


disk = _load("gpuhub_disk", SINGLEUSER / "gpuhub_disk.py")
notices = _load("gpuhub_notices_notices", SINGLEUSER / "gpuhub_notices" / "notices.py")

GB = 2**30  # the units the watch shows (GiB, as GPUHUB_DISK_BUDGET_GB counts)
DOCKER, HOMES = 1, 2  # file system keys


def fs(key=DOCKER, used=50, available=50, path="/var/lib/docker") -> object:
    return disk.FileSystem(key, path, (used + available) * GB, used * GB, available * GB)


def server(name="alice", home=1, scratch=0, budget=20, line=90, home_fs=DOCKER, **kw):
    return disk.Server(
        container=f"{name}-container-0123456789",
        service=f"jy-{name}",
        user=name,
        home=int(home * GB),
        scratch=int(scratch * GB),
        home_fs=home_fs,
        scratch_fs=DOCKER,
        budget=int(budget * GB) if budget else None,
        line=line,
        **kw,
    )


def reading(*servers, filesystems=None, when=1_700_000_000.0):
    systems = filesystems or [fs()]
    return disk.Reading(when, "w1", {f.key: f for f in systems}, tuple(servers), 10.0)


def kinds(actions):
    return [(type(a).__name__, getattr(getattr(a, "server", None), "user", None)) for a in actions]


def test_its_names_are_the_hubs():
    assert disk.USER_LABEL == contract.USER_LABEL
    assert disk.DISK_BUDGET_LABEL == contract.DISK_BUDGET_LABEL
    assert disk.DISK_SAFETY_LABEL == contract.DISK_SAFETY_LABEL
    assert disk.SERVICE_LABEL == contract.DOCKER_SERVICE_LABEL
    assert disk.DISK_WATCH_PORT == contract.DISK_WATCH_PORT
    assert disk.HOME_PATH == homes.HOME_PATH
    assert os.path.basename(disk.NOTICES_FILE) == notices.DISK_NOTICES
    assert os.path.dirname(disk.NOTICES_FILE) == os.path.dirname(notices.DEFAULT_PATH)


# ---- the budget ---------------------------------------------------------------------------


def test_over_the_budget_is_warned_once_then_again_only_when_the_use_moved():
    actions, state = disk.decide(reading(server(home=21)))
    assert kinds(actions) == [("Warn", "alice")] and actions[0].first
    actions, state = disk.decide(reading(server(home=21.5)), state)
    assert actions == ()  # 0.5 GB of a 20 GB budget: under 5%, no news
    actions, state = disk.decide(reading(server(home=22.2)), state)
    assert kinds(actions) == [("Warn", "alice")] and not actions[0].first
    actions, state = disk.decide(reading(server(home=15)), state)
    assert kinds(actions) == [("Within", "alice")]
    actions, _ = disk.decide(reading(server(home=15)), state)
    assert actions == ()


def test_home_and_scratch_count_together_and_no_budget_warns_nobody():
    actions, _ = disk.decide(reading(server(home=12, scratch=9)))
    assert kinds(actions) == [("Warn", "alice")]
    actions, _ = disk.decide(reading(server(home=12, scratch=7)))
    assert actions == ()
    actions, _ = disk.decide(reading(server(home=500, budget=None)))
    assert actions == ()


def test_the_warning_tells_the_figures_and_what_to_do():
    (warn,), _ = disk.decide(reading(server(home=18, scratch=3)))
    notice = disk.notice_of(warn, 1_700_000_000.0)
    assert notice["level"] == "warning"
    assert "21.0 GB" in notice["message"] and "budget is 20.0 GB" in notice["message"]
    assert "home 18.0 GB" in notice["message"] and "scratch" in notice["message"]
    assert "Delete" in notice["message"]
    assert notices.parse_notices(json.dumps({"notices": [notice]})) == [notice]


# ---- the safety line ----------------------------------------------------------------------


def test_past_the_line_the_server_that_wrote_the_most_is_stopped_not_the_one_holding_most():
    full = [fs(used=89, available=11)]
    _, state = disk.decide(
        reading(server("alice", home=40), server("bob", home=2), filesystems=full)
    )
    past = [fs(used=92, available=8)]
    actions, state = disk.decide(
        reading(server("alice", home=40.1), server("bob", home=5), filesystems=past), state
    )
    stops = [a for a in actions if isinstance(a, disk.Stop)]
    assert [s.server.user for s in stops] == ["bob"]
    assert stops[0].wrote == 3 * GB and stops[0].line == 90
    reason = stops[0].reason
    assert "92% full" in reason and "safety line of 90%" in reason and "3.0 GB" in reason
    assert "the disk of the machine your server ran on (w1, /var/lib/docker)" in reason
    assert "files are kept" in reason
    # the next round: bob is not stopped twice (even where the engine's reading has not seen
    # him paused yet); alice, still writing, is next
    actions, state = disk.decide(
        reading(server("alice", home=42), server("bob", home=8), filesystems=past), state
    )
    assert [a.server.user for a in actions if isinstance(a, disk.Stop)] == ["alice"]
    assert set(state.stopped) == {server("alice").container, server("bob").container}


def test_a_file_system_past_its_line_that_nobody_writes_to_stops_nobody():
    past = [fs(used=95, available=5)]
    _, state = disk.decide(reading(server(home=10), filesystems=past))
    actions, _ = disk.decide(reading(server(home=10), filesystems=past), state)
    assert kinds(actions) == [("Past", None)] and actions[0].line == 90
    # nor on the first round, when nothing is known of who writes
    actions, _ = disk.decide(reading(server(home=10), filesystems=past))
    assert kinds(actions) == [("Past", None)]


def test_below_the_line_or_without_one_nobody_is_stopped():
    _, state = disk.decide(reading(server(home=1), filesystems=[fs(used=80, available=20)]))
    actions, _ = disk.decide(
        reading(server(home=9), filesystems=[fs(used=89, available=11)]), state
    )
    assert not [a for a in actions if isinstance(a, disk.Stop)]
    _, state = disk.decide(
        reading(server(home=1, line=None), filesystems=[fs(used=98, available=2)])
    )
    actions, _ = disk.decide(
        reading(server(home=9, line=None), filesystems=[fs(used=99, available=1)]), state
    )
    assert actions == ()


def test_shared_homes_their_own_line_and_words():
    systems = [fs(DOCKER, 10, 90), fs(HOMES, 90, 10, "/srv/homes")]
    a0 = server("alice", home=1, home_fs=HOMES)
    b0 = server("bob", home=1, home_fs=HOMES)
    _, state = disk.decide(reading(a0, b0, filesystems=systems))
    systems = [fs(DOCKER, 10, 90), fs(HOMES, 95, 5, "/srv/homes")]
    actions, _ = disk.decide(
        reading(
            server("alice", home=2, home_fs=HOMES),
            server("bob", home=1.5, scratch=3, home_fs=HOMES),  # scratch: the docker disk
            filesystems=systems,
        ),
        state,
    )
    (stop,) = actions
    assert stop.server.user == "alice" and stop.filesystem.key == HOMES
    assert "the shared storage of the homes (/srv/homes) was 95% full" in stop.reason


def test_the_lowest_line_of_the_servers_on_a_file_system_holds():
    systems = [fs(used=86, available=14)]
    _, state = disk.decide(
        reading(server("alice", line=95), server("bob", line=85), filesystems=systems)
    )
    actions, _ = disk.decide(
        reading(server("alice", home=2, line=95), server("bob", line=85), filesystems=systems),
        state,
    )
    assert [(type(a).__name__, a.line) for a in actions] == [("Stop", 85)]


def test_a_paused_server_is_not_stopped_again_and_a_gone_one_is_forgotten():
    past = [fs(used=95, available=5)]
    _, state = disk.decide(reading(server(home=1), filesystems=past))
    actions, state = disk.decide(reading(server(home=3), filesystems=past), state)
    assert kinds(actions) == [("Stop", "alice")]
    actions, state = disk.decide(reading(server(home=3, paused=True), filesystems=past), state)
    assert kinds(actions) == [("Past", None)]
    _, state = disk.decide(reading(filesystems=past), state)
    assert state.stopped == {} and state.written == {}


def test_the_report_says_each_server_its_figures_and_its_stop():
    past = [fs(used=95, available=5)]
    _, state = disk.decide(reading(server(home=1), server("bob"), filesystems=past))
    r = reading(server(home=25), server("bob"), filesystems=past)
    _, state = disk.decide(r, state)
    made = json.loads(json.dumps(disk.report(r, state, ["a problem"])))
    assert made["version"] == 1 and made["machine"] == "w1" and made["every_s"] == 10
    assert made["filesystems"] == [
        {
            "path": "/var/lib/docker",
            "total": 100 * GB,
            "used": 95 * GB,
            "line_percent": 90,
            "past": True,
        }  # fmt: skip
    ]
    alice, bob = made["servers"]
    assert alice["service"] == "jy-alice" and alice["home"] == 25 * GB and alice["over"]
    assert alice["budget"] == 20 * GB and alice["stopped"]["reason"].startswith("Your server")
    assert bob["stopped"] is None and not bob["over"]
    assert made["problems"] == ["a problem"]


# ---- measuring ----------------------------------------------------------------------------


def test_measure_counts_blocks_each_inode_once_and_follows_no_link(tmp_path):
    tree = tmp_path / "home"
    (tree / "data").mkdir(parents=True)
    with open(tree / "data" / "big", "wb") as f:
        f.write(os.urandom(3 * 1024 * 1024))
    os.link(tree / "data" / "big", tree / "again")
    with open(tree / "sparse", "wb") as f:
        f.truncate(10**10)  # 10 GB that take no disk
    outside = tmp_path / "outside"
    outside.mkdir()
    with open(outside / "other", "wb") as f:
        f.write(os.urandom(2 * 1024 * 1024))
    os.symlink(outside, tree / "link")
    size, device = disk.measure(str(tree))
    assert device == os.stat(tree).st_dev
    assert 3 * 1024 * 1024 <= size < 3 * 1024 * 1024 + 256 * 1024
    with pytest.raises(OSError):
        disk.measure(str(tmp_path / "missing"))


def test_paths_of_a_container_as_the_engine_describes_it():
    p = disk.paths_of(
        {
            "Id": "c" * 64,
            "Config": {"Labels": {contract.USER_LABEL: "alice"}},
            "State": {"Paused": True},
            "GraphDriver": {"Data": {"UpperDir": "/var/lib/docker/overlay2/x/diff"}},
            "Mounts": [
                {"Destination": "/srv/tutorials", "Source": "/shared/tutorials"},
                {"Destination": "/home/jovyan", "Source": "/var/lib/docker/volumes/h/_data"},
            ],
        }
    )
    assert p.home == "/var/lib/docker/volumes/h/_data"
    assert p.scratch == "/var/lib/docker/overlay2/x/diff" and p.paused
    assert disk.paths_of({"Id": "x"}).home is None


# ---- notices ------------------------------------------------------------------------------


def test_notices_go_in_as_a_tar_the_lab_extension_reads(tmp_path):
    warn = disk.Warn(server(home=25), first=True)
    folder, blob = disk.notices_tar([disk.notice_of(warn, 1_700_000_000.0)])
    assert folder == "/tmp"
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["gpuhub-guard"].isdir() and members["gpuhub-guard"].uid == 0
        assert members["gpuhub-guard/disk-notices.json"].mode == 0o644
        tar.extractall(tmp_path, filter="data")
    guard_file = tmp_path / "gpuhub-guard" / "notices.json"
    guard_file.write_text(json.dumps({"notices": [
        {"id": "gpu", "level": "info", "time": 1_600_000_000, "title": "", "message": "gpu"}
    ]}))  # fmt: skip
    read = notices.read_notices(str(guard_file))
    assert [n["id"] for n in read] == ["gpu", f"disk-over-{warn.server.container[:12]}"]


# ---- the engine, over a unix socket --------------------------------------------------------


class FakeEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def engine_at(tmp_path, containers: dict[str, dict], root: str, pause_status=204):
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def address_string(self):
            return "engine"

        def _answer(self, status, body=None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            calls.append(("GET", self.path))
            if self.path == "/info":
                return self._answer(200, {"DockerRootDir": root})
            if self.path.startswith("/containers/json"):
                return self._answer(200, [{"Id": c} for c in containers])
            ident = self.path.split("/")[2]
            if ident in containers:
                return self._answer(200, containers[ident])
            return self._answer(404, {"message": "No such container"})

        def do_POST(self):  # noqa: N802
            calls.append(("POST", self.path))
            if pause_status == 204:
                self._answer(204)
            else:
                self._answer(pause_status, {"message": "cannot pause"})

        def do_PUT(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(("PUT", self.path, self.headers["Content-Type"], body))
            self._answer(200)

        def log_message(self, *args):
            pass

    path = str(tmp_path / "engine.sock")
    server = FakeEngine(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, path, calls


PIDS = {"alice": 101, "bob": 102}


def container(name, home, scratch, budget_mb="20000", line="90"):
    """An inspected container; its home, as the watch reads it, is ``proc/PID/root/home/jovyan``
    (``homes_as_seen``)."""
    return {
        "Id": f"{name}-container-0123456789",
        "Config": {
            "Labels": {
                contract.USER_LABEL: name,
                contract.DOCKER_SERVICE_LABEL: f"jy-{name}",
                contract.DISK_BUDGET_LABEL: budget_mb,
                contract.DISK_SAFETY_LABEL: line,
            }
        },
        "State": {"Paused": False, "Pid": PIDS[name]},
        "GraphDriver": {"Data": {"UpperDir": scratch}},
        "Mounts": [{"Destination": "/home/jovyan", "Source": home}],
    }


def homes_as_seen(tmp_path) -> str:
    """Each server's home as the watch reads it: ``PROC/PID/root/home/jovyan``."""
    for pid in PIDS.values():
        (tmp_path / "proc" / str(pid) / "root/home/jovyan").mkdir(parents=True)
    return str(tmp_path / "proc")


def test_a_round_measures_under_the_host_root_pauses_the_writer_and_serves_its_report(tmp_path):
    host = tmp_path / "host"
    for part in ("docker/volumes/a", "docker/overlay2/a", "docker/volumes/b", "docker/overlay2/b"):
        (host / part).mkdir(parents=True)
    containers = {
        "alice-container-0123456789": container("alice", "/docker/volumes/a", "/docker/overlay2/a"),
        # a budget of 1 MiB (over it at once) and a line of 1%: any file system is past it
        # bob's home on shared storage that the watch's /host does not show: read as he sees it
        "bob-container-0123456789": container(
            "bob", "/srv/homes/bob", "/docker/overlay2/b", budget_mb="1", line="1"
        ),
    }
    engine, path, calls = engine_at(tmp_path, containers, "/docker")
    try:
        watch = disk.Watch(disk.Engine(path), str(host), 10, homes_as_seen(tmp_path))
        first = watch.round()
        assert [s["service"] for s in first["servers"]] == ["jy-alice", "jy-bob"]
        assert first["filesystems"][0]["path"] == "/docker" and first["filesystems"][0]["past"]
        (host / "docker/overlay2/b/tmp").mkdir()
        (host / "docker/overlay2/b/tmp/big").write_bytes(os.urandom(4 * 1024 * 1024))
        second = watch.round()
        bob = second["servers"][1]
        assert bob["scratch"] >= 4 * 1024 * 1024 and bob["over"]
        assert bob["home"] is not None and second["problems"] == []
        assert "wrote" not in bob["stopped"]["reason"]
        assert "writing to it the most: 4 MB in the last 10 seconds" in bob["stopped"]["reason"]
        assert second["servers"][0]["stopped"] is None
        assert ("POST", "/containers/bob-container-0123456789/pause") in calls
        puts = [c for c in calls if c[0] == "PUT"]
        assert all(c[1].startswith("/containers/bob-container") for c in puts)
        assert puts[-1][1].endswith("archive?path=%2Ftmp") and puts[-1][2] == "application/x-tar"
        with tarfile.open(fileobj=io.BytesIO(puts[-1][3])) as tar:
            written = json.load(tar.extractfile("gpuhub-guard/disk-notices.json"))
        assert [n["level"] for n in written["notices"]] == ["warning", "error"]
        listing = [c[1] for c in calls if c[1].startswith("/containers/json")][0]
        assert "gpu-jupyterhub.user" in urllib.request.unquote(listing)

        served = disk.serve(watch, 0, "127.0.0.1")  # loopback only: hermetic
        try:
            port = served.server_address[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/disk", timeout=5) as answer:
                assert json.load(answer) == json.loads(json.dumps(second))
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
        finally:
            served.shutdown()
    finally:
        engine.shutdown()


def test_an_engine_that_does_not_answer_leaves_the_last_report(tmp_path):
    watch = disk.Watch(disk.Engine(str(tmp_path / "nothing.sock")), str(tmp_path))
    assert watch.round() == {}
    with pytest.raises(disk.EngineError, match="did not answer"):
        disk.Engine(str(tmp_path / "nothing.sock")).root_dir()
    assert isinstance(socket.AF_UNIX, int)


def test_a_pause_the_engine_refused_is_tried_again_next_round(tmp_path):
    host = tmp_path / "host"
    (host / "docker/volumes/b").mkdir(parents=True)
    (host / "docker/overlay2/b").mkdir(parents=True)
    containers = {
        "bob-container-0123456789": container(
            "bob", "/docker/volumes/b", "/docker/overlay2/b", line="1"
        )
    }
    engine, path, calls = engine_at(tmp_path, containers, "/docker", pause_status=409)
    try:
        watch = disk.Watch(disk.Engine(path), str(host), 10, homes_as_seen(tmp_path))
        watch.round()
        for n in range(2):
            (host / f"docker/overlay2/b/f{n}").write_bytes(os.urandom(2 * 1024 * 1024))
            made = watch.round()
            assert made["servers"][0]["stopped"] is None
            assert any("could not be paused" in p and "409" in p for p in made["problems"])
        pauses = [c for c in calls if c[0] == "POST"]
        assert len(pauses) == 2
    finally:
        engine.shutdown()
