"""Benchmarks on the multi-node test bed, run by `make bench`; figures printed, never asserted.

1-3. spawns: GPUSwarmSpawner vs stock dockerspawner.SwarmSpawner vs the bare Swarm operation
     (one spawn; 50 at once; refusals). Each hub is its own stack (own port and network).
4.   a fresh GPU machine joining with worker_setup/setup.sh (also `make bench-join`).
5.   tutorials: git push until readable in a running server (webhook, polling, the original
     workshop's pull in place).
6.   the waiting line: a slice freed until the next in line's server is ready (tests/bench/line.py).
7.   refusals (--only refusals): the crowd on the GPU hub alone, repeated; when those who do
     not fit are told, and where (the gate before JupyterHub's spawn, or the spawner).
8.   a hub whose servers' network is a /28: the participants beyond its addresses, and what
     they are told (--only network).

    python -m tests.bench.bench [--repeats 10] [--crowd 50]
                                [--only single|crowd|join|tutorials|line|refusals|network]
                                [--cpu-limit CORES]
"""

from __future__ import annotations

import argparse
import collections
import copy
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import docker

from gpu_swarm_spawner import GPUSwarmSpawner, placement
from gpu_swarm_spawner.contract import USER_LABEL
from gpu_swarm_spawner.events import Event, read_events
from gpu_swarm_spawner.tasks import is_live
from tests.bench.client import Spawns
from tests.bench.line import bench_line, report, until_ended
from tests.integration.hub import BED, BED_HOST, REPO, Hub, container_of, hub_url, state_file
from tests.integration.spawners import inventory
from tests.sync.gitrepos import ServedRemote, signed_push

VARIANTS = {
    # name: settings of its stack
    "gpu": {"STACK": "bench-gpu", "HTTP_PORT": "18100", "NETWORK": "bench-gpu"},
    "stock": {
        "STACK": "bench-stock",
        "HTTP_PORT": "18200",
        "NETWORK": "bench-stock",
        "SPAWNER": "stock-swarm",
    },
    "gpu-1thread": {
        "STACK": "bench-gpu1",
        "HTTP_PORT": "18300",
        "NETWORK": "bench-gpu1",
        "DOCKER_API_THREADS": "1",
    },
    # the tutorial-sync round: a hub whose tutorials come from git daemon on the bed's bridge
    "tutorials": {
        "STACK": "bench-tut",
        "HTTP_PORT": "18400",
        "NETWORK": "bench-tut",
        "TUTORIAL_REPOS": f"gpu101=git://{BED_HOST}:9418/gpu101.git",
        "TUTORIAL_POLL": "30",
    },
}
COMMON = {"START_TIMEOUT": "60", "POLL_INTERVAL": "30", "NAMED_SLOTS": "NVIDIA-GPU"}
COMMON["CONFIG"] = "none"  # an organizer's ./config.env is not the bench's


# the bed's engine settings (tests/bed/bed.sh env), which every variant keeps
BED_ENGINE = {"GPUHUB_DAEMON_JSON", "GPUHUB_DOCKERD_CMD", "GPUHUB_DOCKERD_PIDFILE"}
BED_ENGINE |= {"GPUHUB_DOCKERD_LOG", "GPUHUB_ADVERTISE_ADDR", "GPUHUB_ENGINE_ADDR"}
BED_ENGINE |= {"GPUHUB_IMAGE_TAR"}


def env_of(variant: str) -> dict[str, str]:
    settings = {**COMMON, **VARIANTS[variant]}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_") or k in BED_ENGINE}
    return {**clean, **{f"GPUHUB_{k}": v for k, v in settings.items()}}


def deploy_cli(variant: str, *args: str) -> str:
    """``python -m deploy ARGS`` with the variant's settings; its output."""
    result = subprocess.run(
        [sys.executable, "-m", "deploy", *args],
        cwd=REPO,
        env=env_of(variant),
        capture_output=True,
        text=True,
    )
    if result.returncode:
        raise RuntimeError(
            f"{variant}: python -m deploy {' '.join(args)}:\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def setting(variant: str, key: str) -> str:
    return deploy_cli(variant, "settings", key).strip()


def deploy(variant: str) -> Hub:
    deploy_cli(variant, "stack")
    state = {"GPUHUB_STATE_DIR": setting(variant, "GPUHUB_STATE_DIR")}
    settings = VARIANTS[variant]
    return Hub(
        hub_url(settings["HTTP_PORT"]),
        state_file(state, "ops_token"),
        state_file(state, "demo_password"),
        settings["STACK"],
    )


def hub_container_of(hub: Hub):
    """The hub's running container (on the manager)."""
    return docker.from_env().containers.list(filters={"name": f"{hub.stack}_hub."})[0]


def remove(variant: str) -> None:
    deploy_cli(variant, "down", "--purge")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"p50 {statistics.median(values):6.2f} s  p95 {pct(values, 0.95):6.2f} s  (n={len(values)})"
    )


