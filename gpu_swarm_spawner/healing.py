"""What the hub did to bring its view, Swarm's and the proxy's back into agreement.

Every such action (``reconcile.py`` decides, ``spawner.py`` and ``keeper.py`` act) is logged,
counted in the hub's metrics (``gpuhub_healed_total{action=...}`` on ``/hub/metrics``, which
Prometheus scrapes) and recorded as a "healed" event for the organizer's dashboard.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import Counter

from . import events

#: The actions, and what each means (the dashboard and the docs use these words).
ACTIONS = {
    "kept": "a server Swarm is bringing back was kept as running, not taken for stopped",
    "moved": "a server Swarm replaced runs at a new address; the hub's record followed it",
    "back": "a server Swarm brought back answers again",
    "lost": "a server away for longer than server_lost_after was reported stopped",
    "leftover removed": "a participant's own earlier server, which the hub had let go, was "
    "removed before their new start (not refused for its slices)",
    "orphan removed": "a service no server of the hub owns was removed after the grace",
    "routes restored": "routes the proxy lacked (it restarted) or that pointed elsewhere were "
    "put back",
}

HEALED = Counter(
    "gpuhub_healed",
    "What the hub did to bring its view, Swarm's and the proxy's back into agreement",
    ["action"],
)
for _action in ACTIONS:
    HEALED.labels(_action)  # each shows as 0 before it first happens


def record(
    log: logging.Logger,
    journal: events.Journal | None,
    action: str,
    message: str,
    user: str = "",
    server: str = "",
    count: int = 1,
) -> None:
    """Log ``message`` (a warning: something had diverged), count ``action`` and record it for
    the dashboard; a failed write to the journal is logged, never raised."""
    if action not in ACTIONS:
        raise ValueError(f"unknown healing action {action!r}; one of {sorted(ACTIONS)}")
    log.warning("Healed (%s): %s", action, message)
    HEALED.labels(action).inc(count)
    if journal is None:
        return
    event = events.Event(time.time(), "healed", user or "-", server, action=action, reason=message)
    try:
        journal.record(event)
    except OSError as e:
        log.warning("Could not record the healing '%s' for the dashboard: %s", action, e)
