"""Firewall rules applied from inside the single-user image (standard library only).

``gpuhub-firewall server -- CMD...`` is a participant's server's first step: the spawner starts
the container as root with CAP_NET_ADMIN, this applies GPUHUB_FIREWALL (``iptables-restore``
text the hub made, gpu_swarm_spawner/egress.py) to the container's own network namespace, closes
IPv6, then becomes jovyan (uid 1000) with no capabilities left, not even in its bounding set,
and no way to gain any (no_new_privs), and runs CMD. Rules that cannot be applied stop the
server: it never runs unfenced.

``gpuhub-firewall host`` keeps a machine's own rules in place (worker_setup/host_firewall.py
makes them; the join runs this in a container of the machine's engine with the host's network,
restarted by the engine after its restarts and the machine's reboots): GPUHUB_HOST_RULES (our
chains, ``iptables-restore --noflush`` text) and GPUHUB_HOST_HOOKS (one rule per line that jumps
to them, e.g. ``DOCKER-USER -i docker_gwbridge -j GPUHUB-GWBRIDGE``), in the iptables of the
engine's own rules (nft or legacy: the one that holds DOCKER-USER), checked again every
GPUHUB_FIREWALL_EVERY seconds (30). ``gpuhub-firewall host-remove`` takes them out.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time

USER = "jovyan"
#: the chains of ours in a machine's rules: named GPUHUB-...
CHAIN = re.compile(r"^:(GPUHUB-[A-Z0-9-]+) ")
#: the iptables programs, the engine's own first where it can be told
BACKENDS = ("iptables", "iptables-nft", "iptables-legacy")


def say(message: str) -> None:
    print(f"gpuhub-firewall: {message}", file=sys.stderr, flush=True)


def _is_address(word: str) -> bool:
    try:
        ipaddress.IPv4Network(word, strict=False)
    except ValueError:
        return False
    return True


def resolve(host: str) -> list[str]:
    """The IPv4 addresses of ``host`` here, [] when it has none."""
    try:
        found = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({item[4][0] for item in found})


def with_addresses(rules: str, lookup=resolve) -> tuple[str, list[str]]:
    """``rules`` with each rule naming a host (``-d NAME``) written once per address it has
    here, and what could not be resolved (its rules left out: nothing is opened for it)."""
    out, missing = [], []
    for line in rules.splitlines():
        words = line.split()
        if "-d" in words and not _is_address(words[words.index("-d") + 1]):
            at = words.index("-d") + 1
            addresses = lookup(words[at])
            if not addresses:
                missing.append(words[at])
            for address in addresses:
                out.append(" ".join([*words[:at], f"{address}/32", *words[at + 1 :]]))
            continue
        out.append(line)
    return "\n".join(out) + "\n", missing


def restore(program: str, text: str, *options: str) -> str:
    """Run ``program-restore``; "" when it worked, else what it said."""
    try:
        done = subprocess.run(
            [f"{program}-restore", *options], input=text, capture_output=True, text=True
        )
    except OSError as e:
        return str(e)
    return "" if done.returncode == 0 else (done.stderr or done.stdout).strip()


IPV6_CLOSED = "\n".join(
    [
        "*filter",
        ":INPUT DROP [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT DROP [0:0]",
        "-A INPUT -i lo -j ACCEPT",
        "-A OUTPUT -o lo -j ACCEPT",
        "COMMIT",
        "",
    ]
)


def has_ipv6(path: str = "/proc/net/if_inet6") -> bool:
    """An IPv6 address besides loopback's in this network namespace."""
    try:
        with open(path) as f:
            return any(line.split()[-1] != "lo" for line in f if line.strip())
    except OSError:
        return False


def apply_server(rules: str) -> str:
    """Apply a server's rules to its own namespace; "" when done, else why not."""
    rules, missing = with_addresses(rules)
    for host in missing:
        say(f"{host} has no IPv4 address here: nothing opened for it")
    errors = []
    for program in ("iptables", "iptables-legacy"):
        error = restore(program, rules)
        if not error:
            break
        errors.append(f"{program}-restore: {error}")
    else:
        return "; ".join(errors)
    if has_ipv6():
        for program in ("ip6tables", "ip6tables-legacy"):
            if not restore(program, IPV6_CLOSED):
                break
        else:
            return "IPv6 could not be closed (ip6tables-restore failed)"
    return ""


