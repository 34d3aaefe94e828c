"""`make bench-scale`: 500 participants through the hub's REST API, on a bed of 10 GPU machines
(tests/bench/scale.sh sets it up: 5 simulated GPUs x 10 slices each, 500 slices, a manager that
runs only the hub) with the stand-in server image (images/scale-server: busybox answering as a
single-user server does, well under 1 MB each). Figures printed, never asserted.

Per hub (GPUSwarmSpawner, then stock dockerspawner.SwarmSpawner with the original workshop's
named slots):

- waves of JupyterHub's ``concurrent_spawn_limit`` until all 500 are ready (spawn p50/p95 per
  wave), then with 500 running: the 501st participant's refusal, 100 and 500 more at once
  (three rounds each; stock: 100 once, as it tells nobody), the hub API's latency
  (``GET /hub/api/users``, ``GET /hub/api/users/<one>``), the hub's CPU and memory, the
  manager engine's CPU, the poll cycle's cost, the proxy's routes and GPU oversubscription
  (from the services' own reservations); then all stopped, the services left, and when the
  stopped servers' tasks no longer hold slices;
- all 500 at once onto free slices (those over the limit retried as JupyterHub's 429 asks),
  then stopped.

    python -m tests.bench.scale [--participants 500] [--variants gpu,stock] [--only waves|burst]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import docker

from tests.bench import bench
from tests.bench.bench import PAGE, fmt, pct, servers
from tests.bench.client import Spawns
from tests.integration.hub import Hub
from tests.integration.spawners import inventory

IMAGE = "gpu-jupyterhub/scale-server:latest"
SCALE = {
    # no waiting line: JupyterHub's own concurrent_spawn_limit (100) applies, and the 501st is
    # refused at once, as the original workshop's participants were
    "WAITING_LINE": "off",
    "SINGLEUSER_IMAGE": IMAGE,
    # limits, not reservations: the stand-in uses far less, and Swarm places by slices alone
    "CPU_LIMIT": "0.5",
    "MEM_LIMIT": "256M",
    "PIDS_LIMIT": "256",
    "START_TIMEOUT": "300",
    "IDLE_TIMEOUT": "0",
    # busybox only: no gpuhub-firewall to start the servers with (scale.sh, the machines too)
    "EGRESS": "off",
}
bench.VARIANTS["scale-gpu"] = {
    **SCALE,
    "STACK": "bench-scale",
    "HTTP_PORT": "18600",
    "NETWORK": "bench-scale",
    # room for 500 servers (a swarm made before its pool was /20 gives /24: about 250)
    "NETWORK_SUBNET": "10.210.0.0/20",
}
bench.VARIANTS["scale-stock"] = {
    **SCALE,
    "STACK": "bench-scale-stock",
    "HTTP_PORT": "18700",
    "NETWORK": "bench-scale-stock",
    "NETWORK_SUBNET": "10.211.0.0/20",
    "SPAWNER": "stock-swarm",
}
BED_RUN = Path("/run/gpu-jupyterhub-bed")


# ---- what the machine spends ---------------------------------------------------------------


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def manager_cpu() -> float:
    """CPU seconds of the bed manager's engine: dockerd's own (its containerd, a process of
    its own, is not counted)."""
    return process_cpu(int((BED_RUN / "manager.pid").read_text()))


def container_usage(container) -> tuple[float, int]:
    """(CPU seconds, memory bytes without page cache) of a container, from its cgroup."""
    stats = container.stats(stream=False)
    cpu = stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9
    memory = stats["memory_stats"]
    cache = memory.get("stats", {}).get("inactive_file", 0)
    return cpu, memory.get("usage", 0) - cache


class Meter:
    """CPU of the hub's container and of the manager's engine between ``start`` and ``read``."""

    def __init__(self, hub: Hub):
        self.container = bench.hub_container_of(hub)
        self.start()

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.hub0 = container_usage(self.container)[0]
        self.mgr0 = manager_cpu()

    def read(self) -> dict[str, float]:
        seconds = time.monotonic() - self.t0
        hub_cpu, hub_memory = container_usage(self.container)
        return {
            "seconds": seconds,
            "hub_cpu": hub_cpu - self.hub0,
            "manager_cpu": manager_cpu() - self.mgr0,
            "hub_memory": hub_memory,
        }


def cpu_line(m: dict[str, float]) -> str:
    s = m["seconds"]
    return (
        f"hub {m['hub_cpu']:.1f} CPU-s ({100 * m['hub_cpu'] / s:.0f}% of a core), manager "
        f"engine {m['manager_cpu']:.1f} CPU-s ({100 * m['manager_cpu'] / s:.0f}%), hub memory "
        f"{m['hub_memory'] / 2**20:.0f} MiB, over {s:.0f} s"
    )


# ---- the participants ----------------------------------------------------------------------


def users_of(n: int) -> list[str]:
    return [f"scale-{i:03d}" for i in range(n)]


def create_users(hub: Hub, users: list[str]) -> None:
    for i in range(0, len(users), PAGE):
        r = hub.api("POST", "/users", json={"usernames": users[i : i + PAGE]})
        if r.status_code not in (201, 409):
            raise RuntimeError(f"creating users: {r.status_code} {r.text}")


class Crowd:
    """Spawn requests sent together (tests/bench/client.py); one watcher reads all servers
    every ``WATCH_S`` while any request it waits for was accepted.

    A request answered 429 (JupyterHub's concurrent_spawn_limit) is sent again after the
    Retry-After it names; any other refusal is recorded with its time and status."""

    WATCH_S = 0.5

    def __init__(self, hub: Hub):
        self.hub = hub
        self.spawns = Spawns(hub.url, dict(hub.session.headers))
        self.lock = threading.Lock()
        self.sent: dict[str, float] = {}  # first request
        self.accepted: set[str] = set()
        self.ready: dict[str, float] = {}  # seconds from the first request
        self.refused: dict[str, tuple[float, str]] = {}

    @property
    def retries(self) -> int:
        return self.spawns.retries

    def _answered(self, user: str, answer: Future) -> None:
        if answer.cancelled() or answer.exception():
            return  # closed while it was out: neither accepted nor refused
        status, body, seconds = answer.result()
        with self.lock:
            if status in (201, 202):
                self.accepted.add(user)
            else:
                self.refused[user] = (seconds, f"{status} {body[:120]}")

    def send(self, users: list[str]) -> None:
        now = time.monotonic()
        for user in users:
            self.sent[user] = now
            answer = self.spawns.send(user, now)
            answer.add_done_callback(lambda a, user=user: self._answered(user, a))

    def wait(self, users: list[str], timeout: float) -> None:
        """Until each of ``users`` is ready or refused (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        pending = set(users)
        while pending and time.monotonic() < deadline:
            time.sleep(self.WATCH_S)
            # the hub is asked only while it has accepted someone still pending: with 500
            # running, each listing is 3 pages of 200 users, which a burst of refusals waited
            # behind twice a second
            with self.lock:
                watching = bool(self.accepted & pending)
            listed = servers(self.hub) if watching else {}
            now = time.monotonic()
            with self.lock:
                for user in list(pending):
                    if user in self.refused:
                        pending.discard(user)
                    elif user in self.accepted and not listed.get(user):
                        self.refused[user] = (now - self.sent[user], "server gone")
                        pending.discard(user)
                    elif (listed.get(user) or {}).get("ready"):
                        self.ready[user] = now - self.sent[user]
                        pending.discard(user)

    def close(self) -> None:
        self.spawns.close()  # requests answered 429 are not sent again


def stop_all(hub: Hub, users: list[str]) -> float:
    """Every server stopped, ``users``' and any other the hub lists (50 DELETEs at a time);
    seconds until the hub lists none."""
    t0 = time.monotonic()
    everyone = sorted(set(users) | set(servers(hub)))
    with ThreadPoolExecutor(50) as pool:
        list(pool.map(lambda u: hub.api("DELETE", f"/users/{u}/server"), everyone))
    deadline = t0 + 600
    while servers(hub) and time.monotonic() < deadline:
        time.sleep(1)
    return time.monotonic() - t0


def services_left(hub: Hub, timeout: float = 120) -> int:
    """Servers' services of this hub that remain ``timeout`` s after the hub listed none."""
    client = docker.from_env()
    deadline = time.monotonic() + timeout
    while True:
        left = client.api.services(filters={"label": f"gpu-jupyterhub.stack={hub.stack}"})
        left = [s for s in left if s["Spec"]["Name"].startswith("jy-")]
        if not left or time.monotonic() > deadline:
            return len(left)
        time.sleep(1)


#: how long the bench waits for the stopped servers' slices to be free
FREE_TIMEOUT_S = 300


def slices_free_after(timeout: float = FREE_TIMEOUT_S) -> float | None:
    """Seconds until no task of the swarm holds a GPU slice (None: not within ``timeout``).
    A stop that removes a server's service returns before its task has ended, and until
    then Swarm counts its slices, and so do the hub's refusals: a burst sent sooner is
    refused for slices still held."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not any(g.used for g in inventory().values()):
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def stopped_line(stop_s: float, free_s: float | None, left: int) -> str:
    free = f"not within {FREE_TIMEOUT_S} s" if free_s is None else f"{free_s:.1f} s later"
    return f"all stopped in {stop_s:.1f} s, their slices free {free}, services left: {left}"


# ---- with 500 running ----------------------------------------------------------------------


def refusal_times(hub: Hub, user: str, repeats: int = 5) -> list[tuple[float, str]]:
    """The participant who does not fit, ``repeats`` times: seconds until the hub says so."""
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        r = hub.api("POST", f"/users/{user}/server")
        if r.status_code in (201, 202):  # accepted: refused later, or (wrongly) started
            while True:
                server = hub.server(user)
                if server is None or server.get("ready") or time.monotonic() - t0 > 120:
                    break
                time.sleep(0.05)
            if server and server.get("ready"):
                outcome = "STARTED (a slice was free)"
            elif server:
                outcome = "not told within 120 s (its start still pending)"
            else:
                outcome = "refused after accepting"
            if server:
                hub.stop(user)
        else:
            outcome = f"{r.status_code}: {r.json().get('message', '')[:100]}"
        times.append((time.monotonic() - t0, outcome))
    return times


def refused_burst(hub: Hub, size: int) -> dict:
    """``size`` more participants at once while every slice is taken: seconds until each is
    told."""
    extras = [f"scale-more-{i:03d}" for i in range(size)]
    create_users(hub, extras)
    crowd = Crowd(hub)
    try:
        crowd.send(extras)
        crowd.wait(extras, timeout=120)
    finally:
        crowd.close()
    return {
        "refused": [t for t, _ in crowd.refused.values()],
        "started": len(crowd.ready),
        "untold": size - len(crowd.refused) - len(crowd.ready),
        "reasons": collections.Counter(r[:40] for _, r in crowd.refused.values()).most_common(2),
    }


def api_latency(hub: Hub, one: str, repeats: int = 100) -> dict[str, list[float]]:
    """Seconds per hub API call, sequentially: all users (the first page) and one user."""
    result: dict[str, list[float]] = {"GET /users": [], f"GET /users/{one}": []}
    for _ in range(repeats):
        for name, path in (("GET /users", "/users"), (f"GET /users/{one}", f"/users/{one}")):
            t0 = time.monotonic()
            hub.api("GET", path).raise_for_status()
            result[name].append(time.monotonic() - t0)
    return result


def proxy_routes(hub: Hub) -> int:
    """The routes the proxy holds, asked from the hub's container (the proxy's API is on the
    stack's network only)."""
    code = (
        "import json, urllib.request; token = open('/run/secrets/proxy_token').read().strip(); "
        "r = urllib.request.Request('http://proxy:8001/api/routes', "
        "headers={'Authorization': 'token ' + token}); "
        "print(len(json.load(urllib.request.urlopen(r, timeout=10))))"
    )
    out = bench.hub_container_of(hub).exec_run(["python3", "-c", code])
    return int(out.output.decode().strip().splitlines()[-1])


def oversubscribed(hub: Hub) -> tuple[int, int, dict[str, int]]:
    """(GPUs holding more than their slices, servers counted, servers per GPU) from the
    services' own reservations (GPUSwarmSpawner: ``<uuid>: n``) or, for named slots, from the
    slots Swarm assigned to their tasks (``<kind>=<uuid>/<n>``)."""
    client = docker.from_env()
    slices = {g.uuid: g.slices for g in inventory().values()}
    held: dict[str, int] = collections.Counter()
    count = 0
    label = f"gpu-jupyterhub.stack={hub.stack}"
    for service in client.api.services(filters={"label": label}):
        if not service["Spec"]["Name"].startswith("jy-"):
            continue
        count += 1
        reserved = service["Spec"]["TaskTemplate"].get("Resources", {}).get("Reservations", {})
        for resource in reserved.get("GenericResources") or []:
            spec = resource.get("DiscreteResourceSpec")
            if spec and spec["Kind"] in slices:
                held[spec["Kind"]] += spec["Value"]
    for task in client.api.tasks(filters={"desired-state": "running"}):
        for resource in task.get("AssignedGenericResources") or []:
            spec = resource.get("NamedResourceSpec")
            if spec and "/" in spec["Value"] and task["ServiceID"]:
                held[spec["Value"].split("/")[0] + "#named"] += 1
    over = sum(1 for kind, n in held.items() if n > slices.get(kind.split("#")[0], 0))
    return over, count, dict(held)


# ---- the runs ------------------------------------------------------------------------------


def waves(hub: Hub, users: list[str], limit: int) -> dict:
    crowd = Crowd(hub)
    t0 = time.monotonic()
    report: dict = {"waves": []}
    try:
        for i in range(0, len(users), limit):
            wave = users[i : i + limit]
            w0 = time.monotonic()
            crowd.send(wave)
            crowd.wait(wave, timeout=600)
            ready = [crowd.ready[u] for u in wave if u in crowd.ready]
            refused = [u for u in wave if u in crowd.refused]
            report["waves"].append(ready)
            print(
                f"    wave {i // limit + 1}: {len(ready)} ready in {time.monotonic() - w0:5.1f} s, "
                f"spawn {fmt(ready)}"
                + (f", {len(refused)} refused: {crowd.refused[refused[0]][1]}" if refused else ""),
                flush=True,
            )
    finally:
        crowd.close()
    report["all_ready_s"] = time.monotonic() - t0
    report["ready"] = len(crowd.ready)
    report["refused"] = dict(crowd.refused)
    return report


def burst(hub: Hub, users: list[str]) -> dict:
    crowd = Crowd(hub)
    t0 = time.monotonic()
    try:
        crowd.send(users)
        crowd.wait(users, timeout=900)
    finally:
        crowd.close()
    ready = list(crowd.ready.values())
    refused = [t for t, _ in crowd.refused.values()]
    return {
        "all_ready_s": time.monotonic() - t0,
        "ready": ready,
        "refused": refused,
        "reasons": collections.Counter(r for _, r in crowd.refused.values()).most_common(3),
        "retries": crowd.retries,
    }


def swarm_read(repeats: int = 10) -> tuple[list[float], int, int]:
    """What the spawner's read of the swarm (all nodes and all tasks) costs: seconds per read,
    the tasks listed and the bytes of the answer."""
    client = docker.from_env()
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        nodes, tasks = client.api.nodes(), client.api.tasks()
        times.append(time.monotonic() - t0)
    return times, len(tasks), len(json.dumps(nodes)) + len(json.dumps(tasks))


def with_all_running(hub: Hub, users: list[str], extra: str, poll_interval: float) -> dict:
    """Figures with every participant's server running."""
    figures: dict = {}
    figures["swarm_read"] = swarm_read()
    over, count, held = oversubscribed(hub)
    figures["oversubscribed"], figures["services"] = over, count
    figures["routes"] = proxy_routes(hub)
    meter = Meter(hub)
    time.sleep(2 * poll_interval)  # two poll cycles, nothing else asked of the hub
    figures["idle"] = meter.read()
    figures["refusal"] = refusal_times(hub, extra)
    # 100: JupyterHub's concurrent_spawn_limit; 500: as many again as run; three rounds each.
    # Stock SwarmSpawner tells nobody (each waits for its start_timeout): one round of 100.
    ours = hub.stack == bench.VARIANTS["scale-gpu"]["STACK"]
    bursts = [(size, n) for size in (100, 500) for n in (1, 2, 3)] if ours else [(100, 1)]
    figures["refused_burst"] = [(size, n, refused_burst(hub, size)) for size, n in bursts]
    figures["api"] = api_latency(hub, users[len(users) // 2])
    return figures


def run_variant(variant: str, n: int, only: str | None) -> dict:
    name = "GPUSwarmSpawner" if variant == "scale-gpu" else "stock SwarmSpawner"
    print(f"\n== {name} ({bench.VARIANTS[variant]['STACK']}) ==", flush=True)
    bench.remove(variant)  # what an interrupted run left on the manager (it keeps its data)
    hub = bench.deploy(variant)
    users, extra = users_of(n), "scale-extra"
    create_users(hub, [*users, extra])
    poll = float(bench.COMMON["POLL_INTERVAL"])
    result: dict = {"name": name}
    try:
        if only in (None, "waves"):
            limit = 100  # JupyterHub's concurrent_spawn_limit with the line off
            print(f"  waves of {limit} (JupyterHub's concurrent_spawn_limit)", flush=True)
            meter = Meter(hub)
            w = result["waves"] = waves(hub, users, limit)
            result["start_cost"] = meter.read()
            print(
                f"  {w['ready']} ready after {w['all_ready_s']:.1f} s; "
                f"{cpu_line(result['start_cost'])}",
                flush=True,
            )
            f = result["running"] = with_all_running(hub, users, extra, poll)
            print(
                f"  with {f['services']} running: {f['oversubscribed']} GPUs oversubscribed, "
                f"{f['routes']} proxy routes",
                flush=True,
            )
            print(f"  idle, two poll cycles: {cpu_line(f['idle'])}", flush=True)
            times, listed, size = f["swarm_read"]
            print(
                f"  one read of the swarm (nodes, all {listed} tasks, {size / 2**20:.1f} MiB): "
                f"p50 {1000 * statistics.median(times):.0f} ms",
                flush=True,
            )
            for seconds, outcome in f["refusal"]:
                print(f"  participant {n + 1}: {seconds:.2f} s  {outcome}", flush=True)
            for size, rounds, b in f["refused_burst"]:
                print(
                    f"  {size} more at once (round {rounds}): {len(b['refused'])} refused in "
                    f"{fmt(b['refused'])}, max {max(b['refused'], default=0):.2f} s; "
                    f"{b['started']} started, {b['untold']} not told within 120 s "
                    f"({b['reasons']})",
                    flush=True,
                )
            for call, times in f["api"].items():
                print(
                    f"  {call:22s} p50 {1000 * statistics.median(times):6.1f} ms  "
                    f"p95 {1000 * pct(times, 0.95):6.1f} ms",
                    flush=True,
                )
            meter.start()
            result["stop_s"] = stop_all(hub, users)
            result["stop_cost"] = meter.read()
            result["left"] = services_left(hub)
            result["free_s"] = slices_free_after()
            print(
                f"  {stopped_line(result['stop_s'], result['free_s'], result['left'])}; "
                f"{cpu_line(result['stop_cost'])}",
                flush=True,
            )
        if only in (None, "burst"):
            print(f"  all {n} at once", flush=True)
            b = result["burst"] = burst(hub, users)
            print(
                f"  {len(b['ready'])} ready after {b['all_ready_s']:.1f} s, "
                f"spawn {fmt(b['ready'])}; "
                f"{len(b['refused'])} refused ({b['reasons']}); {b['retries']} requests "
                "answered 429 and sent again",
                flush=True,
            )
            result["burst_stop_s"] = stop_all(hub, users)
            result["burst_left"] = services_left(hub)
            result["burst_free_s"] = slices_free_after()
            stopped = result["burst_stop_s"], result["burst_free_s"], result["burst_left"]
            print(f"  {stopped_line(*stopped)}", flush=True)
    finally:
        bench.remove(variant)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--participants", type=int, default=500)
    parser.add_argument("--variants", default="gpu,stock")
    parser.add_argument("--only", choices=("waves", "burst"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    gpus = inventory()
    slices = sum(g.slices for g in gpus.values())
    nodes = len({g.node_name for g in gpus.values()})
    print(f"bed: {nodes} GPU machines, {len(gpus)} simulated GPUs, {slices} slices", flush=True)
    results = [
        run_variant(f"scale-{v}", args.participants, args.only) for v in args.variants.split(",")
    ]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
