"""What the organizer's dashboard shows, built from what was read (pure: plain dicts and
figures in, one JSON-ready dict out). ``app.py`` does the reading and serves the page.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..contract import SERVICE_PREFIX, USER_LABEL, is_mig, is_simulated
from ..events import DISK_STOP, Event, Waiting
from ..guards import GuardFigures
from ..inventory import gpu_kinds, task_reservations, used_slices
from ..tasks import is_live

#: how many recent starts, and recent refusals and failures, the page lists
RECENT = 25
#: spawn durations over this many seconds back make the p50/p95 figures
SPAWN_WINDOW_S = 3600


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _servers(tasks: list[dict], services: list[dict], prefix: str) -> list[dict]:
    """The participants' live servers: user, node, the GPU slices held (``{uuid: n}``)."""
    specs = {s["ID"]: s.get("Spec", {}) for s in services}
    found = []
    for task in tasks:
        spec = specs.get(task.get("ServiceID"), {})
        if not spec.get("Name", "").startswith(prefix + "-") or not is_live(task):
            continue
        found.append(
            {
                "user": spec.get("Labels", {}).get(USER_LABEL, "?"),
                "node": task.get("NodeID", ""),
                "state": task.get("Status", {}).get("State", "?"),
                "held": task_reservations(task),
            }
        )
    return found


def _gpu(uuid: str, slices: int, used: int, servers: list[dict], figures: GuardFigures) -> dict:
    measured = figures.gpus.get(uuid, {})
    participants = []
    for server in servers:
        if uuid not in server["held"]:
            continue
        user = server["user"]
        memory, budget = figures.participants.get((user, uuid), (None, None))
        participants.append(
            {
                "user": user,
                "slices": server["held"][uuid],
                "state": server["state"],
                "memory_used": memory,
                "memory_budget": budget,
                "over": bool(budget and memory is not None and memory > budget),
            }
        )
    return {
        "uuid": uuid,
        "slices": slices,
        "used": min(used, slices),
        "mig": is_mig(uuid),
        "simulated": is_simulated(uuid),
        "utilization": measured.get("util"),
        "memory_used": measured.get("used"),
        "memory_total": measured.get("total"),
        "participants": sorted(participants, key=lambda p: p["user"]),
    }


def _machine(node: dict, used_on: dict, servers: list[dict], figures, silent, guard_expected):
    kinds = gpu_kinds(node)
    mine = [s for s in servers if s["node"] == node["ID"]]
    availability = node.get("Spec", {}).get("Availability", "?")
    if not kinds:
        guard = "no GPUs"
    elif node["ID"] in silent:
        guard = "no answer"
    elif not guard_expected(node):
        guard = "simulated GPUs"
    else:
        guard = "ok"
    gpus = [_gpu(u, n, used_on.get(u, 0), mine, figures) for u, n in sorted(kinds.items())]
    return {
        "name": node.get("Description", {}).get("Hostname", node["ID"][:12]),
        "state": node.get("Status", {}).get("State", "?"),
        "availability": availability,
        # servers go only to ready, active machines with GPUs: anything else takes none
        "accepting": bool(kinds)
        and node.get("Status", {}).get("State") == "ready"
        and availability == "active",
        "guard": guard,
        "gpus": gpus,
        "cpu_only": sorted(s["user"] for s in mine if not s["held"]),
        "slices": sum(g["slices"] for g in gpus),
        "slices_used": sum(g["used"] for g in gpus),
    }


def _event(e: Event) -> dict:
    return {
        "time": e.time,
        "kind": e.kind,
        "user": e.user + (f"/{e.server}" if e.server else ""),
        "seconds": e.seconds,
        "waited": e.waited,
        "gpu": e.gpu,
        "node": e.node,
        "reason": e.reason,
        "action": e.action,
    }


