"""The fleet's snapshot (``fleet.json``, written by the hub's fleet keeper) read for the views
(``fleet_view.read``): what the keeper writes, in the organizer's words; what is not a
snapshot, as no fleet; a key missing, as unknown; an old snapshot, as stale."""

from __future__ import annotations

import json

import pytest

from gpu_swarm_spawner import fleet_view, provider

from .fleet_snapshots import AT, NOT_SNAPSHOTS, SNAPSHOT, text


def test_the_keepers_snapshot_reads_in_the_organizers_words():
    fleet = fleet_view.read(text(), now=AT + 5)
    assert (fleet["at"], fleet["age"], fleet["stale"], fleet["stale_line"]) == (AT, 5.0, False, "")
    assert (fleet["fleet"], fleet["min"], fleet["max"], fleet["floor"]) == ("on", 0, 4, 2)
    shown = [(m["name"], m["words"], m["taking"], m["out"]) for m in fleet["machines"]]
    assert shown == [
        ("gpu-2", "taking servers", True, False),
        ("gpu-3", "paused (given back if it stays empty)", False, True),
        ("gpu-4", "being given back", False, True),
        ("asked-7", "asked for", False, False),
        ("gpu-5", "booting", False, False),
        ("gpu-6", "joining the swarm", False, False),
        ("own-1", "taking servers (fixed: yours, never given back)", True, False),
        ("asked-3", "given up (never joined; still in the cloud's group)", False, True),
        ("gpu-1", "down (no answer; given back if it stays down)", False, True),  # last
    ]
    assert [m["fixed"] for m in fleet["machines"]] == [None] * 6 + [True, False, None]
    assert fleet["group"] == 6
    assert fleet["group_line"] == (
        "The cloud's group: 6 machine(s), as the hub counts it; 1 fixed machine(s) of yours "
        "beside it"
    )
    gpu2 = fleet["machines"][0]
    assert (gpu2["since"], gpu2["servers"], gpu2["free"], gpu2["slices"]) == (AT - 1000, 3, 0, 3)
    assert gpu2["reason"] == "asked at 09:02 for 4 people in line"
    assert fleet["coming"] == {
        "machines": 3,
        "ready_in": 240.0,
        "ready_at": AT + 240,
        "line": "3 machine(s) on their way, ready in about 4 minutes",
    }
    # the cloud's refusal: its kind, what to do, the command's last line that says something
    last = fleet["provider"]["last"]
    assert (last["failed"], last["kind"], last["action"], last["at"]) == (
        True,
        "quota exceeded",
        "grow",
        AT - 10,
    )
    assert last["advice"] == provider.ADVICE[provider.QUOTA]
    assert last["output"].startswith("ERROR: (gcloud.compute.instance-groups.managed.resize)")
    assert (fleet["provider"]["blocked"], fleet["provider"]["blocked_until"]) == (True, AT + 590)
    assert fleet["cost"]["line"] == (
        "12.5 machine-hours, 20.1 of 37.5 slice-hours used (54%), about $31.25 at $2.5 an hour"
    )
    assert [(d["action"], d["machine"], d["target"]) for d in fleet["decisions"]] == [
        ("grow", "", 4),  # newest first
        ("drain", "gpu-4", 3),
    ]
    json.dumps(fleet)  # the dashboard's data call sends it as is


@pytest.mark.parametrize("case", sorted(NOT_SNAPSHOTS))
def test_what_is_not_a_snapshot_is_no_fleet(case):
    assert fleet_view.read(NOT_SNAPSHOTS[case], now=AT) is None


