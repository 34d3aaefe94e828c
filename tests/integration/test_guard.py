"""The GPU guard on the bed: a fresh machine (own root filesystem, clean copy of the repository)
joins with the line `make join-command` prints, the fake NVML selected explicitly (two A10s of
24 GiB, 3 slices each: a budget of 8 GiB). Real participants' servers run there; each starts a
real process that the fake NVML reports as holding GPU memory (FAKE_NVML_GPU_MB in its
environment), as a kernel would on a real GPU:

- alice's process holds 10000 MiB (over her 8192 and over the stop line, 110%);
- bob's holds 2000 MiB on the same GPU;
- a process of the machine's own (no container) holds 3000 MiB.

First in warn mode: alice is warned (the notice lands in her container, metrics say so), and
nothing is stopped. Then the same line with --guard-mode enforce: the guard restarts, warns
again, and after the grace stops alice's process only; her server runs on, bob's process and
the machine's own are untouched.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import subprocess
import tarfile
import time
import urllib.request

import docker
import pytest

from .hub import BED as BED_ENV
from .hub import BED_RUN, engine_of
from .spawners import make_spawner, remove_services
from .test_worker_setup import bed, join_line

pytestmark = pytest.mark.integration

MACHINE = "fresh3"
ADDR = f"{BED_ENV['BED_NET']}.33"  # bed.sh's fresh_addr
ROOT = BED_RUN / f"{MACHINE}.root"
GUARD_LOG = ROOT / "var/log/gpu-jupyterhub-guard.log"
FIXTURE = "tests/fixtures/nvml/guard-2gpus.json"  # in the machine's copy of the repository
GPU0 = "GPU-9a3e0000-0000-4000-8000-00000000a101"
PORT = 9445
GRACE = 6
#: what each participant's server starts beside JupyterLab: a process "holding" GPU memory
HOLD = 'env FAKE_NVML_GPU_MB={mb} sleep 100000 & exec "$@"'


def on_machine(command: str, check: bool = True) -> subprocess.CompletedProcess:
    return bed("on", MACHINE, command, check=check)


def metrics() -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{ADDR}:{PORT}/metrics", timeout=5) as response:
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(what, timeout: float, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(step)
    return what()


@pytest.fixture(scope="module")
def machine(hub):
    """fresh3 joined with the printed line (warn mode), the image file and the fixture."""
    bed("fresh", MACHINE)
    try:
        tar = bed("image-tar", MACHINE).stdout.strip().splitlines()[-1]
        line = join_line().removeprefix("sudo ")
        extra = ["--image-tar", tar, "--nvml-fixture", FIXTURE, "--guard-mode", "warn"]
        result = on_machine(f"{line} {shlex.join(extra)}", check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        yield line, extra, result.stdout
    finally:
        remove_services(hub.stack)
        bed("remove", MACHINE, check=False)


def node_id() -> str:
    client = docker.from_env()
    (node,) = [n for n in client.api.nodes() if n["Description"]["Hostname"] == MACHINE]
    return node["ID"]


def only_gpu0(node: dict) -> dict:
    resources = node["Description"]["Resources"]
    resources["GenericResources"] = [
        r for r in resources["GenericResources"] if r["DiscreteResourceSpec"]["Kind"] == GPU0
    ]
    return node


async def start_server(name: str, mb: int, hub_settings):
    spawner = make_spawner(name, hub_settings)
    spawner.cmd = ["sh", "-c", HOLD.format(mb=mb), "sh", "start-singleuser"]
    real_read = spawner._read_swarm

    async def this_gpu():
        nodes, tasks = await real_read()
        return [only_gpu0(n) for n in nodes if n["Description"]["Hostname"] == MACHINE], tasks

    spawner._read_swarm = this_gpu
    await spawner.start()
    assert (spawner.gpu_node, spawner.gpu_uuid) == (MACHINE, GPU0)
    return spawner


def container(service: str):
    client = engine_of(node_id())
    (found,) = client.containers.list(filters={"label": f"com.docker.swarm.service.name={service}"})
    return found


def holders(service: str) -> list[str]:
    """The container's processes still holding "GPU memory" (docker top: no exec needed)."""
    rows = container(service).top(ps_args="-eo pid,ppid,args")["Processes"]
    return [row for row in rows if row[-1] == "sleep 100000"]


def notices(service: str) -> list[dict]:
    try:
        chunks, _ = container(service).get_archive("/tmp/gpuhub-guard/notices.json")
    except docker.errors.NotFound:
        return []
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return json.load(tar.extractfile("notices.json"))["notices"]


