"""The GPU guard's rounds (worker_setup/guard.py and the guard_* modules beside it) over the
fake NVML, a /proc tree of files and an engine that answers from a list: attribution, warnings,
stops, notices, metrics, and every failure it must survive. The decision itself is tested in
test_guard_policy.py."""

from __future__ import annotations

import json
import logging
import signal
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpu_swarm_spawner import contract
from tests.fakes.nvml import FakeNVML
from worker_setup import guard_command, guard_metrics, guard_notices
from worker_setup.engine_api import EngineUnavailable
from worker_setup.guard import Guard, Options
from worker_setup.guard_attribution import Proc, Server, container_of, servers_from
from worker_setup.guard_policy import GuardSettings

GPU0 = "GPU-9a3e0000-0000-4000-8000-00000000a101"
GPU1 = "GPU-9a3e0000-0000-4000-8000-00000000a102"
ALICE, BOB = "a" * 64, "b" * 64
MiB = 1024 * 1024


def fixture(processes, fail=None):
    gpus = [
        {"uuid": GPU0, "name": "NVIDIA A10", "memory_mb": 24576, "utilization_percent": 37},
        {"uuid": GPU1, "name": "NVIDIA A10", "memory_mb": 24576},
    ]
    return {"gpus": gpus, "processes": processes, "fail": fail or {}, "scan_processes": False}


def labels(user, gpu=GPU0, slices="1", budget="8192"):
    found = {"com.docker.swarm.service.name": f"jy-{user}", "gpu-jupyterhub.user": user,
             "gpu-jupyterhub.gpu": gpu, "gpu-jupyterhub.slices": slices}  # fmt: skip
    if budget is not None:
        found["gpu-jupyterhub.gpu-memory-limit-mb"] = budget
    return found


class Engine:
    """The engine's two calls the guard makes: containers listed from ``self.running``, and
    their first process (its file system at ``proc/PID/root``)."""

    def __init__(self, proc=None):
        self.running = [{"Id": ALICE, "Labels": labels("alice")},
                        {"Id": BOB, "Labels": labels("bob")}]  # fmt: skip
        self.pids = {ALICE: 11, BOB: 22}
        self.proc = proc
        self.down = False
        self.advertised = {GPU0: 3, GPU1: 3, "ssd": 2}
        self.labels = ["rack=7"]  # the engine's labels, as /info lists them
        self.info_calls = 0

    def containers(self, label):
        if self.down:
            raise EngineUnavailable("the Docker engine at /x.sock does not answer: refused")
        return [c for c in self.running if label in c["Labels"]]

    def info(self):
        self.info_calls += 1
        if self.down:
            raise EngineUnavailable("down")
        specs = [
            {"DiscreteResourceSpec": {"Kind": k, "Value": v}} for k, v in self.advertised.items()
        ]
        named = [{"NamedResourceSpec": {"Kind": "x", "Value": "y"}}]
        return {"GenericResources": specs + named, "Labels": self.labels}

    def container_pid(self, container):
        if self.down:
            raise EngineUnavailable("down")
        return self.pids[container]

    def notices(self, container):
        """The notices the guard last wrote into ``container``."""
        path = self.proc / str(self.pids[container]) / "root/tmp/gpuhub-guard/notices.json"
        return json.loads(path.read_text())["notices"] if path.exists() else []


class Machine:
    """A /proc of files: each pid's cgroup, start time, in-container pid and command."""

    def __init__(self, root):
        self.root = root
        self.kills: list[tuple[int, int]] = []

    def add(self, pid, container=None, start=100, inside=7, command="python -m ipykernel_launcher"):
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        cgroup = f"/docker/{container}" if container else "/user.slice/session-1.scope"
        (d / "cgroup").write_text(f"12:memory:{cgroup}\n0::{cgroup}\n")
        (d / "stat").write_text(f"{pid} (py thon) S " + "0 " * 18 + f"{start} 0 0\n")
        (d / "status").write_text(f"Name:\tpython\nNSpid:\t{pid}\t{inside}\n")
        (d / "cmdline").write_text(command.replace(" ", "\0") + "\0")

    def remove(self, pid):
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()

    def kill(self, pid, sig):
        if not (self.root / str(pid)).is_dir():
            return False
        self.kills.append((pid, sig))
        return True


