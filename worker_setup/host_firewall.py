"""The machine's own rules for the containers it runs (docs/participants.md).

Every container on a swarm's overlay network reaches the outside through the engine's
``docker_gwbridge``. On a machine that runs participants' servers, what comes from there may
not reach:

- the cloud's instance metadata service (169.254.169.254, the machine's credentials) or any
  other link-local address (``GPUHUB-FORWARD``, hooked in Docker's own DOCKER-USER chain);
- the swarm's manager (``--manager``'s address: its engine, Swarm's ports, SSH), and the
  engine's and Swarm's ports of any machine on a private network (the other GPU machines);
- this machine itself (``GPUHUB-INPUT``, hooked in INPUT): nothing but name look-ups and, on the
  manager, the GPU guard's metrics port, which the stack's Prometheus scrapes from there, and
  the disk watch's port (``DISK_WATCH_PORT``), where the hub reads the manager's own disk report
  (disk_watch.py; a participant's server on the manager can read it too: server names, sizes).

Each participant's server also fences itself in (gpu_swarm_spawner/egress.py); these rules hold
for every container of the machine, whatever its image, and so also for a server that did not.

They are kept by a container of the machine's engine (``KEEPER``: the single-user image's
``gpuhub-firewall host``, with the host's network and CAP_NET_ADMIN, restart policy
``always``): the engine starts it again after its own restarts and the machine's reboots, and
it puts the rules back within ``CHECK_EVERY_S`` when something (a firewall reload) removed them.
``rules`` is pure; the join and `make demo` run ``ensure``/``remove`` through the engine (the
container's part shared with the disk watch: keepers.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

from gpu_swarm_spawner.contract import GUARD_METRICS_PORT, LABEL_PREFIX, LINK_LOCAL, PRIVATE

from . import keepers

KEEPER = "gpuhub-firewall"
#: the keeper's label holding a digest of what it keeps (the rules and its image)
DIGEST_LABEL = LABEL_PREFIX + "firewall"
CHECK_EVERY_S = 30
GWBRIDGE = "docker_gwbridge"
#: a Docker engine's and Swarm's ports: the engine's API (plain, TLS), Swarm's management,
#: gossip and overlay traffic
TCP, UDP = "2375,2376,2377,7946", "7946,4789"


@dataclass(frozen=True)
class Rules:
    """``iptables-restore --noflush`` text of our chains, and the rules that jump to them."""

    text: str
    hooks: tuple[str, ...]

    def digest(self, image: str) -> str:
        whole = "\n".join([image, self.text, *self.hooks])
        return hashlib.sha256(whole.encode()).hexdigest()[:16]


def _host(address: str) -> str:
    """ADDR of ``ADDR`` or ``ADDR:PORT`` (IPv4), "" when it is no IPv4 address."""
    host = address.rpartition(":")[0] if address.count(":") == 1 else address
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return ""


def rules(managers: list[str], guard_port: int = GUARD_METRICS_PORT, disk_port: int = 0) -> Rules:
    """The rules of a machine whose swarm's managers are at ``managers`` (ADDR or ADDR:PORT;
    none on the manager itself); ``guard_port`` (0: none) stays open to its containers, for the
    Prometheus of a stack on this machine, and ``disk_port`` (0: none) for its hub, which reads
    this machine's disk watch (disk_watch.py) there."""
    forward = [
        ":GPUHUB-FORWARD - [0:0]",
        "-A GPUHUB-FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
        "-A GPUHUB-FORWARD -p udp --dport 53 -j RETURN",
        "-A GPUHUB-FORWARD -p tcp --dport 53 -j RETURN",
        f"-A GPUHUB-FORWARD -d {LINK_LOCAL} -j REJECT",
    ]
    for manager in dict.fromkeys(filter(None, map(_host, managers))):
        forward.append(f"-A GPUHUB-FORWARD -d {manager}/32 -j REJECT")
    for network in PRIVATE:  # the other machines' engines and Swarm's ports, on a private net
        forward.append(
            f"-A GPUHUB-FORWARD -d {network} -p tcp -m multiport --dports {TCP} -j REJECT"
        )
        forward.append(
            f"-A GPUHUB-FORWARD -d {network} -p udp -m multiport --dports {UDP} -j REJECT"
        )
    into = [
        ":GPUHUB-INPUT - [0:0]",
        "-A GPUHUB-INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN",
        "-A GPUHUB-INPUT -p udp --dport 53 -j RETURN",
        "-A GPUHUB-INPUT -p tcp --dport 53 -j RETURN",
        *(
            f"-A GPUHUB-INPUT -p tcp --dport {port} -j RETURN"
            for port in (guard_port, disk_port)
            if port
        ),
        "-A GPUHUB-INPUT -j REJECT",
    ]
    text = "\n".join(["*filter", *forward, *into, "COMMIT", ""])
    hooks = (
        f"DOCKER-USER -i {GWBRIDGE} -j GPUHUB-FORWARD",
        f"INPUT -i {GWBRIDGE} -j GPUHUB-INPUT",
    )
    return Rules(text, hooks)


