"""A model of the iptables rules the project writes (``iptables-restore`` text, table filter),
for asking what happens to a packet: the first rule that matches decides (ACCEPT, REJECT,
DROP; RETURN goes back to the calling chain; a user chain's name jumps to it), else the
built-in chain's policy. Only the matches the project uses are known; any other word makes
the model refuse the rule, so it never ignores one silently. The bed's tests apply the same
text with the real iptables-restore."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

VERDICTS = ("ACCEPT", "REJECT", "DROP", "RETURN")


@dataclass(frozen=True)
class Packet:
    dst: str
    dport: int = 0
    proto: str = "tcp"
    src: str = "10.9.9.9"
    out: str = "eth0"
    into: str = "eth0"
    state: str = "NEW"


@dataclass
class Rule:
    matches: dict = field(default_factory=dict)
    target: str = ""


def parse(text: str) -> tuple[dict[str, str], dict[str, list[Rule]]]:
    """(policies of the built-in chains, rules of every chain) of one ``*filter`` table."""
    policies: dict[str, str] = {}
    chains: dict[str, list[Rule]] = {}
    for line in text.splitlines():
        if not line or line in ("*filter", "COMMIT") or line.startswith("#"):
            continue
        if line.startswith(":"):
            name, policy = line[1:].split()[:2]
            chains.setdefault(name, [])
            if policy != "-":
                policies[name] = policy
            continue
        words = line.split()
        assert words[0] == "-A", line
        chain, rule, i = words[1], Rule(), 2
        while i < len(words):
            word = words[i]
            if word in ("-i", "-o", "-s", "-d", "-p", "--dport", "--ctstate", "--dports", "-j"):
                value = words[i + 1]
                if word == "-j":
                    rule.target = value
                else:
                    rule.matches[word] = value
                i += 2
            elif word == "-m" and words[i + 1] in ("conntrack", "multiport"):
                i += 2
            else:
                raise AssertionError(f"the model does not know {word!r} in: {line}")
        chains.setdefault(chain, []).append(rule)
    return policies, chains


def _matches(rule: Rule, p: Packet) -> bool:
    m = rule.matches
    checks = [
        ("-i", lambda v: p.into == v),
        ("-o", lambda v: p.out == v),
        ("-s", lambda v: ipaddress.ip_address(p.src) in ipaddress.ip_network(v, strict=False)),
        ("-d", lambda v: ipaddress.ip_address(p.dst) in ipaddress.ip_network(v, strict=False)),
        ("-p", lambda v: p.proto == v),
        ("--dport", lambda v: p.dport == int(v)),
        ("--dports", lambda v: str(p.dport) in v.split(",")),
        ("--ctstate", lambda v: p.state in v.split(",")),
    ]
    return all(check(m[key]) for key, check in checks if key in m)


def verdict(text: str, chain: str, packet: Packet) -> str:
    """What the rules decide for ``packet`` entering built-in ``chain``."""
    policies, chains = parse(text)
    decided = _walk(chains, chain, packet)
    return decided if decided not in ("", "RETURN") else policies.get(chain, "ACCEPT")


def _walk(chains: dict[str, list[Rule]], chain: str, packet: Packet) -> str:
    for rule in chains.get(chain, []):
        if not _matches(rule, packet):
            continue
        if rule.target in VERDICTS:
            return rule.target
        decided = _walk(chains, rule.target, packet)
        if decided and decided != "RETURN":
            return decided
    return ""
