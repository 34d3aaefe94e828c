"""`make bench` part 6: the waiting line. Every slice of the bed is held by a participant's
server; one more participant waits in line; one server is stopped through the hub (as the idle
culler or the participant does). Measured: seconds from that stop being done (the hub's DELETE
answered, the service removed) to the waiting participant's server being ready, against a
single spawn onto a free slice (POST -> ready) in the same run. The first figure includes the
time the stopped server's task takes to end (until then its slice is not free), so it is an
upper bound on "a slice freed -> the next in line ready". Figures printed, nothing asserted.

    python -m tests.bench.bench --only line [--repeats 10]
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from tests.integration.hub import Hub
from tests.integration.spawners import inventory


def _until_ready(hub: Hub, user: str, timeout: float = 120) -> float:
    """Seconds until ``user``'s server is ready (polled every 50 ms)."""
    t0 = time.monotonic()
    while not (hub.server(user) or {}).get("ready"):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{user} not ready after {timeout} s: {hub.server(user)}")
        time.sleep(0.05)
    return time.monotonic() - t0


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
    times: dict[str, list[float]] = {"line": [], "single": []}
    with ThreadPoolExecutor(slices) as pool:
        list(pool.map(lambda u: _start(hub, u), occupants))
        list(pool.map(lambda u: _until_ready(hub, u), occupants))
    try:
        for i in range(repeats + 1):  # the first of each is a warm-up, not counted
            waiting = f"bench-wait-{i}"
            _start(hub, waiting, line="join")
            while not (hub.server(waiting) or {}).get("pending"):
                time.sleep(0.05)
            time.sleep(1)  # in line by now (the refusal, then the join, take a read or two)
            hub.stop(occupants.pop(0))
            freed_to_ready = _until_ready(hub, waiting)
            occupants.append(waiting)

            # a single spawn onto a free slice, for comparison: stop one, spawn, refill
            moved = occupants.pop(0)
            hub.stop(moved)
            _until_a_slice_is_free()
            single = f"bench-single-{i}"
            t0 = time.monotonic()
            _start(hub, single)  # POST -> ready, as the crowd benchmark's spawns
            _until_ready(hub, single)
            spawn = time.monotonic() - t0
            hub.stop(single)
            _until_a_slice_is_free()
            _start(hub, moved)
            _until_ready(hub, moved)
            occupants.append(moved)
            if i:
                times["line"].append(freed_to_ready)
                times["single"].append(spawn)
            print(
                f"  round {i}{' (warm-up)' if not i else ''}: slice freed -> next in line "
                f"ready {freed_to_ready:.2f} s; single spawn {spawn:.2f} s",
                flush=True,
            )
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(hub.stop, occupants))
    return times


def report(times: dict[str, list[float]]) -> None:
    line, single = statistics.median(times["line"]), statistics.median(times["single"])
    print(
        f"  summary: slice freed -> next in line ready p50 {line:.2f} s (max "
        f"{max(times['line']):.2f} s); single spawn p50 {single:.2f} s; difference "
        f"{line - single:+.2f} s (goal: at most +1 s), ratio {line / single:.2f}"
    )
