"""The GPU choice as a collaborator: given a broker, who the spawn is for, the line's rules and
callbacks, it reserves, refuses and tells, with no spawner (nor Docker call) behind it."""

import logging

import pytest

from gpu_swarm_spawner import NoGPUSliceAvailable
from gpu_swarm_spawner.attempt import Attempt
from gpu_swarm_spawner.broker import GPUBroker, Request
from gpu_swarm_spawner.spawner_gpu import GPUChoice, LineRules, Spawn

from .clusters import node, task

NODES = [node("n1", "alpha", {"GPU-a0": 3})]


@pytest.fixture
def broker():
    b = GPUBroker(threads=1, max_age=0)
    yield b
    b.close()


def choice_for(broker, owner, told, rules=None):
    async def read_swarm():
        return NODES, [task("n1", {"GPU-a0": 2})]

    async def docker(method, *args, **kwargs):
        raise AssertionError(f"a Docker call ({method}) where the broker's read is enough")

    return GPUChoice(
        broker,
        Spawn(owner, owner, f"jy-{owner}", f"/hub/spawn/{owner}", f"jy-home-{owner}"),
        rules or LineRules(),
        read_swarm=read_swarm,
        docker=docker,
        log=logging.getLogger("test"),
        report=lambda percent, message: told.append(message),
        record=lambda kind, **fields: told.append(kind),
        healed=lambda action, message: told.append(action),
        joined_line=lambda attempt: told.append("joined"),
    )


async def test_the_gpu_choice_reserves_and_refuses_from_its_inputs_alone(broker):
    told = []
    ann = choice_for(broker, "ann", told)
    reservation = await ann.reserve(Request(1, prefer_node="beta"), {}, Attempt.begin())
    assert (reservation.gpu.uuid, reservation.owner) == ("GPU-a0", "ann")
    assert reservation.stands() and "beta" in told[-1]  # told their home machine is away
    bob = choice_for(broker, "bob", told, LineRules(cpu_only_servers=True))
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await bob.reserve(Request(1), {}, Attempt.begin())
    assert refused.value.jupyterhub_message.startswith("All GPU slices are in use (3/3)")
    assert "opt-gpu=none" in refused.value.jupyterhub_html_message  # offered: no GPU
    assert "/hub/spawn/bob" in refused.value.jupyterhub_html_message
    assert list(broker.claimed()) == ["ann"]


async def test_a_handed_reservation_is_taken_as_it_is_while_it_stands(broker):
    told = []
    ann = choice_for(broker, "ann", told)
    gate = await broker.reserve("ann", Request(1), ann.read_swarm)
    assert await ann.reserve(Request(1), {}, Attempt.begin(), handed=gate) is gate
    gate.forget()
    again = await ann.reserve(Request(1), {}, Attempt.begin(), handed=gate)
    assert again is not gate and again.stands()


async def test_with_no_gpu_machine_the_line_waits_for_the_fleet_only_when_it_runs(broker):
    """A fleet of no machine at all (its minimum 0) grows only for people waiting: with the
    fleet on (GPUHUB_FLEET, the spawner's ``fleet``), a participant whom no GPU of the swarm
    could hold joins the line (found on the bed: refused "no GPU machine is connected", nobody
    waited, nothing grew; a flag the keeper's round set came too late for the first spawn)."""
    told = []

    async def no_gpu_machine():
        return [], []

    def choice(**rules):
        made = choice_for(broker, "ann", told, LineRules(**rules))
        made.read_swarm = no_gpu_machine
        return made

    auto = choice(waiting_line="auto")
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await auto.reserve(Request(1), {}, Attempt.begin(), may_wait=False)
    assert "no GPU machine is connected" in refused.value.jupyterhub_message
    assert not auto.joins_line([], Request(1), {})  # no fleet: a line that never moves
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await choice(waiting_line="offer").reserve(Request(1), {}, Attempt.begin())
    assert "opt-line" not in getattr(refused.value, "jupyterhub_html_message", "")
    fleet = choice(waiting_line="auto", fleet=True)
    assert fleet.joins_line([], Request(1), {}) and fleet.joins_line([], Request(None), {})
    with pytest.raises(NoGPUSliceAvailable) as refused:
        await choice(waiting_line="offer", fleet=True).reserve(Request(1), {}, Attempt.begin())
    assert "opt-line=join" in refused.value.jupyterhub_html_message  # the line is offered
