"""The fleet's decisions (gpu_swarm_spawner/capacity.py), its schedule (schedule.py) and its cost
(cost.py): round by round on made-up fleets, then on a workshop day replayed without a cloud
(tests/unit/fleet_day.py) against a fixed fleet sized for the peak, with the cloud saying no,
a machine that never joins and a machine taken back."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from gpu_swarm_spawner import capacity, placement
from gpu_swarm_spawner.capacity import (
    DRAIN,
    GIVE_UP,
    GIVEN_UP,
    GROW,
    NOTHING,
    REMOVE,
    RESUME,
    Machine,
    Settings,
    arrival,
    boot_and_join,
    decide,
    on_its_way_message,
)
from gpu_swarm_spawner.contract import FLEET_GROUP, FLEET_LABEL
from gpu_swarm_spawner.cost import Span, usage
from gpu_swarm_spawner.schedule import Schedule, ScheduleError, read_schedule

from . import fleet_day
from .clusters import node, task
from .fleet_day import HOUR, MINUTE, ROUND_S, Provider, replay, workshop_day

NOW = 1_800_000_000.0  # some epoch second
SETTINGS = Settings(min_machines=0, max_machines=4, slices_per_machine=3, empty_for=600)


def ready(name, free=3, servers=0, since=NOW - 3600, last_server=None, slices=3):
    return Machine(
        name, "ready", since, servers=servers, free=free, slices=slices, last_server=last_server
    )


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def actions(decisions):
    return [(d.action, d.machine or d.target) for d in decisions]


# ---- the schedule -----------------------------------------------------------------------------


def test_the_schedule_reads_the_issues_spelling_and_the_short_one_alike():
    issue = read_schedule("10 machines from 08:45, 4 machines after 17:00")
    short = read_schedule("4 from 17:00; 10 from 8:45")
    assert issue.entries == short.entries == ((8 * 60 + 45, 10), (17 * 60, 4))
    assert issue.describe() == "10 from 08:45, 4 from 17:00 (UTC)"


@pytest.mark.parametrize(
    ("clock", "machines"),
    [("08:44", 4), ("08:45", 10), ("16:59", 10), ("17:00", 4), ("23:59", 4), ("03:00", 4)],
)
def test_each_entry_holds_from_its_minute_and_the_last_one_through_the_night(clock, machines):
    schedule = read_schedule("10 from 08:45, 4 from 17:00")
    assert schedule.at(utc(f"2026-11-27T{clock}")) == machines


def test_times_are_wall_clock_times_of_the_named_zone_in_summer_and_winter():
    berlin = read_schedule("10 from 08:45, 4 from 17:00", zone="Europe/Berlin")
    assert berlin.at(utc("2026-07-01T06:45")) == 10  # 08:45 summer time (UTC+2)
    assert berlin.at(utc("2026-07-01T06:44")) == 4
    assert berlin.at(utc("2026-01-15T07:45")) == 10  # 08:45 winter time (UTC+1)
    assert berlin.at(utc("2026-01-15T06:45")) == 4  # 07:45 there


def test_most_looks_ahead_to_the_next_rise():
    schedule = read_schedule("10 from 08:45, 4 from 17:00")
    at_0840 = utc("2026-11-27T08:40")
    assert schedule.most(at_0840, at_0840 + 300) == 10
    assert schedule.most(at_0840, at_0840 + 240) == 4
    assert Schedule().most(at_0840, at_0840 + 300) == 0


def test_no_schedule_asks_for_nothing():
    schedule = read_schedule("  ")
    assert schedule.entries == () and schedule.at(NOW) == 0
    assert schedule.describe() == "no schedule"


@pytest.mark.parametrize(
    ("text", "zone", "said"),
    [
        ("10 from 8.45", "UTC", "'10 from 8.45' is not an entry of the schedule; write machines"),
        ("ten from 08:45", "UTC", "e.g. '10 from 08:45, 4 from 17:00'"),
        ("10 from 24:00", "UTC", "'10 from 24:00' has no such time of day; write HH:MM"),
        ("10 from 08:60", "UTC", "has no such time of day"),
        ("10 from 08:45, 4 from 8:45", "UTC", "two entries start at 08:45; keep one of them"),
        ("10 from 08:45", "Berlin", "unknown time zone 'Berlin'; write an IANA name"),
    ],
)
def test_a_schedule_that_cannot_be_read_says_what_to_write(text, zone, said):
    with pytest.raises(ScheduleError, match="^GPUHUB_FLEET_SCHEDULE: ") as refused:
        read_schedule(text, zone, name="GPUHUB_FLEET_SCHEDULE")
    with pytest.raises(ScheduleError, match="^the schedule: "):
        read_schedule(text, zone)
    assert said in str(refused.value)


# ---- growing --------------------------------------------------------------------------------


def test_people_waiting_beyond_the_free_slices_grow_the_group_by_what_they_need():
    fleet = [ready("gpu-0", free=1)]
    [decision] = decide(NOW, fleet, [1] * 5, SETTINGS)
    assert (decision.action, decision.target) == (GROW, 3)  # 4 missing slices: 2 machines
    assert "5 wait for 5 slices" in decision.reason
    assert "1 slice free now and 0 machine(s) on their way" in decision.reason


def test_machines_on_their_way_are_counted_so_the_hub_never_asks_twice():
    coming = Machine("asked-1", "asked", NOW - 60, asked=NOW - 60)
    fleet = [ready("gpu-0", free=0), coming]
    assert actions(decide(NOW, fleet, [1, 1, 1], SETTINGS)) == [(NOTHING, 0)]
    assert "on their way" in decide(NOW, fleet, [1, 1, 1], SETTINGS)[0].reason
    assert actions(decide(NOW, fleet, [1, 1, 1, 1], SETTINGS)) == [(GROW, 3)]


def test_a_full_gpu_in_line_counts_its_slices():
    assert actions(decide(NOW, [ready("gpu-0", free=2)], [3], SETTINGS)) == [(GROW, 2)]


def test_the_margin_is_kept_free_for_the_next_arrivals():
    with_margin = Settings(max_machines=4, slices_per_machine=3, margin=2)
    assert actions(decide(NOW, [ready("gpu-0", free=1)], [], with_margin)) == [(GROW, 2)]
    assert "nobody waits and the fleet keeps 2 slices free" in (
        decide(NOW, [ready("gpu-0", free=1)], [], with_margin)[0].reason
    )
    assert actions(decide(NOW, [ready("gpu-0", free=2)], [], with_margin)) == [(NOTHING, 0)]


def test_in_a_rush_as_many_slices_are_kept_free_as_people_came_over_the_last_boot_and_join():
    rush = Settings(max_machines=4, slices_per_machine=8, margin=2, boot_and_join=300)
    fleet = [ready("gpu-0", free=6, servers=2, slices=8)]
    came = [NOW - 290, NOW - 200, NOW - 120, NOW - 60, NOW - 10, NOW - 5, NOW]  # 7 in 5 min
    [grow] = decide(NOW, fleet, [], rush, arrivals=came)
    assert (grow.action, grow.target) == (GROW, 2)  # 6 free do not cover the next 7
    assert (
        "nobody waits and 7 people came in the last 5 min, so 7 slices are kept free for the "
        "next; 6 slices free now" in grow.reason
    )
    # only the last boot-and-join counts: an hour's trickle is below the organizer's margin
    trickle = [NOW - 301, NOW - 600, NOW - 1200, NOW - 2400, NOW - 3000, NOW - 3500, NOW - 5]
    assert actions(decide(NOW, fleet, [], rush, arrivals=trickle)) == [(NOTHING, 0)]
    assert actions(decide(NOW, fleet, [], rush, arrivals=[NOW - 301, *came[1:]])) == [(NOTHING, 0)]
    # the window is the boot-and-join expected (learnt from the joins seen)
    quick = replace(rush, boot_and_join=60)
    assert actions(decide(NOW, fleet, [], quick, arrivals=came)) == [(NOTHING, 0)]


def test_the_margin_kept_in_a_rush_is_at_most_one_machines_and_never_below_the_organizers():
    rush = Settings(max_machines=10, slices_per_machine=3, margin=1, boot_and_join=300)
    burst = [NOW - 30] * 12  # a room pressed Start at once: 12 came
    fleet = [ready("gpu-0", free=0, servers=3)]
    [grow] = decide(NOW, fleet, [1] * 12, rush, arrivals=burst)
    # the line's 12 slices and one machine's 3 kept free: 5 machines, not 3 more for a forecast
    # of as many again
    assert (grow.action, grow.target) == (GROW, 6)
    assert "12 people came in the last 5 min, so 3 slices are kept free for the next (at " in (
        grow.reason
    )
    assert capacity.kept_free(12, rush) == 3 and capacity.kept_free(0, rush) == 1
    assert capacity.kept_free(2, rush) == 2
    assert capacity.kept_free(2, replace(rush, margin=5)) == 5  # the organizer's margin holds
    assert capacity.came_within(NOW, [NOW - 300, NOW - 299.5, NOW, NOW + 1], 300) == 2


def test_a_machine_is_not_given_back_while_a_rush_needs_its_slices():
    settings = Settings(max_machines=4, slices_per_machine=3, empty_for=600, margin=1)
    fleet = [ready("gpu-0", free=2, servers=1), ready("gpu-1", last_server=NOW - 900)]
    assert actions(decide(NOW, fleet, [], settings)) == [(DRAIN, "gpu-1")]
    came = [NOW - 100, NOW - 50, NOW - 20]  # 3 came: gpu-0's 2 free do not cover the next 3
    assert actions(decide(NOW, fleet, [], settings, arrivals=came)) == [(NOTHING, 0)]


def test_never_above_the_maximum_and_the_line_is_told_why():
    fleet = [ready(f"gpu-{i}", free=0) for i in range(4)]
    [decision] = decide(NOW, fleet, [1] * 7, SETTINGS)
    assert decision.action == NOTHING
    assert "at its maximum (4 machines)" in decision.reason
    [capped] = decide(NOW, fleet[:3], [1] * 7, SETTINGS)
    assert (capped.action, capped.target) == (GROW, 4)
    assert "held to the maximum, 4" in capped.reason


def test_the_minimum_and_the_schedule_are_floors_asked_for_one_boot_ahead():
    schedule = read_schedule("3 from 08:45, 1 from 17:00")
    settings = Settings(min_machines=1, max_machines=4, boot_and_join=300, schedule=schedule)
    early = decide(utc("2026-11-27T08:39"), [ready("gpu-0")], [], settings)
    assert actions(early) == [(NOTHING, 0)]
    [decision] = decide(utc("2026-11-27T08:41"), [ready("gpu-0")], [], settings)
    assert (decision.action, decision.target) == (GROW, 3)
    assert "at least 3 machines now (minimum 1, schedule: 3 from 08:45" in decision.reason
    assert actions(decide(utc("2026-11-27T20:00"), [], [], settings)) == [(GROW, 1)]


def test_while_the_cloud_said_no_nothing_is_asked_and_the_reason_says_when_again():
    fleet = [ready("gpu-0", free=0)]
    [decision] = decide(NOW, fleet, [1], SETTINGS, NOW + 300, "quota exceeded")
    assert decision.action == NOTHING
    assert "the cloud said no (quota exceeded); asking again in 5 min" in decision.reason
    assert actions(decide(NOW + 300, fleet, [1], SETTINGS, NOW + 300, "quota exceeded")) == [
        (GROW, 2)
    ]


def test_a_machine_that_never_joins_is_given_up_and_no_longer_counted():
    stuck = Machine("asked-1", "booting", NOW - 800, asked=NOW - 1000)
    fleet = [ready("gpu-0", free=0), stuck]
    decisions = decide(NOW, fleet, [1], SETTINGS)
    assert actions(decisions) == [(GIVE_UP, "asked-1"), (GROW, 2)]
    assert decisions[0].reason == (
        "asked-1 was asked for 17 min ago and has not joined (limit 15 min); it is no longer "
        "counted as on its way"
    )
    # within the limit it is still awaited, and while it is not late it covers the line
    within = [ready("gpu-0", free=0), Machine("asked-1", "booting", NOW, asked=NOW - 400)]
    assert actions(decide(NOW, within, [1], SETTINGS)) == [(NOTHING, 0)]


def test_a_machine_joined_by_hand_is_never_given_up():
    joining = Machine("by-hand", "joining", NOW - 5000)
    assert GIVE_UP not in [d.action for d in decide(NOW, [joining], [], SETTINGS)]


def test_a_late_machine_no_longer_covers_the_line_and_one_more_is_asked_once():
    late = Machine("asked-1", "asked", NOW - 7 * MINUTE, asked=NOW - 7 * MINUTE)
    fleet = [ready("gpu-0", free=0), late]
    [grow] = decide(NOW, fleet, [1], SETTINGS)  # usually 5 min: late after 7.5 min
    assert actions([grow]) == [(NOTHING, 0)]
    [grow] = decide(NOW + 40, fleet, [1], SETTINGS)
    assert (grow.action, grow.target) == (GROW, 3)  # asked-1 still in the group: one more
    assert grow.reason == (
        "grow the group to 3 machines: 1 wait for 1 slice and the fleet keeps 0 slices free; "
        "0 slices free now and 0 machine(s) on their way; asked-1 is late: asked 8 min ago, a "
        "machine usually joins in 5 min; one more asked in its place"
    )
    # the next rounds count the new one on its way: not asked twice for the same gap...
    fleet.append(Machine("asked-2", "asked", NOW + 40, asked=NOW + 40))
    assert actions(decide(NOW + 50, fleet, [1], SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW + 50, fleet, [1] * 3, SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW + 50, fleet, [1] * 4, SETTINGS)) == [(GROW, 4)]  # more people
    # ...nor when it is given up at the join limit: it was not counted for the line already
    given_up = decide(NOW + 490, fleet, [1], SETTINGS)  # asked 15 min 10 s ago
    assert actions(given_up) == [(GIVE_UP, "asked-1")]


def test_a_machine_is_late_past_half_as_long_again_as_the_expected_boot_and_join():
    assert capacity.late_after(300) == 450
    fleet = [ready("gpu-0", free=0), Machine("asked-1", "booting", NOW, asked=NOW - 450)]
    assert actions(decide(NOW, fleet, [1], SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW + 1, fleet, [1], SETTINGS)) == [(GROW, 3)]
    # the expected boot-and-join is the settings' (the keeper's: learnt from the joins seen)
    assert actions(decide(NOW + 1, fleet, [1], replace(SETTINGS, boot_and_join=301))) == [
        (NOTHING, 0)
    ]
    [quick] = decide(NOW - 385, fleet, [1], replace(SETTINGS, boot_and_join=40))
    assert "asked-1 is late: asked 65 s ago, a machine usually joins in 40 s" in quick.reason
    # a machine joined by hand was never asked for: never late
    by_hand = [ready("gpu-0", free=0), Machine("by-hand", "joining", NOW - 5000)]
    assert actions(decide(NOW, by_hand, [1], SETTINGS)) == [(NOTHING, 0)]


def test_a_late_machine_counts_in_the_groups_size_so_the_maximum_holds():
    fleet = [ready("gpu-0", free=0), Machine("asked-1", "asked", NOW - 600, asked=NOW - 600)]
    [held] = decide(NOW, fleet, [1], replace(SETTINGS, max_machines=2))
    assert held.reason == (
        "1 wait for 1 slice with 0 slices free, but the fleet is at its maximum (2 machines); "
        "asked-1 is late: asked 10 min ago, a machine usually joins in 5 min"
    )
    assert held.action == NOTHING


def test_a_late_machine_is_not_replaced_while_the_free_slices_or_the_others_cover_the_line():
    late = Machine("asked-1", "asked", NOW - 600, asked=NOW - 600)
    assert actions(decide(NOW, [ready("gpu-0", free=1), late], [1], SETTINGS)) == [(NOTHING, 0)]
    other = Machine("asked-2", "asked", NOW - 60, asked=NOW - 60)
    fleet = [ready("gpu-0", free=1), late, other]
    assert actions(decide(NOW, fleet, [1] * 4, SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW, fleet, [1] * 5, SETTINGS)) == [(GROW, 4)]
    # nobody waits: it still counts toward the margin, and nothing is asked in its place...
    margin = replace(SETTINGS, margin=3)
    assert actions(decide(NOW, [ready("gpu-0", free=0), late], [], margin)) == [(NOTHING, 0)]
    # ...but while people wait it covers neither them nor the margin kept for the next ones
    assert actions(decide(NOW, [ready("gpu-0", free=1), late], [1], margin)) == [(GROW, 3)]


def test_a_late_machine_that_joins_after_all_is_one_of_the_group_and_the_spare_is_given_back():
    # asked-1 was late, gpu-2 was asked in its place; asked-1 joined as gpu-1 and took the one
    # waiting: the group's three machines, gpu-2 given back once empty for empty_for
    fleet = [
        ready("gpu-0", free=0, servers=3),
        ready("gpu-1", free=2, servers=1, since=NOW, last_server=NOW),
        ready("gpu-2", since=NOW),
    ]
    assert actions(decide(NOW + 599, fleet, [], SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW + 600, fleet, [], SETTINGS)) == [(DRAIN, "gpu-2")]


# ---- the group's machines and the fixed ones ---------------------------------------------------


def test_fixed_machines_free_slices_cover_the_line_but_they_are_not_in_the_groups_size():
    fixed = [
        replace(ready("own-1", free=2), fixed=True),
        replace(ready("own-2", free=0), fixed=True),
    ]
    fleet = [*fixed, ready("gpu-0", free=0)]
    assert actions(decide(NOW, fleet, [1, 1], SETTINGS)) == [(NOTHING, 0)]
    [grow] = decide(NOW, fleet, [1] * 4, SETTINGS)
    assert (grow.action, grow.target) == (GROW, 2)  # the group's one, and one for 2 slices
    # no group machine at all: the group is grown from nothing, whatever the fixed ones
    assert actions(decide(NOW, fixed, [1] * 3, SETTINGS)) == [(GROW, 1)]
    # the maximum is the group's: two fixed machines do not use it up
    held = Settings(max_machines=1, slices_per_machine=3)
    assert actions(decide(NOW, fixed, [1] * 3, held)) == [(GROW, 1)]


def test_a_fixed_machine_not_ready_is_not_waited_for_nor_ever_given_up():
    joining = Machine("own-1", "joining", NOW - 5000, asked=NOW - 5000, fixed=True)
    assert actions(decide(NOW, [joining], [1], SETTINGS)) == [(GROW, 1)]
    assert capacity.arrival(NOW, [joining], 300) is None


def test_a_fixed_machine_is_never_given_back_and_the_floor_counts_the_groups_machines():
    settings = Settings(min_machines=1, max_machines=4, slices_per_machine=3, empty_for=600)
    own = replace(ready("own-1", free=3, since=NOW - 7200), fixed=True)  # the emptiest
    assert actions(decide(NOW, [own], [], settings)) == [(GROW, 1)]  # the minimum: the group's
    fleet = [own, ready("gpu-1"), ready("gpu-2")]
    [drain] = decide(NOW, fleet, [], replace(settings, margin=6))
    assert (drain.action, drain.machine) == (DRAIN, "gpu-1")  # own-1's slices cover the margin
    assert actions(decide(NOW, [own, ready("gpu-1")], [], settings)) == [(NOTHING, 0)]
    assert decide(NOW, [own, ready("gpu-1")], [], settings)[0].reason == (
        "1 machine(s) of the group and 1 fixed; none may go yet (floor 1)"
    )


def test_a_machine_given_up_unseen_stays_in_the_groups_size_until_the_organizer_removes_it():
    stuck = Machine("asked-1", "asked", NOW - 1000, asked=NOW - 1000)
    fleet = [ready("gpu-0", free=0), stuck]
    decisions = decide(NOW, fleet, [1], SETTINGS)
    # the cloud still holds it: growing to 2 would ask for nothing
    assert actions(decisions) == [(GIVE_UP, "asked-1"), (GROW, 3)]
    assert "1 machine(s) given up are still in the group" in decisions[1].reason
    given_up = Machine("asked-1", GIVEN_UP, NOW, asked=NOW - 1000)
    fleet = [ready("gpu-0", free=0, servers=3), given_up]
    assert actions(decide(NOW + 10, fleet, [1], SETTINGS)) == [(GROW, 3)]
    assert actions(decide(NOW + 10, fleet, [], SETTINGS)) == [(NOTHING, 0)]  # brings nothing
    [held] = decide(NOW + 10, fleet, [1], replace(SETTINGS, max_machines=2))
    assert held.reason.endswith("(2 machines, 1 of them given up but still in the group)")


def test_a_group_machine_down_counts_in_the_groups_size_and_is_given_back_after_a_boot():
    down = Machine("gpu-3", "gone", NOW - 200, asked=NOW - 5000)  # down for 200 s
    fleet = [ready("gpu-0", free=0, servers=3), down]
    assert actions(decide(NOW, fleet, [], SETTINGS)) == [(NOTHING, 0)]  # not yet
    [grow] = decide(NOW, fleet, [1], SETTINGS)
    # the cloud still has gpu-3: "grow to 2" would bring nothing
    assert (grow.action, grow.target) == (GROW, 3)
    assert grow.reason.endswith(
        "1 machine(s) down are still in the group until the hub gives them back"
    )
    # at the maximum with people waiting, the machine down stands between them and a new one:
    # given back once its servers are surely lost (DOWN_LEAST_S), not a boot-and-join later
    at_most = replace(SETTINGS, max_machines=2)
    just_down = replace(down, since=NOW - capacity.DOWN_LEAST_S)
    [held] = decide(NOW, [fleet[0], just_down], [1], at_most)
    assert held.reason.endswith("(2 machines, 1 of them down but still in the group)")
    assert actions(decide(NOW + 1, [fleet[0], just_down], [1], at_most)) == [(REMOVE, "gpu-3")]
    assert actions(decide(NOW, fleet, [], at_most)) == [(NOTHING, 0)]  # nobody waits: the bound
    # the bound: the expected boot-and-join, 300 s here
    assert actions(decide(NOW + 100, fleet, [], SETTINGS)) == [(NOTHING, 0)]  # at it
    [remove] = decide(NOW + 101, fleet, [], SETTINGS)
    assert (remove.action, remove.machine) == (REMOVE, "gpu-3")
    assert remove.reason == (
        "gpu-3 has been down for 5 min (limit 5 min): given back, a machine that stops "
        "answering is replaced, not repaired"
    )
    # people waiting: the grow first (the cloud makes a new one at once), counting it
    assert actions(decide(NOW + 101, fleet, [1], SETTINGS)) == [(GROW, 3), (REMOVE, "gpu-3")]
    # joins seen quicker than a minute: a blip of a minute still destroys nothing
    quick = replace(SETTINGS, boot_and_join=40)
    assert actions(decide(NOW - 140, fleet, [], quick)) == [(NOTHING, 0)]  # down 60 s
    assert actions(decide(NOW - 139, fleet, [], quick)) == [(REMOVE, "gpu-3")]


def test_a_machine_down_with_a_server_left_in_swarms_list_is_given_back_all_the_same():
    down = Machine("gpu-3", "gone", NOW - 1000, servers=1)  # a task Swarm still lists
    assert actions(decide(NOW, [down], [], SETTINGS)) == [(REMOVE, "gpu-3")]


def test_a_fixed_machine_down_is_never_given_back_nor_in_the_groups_size():
    own = Machine("own-1", "gone", NOW - 5000, fixed=True)
    fleet = [ready("gpu-0", free=0, servers=3), own]
    assert actions(decide(NOW, fleet, [], SETTINGS)) == [(NOTHING, 0)]
    assert actions(decide(NOW, fleet, [1], SETTINGS)) == [(GROW, 2)]


# ---- giving back ----------------------------------------------------------------------------


def test_the_machine_empty_the_longest_is_drained_when_the_others_cover_the_margin():
    settings = Settings(max_machines=4, slices_per_machine=3, empty_for=600, margin=3)
    fleet = [
        ready("gpu-0", free=1, servers=2),
        ready("gpu-1", last_server=NOW - 700),
        ready("gpu-2", last_server=NOW - 900),
    ]
    [decision] = decide(NOW, fleet, [], settings)
    assert (decision.action, decision.machine) == (DRAIN, "gpu-2")
    assert "gpu-2 has held no server for 15 min and the others' 4 slices free cover" in (
        decision.reason
    )


def test_a_machine_with_a_server_is_never_drained_however_long_ago_its_last_start():
    fleet = [ready("gpu-0", free=2, servers=1, last_server=NOW - 9000), ready("gpu-1")]
    assert actions(decide(NOW, fleet, [], SETTINGS)) == [(DRAIN, "gpu-1")]
    assert actions(decide(NOW, fleet[:1], [], SETTINGS)) == [(NOTHING, 0)]


def test_no_machine_goes_before_its_empty_time_nor_while_people_wait():
    fleet = [ready("gpu-0", last_server=NOW - 500), ready("gpu-1", free=0, servers=3)]
    assert actions(decide(NOW, fleet, [], SETTINGS)) == [(NOTHING, 0)]
    fleet = [ready("gpu-0", free=3, last_server=NOW - 5000), ready("gpu-1", free=0, servers=3)]
    assert DRAIN not in [d.action for d in decide(NOW, fleet, [1], SETTINGS)]


def test_no_machine_goes_when_the_others_would_not_cover_the_margin_or_the_floor():
    fleet = [ready("gpu-0", free=1, servers=2), ready("gpu-1")]
    tight = Settings(max_machines=4, slices_per_machine=3, margin=2)
    assert actions(decide(NOW, fleet, [], tight)) == [(NOTHING, 0)]
    floor = Settings(min_machines=2, max_machines=4, slices_per_machine=3)
    assert actions(decide(NOW, fleet, [], floor)) == [(NOTHING, 0)]


def test_one_machine_at_a_time_then_removed_when_still_empty():
    fleet = [ready("gpu-0"), ready("gpu-1"), Machine("gpu-2", "draining", NOW - 30, slices=3)]
    assert actions(decide(NOW, fleet, [], SETTINGS)) == [(REMOVE, "gpu-2")]
    leaving = [ready("gpu-0"), ready("gpu-1"), Machine("gpu-2", "leaving", NOW - 30)]
    assert actions(decide(NOW, leaving, [], SETTINGS)) == [(NOTHING, 0)]


def test_a_paused_machine_that_got_a_server_is_resumed_never_removed():
    raced = Machine("gpu-1", "draining", NOW - 30, servers=1, free=2, slices=3)
    assert actions(decide(NOW, [ready("gpu-0", free=0, servers=3), raced], [], SETTINGS)) == [
        (RESUME, "gpu-1")
    ]


def test_people_waiting_resume_a_paused_machine_before_a_new_one_is_asked_for():
    paused = Machine("gpu-1", "draining", NOW - 30, free=3, slices=3)
    decisions = decide(NOW, [ready("gpu-0", free=0, servers=3), paused], [1, 1], SETTINGS)
    assert actions(decisions) == [(RESUME, "gpu-1")]
    assert "2 wait for 2 slices; gpu-1 is resumed instead of being given back" in (
        decisions[0].reason
    )
    more = decide(NOW, [ready("gpu-0", free=0, servers=3), paused], [1] * 5, SETTINGS)
    assert actions(more) == [(RESUME, "gpu-1"), (GROW, 3)]
    covered = decide(NOW, [ready("gpu-0", free=2, servers=1), paused], [1, 1], SETTINGS)
    assert actions(covered) == [(REMOVE, "gpu-1")]  # the free slices cover them: it goes on


def test_an_unknown_state_or_impossible_settings_are_refused():
    with pytest.raises(ValueError, match="unknown machine state 'up'"):
        Machine("gpu-0", "up", NOW)
    with pytest.raises(ValueError, match=r"minimum \(5\) must be from 0 to its maximum \(4\)"):
        Settings(min_machines=5, max_machines=4)
    with pytest.raises(ValueError, match="at least 1 slice"):
        Settings(slices_per_machine=0)


# ---- the idle stop ---------------------------------------------------------------------------

IDLE = replace(SETTINGS, stop_idle_after=1200)


def idle(machine: str, *who: str, for_s: float = 1500) -> list[capacity.Server]:
    """Servers of ``who`` on ``machine``, idle for ``for_s`` seconds."""
    return [capacity.Server(w, machine, NOW - for_s) for w in who]


def stops(fleet, servers, line=(), settings=IDLE, going=()):
    found = capacity.idle_stop(NOW, fleet, servers, line, settings, going)
    return None if found is None else (found.machine, found.servers)


def test_a_machine_whose_servers_are_all_idle_is_emptied_so_that_it_can_be_given_back():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2", free=2, servers=1)]
    servers = idle("gpu-1", "bo", "al") + idle("gpu-2", "cy", for_s=60)
    found = capacity.idle_stop(NOW, fleet, servers, [], IDLE)
    assert (found.action, found.machine, found.servers) == ("stop idle", "gpu-1", ("al", "bo"))
    assert found.reason.startswith(
        "gpu-1's 2 servers idle for 25+ min (GPUHUB_FLEET_STOP_IDLE_AFTER: 20 min) and nobody "
        "waits; stopped so that the machine can be given back (files kept, kernels lost)"
    )


def test_it_is_off_at_0_the_default():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2")]
    servers = idle("gpu-1", "al", "bo", for_s=24 * 3600)
    assert Settings().stop_idle_after == 0
    assert stops(fleet, servers, settings=SETTINGS) is None
    assert stops(fleet, servers) == ("gpu-1", ("al", "bo"))


def test_never_a_machine_with_one_server_in_use_starting_or_unknown_to_the_hub():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2")]
    assert stops(fleet, idle("gpu-1", "al") + idle("gpu-1", "bo", for_s=1199)) is None  # in use
    starting = [capacity.Server("bo", "gpu-1", None)]
    assert stops(fleet, idle("gpu-1", "al") + starting) is None
    assert stops(fleet, idle("gpu-1", "al")) is None  # a task on it the hub does not know
    assert stops(fleet, idle("gpu-1", "al", "bo", for_s=1200)) == ("gpu-1", ("al", "bo"))


def test_never_a_fixed_machine_nor_one_not_ready():
    own = replace(ready("own-1", free=1, servers=2), fixed=True)
    assert stops([own, ready("gpu-2")], idle("own-1", "al", "bo")) is None
    paused = Machine("gpu-1", "draining", NOW - 30, servers=2, free=1, slices=3)
    assert stops([paused, ready("gpu-2")], idle("gpu-1", "al", "bo")) is None


def test_not_while_anyone_waits():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2")]
    assert stops(fleet, idle("gpu-1", "al", "bo"), line=[1]) is None


def test_not_below_the_floor_counting_only_the_group_machines_that_keep_servers():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2", free=2, servers=1)]
    servers = idle("gpu-1", "al", "bo") + idle("gpu-2", "cy", for_s=60)
    assert stops(fleet, servers, settings=replace(IDLE, min_machines=2)) is None
    assert stops(fleet, servers, settings=replace(IDLE, min_machines=1)) == ("gpu-1", ("al", "bo"))
    # an empty machine is given back anyway, and a fixed one is not the group's: neither counts
    more = fleet[:1] + [ready("gpu-3"), replace(ready("own-1"), fixed=True)]
    assert stops(more, servers[:2], settings=replace(IDLE, min_machines=1)) is None


def test_not_when_the_machines_that_stay_would_not_cover_the_margin():
    fleet = [ready("gpu-1", free=1, servers=2), ready("gpu-2", free=2, servers=1)]
    servers = idle("gpu-1", "al", "bo") + idle("gpu-2", "cy", for_s=60)
    assert stops(fleet, servers, settings=replace(IDLE, margin=3)) is None
    assert stops(fleet, servers, settings=replace(IDLE, margin=2)) == ("gpu-1", ("al", "bo"))
    # an empty group machine goes anyway; a fixed one's free slices stay and count
    empty = ready("gpu-3", free=3)
    assert stops(fleet + [empty], servers, settings=replace(IDLE, margin=3)) is None
    own = replace(ready("own-1", free=1), fixed=True)
    covered = stops(fleet + [own], servers, settings=replace(IDLE, margin=3))
    assert covered == ("gpu-1", ("al", "bo"))


def test_one_machine_a_round_the_one_idle_longest_and_never_one_already_emptied():
    fleet = [ready("gpu-1", free=2, servers=1), ready("gpu-2", free=2, servers=1), ready("gpu-3")]
    servers = idle("gpu-1", "al", for_s=1300) + idle("gpu-2", "bo", for_s=1800)
    assert stops(fleet, servers) == ("gpu-2", ("bo",))
    # gpu-2's servers were stopped; its tasks may still show: it counts as given back
    assert stops(fleet, servers, going={"gpu-2"}) == ("gpu-1", ("al",))
    assert stops(fleet, servers, settings=replace(IDLE, min_machines=1), going={"gpu-2"}) is None


@pytest.fixture
def hub_clock_in_berlin(monkeypatch):
    """The hub's clock (its process's local time, TZ) on Berlin's winter time."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_participant_whose_idle_server_was_stopped_reads_when_after_how_long_and_why(
    hub_clock_in_berlin,
):
    # NOW is 08:00 UTC, 09:00 in Berlin; 20 min 59 s without activity: 20 minutes
    told = capacity.idle_stop_message(NOW + 3 * 60, 20 * 60 + 59)
    assert told == (
        "Stopped at 09:03 after 20 minutes without activity, so that its GPU "
        "machine could be given back. Your files are kept; start your server again when you "
        "are back."
    )
    assert "after 1 minute without activity" in capacity.idle_stop_message(NOW, 60)
    assert "after 1 minute without activity" in capacity.idle_stop_message(NOW, 30)


