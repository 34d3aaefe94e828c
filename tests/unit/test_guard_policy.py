"""The GPU guard's decision (worker_setup/guard_policy.py): pure, so each rule is a round or a
few rounds of ``decide`` on hand-made readings. Its settings (GuardSettings) are the contract's
(gpu_swarm_spawner/contract.py), which the organizer's settings check with the same rules."""

from __future__ import annotations

import pytest

from gpu_swarm_spawner.contract import GuardSettings
from worker_setup.guard_policy import (
    Budget,
    GPUProcess,
    GuardState,
    Reading,
    Report,
    Stop,
    Warn,
    decide,
)

GPU_A = "GPU-8d2c0000-0000-0000-0000-000000000001"
GPU_B = "GPU-41f00000-0000-0000-0000-000000000002"
#: alice and bob share GPU_A, 8000 MB each; carol holds GPU_B
BUDGETS = {"jy-alice": Budget(GPU_A, 8000), "jy-bob": Budget(GPU_A, 8000),
           "jy-carol": Budget(GPU_B, 24000)}  # fmt: skip
ENFORCE = GuardSettings(mode="enforce", warn_percent=100, stop_percent=110, grace_seconds=60)
WARN = GuardSettings(mode="warn", warn_percent=100, stop_percent=110, grace_seconds=60)


def reading(*processes: tuple, gpus=(GPU_A, GPU_B)) -> Reading:
    """``reading((pid, owner, used_mb), (pid, owner, used_mb, gpu), ...)``; GPU_A by default."""
    return Reading(frozenset(gpus), tuple(
        GPUProcess(p[0], p[3] if len(p) > 3 else GPU_A, p[2], p[1]) for p in processes
    ))  # fmt: skip


def rounds(settings, *steps, budgets=BUDGETS):
    """Run ``(now, reading)`` steps one after the other; the actions of each, and the state."""
    state, out = None, []
    for now, seen in steps:
        decision = decide(seen, budgets, settings, now, state)
        out.append(decision.actions)
        state = decision.state
    return out, state


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


# -- settings


def test_the_defaults_warn_and_never_stop():
    assert GuardSettings() == GuardSettings("warn", 100.0, 110.0, 60.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "kill"}, "GPUHUB_GUARD_MODE is 'kill'; write one of: off, warn, enforce"),
        (
            {"warn_percent": 0},
            "GPUHUB_GUARD_WARN_PERCENT is 0; write a percentage of the budget above 0, e.g. 100",
        ),  # fmt: skip
        (
            {"warn_percent": 120, "stop_percent": 110},
            "GPUHUB_GUARD_STOP_PERCENT is 110, below "
            "GPUHUB_GUARD_WARN_PERCENT (120); write at least 120, e.g. 132",
        ),  # fmt: skip
        (
            {"grace_seconds": -1},
            "GPUHUB_GUARD_GRACE_SECONDS is -1; write 0 or more seconds, e.g. 60",
        ),  # fmt: skip
        ({"grace_seconds": float("nan")}, "GPUHUB_GUARD_GRACE_SECONDS is nan; write a number"),
        ({"stop_percent": "110"}, "GPUHUB_GUARD_STOP_PERCENT is '110'; write a number"),
        ({"warn_percent": True}, "GPUHUB_GUARD_WARN_PERCENT is True; write a number"),
    ],
)
def test_invalid_settings_say_what_to_write(kwargs, message):
    with pytest.raises(ValueError) as raised:
        GuardSettings(**kwargs)
    assert str(raised.value).startswith(message)


def test_every_problem_is_told_at_once():
    with pytest.raises(ValueError) as raised:
        GuardSettings(mode="on", warn_percent=-5, grace_seconds=-2)
    assert str(raised.value).count("; write") == 3


def test_equal_lines_and_no_grace_are_valid():
    assert GuardSettings("enforce", 100, 100, 0).grace_seconds == 0


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        ENFORCE.mode = "off"  # type: ignore[misc]


def test_parse_reads_the_organizers_values():
    values = {"GPUHUB_GUARD_MODE": " Enforce ", "GPUHUB_GUARD_WARN_PERCENT": "95%",
              "GPUHUB_GUARD_STOP_PERCENT": "120", "GPUHUB_GUARD_GRACE_SECONDS": "30"}  # fmt: skip
    assert GuardSettings.parse(values) == GuardSettings("enforce", 95, 120, 30)
    assert GuardSettings.parse({}) == GuardSettings()