def build(
    *,
    nodes: list[dict],
    tasks: list[dict],
    services: list[dict],
    figures: GuardFigures,
    silent: Iterable[str],
    guard_expected,
    events: list[Event],
    line: list[Waiting],
    now: float,
    prefix: str = SERVICE_PREFIX,
    fleet: dict | None = None,
) -> dict:
    """The dashboard's state: machines with their GPUs and each GPU's participants, the
    waiting line, recent starts, refusals and failures, what the hub healed (``healing.py``),
    the servers stopped for their machine's disk (``disk.py``), the guard's warnings and
    stops, and the fleet of GPU machines the hub drives (``fleet_view.read``; None: the fleet
    is off, nothing is shown of it).
    ``guard_expected(node)``: whether a guard should answer there (``guards.guarded``)."""
    servers = _servers(tasks, services, prefix)
    used_on = used_slices(tasks)
    silent = set(silent)
    machines = [
        _machine(n, used_on, servers, figures, silent, guard_expected)
        for n in sorted(nodes, key=lambda n: n.get("Description", {}).get("Hostname", ""))
    ]
    recent_starts = [
        e.seconds
        for e in events
        if e.kind == "started" and e.seconds is not None and now - e.time <= SPAWN_WINDOW_S
    ]
    guard_counts = sorted(set(figures.warnings) | set(figures.stops))
    return {
        "time": now,
        "totals": {
            "gpu_machines": sum(bool(m["gpus"]) for m in machines),
            "accepting": sum(m["accepting"] for m in machines),
            "slices": sum(m["slices"] for m in machines),
            "slices_used": sum(m["slices_used"] for m in machines),
            "servers": len(servers),
            "cpu_only": sum(not s["held"] for s in servers),
            "waiting": len(line),
            "spawn_p50": _percentile(recent_starts, 50),
            "spawn_p95": _percentile(recent_starts, 95),
            "starts_counted": len(recent_starts),
        },
        "machines": machines,
        "line": [
            {
                "place": place,
                "user": w.user + (f"/{w.server}" if w.server else ""),
                "waited": max(0.0, now - w.joined),
                "full_gpu": w.slices is None,
                "slices": w.slices,
                "holds": w.holds,
            }
            for place, w in enumerate(line, start=1)
        ],
        "starts": [_event(e) for e in reversed(events) if e.kind == "started"][:RECENT],
        "problems": [_event(e) for e in reversed(events) if e.kind in ("refused", "failed")][
            :RECENT
        ],
        "healed": [_event(e) for e in reversed(events) if e.kind == "healed"][:RECENT],
        "disk_stops": [_event(e) for e in reversed(events) if e.kind == DISK_STOP][:RECENT],
        "guard": [
            {
                "user": user,
                "gpu": gpu,
                "warnings": int(figures.warnings.get((user, gpu), 0)),
                "stops": int(figures.stops.get((user, gpu), 0)),
            }
            for user, gpu in guard_counts
        ],
        "fleet": fleet,
    }


# ---- the dashboard's own metrics (Prometheus scrapes them) and the plots ----------------------


def metric_families(state: dict) -> list[GaugeMetricFamily]:
    """The state's figures as Prometheus metric families: what the plots draw over the
    workshop besides the guards' and JupyterHub's own metrics."""
    used = GaugeMetricFamily(
        "gpuhub_slices_used", "GPU slices held by participants' servers", labels=["machine"]
    )
    total = GaugeMetricFamily(
        "gpuhub_slices_total", "GPU slices a machine advertises", labels=["machine"]
    )
    taking = GaugeMetricFamily(
        "gpuhub_machine_taking_servers",
        "1 when a GPU machine takes new servers",
        labels=["machine"],
    )
    for m in state["machines"]:
        if m["gpus"]:
            used.add_metric([m["name"]], m["slices_used"])
            total.add_metric([m["name"]], m["slices"])
            taking.add_metric([m["name"]], int(m["accepting"]))
    totals = state["totals"]
    servers = GaugeMetricFamily(
        "gpuhub_servers", "Participants' servers, with a GPU or without", labels=["kind"]
    )
    servers.add_metric(["gpu"], totals["servers"] - totals["cpu_only"])
    servers.add_metric(["cpu_only"], totals["cpu_only"])
    line = GaugeMetricFamily(
        "gpuhub_line_length", "Participants waiting in line", value=totals["waiting"]
    )
    return [used, total, taking, servers, line]