def test_a_key_missing_or_of_the_wrong_type_is_unknown_not_an_error():
    bare = fleet_view.read(json.dumps({"at": AT}), now=AT)
    assert (bare["min"], bare["max"], bare["floor"], bare["fleet"]) == (None, None, None, None)
    assert bare["group"] is None
    assert bare["group_line"] == "The cloud's group: unknown machine(s), as the hub counts it"
    assert bare["machines"] == [] and bare["decisions"] == [] and bare["coming"] is None
    assert bare["provider"] == {
        "busy": None,
        "last": None,
        "blocked_until": None,
        "blocked": False,
    }
    assert bare["cost"]["line"] == "unknown (the snapshot has no cost figures)"

    odd = {
        "at": AT,
        "min": "two",
        "max": -1,
        "floor": 1.5,
        "group": "six",
        "machines": [
            "gpu-9",
            {"state": "rebooting", "servers": True, "free": "3", "fixed": "yes"},
            {},
        ],
        "coming": {"ready_in": "soon"},
        "provider": {"busy": "no", "last": {"ok": False}, "blocked_until": "later"},
        "cost": {"machine_hours": "12"},
        "decisions": [None, {"action": 3}],
    }
    fleet = fleet_view.read(json.dumps(odd), now=AT)
    assert (fleet["min"], fleet["max"], fleet["floor"]) == (None, None, None)
    strange, empty = fleet["machines"]  # what is not a machine is left out
    assert (strange["name"], strange["words"], strange["taking"]) == (None, "rebooting", False)
    assert (strange["servers"], strange["free"], strange["since"]) == (None, None, None)
    assert strange["fixed"] is None and fleet["group"] is None
    assert empty["words"] is None and empty["reason"] is None
    assert fleet["coming"]["line"] == "unknown machine(s) on their way, ready in an unknown time"
    assert fleet["coming"]["ready_at"] is None
    last = fleet["provider"]["last"]  # a failure with nothing said: the general advice
    assert (last["kind"], last["advice"], last["output"]) == (
        "failed",
        provider.ADVICE[provider.UNKNOWN],
        None,
    )
    assert fleet["provider"]["busy"] is None and not fleet["provider"]["blocked"]
    assert fleet["cost"]["machine_hours"] is None
    assert fleet["decisions"] == [
        {"at": None, "action": None, "machine": "", "target": None, "reason": None}
    ]


def test_a_call_that_worked_is_no_failure_and_an_unknown_kind_keeps_the_keepers_line():
    worked = {**SNAPSHOT["provider"], "last": {"action": "grow", "at": AT, "ok": True, "kind": ""}}
    fleet = fleet_view.read(text(provider=worked), now=AT)
    assert not fleet["provider"]["last"]["failed"] and fleet["provider"]["last"]["advice"] is None
    told = "remove gpu-3 failed (a new kind): ask the organizer's cloud"
    new_kind = {"last": {"ok": False, "kind": "a new kind", "told": told}}
    last = fleet_view.read(text(provider=new_kind), now=AT)["provider"]["last"]
    assert (last["kind"], last["advice"]) == ("a new kind", told)


def test_a_snapshot_older_than_a_minute_is_stale_with_its_age():
    assert not fleet_view.read(text(), now=AT + 60)["stale"]
    fleet = fleet_view.read(text(), now=AT + 150)
    assert fleet["stale"] and fleet["age"] == 150
    assert fleet["stale_line"].startswith("The fleet's snapshot is 2 minutes old: the hub's fleet")
    assert fleet["provider"]["blocked"]  # its end, 590 s after the snapshot, is to come
    over = fleet_view.read(text(), now=AT + 600)
    assert over["stale"] and not over["provider"]["blocked"]  # its end has passed


def test_the_cost_without_a_price_names_the_setting_that_gives_an_estimate():
    for price in (None, 0, -3):
        cost = {**SNAPSHOT["cost"], "price_per_hour": price, "estimated": None}
        line = fleet_view.read(text(cost=cost), now=AT)["cost"]["line"]
        assert line == (
            "12.5 machine-hours, 20.1 of 37.5 slice-hours used (54%); set "
            "GPUHUB_FLEET_PRICE_PER_HOUR for an estimate"
        )


def test_no_machine_on_its_way_is_no_coming_line():
    assert fleet_view.read(text(coming={"machines": 0, "ready_in": None}), now=AT)["coming"] is None
    assert fleet_view.read(text(coming=None), now=AT)["coming"] is None


def test_a_fixed_machine_down_is_not_said_to_be_given_back():
    snapshot = json.loads(text())
    snapshot["machines"] = [{"name": "own-1", "state": "gone", "fixed": True}]
    (own,) = fleet_view.read(json.dumps(snapshot), now=AT)["machines"]
    assert own["words"] == "down (no answer) (fixed: yours, never given back)"
    assert own["out"] is True