# ---- what the line is told ------------------------------------------------------------------


def test_the_boot_and_join_time_is_the_median_of_the_recent_joins():
    assert boot_and_join([], 300) == 300
    assert boot_and_join([200, 400, 250], 300) == 250
    assert boot_and_join([9999] * 5 + [100] * 10, 300) == 100  # only the last 10


def test_the_line_is_told_when_the_first_machine_on_its_way_is_likely_ready():
    fleet = [
        ready("gpu-0"),
        Machine("asked-1", "asked", NOW - 60, asked=NOW - 60),
        Machine("asked-2", "booting", NOW - 10, asked=NOW - 120),
    ]
    assert arrival(NOW, fleet, 360) == 240
    assert on_its_way_message(arrival(NOW, fleet, 360)) == (
        "A GPU machine is on its way (about 4 minutes)."
    )
    overdue = [Machine("asked-1", "joining", NOW, asked=NOW - 400)]
    assert arrival(NOW, overdue, 300) == 60  # past its time, not late yet: never negative
    assert arrival(NOW, [ready("gpu-0")], 300) is None
    assert on_its_way_message(None) == ""


# ---- cost -----------------------------------------------------------------------------------


def test_machine_hours_and_cost_beside_the_slice_hours_used():
    machines = [Span(0, 2 * HOUR, 4), Span(HOUR, None, 4)]
    servers = [Span(0, HOUR, 1), Span(HOUR, 3 * HOUR, 2)]
    used = usage(machines, servers, now=3 * HOUR, price_per_hour=14)
    assert used.machine_hours == 4
    assert (used.slice_hours_offered, used.slice_hours_used) == (16, 5)
    assert used.cost == 56
    assert used.describe() == (
        "4.0 machine-hours, 5.0 of 16.0 slice-hours used (31%), about $56.00 at $14 an hour"
    )
    assert usage(machines, servers, now=3 * HOUR).describe().endswith("used (31%)")
    assert usage([], [], now=0).used_share == 0
    assert usage([Span(0, 5 * HOUR, 1)], [], now=HOUR).machine_hours == 1  # up to now only


