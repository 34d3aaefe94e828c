"""The day replay on the bed (tests/bench/bench_fleet.py), its pure parts: the compressed
clock, the day's peak, the participants' moves against a fake hub, when the dashboard tells of
each failure, and which servers a give-back ended."""

from __future__ import annotations

import pytest

from gpu_swarm_spawner.events import Event
from tests.bench import bench_fleet
from tests.bench.bench_fleet import (
    Clock,
    Failure,
    Participants,
    Result,
    day_of,
    given_back_endings,
    machine_shown_gone,
    peak,
    shows,
)
from tests.integration import bed_cloud
from tests.unit.fleet_day import DAY_START, HOUR, IDLE_TIMEOUT, MINUTE, Session, workshop_day


def test_one_hour_of_the_day_lasts_the_given_seconds():
    clock = Clock(t0=1000.0, hour=60.0)
    assert clock.day(1000.0) == DAY_START
    assert clock.day(1060.0) == DAY_START + HOUR
    assert clock.real(DAY_START + 2.5 * HOUR) == 1150.0
    assert clock.seconds(20 * MINUTE) == 20.0


def test_the_peak_is_the_most_sessions_at_once():
    sessions = [
        Session("a", 0, 10),
        Session("b", 5, 15),
        Session("c", 10, 20),
        Session("d", 12, 13),
    ]
    assert peak(sessions) == 3  # b, c and d at 12 (a ended at 10 as c began)
    assert peak([]) == 0
    day = workshop_day(16)
    assert 12 <= peak(day) <= 16


def test_each_participants_sessions_in_order():
    sessions = [Session("a", 50, 60), Session("b", 10, 20), Session("a", 0, 30)]
    assert day_of(sessions) == [
        [Session("a", 0, 30), Session("a", 50, 60)],
        [Session("b", 10, 20)],
    ]


