"""The loop of the hub's periodic checks (the access check, the disk check): a round at once,
then one every so many seconds, as jupyterhub-idle-culler runs; a failing round is logged once
while it keeps failing the same way, and never stops the next."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def keep(one_round: Callable[[], Awaitable[object]], every: float, log, what: str) -> None:
    """``one_round()`` now and every ``every`` seconds until cancelled. ``what`` names the
    check in the log: "The {what} failed; trying again", then "The {what} works again"."""
    failing = ""
    while True:
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
        await asyncio.sleep(every)
