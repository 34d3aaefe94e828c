"""Many participants' spawn requests at once, from one asyncio loop (aiohttp, a dependency of
JupyterHub's) in a thread of its own.

500 requests from 500 Python threads cost the client as much CPU as the hub spends answering
them, on the same 2 cores, and their start is spread by the threads' scheduling: the benchmarks
measured the client as much as the hub. One loop sends them all in the same instant, as 500
browsers on their own machines would, and measures from that instant.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import Future

import aiohttp


class Spawns:
    """``POST /hub/api/users/<name>/server`` for many users at once.

    ``send`` returns a future of ``(status, body, seconds from sending)``. An answer 429
    (JupyterHub's concurrent-spawn limit) is sent again after the Retry-After it names, while
    ``retry_429`` holds; ``retries`` counts them."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float = 300, retry_429=True):
        self.url, self.headers, self.timeout = url, dict(headers), timeout
        self.retry_429 = retry_429
        self.retries = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        join_clients_cpu(self.thread)
        self.session = self._run(self._session()).result()

    def _run(self, coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def _session(self) -> aiohttp.ClientSession:
        # no limit on connections: each participant has their own browser
        return aiohttp.ClientSession(
            headers=self.headers,
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )

    async def _post(self, user: str, t0: float) -> tuple[int, str, float]:
        while True:
            async with self.session.post(f"{self.url}/hub/api/users/{user}/server") as r:
                body = await r.text()
                if r.status != 429 or not self.retry_429:
                    return r.status, body, time.monotonic() - t0
                self.retries += 1  # only the loop's thread counts
                wait = float(r.headers.get("Retry-After") or 1)
            await asyncio.sleep(wait)

    def send(self, user: str, t0: float | None = None) -> Future:
        """The request for ``user``, timed from ``t0`` (default: now)."""
        return self._run(self._post(user, time.monotonic() if t0 is None else t0))

    def close(self) -> None:
        """Stop sending again on 429; close the session and the loop's thread (requests still
        out are cancelled)."""
        self.retry_429 = False

        async def shut() -> None:
            await self.session.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        self._run(shut()).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def join_clients_cpu(thread: threading.Thread) -> None:
    """Move ``thread`` into the bed's CPU group for the participants' browsers (tests/bed/bed.sh:
    GPUHUB_BED_CLIENTS_CPU, weighed as the manager), where the bed has one: the browsers are on
    machines of their own, so the client's wait for the CPU is not the hub's answer time."""
    group = os.environ.get("GPUHUB_BED_CLIENTS_CPU")
    if group:
        with open(os.path.join(group, "tasks"), "w") as tasks:  # cgroup v1: one thread
            tasks.write(str(thread.native_id))