@pytest.fixture
def machine(tmp_path):
    m = Machine(tmp_path / "proc")
    m.root.mkdir()
    m.add(101, ALICE, inside=42)
    m.add(102, ALICE)
    m.add(201, BOB)
    m.add(301)  # the host's own
    for init in (11, 22):  # the containers' first processes, and their file systems
        (m.root / str(init) / "root" / "tmp").mkdir(parents=True)
    return m


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


#: alice holds 9000 + 1000 MiB of her 8192, bob 2000 MiB, the host 500 MiB
OVER = [
    {"pid": 101, "gpu": 0, "used_mb": 9000},
    {"pid": 102, "gpu": 0, "used_mb": 1000},
    {"pid": 201, "gpu": 0, "used_mb": 2000},
    {"pid": 301, "gpu": 0, "used_mb": 500},
]


def make_guard(machine, mode="enforce", processes=OVER, fail=None, engine=None, **options):
    clock = Clock()
    guard = Guard(
        GuardSettings(mode=mode, grace_seconds=60),
        FakeNVML(fixture(processes, fail)),
        engine or Engine(machine.root),
        Options(interval=5, kill_after=10, machine="gpu-1", **options),
        proc=Proc(str(machine.root)),
        clock=clock,
        wall=lambda: 1_700_000_000.0 + clock.now,
        kill=machine.kill,
    )
    return guard, clock


# ---- attribution --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cgroup, container",
    [
        (f"12:memory:/docker/{ALICE}\n0::/docker/{ALICE}\n", ALICE),  # v1, cgroupfs driver
        (f"0::/system.slice/docker-{ALICE}.scope\n", ALICE),  # v2, systemd driver
        (f"0::/docker/{BOB}/docker/{ALICE}\n", ALICE),  # an engine in a container
        ("0::/user.slice/user-0.slice/session-3.scope\n", None),  # a host process
        (f"0::/docker/{ALICE}0\n", None),  # not an id: 65 hex digits
    ],
)
def test_a_process_is_found_in_its_container_by_its_cgroup(cgroup, container):
    assert container_of(cgroup) == container


def test_servers_come_from_the_labels_and_odd_labels_are_said():
    servers, problems = servers_from([
        {"Id": ALICE, "Labels": labels("alice", slices="2", budget="16384")},
        {"Id": BOB, "Labels": labels("bob", budget=None)},
        {"Id": "c" * 64, "Labels": {"gpu-jupyterhub.user": "carol"}},  # no GPU: not guarded
        {"Id": "d" * 64, "Labels": labels("dave", slices="two")},
    ])  # fmt: skip
    assert (servers[ALICE].owner, servers[ALICE].slices, servers[ALICE].budget_mb) == (
        "jy-alice", 2, 16384)  # fmt: skip
    assert servers[BOB].budget_mb is None
    assert set(servers) == {ALICE, BOB}
    assert problems == [
        "jy-dave: labels gpu-jupyterhub.slices/gpu-jupyterhub.gpu-memory-limit-mb are not "
        "whole numbers; its processes count as nobody's"
    ]


# ---- each participant's own figures -------------------------------------------------------


def figures(machine, pid):
    path = machine.root / str(pid) / "root/tmp/gpuhub-guard/usage.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_each_participant_gets_their_own_figures_written_when_they_change(machine):
    guard, clock = make_guard(machine, mode="warn")
    guard.round()
    alice, bob = figures(machine, 11), figures(machine, 22)
    assert (alice["gpu"], alice["used_mb"], alice["budget_mb"]) == (GPU0, 10_000, 8192)
    assert alice["gpu_memory_total_mb"] > 0 and alice["time"] == 1_700_000_000.0 + clock.now
    assert bob["used_mb"] == 2000  # the host's 500 MiB are nobody's, not in anyone's figures
    first = alice["time"]
    clock.now += 5
    guard.round()
    assert figures(machine, 11)["time"] == first  # unchanged: not written again
    clock.now += guard_notices.USAGE_REFRESH_S
    guard.round()
    assert figures(machine, 11)["time"] > first  # written again before it goes stale
    guard.nvml = FakeNVML(fixture([p for p in OVER if p["pid"] != 101]))
    clock.now += 5
    guard.round()
    assert figures(machine, 11)["used_mb"] == 1000  # her big process ended: said at once