def test_a_negative_price_is_refused():
    with pytest.raises(ValueError, match="cannot be negative"):
        usage([], [], 0, price_per_hour=-1)


# ---- a workshop day, replayed ---------------------------------------------------------------
#
# The day and the organizer's settings are fleet_day's (its docstring says where each number
# comes from): 48 participants, machines of 8 slices, a fixed fleet of 6 from 08:30 to 17:30.

#: Issue 41's goal: at most this share of the fixed fleet's machine-hours.
GOAL_SHARE = 0.6
DAY = fleet_day.ORGANIZER


@pytest.fixture(scope="module")
def day():
    """The day with the culler at its default (lunch outlasted): fixed, spread, pack, instant."""
    sessions = workshop_day()
    return sessions, fleet_day.figures(sessions)


@pytest.fixture(scope="module")
def lunch_culled():
    """The day with a culler shorter than lunch, so that machines empty while people eat."""
    sessions = workshop_day(idle_timeout=fleet_day.LUNCH_CULLED)
    return sessions, fleet_day.figures(sessions)


def test_the_replayed_day_has_a_morning_of_arrivals_a_lunch_dip_and_an_afternoon_that_empties():
    people = fleet_day.workshop_people()

    def working(hour):
        return sum(any(a <= hour * HOUR < b for a, b in p.active()) for p in people)

    assert len(people) == fleet_day.PEOPLE == fleet_day.FIXED * fleet_day.SLICES
    assert 8.75 * HOUR <= min(p.arrive for p in people) < 9 * HOUR  # before the tutorial starts
    assert 10 * HOUR < max(p.arrive for p in people) <= 11 * HOUR  # late arrivals
    assert working(8.7) == 0 and working(9.25) == 36 and working(11) == 48
    assert working(13) < 12 < working(14) and working(14) > 30  # most break, most come back
    assert working(15.75) <= working(14) / 2 + 6 and working(17) == 0  # they leave