def wait_quiet(timeout: float = 180) -> None:
    """Until no task holding any generic resource is live: the servers of the previous round
    (GPU kinds, or the stock hub's named slots, which the GPU inventory does not count) have
    stopped, so one round's clean-up does not slow the next round down."""
    client = docker.from_env()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [
            t
            for t in client.api.tasks()
            if is_live(t)
            and ((t["Spec"].get("Resources") or {}).get("Reservations") or {}).get(
                "GenericResources"
            )
        ]
        if not busy:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{len(busy)} tasks still hold GPU slices after {timeout} s")


# ---- 1. one spawn, warm image ----------------------------------------------------------------


#: The hub's data folder in its container (jupyterhub_config.DATA; the stack keeps its default)
HUB_DATA = "/srv/jupyterhub/data"
#: Where a spawn's time goes, in order (``spawn_split``)
SPLIT = (
    "hub before the spawner",
    "spawner until its service",
    "Swarm until the container runs",
    "server's start until it answers",
    "hub until it says ready",
)


def spawn_split(post: float, ready: float, started: Event, running: float) -> dict | None:
    """Where one spawn's time went (SPLIT, seconds), from the bench's own clock (``post``: the
    POST sent, ``ready``: the REST API said ready), the spawner's record of its start
    (``started``, events.py: when it began, its service created, its server answering) and
    Swarm's (``running``: when the task's container was running). None when the record lacks
    a mark (a hub without them: stock SwarmSpawner). All on this machine's clock, as the bed's
    machines are."""
    phases = started.phases or {}
    if started.seconds is None or not {"created", "answered"} <= phases.keys():
        return None
    begun = started.time - started.seconds
    marks = [post, begun, begun + phases["created"], running, begun + phases["answered"], ready]
    return dict(zip(SPLIT, (b - a for a, b in zip(marks, marks[1:]))))


def swarm_time(stamp: str) -> float:
    """Swarm's RFC 3339 time (nanoseconds, Z) as epoch seconds."""
    day, _, rest = stamp.rstrip("Z").partition("T")
    clock, _, fraction = rest.partition(".")
    whole = datetime.datetime.fromisoformat(f"{day}T{clock}+00:00").timestamp()
    return whole + float(f"0.{fraction or 0}")


def running_since(user: str) -> float | None:
    """When the running task of ``user``'s server began running (Swarm's record), if it does."""
    client = docker.from_env()
    for service in client.api.services(filters={"label": f"{USER_LABEL}={user}"}):
        for t in client.api.tasks(filters={"service": service["ID"]}):
            if t["Status"]["State"] == "running":
                return swarm_time(t["Status"]["Timestamp"])
    return None


def started_record(hub: Hub, user: str) -> Event | None:
    """The hub's last record of a start of ``user``'s server (its events.jsonl)."""
    out = hub_container_of(hub).exec_run(
        ["tail", "-n", "200", f"{HUB_DATA}/dashboard/events.jsonl"]
    )
    found = [e for e in read_events(out.output.splitlines()) if e.user == user]
    return next((e for e in reversed(found) if e.kind == "started"), None)


def until_ready(hub: Hub, user: str, t0: float, timeout: float = 120) -> None:
    """Until the hub says ``user``'s server is ready, as the spawn-pending page hears it: the
    hub's progress stream (one request, the hub pushes the "ready" event; polling the REST API
    every 0.05 s cost the hub's thread and the starting server's CPU a share the bare spawn
    did not pay)."""
    with hub.api("GET", f"/users/{user}/server/progress", stream=True) as stream:
        for raw in stream.iter_lines():
            if raw.startswith(b"data:") and json.loads(raw[5:]).get("ready"):
                return
            if time.monotonic() - t0 > timeout:
                break
    while not (hub.server(user) or {}).get("ready"):  # the stream ended first (a failure?)
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{user} not ready after {timeout:.0f} s")
        time.sleep(0.05)


