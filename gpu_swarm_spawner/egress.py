"""What a participant's server may reach: the organizer's GPUHUB_EGRESS setting, read once, and
the firewall of the server's own network namespace made from it.

Pure: ``read_egress`` is the setting's one reader (the settings' check and the spawner's trait
both use it) and ``server_rules`` gives the ``iptables-restore`` text the server's container
applies to itself before JupyterLab starts (``images/singleuser/gpuhub-firewall``; the spawner
starts the container as root with CAP_NET_ADMIN for that step only). Standard library only.

What every server gets, whatever the setting (docs/participants.md):

- on the servers' network, only the proxy's public port (the hub's API is reached through it)
  and, inbound, only connections to the server's own port: no other participant's server,
  nothing else of the stack;
- never the link-local range (the clouds' instance metadata address, 169.254.169.254, and its
  credentials), nor the swarm's machines (their engines, Swarm's ports, SSH);
- ``internet`` (the default): every public address, no private one (10/8, 172.16/12, 192.168/16,
  100.64/10); ``none``: nothing outside the hub; a list of entries: only those (host names,
  addresses or ranges, each with an optional port), private ones included when listed.

``off`` puts no firewall in the servers at all: only for an image without ``gpuhub-firewall``
(the benchmarks' stand-in servers), never for participants the organizer does not know.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .contract import LINK_LOCAL, PRIVATE

INTERNET, NONE, OFF = "internet", "none", "off"
#: the setting's example, for messages
EXAMPLE = "internet, none, or a list such as: pypi.org files.pythonhosted.org:443 10.2.0.0/16"
MODES = (INTERNET, NONE, OFF)

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


class EgressError(ValueError):
    """GPUHUB_EGRESS cannot be read; the message says what to write."""


@dataclass(frozen=True)
class Destination:
    """One entry of an egress list: a host name, an IPv4 address or range, and a TCP port (0:
    every port and protocol)."""

    host: str
    port: int = 0

    def written(self) -> str:
        return f"{self.host}:{self.port}" if self.port else self.host


@dataclass(frozen=True)
class Egress:
    """The setting, read: ``internet``, ``none`` or ``list`` with its ``allowed`` entries."""

    mode: str = INTERNET
    allowed: tuple[Destination, ...] = ()

    def written(self) -> str:
        """The one written form (what the stack hands the hub)."""
        if self.mode == "list":
            return " ".join(d.written() for d in self.allowed)
        return self.mode


def _entry(word: str) -> Destination:
    if "://" in word or ("/" in word and not word.partition("/")[0].replace(".", "").isdigit()):
        raise EgressError(
            f"{word!r} is not a host name, address or range; write e.g. pypi.org or "
            "files.pythonhosted.org:443 (no https://, no path)"
        )
    host, port = word, 0
    if word.count(":") == 1:
        host, _, text = word.partition(":")
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise EgressError(f"{word!r}: the port after ':' must be a number from 1 to 65535")
        port = int(text)
    elif ":" in word:
        raise EgressError(f"{word!r}: IPv6 is not supported; write an IPv4 address or a name")
    if "/" in host or host.replace(".", "").isdigit():
        try:
            network = ipaddress.IPv4Network(host, strict=False)
        except ValueError:
            raise EgressError(
                f"{word!r} is not an IPv4 address or range (e.g. 10.2.0.0/16)"
            ) from None
        if network.prefixlen == 0:
            raise EgressError(f"{word!r} is every address; write GPUHUB_EGRESS=internet instead")
        if network.overlaps(ipaddress.IPv4Network(LINK_LOCAL)):
            raise EgressError(
                f"{word!r} is link-local, where clouds serve the machine's credentials "
                "(169.254.169.254); servers never reach it"
            )
        return Destination(str(network) if "/" in host else str(network.network_address), port)
    name = host.lower().rstrip(".")
    if "/" in word or not _HOST.match(name):
        raise EgressError(
            f"{word!r} is not a host name, address or range; write e.g. pypi.org or "
            "files.pythonhosted.org:443 (no https://, no path)"
        )
    return Destination(name, port)


def read_egress(text: str) -> Egress:
    """GPUHUB_EGRESS: ``internet``, ``none``, or entries separated by spaces or commas."""
    words = text.replace(",", " ").split()
    if not words:
        raise EgressError(f"it is empty; write {EXAMPLE}")
    if len(words) == 1 and words[0].lower() in MODES:
        return Egress(words[0].lower())
    if {w.lower() for w in words} & set(MODES):
        raise EgressError(f"{text!r} mixes {'/'.join(MODES)} with a list; write one of {EXAMPLE}")
    allowed: list[Destination] = []
    for word in words:
        entry = _entry(word)
        if entry not in allowed:
            allowed.append(entry)
    return Egress("list", tuple(allowed))


@dataclass(frozen=True)
class ServerNetwork:
    """Where a server runs: the servers' network (its ranges), the proxy's port there, the
    server's own port, and the swarm's machines' addresses."""

    subnets: tuple[str, ...]
    proxy_port: int
    server_port: int
    machines: tuple[str, ...] = ()


def machine_addresses(nodes: list[dict]) -> tuple[str, ...]:
    """The IPv4 addresses the swarm's machines are known by (the Engine API's nodes: each
    one's address, a manager's listening address too), sorted."""
    found = set()
    for node in nodes:
        manager = ((node.get("ManagerStatus") or {}).get("Addr") or "").rpartition(":")[0]
        for addr in ((node.get("Status") or {}).get("Addr") or "", manager):
            try:
                address = ipaddress.IPv4Address(addr)
            except ValueError:
                continue
            if not address.is_unspecified and not address.is_loopback:
                found.add(str(address))
    return tuple(sorted(found, key=ipaddress.IPv4Address))


def _reject(*match: str) -> str:
    return " ".join(["-A OUTPUT", *match, "-j REJECT"])


def server_rules(egress: Egress, net: ServerNetwork) -> str:
    """The ``iptables-restore`` text (table filter) of a server's own network namespace.

    Host names of a list stay names: the container resolves them when it starts (the
    addresses a CDN gives there), one rule per address."""
    out = ["*filter", ":INPUT DROP [0:0]", ":FORWARD DROP [0:0]", ":OUTPUT ACCEPT [0:0]"]
    out += [
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        *(f"-A INPUT -s {s} -p tcp --dport {net.server_port} -j ACCEPT" for s in net.subnets),
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ]
    for subnet in net.subnets:  # the stack: the proxy's public port only
        out.append(f"-A OUTPUT -d {subnet} -p tcp --dport {net.proxy_port} -j ACCEPT")
        out.append(_reject("-d", subnet))
    if egress.mode != NONE:  # names: Docker's resolver asks the machine's, wherever it is
        out += [f"-A OUTPUT -p {p} --dport 53 -j ACCEPT" for p in ("udp", "tcp")]
    out.append(_reject("-d", LINK_LOCAL))
    out += [_reject("-d", f"{addr}/32") for addr in net.machines]
    for d in egress.allowed:
        port = f" -p tcp --dport {d.port}" if d.port else ""
        out.append(f"-A OUTPUT -d {d.host}{port} -j ACCEPT")
    if egress.mode == INTERNET:
        out += [_reject("-d", r) for r in PRIVATE]
    else:
        out.append(_reject())
    out.append("COMMIT")
    return "\n".join(out) + "\n"