def test_the_guards_own_defaults_are_the_ones_settings_env_declares():
    """A GPU machine joined without --guard-* options runs the guard with its own defaults; they
    are deploy/settings.env's, and the join line passes only the settings that differ."""
    from pathlib import Path

    from deploy.settings import read_defaults
    from gpu_swarm_spawner import contract

    env = Path(__file__).resolve().parents[2] / "deploy" / "settings.env"
    defaults = {key: value for key, (value, _line) in read_defaults(str(env)).items()}
    assert GuardSettings.parse({k: defaults[k] for k in contract.GUARD_KEYS}) == GuardSettings()
    assert int(defaults["GPUHUB_GUARD_METRICS_PORT"]) == contract.GUARD_METRICS_PORT
    guard_keys = {key for key in defaults if key.startswith("GPUHUB_GUARD_")}
    assert guard_keys == {*contract.GUARD_KEYS, "GPUHUB_GUARD_METRICS_PORT"}


def test_parse_names_each_bad_value():
    with pytest.raises(ValueError) as raised:
        GuardSettings.parse(
            {
                "GPUHUB_GUARD_GRACE_SECONDS": "a minute",
                "GPUHUB_GUARD_STOP_PERCENT": "inf",
                "GPUHUB_GUARD_MODE": "strict",
            }
        )
    message = str(raised.value)  # fmt: skip
    assert "GPUHUB_GUARD_GRACE_SECONDS is 'a minute'; write a number, e.g. 60" in message
    assert "GPUHUB_GUARD_STOP_PERCENT is 'inf'; write a number, e.g. 100" in message
    assert "GPUHUB_GUARD_MODE is 'strict'; write one of: off, warn, enforce" in message


# -- within budget, warnings


def test_within_budget_nothing_happens():
    [actions], state = rounds(ENFORCE, (0, reading((10, "jy-alice", 7000), (11, "jy-alice", 1000))))
    assert actions == ()
    assert state == GuardState()


def test_exactly_on_the_warn_line_is_within():
    settings = GuardSettings("enforce", 50, 50, 0)
    [actions], _ = rounds(settings, (0, reading((10, "jy-alice", 4000))))
    assert actions == ()
    [actions], _ = rounds(settings, (0, reading((10, "jy-alice", 4001))))
    assert kinds(actions) == ["Warn", "Stop"]


def test_over_budget_warns_with_the_numbers_and_every_process_most_memory_first():
    seen = reading((10, "jy-alice", 3000), (11, "jy-alice", 5500), (12, "jy-bob", 2000))
    [actions], state = rounds(ENFORCE, (100, seen))
    assert actions == (Warn("jy-alice", GPU_A, 8500, 8000, (11, 10), 100, True, 160),)
    assert state.over_since == {"jy-alice": 100}


def test_the_total_counts_all_processes_each_within_budget():
    [actions], _ = rounds(WARN, (0, reading((10, "jy-alice", 4500), (11, "jy-alice", 4500))))
    assert kinds(actions) == ["Warn"]
    assert actions[0].used_mb == 9000


def test_warnings_go_on_each_round_and_only_the_first_is_first():
    seen = reading((10, "jy-alice", 8500))
    out, _ = rounds(WARN, (0, seen), (5, seen), (10, seen))
    assert [a[0].first for a in out] == [True, False, False]
    assert [a[0].over_since for a in out] == [0, 0, 0]
    assert [a[0].stop_at for a in out] == [None, None, None], "warn mode stops never"


def test_warn_mode_never_stops_however_far_over_and_however_long():
    seen = reading((10, "jy-alice", 80000))
    out, _ = rounds(WARN, (0, seen), (3600, seen), (86400, seen))
    assert [kinds(a) for a in out] == [["Warn"]] * 3


def test_off_does_nothing_and_keeps_nothing():
    settings = GuardSettings(mode="off", grace_seconds=0)
    state = GuardState({"jy-alice": 0}, {10: 0}, frozenset({99}))
    seen = reading((10, "jy-alice", 80000), (99, None, 100))
    decision = decide(seen, BUDGETS, settings, 1000, state)
    assert decision.actions == ()
    assert decision.state == GuardState()


# -- stopping