# ---- warn and enforce ---------------------------------------------------------------------


def test_warn_mode_tells_the_participant_over_budget_and_never_stops(machine, caplog):
    caplog.set_level(logging.INFO, "gpu-guard")
    guard, clock = make_guard(machine, mode="warn")
    for _ in range(20):
        guard.round()
        clock.now += 5
    assert machine.kills == []
    [warning] = guard.engine.notices(ALICE)
    assert warning["level"] == "warning" and warning["title"] == "GPU memory over your budget"
    assert warning["message"].startswith(
        "Your processes use 9.8 GB of GPU memory; your budget is 8.0 GB (1 slice of NVIDIA A10)"
    )
    assert "will be stopped" not in warning["message"]
    assert guard.engine.notices(BOB) == []
    # written once, into her container's file system only (everyone gets their figures)
    notices = list(machine.root.glob("*/root/tmp/gpuhub-guard/notices.json"))
    assert notices == [machine.root / "11/root/tmp/gpuhub-guard/notices.json"]
    assert guard.warnings == {("alice", GPU0): 1}
    # the host's process: reported once, never touched
    reports = [r for r in caplog.messages if "process 301" in r]
    assert reports == [
        f"GPU process 301 on {GPU0} (0.5 GB): belongs to no participant; not touched"
    ]


def test_enforce_stops_the_biggest_process_after_the_grace_and_nothing_else(machine):
    guard, clock = make_guard(machine)
    guard.round()  # over: warned, the grace begins
    [warning] = guard.engine.notices(ALICE)
    assert "If you still use more than 8.8 GB at " in warning["message"]
    assert "the process holding the most (pid 42 in your server (python -m ipykernel_launcher))" \
        in warning["message"]  # fmt: skip
    clock.now += 55
    guard.round()
    assert machine.kills == []  # within the grace
    clock.now += 5
    guard.round()
    assert machine.kills == [(101, signal.SIGTERM)]  # 9000 MiB; 1000 MiB left is within
    stop = guard.engine.notices(ALICE)[-1]
    assert stop["level"] == "error"
    assert stop["message"].startswith(
        "The GPU guard stopped pid 42 in your server (python -m ipykernel_launcher), which held "
        "8.8 GB of GPU memory: your processes used 9.8 GB, above 8.8 GB (110% of your 8.0 GB "
        "budget) for more than 60 s."
    )
    assert guard.stops == {("alice", GPU0): 1}
    # SIGTERM ignored: SIGKILL after --kill-after, to the same process only
    clock.now += 10
    guard.round()
    assert machine.kills == [(101, signal.SIGTERM), (101, signal.SIGKILL)]
    assert all(pid in (101,) for pid, _ in machine.kills)  # bob and the host: untouched


def test_a_process_gone_or_replaced_before_the_kill_is_left_alone(machine, caplog):
    caplog.set_level(logging.INFO, "gpu-guard")
    guard, clock = make_guard(machine)
    guard.round()
    clock.now += 60
    guard.round()
    assert machine.kills == [(101, signal.SIGTERM)]
    machine.add(101, ALICE, start=555)  # it ended; its pid is now another process's
    clock.now += 10
    guard.round()
    assert machine.kills == [(101, signal.SIGTERM)]  # no SIGKILL for the newcomer
    guard2, clock2 = make_guard(machine)
    guard2.round()
    clock2.now += 60
    observe = guard2.observe

    def read_then_end(now=None):
        found = observe(now)
        machine.remove(101)  # gone between reading and acting
        return found

    guard2.observe = read_then_end
    guard2.round()
    assert (101, signal.SIGTERM) not in machine.kills[1:]
    assert "jy-alice: pid 101 is already gone" in caplog.messages
    # replaced between reading and acting: the newcomer with its pid is not signalled
    machine.add(101, ALICE, start=100)
    guard3, clock3 = make_guard(machine)
    guard3.round()
    clock3.now += 60
    observe3 = guard3.observe

    def read_then_replace(now=None):
        found = observe3(now)
        machine.add(101, ALICE, start=777)
        return found

    guard3.observe = read_then_replace
    kills = len(machine.kills)
    guard3.round()
    assert machine.kills[kills:] == []