def test_the_default_culler_outlasts_lunch_and_a_shorter_one_ends_the_servers_while_people_eat():
    people = fleet_day.workshop_people()
    kept = workshop_day()  # GPUHUB_IDLE_TIMEOUT's default, 90 min
    culled = workshop_day(idle_timeout=fleet_day.LUNCH_CULLED)

    def held(sessions, hour):
        return sum(1 for s in sessions if s.start <= hour * HOUR < s.end)

    assert len(kept) == len(people)  # one server each, all day
    assert held(kept, 13.25) == 48 and held(kept, 14.5) < 48  # those who left at lunch culled
    assert held(culled, 13.25) < 12  # only those working through lunch
    returning = sum(1 for p in people if p.back is not None)
    assert len(culled) == len(people) + returning  # a new server after lunch
    assert all(s.end <= fleet_day.DAY_END for s in kept + culled)


def test_the_culler_ends_a_server_at_its_first_check_past_the_timeout():
    lunch = 12.5 * HOUR + 10  # 12:30:10
    assert fleet_day.culled(lunch, 5400) == 14 * HOUR + MINUTE  # 14:00:10 due, checked 14:01
    assert fleet_day.culled(12.5 * HOUR, 5400) == 14 * HOUR  # due on a check
    one = fleet_day.Person("ada", 9 * HOUR, 16 * HOUR, lunch=12.5 * HOUR, back=13.5 * HOUR)
    assert fleet_day.servers_of([one], 5400) == [
        fleet_day.Session("ada", 9 * HOUR, 17.5 * HOUR)  # due 17:30: the organizer stops it
    ]
    assert fleet_day.servers_of([one], 1800) == [
        fleet_day.Session("ada", 9 * HOUR, 13 * HOUR),
        fleet_day.Session("ada", 13.5 * HOUR, 16.5 * HOUR),
    ]
    assert fleet_day.servers_of([one], 0) == [fleet_day.Session("ada", 9 * HOUR, 17.5 * HOUR)]


