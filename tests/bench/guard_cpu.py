"""The GPU guard's CPU per round on a machine of 24 participants: part 6 of `make bench`, in this
process, without Docker or a GPU. Figures printed, never asserted.

    python -m tests.bench.guard_cpu      (or: bash tests/bench/run.sh --only guard)

The real Guard (worker_setup/guard.py) runs its rounds over

- the fake NVML: 8 H100s of 3 slices, 24 participants with 2 GPU processes each and 3 host
  processes, all listed in the fixture (``"scan_processes": false``);
- a real Proc over a /proc of files (each pid's cgroup, stat, status and cmdline);
- an engine answering containers() and container_pid() from memory; the notices go into each
  container's root under that /proc (one participant is over the warn line and is warned once).

Measured: CPU per round (``time.process_time`` over 200 rounds, median of 5 repeats), and of
it the fake NVML's reading, which stands in for the driver's calls (measure those on a GPU
machine); the one engine call a round made for real (``EngineAPI.containers`` over a unix
socket to a small threaded HTTP server answering 24 containers' JSON; the calling thread's CPU,
added to the round's); the fake NVML's /proc scan over this machine's /proc (the test bed's
only); and, with a clock stepping 5 s a round and a grace of 60 s, the seconds from a process
going over its budget to the warning and to the stop.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import os
import signal
import socketserver
import statistics
import tempfile
import threading
import time
from pathlib import Path

from gpu_swarm_spawner import contract
from tests.fakes.nvml import FakeNVML
from worker_setup import telemetry
from worker_setup.engine_api import EngineAPI
from worker_setup.guard import Guard, Options
from worker_setup.guard_attribution import Proc, servers_from
from worker_setup.guard_notices import NOTICES_FILE
from worker_setup.guard_policy import GuardSettings

GPUS, SLICES, PROCESSES_EACH, HOST_PROCESSES = 8, 3, 2, 3
PARTICIPANTS = GPUS * SLICES
GPU_MB = 81559  # an H100 80GB
BUDGET_MB = GPU_MB // SLICES
INTERVAL, GRACE, KILL_AFTER = 5.0, 60.0, 10.0
ROUNDS, REPEATS = 200, 5


def gpu_uuid(index: int) -> str:
    return f"GPU-3f2a9c4e-81b7-4d2e-a6c5-{index:012d}"


def container_id(n: int) -> str:
    return hashlib.sha256(f"bench-{n}".encode()).hexdigest()


def init_pid(n: int) -> int:
    """The first process of participant ``n``'s container."""
    return 20000 + n


def gpu_pids(n: int) -> list[int]:
    return [30000 + PROCESSES_EACH * n + k for k in range(PROCESSES_EACH)]


HOST_PIDS = [900 + k for k in range(HOST_PROCESSES)]


