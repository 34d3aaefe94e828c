"""The GPU machines the hub asks the cloud for, as the organizer sees them: ``fleet.json`` read
into one plain dict that the dashboard (``dashboard/``) and ``make status`` (``deploy/status.py``)
both show. Pure, standard library only.

The hub's fleet keeper rewrites ``fleet.json`` in the dashboard folder (beside ``events.jsonl``
and ``line.json``, ``GPUSwarmSpawner.dashboard_dir``) every round while ``GPUHUB_FLEET`` is on:
its machines with their state and the reason for it (a *fixed* machine, joined by hand without
the cloud group's mark, is marked so: its slices count, the hub never gives it back), the size
of the cloud's group as the hub counts it, the machines on their way, the provider's last call
and back-off, the cost figures and its recent decisions. ``read`` is its one reader,
and a tolerant one: a file that is missing, cut short, not JSON or of another shape is no fleet
data (None: the views show no fleet at all, as with the fleet off); a key that is missing or of
the wrong type reads as None, shown as "unknown", never an error. A snapshot older than
``STALE_AFTER_S`` is *stale*: the keeper is not writing (the hub is down or restarting, or the
fleet was turned off), and the views say so with its age.

Times stay epoch seconds: the page shows them in the browser's time zone, ``make status`` in
the manager's.
"""

from __future__ import annotations

import json

from .cost import Usage
from .line import about
from .provider import ADVICE, last_line
from .tolerant import number

FLEET_FILE = "fleet.json"
#: A snapshot older than this is stale: the keeper writes one every round (10 s).
STALE_AFTER_S = 60.0
#: The most decisions the views list (the keeper keeps the last 50).
DECISIONS = 50
#: The price setting the cost line names when there is no price.
PRICE_SETTING = "GPUHUB_FLEET_PRICE_PER_HOUR"

#: A machine's state (``capacity.STATES``) in the organizer's words.
STATE_WORDS = {
    "asked": "asked for",
    "booting": "booting",
    "joining": "joining the swarm",
    "ready": "taking servers",
    "draining": "paused (given back if it stays empty)",
    "leaving": "being given back",
    "gone": "down (no answer; given back if it stays down)",
    "given up": "given up (never joined; still in the cloud's group)",
}
#: Added to a fixed machine's state words.
FIXED_WORDS = " (fixed: yours, never given back)"
#: A fixed machine's, where the group's say what the hub does (it never gives a fixed one back).
FIXED_STATE_WORDS = {"gone": "down (no answer)"}
#: The states that take no servers and are not on their way: the views mark them.
NOT_TAKING = frozenset({"draining", "leaving", "gone", "given up"})


def _count(value) -> int | None:
    found = number(value)
    return int(found) if found is not None and found >= 0 and found.is_integer() else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _machine(entry: dict) -> dict:
    state = _text(entry.get("state"))
    fixed = entry.get("fixed")
    fixed = fixed if isinstance(fixed, bool) else None
    words = STATE_WORDS.get(state, state) if state else None
    if fixed and state in FIXED_STATE_WORDS:
        words = FIXED_STATE_WORDS[state]
    return {
        "name": _text(entry.get("name")),
        "state": state,
        "fixed": fixed,
        "words": words + FIXED_WORDS if words and fixed else words,
        "taking": state == "ready",
        "out": state in NOT_TAKING,
        "since": number(entry.get("since")),
        "servers": _count(entry.get("servers")),
        "free": _count(entry.get("free")),
        "slices": _count(entry.get("slices")),
        "reason": _text(entry.get("reason")),
    }


def _coming(record, at: float) -> dict | None:
    if not isinstance(record, dict):
        return None
    machines, ready_in = _count(record.get("machines")), number(record.get("ready_in"))
    if machines == 0:
        return None
    ready_at = None if ready_in is None else at + max(ready_in, 0.0)
    count = "unknown" if machines is None else str(machines)
    line = f"{count} machine(s) on their way"
    line += ", ready in " + (about(ready_in) if ready_in is not None else "an unknown time")
    return {"machines": machines, "ready_in": ready_in, "ready_at": ready_at, "line": line}


