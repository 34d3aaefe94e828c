"""The loop of the hub's periodic checks (the access check, the disk check, the fleet's rounds):
a round at once, then one every so many seconds, as jupyterhub-idle-culler runs; a failing round
is logged once while it keeps failing the same way, and never stops the next. A loop given a
``wake`` event also runs its next round as soon as that is set (the fleet's, when someone joins
the waiting line), never two rounds at once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


async def keep(
    one_round: Callable[[], Awaitable[object]],
    every: float,
    log,
    what: str,
    wake: asyncio.Event | None = None,
    least: float = 0.0,
) -> None:
    """``one_round()`` now and ``every`` seconds after each until cancelled. ``what`` names the
    check in the log: "The {what} failed; trying again", then "The {what} works again".

    ``wake``: an event that brings the next round forward (it is cleared as a round begins, so
    one set during a round brings one more); ``least``: the fewest seconds from one round's
    start to the next one's, however often ``wake`` is set (a burst of wake-ups brings one
    round, not one each)."""
    loop = asyncio.get_running_loop()
    failing = ""
    while True:
        began = loop.time()
        if wake is not None:
            wake.clear()
        try:
            await one_round()
        except Exception as e:
            now_failing = f"{type(e).__name__}: {e}"
            if now_failing != failing:
                log.exception("The %s failed; trying again", what)
            failing = now_failing
        else:
            if failing:
                log.info("The %s works again", what)
            failing = ""
        if wake is None:
            await asyncio.sleep(every)
            continue
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=every)
        await asyncio.sleep(max(began + least - loop.time(), 0))