def spawn_once(hub: Hub, user: str, split: list | None = None) -> float:
    """Seconds from POST to ready for one spawn of ``user``'s server; ``split``: where its time
    went is appended (SPLIT), when the hub records it."""
    hub.api("POST", f"/users/{user}")
    t0, post = time.monotonic(), time.time()
    r = hub.api("POST", f"/users/{user}/server")
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn of {user} failed: {r.status_code} {r.text}")
    until_ready(hub, user, t0)
    elapsed, ready = time.monotonic() - t0, time.time()
    if split is not None:
        running, started = running_since(user), started_record(hub, user)
        if running is not None and started is not None:
            split.append(spawn_split(post, ready, started, running))
    hub.stop(user)
    return elapsed


PROBE = """
import sys, time, urllib.request, urllib.error
url, deadline = sys.argv[1], time.time() + 120
while time.time() < deadline:
    try:
        urllib.request.urlopen(url, timeout=1)
        break
    except urllib.error.HTTPError:
        break  # the server answers (even 403 is an answer)
    except Exception:
        time.sleep(0.05)
print(time.time())
"""


def server_template(hub: Hub) -> tuple[dict, str]:
    """The task template of a server ``hub`` spawned (image, command, env, mounts, limits,
    reservations, restart policy, network) and the server's URL path: the bare operation starts
    the same server program under the same limits."""
    user = "bench-template"
    hub.api("POST", f"/users/{user}")
    hub.api("POST", f"/users/{user}/server")
    hub.wait_ready(user)
    (service,) = (
        s
        for s in docker.from_env().api.services()
        if f"JUPYTERHUB_USER={user}" in s["Spec"]["TaskTemplate"]["ContainerSpec"].get("Env", [])
    )
    hub.stop(user)
    template = service["Spec"]["TaskTemplate"]
    env = dict(line.split("=", 1) for line in template["ContainerSpec"]["Env"])
    return template, env["JUPYTERHUB_SERVICE_PREFIX"] + "api"


def slices_of(template: dict) -> int:
    """The GPU slices a task template reserves (0: none)."""
    reserved = template.get("Resources", {}).get("Reservations", {})
    return sum(
        r["DiscreteResourceSpec"]["Value"]
        for r in reserved.get("GenericResources") or []
        if "DiscreteResourceSpec" in r
    )


def on_gpu(template: dict, gpu_uuid: str) -> dict:
    """``template`` with its GPU slices (as many, at least 1) reserved on ``gpu_uuid``."""
    t = copy.deepcopy(template)
    t.pop("ForceUpdate", None)
    reserved = t.setdefault("Resources", {}).setdefault("Reservations", {})
    slices = slices_of(template) or 1
    reserved["GenericResources"] = [{"DiscreteResourceSpec": {"Kind": gpu_uuid, "Value": slices}}]
    return t


def with_new_home(template: dict, name: str) -> dict:
    """``template`` with each named volume it mounts replaced by a new one for ``name``, as a
    new participant's server gets (Docker makes it and copies the image's files into it)."""
    t = copy.deepcopy(template)
    for mount in t["ContainerSpec"].get("Mounts") or []:
        if mount.get("Type") == "volume" and mount.get("Source"):
            mount["Source"] = f"{name}-{RUN}-{mount['Source']}"
    return t


#: this run's mark in the names it gives (its participants, the bare servers' volumes): each
#: spawn is a new participant's, whose home volume is made
RUN = time.strftime("%H%M%S")


def describe_limits(template: dict) -> str:
    """What a server runs under: its CPU, memory and process limits, the CPU and memory it
    reserves, its GPU slices, its restart policy."""
    resources = template.get("Resources", {})
    limits, reserved = resources.get("Limits", {}), resources.get("Reservations", {})

    def cpu(r):
        return f"{r['NanoCPUs'] / 1e9:g} cores" if r.get("NanoCPUs") else "-"

    def memory(r):
        return f"{r['MemoryBytes'] / 2**30:.2g} GiB" if r.get("MemoryBytes") else "-"

    restart = template.get("RestartPolicy", {}).get("Condition", "any (Swarm's default)")
    return (
        f"limits cpu {cpu(limits)}, memory {memory(limits)}, pids {limits.get('Pids') or '-'}; "
        f"reserves cpu {cpu(reserved)}, memory {memory(reserved)}, "
        f"{slices_of(template)} GPU slice(s); restart {restart}"
    )


