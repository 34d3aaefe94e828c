"""The waiting line's rule (gpu_swarm_spawner/line.py): order of arrival, the held GPU that
keeps a full-GPU request from being starved without blocking 1-slice requests behind it, the
estimate and the words a participant reads."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpu_swarm_spawner.inventory import GPU
from gpu_swarm_spawner.line import (
    Entry,
    about,
    assign,
    can_ever_fit,
    closest,
    estimate,
    ordinal,
    position,
    waiting_message,
)
from gpu_swarm_spawner.placement import Request

ONE, FULL = Request(1), Request(None)


def gpu(uuid, used, slices=3, node="n1"):
    return GPU(uuid, node, node, slices, used)


def line(*requests):
    return [Entry(f"p{i}", r, joined=i) for i, r in enumerate(requests, start=1)]


def free_up(gpus, uuid, n=1):
    return [replace(g, used=g.used - n) if g.uuid == uuid else g for g in gpus]


def test_freed_slices_go_to_the_earliest_in_line():
    gpus = [gpu("GPU-a", 3), gpu("GPU-b", 3)]
    waiting = line(ONE, ONE, ONE)
    assert assign(waiting, gpus).assigned == ()
    done = assign(waiting, free_up(gpus, "GPU-b"))
    assert [(a.owner, a.gpu.uuid, a.slices) for a in done.assigned] == [("p1", "GPU-b", 1)]
    done = assign(waiting, free_up(free_up(gpus, "GPU-b"), "GPU-a"))
    assert [a.owner for a in done.assigned] == ["p1", "p2"]


def test_one_pass_never_gives_a_gpu_more_slices_than_it_has():
    gpus = [gpu("GPU-a", 1)]  # 2 free
    done = assign(line(ONE, ONE, ONE, ONE), gpus)
    assert [a.owner for a in done.assigned] == ["p1", "p2"]


def test_a_full_gpu_request_at_the_head_does_not_block_one_slice_requests_behind_it():
    gpus = [gpu("GPU-a", 3), gpu("GPU-b", 2)]  # nothing empty; b has 1 free
    done = assign(line(FULL, ONE), gpus)
    # the full-GPU request holds the GPU closest to empty (b: 2 in use); p2 may not take its
    # free slice, but takes one elsewhere once there is one
    assert done.held_for == "p1" and done.held_gpu == "GPU-b"
    assert done.assigned == ()
    done = assign(line(FULL, ONE), free_up(gpus, "GPU-a"), held=done)
    assert [(a.owner, a.gpu.uuid) for a in done.assigned] == [("p2", "GPU-a")]
    assert done.held_gpu == "GPU-b"  # still: a has as few in use now, but b is emptying


def test_a_full_gpu_request_is_not_starved_by_one_slice_requests():
    """Slices keep freeing on both GPUs; the 1-slice requests never refill the held GPU, so it
    empties and the full-GPU request gets it, before the ones that came after it."""
    gpus = [gpu("GPU-a", 3), gpu("GPU-b", 3)]
    waiting = line(FULL, ONE, ONE, ONE, ONE)
    served, done = [], None
    for freed in ["GPU-a", "GPU-b", "GPU-a", "GPU-b", "GPU-a", "GPU-b"]:
        gpus = free_up(gpus, freed)
        done = assign(waiting, gpus, held=done)
        for a in done.assigned:
            served.append(a.owner)
            gpus = [replace(g, used=g.used + a.slices) if g.uuid == a.gpu.uuid else g for g in gpus]
        waiting = [e for e in waiting if done.of(e.owner) is None]
    assert "p1" in served, served
    full = next(g for g in gpus if g.used == 3 and g.uuid == "GPU-a")  # held, emptied, taken
    assert full and served.index("p1") < 4, served


def test_without_the_hold_the_full_gpu_request_would_wait_forever():
    """The guard against the rule being dropped: with nothing held, 1-slice requests take every
    slice that frees and no GPU ever empties."""
    gpus = [gpu("GPU-a", 3)]
    waiting = line(FULL, ONE)
    done = assign(waiting, free_up(gpus, "GPU-a"))
    assert done.held_gpu == "GPU-a"
    assert done.assigned == ()  # p2 must not take the freed slice of the held GPU


def test_only_the_earliest_who_does_not_fit_holds_a_gpu():
    gpus = [gpu("GPU-a", 3), gpu("GPU-b", 2), gpu("GPU-c", 1)]
    done = assign(line(ONE, FULL, FULL, ONE), gpus)
    # p1 takes one of c's 2 free slices; p2 holds b (as close to empty as c, first by name);
    # p3 holds nothing; p4 takes c's last slice
    assert [(a.owner, a.gpu.uuid) for a in done.assigned] == [("p1", "GPU-c"), ("p4", "GPU-c")]
    assert done.held_for == "p2" and done.held_gpu == "GPU-b"


def test_a_gpu_held_is_the_one_closest_to_having_room():
    gpus = [gpu("GPU-a", 3, slices=3), gpu("GPU-b", 2, slices=8), gpu("GPU-c", 1, slices=2)]
    assert closest(gpus, None).uuid == "GPU-c"  # 1 slice in use: closest to empty
    assert closest(gpus, 3).uuid == "GPU-b"  # 3 of its 8 free... well, 6: already fits
    assert closest(gpus, 9) is None  # no GPU has 9 slices
    assert can_ever_fit(gpus, 8) and not can_ever_fit(gpus, 9)


def test_newcomers_come_after_the_line():
    """A newcomer is the last entry of a pass: it gets what the line cannot use, never what
    the line can."""
    gpus = [gpu("GPU-a", 2)]  # 1 free
    done = assign([*line(ONE), Entry("new", ONE)], gpus)
    assert [a.owner for a in done.assigned] == ["p1"]
    done = assign([*line(FULL), Entry("new", ONE)], [gpu("GPU-a", 2), gpu("GPU-b", 3)])
    assert done.held_gpu == "GPU-a" and done.assigned == ()  # a is held for p1


def test_positions_count_from_one():
    waiting = line(ONE, ONE, FULL)
    assert [position(waiting, f"p{i}") for i in (1, 2, 3)] == [1, 2, 3]
    assert position(waiting, "stranger") == 0


def test_the_estimate_is_the_lines_pace_and_nothing_without_one():
    assert estimate(3, served=[], now=1000, since=0) is None
    # 4 left the line in the last 10 minutes: one every 150 s; 3rd in line: 450 s
    assert estimate(3, served=[500, 600, 800, 900], now=1000, since=400) == pytest.approx(450)
    # only the last half hour counts, and only since the line began
    old = [0, 10, 20]
    assert estimate(1, served=[*old, 3500], now=3600, since=0) == pytest.approx(1800)
    assert estimate(1, served=[100], now=200, since=150) is None  # before this line began


@pytest.mark.parametrize(
    "n, said", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                (13, "13th"), (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")],
)  # fmt: skip
def test_ordinals(n, said):
    assert ordinal(n) == said


@pytest.mark.parametrize(
    "seconds, said",
    [(20, "less than a minute"), (60, "about 1 minute"), (250, "about 4 minutes"),
     (89 * 60, "about 89 minutes"), (90 * 60, "about 1.5 hours"), (7200, "about 2.0 hours")],
)  # fmt: skip
def test_waits_are_said_as_people_say_them(seconds, said):
    assert about(seconds) == said


def test_the_waiting_message_says_place_wait_and_that_closing_the_page_is_fine():
    text = waiting_message(3, 6, 250, held=False)
    assert "You are 3rd in line (6 waiting): about 4 minutes." in text
    assert "you keep your place if you close this page" in text
    text = waiting_message(1, 1, None, held=True)
    assert "1st in line (1 waiting); a GPU is being kept free for you: no estimate yet" in text


def test_the_line_places_as_a_start_would_with_the_participants_seed():
    """Between tied GPUs the line's choice is the participant's, as ``placement.choose`` makes
    it with their seed (their name), so spawns served in one pass spread over the tied GPUs
    the way direct starts do. mutmut found the seed's pass untested."""
    from gpu_swarm_spawner.placement import choose

    gpus = [gpu(f"GPU-{c}", 2) for c in "abcdef"]  # six tied GPUs, one slice free on each
    for name in ("ann", "bob", "cy", "dee"):
        request = Request(1, seed=name)
        done = assign([Entry(name, request, joined=1)], gpus)
        assert done.assigned[0].gpu.uuid == choose(gpus, 1, seed=name).uuid
    firsts = {
        assign([Entry(n, Request(1, seed=n), 1)], gpus).assigned[0].gpu.uuid for n in "pqrstu"
    }
    assert len(firsts) > 1  # not every participant on the first GPU by name