def test_no_stop_before_the_grace_then_the_biggest_process_at_the_grace():
    seen = reading((10, "jy-alice", 3000), (11, "jy-alice", 6000))
    out, state = rounds(ENFORCE, (0, seen), (59.9, seen), (60, seen))
    assert [kinds(a) for a in out] == [["Warn"], ["Warn"], ["Warn", "Stop"]]
    assert out[2][1] == Stop("jy-alice", 11, GPU_A, 6000, 9000, 8000, 8800)
    assert state.stopped == {11: 60}


def test_only_as_many_as_bring_them_under_the_stop_line():
    # 12000 of 8000, stop line 8800: 5000 leaves 7000; the others stay
    seen = reading((10, "jy-alice", 2000), (11, "jy-alice", 5000), (12, "jy-alice", 4000),
                   (13, "jy-alice", 1000))  # fmt: skip
    [actions], _ = rounds(GuardSettings("enforce", 100, 110, 0), (0, seen))
    assert [a.pid for a in actions if isinstance(a, Stop)] == [11]
    # 16000: 6000 then 5000 leave 5000 (11000 left would still be over)
    seen = reading((10, "jy-alice", 6000), (11, "jy-alice", 5000), (12, "jy-alice", 5000))
    [actions], _ = rounds(GuardSettings("enforce", 100, 110, 0), (0, seen))
    assert [a.pid for a in actions if isinstance(a, Stop)] == [10, 11]


def test_equal_processes_are_stopped_lowest_pid_first():
    seen = reading((30, "jy-alice", 5000), (20, "jy-alice", 5000))
    [actions], _ = rounds(GuardSettings("enforce", 100, 110, 0), (0, seen))
    assert [a.pid for a in actions if isinstance(a, Stop)] == [20]


def test_between_the_warn_and_the_stop_line_only_warnings():
    seen = reading((10, "jy-alice", 8800))  # 110%: on the stop line
    out, _ = rounds(ENFORCE, (0, seen), (600, seen))
    assert [kinds(a) for a in out] == [["Warn"], ["Warn"]]


def test_back_within_budget_resets_the_grace():
    over, within = reading((10, "jy-alice", 9000)), reading((10, "jy-alice", 7000))
    out, _ = rounds(ENFORCE, (0, over), (50, within), (55, over), (100, over), (115, over))
    assert [kinds(a) for a in out] == [["Warn"], [], ["Warn"], ["Warn"], ["Warn", "Stop"]]
    assert out[2][0].first and out[2][0].over_since == 55 and out[2][0].stop_at == 115


def test_other_participants_on_the_same_gpu_are_never_touched():
    seen = reading((10, "jy-alice", 20000), (20, "jy-bob", 7999), (21, "jy-bob", 1),
                   (30, "jy-carol", 23000, GPU_B))  # fmt: skip
    [actions], _ = rounds(GuardSettings("enforce", 100, 110, 0), (0, seen))
    assert actions == (
        Warn("jy-alice", GPU_A, 20000, 8000, (10,), 0, True, 0),
        Stop("jy-alice", 10, GPU_A, 20000, 20000, 8000, 8800),
    )


def test_a_stopped_process_still_listed_is_not_stopped_twice_nor_counted():
    settings = GuardSettings("enforce", 100, 110, 10)
    first = reading((10, "jy-alice", 6000), (11, "jy-alice", 4000))
    out, state = rounds(settings, (0, first), (10, first), (15, first))
    assert [a.pid for a in out[1] if isinstance(a, Stop)] == [10]
    assert kinds(out[2]) == ["Warn"], "10 is on its way out: 4000 left"
    assert out[2][0].used_mb == 10000, "the warning says what the reading says"
    # still there a grace later (the stop failed): it may be stopped again
    decision = decide(first, BUDGETS, settings, 20, state)
    assert [a.pid for a in decision.actions if isinstance(a, Stop)] == [10]


def test_a_stopped_process_gone_is_forgotten():
    settings = GuardSettings("enforce", 100, 110, 0)
    out, state = rounds(settings, (0, reading((10, "jy-alice", 9000))),
                        (5, reading((11, "jy-alice", 100))))  # fmt: skip
    assert kinds(out[0]) == ["Warn", "Stop"] and out[1] == ()
    assert state == GuardState()


def test_a_stop_warning_says_when_stopping_begins():
    [actions], _ = rounds(ENFORCE, (1000, reading((10, "jy-alice", 9000))))
    assert actions[0].stop_at == 1060


# -- what is never stopped


