"""dockerspawner's options that GPUSwarmSpawner must honour, and the pids limit it adds.

Each test drives the spawner against the fake Docker client (tests/unit/fake_docker.py).
Servers that must answer are TCP listeners on the loopback interface.
"""

import asyncio
from types import SimpleNamespace

import pytest
from traitlets import TraitError

from gpu_swarm_spawner.holding import Holding

from .clusters import node
from .fake_docker import make_fake


@pytest.fixture
async def listener():
    """A TCP server on 127.0.0.1 standing in for JupyterLab; ``accepted`` counts connections."""
    accepted = []

    async def answer(reader, writer):
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield SimpleNamespace(port=port, accepted=accepted)
    server.close()
    await server.wait_closed()


def generic_of(created: dict) -> set:
    """(kind, value) of every generic resource the service reserves."""
    generic = created["task_template"]["Resources"]["Reservations"]["GenericResources"]
    return {(spec["Kind"], spec["Value"]) for entry in generic for spec in entry.values()}


# ---- use_internal_hostname (internal_ssl) ----------------------------------------------------


async def test_with_internal_ssl_the_hub_connects_by_the_name_on_the_certificate():
    spawner = make_fake(internal_ssl=True)
    assert spawner.use_internal_hostname  # dockerspawner turns it on with internal_ssl
    spawner.task_ip = "127.0.0.3"  # the task's address is known, but not on the certificate
    ip, port = await spawner.get_ip_and_port()
    assert (ip, port) == (spawner.object_name, 8888)
    assert f"DNS:{ip}" in spawner.ssl_alt_names


async def test_with_internal_hostname_the_probe_dials_the_name_too(listener):
    spawner = make_fake(use_internal_hostname=True, probe_server=True, port=listener.port)
    spawner.object_name = "localhost"  # a name that resolves here, to the listener
    # the task's address does not answer: the probe must not wait on it
    await asyncio.wait_for(spawner.wait_for_port("127.0.0.3"), timeout=3)
    assert listener.accepted


# ---- extra_resources_spec["generic_resources"]: a dict or a list -----------------------------

CONFIGURED = {
    "dict": {"fpga": 1, "ssd": "fast", "GPU-b": 7},
    "list": [
        {"DiscreteResourceSpec": {"Kind": "fpga", "Value": 1}},
        {"NamedResourceSpec": {"Kind": "ssd", "Value": "fast"}},
        {"DiscreteResourceSpec": {"Kind": "GPU-b", "Value": 7}},
    ],
}


@pytest.mark.parametrize("form", CONFIGURED)
async def test_generic_resources_may_be_a_dict_or_a_list_and_keep_the_gpu_slices(form):
    spawner = make_fake(extra_resources_spec={"generic_resources": CONFIGURED[form]})
    spawner.holding = Holding(gpu="GPU-b", slices=2)
    await spawner.create_object()
    # the configured resources stay; the server's own slices replace a configured GPU-b
    assert generic_of(spawner.created[-1]) == {("fpga", 1), ("ssd", "fast"), ("GPU-b", 2)}


# ---- use_internal_ip = False: host_ip and the published port ---------------------------------


async def test_without_internal_ips_the_service_publishes_its_port_through_the_routing_mesh():
    spawner = make_fake(use_internal_ip=False)
    spawner.holding = Holding(gpu="GPU-b", slices=1)
    await spawner.create_object()  # the fake refuses ingress ports with dnsrr, as Swarm does
    endpoint = spawner.created[-1]["endpoint_spec"]
    assert endpoint.get("Mode") != "dnsrr"
    assert [(p["TargetPort"], p.get("PublishMode", "ingress")) for p in endpoint["Ports"]] == [
        (8888, "ingress")
    ]


async def test_without_internal_ips_the_hub_and_the_probe_go_to_the_published_port(listener):
    spawner = make_fake(
        use_internal_ip=False, host_ip="127.0.0.1", probe_server=True, http_timeout=3
    )
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.published_port = listener.port  # Swarm publishes the server's 8888 there
    # the task's address and the service name do not answer here
    assert await asyncio.wait_for(spawner.start(), timeout=10) == ("127.0.0.1", listener.port)
    assert listener.accepted, "the probe never dialled host_ip and the published port"


async def test_without_internal_ips_a_missing_published_port_fails_the_start_clearly():
    spawner = make_fake(use_internal_ip=False, extra_endpoint_spec={"ports": {}}, probe_server=True)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    with pytest.raises(RuntimeError, match="publishes no port for the server's port 8888"):
        await asyncio.wait_for(spawner.start(), timeout=10)
    assert spawner.services == {}  # and its service is gone


async def test_poll_does_not_call_a_server_replaced_when_the_hub_does_not_route_by_address():
    for options, routed in [
        ({"use_internal_ip": False, "host_ip": "127.0.0.1"}, "127.0.0.1"),
        ({"use_internal_hostname": True}, None),
    ]:
        spawner = make_fake(**options)
        spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
        spawner.holding = Holding(gpu="GPU-a0", slices=1)
        spawner.object_id = (await spawner.create_object())["ID"]
        spawner.server = SimpleNamespace(ip=routed or spawner.object_name)
        assert await spawner.poll() is None, options


# ---- pids_limit --------------------------------------------------------------------------------


async def test_pids_limit_reaches_the_service_beside_the_other_limits():
    spawner = make_fake(pids_limit=512, mem_limit="1G", cpu_limit=2)
    spawner.holding = Holding(gpu="GPU-b", slices=1)
    await spawner.create_object()
    limits = spawner.created[-1]["task_template"]["Resources"]["Limits"]
    assert limits == {"Pids": 512, "MemoryBytes": 1024**3, "NanoCPUs": 2_000_000_000}


async def test_no_pids_limit_by_default():
    spawner = make_fake()
    assert spawner.pids_limit == 0
    spawner.holding = Holding(gpu="GPU-b", slices=1)
    await spawner.create_object()
    assert "Pids" not in spawner.created[-1]["task_template"]["Resources"].get("Limits", {})


def test_a_negative_pids_limit_is_refused_with_advice():
    with pytest.raises(TraitError, match=r"pids_limit must be 0 \(no limit\) or more, got -1"):
        make_fake(pids_limit=-1)


# ---- the port probe ---------------------------------------------------------------------------


async def test_the_server_is_probed_only_once_its_task_runs(listener):
    """Dialled while the task had an address but no running container, the server's address
    answered about 0.25 s late on the bed's machines: the probe waits for the task to run."""
    spawner = make_fake(probe_server=True, port=listener.port, task_poll_interval=0.01)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.task_address = "127.0.0.1"  # where the stand-in server listens
    spawner.task_states = [{"State": "starting", "Message": "starting"}]
    start = asyncio.ensure_future(spawner.start())
    for _ in range(500):  # until the task was read many times, "starting"
        if len(spawner.called("tasks")) >= 20 or start.done():
            break
        await asyncio.sleep(0.01)
    assert listener.accepted == [] and not start.done()
    (service,) = spawner.services.values()
    service["task"]["Status"] = {"State": "running", "Message": "started"}
    await asyncio.wait_for(start, timeout=5)
    assert listener.accepted  # probed once it ran, and the start ended when it answered
