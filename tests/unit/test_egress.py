"""GPUHUB_EGRESS, read once (gpu_swarm_spawner/egress.py), and the firewall each server applies
to itself, followed on to the service the spawner creates. What the rules decide is asked of a
model of iptables (iptables_model.py); the bed applies them for real
(tests/integration/test_participant_reach.py)."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from deploy import settings
from deploy.envfile import merge, read_defaults
from gpu_swarm_spawner import egress, service_spec
from gpu_swarm_spawner.egress import EgressError, ServerNetwork, read_egress, server_rules

from .fake_docker import make_fake
from .iptables_model import Packet, verdict

SUBNET = "10.213.0.0/22"
NET = ServerNetwork(
    subnets=(SUBNET,), proxy_port=8000, server_port=8888, machines=("10.0.0.5", "203.0.113.7")
)
PROXY, OTHER_SERVER = "10.213.0.4", "10.213.0.9"


# ---- the setting, as organizers write it ---------------------------------------------------


@pytest.mark.parametrize(
    "written, mode, allowed",
    [
        ("internet", "internet", ""),
        (" Internet ", "internet", ""),
        ("none", "none", ""),
        ("off", "off", ""),
        ("pypi.org files.pythonhosted.org:443", "list", "pypi.org files.pythonhosted.org:443"),
        ("pypi.org, files.pythonhosted.org", "list", "pypi.org files.pythonhosted.org"),
        ("PyPI.org. pypi.org", "list", "pypi.org"),  # one name, its case and final dot aside
        ("10.2.3.4/16 198.51.100.7:8080", "list", "10.2.0.0/16 198.51.100.7:8080"),
    ],
)
def test_what_organizers_write_is_read_into_one_written_form(written, mode, allowed):
    read = read_egress(written)
    assert read.mode == mode
    assert read.written() == (allowed or mode)
    assert read_egress(read.written()) == read  # the stack hands the hub the written form


@pytest.mark.parametrize(
    "written, says",
    [
        ("", "it is empty"),
        ("https://pypi.org/simple", "no https://, no path"),
        ("pypi.org/simple", "no https://, no path"),
        ("169.254.169.254", "link-local"),
        ("169.254.0.0/16", "link-local"),
        ("0.0.0.0/0", "write GPUHUB_EGRESS=internet instead"),
        ("pypi.org:99999", "a number from 1 to 65535"),
        ("2001:db8::1", "IPv6 is not supported"),
        ("10.0.0.0/33", "not an IPv4 address or range"),
        ("internet pypi.org", "mixes internet/none/off with a list"),
        ("pypi_org", "not a host name"),
    ],
)
def test_what_cannot_work_is_refused_with_what_to_write(written, says):
    with pytest.raises(EgressError, match=says.replace("/", ".")):
        read_egress(written)


def test_the_settings_check_and_the_spawner_trait_use_the_one_reader():
    defaults = merge(read_defaults(str(settings.DEFAULTS)), {}, {}).values
    values = {**defaults, "GPUHUB_EGRESS": "https://pypi.org"}
    found = [p for p in settings.problems(values, mode="demo") if p.startswith("GPUHUB_EGRESS")]
    assert found == [f"GPUHUB_EGRESS: {_said('https://pypi.org')}"]
    spawner = make_fake()
    with pytest.raises(TraitError, match="no https://"):
        spawner.egress = "https://pypi.org"
    spawner.egress = "PyPI.org:443"
    assert spawner.egress == "pypi.org:443"


def _said(written: str) -> str:
    try:
        read_egress(written)
    except EgressError as e:
        return str(e)
    raise AssertionError(f"{written!r} was taken")


# ---- what the rules decide ---------------------------------------------------------------


def out(rules: str, dst: str, port: int = 443, proto: str = "tcp") -> str:
    return verdict(rules, "OUTPUT", Packet(dst=dst, dport=port, proto=proto))


@pytest.mark.parametrize("mode", ["internet", "none", "pypi.org 10.2.0.0/16"])
def test_every_mode_reaches_the_proxy_and_nothing_else_of_the_stack(mode):
    rules = server_rules(read_egress(mode), NET)
    assert out(rules, PROXY, 8000) == "ACCEPT"
    for port in (8081, 8001, 8888, 9090, 5000, 22):  # the hub, the proxy's API, a server...
        assert out(rules, PROXY, port) == "REJECT", port
        assert out(rules, OTHER_SERVER, port) == "REJECT", port
    for dst, port in [("169.254.169.254", 80), ("169.254.170.2", 80), ("10.0.0.5", 2377),
                      ("203.0.113.7", 22), ("203.0.113.7", 2375)]:  # fmt: skip
        assert out(rules, dst, port) == "REJECT", (dst, port)
    # answers to connections made to it, and its own loopback, always pass
    assert verdict(rules, "OUTPUT", Packet(dst="1.2.3.4", state="ESTABLISHED")) == "ACCEPT"
    assert verdict(rules, "OUTPUT", Packet(dst="127.0.0.1", out="lo")) == "ACCEPT"


def test_only_the_servers_port_takes_connections_and_only_from_the_servers_network():
    rules = server_rules(read_egress("internet"), NET)
    assert verdict(rules, "INPUT", Packet(dst="10.213.0.8", dport=8888, src=PROXY)) == "ACCEPT"
    for src, port in [(PROXY, 22), (PROXY, 8889), ("172.18.0.1", 8888), ("8.8.8.8", 8888)]:
        assert verdict(rules, "INPUT", Packet(dst="10.213.0.8", dport=port, src=src)) == "DROP"


def test_internet_is_every_public_address_and_no_private_one():
    rules = server_rules(read_egress("internet"), NET)
    assert out(rules, "151.101.0.223") == "ACCEPT"  # pypi.org's
    assert out(rules, "8.8.8.8", 53, "udp") == "ACCEPT"
    for private in ("10.1.2.3", "172.16.5.5", "172.31.255.1", "192.168.1.1", "100.64.0.1"):
        assert out(rules, private) == "REJECT", private
    # names: Docker's resolver asks the machine's, which may be a private address
    assert out(rules, "10.0.0.2", 53, "udp") == "ACCEPT"


def test_none_is_nothing_not_even_names_outside():
    rules = server_rules(read_egress("none"), NET)
    for dst, port, proto in [("151.101.0.223", 443, "tcp"), ("8.8.8.8", 53, "udp")]:
        assert out(rules, dst, port, proto) == "REJECT"


def test_a_list_opens_what_it_names_private_ranges_too_but_never_a_machine():
    rules = server_rules(read_egress("198.51.100.7:443 10.2.0.0/16 10.0.0.5"), NET)
    assert out(rules, "198.51.100.7", 443) == "ACCEPT"
    assert out(rules, "198.51.100.7", 22) == "REJECT"  # that port only
    assert out(rules, "10.2.9.9", 5432) == "ACCEPT"
    assert out(rules, "10.0.0.5", 2377) == "REJECT"  # a machine of the swarm, listed or not
    assert out(rules, "151.101.0.223") == "REJECT"  # not listed


def test_names_stay_names_for_the_container_to_look_up():
    rules = server_rules(read_egress("pypi.org:443"), NET)
    assert "-A OUTPUT -d pypi.org -p tcp --dport 443 -j ACCEPT" in rules.splitlines()


def test_the_machines_are_every_nodes_address_and_a_managers_listening_one():
    nodes = [
        {"Status": {"Addr": "10.0.0.11"}},
        {"Status": {"Addr": "0.0.0.0"}, "ManagerStatus": {"Addr": "10.0.0.5:2377"}},
        {"Status": {"Addr": "127.0.0.1"}},
        {"Status": {}},
    ]
    assert egress.machine_addresses(nodes) == ("10.0.0.5", "10.0.0.11")


# ---- followed on to the server's service -------------------------------------------------


async def test_the_spawner_gives_the_server_its_firewall_and_root_only_to_apply_it():
    spawner = make_fake()
    spawner.nodes = [{"ID": "n1", "Status": {"Addr": "10.0.0.11"}}]
    spawner.subnets = ["10.0.7.0/24"]
    spawner.broker.last_nodes = spawner.nodes
    spec = service_spec.create_kwargs(await spawner.server_spec())
    container = spec["task_template"]["ContainerSpec"]
    assert container["Command"] == service_spec.FIREWALL_COMMAND
    assert container["User"] == "0" and container["CapabilityAdd"] == ["CAP_NET_ADMIN"]
    env = dict(line.split("=", 1) for line in container["Env"])
    assert env["HOME"] == "/home/jovyan"
    rules = env["GPUHUB_FIREWALL"]
    assert verdict(rules, "OUTPUT", Packet(dst="10.0.7.3", dport=8000)) == "ACCEPT"
    assert verdict(rules, "OUTPUT", Packet(dst="10.0.7.3", dport=8081)) == "REJECT"
    assert verdict(rules, "OUTPUT", Packet(dst="10.0.0.11", dport=7946)) == "REJECT"
    assert container["Args"][:1] == spawner.cmd  # the server's own command comes after


async def test_egress_off_starts_the_server_as_the_image_says():
    spawner = make_fake(egress="off")
    spec = service_spec.create_kwargs(await spawner.server_spec())
    container = spec["task_template"]["ContainerSpec"]
    assert not container.get("Command") and not container.get("User")
    assert "CapabilityAdd" not in container
    assert not any(e.startswith("GPUHUB_FIREWALL=") for e in container.get("Env") or [])
