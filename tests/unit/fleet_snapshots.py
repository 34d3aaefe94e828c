"""Snapshots of the fleet as the hub's fleet keeper writes them (``fleet.json`` in the dashboard
folder, the schema of docs/autoscaling.md), and files that are not one: what the dashboard
and ``make status`` must read."""

from __future__ import annotations

import json

AT = 1_764_320_000.0

#: A round of a busy morning: one machine of every state, one on its way, a fixed machine of
#: the organizer's, one given up still in the cloud's group, the cloud's quota refused the last
#: grow, a price set.
SNAPSHOT = {
    "at": AT,
    "fleet": "on",
    "min": 0,
    "max": 4,
    "floor": 2,
    "group": 6,
    "machines": [
        {
            "name": "gpu-2",
            "state": "ready",
            "since": AT - 1000,
            "servers": 3,
            "free": 0,
            "slices": 3,
            "reason": "asked at 09:02 for 4 people in line",
        },
        {
            "name": "gpu-1",
            "state": "gone",
            "since": AT - 7200,
            "servers": 0,
            "free": 0,
            "slices": 3,
            "reason": "gpu-1 was removed by the provider",
        },
        {
            "name": "gpu-3",
            "state": "draining",
            "since": AT - 60,
            "servers": 0,
            "free": 3,
            "slices": 3,
            "reason": "gpu-3 has held no server for 15 min",
        },
        {
            "name": "gpu-4",
            "state": "leaving",
            "since": AT - 20,
            "servers": 0,
            "free": 0,
            "slices": 3,
            "reason": "gpu-4 is paused and still holds no server; the provider removes it",
        },
        {
            "name": "asked-7",
            "state": "asked",
            "since": AT - 30,
            "servers": 0,
            "free": 0,
            "slices": 0,
            "reason": "grow the group to 4 machines: 5 wait for 5 slices",
        },
        {"name": "gpu-5", "state": "booting", "since": AT - 90, "reason": "asked at 09:10"},
        {"name": "gpu-6", "state": "joining", "since": AT - 40, "reason": "asked at 09:08"},
        {
            "name": "own-1",
            "state": "ready",
            "since": AT - 9000,
            "servers": 2,
            "free": 1,
            "slices": 3,
            "reason": "fixed: joined without the group's mark; its slices count, never given back",
            "fixed": True,
        },
        {
            "name": "asked-3",
            "state": "given up",
            "since": AT - 100,
            "servers": 0,
            "free": 0,
            "slices": 0,
            "reason": "asked-3 was asked for 16 min ago and has not joined (limit 15 min); ...: "
            "remove it in the cloud's console, the hub cannot name it",
            "fixed": False,
        },
    ],
    "coming": {"machines": 3, "ready_in": 240.0},
    "provider": {
        "busy": False,
        "last": {
            "action": "grow",
            "at": AT - 10,
            "ok": False,
            "kind": "quota exceeded",
            "told": "grow the group to 4 failed (quota exceeded, exit status 1: ...): ...",
            "output": "Updated [...]\nERROR: (gcloud.compute.instance-groups.managed.resize) "
            "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 4.0 in region europe-west4.\n",
        },
        "blocked_until": AT + 590,
    },
    "cost": {
        "machine_hours": 12.5,
        "slice_hours_offered": 37.5,
        "slice_hours_used": 20.1,
        "price_per_hour": 2.5,
        "estimated": 31.25,
    },
    "decisions": [
        {"at": AT - 900, "action": "drain", "machine": "gpu-4", "target": 3, "reason": "first"},
        {
            "at": AT - 10,
            "action": "grow",
            "machine": "",
            "target": 4,
            "reason": "grow the group to 4 machines: 5 wait for 5 slices",
        },
    ],
}


def text(snapshot: dict = SNAPSHOT, **changes) -> str:
    """The file's text, with top-level keys changed (None: left out)."""
    record = {**snapshot, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not None})


#: Files that are no snapshot: the fleet is shown as off, never as an error.
NOT_SNAPSHOTS = {
    "missing": None,
    "empty": "",
    "cut short": text()[: len(text()) // 2],
    "garbage": "this is { not json",
    "not utf-8": b"\xff\xfe{\x00",
    "a list": "[1, 2]",
    "a string": '"fleet"',
    "without its time": text(at=None),
    "an older format": json.dumps({"time": AT, "machines": [{"name": "gpu-2"}]}),
    "time as text": text(at="2026-11-28T09:00:00Z"),
    "time not a number": '{"at": NaN, "machines": []}',
}