def test_the_fixed_fleet_is_sized_for_the_peak_and_paid_all_day(day):
    _, days = day
    fixed = days["fixed"]
    assert fixed.p95_wait() == 0 and fixed.unserved == 0
    assert fixed.machine_hours == pytest.approx(fleet_day.FIXED * 9)  # 08:30 to 17:30
    assert fixed.usage.cost == pytest.approx(fleet_day.FIXED * 9 * fleet_day.PRICE)


@pytest.mark.parametrize("policy", ["spread", "pack"])
@pytest.mark.parametrize("culler", ["day", "lunch_culled"])
def test_the_driven_fleet_keeps_the_wait_within_one_boot_of_the_fixed_fleets(
    policy, culler, request
):
    _, days = request.getfixturevalue(culler)
    driven = days[policy]
    assert driven.unserved == 0
    assert 0 < driven.p95_wait() <= days["fixed"].p95_wait() + DAY.boot_and_join


@pytest.mark.parametrize("policy", ["spread", "pack"])
def test_no_server_is_ended_by_a_machine_given_back(lunch_culled, policy):
    _, days = lunch_culled
    driven = days[policy]
    removed = [d for _, d in driven.decisions if d.action == REMOVE]
    assert len(removed) >= 3  # machines were given back at lunch and in the afternoon
    assert driven.servers_ended_by_removal == 0


def test_the_driven_fleet_pays_for_fewer_machine_hours_near_what_an_instant_cloud_would(
    day, lunch_culled
):
    """An instant cloud (machines ready at once, given back the moment they empty) is the best
    a fleet can do without moving servers; the driven fleet stays within a boot, an empty
    quarter of an hour and the machine asked ahead at the rush's end (``capacity.kept_free``)
    of it."""
    for (_, days), most in ((day, 0.96), (lunch_culled, 0.87)):
        fixed = days["fixed"].machine_hours
        for policy in placement.POLICIES:
            share = days[policy].machine_hours / fixed
            assert share < most
            assert share <= days["instant"].machine_hours / fixed + 0.07


def test_pack_lets_a_machine_empty_where_spread_keeps_two_busy():
    """Four participants on a fleet of two machines: ``pack`` (the hub's placement, imported by
    the replay) puts them on one and the other is given back; ``spread`` keeps both."""
    sessions = [fleet_day.Session(f"p{i}", 8.5 * HOUR + i * MINUTE, 11 * HOUR) for i in range(1, 5)]
    fleet = Settings(max_machines=2, slices_per_machine=8, empty_for=10 * MINUTE)
    packed = replay(sessions, settings=fleet, start_machines=2, policy="pack")
    spread = replay(sessions, settings=fleet, start_machines=2, policy="spread")
    all_day = [replace(s, end=fleet_day.DAY_END) for s in sessions]
    for policy, held in (("pack", [0, 4]), ("spread", [2, 2])):
        assert sorted(len(b.servers) for b in replay(all_day, fixed=2, policy=policy).boxes) == held
    assert [b.gone_at is not None and b.gone_at < 9 * HOUR for b in packed.boxes].count(True) == 1
    assert all(b.gone_at is None or b.gone_at > 11 * HOUR for b in spread.boxes)
    assert packed.machine_hours < spread.machine_hours - 1.5
    assert packed.p95_wait() == spread.p95_wait() == 0


def test_no_fleet_whose_servers_stay_put_reaches_issue_41s_goal_on_this_day(day, lunch_culled):
    """Why the goal below is expected to fail: even servers moved at will, every minute, onto
    the fewest machines ready at once would need more than 0.6 of the fixed fleet's hours,
    with the culler at its default (a server outlives its participant by 90 minutes) or at half
    an hour; the hub's fleet cannot do better than that, nor than an instant cloud."""
    for sessions, days in (day, lunch_culled):
        fixed = days["fixed"].machine_hours
        assert fleet_day.packed_machine_hours(sessions) > GOAL_SHARE * fixed + 3
        assert fleet_day.packed_machine_hours(sessions) < days["instant"].machine_hours