def _call(record) -> dict | None:
    """The provider's last call; its failure in words: the kind, what to do, the output's
    last line."""
    if not isinstance(record, dict):
        return None
    ok = record.get("ok")
    ok = ok if isinstance(ok, bool) else None
    kind = _text(record.get("kind")) or None
    told = _text(record.get("told"))
    output = _text(record.get("output"))
    failed = ok is False
    return {
        "action": _text(record.get("action")),
        "at": number(record.get("at")),
        "ok": ok,
        "failed": failed,
        "kind": (kind or "failed") if failed else kind,
        # the advice of the provider's reading; the keeper's own line for a kind it does not know
        "advice": (ADVICE.get(kind or "failed") or told) if failed else None,
        "told": told,
        "output": last_line(output) if output is not None else None,
    }


def _provider(record, now: float) -> dict:
    record = _dict(record)
    busy = record.get("busy")
    blocked_until = number(record.get("blocked_until"))
    return {
        "busy": busy if isinstance(busy, bool) else None,
        "last": _call(record.get("last")),
        "blocked_until": blocked_until,
        "blocked": blocked_until is not None and blocked_until > now,
    }


def cost_line(machine_hours, offered, used, price) -> str:
    """The cost as ``make status`` and the dashboard say it (``cost.Usage.describe``):
    machine-hours, slice-hours used of offered, and the estimate at its price, or the setting
    that gives one."""
    if machine_hours is None or offered is None or used is None:
        return "unknown (the snapshot has no cost figures)"
    priced = price is not None and price > 0
    line = Usage(machine_hours, offered, used, price if priced else 0.0).describe()
    return line if priced else f"{line}; set {PRICE_SETTING} for an estimate"


def _cost(record) -> dict:
    record = _dict(record)
    figures = {
        key: number(record.get(key))
        for key in (
            "machine_hours",
            "slice_hours_offered",
            "slice_hours_used",
            "price_per_hour",
            "estimated",
        )
    }
    line = cost_line(
        figures["machine_hours"],
        figures["slice_hours_offered"],
        figures["slice_hours_used"],
        figures["price_per_hour"],
    )
    return {**figures, "line": line}


def _decision(entry: dict) -> dict:
    return {
        "at": number(entry.get("at")),
        "action": _text(entry.get("action")),
        "machine": _text(entry.get("machine")) or "",
        "target": _count(entry.get("target")),
        "reason": _text(entry.get("reason")),
    }


def group_line(group: int | None, fixed: int) -> str:
    """The cloud's group as the hub counts it (what a grow's count starts from), and the fixed
    machines beside it."""
    size = "unknown" if group is None else str(group)
    line = f"The cloud's group: {size} machine(s), as the hub counts it"
    return line + (f"; {fixed} fixed machine(s) of yours beside it" if fixed else "")


def stale_line(age: float) -> str:
    """What the views say of a snapshot the keeper stopped writing."""
    return (
        f"The fleet's snapshot is {about(age).removeprefix('about ')} old: the hub's fleet "
        "keeper is not running (the hub is down or restarting, or GPUHUB_FLEET is off); below "
        "is the fleet as it was then."
    )


def read(text: str | bytes | None, now: float) -> dict | None:
    """``fleet.json``'s text read at ``now``: the fleet as the views show it, or None when it is
    no snapshot (no file, cut short, not JSON, another shape)."""
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:  # a file cut short, or not JSON (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(record, dict):
        return None
    at = number(record.get("at"))
    if at is None:  # not a snapshot of this format
        return None
    age = max(now - at, 0.0)
    machines = [
        _machine(m)
        for m in (record.get("machines") if isinstance(record.get("machines"), list) else [])
        if isinstance(m, dict)
    ]
    decisions = record.get("decisions")
    group = _count(record.get("group"))
    fixed = sum(1 for m in machines if m["fixed"] and m["state"] != "gone")
    return {
        "at": at,
        "age": age,
        "stale": age > STALE_AFTER_S,
        "stale_line": stale_line(age) if age > STALE_AFTER_S else "",
        "fleet": _text(record.get("fleet")),
        "min": _count(record.get("min")),
        "max": _count(record.get("max")),
        "floor": _count(record.get("floor")),
        "group": group,
        "group_line": group_line(group, fixed),
        # the keeper's order, the machines gone (the day's history, kept for the cost) last
        "machines": sorted(machines, key=lambda m: m["state"] == "gone"),
        "coming": _coming(record.get("coming"), at),
        "provider": _provider(record.get("provider"), now),
        "cost": _cost(record.get("cost")),
        # newest first, as the dashboard's other lists
        "decisions": [
            _decision(d)
            for d in reversed(decisions if isinstance(decisions, list) else [])
            if isinstance(d, dict)
        ][:DECISIONS],
    }