def bare_server(hub_container, network: str, template: tuple[dict, str], name: str):
    """docker service create of the hub's task template for a server (same program, limits,
    network, GPU slices, restart policy; dnsrr) until the server answers, probed from the hub's
    container: (the service's ID, seconds from the create to the answer)."""
    client = docker.from_env()
    spec, path = template
    # the GPU the hub's spread would give a new participant of this name: the bare servers
    # land on the bed's machines as the hub's do (the manager's own engine is the quicker)
    gpu = placement.choose(list(inventory().values()), slices_of(spec) or 1, seed=name)
    result = {}

    def probe():
        out = hub_container.exec_run(["python3", "-c", PROBE, f"http://{name}:8888{path}"])
        result["t"] = float(out.output.decode().strip().splitlines()[-1])

    prober = threading.Thread(target=probe)
    t0 = time.time()
    prober.start()
    service = client.api.create_service(
        with_new_home(on_gpu(spec, gpu.uuid), name),
        name=name,
        endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
        labels={"gpu-jupyterhub.stack": "bench-bare"},
    )
    prober.join()
    BARE_SPLIT.append(bare_split(t0, service["ID"], result["t"]))
    return service["ID"], result["t"] - t0


#: each bare server's (Swarm until its container runs, its start until it answers), seconds
BARE_SPLIT: list[tuple[float, float] | None] = []


def bare_split(created: float, service_id: str, answered: float) -> tuple[float, float] | None:
    """Where a bare server's time went, from Swarm's record of when its task began running."""
    for t in docker.from_env().api.tasks(filters={"service": service_id}):
        if t["Status"]["State"] == "running":
            running = swarm_time(t["Status"]["Timestamp"])
            return running - created, answered - running
    return None


def bare_once(hub_container, network: str, template: tuple[dict, str], n: int) -> float:
    """The bare spawn: seconds until a bare server answers (then it is removed)."""
    service_id, seconds = bare_server(hub_container, network, template, f"bench-bare-{n}")
    docker.from_env().api.remove_service(service_id)
    return seconds


def bare_removal_once(hub_container, network: str, template: tuple[dict, str], n: int) -> float:
    """SwarmSpawner's stop, bare: a running server's service removed; seconds until its task
    no longer holds its slice."""
    client = docker.from_env()
    service_id, _ = bare_server(hub_container, network, template, f"bench-bare-stop-{n}")
    (task,) = client.api.tasks(filters={"service": service_id, "desired-state": "running"})
    t0 = time.monotonic()
    client.api.remove_service(service_id)
    return until_ended(task["ID"]) - t0


def bench_single(hubs: dict[str, Hub], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"bare": [], "stock": [], "gpu": []}
    split: list[dict | None] = []  # where each counted GPUSwarmSpawner spawn's time went
    container = hub_container_of(hubs["gpu"])
    template = server_template(hubs["gpu"])
    stock_template, _ = server_template(hubs["stock"])
    print(f"  servers of GPUSwarmSpawner and bare: {describe_limits(template[0])}")
    print(f"  servers of stock SwarmSpawner:       {describe_limits(stock_template)}")
    # in rounds, each variant once per round in a turning order: what the bed's machines go
    # through over the run (volumes and exited containers piling up, other work) reaches every
    # variant alike; the first round is a warm-up, not counted
    names = ["bare", "stock", "gpu"]
    for i in range(repeats + 1):
        for name in names[i % 3 :] + names[: i % 3]:
            wait_quiet()
            if name == "bare":
                t = bare_once(container, VARIANTS["gpu"]["NETWORK"], template, i)
            else:
                user = f"bench-one-{RUN}-{name}-{i}"  # a new participant's, new home volume
                t = spawn_once(hubs[name], user, split if i and name == "gpu" else None)
            if i:
                times[name].append(t)
    for name in names:
        print(f"  single spawn  {name:12s} {fmt(times[name])}", flush=True)
    print_split(split)
    bare = [b for b in BARE_SPLIT[-repeats:] if b]
    if bare:
        swarm, start = (statistics.median(b[i] for b in bare) for i in (0, 1))
        print(
            f"  the bare servers (medians of {len(bare)}): {SPLIT[2]} {swarm:.2f} s, "
            f"{SPLIT[3]} {start:.2f} s"
        )
    return times


def print_split(split: list[dict | None]) -> None:
    """Where the GPU hub's spawns' time went: each part's median (and its share of the total
    of the medians), in order."""
    known = [s for s in split if s]
    if not known:
        print(f"  where a spawn's time goes: not recorded ({len(split)} spawns)")
        return
    medians = {part: statistics.median(s[part] for s in known) for part in SPLIT}
    total = sum(medians.values())
    print(f"  where a GPUSwarmSpawner spawn's time goes (medians of {len(known)} spawns):")
    for part, seconds in medians.items():
        print(f"    {part:34s} {seconds:6.2f} s  {seconds / total:4.0%}")