@pytest.mark.xfail(
    strict=True,
    reason="issue 41's 0.6 is not reached on this day: servers cannot move and the culler "
    "keeps each for 90 min after its participant's last activity, so a machine is paid until "
    "its last participant leaves plus the culler's time; the hub's fleet pays 0.95 of the "
    "fixed fleet's hours under spread and 0.94 under pack, an instant cloud 0.92, and servers "
    "moved at will would still need 0.81 (with a 30-minute culler: the hub's 0.86 spread and "
    "0.85 pack, an instant cloud 0.80, servers moved 0.68; the idle stop "
    "(GPUHUB_FLEET_STOP_IDLE_AFTER) at 15 minutes: 0.89 under pack)",
)
def test_issue_41s_machine_hours_goal(day):
    _, days = day
    best = min(days[policy].machine_hours for policy in placement.POLICIES)
    assert best <= GOAL_SHARE * days["fixed"].machine_hours


def test_quota_refusals_are_told_backed_off_and_the_line_served_once_the_cloud_says_yes():
    refusing = Provider(refuse=lambda now: "quota exceeded" if now < 9.5 * HOUR else "")
    driven = replay(workshop_day(), settings=DAY, provider=refusing, start_machines=1)
    told = [when for when, what in driven.told if what == "quota exceeded"]
    assert told and min(told) < 9 * HOUR
    gaps = [b - a for a, b in zip(told, told[1:])]
    assert min(gaps) >= refusing.backoff_s  # backed off, not asked every round
    blocked = [d for _, d in driven.decisions if "the cloud said no (quota exceeded)" in d.reason]
    assert blocked  # the dashboard's reason while it waits
    assert driven.unserved == 0 and driven.servers_ended_by_removal == 0
    assert max(driven.waits) > 30 * MINUTE  # people waited for the cloud...
    assert max(driven.waits) < 50 * MINUTE  # ...and were served once it said yes


def test_a_machine_that_never_joins_is_given_up_within_its_bound_and_replaced():
    stuck = Provider(never_joins=1)
    driven = replay(workshop_day(), settings=DAY, provider=stuck, start_machines=1)
    never = next(b for b in driven.boxes if b.ready_at == float("inf"))
    given_up = [t for t, d in driven.decisions if d.action == GIVE_UP and d.machine == never.name]
    assert given_up and given_up[0] - never.asked <= DAY.join_within + fleet_day.ROUND_S
    # in the group (and paid for) until the organizer removes it, when the hub stops counting it
    assert never.gone_at == pytest.approx(given_up[0] + DAY.join_within, abs=fleet_day.TICK_S)
    assert driven.unserved == 0


@pytest.mark.parametrize(
    ("culler", "counted", "replaced"), [("day", 420, 210), ("lunch_culled", 345, 135)]
)
def test_people_wait_less_behind_a_machine_that_never_joins_once_it_is_late(
    culler, counted, replaced, request, monkeypatch
):
    """The machine that never joins is asked for at 08:47, for the margin kept as the 09:00
    rush begins (5 people came in the 5 minutes before), and due at 08:52. Counted as on its
    way until it was given up at 15 minutes (the rule before a machine could be late), the p95
    wait was ``counted``; with one more asked once it is late, from 08:55, ``replaced``."""
    sessions, _ = request.getfixturevalue(culler)
    stuck = replay(sessions, settings=DAY, provider=Provider(never_joins=1), start_machines=1)
    never = next(b for b in stuck.boxes if b.ready_at == float("inf"))
    assert never.asked == 8 * HOUR + 47 * MINUTE
    when, grow = next((t, d) for t, d in stuck.decisions if f"{never.name} is late" in d.reason)
    assert grow.action == GROW and when == 8 * HOUR + 55 * MINUTE  # the first round past 7.5 min
    assert stuck.p95_wait() == replaced and stuck.unserved == 0
    monkeypatch.setattr(capacity, "late_after", lambda expected: float("inf"))
    before = replay(sessions, settings=DAY, provider=Provider(never_joins=1), start_machines=1)
    assert before.p95_wait() == counted


@pytest.mark.parametrize(
    ("culler", "policy", "plain", "stuck", "share"),
    [
        ("day", "spread", (210, 0.932), (360, 0.939), (60, 0.952, 210, 0.942)),
        ("day", "pack", (210, 0.932), (360, 0.939), (60, 0.941, 210, 0.942)),
        ("lunch_culled", "spread", (195, 0.837), (285, 0.847), (45, 0.863, 135, 0.856)),
        ("lunch_culled", "pack", (195, 0.832), (285, 0.839), (45, 0.848, 135, 0.849)),
    ],
)
def test_the_margin_kept_in_the_rush_cuts_the_wait_for_a_machine_asked_ahead_at_its_end(
    culler, policy, plain, stuck, share, request, monkeypatch
):
    """The p95 wait and the share of the fixed fleet's machine-hours, on the plain day and with
    a machine that never joins: ``share`` with the margin kept in a rush (``kept_free``),
    ``plain`` and ``stuck`` with the organizer's 2 slices alone. The rush's margin asks for
    machines as the rush comes rather than for the line once it waits; what it costs is the
    last machine, asked at the rush's end for arrivals that slow down then (an hour before
    the late arrivals fill it; under ``pack`` it is given back empty and asked again)."""
    sessions, _ = request.getfixturevalue(culler)
    fixed = fleet_day.FIXED * 9

    def measured(provider=None):
        driven = replay(sessions, settings=DAY, provider=provider, start_machines=1, policy=policy)
        assert driven.unserved == 0 and driven.servers_ended_by_removal == 0
        return driven.p95_wait(), round(driven.machine_hours / fixed, 3)

    assert (*measured(), *measured(Provider(never_joins=1))) == share
    monkeypatch.setattr(capacity, "kept_free", lambda came, settings: settings.margin)
    assert (measured(), measured(Provider(never_joins=1))) == (plain, stuck)


def test_issue_41s_wait_goal_with_a_machine_that_never_joins(day, lunch_culled):
    """Within one boot-and-join of the fixed fleet's with the culler at its default and at half
    an hour: the margin kept in the rush asks for the machines the rush needs as it comes, so a
    machine that never joins is one of several on their way, and is replaced once late."""
    for sessions, days in (day, lunch_culled):
        stuck = replay(sessions, settings=DAY, provider=Provider(never_joins=1), start_machines=1)
        assert stuck.p95_wait() <= days["fixed"].p95_wait() + DAY.boot_and_join


def lost_at_eleven(how: str):
    """The day with its busiest machine of the morning lost at 11:00, ``how`` ("take_back" or
    "dies", ``replay``'s): the day and that machine."""
    sessions = workshop_day()
    before = replay(sessions, settings=DAY, start_machines=1)
    busy = max((b for b in before.boxes if b.asked and b.asked < 10 * HOUR), key=lambda b: b.slices)
    driven = replay(sessions, settings=DAY, start_machines=1, **{how: (11 * HOUR, busy.name)})
    return driven, next(b for b in driven.boxes if b.name == busy.name)


def test_a_machine_taken_back_is_a_machine_gone_and_its_participants_start_again():
    driven, taken = lost_at_eleven("take_back")
    assert taken.state == "gone" and taken.gone_at == pytest.approx(11 * HOUR, abs=15)
    assert driven.restarted > 0  # its participants were in line again
    assert driven.unserved == 0 and driven.servers_ended_by_removal == 0
    grown_after = [d for t, d in driven.decisions if d.action == GROW and t >= 11 * HOUR]
    assert grown_after  # a machine asked for in its place


def test_a_machine_that_dies_is_given_back_and_a_grow_brings_a_real_machine_in_its_place():
    driven, dead = lost_at_eleven("dies")
    assert driven.restarted > 0 and driven.unserved == 0  # its participants served elsewhere
    (removed,) = [t for t, d in driven.decisions if d.action == REMOVE and d.machine == dead.name]
    # its participants wait in line and the group is at its maximum with it: given back once
    # its servers are surely lost (at the next round), not before, not a boot-and-join later
    assert (
        11 * HOUR + capacity.DOWN_LEAST_S < removed <= 11 * HOUR + capacity.DOWN_LEAST_S + ROUND_S
    )
    assert dead.gone_at == removed  # paid for until then
    # a real machine is asked at the next round
    after = [b for b in driven.boxes if b.asked >= 11 * HOUR and b.ready_at <= 11 * HOUR + HOUR]
    assert after and after[0].asked <= removed + ROUND_S
    # those who lost their server waited the bound and a boot: 420 s (660 s with the bound a
    # boot-and-join)
    assert driven.p95_wait() <= capacity.DOWN_LEAST_S + DAY.boot_and_join + 2 * ROUND_S


