"""What the hub records for the dashboard (``events.py``): the format's one reader fed the odd
files real hubs leave behind, the journal's files, and the spawner's records of its starts,
refusals, failures, stops and the waiting line (fake swarm)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from gpu_swarm_spawner import events
from gpu_swarm_spawner.events import Event, Journal, Waiting
from gpu_swarm_spawner.spawner import NoGPUSliceAvailable, SpawnFailed

from .clusters import node, task
from .fake_docker import UNPLACEABLE, make_fake
from .waiting import until


def test_events_read_back_as_written():
    written = [
        Event(1.5, "started", "alice", seconds=3.2, waited=40.0, gpu="GPU-a", node="gpu-1"),
        Event(1.6, "started", "ann", seconds=2.5, phases={"created": 0.1, "answered": 2.4}),
        Event(2.0, "refused", "bob", server="big", reason="All GPU slices are in use (18/18)"),
        Event(3.0, "stopped", "zoë"),
    ]
    text = "\n".join(events.encode(e) for e in written) + "\n"
    assert events.read_events(text.splitlines()) == written
    assert "seconds" not in events.encode(written[2])  # defaults are left out


def test_the_reader_skips_what_it_cannot_use_and_keeps_the_rest():
    good = events.encode(Event(5.0, "failed", "carol", reason="no image on gpu-2"))
    lines = [
        good[: len(good) // 2],  # cut short by a crash mid-write
        "",
        "not json",
        b"\xff\xfe binary",
        "[1, 2]",
        '{"time": 1, "kind": "exploded", "user": "x"}',  # a kind from a newer version
        '{"time": 1, "kind": "started"}',  # nobody
        '{"time": "noon", "kind": "started", "user": "x"}',
        '{"time": true, "kind": "started", "user": "x"}',  # a bool is no time
        '{"time": 1, "kind": "started", "user": "x", "gpu": 7}',
        '{"time": 1, "kind": "started", "user": "x", "seconds": "fast"}',  # dropped, kept
        '{"time": 2, "kind": "stopped", "user": "y", "colour": "red"}',  # unknown field
        # phases: an unknown one and one without a number dropped, the rest kept
        '{"time": 3, "kind": "started", "user": "p", "phases": {"created": 0.2, "x": 1, '
        '"running": "soon"}}',
        '{"time": 3, "kind": "started", "user": "q", "phases": [1, 2]}',
        good,
        good.encode(),  # bytes, as tail() returns them
    ]
    found = events.read_events(lines)
    assert [(e.kind, e.user) for e in found] == [
        ("started", "x"),
        ("stopped", "y"),
        ("started", "p"),
        ("started", "q"),
        ("failed", "carol"),
        ("failed", "carol"),
    ]
    assert found[0].seconds is None
    assert found[2].phases == {"created": 0.2} and found[3].phases is None


def test_the_line_snapshot_reads_back_and_odd_entries_are_skipped():
    waiting = [Waiting("w1", "", 10.0, 1), Waiting("admin", "big", 12.0, None, holds="GPU-b")]
    when, line = events.read_line(events.line_snapshot(waiting, 20.0))
    assert (when, line) == (20.0, waiting)
    odd = json.dumps(
        {
            "time": 30,
            "line": [
                {"user": "ok", "server": "", "joined": 1, "slices": 2},
                {"user": "", "joined": 1, "slices": 1},
                {"user": "zero", "joined": 1, "slices": 0},
                {"user": "float", "joined": 1, "slices": 1.5},
                {"user": "nojoin", "slices": 1},
                "w9",
            ],
        }
    )
    assert events.read_line(odd) == (30.0, [Waiting("ok", "", 1.0, 2)])
    for broken in ("", "{", "[]", '{"line": 5}', "null"):
        assert events.read_line(broken) == (0.0, [])


def test_the_journal_appends_rotates_and_rewrites_the_line_whole(tmp_path):
    folder = tmp_path / "dashboard"  # made on first use
    journal = Journal(folder, max_bytes=300)
    for i in range(12):
        journal.record(Event(float(i), "stopped", f"user-{i}"))
    rotated = folder / "events.jsonl.1"
    assert rotated.exists() and (folder / "events.jsonl").stat().st_size <= 300 + 60
    kept = events.read_events(rotated.read_text().splitlines())
    kept += events.read_events((folder / "events.jsonl").read_text().splitlines())
    assert [e.user for e in kept] == [f"user-{i}" for i in range(12)]  # nothing lost
    journal.line([Waiting("w1", "", 1.0, 1)], 2.0)
    journal.line([], 3.0)
    assert events.read_line((folder / "line.json").read_text()) == (3.0, [])
    assert sorted(p.name for p in folder.iterdir()) == [
        "events.jsonl",
        "events.jsonl.1",
        "line.json",
    ]


def test_tail_reads_only_the_end_of_a_long_file(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(events.encode(Event(i, "stopped", f"u{i}")) + "\n" for i in range(500)))
    found = events.read_events(events.tail(path, max_bytes=400))
    assert found and found[-1].user == "u499" and len(found) < 20
    assert events.tail(tmp_path / "missing") == []


# ---- what the spawner records ---------------------------------------------------------------


def recorded(folder) -> list[Event]:
    return events.read_events(events.tail(folder / "events.jsonl"))


def a_hub(tmp_path, name="alice", **traits):
    traits.setdefault("inventory_max_age", 0)
    traits.setdefault("line_interval", 0.1)
    spawner = make_fake(name, dashboard_dir=str(tmp_path), **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    return spawner


async def test_a_start_and_a_stop_are_recorded_with_the_gpu_and_the_duration(tmp_path):
    spawner = a_hub(tmp_path)
    await spawner.start()
    await spawner.stop()
    started, stopped = recorded(tmp_path)
    assert (started.kind, started.user, started.gpu, started.node) == (
        "started",
        "alice",
        "GPU-a0",
        "alpha",
    )
    assert 0 <= started.seconds < 5 and started.waited is None
    # where the start's time went, in the order a start reaches them
    marks = started.phases
    assert list(marks) == ["slices", "created", "placed", "running"], marks
    assert list(marks.values()) == sorted(marks.values())
    assert marks["running"] <= started.seconds + 0.01  # (rounded to 0.01 s)
    assert (stopped.kind, stopped.gpu) == ("stopped", "GPU-a0")


async def test_a_start_whose_server_answers_records_when_it_answered(tmp_path):
    async def answer(reader, writer):
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    spawner = a_hub(tmp_path, probe_server=True, port=port)
    spawner.task_address = "127.0.0.1"  # where the server listens
    try:
        await spawner.start()
    finally:
        server.close()
    (started,) = recorded(tmp_path)
    assert "answered" in started.phases, started.phases
    assert started.phases["created"] <= started.phases["answered"] <= started.seconds + 0.01


async def test_a_refusal_and_a_failure_are_recorded_with_what_the_participant_read(tmp_path):
    spawner = a_hub(tmp_path, waiting_line="off")
    spawner.tasks = [task("n1", {"GPU-a0": 1}, service_id=f"s{i}") for i in range(3)]
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await spawner.start()
    broken = a_hub(tmp_path, name="bob", start_timeout=1, placement_attempts=1)
    broken.task_states = [{"State": "rejected", "Err": "No such image: gpu-jupyterhub/x"}]
    with pytest.raises(SpawnFailed) as failed:
        await broken.start()
    refusal, failure = recorded(tmp_path)
    assert (refusal.kind, refusal.reason) == ("refused", refused.value.jupyterhub_message)
    assert (failure.kind, failure.user, failure.reason) == (
        "failed",
        "bob",
        failed.value.jupyterhub_message,
    )


async def test_the_line_is_written_as_it_changes_and_joins_and_departures_recorded(tmp_path):
    full = [task("n1", {"GPU-a0": 1}, service_id=f"s{i}") for i in range(3)]
    first, second = a_hub(tmp_path, "w1", waiting_line="auto"), a_hub(tmp_path, "w2")
    second.waiting_line = "auto"
    for spawner in (first, second):
        spawner.tasks = list(full)
    one = asyncio.ensure_future(first.start())
    two = asyncio.ensure_future(second.start())

    def line_now():
        return [w.user for w in events.read_line((tmp_path / "line.json").read_text())[1]]

    await until(lambda: (tmp_path / "line.json").exists() and line_now() == ["w1", "w2"])
    two.cancel()  # w2 leaves
    await until(lambda: line_now() == ["w1"])
    first.tasks = second.tasks = full[:2]  # a server stopped: w1 gets its slice
    await asyncio.wait_for(one, 3)
    await until(lambda: line_now() == [])
    kinds = [(e.kind, e.user) for e in recorded(tmp_path)]
    assert kinds == [
        ("joined line", "w1"),
        ("joined line", "w2"),
        ("left line", "w2"),
        ("started", "w1"),
    ]
    started = recorded(tmp_path)[-1]
    assert started.waited is not None and started.waited >= 0


async def test_a_journal_that_cannot_be_written_never_fails_a_start(tmp_path, caplog):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the folder should be")
    spawner = a_hub(blocked)
    with caplog.at_level(logging.WARNING):
        await spawner.start()
    assert spawner.holding.gpu == "GPU-a0"
    assert "Could not record 'started' of alice" in caplog.text


async def test_nothing_is_written_without_a_dashboard_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spawner = make_fake("alice", inventory_max_age=0)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.start()
    assert list(tmp_path.iterdir()) == []
    assert UNPLACEABLE  # the fake's states stay importable for the failure test