PAGE = 200  # JupyterHub's largest page of users (api_page_max_limit)


def servers(hub: Hub) -> dict[str, dict]:
    """Every user's default server with one ``state=active`` listing, page by page."""
    found: dict[str, dict] = {}
    offset = 0
    while True:
        r = hub.api("GET", "/users", params={"state": "active", "limit": PAGE, "offset": offset})
        r.raise_for_status()
        page = r.json()
        items = page["items"] if isinstance(page, dict) else page
        for user in items:
            server = (user.get("servers") or {}).get("")
            if server:
                found[user["name"]] = server
        if len(items) < PAGE:
            return found
        offset += PAGE


# ---- 2 and 3. a crowd at once; refusals ----------------------------------------------------------


def crowd(hub: Hub, size: int, timeout: float) -> dict:
    """``size`` spawn requests at once; when each became ready, was refused, or neither (lists
    of seconds), and the most common reasons for refusals (``reasons``).

    The requests go out together (tests/bench/client.py); one watcher reads every user's state
    with a single GET /users every 0.25 s (50 pollers would load the hub more than the spawns).
    """
    users = [f"bench-crowd-{i:02d}" for i in range(size)]
    hub.api("POST", "/users", json={"usernames": users})
    outcomes: dict[str, tuple[str, float]] = {}
    accepted: set[str] = set()
    reasons: collections.Counter = collections.Counter()
    lock = threading.Lock()
    spawns = Spawns(hub.url, dict(hub.session.headers), timeout=timeout, retry_429=False)
    t0 = time.monotonic()

    def answered(user: str, answer: Future) -> None:
        if answer.cancelled() or answer.exception():
            return  # no answer within the timeout: counted as such below
        status, body, seconds = answer.result()
        with lock:
            if status in (201, 202):
                accepted.add(user)
            else:  # the spawn failed before the hub answered (within its slow_spawn_timeout)
                outcomes[user] = ("refused", seconds)
                reasons[f"{status} {body[:60]}"] += 1

    try:
        for user in users:
            spawns.send(user, t0).add_done_callback(lambda a, user=user: answered(user, a))
        while len(outcomes) < size and time.monotonic() - t0 < timeout:
            time.sleep(0.25)
            listed = servers(hub)  # every page: JupyterHub answers at most 200 users at once
            now = time.monotonic() - t0
            with lock:
                for user in accepted - outcomes.keys():
                    server = listed.get(user)
                    if server is None:  # the spawn failed after the request was accepted
                        outcomes[user] = ("refused", now)
                        reasons["failed after the hub accepted it"] += 1
                    elif server["ready"]:
                        outcomes[user] = ("ready", now)
    finally:
        spawns.close()
    for user in users:
        hub.api("DELETE", f"/users/{user}/server")
    for user in users:
        hub.wait_stopped(user, timeout=180)
    result: dict = {"ready": [], "refused": [], "timeout": []}
    for user in users:
        outcome, t = outcomes.get(user, ("timeout", timeout))
        result[outcome].append(t)
    result["reasons"] = reasons.most_common(3)
    return result


# ---- 4. adding a GPU machine ------------------------------------------------------------------


def bench_join(repeats: int) -> list[float]:
    """The line `make join-command` prints (plus --image-tar, as it advises, and simulated
    GPUs), run on a fresh bed machine (its own root filesystem, Docker installed, engine not
    started, a clean copy of the repository), until the spawner's inventory shows its GPU
    slices; a new machine for each run."""
    bed = f"{REPO}/tests/bed/bed.sh"
    machine = "fresh9"

    def run(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["bash", bed, *args], capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"bed.sh {args[0]} failed:\n{result.stdout}{result.stderr}")
        return result

    make = subprocess.run(["make", "-s", "join-command"], cwd=REPO, capture_output=True, text=True)
    (line,) = [x for x in make.stdout.splitlines() if x.startswith("sudo ./worker_setup/")]
    times = []
    try:
        for i in range(repeats):
            run("fresh", machine)
            tar = run("image-tar", machine).stdout.split()[-1]  # the copy is not timed
            t0 = time.monotonic()
            result = run("on", machine, f"{line} --image-tar {tar} --simulate-gpus 2")
            while not [g for g in inventory().values() if g.node_name == machine]:
                if time.monotonic() - t0 > 300:
                    raise TimeoutError(f"{machine}'s slices not visible after 300 s")
                time.sleep(0.2)
            times.append(time.monotonic() - t0)
            steps = [line for line in result.stdout.splitlines() if line.startswith("[")]
            print(f"  run {i + 1}: {times[-1]:5.1f} s   " + "; ".join(steps), flush=True)
    finally:
        subprocess.run(["bash", bed, "remove", machine], capture_output=True)
    return times