def test_the_fleet_requires_shared_homes_in_the_replay_as_in_the_hub():
    sessions = [fleet_day.Session("ada", 9 * HOUR, 10 * HOUR)]
    with pytest.raises(ValueError, match="requires shared homes"):
        replay(sessions, settings=DAY, start_machines=1, shared_homes=False)
    with pytest.raises(ValueError, match="needs the fleet's settings and people"):
        replay(sessions, fixed=1, fleet_idle=15 * MINUTE, people=fleet_day.workshop_people())


def test_a_culled_lunchs_returners_are_placed_like_anyone_so_pack_saves_over_spread(lunch_culled):
    """Shared homes: a returner is no longer sent back to their home volume's machine, so
    ``pack`` fills the busy machines and lets the others empty sooner than ``spread``."""
    _, days = lunch_culled
    assert days["pack"].machine_hours < days["spread"].machine_hours - 0.2


# ---- the idle stop (GPUHUB_FLEET_STOP_IDLE_AFTER) in the replay ----------------------------
#
# fleet_day.fleet_idle_stops: idle servers stopped early only where that lets a machine go.


def _box(name, servers, state="ready", slices=8):
    return fleet_day.Box(name, state, 0.0, 0.0, slices, 0.0, dict.fromkeys(servers, 20 * HOUR))


def test_the_fleet_aware_culler_stops_a_machine_only_when_all_its_people_are_away_and_it_can_go():
    now = 11 * HOUR
    people = {
        "ada": fleet_day.Person("ada", 9 * HOUR, now - 20 * MINUTE),  # gone 20 min ago
        "bob": fleet_day.Person("bob", 9 * HOUR, now - 30 * MINUTE),
        "cy": fleet_day.Person("cy", 9 * HOUR, 12 * HOUR),  # at work
        "dee": fleet_day.Person("dee", 9 * HOUR, now - 20 * MINUTE),
    }
    boxes = [
        _box("gpu-0", ["ada", "bob"]),
        _box("gpu-1", ["cy"]),
        _box("gpu-2", ["dee", "cy2"]),
        _box("gpu-3", []),  # empty: soon given back, so not one that stays
    ]
    people["cy2"] = replace(people["cy"], who="cy2")
    fleet = Settings(min_machines=1, max_machines=4, slices_per_machine=8, margin=2)

    def stops(idle_for=15 * MINUTE, waiting=0, settings=fleet):
        found = fleet_day.fleet_idle_stops(now, boxes, waiting, settings, people, idle_for)
        return [b.name for b in found]

    assert stops() == ["gpu-0"]  # gpu-2 holds someone at work; gpu-1 too
    assert stops(idle_for=25 * MINUTE) == []  # ada has been away 20 minutes only
    assert stops(waiting=1) == []  # its slices are wanted: it would not be given back
    assert stops(settings=replace(fleet, min_machines=3)) == []  # the floor holds it
    assert stops(settings=replace(fleet, margin=14)) == []  # the others' 13 free: too few
    people["cy2"] = replace(people["dee"], who="cy2")
    assert stops() == ["gpu-0", "gpu-2"]  # both may go: gpu-1 still covers the margin
    assert stops(settings=replace(fleet, margin=8)) == ["gpu-0"]  # gpu-0's 8 free count


def test_whoever_comes_back_to_a_server_the_fleet_aware_culler_stopped_starts_a_new_one():
    """Two participants share a machine of 2 slices and take a half-hour break; a third works
    on another. After 15 idle minutes the pair's servers are stopped, the machine is given back,
    and on their return one finds the other machine's free slice, the other waits a boot."""
    away = ((10 * HOUR, 10.5 * HOUR),)
    people = [
        fleet_day.Person("ada", 9 * HOUR, 12 * HOUR, breaks=away),
        fleet_day.Person("bob", 9 * HOUR + MINUTE, 12 * HOUR, breaks=away),
        fleet_day.Person("cy", 9 * HOUR + 2 * MINUTE, 12 * HOUR),
    ]
    sessions = fleet_day.servers_of(people)
    fleet = Settings(min_machines=1, max_machines=2, slices_per_machine=2, empty_for=5 * MINUTE)
    kept = replay(sessions, settings=fleet, start_machines=1, slices=2)
    culled = replay(
        sessions, settings=fleet, start_machines=1, slices=2, people=people, fleet_idle=15 * MINUTE
    )
    assert kept.stopped_early == [] and kept.came_back == 0
    assert culled.stopped_early[:2] == [(10.25 * HOUR, "ada"), (10.25 * HOUR, "bob")]
    assert all(when > 12 * HOUR for when, _ in culled.stopped_early[2:])  # all gone at noon
    assert culled.came_back == 2
    assert sorted(culled.came_back_waits)[0] == 0  # cy's machine had a free slice
    assert fleet.boot_and_join <= sorted(culled.came_back_waits)[1] <= fleet.boot_and_join + 60
    assert culled.machine_hours < kept.machine_hours - 0.1
    # a stopped server's slice-hours end when it is stopped: the pair's quarter-hours away
    assert culled.usage.slice_hours_used <= kept.usage.slice_hours_used - 2 * 0.25
    assert culled.servers_ended_by_removal == 0 and culled.unserved == 0
    longer = replay(
        sessions, settings=fleet, start_machines=1, slices=2, people=people, fleet_idle=HOUR
    )
    assert longer.came_back == 0  # the break was shorter than its hour
    assert all(when > 12 * HOUR for when, _ in longer.stopped_early)


@pytest.mark.parametrize("idle", fleet_day.FLEET_IDLE)
def test_on_the_day_the_fleet_aware_culler_stops_only_servers_of_people_away(idle):
    people = fleet_day.workshop_people()
    for day_people in (people, fleet_day.with_break(people, *fleet_day.AFTERNOON_BREAK)):
        by_who = {p.who: p for p in day_people}
        for policy in placement.POLICIES:
            day = fleet_day.fleet_idle_day(fleet_day.IDLE_TIMEOUT, idle, policy, day_people)
            assert day.stopped_early
            for when, who in day.stopped_early:
                since = by_who[who].idle_since(when)
                assert since is not None and when - since >= idle
            assert day.servers_ended_by_removal == 0 and day.unserved == 0


def test_a_fleet_aware_culler_of_15_minutes_saves_a_twentieth_of_the_day_and_costs_a_break(day):
    """The variant on the day, the hub's culler at its default: those it stops have left for
    the day, nobody comes back to a stopped server, and the wait is the hub's; a 20-minute
    afternoon break (not part of the day) is where it costs people their kernels."""
    _, days = day
    fixed = days["fixed"].machine_hours
    breaking = fleet_day.with_break(fleet_day.workshop_people(), *fleet_day.AFTERNOON_BREAK)
    for policy in placement.POLICIES:
        culled = fleet_day.fleet_idle_day(fleet_day.IDLE_TIMEOUT, 15 * MINUTE, policy)
        assert culled.machine_hours / fixed <= days[policy].machine_hours / fixed - 0.05
        assert culled.came_back == 0 and culled.p95_wait() == days[policy].p95_wait()
        assert culled.machine_hours / fixed > GOAL_SHARE + 0.25  # no nearer issue 41's goal
        for idle, came_back in ((15 * MINUTE, 15), (20 * MINUTE, 0)):
            on_break = fleet_day.fleet_idle_day(fleet_day.IDLE_TIMEOUT, idle, policy, breaking)
            assert on_break.came_back == came_back


def test_the_rounds_reasons_are_dashboard_sentences(lunch_culled):
    _, days = lunch_culled
    said = {d.action for _, d in days["pack"].decisions}
    assert {GROW, DRAIN, REMOVE} <= said
    assert all(d.reason and d.reason[0].isalnum() for _, d in days["pack"].decisions)
    assert capacity.STATES[0] == "asked"


def test_the_fleets_settings_are_made_from_the_settings_values():
    """capacity.fleet_settings: what the hub makes of cfg.fleet_* (test_settings.py reads those)."""
    values = dict(
        min_machines=1,
        max_machines=5,
        schedule="10 from 08:45, 4 from 17:00",
        timezone="Europe/Berlin",
        empty_for=600,
        margin=2,
        slices_per_machine=0,
        slices_per_gpu=3,
        boot_and_join=300,
        join_within=900,
    )
    made = capacity.fleet_settings(**values)
    assert made.schedule == read_schedule("10 from 08:45, 4 from 17:00", "Europe/Berlin")
    assert (made.min_machines, made.max_machines, made.margin) == (1, 5, 2)
    assert (made.empty_for, made.boot_and_join, made.join_within) == (600.0, 300.0, 900.0)
    assert made.slices_per_machine == 3  # 0: none seen yet, GPUHUB_SLICES_PER_GPU stands in
    assert capacity.fleet_settings(**{**values, "slices_per_machine": 8}).slices_per_machine == 8
    with pytest.raises(ScheduleError, match="^GPUHUB_FLEET_SCHEDULE: '10 from 8.45'"):
        capacity.fleet_settings(**{**values, "schedule": "10 from 8.45"})