class _Families:
    """A collector of families made already (prometheus_client's registry asks collect())."""

    def __init__(self, families: list[GaugeMetricFamily]):
        self.families = families

    def collect(self):
        return self.families


def metrics_text(state: dict) -> str:
    """``metric_families`` in Prometheus' text format (prometheus_client writes and escapes it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(metric_families(state)))
    return generate_latest(registry).decode()


SPAWN_QUANTILE = (
    "histogram_quantile({q}, sum by (le) (rate("
    'jupyterhub_server_spawn_duration_seconds_bucket{{status="success"}}[10m])))'
)


@dataclass(frozen=True)
class Plot:
    id: str
    title: str
    unit: str
    #: (the series' name, or a label whose value names each series; the PromQL query)
    queries: tuple[tuple[str, str], ...]


PLOTS = (
    Plot("slices", "GPU slices in use", "slices", (("machine", "gpuhub_slices_used"),)),
    Plot(
        "utilization",
        "GPU utilisation",
        "%",
        (("machine", "avg by (machine) (gpuhub_gpu_utilization_percent)"),),
    ),
    Plot(
        "memory",
        "GPU memory in use",
        "GB",
        (("machine", "sum by (machine) (gpuhub_gpu_memory_used_bytes) / 1073741824"),),
    ),
    Plot("servers", "Participants with a server", "", (("kind", "gpuhub_servers"),)),
    Plot(
        "spawn",
        "Time to start a server",
        "s",
        (("p50", SPAWN_QUANTILE.format(q=0.5)), ("p95", SPAWN_QUANTILE.format(q=0.95))),
    ),
    Plot("line", "Waiting in line", "", (("waiting", "gpuhub_line_length"),)),
)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")


def duration_seconds(text: str, default: float = 15) -> float:
    """A Prometheus duration (``15s``, ``1h30m``) in seconds; ``default`` when it is not one."""
    parts = _PART.findall(text or "")
    if not parts or "".join(n + u for n, u in parts) != text:
        return default
    return sum(int(n) * _UNITS[u] for n, u in parts)


def plot_span(now: float, span_s: float, lowest: float | None) -> float:
    """The seconds the plots cover: ``span_s``, or less when Prometheus holds less (a
    workshop's first hour is drawn across the whole width, not squeezed into a corner)."""
    if lowest is None or lowest <= 0:
        return span_s
    return max(60.0, min(span_s, now - lowest))


def step_for(span_s: float, points: int = 240, least: float = 15) -> float:
    """The step of a range query: about ``points`` points over the span, never finer than the
    scrape interval."""
    return max(least, round(span_s / points))


def plot_series(plot: Plot, answers: list[dict | None]) -> dict:
    """A plot from Prometheus' query_range answers (one per query; None: no answer). A
    series' name is the query's own name, or the value of the label it names (``machine``);
    points that are not numbers (NaN: no spawns in a window) are left out."""
    series = []
    for (name, _), answer in zip(plot.queries, answers):
        for result in ((answer or {}).get("data") or {}).get("result") or []:
            label = (result.get("metric") or {}).get(name, name)
            points = []
            for when, value in result.get("values") or []:
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(number):
                    points.append([float(when), number])
            if points:
                series.append({"name": label, "points": points})
    return {
        "id": plot.id,
        "title": plot.title,
        "unit": plot.unit,
        "series": sorted(series, key=lambda s: s["name"]),
    }
