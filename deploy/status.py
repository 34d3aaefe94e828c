"""`make status`: the swarm's machines, GPUs, free and used slices, running servers with
their GPU memory against their budget (from each GPU machine's guard), the waiting line (from
the hub's REST API) and, while the hub drives the GPU machines (``GPUHUB_FLEET=on``), the
fleet's machines and cost (its snapshot, ``fleet.json``, copied out of the hub's container).

    python -m deploy.status [--prefix jy] [--guard-port 9445]

``render``, ``guard_memory``, ``render_line`` and ``render_fleet`` are pure (plain dicts from
the Docker API, the hub's user models, metrics text and the fleet's snapshot in, text out);
``main`` reads the manager's Docker API, each machine's guard metrics and the hub.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from collections.abc import Mapping

from gpu_swarm_spawner import fleet_view, guards
from gpu_swarm_spawner.contract import SERVICE_PREFIX, USER_LABEL, is_mig, is_simulated
from gpu_swarm_spawner.inventory import (
    build_inventory,
    gpu_kinds,
    kinds_on_several_nodes,
    task_reservations,
    totals,
    used_slices,
)
from gpu_swarm_spawner.tasks import is_live


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


#: (user, GPU UUID) -> (bytes used, bytes of the budget or None), as the guards report them
Memory = Mapping[tuple[str, str], tuple[float, float | None]]


def guard_memory(texts: list[str]) -> dict[tuple[str, str], tuple[float, float | None]]:
    """Each participant's GPU memory and budget from the guards' metrics (Prometheus text)."""
    return guards.read_metrics(texts).participants


def _memory(memory: Memory | None, user: str, gpus) -> str:
    if memory is None:
        return "-"
    found = [memory[(user, gpu)] for gpu in gpus if (user, gpu) in memory]
    if not found:
        return "?"
    used, budget = found[0]
    gb = 1024**3
    shown = f"{used / gb:.1f}" + (f" / {budget / gb:.1f} GB" if budget else " GB")
    return shown + (" OVER" if budget and used > budget else "")


def render(
    nodes: list[dict],
    tasks: list[dict],
    services: list[dict],
    prefix: str = SERVICE_PREFIX,
    memory: Memory | None = None,
    silent: tuple[str, ...] = (),
) -> str:
    """Machines with their GPUs and slices, then one line per participant's server. MIG
    instances count among a machine's GPUs, marked ``MIG`` (as is a server holding one).
    ``memory``: the guards' figures (None: not read); ``silent``: machines whose guard did not
    answer."""
    used_on = used_slices(tasks)  # on every machine, paused or drained ones too
    rows = [["machine", "state", "availability", "GPUs", "slices used/total", "note"]]
    for node in sorted(nodes, key=lambda n: n["Description"].get("Hostname", "")):
        kinds = gpu_kinds(node)
        used = sum(min(used_on.get(uuid, 0), n) for uuid, n in kinds.items())
        simulated = any(is_simulated(uuid) for uuid in kinds)
        migs = sum(is_mig(uuid) for uuid in kinds)
        rows.append(
            [
                node["Description"].get("Hostname", node["ID"][:12]),
                node.get("Status", {}).get("State", "?"),
                node.get("Spec", {}).get("Availability", "?"),
                f"{len(kinds)} ({migs} MIG)" if migs else str(len(kinds)),
                f"{used}/{sum(kinds.values())}" if kinds else "-",
                "; ".join(
                    note
                    for note, shown in (
                        ("simulated GPUs", simulated),
                        ("guard: no answer", node["ID"] in silent),
                    )
                    if shown
                ),
            ]
        )
    used, total = totals(build_inventory(nodes, tasks))
    lines = ["GPU machines", *_table(rows), ""]
    lines.append(f"  {total - used} of {total} slices free on schedulable machines")
    for uuid, names in kinds_on_several_nodes(nodes).items():
        lines.append(
            f"  {uuid} is advertised by {' and '.join(names)}: no server starts on it (Swarm "
            "could place it on either). Give each machine its own /etc/machine-id (machines "
            "cloned from one image share simulated GPUs), then run its join line again"
        )

    specs = {s["ID"]: s["Spec"] for s in services}
    hosts = {n["ID"]: n["Description"].get("Hostname", n["ID"][:12]) for n in nodes}
    servers = [["server", "user", "machine", "GPU", "slices", "GPU memory", "state"]]
    for task in tasks:
        spec = specs.get(task.get("ServiceID"), {})
        name = spec.get("Name", "")
        if not name.startswith(prefix + "-") or not is_live(task):
            continue
        held = task_reservations(task)
        labels = spec.get("Labels", {})
        servers.append(
            [
                name,
                labels.get(USER_LABEL, "?"),
                hosts.get(task.get("NodeID"), "-"),
                ", ".join(f"{u} (MIG)" if is_mig(u) else u for u in held) or "-",
                str(sum(held.values())),
                _memory(memory, labels.get(USER_LABEL, "?"), held),
                task["Status"]["State"],
            ]
        )
    servers[1:] = sorted(servers[1:])
    lines += ["", f"Servers ({len(servers) - 1})"]
    lines += _table(servers) if len(servers) > 1 else ["  none"]
    return "\n".join(lines)


def waiting(users: list[dict]) -> list[tuple[float, str]]:
    """The participants in the waiting line, head first, as ``(joined, user[/server])``, from
    the hub's user models (their servers' state, which the spawner writes on joining)."""
    found = []
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            joined = (server.get("state") or {}).get("line_joined")
            if server.get("pending") == "spawn" and joined:
                found.append((float(joined), f"{user['name']}/{name}" if name else user["name"]))
    return sorted(found)


def render_line(line: list[tuple[float, str]], now: float) -> str:
    """The waiting line as ``make status`` prints it."""
    rows = [["place", "user", "waiting since", "waited"]]
    for place, (joined, who) in enumerate(line, start=1):
        since = time.strftime("%H:%M:%S", time.localtime(joined))
        rows.append([str(place), who, since, f"{(now - joined) / 60:.0f} min"])
    return "\n".join([f"Waiting line ({len(line)})", *(_table(rows) if line else ["  nobody"])])


def read_line(environ: Mapping[str, str] | None = None) -> str:
    """The waiting line from the hub's REST API (the operations token), or why not."""
    import os

    from . import settings, stack

    try:
        config = settings.read()
        token_file = os.path.join(config.state_dir, "ops_token")
        with open(token_file) as f:
            token = f.read().strip()
        status, body = stack.hub_get(
            config, "/hub/api/users?state=active", token, environ or os.environ
        )
    except (OSError, settings.SettingsError, ValueError) as e:
        return f"Waiting line: not read ({e})"
    except Exception as e:  # http.client's errors: the hub is not up
        return f"Waiting line: the hub did not answer ({type(e).__name__}: {e})"
    if status != 200:
        return f"Waiting line: the hub answered {status}"
    return render_line(waiting(json.loads(body)), time.time())