@pytest.fixture(scope="module")
def servers(machine, hub_settings):
    """alice over budget and bob within it on GPU 0, and a process of the machine's own."""
    started = time.monotonic()
    alice = asyncio.run(start_server("ci-guard-alice", 10000, hub_settings))
    bob = asyncio.run(start_server("ci-guard-bob", 2000, hub_settings))
    on_machine(f"FAKE_NVML_GPU_MB=3000 FAKE_NVML_GPU={GPU0} setsid sleep 100001 >/dev/null 2>&1 &")
    yield alice, bob, started


def test_the_join_started_the_guard(machine):
    _, _, out = machine
    assert re.search(r"\n  guard +started \(warn mode, metrics on :9445; pid file ", out), out
    assert "FAKE NVML" in GUARD_LOG.read_text()


def test_warn_mode_warns_the_participant_over_budget_and_stops_nothing(servers):
    alice, bob, started = servers
    warned = wait_for(lambda: notices(alice.object_name), timeout=30)
    print(f"server start -> warning in her container: {time.monotonic() - started:.1f} s")
    assert [n["level"] for n in warned] == ["warning"]
    assert warned[0]["message"].startswith(
        "Your processes use 9.8 GB of GPU memory; your budget is 8.0 GB (1 slice of NVIDIA A10)"
    )
    assert notices(bob.object_name) == []
    time.sleep(12)  # two grace periods of the enforce test: warn mode never stops
    rows = container(alice.object_name).top(ps_args="-eo pid,ppid,args")["Processes"]
    assert len(holders(alice.object_name)) == 1, rows
    assert len(holders(bob.object_name)) == 1
    log = GUARD_LOG.read_text()
    assert "jy-ci-2dguard-2dalice (ci-guard-alice) uses 9.8 GB of their 8.0 GB budget" in log
    assert re.search(r"GPU process \d+ on GPU-9a3e\S+ \(2\.9 GB\): belongs to no participant", log)


def test_the_metrics_say_what_the_fake_nvml_reports(servers):
    alice, _, _ = servers
    text = metrics()
    mib = 1024 * 1024
    assert sample(text, "gpuhub_gpu_memory_total_bytes", gpu=GPU0) == 24576 * mib
    # the fake reports the processes' memory as the GPU's: 10000 + 2000 + 3000 MiB
    assert sample(text, "gpuhub_gpu_memory_used_bytes", gpu=GPU0) == 15000 * mib
    assert sample(text, "gpuhub_gpu_slices_used", gpu=GPU0) == 2
    assert sample(text, "gpuhub_gpu_slices_total", gpu=GPU0) == 3  # the engine's /info
    user = {"gpu": GPU0, "user": "ci-guard-alice", "machine": MACHINE}
    assert sample(text, "gpuhub_participant_gpu_memory_used_bytes", **user) == 10000 * mib
    assert sample(text, "gpuhub_participant_gpu_memory_budget_bytes", **user) == 8192 * mib
    assert sample(text, "gpuhub_participant_warnings_total", **user) == 1
    assert sample(text, "gpuhub_unattributed_gpu_memory_bytes", gpu=GPU0) == 3000 * mib
    assert sample(text, "gpuhub_participant_stops_total", **user) is None


def test_enforce_stops_only_the_process_over_budget_after_the_grace(machine, servers, monkeypatch):
    _, extra, _ = machine
    alice, bob, _ = servers
    # the organizer's settings on the manager, passed on by the printed line
    monkeypatch.setenv("GPUHUB_GUARD_MODE", "enforce")
    monkeypatch.setenv("GPUHUB_GUARD_GRACE_SECONDS", str(GRACE))
    line = join_line().removeprefix("sudo ")
    assert line.endswith(f" --guard-mode enforce --guard-grace-seconds {GRACE}"), line
    result = on_machine(f"{line} {shlex.join(extra[:-2])}", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\n  guard +restarted \(enforce mode", result.stdout), result.stdout
    t0 = time.monotonic()
    stopped = wait_for(lambda: not holders(alice.object_name), timeout=GRACE + 30)
    print(f"guard restarted -> alice's process stopped: {time.monotonic() - t0:.1f} s")
    assert stopped, "alice's process over budget was not stopped"
    assert time.monotonic() - t0 >= GRACE - 1
    levels = [n["level"] for n in wait_for(lambda: notices(alice.object_name)[-1:], timeout=10)]
    assert levels == ["error"]
    stop = notices(alice.object_name)[-1]
    assert "which held 9.8 GB of GPU memory" in stop["message"]
    assert "above 8.8 GB (110% of your 8.0 GB budget)" in stop["message"]
    # her server runs on; bob's process and the machine's own are untouched
    assert container(alice.object_name).status == "running"
    assert len(holders(bob.object_name)) == 1
    assert "sleep 100001" in on_machine("ps -eo args").stdout
    text = metrics()
    user = {"gpu": GPU0, "user": "ci-guard-alice"}
    assert sample(text, "gpuhub_participant_stops_total", **user) == 1