# ---- 5. tutorials: git push -> readable in a running server -------------------------------------


def original_poller(remote_url: str, target: Path, interval: float, stop: threading.Event):
    """The original workshop's publishing: every ``interval`` s, pull into the shared directory
    in place (readers can see a half-updated tree)."""
    subprocess.run(["git", "clone", "-q", remote_url, str(target)], check=True)
    while not stop.wait(interval):
        subprocess.run(["git", "-C", str(target), "pull", "-q", "--ff-only"], capture_output=True)


def bench_tutorials(samples: int) -> dict[str, list[float]]:
    remote = ServedRemote(Path(BED["BED_DATA"], "bench-remotes"), "gpu101", address=BED_HOST)
    author = remote.author
    author.write("00-start.ipynb", "{}")
    author.commit_and_push("first")
    times: dict[str, list[float]] = {"webhook": [], "polling": [], "original": []}
    stop = threading.Event()
    try:
        hub = deploy("tutorials")
        share = Path(setting("tutorials", "GPUHUB_TUTORIALS_DIR"))
        state = {"GPUHUB_STATE_DIR": setting("tutorials", "GPUHUB_STATE_DIR")}
        secret = state_file(state, "webhook_secret")
        poller = threading.Thread(
            target=original_poller,
            args=(f"file://{remote.base}/gpu101.git", share / "gpu101-original", 30, stop),
        )
        poller.start()
        hub.api("POST", "/users/bench-tutorials")
        hub.api("POST", "/users/bench-tutorials/server")
        hub.wait_ready("bench-tutorials")
        container = container_of("jy-bench-2dtutorials")

        def readable_after(path: str, content: str, t0: float, timeout: float = 60) -> float:
            while time.monotonic() - t0 < timeout:
                got = container.exec_run(["cat", path])
                if got.exit_code == 0 and got.output.decode() == content:
                    return time.monotonic() - t0
                time.sleep(0.1)
            raise TimeoutError(f"{path} not readable after {timeout} s")

        for i in range(samples):
            author.write(f"w{i}.ipynb", f"webhook {i}")
            author.commit_and_push(f"webhook {i}")
            body, headers = signed_push(
                VARIANTS["tutorials"]["TUTORIAL_REPOS"].split("=", 1)[1],
                secret,
                delivery=f"bench-{i}-{time.time()}",
            )
            t0 = time.monotonic()
            r = hub.session.post(
                f"{hub.url}/services/tutorial-sync/webhook", data=body, headers=headers
            )
            r.raise_for_status()
            times["webhook"].append(
                readable_after(f"/srv/tutorials/gpu101/w{i}.ipynb", f"webhook {i}", t0)
            )

            author.write(f"p{i}.ipynb", f"polled {i}")
            author.commit_and_push(f"polled {i}")
            t0 = time.monotonic()
            times["polling"].append(
                readable_after(f"/srv/tutorials/gpu101/p{i}.ipynb", f"polled {i}", t0)
            )
            times["original"].append(
                readable_after(f"/srv/tutorials/gpu101-original/p{i}.ipynb", f"polled {i}", t0)
            )
            print(
                f"  push {i + 1}: webhook {times['webhook'][-1]:5.2f} s   polling "
                f"{times['polling'][-1]:5.2f} s   original (pull in place) "
                f"{times['original'][-1]:5.2f} s",
                flush=True,
            )
    finally:
        stop.set()
        remove("tutorials")
        remote.close()
    return times


def spawns(args, slices: int) -> None:
    print("deploying the hubs (GPUSwarmSpawner, stock SwarmSpawner, GPUSwarmSpawner 1 thread)")
    hubs = {}
    single: dict[str, list[float]] = {}
    crowds: dict[str, dict[str, list[float]]] = {}
    try:
        for variant in ("gpu", "stock", "gpu-1thread"):
            hubs[variant] = deploy(variant)

        if args.only != "crowd":
            print(f"\n1. one spawn, warm image, POST -> ready ({args.repeats} runs each)")
            single = bench_single(hubs, args.repeats)

        if args.only != "single":
            print(f"\n2. {args.crowd} participants at once ({slices} slices)")
            for variant in ("stock", "gpu", "gpu-1thread"):
                wait_quiet()
                crowds[variant] = c = crowd(hubs[variant], args.crowd, timeout=150)
                print(
                    f"  {variant:12s} ready {len(c['ready']):2d}  refused {len(c['refused']):2d}  "
                    f"stuck {len(c['timeout']):2d}   ready: {fmt(c['ready'])}   "
                    f"refused: {fmt(c['refused'])}",
                    flush=True,
                )
    finally:
        for variant in hubs:
            remove(variant)
    summary(single, crowds, args.crowd)