#: The hub's dashboard folder inside its container (deploy/stack.yml's hub-data volume at
#: jupyterhub_config.py's DATA), where the fleet's keeper writes fleet.json.
HUB_DASHBOARD_DIR = "/srv/jupyterhub/data/dashboard"


def _clock(t: float | None) -> str:
    return "unknown" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def _known(value) -> str:
    return "unknown" if value is None else str(value)


def render_fleet(fleet: dict, decisions: int = 5) -> str:
    """The fleet (``fleet_view.read``) as ``make status`` prints it: the provider's failure
    first, the machines with their state and reason, what is on its way, the cost, and the
    latest ``decisions``."""
    lines = ["GPU machines the hub asks for (GPUHUB_FLEET)"]
    if fleet["stale"]:
        lines.append(f"  {fleet['stale_line']} (written {_clock(fleet['at'])})")
    provider = fleet["provider"]
    last = provider["last"]
    if last and last["failed"]:
        lines += [
            f"  The cloud's provider failed: {last['kind']} ({_known(last['action'])}, at "
            f"{_clock(last['at'])})",
            f"    what to do: {_known(last['advice'])}",
            f"    its last output line: {last['output'] or '(none)'}",
        ]
    if provider["blocked"]:
        lines.append(
            f"  Back-off: nothing is asked of the cloud until {_clock(provider['blocked_until'])}"
        )
    rows = [["machine", "state", "since", "servers", "free/total slices", "reason"]]
    for m in fleet["machines"]:
        rows.append(
            [
                _known(m["name"]),
                _known(m["words"]),
                _clock(m["since"]),
                _known(m["servers"]),
                f"{_known(m['free'])}/{_known(m['slices'])}",
                _known(m["reason"]),
            ]
        )
    lines += _table(rows) if len(rows) > 1 else ["  none"]
    coming = fleet["coming"]
    if coming:
        ready = f" (about {_clock(coming['ready_at'])})" if coming["ready_at"] else ""
        lines.append(f"  {coming['line']}{ready}")
    lines.append(
        f"  At least {_known(fleet['floor'])} machine(s) now (minimum {_known(fleet['min'])}, "
        f"maximum {_known(fleet['max'])})"
    )
    lines.append(f"  {fleet['group_line']}")
    lines.append(f"  Cost: {fleet['cost']['line']}")
    if fleet["decisions"]:
        lines.append("  Latest decisions (newest first):")
        for d in fleet["decisions"][:decisions]:
            machine = f" {d['machine']}" if d["machine"] else ""
            lines.append(
                f"    {_clock(d['at'])}  {_known(d['action'])}{machine}: {_known(d['reason'])}"
            )
    return "\n".join(lines)