# ---- the swarm read into the fleet (observe) --------------------------------------------------


def _gpu_node(name, slices=3, state="ready", availability="active", group=True):
    """A GPU machine of the cloud's group (its start-up script's mark), or a fixed one."""
    made = node(f"id-{name}", name, {f"GPU-{name}": slices}, state, availability)
    if group:
        made["Description"]["Engine"] = {"Labels": {FLEET_LABEL: FLEET_GROUP}}
    return made


def _server(name, slices=1, labels=None):
    made = task(f"id-{name}", {f"GPU-{name}": slices} if slices else {})
    made["Spec"]["ContainerSpec"] = {"Labels": labels or {}}
    return made


def _cpu_node():
    return node("id-manager", "manager", {})  # no GPU: not a machine of the fleet


def test_observe_counts_servers_and_free_slices_and_leaves_the_organizers_paused_machines_out():
    nodes = [
        _gpu_node("gpu-1"),
        _gpu_node("gpu-2", availability="pause"),  # paused by the organizer, not by the hub
        _gpu_node("gpu-3", state="down"),
        _cpu_node(),
    ]
    anchor = _server("gpu-1", 0, {"com.docker.stack.namespace": "gpuhub"})  # the stack's own
    seen = capacity.observe(NOW, nodes, [_server("gpu-1", 2), anchor], {}, [])
    by_name = {m.name: m for m in seen.machines}
    assert set(by_name) == {"gpu-1", "gpu-3"}
    assert (by_name["gpu-1"].state, by_name["gpu-1"].servers, by_name["gpu-1"].free) == (
        "ready",
        1,
        1,
    )
    assert by_name["gpu-3"].state == "gone"
    assert seen.used == 2
    # the organizer's pause is not a machine leaving: the hub still knows it when it is back
    again = capacity.observe(NOW + 10, nodes, [], seen.memory | {"gpu-2": seen.memory["gpu-1"]},
                             [capacity.Asked("asked-1", NOW)])  # fmt: skip
    assert "gpu-2" in again.memory and again.left == [] and again.joined == []


def test_observe_gives_a_new_machine_the_place_of_the_oldest_one_asked_for():
    asked = [capacity.Asked("asked-2", NOW - 100), capacity.Asked("asked-1", NOW - 300)]
    seen = capacity.observe(NOW, [_gpu_node("gpu-9")], [], {}, asked)
    assert seen.joined == [("gpu-9", 300.0)]
    assert [a.name for a in seen.asked] == ["asked-2"]
    assert seen.memory["gpu-9"].asked == NOW - 300
    assert [m.state for m in seen.machines] == ["ready", "asked"]


def test_observe_tells_the_groups_machines_by_their_mark_and_the_others_are_fixed():
    nodes = [_gpu_node("own-1", group=False), _gpu_node("gpu-1"), _cpu_node()]
    asked = [capacity.Asked("asked-1", NOW - 200)]
    seen = capacity.observe(NOW, nodes, [_server("own-1", 2), _server("gpu-1", 1)], {}, asked)
    by_name = {m.name: m for m in seen.machines}
    assert {n: m.fixed for n, m in by_name.items()} == {"own-1": True, "gpu-1": False}
    assert seen.joined == [("gpu-1", 200.0)]  # the fixed one took no asked-for machine's place
    assert seen.memory["own-1"].fixed and seen.memory["own-1"].reason.startswith("fixed")
    assert seen.used == 1  # the group's slice-hours: the fixed machine's are the organizer's
    # alone, the fixed machine still takes no asked-for machine's place
    seen = capacity.observe(NOW, nodes[:1], [], {}, asked)
    assert [a.name for a in seen.asked] == ["asked-1"] and seen.joined == []


def test_observe_gives_a_machine_joining_late_the_place_of_one_given_up():
    given_up = [capacity.GivenUp("asked-1", NOW - 2000, NOW - 1000)]
    seen = capacity.observe(NOW, [], [], {}, [], given_up=given_up)
    assert seen.given_up == given_up
    assert [(m.name, m.state) for m in seen.machines] == [("asked-1", GIVEN_UP)]
    seen = capacity.observe(NOW, [_gpu_node("gpu-7")], [], {}, [], given_up=given_up)
    assert seen.given_up == [] and seen.joined == []  # too late to be a join's measure
    assert seen.memory["gpu-7"].start == NOW - 2000  # paid for since it was asked for
    assert seen.memory["gpu-7"].reason == "joined 17 min after it was given up"
    seen = capacity.observe(NOW, [_gpu_node("own-1", group=False)], [], {}, [], given_up=given_up)
    assert seen.given_up == given_up  # a fixed machine is not the one given up


def test_observe_pauses_again_a_machine_whose_removal_did_not_happen():
    leaving = capacity.Memory("id-gpu-1", "leaving", NOW - 1000, NOW - 9000, hub="leaving",
                              hub_at=NOW - 1000)  # fmt: skip
    paused = _gpu_node("gpu-1", availability="pause")
    seen = capacity.observe(NOW, [paused], [], {"gpu-1": leaving}, [], leave_within=900)
    assert seen.machines[0].state == "draining"  # the next round asks the provider again
    seen = capacity.observe(NOW, [paused], [], {"gpu-1": leaving}, [], leave_within=1200)
    assert seen.machines[0].state == "leaving"


def test_a_new_machine_brings_the_slices_most_machines_have():
    memory = {
        n: capacity.Memory(f"id-{n}", "ready", NOW, NOW, slices=s)
        for n, s in (("a", 4), ("b", 4), ("c", 8))
    }
    assert capacity.learnt_slices(memory, 3) == 4
    assert capacity.learnt_slices({}, 3) == 3
    own = {n: capacity.Memory(f"id-{n}", "ready", NOW, NOW, slices=8, fixed=True) for n in "xyz"}
    assert capacity.learnt_slices(memory | own, 3) == 4  # the organizer's own are another kind
    assert capacity.learnt_slices(own, 3) == 3


def test_the_line_reads_the_clouds_refusal_before_any_machine_on_its_way():
    coming = [Machine("asked-1", "asked", NOW - 60, asked=NOW - 60)]
    assert (
        capacity.for_the_line(NOW, coming, 300) == "A GPU machine is on its way (about 4 minutes)."
    )
    assert capacity.for_the_line(NOW, coming, 300, "No more.") == "No more."
    assert capacity.for_the_line(NOW, [], 300) == ""


def test_while_the_grow_command_runs_the_line_reads_that_the_hub_is_asking():
    """Not "on its way" before the cloud said yes; a machine it said yes to before, or its
    refusal, is what the line reads all the same."""
    said_yes = [Machine("asked-1", "asked", NOW - 60, asked=NOW - 60)]
    assert capacity.for_the_line(NOW, [], 300, asking=True) == (
        "The hub is asking the cloud for a GPU machine."
    )
    assert capacity.for_the_line(NOW, said_yes, 300, asking=True).startswith(
        "A GPU machine is on its way"
    )
    assert capacity.for_the_line(NOW, [], 300, "No more.", asking=True) == "No more."


def test_the_line_is_not_promised_minutes_by_a_late_machine():
    # asked 900 s ago, a boot-and-join of 300 s: late (past 1.5 x 300 s); nothing else coming
    late = Machine("asked-1", "joining", NOW, asked=NOW - 900)
    assert capacity.for_the_line(NOW, [late], 300) == capacity.LATE_MESSAGE
    assert "minute" not in capacity.LATE_MESSAGE
    # the machine asked in its place is the one to wait for: its own minutes are told
    instead = Machine("asked-2", "asked", NOW - 60, asked=NOW - 60)
    assert arrival(NOW, [late, instead], 300) == 240
    assert capacity.for_the_line(NOW, [late, instead], 300) == (
        "A GPU machine is on its way (about 4 minutes)."
    )
    # overdue but not late yet: still the minute it may take
    overdue = Machine("asked-1", "joining", NOW, asked=NOW - 400)
    assert capacity.for_the_line(NOW, [overdue], 300) == (
        "A GPU machine is on its way (about 1 minute)."
    )
    # a refusal still comes first, and nothing coming is nothing said
    assert capacity.for_the_line(NOW, [late], 300, refused="No GPUs.") == "No GPUs."
    assert capacity.for_the_line(NOW, [], 300) == ""