def test_a_process_of_nobody_is_reported_once_and_never_stopped():
    settings = GuardSettings("enforce", 100, 110, 0)
    host = reading((5, None, 70000))
    out, state = rounds(settings, (0, host), (5, host), (10, reading()), (15, host))
    assert out[0] == (Report(5, GPU_A, 70000, None, "belongs to no participant"),)
    assert out[1] == () and out[2] == ()
    assert kinds(out[3]) == ["Report"], "seen again after it was gone: reported again"
    assert state.reported == {5}


def test_a_participant_without_a_budget_or_on_another_gpu_is_reported_not_counted():
    seen = reading((40, "jy-dave", 9000), (41, "jy-alice", 9000, GPU_B), (42, "jy-alice", 100))
    [actions], _ = rounds(GuardSettings("enforce", 100, 110, 0), (0, seen))
    assert actions == (
        Report(40, GPU_A, 9000, "jy-dave", "jy-dave has no known budget"),
        Report(41, GPU_B, 9000, "jy-alice", f"not on jy-alice's GPU {GPU_A}"),
    )


def test_reports_come_after_the_participants_and_by_pid():
    seen = reading((9, None, 1), (3, None, 1), (10, "jy-bob", 9000), (11, "jy-alice", 9000))
    [actions], _ = rounds(WARN, (0, seen))
    assert [(type(a).__name__, getattr(a, "owner", None), a.pid if isinstance(a, Report)
             else None) for a in actions] == [("Warn", "jy-alice", None), ("Warn", "jy-bob", None),
                                              ("Report", None, 3), ("Report", None, 9)]  # fmt: skip


# -- what the reading does not say


def test_a_gpu_not_read_this_round_keeps_its_participants_as_they_were():
    settings = GuardSettings("enforce", 100, 110, 10)
    over = reading((10, "jy-alice", 9000))
    out, state = rounds(settings, (0, over), (20, reading(gpus=(GPU_B,))))
    assert out[1] == ()
    assert state.over_since == {"jy-alice": 0}, "neither reset nor dropped"
    decision = decide(over, BUDGETS, settings, 30, state)
    assert kinds(decision.actions) == ["Warn", "Stop"]
    assert decision.actions[0].first is False


def test_a_participant_gone_is_dropped_from_the_state():
    out, state = rounds(WARN, (0, reading((10, "jy-alice", 9000))))
    decision = decide(reading(), {"jy-bob": BUDGETS["jy-bob"]}, WARN, 5, state)
    assert decision.actions == () and decision.state == GuardState()


def test_no_processes_at_all_is_within_budget():
    _, state = rounds(WARN, (0, reading((10, "jy-alice", 9000))), (5, reading()))
    assert state.over_since == {}


# -- pure


def test_decide_changes_none_of_its_inputs_and_answers_the_same_twice():
    seen = reading((10, "jy-alice", 9000), (5, None, 10))
    state = GuardState({"jy-alice": 0}, {}, frozenset())
    budgets = dict(BUDGETS)
    first = decide(seen, budgets, ENFORCE, 100, state)
    assert state == GuardState({"jy-alice": 0}, {}, frozenset())
    assert budgets == BUDGETS
    assert decide(seen, budgets, ENFORCE, 100, state) == first
    assert kinds(first.actions) == ["Warn", "Stop", "Report"]


def test_a_stopped_process_gone_within_the_grace_is_forgotten():
    settings = GuardSettings("enforce", 100, 110, 30)
    steps = [(0, reading((10, "jy-alice", 9000))), (30, reading((10, "jy-alice", 9000))),
             (35, reading((11, "jy-alice", 100)))]  # fmt: skip
    out, state = rounds(settings, *steps)
    assert kinds(out[1]) == ["Warn", "Stop"] and out[2] == ()
    assert state.stopped == {}


def test_the_next_stop_skips_a_process_already_stopped():
    settings = GuardSettings("enforce", 100, 110, 10)
    before = reading((10, "jy-alice", 6000), (11, "jy-alice", 3000))
    after = reading((10, "jy-alice", 6000), (11, "jy-alice", 5000), (12, "jy-alice", 5000))
    out, state = rounds(settings, (0, before), (10, before), (15, after))
    assert [a.pid for a in out[1] if isinstance(a, Stop)] == [10]
    assert [a.pid for a in out[2] if isinstance(a, Stop)] == [11], "10 is going already"
    assert state.stopped == {10: 10, 11: 15}