def processes(over: float = 1.05) -> list[dict]:
    """Each participant's processes within budget (70% of it), participant 0's at ``over``
    times the budget (1.05: above the warn line, below the stop line); and the host's."""
    listed = []
    for n in range(PARTICIPANTS):
        share = over if n == 0 else 0.7
        first = int(BUDGET_MB * share * 0.8)
        sizes = [first, int(BUDGET_MB * share) - first]
        for pid, mb in zip(gpu_pids(n), sizes):
            listed.append({"pid": pid, "gpu": n // SLICES, "used_mb": mb})
    listed += [{"pid": pid, "gpu": k, "used_mb": 300} for k, pid in enumerate(HOST_PIDS)]
    return listed


def fixture(listed: list[dict], scan: bool = False) -> dict:
    gpus = [{"uuid": gpu_uuid(i), "name": "NVIDIA H100 80GB HBM3", "memory_mb": GPU_MB,
             "utilization_percent": 35, "memory_used_mb": 500} for i in range(GPUS)]  # fmt: skip
    return {"gpus": gpus, "processes": listed, "scan_processes": scan}


def container(n: int) -> dict:
    """Participant ``n``'s container as the engine's list API gives it (a Swarm task's)."""
    user, cid = f"user{n:02d}", container_id(n)
    service = f"jy-{user}"
    task = hashlib.sha256(f"task-{n}".encode()).hexdigest()[:25]
    labels = {
        "com.docker.stack.namespace": "",
        "com.docker.swarm.node.id": "kq3x9w1m2n4b5v6c7x8z9a0s1",
        "com.docker.swarm.service.id": task[::-1],
        "com.docker.swarm.service.name": service,
        "com.docker.swarm.task": "",
        "com.docker.swarm.task.id": task,
        "com.docker.swarm.task.name": f"{service}.1.{task}",
        contract.USER_LABEL: user,
        contract.GPU_LABEL: gpu_uuid(n // SLICES),
        contract.SLICES_LABEL: "1",
        contract.BUDGET_LABEL: str(BUDGET_MB),
    }
    network = {"IPAMConfig": {"IPv4Address": f"10.0.1.{n + 10}"}, "Links": None, "Aliases": None,
               "NetworkID": "x" * 64, "EndpointID": "y" * 64, "Gateway": "",
               "IPAddress": f"10.0.1.{n + 10}", "IPPrefixLen": 24, "IPv6Gateway": "",
               "GlobalIPv6Address": "", "GlobalIPv6PrefixLen": 0,
               "MacAddress": "02:42:0a:00:01:0a", "DriverOpts": None}  # fmt: skip
    return {
        "Id": cid,
        "Names": [f"/{service}.1.{task}"],
        "Image": "gpu-jupyterhub/singleuser:latest@sha256:" + "a" * 64,
        "ImageID": "sha256:" + "b" * 64,
        "Command": "tini -g -- start-singleuser.sh",
        "Created": 1_700_000_000 + n,
        "Ports": [],
        "Labels": labels,
        "State": "running",
        "Status": "Up 2 hours",
        "HostConfig": {"NetworkMode": "default"},
        "NetworkSettings": {"Networks": {"gpuhub": network}},
        "Mounts": [{"Type": "volume", "Name": f"jupyterhub-{user}", "Source":
                    f"/var/lib/docker/volumes/jupyterhub-{user}/_data", "Destination":
                    "/home/jovyan", "Driver": "local", "Mode": "z", "RW": True,
                    "Propagation": ""}],
    }  # fmt: skip


CONTAINERS = [container(n) for n in range(PARTICIPANTS)]


class MemoryEngine:
    """The engine's two calls the guard makes, answered from memory."""

    def containers(self, label: str) -> list[dict]:
        return [c for c in CONTAINERS if label in c["Labels"]]

    def container_pid(self, ident: str) -> int:
        return init_pid(next(n for n, c in enumerate(CONTAINERS) if c["Id"] == ident))


def make_proc(root: Path) -> None:
    """A /proc of files: every GPU process in its container (cgroup v2, systemd driver), the
    host's in a session; each container's first process with its file system (``root``)."""

    def add(pid: int, cgroup: str, command: str) -> None:
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(f"0::{cgroup}\n")
        (d / "stat").write_text(f"{pid} (python3) S " + "1 " * 18 + "123456 0 0\n")
        (d / "status").write_text(f"Name:\tpython3\nNSpid:\t{pid}\t{pid % 100}\n")
        (d / "cmdline").write_text(command.replace(" ", "\0") + "\0")

    for n in range(PARTICIPANTS):
        scope = f"/system.slice/docker-{container_id(n)}.scope"
        for pid in gpu_pids(n):
            add(pid, scope, "/opt/conda/bin/python -m ipykernel_launcher -f kernel.json")
        (root / str(init_pid(n)) / "root" / "tmp").mkdir(parents=True)
    for pid in HOST_PIDS:
        add(pid, "/user.slice/user-0.slice/session-1.scope", "python3 train.py")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_guard(root: Path, listed: list[dict]) -> tuple[Guard, Clock, list[tuple[int, int]]]:
    clock, kills = Clock(), []

    def kill(pid: int, sig: int) -> bool:
        kills.append((pid, sig))
        return True  # the process stays: SIGTERM ignored

    guard = Guard(
        GuardSettings(mode="enforce", grace_seconds=GRACE),
        FakeNVML(fixture(listed)),
        MemoryEngine(),
        Options(interval=INTERVAL, kill_after=KILL_AFTER, machine="bench"),
        proc=Proc(str(root)),
        clock=clock,
        wall=lambda: 1_700_000_000.0 + clock.now,
        kill=kill,
    )
    return guard, clock, kills


def per_call(call, n: int, timer=time.process_time) -> float:
    """Median seconds of ``timer`` per call of ``call`` over ``REPEATS`` runs of ``n``."""
    runs = []
    for _ in range(REPEATS):
        start = timer()
        for _ in range(n):
            call()
        runs.append((timer() - start) / n)
    return statistics.median(runs)


# ---- 1. the round -------------------------------------------------------------------------


def rounds(root: Path) -> tuple[float, float]:
    """CPU seconds per round, and per reading of the fake NVML."""
    guard, clock, kills = make_guard(root, processes())
    done = guard.round()  # the first round reads every cgroup; later ones only the start times
    owners = [p.owner for p in done.reading.processes]
    assert len(done.servers) == PARTICIPANTS, done.servers
    assert owners.count(None) == HOST_PROCESSES and len(owners) == len(processes()), owners
    notice = root / str(init_pid(0)) / "root" / NOTICES_FILE.lstrip("/")
    assert json.loads(notice.read_text())["notices"][0]["level"] == "warning"
    assert guard.warnings == {("user00", gpu_uuid(0)): 1}

    def one_round():
        clock.now += INTERVAL
        guard.round()

    cpu = per_call(one_round, ROUNDS)
    assert kills == [] and guard.errors == {}, (kills, guard.errors)
    return cpu, per_call(lambda: telemetry.read(guard.nvml), ROUNDS)


# ---- 2. the engine call -------------------------------------------------------------------


class _Engine(http.server.BaseHTTPRequestHandler):
    body = json.dumps(CONTAINERS).encode()

    def do_GET(self):  # noqa: N802 (http.server's name)
        found = self.path.startswith("/v1.41/containers/json")
        body = self.body if found else b'{"message": "page not found"}'
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet, and a unix socket has no client address to log
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def engine_call(folder: Path) -> tuple[float, float]:
    """CPU seconds of the calling thread per EngineAPI.containers(), and its wall time."""
    path = str(folder / "docker.sock")
    server = _UnixServer(path, _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = EngineAPI({"DOCKER_HOST": f"unix://{path}"})
        servers, problems = servers_from(api.containers(contract.USER_LABEL))
        assert len(servers) == PARTICIPANTS and not problems, (servers, problems)

        def call():
            api.containers(contract.USER_LABEL)

        return per_call(call, ROUNDS, time.thread_time), per_call(call, ROUNDS, time.perf_counter)
    finally:
        server.shutdown()
        server.server_close()


# ---- 3. the fake NVML's /proc scan ----------------------------------------------------------


def proc_scan() -> tuple[int, float, float]:
    """This machine's processes; CPU seconds of the first round (every environment read) and
    of each later one (nvmlDeviceGetCount, then every GPU's processes)."""
    nvml = FakeNVML(fixture([], scan=True), proc_root="/proc")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]

    def one_round():
        nvml.nvmlDeviceGetCount()
        for handle in handles:
            nvml.nvmlDeviceGetComputeRunningProcesses(handle)

    start = time.process_time()
    one_round()
    first = time.process_time() - start
    count = sum(1 for name in os.listdir("/proc") if name.isdigit())
    return count, first, per_call(one_round, 50)


# ---- 4. over budget: until the warning and the stop -----------------------------------------


def reaction(root: Path, after_round: float) -> tuple[float, float, float]:
    """Seconds from participant 0 going over the stop line ``after_round`` seconds after a
    round to its warning, its SIGTERM and its SIGKILL (the process ignoring SIGTERM)."""
    guard, clock, kills = make_guard(root, processes(over=0.7))
    guard.round()
    went_over = clock.now + after_round
    warned = term = None
    over = FakeNVML(fixture(processes(over=1.2)))  # above the stop line
    while True:
        clock.now += INTERVAL
        if clock.now >= went_over:
            guard.nvml = over
        guard.round()
        if warned is None and guard.warnings:
            warned = clock.now - went_over
        if term is None and (gpu_pids(0)[0], signal.SIGTERM) in kills:
            term = clock.now - went_over
        if (gpu_pids(0)[0], signal.SIGKILL) in kills:
            return warned, term, clock.now - went_over


def main() -> None:
    logging.getLogger("gpu-guard").setLevel(logging.ERROR)  # its once-only lines: not timed here
    print(
        f"\n6. the GPU guard's CPU per round (in-process: the real Guard over the fake NVML, a "
        f"/proc of files, an engine in memory; {REPEATS} x {ROUNDS} rounds)"
    )
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as tmp:
        folder = Path(tmp)
        make_proc(folder / "proc")
        round_cpu, nvml_cpu = rounds(folder / "proc")
        call_cpu, call_wall = engine_call(folder)
        procs, scan_first, scan_cpu = proc_scan()
        best = reaction(folder / "proc", after_round=INTERVAL - 0.001)
        worst = reaction(folder / "proc", after_round=0.001)
    print(
        f"  machine: {GPUS} GPUs x {SLICES} slices, {PARTICIPANTS} participants x "
        f"{PROCESSES_EACH} GPU processes + {HOST_PROCESSES} host processes"
    )
    print(
        f"  Guard.round(): {round_cpu * 1e3:.3f} ms CPU (median); of it the fake NVML's "
        f"reading {nvml_cpu * 1e3:.3f} ms, standing in for the driver's calls (not measured here)"
    )
    print(
        f"  engine: EngineAPI.containers() over a unix socket, {PARTICIPANTS} containers "
        f"({len(_Engine.body) / 1024:.0f} KiB of JSON): {call_cpu * 1e3:.3f} ms CPU in the "
        f"guard's thread, {call_wall * 1e3:.3f} ms wall; once a round"
    )
    print(
        f"  fake NVML /proc scan of this machine ({procs} processes; the test bed's only, never "
        f"on a GPU machine): {scan_cpu * 1e3:.3f} ms CPU a round, the first "
        f"{scan_first * 1e3:.1f} ms"
    )
    print(
        f"  over budget -> warning in {best[0]:.1f} to {worst[0]:.1f} s (worst: the interval, "
        f"{INTERVAL:g} s); -> SIGTERM in {best[1]:.1f} to {worst[1]:.1f} s (worst: grace "
        f"{GRACE:g} s + interval); -> SIGKILL, SIGTERM ignored, in {best[2]:.1f} to "
        f"{worst[2]:.1f} s (kill-after {KILL_AFTER:g} s)"
    )
    total = round_cpu + call_cpu
    print(
        f"guard: {PARTICIPANTS} participants, {total * 1e3:.2f} ms CPU per round = "
        f"{total / INTERVAL * 100:.3f}% of a core at {INTERVAL:g} s (goal < 1%)"
    )


if __name__ == "__main__":
    main()
