"""The bench's bare baseline runs the hub's own task template (issue 31: like with like)."""

from tests.bench.bench import describe_limits, on_gpu, slices_of

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