def test_back_within_budget_is_said_and_the_grace_starts_again(machine):
    guard, clock = make_guard(machine)
    guard.round()
    clock.now += 30
    guard.nvml = FakeNVML(fixture([p for p in OVER if p["pid"] != 101]))
    guard.round()
    assert [n["level"] for n in guard.engine.notices(ALICE)] == ["warning", "info"]
    guard.nvml = FakeNVML(fixture(OVER))
    clock.now += 40  # 70 s after the first excess, but only now over again
    guard.round()
    assert machine.kills == []


def test_the_notices_file_keeps_the_last_twenty(machine):
    guard, _ = make_guard(machine)
    server = Server(ALICE, "jy-alice", "alice", GPU0, 1, 8192)
    for n in range(25):
        guard._notify(server, {"id": f"n{n}", "level": "info", "time": n, "message": "m"})
    guard._notify(server, {"id": "n24", "level": "info", "time": 99, "message": "again"})
    kept = guard.engine.notices(ALICE)
    assert [n["id"] for n in kept] == [f"n{n}" for n in range(5, 24)] + ["n24"]
    assert kept[-1]["message"] == "again"


def test_a_link_the_participant_planted_fails_the_write_instead_of_following_it(tmp_path, caplog):
    root, outside = tmp_path / "root", tmp_path / "host-etc"
    (root / "tmp").mkdir(parents=True)
    outside.mkdir()
    (root / "tmp" / "gpuhub-guard").symlink_to(outside)
    with pytest.raises(OSError):
        guard_notices.write_into(str(root), "{}")
    assert list(outside.iterdir()) == []
    (root / "tmp" / "gpuhub-guard").unlink()
    (root / "tmp" / "gpuhub-guard").mkdir()
    (root / "tmp" / "gpuhub-guard" / "notices.json").symlink_to(outside / "passwd")
    guard_notices.write_into(str(root), '{"notices": []}')  # the link is replaced, not followed
    assert list(outside.iterdir()) == []
    assert (root / "tmp/gpuhub-guard/notices.json").read_text() == '{"notices": []}'


# ---- what it survives ---------------------------------------------------------------------


def test_nvml_failing_to_start_is_logged_once_and_tried_again(machine, caplog):
    guard, clock = make_guard(machine, fail={"nvmlInit": {"error": "DriverNotLoaded"}})
    for _ in range(3):
        done = guard.round()
        clock.now += 5
    assert done.snapshot.gpus == ()
    assert len([m for m in caplog.messages if m.startswith("NVML: cannot start")]) == 1
    assert guard.errors["nvml"] == 3
    guard.nvml.failures.clear()  # the driver is back
    assert len(guard.round().snapshot.gpus) == 2


def test_a_lost_gpu_is_logged_and_the_other_still_guarded(machine, caplog):
    processes = [*OVER, {"pid": 201, "gpu": 1, "used_mb": 100}]
    fail = {"nvmlDeviceGetComputeRunningProcesses": {"gpu": 1, "error": "GpuIsLost"}}
    guard, _ = make_guard(machine, processes=processes, fail=fail, mode="warn")
    guard.round()
    assert any("GPU is lost" in m for m in caplog.messages)
    assert guard.warnings == {("alice", GPU0): 1}


def test_while_the_engine_is_down_nothing_is_decided_and_the_grace_is_kept(machine, caplog):
    guard, clock = make_guard(machine)
    guard.round()
    guard.engine.down = True
    for _ in range(3):
        clock.now += 20
        done = guard.round()
    assert done.reading is None and machine.kills == []
    assert len([m for m in caplog.messages if m.startswith("engine: ")]) == 1
    guard.engine.down = False
    guard.round()  # 60 s after the first warning: the stop is due now
    assert machine.kills == [(101, signal.SIGTERM)]


def test_a_container_without_labels_counts_as_nobodys(machine):
    engine = Engine(machine.root)
    engine.running[0]["Labels"] = {"com.docker.swarm.service.name": "jy-alice"}
    guard, clock = make_guard(machine, engine=engine)
    for _ in range(20):
        guard.round()
        clock.now += 5
    assert machine.kills == [] and engine.notices(ALICE) == []


