"""The waiting line as the spawner uses it (fake swarm): who joins (``waiting_line``), what the
participant reads while waiting, the refusal's offer, the line's longest wait, and a hub restart
that empties the line. The rule of the line itself: test_line.py; the broker: test_broker.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Server
from jupyterhub.spawner import Spawner
from tornado import web

from gpu_swarm_spawner.holding import Holding
from gpu_swarm_spawner.spawner import NoGPUSliceAvailable, SpawnFailed

from .clusters import node, task
from .fake_docker import make_fake
from .waiting import until

FULL = [task("n1", {"GPU-a0": 1}, service_id=f"svc-{i}") for i in range(3)]


def full_hub(name="alice", **traits):
    traits.setdefault("inventory_max_age", 0)
    traits.setdefault("line_interval", 0.1)
    spawner = make_fake(name, **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.tasks = list(FULL)
    return spawner


def messages(spawner) -> list[str]:
    return [e["message"] for e in spawner.attempt.progress]


async def test_auto_puts_the_participant_in_line_and_starts_them_when_a_slice_frees():
    spawner = full_hub(waiting_line="auto")
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: any("in line" in m for m in messages(spawner)))
    assert "You are 1st in line (1 waiting): no estimate yet" in messages(spawner)[-1]
    assert spawner.created == []  # no service while waiting
    assert spawner.get_state()["line_joined"] > 0  # the database knows they wait
    spawner.tasks = FULL[:2]  # one server stopped
    await asyncio.wait_for(start, 3)
    assert spawner.holding.gpu == "GPU-a0" and len(spawner.created) == 1
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
    assert 'href="/hub/spawn/alice?opt-gpu=none&amp;opt-image=PyTorch">Start without a GPU now' in (
        offer)  # fmt: skip


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
    spawner = full_hub(waiting_line="off", cpu_only_servers=False)
    spawner.user_options = {"line": "join"}
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(spawner.start(), 1)
    assert not getattr(refused.value, "jupyterhub_html_message", "")  # nothing to offer
    cpu_only = full_hub("dan", waiting_line="off")
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await asyncio.wait_for(cpu_only.start(), 1)
    offer = refused.value.jupyterhub_html_message
    assert "Start without a GPU now" in offer and "Wait in line" not in offer
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
    # at its start JupyterHub stops the spawn it found pending (found on the bed): the state
    # it writes back still says so, and so does the hub after a second restart
    after_restart.clear_state()
    written = after_restart.get_state()
    again = make_fake("alice")
    again.load_state(written)
    assert again.failure_message == after_restart.failure_message != ""
    again.full_gpu_requested = False
    again.nodes, again.tasks = [node("n1", "alpha", {"GPU-a0": 3})], []
    await asyncio.wait_for(again.start(), 3)  # a new start forgets it
    assert "line_lost" not in again.get_state()


def test_jupyterhub_gives_the_spawn_the_lines_longest_wait_on_top_of_the_servers_start():
    spawner = make_fake(start_timeout=120, waiting_line="offer", line_max_wait=1800)
    spawner.run_pre_spawn_hook()
    spawner.run_pre_spawn_hook()  # not added twice
    assert (spawner.start_timeout, spawner.server_start_timeout) == (1920, 120)
    off = make_fake(start_timeout=120, waiting_line="off")
    off.run_pre_spawn_hook()
    assert (off.start_timeout, off.server_start_timeout) == (120, 120)


# ---- servers without a GPU ------------------------------------------------------------------


async def test_a_server_without_a_gpu_starts_while_the_gpus_are_full_and_holds_no_slice():
    spawner = full_hub(home_node="")
    spawner.nodes.append(node("n2", "beta", {"GPU-b0": 3}))
    spawner.tasks += [task("n2", {"GPU-b0": 2})]  # beta: 1 slice free, alpha none
    spawner.cpu_only_requested = True
    await asyncio.wait_for(spawner.start(), 3)
    (created,) = spawner.created
    spec = created["task_template"]
    assert spec["Resources"].get("Reservations", {}).get("GenericResources") in (None, [])
    assert spec["Placement"]["Constraints"] == ["node.hostname==beta"]  # the most room
    env = dict(e.split("=", 1) for e in spec["ContainerSpec"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GPU_MODE"] == "none"
    assert not {"GPU_UUID", "GPU_SLICES", "GPU_MEMORY_LIMIT_MB"} & set(env)
    assert created["labels"]["gpu-jupyterhub.cpu-only"] == "1"
    assert spec["ContainerSpec"].get("Labels", {}) == {}  # nothing for the GPU guard
    assert spawner.home_node == "beta"  # a restart with a GPU goes back there
    assert any("Starting without a GPU on beta" in m for m in messages(spawner))


def test_the_hubs_pages_say_when_a_server_starts_or_runs_without_a_gpu():
    """``without_gpu`` puts the banner on the spawn-pending and home pages."""
    spawner = make_fake("alice")
    spawner.cpu_only_requested, spawner._spawn_pending = True, True
    assert spawner.without_gpu  # starting, as chosen
    spawner._spawn_pending = False
    spawner.server = Server(ip="127.0.0.1", port=8888)
    assert spawner.without_gpu  # running, and holds no GPU
    spawner.holding = Holding(gpu="GPU-a0")
    assert not spawner.without_gpu  # holds one (after a hub restart too: from the state)
    spawner.holding = Holding()
    spawner.cpu_only_requested, spawner._spawn_pending = False, True
    assert not spawner.without_gpu  # a GPU spawn before its GPU is chosen
    spawner._spawn_pending, spawner.server = False, None
    assert not spawner.without_gpu  # not running at all


async def test_a_server_without_a_gpu_goes_to_the_participants_home():
    spawner = full_hub(home_node="alpha")
    spawner.nodes.append(node("n2", "beta", {"GPU-b0": 3}))
    spawner.cpu_only_requested = True
    await asyncio.wait_for(spawner.start(), 3)
    spec = spawner.created[0]["task_template"]
    assert spec["Placement"]["Constraints"] == ["node.hostname==alpha"]


async def test_servers_without_a_gpu_are_capped():
    spawner = full_hub(cpu_only_max_servers=2)
    spawner.cpu_only_requested = True
    running = [{"Spec": {"Name": "jy-x"}}, {"Spec": {"Name": "jy-y"}}]
    real = spawner.docker

    async def docker(method, *args, **kwargs):
        if method == "services":
            assert kwargs["filters"] == {"label": "gpu-jupyterhub.cpu-only=1"}
            return running
        return await real(method, *args, **kwargs)

    spawner.docker = docker
    with pytest.raises(SpawnFailed) as refused:
        await asyncio.wait_for(spawner.start(), 3)
    assert refused.value.jupyterhub_message.startswith(
        "All 2 servers without a GPU this hub allows are running."
    )
    assert spawner.created == []
    running.pop()
    await asyncio.wait_for(spawner.start(), 3)
    assert len(spawner.created) == 1


def test_no_gpu_is_chosen_in_the_form_and_refused_where_not_offered():
    spawner = make_fake(cpu_only_servers=True)
    spawner.apply_user_options(spawner, {"gpu": "none"})
    assert spawner.cpu_only_requested and not spawner.full_gpu_requested
    off = make_fake(cpu_only_servers=False)
    with pytest.raises(web.HTTPError, match="Servers without a GPU are not offered"):
        off.apply_user_options(off, {"gpu": "none"})


def test_waiting_and_going_without_a_gpu_are_not_kept_for_the_next_start():
    """JupyterHub reuses a start's options for the next start without options ("Start My
    Server"): found on the bed, a participant who once started without a GPU got no GPU again.
    The one-off answers go; the environment stays."""
    spawner = make_fake(cpu_only_servers=True, allowed_images={"PyTorch": "reg/pytorch:1"})
    committed = []
    spawner.orm_spawner = SimpleNamespace(
        server=None, user_options={"gpu": "none", "line": "join", "image": "PyTorch"}
    )
    spawner.user.db = SimpleNamespace(commit=lambda: committed.append(1))
    spawner.apply_user_options(spawner, dict(spawner.orm_spawner.user_options))
    assert spawner.cpu_only_requested  # this start: without a GPU
    assert spawner.orm_spawner.user_options == {"image": "PyTorch"}  # the next: as by default
    assert committed == [1]
    spawner.apply_user_options(spawner, {"gpu": "slice"})
    assert committed == [1]  # nothing to forget: no write


async def test_a_spawn_cancelled_in_line_is_never_reported_ready(monkeypatch):
    """JupyterHub records a server when a spawn begins; when the hub stops, it cancels the spawn
    and its progress stream reported the waiting participant's server "ready" (found on the
    bed): the page reloaded into the stopping hub."""
    # as JupyterHub sees a spawn no longer pending whose server it recorded at the start
    monkeypatch.setattr(Spawner, "ready", property(lambda self: True))
    spawner = full_hub(waiting_line="auto")
    assert spawner.ready
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: spawner.broker.waiting())
    start.cancel()
    await asyncio.gather(start, return_exceptions=True)
    assert not spawner.ready
    spawner.tasks = []
    await asyncio.wait_for(spawner.start(), 3)  # a new start
    assert spawner.ready
