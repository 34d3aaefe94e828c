"""The firewall's two halves: the single-user image's applier (images/singleuser/
gpuhub_firewall.py: a server's rules before it becomes jovyan, a machine's rules kept in place)
and a machine's rules (worker_setup/host_firewall.py), asked of a model of iptables
(iptables_model.py). The bed applies both for real (tests/integration/test_participant_reach.py).
"""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from gpu_swarm_spawner import contract
from worker_setup import host_firewall

from .iptables_model import Packet, verdict
from .start_command import SINGLEUSER


def applier():
    spec = importlib.util.spec_from_file_location(
        "gpuhub_firewall", SINGLEUSER / "gpuhub_firewall.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fw = applier()


# ---- a server's rules --------------------------------------------------------------------


def test_names_are_written_once_per_address_and_a_name_without_one_opens_nothing():
    rules = "\n".join(
        [
            "*filter",
            "-A OUTPUT -d pypi.org -p tcp --dport 443 -j ACCEPT",
            "-A OUTPUT -d nowhere.invalid -j ACCEPT",
            "-A OUTPUT -d 10.2.0.0/16 -j ACCEPT",
            "COMMIT",
        ]
    )
    found = {"pypi.org": ["151.101.0.223", "151.101.64.223"]}
    written, missing = fw.with_addresses(rules, lambda host: found.get(host, []))
    assert written.splitlines() == [
        "*filter",
        "-A OUTPUT -d 151.101.0.223/32 -p tcp --dport 443 -j ACCEPT",
        "-A OUTPUT -d 151.101.64.223/32 -p tcp --dport 443 -j ACCEPT",
        "-A OUTPUT -d 10.2.0.0/16 -j ACCEPT",
        "COMMIT",
    ]
    assert missing == ["nowhere.invalid"]


@pytest.fixture
def as_root(monkeypatch):
    """server() as root, with what it runs recorded instead of done."""
    done = {"restored": [], "became": None}
    monkeypatch.setattr(fw.os, "getuid", lambda: 0)
    monkeypatch.setattr(fw, "has_ipv6", lambda: True)

    def restore(program, text, *options):
        done["restored"].append(program)
        return done.get(program, "")

    def become(command, user=fw.USER):
        done["became"] = (command, user)
        return None

    monkeypatch.setattr(fw, "restore", restore)
    monkeypatch.setattr(fw, "become_user", become)
    return done


def test_a_server_applies_its_rules_then_becomes_jovyan_without_them_in_its_environment(
    as_root, monkeypatch
):
    monkeypatch.setenv("GPUHUB_FIREWALL", "*filter\nCOMMIT\n")
    fw.server(["start-singleuser", "--port=8888"])
    assert as_root["restored"] == ["iptables", "ip6tables"]
    assert as_root["became"] == (["start-singleuser", "--port=8888"], "jovyan")
    assert "GPUHUB_FIREWALL" not in fw.os.environ


def test_legacy_iptables_is_tried_when_nft_is_not_in_the_kernel(as_root, monkeypatch):
    monkeypatch.setenv("GPUHUB_FIREWALL", "*filter\nCOMMIT\n")
    as_root["iptables"] = "iptables-restore: Could not fetch rule set generation id"
    fw.server(["start-singleuser"])
    assert as_root["restored"][:2] == ["iptables", "iptables-legacy"]
    assert as_root["became"] is not None


def test_a_server_whose_rules_cannot_be_applied_does_not_start(as_root, monkeypatch, capsys):
    monkeypatch.setenv("GPUHUB_FIREWALL", "*filter\nCOMMIT\n")
    as_root["iptables"] = as_root["iptables-legacy"] = "Permission denied (you must be root)"
    assert fw.server(["start-singleuser"]) == 1
    assert as_root["became"] is None
    err = capsys.readouterr().err
    assert "the server's firewall could not be set up, so the server does not start" in err
    assert "CAP_NET_ADMIN" in err


def test_ipv6_that_cannot_be_closed_stops_the_server_too(as_root, monkeypatch):
    monkeypatch.setenv("GPUHUB_FIREWALL", "*filter\nCOMMIT\n")
    as_root["ip6tables"] = as_root["ip6tables-legacy"] = "no"
    assert fw.server(["start-singleuser"]) == 1
    assert as_root["became"] is None


def test_rules_given_to_a_server_started_as_a_user_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(fw.os, "getuid", lambda: 1000)
    monkeypatch.setenv("GPUHUB_FIREWALL", "*filter\nCOMMIT\n")
    assert fw.server(["start-singleuser"]) == 1
    assert "started as a user, not root" in capsys.readouterr().err


def test_ipv6_is_seen_only_beyond_loopback(tmp_path):
    inet6 = tmp_path / "if_inet6"
    inet6.write_text("00000000000000000000000000000001 01 80 10 80       lo\n")
    assert not fw.has_ipv6(str(inet6))
    inet6.write_text(inet6.read_text() + "fe800000000000000042acfffe120002 2c 40 20 80     eth0\n")
    assert fw.has_ipv6(str(inet6))
    assert not fw.has_ipv6(str(tmp_path / "none"))


def test_the_image_runs_the_applier_isolated_from_the_participants_files():
    """As root, in the participant's home: nothing there (a gpuhub_firewall.py of theirs),
    nor PYTHONPATH or their user site, may be imported in its place."""
    line = [
        w for w in (SINGLEUSER / "gpuhub-firewall").read_text().splitlines() if w.startswith("exec")
    ]
    assert line == ['exec python3 -I /usr/local/lib/gpu-jupyterhub/gpuhub_firewall.py "$@"']


# ---- a machine's rules ---------------------------------------------------------------------


def _hooked(rules: host_firewall.Rules, chain: str, packet: Packet) -> str:
    """The verdict with the hooks in place: DOCKER-USER (FORWARD's first rule) and INPUT jump
    to our chains for what comes from docker_gwbridge."""
    hooks = [h.replace("DOCKER-USER", "FORWARD") for h in rules.hooks]
    text = rules.text.replace("COMMIT", "\n".join(f"-A {h}" for h in hooks) + "\nCOMMIT")
    packet = Packet(**{**packet.__dict__, "into": host_firewall.GWBRIDGE})
    return verdict(text, chain, packet)


def test_a_machines_rules_close_metadata_the_manager_and_itself_to_its_containers():
    rules = host_firewall.rules(["10.0.0.5:2377"], guard_port=9445)
    for dst, port in [("169.254.169.254", 80), ("10.0.0.5", 2377), ("10.0.0.5", 22)]:
        assert _hooked(rules, "FORWARD", Packet(dst=dst, dport=port)) == "REJECT", dst
    assert _hooked(rules, "FORWARD", Packet(dst="151.101.0.223", dport=443)) == "ACCEPT"
    # another GPU machine on the cloud's network: its engine and Swarm's ports, not the rest
    for port, proto in [(2375, "tcp"), (2376, "tcp"), (2377, "tcp"), (7946, "tcp"),
                        (7946, "udp"), (4789, "udp")]:  # fmt: skip
        assert _hooked(rules, "FORWARD", Packet(dst="10.0.0.12", dport=port, proto=proto)) == (
            "REJECT"
        ), (port, proto)
    assert _hooked(rules, "FORWARD", Packet(dst="10.0.0.12", dport=443)) == "ACCEPT"
    assert _hooked(rules, "FORWARD", Packet(dst="151.101.0.223", dport=2377)) == "ACCEPT"
    assert _hooked(rules, "FORWARD", Packet(dst="169.254.169.254", dport=53, proto="udp")) == (
        "ACCEPT"
    )  # GCP's metadata server is its name server too
    for port in (22, 2375, 2376, 2377, 7946, 4789):
        assert _hooked(rules, "INPUT", Packet(dst="10.0.0.11", dport=port)) == "REJECT", port
    assert _hooked(rules, "INPUT", Packet(dst="10.0.0.11", dport=9445)) == "ACCEPT"
    assert _hooked(rules, "INPUT", Packet(dst="10.0.0.11", dport=22, state="ESTABLISHED")) == (
        "ACCEPT"
    )


def test_the_managers_containers_reach_its_disk_watch_and_no_other_port():
    """The hub, a container on the manager, reads the manager's own disk report; a GPU
    machine's rules (no disk_port: the join's) keep it closed to its containers."""
    port = contract.DISK_WATCH_PORT
    manager = host_firewall.rules([], guard_port=9445, disk_port=port)
    assert _hooked(manager, "INPUT", Packet(dst="10.0.0.5", dport=port)) == "ACCEPT"
    assert _hooked(manager, "INPUT", Packet(dst="10.0.0.5", dport=9445)) == "ACCEPT"
    assert _hooked(manager, "INPUT", Packet(dst="10.0.0.5", dport=port, proto="udp")) == "REJECT"
    for other in (22, 2377, port + 1):
        assert _hooked(manager, "INPUT", Packet(dst="10.0.0.5", dport=other)) == "REJECT", other
    gpu_machine = host_firewall.rules(["10.0.0.5:2377"], guard_port=9445)
    assert _hooked(gpu_machine, "INPUT", Packet(dst="10.0.0.11", dport=port)) == "REJECT"
    # the manager's rules before the disk watch, and a GPU machine's, are as they were
    assert host_firewall.rules([], 9445, disk_port=0) == host_firewall.rules([], 9445)


def test_what_does_not_come_from_the_containers_is_left_alone():
    rules = host_firewall.rules(["10.0.0.5"])
    text = rules.text.replace("COMMIT", "\n".join(f"-A {h}" for h in rules.hooks) + "\nCOMMIT")
    text = text.replace("DOCKER-USER", "FORWARD")
    assert verdict(text, "INPUT", Packet(dst="10.0.0.11", dport=22, into="eth0")) == "ACCEPT"
    assert verdict(text, "FORWARD", Packet(dst="169.254.169.254", dport=80, into="eth0")) == (
        "ACCEPT"
    )


def test_the_keepers_digest_follows_the_rules_and_the_image():
    a = host_firewall.rules(["10.0.0.5"])
    assert a.digest("su:1") == host_firewall.rules(["10.0.0.5:2377"]).digest("su:1")
    assert a.digest("su:1") != a.digest("su:2")
    assert a.digest("su:1") != host_firewall.rules(["10.0.0.6"]).digest("su:1")
    assert "-d fd00::1" not in host_firewall.rules(["[fd00::1]:2377"]).text


# ---- the keeper's loop ------------------------------------------------------------------


class FakeIptables:
    """iptables as ``ensure_host`` calls it: our chain's listing, -C/-I of the hooks."""

    def __init__(self):
        self.listing = ["-N GPUHUB-X", "-A GPUHUB-X -d 169.254.0.0/16 -j REJECT"]
        self.hooked: set[str] = set()
        self.writes = 0

    def iptables(self, program, *args):
        what, chain, *rest = args
        hook = " ".join([chain, *rest])
        code = 0
        out = ""
        if what == "-S":
            out = "\n".join(self.listing)
        elif what == "-C":
            code = 0 if hook in self.hooked else 1
        elif what == "-I":
            self.hooked.add(" ".join([chain, *rest[1:]]))
        return subprocess.CompletedProcess(args, code, out, "")

    def restore(self, program, text, *options):
        assert options == ("--noflush",)
        self.writes += 1
        return ""


def test_the_keeper_writes_once_and_again_only_when_the_rules_were_changed(monkeypatch):
    fake = FakeIptables()
    monkeypatch.setattr(fw, "iptables", fake.iptables)
    monkeypatch.setattr(fw, "restore", fake.restore)
    rules = ":GPUHUB-X - [0:0]\n-A GPUHUB-X -d 169.254.0.0/16 -j REJECT\n"
    hooks = ["DOCKER-USER -i docker_gwbridge -j GPUHUB-X"]
    wanted = fw.ensure_host("iptables", rules, hooks, None)
    assert fake.writes == 1 and fake.hooked == set(hooks)
    wanted = fw.ensure_host("iptables", rules, hooks, wanted)
    assert fake.writes == 1  # nothing changed
    fake.listing = ["-N GPUHUB-X"]  # flushed by someone else (a firewall reload)
    fake.hooked.clear()
    fw.ensure_host("iptables", rules, hooks, wanted)
    assert fake.writes == 2 and fake.hooked == set(hooks)