def _applier(image: str, wanted: Rules, what: str) -> list[str]:
    """``docker run`` arguments (the end) of the image's gpuhub-firewall WHAT with the host's
    network and ``wanted`` in its environment."""
    return [
        "--network=host",
        "--cap-add=NET_ADMIN",
        "--user=0",
        "--env",
        f"GPUHUB_HOST_RULES={wanted.text}",
        "--env",
        "GPUHUB_HOST_HOOKS=" + "\n".join(wanted.hooks),
        "--entrypoint=gpuhub-firewall",
        image,
        what,
    ]


def keeper_args(image: str, wanted: Rules) -> list[str]:
    """``docker run`` arguments of the keeper."""
    return [
        "--detach",
        "--name",
        KEEPER,
        "--restart=always",
        "--label",
        f"{DIGEST_LABEL}={wanted.digest(image)}",
        "--memory=64m",
        "--log-opt=max-size=1m",
        "--env",
        f"GPUHUB_FIREWALL_EVERY={CHECK_EVERY_S}",
        *_applier(image, wanted, "host"),
    ]


def remover_args(image: str, wanted: Rules) -> list[str]:
    """``docker run`` arguments of the one-off container that takes the rules out again."""
    return ["--rm", *_applier(image, wanted, "host-remove")]


WHAT = "containers here reach no metadata address, manager or port of this machine"
FIREWALL = "the machine's firewall"


class FirewallError(keepers.KeeperError):
    """The rules did not come out; the message says why."""


def ensure(
    docker, image: str, managers: list[str], guard_port: int, dry_run=False, disk_port: int = 0
) -> tuple:
    """The keeper runs here with these rules and ``image``: (changed, what it says). ``docker``
    is a DockerCLI (container, run_container, remove_container). Raises keepers.KeeperError."""
    wanted = rules(managers, guard_port, disk_port)
    args = keeper_args(image, wanted)
    done = keepers.keep(docker, KEEPER, DIGEST_LABEL, wanted.digest(image), args, FIREWALL, dry_run)
    if done == "kept":
        return False, f"kept ({WHAT})"
    if dry_run:
        return False, f"{done} its keeper {KEEPER} ({WHAT})"
    return True, f"{done} {KEEPER} ({WHAT})"


def remove(docker, dry_run=False) -> tuple:
    """The keeper gone, and its rules taken out by a one-off container of its image (with the
    rules it kept): (changed, what it says)."""
    now = keepers.remove(docker, KEEPER, FIREWALL, dry_run)
    if now is None:
        return False, "no rules of ours here"
    if dry_run:
        return False, f"would remove {KEEPER} and its rules"
    config = now.get("Config") or {}
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    kept = Rules(
        env.get("GPUHUB_HOST_RULES", ""), tuple(env.get("GPUHUB_HOST_HOOKS", "").split("\n"))
    )
    error = docker.run_container(*remover_args(config.get("Image") or "", kept))
    if error:
        raise FirewallError(f"the machine's firewall rules were not taken out: {error}")
    return True, f"removed {KEEPER} and its rules"
