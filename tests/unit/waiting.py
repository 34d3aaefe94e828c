"""Waiting in async tests for something another task does."""

from __future__ import annotations

import asyncio


async def until(condition, timeout: float = 3.0) -> None:
    """Until ``condition()`` is true, checked every 10 ms; fails the test after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
