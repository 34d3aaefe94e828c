"""The GPU guard on the bed: a fresh machine (own root filesystem, clean copy of the repository)
joins with the line `make join-command` prints, the fake NVML selected explicitly in its
environment (tests/fakes/nvml.py's shim_words: two A10s of 24 GiB, 3 slices each: a budget of
8 GiB). Real participants' servers run there; each starts a real process that the fake NVML
reports as holding GPU memory (FAKE_NVML_GPU_MB in its environment), as a kernel would on a
real GPU:

- alice's process holds 10000 MiB (over her 8192 and over the stop line, 110%);
- bob's holds 2000 MiB on the same GPU;
- a process of the machine's own (no container) holds 3000 MiB.

First in warn mode: alice is warned (the notice lands in her container, metrics say so), and
nothing is stopped. Then the same line with --guard-mode enforce: the guard restarts, warns
again, and after the grace stops alice's process only; her server runs on, bob's process and
the machine's own are untouched. Last, in Chromium, what a participant meets: carol logs in
through the hub, her notebook starts a process that goes over her budget, and her JupyterLab
page shows the guard's warning and then the stop, with the numbers.
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

from gpu_swarm_spawner import contract
from tests.fakes.nvml import shim_words

from .hub import ARTIFACTS, BED_RUN, REPO, engine_of, open_dashboard
from .hub import BED as BED_ENV
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
        line = f"{shim_words(FIXTURE)} {join_line().removeprefix('sudo ')}"
        extra = ["--image-tar", tar, "--guard-mode", "warn"]
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
    assert (spawner.holding.node, spawner.holding.gpu) == (MACHINE, GPU0)
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
    # the join's environment took the fake NVML on to the guard, whose log says so
    fixture = f"/root/gpu-jupyterhub/{FIXTURE}"
    assert f"FAKE NVML: GPUs from the fixture {fixture}, not a driver" in GUARD_LOG.read_text()


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
    result = on_machine(f"{shim_words(FIXTURE)} {line} {shlex.join(extra[:-2])}", check=False)
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


#: what carol runs in her notebook: a process that holds 10000 MiB of her 8192 (the fake NVML
#: reads FAKE_NVML_GPU_MB from its environment, on the GPU NVIDIA_VISIBLE_DEVICES names)
OVER_BUDGET_CELL = (
    "import os, subprocess; holder = subprocess.Popen(['sleep', '100002'], "
    "env=dict(os.environ, FAKE_NVML_GPU_MB='10000')); print('holding', holder.pid)"
)


def pause_others(verb: str, names: list[str]) -> None:
    for name in names:
        subprocess.run(["make", "-s", verb, f"NODE={name}"], cwd=REPO, check=True)


@pytest.mark.browser
def test_the_participant_sees_the_warning_and_the_stop_in_jupyterlab(
    hub, hub_settings, servers, page, browser
):
    """After the enforce test: the guard runs in enforce mode with a 6 s grace."""
    user = "ci-guard-carol"
    # the hub's shared storage, which every server mounts, is mounted on fresh3 as on every bed
    # machine (tests/bed/bed.sh fresh), which its join checked
    client = docker.from_env()
    # the other machines take no new servers meanwhile: carol's lands on fresh3 (GPU 1)
    others = [
        n["Description"]["Hostname"]
        for n in client.api.nodes()
        if n["Description"]["Hostname"] != MACHINE
        and n["Spec"]["Availability"] == "active"
        and n["Status"]["State"] == "ready"
    ]
    pause_others("pause-node", others)
    try:
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", user)
        page.fill("#password_input", hub.password)
        page.click("#login_submit")
        page.wait_for_selector(".jp-LabShell", timeout=120_000)
        page.click('.jp-LauncherCard[data-category="Notebook"]', timeout=60_000)
        editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor.wait_for(timeout=60_000)
        # a cell run before the kernel is ready is dropped: wait for "Python 3 | Idle"
        page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=60_000)
        editor.click()
        page.keyboard.insert_text(OVER_BUDGET_CELL)
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-OutputArea-output", has_text="holding").wait_for(timeout=60_000)
        t0 = time.monotonic()

        # one guard round (5 s) and one poll of the page (5 s) later at most, plus slack
        warning = page.locator(".Toastify__toast", has_text="GPU memory over your budget")
        warning.first.wait_for(timeout=30_000)
        print(f"notebook cell -> warning on her page: {time.monotonic() - t0:.1f} s")
        assert "Your processes use 9.8 GB of GPU memory; your budget is 8.0 GB" in (
            warning.first.inner_text()
        )
        # her own figures in JupyterLab's status bar, from the guard, marked over budget
        usage = page.locator("#gpuhub-gpu-usage")
        page.wait_for_function(
            "() => (document.getElementById('gpuhub-gpu-usage') || {}).innerText"
            "?.includes('over budget')",
            timeout=30_000,
        )
        assert usage.inner_text().startswith("GPU 9.8 / 8.0 GB"), usage.inner_text()
        page.screenshot(path=str(ARTIFACTS / "guard-status-bar.png"))
        stop = page.locator(".Toastify__toast", has_text="A process of yours was stopped")
        stop.first.wait_for(timeout=(GRACE + 30) * 1000)
        print(f"notebook cell -> stop on her page: {time.monotonic() - t0:.1f} s")
        ARTIFACTS.mkdir(exist_ok=True)
        page.wait_for_timeout(1000)  # the toast slides in
        page.screenshot(path=str(ARTIFACTS / "guard-notices.png"))
        stop.first.get_by_role("button", name="Read all").click()
        details = page.locator(".gpuhub-notices-details")
        details.wait_for(timeout=5000)
        text = details.inner_text()
        assert "which held 9.8 GB of GPU memory" in text, text
        assert "above 8.8 GB (110% of your 8.0 GB budget) for more than 6 s" in text, text
        details.get_by_role("button", name="OK").click()

        # the stopped process was hers, started from the notebook; her server and lab run on
        server = hub.server(user)
        assert server and server["ready"], server
        (hers,) = engine_of(node_id()).containers.list(
            filters={"label": f"{contract.USER_LABEL}={user}"}
        )
        assert hers.status == "running"
        rows = hers.top(ps_args="-eo pid,args")["Processes"]
        assert not [row for row in rows if row[-1] == "sleep 100002"], rows
        assert page.locator(".jp-LabShell").is_visible()
        # within her budget again: the status bar says so
        page.wait_for_function(
            "() => !(document.getElementById('gpuhub-gpu-usage') || {}).innerText"
            "?.includes('over budget')",
            timeout=30_000,
        )
        assert "/ 8.0 GB" in usage.inner_text(), usage.inner_text()

        # the organizer's dashboard: her warning and stop, her memory on fresh3's GPU, and the
        # paused machines marked as not taking servers
        dashboard = open_dashboard(browser, hub)
        guard_row = dashboard.locator("#guard-table tbody tr", has_text=user)
        guard_row.wait_for(timeout=30_000)
        _, _, warnings, stops = guard_row.evaluate("r => [...r.cells].map(c => c.innerText)")
        assert int(warnings) >= 1 and int(stops) >= 1, (warnings, stops)
        # (the page redraws every 2 s: a guard that missed one read under load is read again)
        hers = f'[data-machine="{MACHINE}"] [data-user="{user}"]'
        dashboard.wait_for_function(
            "sel => (document.querySelector(sel) || {}).innerText?.includes('/ 8.0 GB')",
            arg=hers,
            timeout=30_000,
        )
        for other in others:
            card = dashboard.locator(f'[data-machine="{other}"]')
            assert "not taking servers (ready, pause)" in card.inner_text()
        # Prometheus scraped this machine's guard (found through Swarm's nodes): its GPU
        # memory is plotted, with the 10000 MiB her process held among the points
        # (plots are redrawn every 15 s: a machine that joined minutes ago gains points)
        dashboard.wait_for_function(
            """machine => {
                const line = document.querySelector(
                    `[data-plot="memory"] polyline[data-series="${machine}"]`);
                return line && Number(line.dataset.points) >= 2
                    && Number(line.dataset.max) >= 9.7;
            }""",
            arg=MACHINE,
            timeout=120_000,
        )
        dashboard.screenshot(path=str(ARTIFACTS / "dashboard-guard.png"), full_page=True)
        dashboard.context.close()
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "guard-notices-last.png"))  # for a red run
        pause_others("resume-node", others)
        hub.stop(user)