def test_a_round_that_fails_does_not_end_the_guard(machine, monkeypatch, caplog):
    guard, _ = make_guard(machine, mode="warn")
    guard.options.interval = 0.01
    calls = []

    def broken(now=None):
        calls.append(1)
        if len(calls) >= 3:
            stop.set()
        raise RuntimeError("a bug")

    monkeypatch.setattr(guard, "observe", broken)
    stop = threading.Event()
    guard.run(stop)
    assert len(calls) == 3 and guard.errors["round"] == 3
    assert "this round failed; the next one goes on" in caplog.messages


# ---- metrics and --once -------------------------------------------------------------------


def scrape(guard) -> dict:
    registry = CollectorRegistry()

    class Collector:
        def collect(self):
            return guard_metrics.metric_families(guard)

    registry.register(Collector())
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "machine"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_are_the_last_rounds_figures(machine):
    guard, _ = make_guard(machine, mode="warn")
    guard.round()
    m = scrape(guard)
    gpu = (("gpu", GPU0),)
    assert m[("gpuhub_gpu_memory_used_bytes", gpu)] == 12500 * MiB  # what the fake reports
    assert m[("gpuhub_gpu_memory_total_bytes", gpu)] == 24576 * MiB
    assert m[("gpuhub_gpu_utilization_percent", gpu)] == 37
    assert m[("gpuhub_gpu_slices_used", gpu)] == 2
    assert m[("gpuhub_gpu_slices_total", gpu)] == 3  # what the engine advertises
    assert m[("gpuhub_gpu_slices_total", (("gpu", GPU1),))] == 3
    assert not [key for key in m if ("gpu", "ssd") in key[1]]  # not a GPU
    alice = (("gpu", GPU0), ("user", "alice"))
    assert m[("gpuhub_participant_gpu_memory_used_bytes", alice)] == 10000 * MiB
    assert m[("gpuhub_participant_gpu_memory_budget_bytes", alice)] == 8192 * MiB
    assert m[("gpuhub_participant_gpu_memory_used_bytes", (("gpu", GPU0), ("user", "bob")))] == (
        2000 * MiB)  # fmt: skip
    assert m[("gpuhub_unattributed_gpu_memory_bytes", gpu)] == 500 * MiB
    assert m[("gpuhub_participant_warnings_total", alice)] == 1
    assert ("gpuhub_participant_stops_total", alice) not in m
    assert m[("gpuhub_guard_engine_up", ())] == 1


def test_once_prints_the_reading_and_changes_nothing(machine, capsys):
    guard, _ = make_guard(machine)
    done, _ = guard.observe()
    lines = guard_command.describe_round(done)
    assert any("pid     101" in line and "jy-alice (alice)" in line for line in lines)
    assert any("pid     301" in line and "no participant's" in line for line in lines)
    assert any(line.startswith("  would warn:") for line in lines)
    assert any(line.startswith(GPU0) and "2 of 3 slices held" in line for line in lines)
    assert guard.engine.notices(ALICE) == [] and machine.kills == []


def test_the_advertised_slices_are_read_each_minute_and_after_the_engine_was_away(machine):
    guard, clock = make_guard(machine, mode="warn")
    engine = guard.engine
    guard.round()
    clock.now += 30
    guard.round()
    assert engine.info_calls == 1
    engine.advertised[GPU0] = 7  # a join rewrote daemon.json and restarted the engine
    engine.down = True
    assert guard.round().slices == {GPU0: 3, GPU1: 3}  # the last known, while it is away
    engine.down = False
    assert guard.round().slices == {GPU0: 7, GPU1: 3}
    clock.now += 61
    engine.advertised[GPU1] = 1
    assert guard.round().slices == {GPU0: 7, GPU1: 1}
    # a machine joined with Swarm's spare unit (contract.SWARM_SPARE): its slices are one less
    clock.now += 61
    engine.advertised.update({GPU0: 4, GPU1: 4})
    engine.labels.append(f"{contract.SPARE_LABEL}={contract.SWARM_SPARE}")
    assert guard.round().slices == {GPU0: 3, GPU1: 3}