def become_user(command: list[str], user: str = USER) -> None:
    """exec ``command`` as ``user``, with no capabilities and no way to gain any."""
    entry = pwd.getpwnam(user)
    os.environ.update(HOME=entry.pw_dir, USER=user, LOGNAME=user, SHELL=entry.pw_shell)
    setpriv = [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    os.execvp("setpriv", [*setpriv, *command])


def server(command: list[str]) -> int:
    if not command:
        say("usage: gpuhub-firewall server -- COMMAND [ARGS...]")
        return 2
    rules = os.environ.pop("GPUHUB_FIREWALL", "")
    if os.getuid() != 0:
        if rules:
            say("started as a user, not root: the server's firewall cannot be set up")
            return 1
        os.execvp(command[0], command)
    if rules:
        error = apply_server(rules)
        if error:
            say(
                f"the server's firewall could not be set up, so the server does not start: "
                f"{error}. The container needs CAP_NET_ADMIN and iptables (nft or legacy) "
                "in the machine's kernel; see docs/participants.md"
            )
            return 1
        say("the server's firewall is in place")
    become_user(command)
    return 1  # not reached


# ---- a machine's own rules ------------------------------------------------------------------


def iptables(program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([program, "-w", *args], capture_output=True, text=True)


def engine_backend() -> str:
    """The iptables program whose tables hold the engine's DOCKER-USER chain (the first that
    works when none does)."""
    working = []
    for program in BACKENDS:
        try:
            done = iptables(program, "-S", "DOCKER-USER")
        except OSError:
            continue
        if done.returncode == 0:
            return program
        working.append(program)
    return working[0] if working else BACKENDS[0]


def chains(rules: str) -> list[str]:
    return [m.group(1) for line in rules.splitlines() if (m := CHAIN.match(line))]


def current(program: str, rules: str) -> list[str]:
    """Our chains' rules as ``iptables -S`` prints them."""
    out = []
    for chain in chains(rules):
        done = iptables(program, "-S", chain)
        out += done.stdout.splitlines() if done.returncode == 0 else [f"missing {chain}"]
    return out


def ensure_host(program: str, rules: str, hooks: list[str], wanted: list[str] | None) -> list[str]:
    """Our chains as ``rules`` has them and each hook in place; ``wanted`` is what
    ``current`` gave right after the last write (None: never written). Returns it anew."""
    if wanted is None or current(program, rules) != wanted:
        error = restore(program, rules, "--noflush")
        if error:
            say(f"{program}-restore: {error}")
            return wanted or []
        say(f"rules written ({', '.join(chains(rules))})")
        wanted = current(program, rules)
    for hook in hooks:
        chain, *match = hook.split()
        if iptables(program, "-C", chain, *match).returncode != 0:
            done = iptables(program, "-I", chain, "1", *match)
            say(f"hooked: {hook}" if done.returncode == 0 else f"{hook}: {done.stderr.strip()}")
    return wanted


def remove_host(program: str, rules: str, hooks: list[str]) -> None:
    for hook in hooks:
        chain, *match = hook.split()
        while iptables(program, "-D", chain, *match).returncode == 0:
            pass
    for chain in chains(rules):
        iptables(program, "-F", chain)
        iptables(program, "-X", chain)


def host(remove: bool = False) -> int:
    rules = os.environ.get("GPUHUB_HOST_RULES", "")
    hooks = [h for h in os.environ.get("GPUHUB_HOST_HOOKS", "").splitlines() if h.strip()]
    if not rules:
        say("GPUHUB_HOST_RULES is empty: nothing to apply")
        return 2
    program = engine_backend()
    if remove:
        remove_host(program, rules, hooks)
        say(f"removed ({program})")
        return 0
    every = float(os.environ.get("GPUHUB_FIREWALL_EVERY", "30"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the rules stay when it stops
    say(f"keeping the machine's rules ({program}), checked every {every:g} s")
    wanted = None
    while True:
        wanted = ensure_host(program, rules, hooks, wanted)
        time.sleep(every)


def main(argv: list[str]) -> int:
    what, rest = (argv[0], argv[1:]) if argv else ("", [])
    if what == "server":
        return server(rest[1:] if rest[:1] == ["--"] else rest)
    if what in ("host", "host-remove"):
        return host(remove=what == "host-remove")
    say("usage: gpuhub-firewall server -- COMMAND... | host | host-remove")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
