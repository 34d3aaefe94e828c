"""The single-spawn bench's figures (issue 31): its bare baseline runs the hub's own task
template (like with like), and where a spawn's time goes is read from the bench's clock, the
spawner's record and Swarm's."""

import pytest

from gpu_swarm_spawner.events import Event
from tests.bench.bench import SPLIT, describe_limits, on_gpu, slices_of, spawn_split, swarm_time

# a GPUSwarmSpawner server's TaskTemplate as `docker service inspect` gives it
SPAWNED = {
    "ContainerSpec": {
        "Image": "gpu-jupyterhub/singleuser:latest",
        "Args": ["start-singleuser"],
        "Env": ["JUPYTERHUB_USER=bench-template"],
    },
    "Resources": {
        "Limits": {"NanoCPUs": 500000000, "MemoryBytes": 2147483648, "Pids": 1024},
        "Reservations": {
            "NanoCPUs": 250000000,
            "GenericResources": [
                {"DiscreteResourceSpec": {"Kind": "GPU-simulated-aa-0", "Value": 1}}
            ],
        },
    },
    "RestartPolicy": {"Condition": "on-failure", "MaxAttempts": 0},
    "Networks": [{"Target": "k3x9"}],
    "ForceUpdate": 0,
}


def test_the_bare_server_keeps_the_hub_s_limits_and_takes_as_many_slices_elsewhere():
    bare = on_gpu(SPAWNED, "GPU-simulated-bb-1")
    assert bare["Resources"]["Limits"] == SPAWNED["Resources"]["Limits"]
    assert bare["Resources"]["Reservations"]["NanoCPUs"] == 250000000
    assert bare["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": "GPU-simulated-bb-1", "Value": 1}}
    ]
    assert bare["RestartPolicy"] == SPAWNED["RestartPolicy"]
    assert bare["ContainerSpec"] == SPAWNED["ContainerSpec"]
    assert bare["Networks"] == SPAWNED["Networks"]
    assert "ForceUpdate" not in bare
    # the hub's own template is left as it was
    assert (
        SPAWNED["Resources"]["Reservations"]["GenericResources"][0]["DiscreteResourceSpec"]["Kind"]
        == "GPU-simulated-aa-0"
    )


def test_a_template_without_slices_gets_one_and_the_limits_are_described():
    stock = {"ContainerSpec": {"Image": "x"}, "Resources": {}}
    assert slices_of(stock) == 0
    assert slices_of(on_gpu(stock, "GPU-x")) == 1
    assert describe_limits(SPAWNED) == (
        "limits cpu 0.5 cores, memory 2 GiB, pids 1024; reserves cpu 0.25 cores, memory -, "
        "1 GPU slice(s); restart on-failure"
    )
    assert describe_limits(stock) == (
        "limits cpu -, memory -, pids -; reserves cpu -, memory -, 0 GPU slice(s); "
        "restart any (Swarm's default)"
    )


def test_swarm_s_times_read_to_the_nanosecond_s_digits_we_keep():
    assert swarm_time("2026-11-26T10:21:17.250000000Z") == pytest.approx(1795688477.25)
    assert swarm_time("2026-11-26T10:21:17Z") == pytest.approx(1795688477.0)


def test_a_spawn_s_time_is_split_in_order_and_adds_up_to_post_to_ready():
    # the spawner began 0.2 s after the POST; its service 0.1 s later; the container ran 1.0 s
    # after that, answered 2.0 s later, and the hub said ready 0.3 s after the answer
    post, begun = 100.0, 100.2
    started = Event(
        begun + 3.5, "started", "u", seconds=3.5, phases={"created": 0.1, "answered": 3.1}
    )
    split = spawn_split(post, ready=begun + 3.1 + 0.3, started=started, running=begun + 1.1)
    assert list(split) == list(SPLIT)
    assert [round(v, 3) for v in split.values()] == [0.2, 0.1, 1.0, 2.0, 0.3]
    assert sum(split.values()) == pytest.approx(3.6)


def test_a_start_without_the_marks_has_no_split():
    assert spawn_split(0, 5, Event(4, "started", "u", seconds=3), running=2) is None
    partial = Event(4, "started", "u", seconds=3, phases={"created": 0.1})
    assert spawn_split(0, 5, partial, running=2) is None