def _archived_file(chunks) -> bytes:
    """The one file of a ``get_archive`` answer (a tar stream)."""
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = next((m for m in tar.getmembers() if m.isfile()), None)
        found = tar.extractfile(member) if member is not None else None
        return found.read() if found is not None else b""


def read_fleet(client, stack: str, now: float) -> dict | None:
    """The fleet's snapshot, copied out of the hub's container (its data volume is the hub's,
    on the manager it runs on) through the engine's API; None when there is none: the fleet
    is off, or the hub runs on another manager or not at all."""
    from docker.errors import NotFound

    running = client.api.tasks(filters={"service": f"{stack}_hub", "desired-state": "running"})
    for task in running:
        container = task.get("Status", {}).get("ContainerStatus", {}).get("ContainerID")
        if not container:
            continue
        try:
            chunks, _ = client.api.get_archive(
                container, f"{HUB_DASHBOARD_DIR}/{fleet_view.FLEET_FILE}"
            )
            return fleet_view.read(_archived_file(chunks), now)
        except NotFound:  # not on this engine, or no snapshot written
            continue
    return None


def scrape_guards(nodes: list[dict], port: int) -> tuple[list[str], tuple[str, ...]]:
    """The metrics text of each GPU machine's guard, and the machines whose guard did not
    answer (``gpu_swarm_spawner.guards.scrape``)."""
    return guards.scrape(nodes, port)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prefix", default=SERVICE_PREFIX, help="service name prefix of user servers"
    )
    parser.add_argument(
        "--guard-port", type=int, default=None, help="the guards' metrics port (the settings')"
    )
    args = parser.parse_args(argv)
    from . import settings

    try:
        config = settings.read()
    except settings.SettingsError:
        config = None
    if args.guard_port is None:
        args.guard_port = config.guard_metrics_port if config else 0
    import docker

    try:
        client = docker.from_env()
        nodes, tasks = client.api.nodes(), client.api.tasks()
        services = client.api.services()
    except docker.errors.APIError as e:
        print(f"status: {e.explanation}; run this on a swarm manager", file=sys.stderr)
        return 1
    except docker.errors.DockerException as e:
        print(f"status: cannot reach the Docker engine ({e}); is it running?", file=sys.stderr)
        return 1
    memory, silent = None, ()
    if args.guard_port:
        texts, silent = scrape_guards(nodes, args.guard_port)
        memory = guard_memory(texts)
    print(render(nodes, tasks, services, args.prefix, memory, silent))
    print()
    print(read_line())
    fleet = None
    if config is not None:
        try:
            fleet = read_fleet(client, config.stack, time.time())
        except (docker.errors.APIError, tarfile.TarError) as e:
            print(f"\nGPU machines the hub asks for: not read ({e})")
    if fleet is not None:
        print()
        print(render_fleet(fleet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
