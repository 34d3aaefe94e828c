"""`make bench` part 6: the waiting line. Every slice of the bed is held by a participant's
server; one more participant waits in line; one server is stopped through the hub (as the idle
culler or the participant does). Measured:

- stop -> slice free: from the hub's DELETE to the stopped server's task no longer holding its
  slice (polled every 20 ms): the server's shutdown and Swarm's, the same with or without a line;
- slice free -> next in line ready: from then to the waiting participant's server being ready;
- a single spawn onto a free slice (POST -> ready), in the same run;
- (bench.py) the bare stop: a running server's service removed, as SwarmSpawner stops a server,
  until its task no longer holds its slice.

The goal: the second at most 1 s longer than the third. Figures printed, nothing asserted.

    python -m tests.bench.bench --only line [--repeats 10]
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import docker

from gpu_swarm_spawner.contract import USER_LABEL
from gpu_swarm_spawner.tasks import is_live
from tests.integration.hub import Hub
from tests.integration.spawners import inventory


def _until_ready(hub: Hub, user: str, timeout: float = 120) -> float:
    """The time (``time.monotonic``) ``user``'s server is seen ready (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not (hub.server(user) or {}).get("ready"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{user} not ready after {timeout} s: {hub.server(user)}")
        time.sleep(0.05)
    return time.monotonic()


def until_ended(task_id: str, timeout: float = 60) -> float:
    """The time a task is seen no longer holding its slices (polled every 20 ms)."""
    api = docker.from_env().api
    deadline = time.monotonic() + timeout
    while True:
        try:
            if not is_live(api.inspect_task(task_id)):
                return time.monotonic()
        except docker.errors.NotFound:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {task_id} still holds its slices after {timeout} s")
        time.sleep(0.02)


def _running_task(user: str) -> str:
    (service,) = docker.from_env().services.list(filters={"label": f"{USER_LABEL}={user}"})
    (task,) = [t for t in service.tasks() if t["Status"]["State"] == "running"]
    return task["ID"]


def _until_a_slice_is_free(timeout: float = 60) -> None:
    """Until a stopped server's task has ended and its slice shows free."""
    deadline = time.monotonic() + timeout
    while not any(g.free for g in inventory().values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no slice free after {timeout} s")
        time.sleep(0.05)


def _start(hub: Hub, user: str, **options) -> None:
    hub.api("POST", f"/users/{user}")
    r = hub.api("POST", f"/users/{user}/server", json=options or None)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"start of {user}: {r.status_code} {r.text}")


def bench_line(hub: Hub, repeats: int) -> dict[str, list[float]]:
    slices = sum(g.slices for g in inventory().values())
    occupants = [f"bench-occ-{i}" for i in range(slices)]
    times: dict[str, list[float]] = {"stop": [], "line": [], "single": []}
    with ThreadPoolExecutor(slices) as pool:
        list(pool.map(lambda u: _start(hub, u), occupants))
        list(pool.map(lambda u: _until_ready(hub, u), occupants))
    watch = ThreadPoolExecutor(2)
    try:
        for i in range(repeats + 1):  # the first of each is a warm-up, not counted
            waiting = f"bench-wait-{i}"
            _start(hub, waiting, line="join")
            while not (hub.server(waiting) or {}).get("pending"):
                time.sleep(0.05)
            time.sleep(1)  # in line by now (the refusal, then the join, take a read or two)
            stopped = occupants.pop(0)
            ended = watch.submit(until_ended, _running_task(stopped))
            ready = watch.submit(_until_ready, hub, waiting)
            t_stop = time.monotonic()
            hub.stop(stopped)
            t_free, t_ready = ended.result(), ready.result()
            occupants.append(waiting)

            # a single spawn onto a free slice, for comparison: stop one, spawn, refill
            moved = occupants.pop(0)
            hub.stop(moved)
            _until_a_slice_is_free()
            single = f"bench-single-{i}"
            t0 = time.monotonic()
            _start(hub, single)  # POST -> ready, as the crowd benchmark's spawns
            spawn = _until_ready(hub, single) - t0
            hub.stop(single)
            _until_a_slice_is_free()
            _start(hub, moved)
            _until_ready(hub, moved)
            occupants.append(moved)
            if i:
                times["stop"].append(t_free - t_stop)
                times["line"].append(t_ready - t_free)
                times["single"].append(spawn)
            print(
                f"  round {i}{' (warm-up)' if not i else ''}: stop -> slice free "
                f"{t_free - t_stop:.2f} s; slice free -> next in line ready "
                f"{t_ready - t_free:.2f} s; single spawn {spawn:.2f} s",
                flush=True,
            )
    finally:
        watch.shutdown()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(hub.stop, occupants))
    return times


def report(times: dict[str, list[float]]) -> None:
    line, single = statistics.median(times["line"]), statistics.median(times["single"])
    stop, bare = statistics.median(times["stop"]), statistics.median(times["bare stop"])
    print(
        f"  summary: stop through the hub -> slice free p50 {stop:.2f} s; a running server's "
        f"service removed (SwarmSpawner's stop) -> slice free p50 {bare:.2f} s; ratio "
        f"{stop / bare:.2f}"
    )
    print(
        f"  summary: slice freed -> next in line ready p50 {line:.2f} s (max "
        f"{max(times['line']):.2f} s); single spawn p50 {single:.2f} s; difference "
        f"{line - single:+.2f} s (goal: at most +1 s), ratio {line / single:.2f}"
    )