def refusal_rounds(size: int, rounds: int) -> None:
    """The crowd on the GPU hub alone, ``rounds`` times: when those who do not fit are told,
    as the client sees it, and the spawner's own part (its "refused after" log lines)."""
    print(f"\n7. refusals: {size} at once on the GPU hub alone, {rounds} rounds")
    hub = deploy("gpu")
    service = f"{hub.stack}_hub"
    try:
        for n in range(1, rounds + 1):
            wait_quiet()
            since = int(time.time())
            result = crowd(hub, size, timeout=150)
            (hub_service,) = docker.from_env().services.list(filters={"name": service})
            log = b"".join(hub_service.logs(stdout=True, stderr=True, since=since)).decode()
            own = [float(x) for x in re.findall(r"refused after ([0-9.]+) s in the spawner", log)]
            gated = [
                float(x) for x in re.findall(r"refused after ([0-9.]+) s before JupyterHub's", log)
            ]
            # the hub's own time for each 503 (from its request log): what it spent answering,
            # against what the client waited (connections queued, the proxy)
            answered = [
                float(x) for x in re.findall(r" 503 POST /hub/api/users/\S+ .*?([0-9.]+)ms", log)
            ]
            refused = result["refused"]
            print(
                f"  round {n}: {len(result['ready'])} ready, {len(refused)} refused in "
                f"p50 {statistics.median(refused) if refused else 0:.2f} s, max "
                f"{max(refused, default=0):.2f} s; {len(gated)} by the gate before JupyterHub's "
                f"spawn (its part: max {max(gated, default=0):.2f} s), {len(own)} in the spawner "
                f"(max {max(own, default=0):.2f} s); the hub's request log: max "
                f"{max(answered, default=0) / 1000:.2f} s; answers: {result['reasons']}",
                flush=True,
            )
    finally:
        remove("gpu")


def joins() -> None:
    print("\n4. a fresh GPU machine runs the join line: until its slices are usable")
    times = bench_join(3)
    print(
        f"  summary: machine joined, slices usable in p50 {statistics.median(times):.1f} s "
        f"(max {max(times):.1f} s)   goal < 60 s; the original workshop's setup.sh: ~5 min"
    )


def tutorials() -> None:
    print("\n5. git push -> readable in a running server (poll interval 30 s)")
    t = bench_tutorials(3)
    print(
        f"  summary: webhook p50 {statistics.median(t['webhook']):.2f} s (goal < 5 s); "
        f"polling p50 {statistics.median(t['polling']):.2f} s, max {max(t['polling']):.2f} s "
        f"(goal <= 32 s); the original workshop's pull-in-place every 30 s: p50 "
        f"{statistics.median(t['original']):.2f} s, and readers can see half-updated trees"
    )


def waiting_line(repeats: int) -> None:
    print("\n6. the waiting line: a slice freed -> the next in line's server ready")
    try:
        hub = deploy("gpu")
        times = bench_line(hub, repeats)
        # the stop's own part, against SwarmSpawner's (the service removed while it runs)
        container = hub_container_of(hub)
        template = server_template(hub)
        times["bare stop"] = []
        for i in range(repeats + 1):  # one warm-up
            wait_quiet()
            t = bare_removal_once(container, VARIANTS["gpu"]["NETWORK"], template, i)
            print(f"  service removed while running -> slice free {t:.2f} s", flush=True)
            if i:
                times["bare stop"].append(t)
    finally:
        remove("gpu")
    report(times)


VARIANTS["small-network"] = {
    "STACK": "bench-small-net",
    "HTTP_PORT": "18650",
    "NETWORK": "bench-small-net",
    "NETWORK_SUBNET": "10.214.0.0/28",  # 16 addresses: a few servers beside the hub's own
    "WAITING_LINE": "off",
}


