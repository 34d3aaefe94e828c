"""`make status`: the swarm's machines, GPUs, free and used slices, and running servers.

    python -m deploy.status [--prefix jy]

``render`` is pure (plain dicts from the Docker API in, text out); ``main`` reads the manager's
Docker API.
"""

from __future__ import annotations

import argparse
import sys

from gpu_swarm_spawner.contract import SERVICE_PREFIX, USER_LABEL, is_mig, is_simulated
from gpu_swarm_spawner.inventory import (
    build_inventory,
    gpu_kinds,
    task_reservations,
    totals,
    used_slices,
)
from gpu_swarm_spawner.tasks import is_live


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def render(
    nodes: list[dict], tasks: list[dict], services: list[dict], prefix: str = SERVICE_PREFIX
) -> str:
    """Machines with their GPUs and slices, then one line per participant's server. MIG
    instances count among a machine's GPUs, marked ``MIG`` (as is a server holding one)."""
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
                "simulated GPUs" if simulated else "",
            ]
        )
    used, total = totals(build_inventory(nodes, tasks))
    lines = ["GPU machines", *_table(rows), ""]
    lines.append(f"  {total - used} of {total} slices free on schedulable machines")

    specs = {s["ID"]: s["Spec"] for s in services}
    hosts = {n["ID"]: n["Description"].get("Hostname", n["ID"][:12]) for n in nodes}
    servers = [["server", "user", "machine", "GPU", "slices", "state"]]
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
                task["Status"]["State"],
            ]
        )
    servers[1:] = sorted(servers[1:])
    lines += ["", f"Servers ({len(servers) - 1})"]
    lines += _table(servers) if len(servers) > 1 else ["  none"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prefix", default=SERVICE_PREFIX, help="service name prefix of user servers"
    )
    args = parser.parse_args(argv)
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
    print(render(nodes, tasks, services, args.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
