"""The waiting line as the spawner uses it (fake swarm): who joins (``waiting_line``), what the
participant reads while waiting, the refusal's offer, the line's longest wait, and a hub restart
that empties the line. The rule of the line itself: test_line.py; the broker: test_broker.py."""

from __future__ import annotations

import asyncio

import pytest

from gpu_swarm_spawner.spawner import NoGPUSliceAvailable

from .clusters import node, task
from .fake_docker import make_fake

FULL = [task("n1", {"GPU-a0": 1}, service_id=f"svc-{i}") for i in range(3)]


def full_hub(name="alice", **traits):
    traits.setdefault("inventory_max_age", 0)
    traits.setdefault("line_interval", 0.1)
    spawner = make_fake(name, **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.tasks = list(FULL)
    return spawner


def messages(spawner) -> list[str]:
    return [e["message"] for e in spawner._progress_events]


async def until(condition, timeout=3.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_auto_puts_the_participant_in_line_and_starts_them_when_a_slice_frees():
    spawner = full_hub(waiting_line="auto")
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: any("in line" in m for m in messages(spawner)))
    assert "You are 1st in line (1 waiting): no estimate yet" in messages(spawner)[-1]
    assert spawner.created == []  # no service while waiting
    assert spawner.get_state()["line_joined"] > 0  # the database knows they wait
    spawner.tasks = FULL[:2]  # one server stopped
    await asyncio.wait_for(start, 3)
    assert spawner.gpu_uuid == "GPU-a0" and len(spawner.created) == 1
    assert "A GPU slice is free for you: starting your server" in messages(spawner)
    assert "line_joined" not in spawner.get_state()


async def test_offer_refuses_at_once_with_a_button_to_wait_in_line():
    spawner = full_hub(waiting_line="offer")
    spawner.hub.base_url = "/hub/"  # as JupyterHub makes its Hub (the hub's prefix)
    spawner.user_options = {"gpu": "slice", "image": "PyTorch"}
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(spawner.start(), 1)
    assert refused.value.jupyterhub_message.startswith("All GPU slices are in use (3/3)")
    offer = refused.value.jupyterhub_html_message
    assert "All GPU slices are in use (3/3)" in offer  # the message itself comes first
    assert 'href="/hub/spawn/alice?opt-line=join&amp;opt-gpu=slice&amp;opt-image=PyTorch"' in offer
    assert "Wait in line for a GPU" in offer and "0 waiting now" in offer


async def test_offer_with_the_participants_yes_puts_them_in_line():
    spawner = full_hub(waiting_line="offer")
    spawner.user_options = {"gpu": "slice", "line": "join"}
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: any("in line" in m for m in messages(spawner)))
    start.cancel()  # the participant leaves the line ("Stop server" on the spawn page)
    with pytest.raises(asyncio.CancelledError):
        await start
    assert spawner.broker.waiting() == [] and spawner.broker.claimed() == {}
    assert spawner.created == []


async def test_off_only_refuses_and_so_does_a_request_no_gpu_can_ever_hold():
    spawner = full_hub(waiting_line="off")
    spawner.user_options = {"line": "join"}
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(spawner.start(), 1)
    assert not getattr(refused.value, "jupyterhub_html_message", "")
    big = full_hub("bob", waiting_line="auto", slices_per_server=4)
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(big.start(), 1)
    assert "the largest GPU here has 3" in refused.value.jupyterhub_message
    assert big.broker.waiting() == []


async def test_a_full_line_and_the_longest_wait_end_the_wait_with_a_message():
    first = full_hub("alice", waiting_line="auto", line_max_length=1)
    waiting = asyncio.ensure_future(first.start())
    await until(lambda: first.broker.waiting())
    second = full_hub("bob", waiting_line="auto", line_max_length=1)
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(second.start(), 1)
    assert "the waiting line is full (1 are waiting)" in refused.value.jupyterhub_message
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    impatient = full_hub("carol", waiting_line="auto", line_max_wait=1)
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(impatient.start(), 3)
    assert refused.value.jupyterhub_message.startswith("You waited less than a minute in line")
    assert impatient.broker.waiting() == [] and "line_joined" not in impatient.get_state()


async def test_a_hub_restart_that_emptied_the_line_is_said_to_the_participant():
    spawner = full_hub(waiting_line="auto")
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: spawner.broker.waiting())
    saved = spawner.get_state()  # what the database holds while they wait
    start.cancel()
    await asyncio.gather(start, return_exceptions=True)
    after_restart = make_fake("alice")
    after_restart.load_state(saved)
    assert after_restart.failure_message.startswith("You were waiting in line for a GPU (since ")
    assert "when the hub restarted, and the line was emptied" in after_restart.failure_message
    after_restart.clear_state()  # a new start or a stop forgets it
    after_restart.line_lost = 0
    assert after_restart.failure_message == ""


def test_jupyterhub_gives_the_spawn_the_lines_longest_wait_on_top_of_the_servers_start():
    spawner = make_fake(start_timeout=120, waiting_line="offer", line_max_wait=1800)
    spawner.run_pre_spawn_hook()
    spawner.run_pre_spawn_hook()  # not added twice
    assert (spawner.start_timeout, spawner.server_start_timeout) == (1920, 120)
    off = make_fake(start_timeout=120, waiting_line="off")
    off.run_pre_spawn_hook()
    assert (off.start_timeout, off.server_start_timeout) == (120, 120)