class FakeHub:
    """The hub's API as the participants use it: what they asked, answered as told."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.status = 202

    def api(self, method, path, **kwargs):
        self.calls.append((method, path))
        status = self.status if method == "POST" and path.endswith("/server") else 204
        return type("R", (), {"status_code": status, "text": ""})()


def people(sessions, hour=60.0):
    result = Result("test", 1)
    return Participants(FakeHub(), Clock(0.0, hour), sessions, result), result


READY = {"ready": True, "state": {"gpu_node": "fresh11"}}
WAITING = {"ready": False}


def test_a_participant_asks_waits_works_reports_and_leaves_to_the_culler():
    start, end = DAY_START + HOUR, DAY_START + 3 * HOUR  # 60 s and 180 s of real time
    p, result = people([Session("ann", start, end)])
    p.tick(30.0, {})
    assert p.hub.calls == []  # not yet
    p.tick(60.0, {})
    assert p.hub.calls == [("POST", "/users/ann/server")] and p.asked == {"ann": 60.0}
    p.tick(61.0, {"ann": WAITING})  # in line
    p.tick(75.0, {"ann": READY})
    assert result.waits == [15.0] and p.node == {"ann": "fresh11"}
    p.tick(76.0, {"ann": READY})
    assert p.hub.calls[-1] == ("POST", "/users/ann/activity")
    p.tick(78.0, {"ann": READY})  # reported 2 s ago: not again yet
    assert p.hub.calls[-1] == ("POST", "/users/ann/activity") and len(p.hub.calls) == 2
    leaves = 180.0 - IDLE_TIMEOUT * 60 / HOUR  # 90 s: stops reporting
    p.tick(leaves + 10, {"ann": READY})
    assert len(p.hub.calls) == 2
    p.tick(leaves + 21, {})  # the culler ended it
    assert p.working == {} and p.ended == [] and result.not_culled == 0


def test_a_server_ended_under_a_working_participant_is_asked_for_again():
    p, result = people([Session("bo", DAY_START, DAY_START + 5 * HOUR)])
    p.tick(1.0, {})
    p.tick(2.0, {"bo": READY})
    p.tick(100.0, {})  # its machine taken back
    assert p.ended == [("bo", "fresh11", 100.0)]
    assert p.hub.calls[-1] == ("POST", "/users/bo/server") and p.asked == {"bo": 100.0}


def test_a_server_the_culler_left_is_stopped_and_counted():
    p, result = people([Session("cy", DAY_START, DAY_START + 3 * HOUR)])  # the culler's 90 min in
    p.tick(1.0, {})
    p.tick(2.0, {"cy": READY})
    p.tick(180.0 + 11.0, {"cy": READY})  # 10 minutes of the day after its end
    assert result.not_culled == 1 and p.hub.calls[-1] == ("DELETE", "/users/cy/server")


def test_one_still_in_line_when_the_session_ends_is_unserved():
    p, result = people([Session("di", DAY_START, DAY_START + 3 * HOUR)])
    p.tick(1.0, {})
    p.tick(181.0, {"di": WAITING})
    assert result.unserved == 1 and p.hub.calls[-1] == ("DELETE", "/users/di/server")


def test_the_second_session_follows_the_first():
    morning = Session("ed", DAY_START, DAY_START + 3 * HOUR)  # works 1.5 h, then the culler's
    afternoon = Session("ed", DAY_START + 4 * HOUR, DAY_START + 7 * HOUR)
    p, result = people([afternoon, morning])
    p.tick(1.0, {})
    p.tick(2.0, {"ed": READY})
    p.tick(170.0, {})  # culled after lunch began
    assert p.working == {}
    p.tick(241.0, {})
    assert p.hub.calls[-1] == ("POST", "/users/ed/server") and len(result.waits) == 1


# ---- what the dashboard tells ----------------------------------------------------------------


def test_a_machine_is_shown_gone_when_no_entry_with_a_state_names_it_or_one_reads_gone():
    state = {
        "machines": [{"name": "fresh11", "state": "ready"}],
        "fleet": {"decisions": [{"action": "drain", "machine": "fresh12"}]},
    }
    assert not machine_shown_gone(state, "fresh11")
    assert machine_shown_gone(state, "fresh12")  # only named by a decision: no state
    state["machines"][0]["state"] = "gone"
    assert machine_shown_gone(state, "fresh11")
    assert machine_shown_gone({"machines": [{"name": "fresh11", "status": "down"}]}, "fresh11")


def test_each_failure_is_told_by_its_own_words():
    refusal = bed_cloud.recorded(bed_cloud.NO_CAPACITY_TEXT)
    told = {"provider": {"last": {"kind": "no capacity", "told": "grow the group to 2 failed"}}}
    assert not shows(told, Failure("refused", 0), refusal)  # without the cloud's words
    told["provider"]["last"]["output"] = refusal.strip().splitlines()[-1].strip()
    assert shows(told, Failure("refused", 0), refusal)
    told["provider"]["last"]["kind"] = "quota exceeded"
    assert not shows(told, Failure("refused", 0), refusal)
    assert shows({"provider": {"last": {"kind": "hung"}}}, Failure("hung", 0), refusal)
    reason = "asked-3 was asked for 15 min ago and has not joined (limit 15 min)"
    assert shows({"decisions": [{"reason": reason}]}, Failure("never joins", 0), refusal)
    gone = Failure("taken back", 0, note="fresh12")
    assert shows({"machines": []}, gone, refusal)
    assert not shows({"machines": [{"name": "fresh12", "state": "ready"}]}, gone, refusal)


def test_a_failure_is_late_by_the_time_from_known_to_told():
    assert Failure("hung", 0.0, known=100.0, told=104.5).late() == 4.5
    assert Failure("hung", 0.0, known=100.0).late() is None


def test_servers_ended_on_a_machine_after_it_was_asked_to_go_are_counted():
    removed = {"fresh11": 500.0}
    events = [
        Event(400.0, "stopped", "ann", node="fresh11"),  # before: its participant's stop
        Event(501.0, "healed", "bo", node="fresh11"),  # after: ended by the give-back
        Event(502.0, "stopped", "cy", node="fresh12"),  # another machine
        Event(503.0, "started", "di", node="fresh11"),
    ]
    assert [e.user for e in given_back_endings(events, removed)] == ["bo"]


def test_the_refusal_the_bench_injects_is_read_as_no_capacity():
    from gpu_swarm_spawner.provider import NO_CAPACITY, classify

    assert classify(bed_cloud.recorded(bed_cloud.NO_CAPACITY_TEXT)) == NO_CAPACITY
    assert bench_fleet.HUNG_TRIES == 3


@pytest.mark.parametrize("hour", [60.0, 120.0])
def test_the_culler_waits_the_replays_90_minutes_compressed(hour):
    assert Clock(0.0, hour).seconds(IDLE_TIMEOUT) == 90 * hour / 60