def small_network(size: int = 14) -> None:
    """More participants than the servers' network has addresses for: what each is told."""
    print(f"\n8. {size} at once on a hub whose network is a /28 (a few servers fit)")
    remove("small-network")
    hub = deploy("small-network")
    users = [f"net-{i:02d}" for i in range(size)]
    hub.api("POST", "/users", json={"usernames": users})
    try:
        with ThreadPoolExecutor(size) as pool:
            outcomes = list(pool.map(lambda u: start_outcome(hub, u), users))
        told = collections.Counter(outcome for _, outcome in outcomes)
        for outcome, count in told.most_common():
            times = [t for t, o in outcomes if o == outcome]
            print(f"  {count} in {fmt(times)}: {outcome}")
    finally:
        remove("small-network")


def start_outcome(hub: Hub, user: str, timeout: float = 300) -> tuple[float, str]:
    """Seconds until ``user``'s start ended, and how: ready, or what they were told."""
    t0 = time.monotonic()
    r = hub.api("POST", f"/users/{user}/server")
    while r.status_code in (201, 202) and time.monotonic() - t0 < timeout:
        server = hub.server(user)
        if server is None:  # failed: what the spawn-pending page's progress stream says
            events = hub.api("GET", f"/users/{user}/server/progress", stream=True)
            last = [e for e in events.iter_lines(decode_unicode=True) if e.startswith("data:")]
            message = json.loads(last[-1][5:])["message"] if last else "?"
            return time.monotonic() - t0, message
        if server.get("ready"):
            return time.monotonic() - t0, "ready"
        time.sleep(0.5)
    return time.monotonic() - t0, f"{r.status_code} {r.text[:200]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--crowd", type=int, default=50)
    parser.add_argument(
        "--only",
        choices=("single", "crowd", "join", "tutorials", "line", "refusals", "network"),
        help="run one part only (while working on it)",
    )
    parser.add_argument(
        "--cpu-limit",
        metavar="CORES",
        help="the hubs' GPUHUB_CPU_LIMIT (default: the deploy's, auto; '' for no limit)",
    )
    args = parser.parse_args()
    if args.cpu_limit is not None:
        COMMON["CPU_LIMIT"] = args.cpu_limit

    slices = sum(g.slices for g in inventory().values())
    nodes = len({g.node_name for g in inventory().values()})
    print(f"bed: {nodes} nodes, {len(inventory())} simulated GPUs, {slices} slices")
    if args.only in (None, "single", "crowd"):
        spawns(args, slices)
    if args.only in (None, "join"):
        joins()
    if args.only in (None, "tutorials"):
        tutorials()
    if args.only in (None, "line"):
        waiting_line(args.repeats)
    if args.only == "refusals":
        refusal_rounds(args.crowd, args.repeats)
    if args.only in (None, "network"):
        small_network()


def summary(single: dict[str, list[float]], crowds: dict, size: int) -> None:
    print("\nsummary (medians; ratios against the same run's baselines)")
    if single:
        bare, stock, gpu = (statistics.median(single[k]) for k in ("bare", "stock", "gpu"))
        print(
            f"  single spawn: GPUSwarmSpawner {gpu:.2f} s = {gpu / bare:.2f}x bare ({bare:.2f} s), "
            f"{gpu / stock:.2f}x stock ({stock:.2f} s)   goal <= 1.1x bare"
        )
    if not crowds:
        return
    s_ready, g_ready = crowds["stock"]["ready"], crowds["gpu"]["ready"]
    if s_ready and g_ready:
        print(
            f"  {size} at once: p95 to ready GPUSwarmSpawner {pct(g_ready, 0.95):.2f} s vs "
            f"stock {pct(s_ready, 0.95):.2f} s ({pct(g_ready, 0.95) / pct(s_ready, 0.95):.2f}x)"
            f"   goal <= stock"
        )
    g1 = crowds["gpu-1thread"]["ready"]
    if g1 and g_ready:
        threads = GPUSwarmSpawner.docker_api_threads.default_value
        print(
            f"  Docker API threads: {threads} (default) -> "
            f"p95 {pct(g_ready, 0.95):.2f} s, 1 (dockerspawner's) -> p95 {pct(g1, 0.95):.2f} s"
        )
    g_ref = crowds["gpu"]["refused"]
    s_ref = crowds["stock"]["refused"] + crowds["stock"]["timeout"]
    if g_ref:
        stock_ref = f"{statistics.median(s_ref):.1f} s" if s_ref else "-"
        print(
            f"  no slice free: GPUSwarmSpawner refuses in p50 {statistics.median(g_ref):.2f} s "
            f"(max {max(g_ref):.2f} s); stock in p50 {stock_ref} (its start_timeout is "
            f"{COMMON['START_TIMEOUT']} s)   goal < 2 s"
        )


if __name__ == "__main__":
    main()
