"""The GPU guard's Prometheus collector: its last round's figures and its counters.

``metric_families`` turns what a ``Guard`` last saw (``Guard.last``) and counted (warnings,
stops, problems) into prometheus_client's metric families, in named steps: each GPU's figures,
the slices held and advertised, each participant's memory against their budget, whether the
engine answered, then the counters. ``serve_metrics`` serves them on ``/metrics``
(``--metrics-port``); the hub's status reads them (gpu_swarm_spawner/guards.py).

It imports the loop (guard.py: ``Guard``, ``Round``), and prometheus_client only when called;
the loop imports nothing of it.
"""

from __future__ import annotations

from .guard import Guard, Round

MiB = 1024 * 1024


def metric_families(guard: Guard):
    """The last round as Prometheus metric families (prometheus_client's)."""
    machine = guard.options.machine
    with guard.lock:
        last = guard.last
        warnings, stops, errors = dict(guard.warnings), dict(guard.stops), dict(guard.errors)
    yield from _gpu_families(machine, last.snapshot.gpus if last is not None else ())
    yield from _slice_families(machine, last)
    yield from _participant_families(machine, last)
    yield _engine_family(machine, last)
    yield from _counter_families(machine, warnings, stops, errors)


def _gauge(name: str, doc: str, labels: list[str]):
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(f"gpuhub_{name}", doc, labels=["machine", *labels])


def _gpu_families(machine: str, gpus) -> list:
    """Each GPU's (and MIG instance's) utilisation, memory, temperature and power; its name."""
    gpu = {
        "util": _gauge("gpu_utilization_percent", "GPU utilisation", ["gpu"]),
        "used": _gauge("gpu_memory_used_bytes", "GPU memory in use", ["gpu"]),
        "total": _gauge("gpu_memory_total_bytes", "GPU memory", ["gpu"]),
        "temp": _gauge("gpu_temperature_celsius", "GPU temperature", ["gpu"]),
        "power": _gauge("gpu_power_watts", "GPU power draw", ["gpu"]),
    }
    info = _gauge(
        "gpu_info", "A GPU (or MIG instance) read by the guard", ["gpu", "name", "parent"]
    )
    for g in gpus:
        info.add_metric([machine, g.uuid, g.name, g.parent_uuid or ""], 1)
        used = None if g.memory_used_mb is None else g.memory_used_mb * MiB
        figures = {
            "util": g.utilization_percent,
            "temp": g.temperature_c,
            "power": g.power_w,
            "used": used,
            "total": g.memory_total_mb * MiB,
        }
        for key, value in figures.items():
            if value is not None:
                gpu[key].add_metric([machine, g.uuid], value)
    return [*gpu.values(), info]


def _slice_families(machine: str, last: Round | None) -> list:
    """The slices the servers here hold, and those the engine advertises, per GPU."""
    slices_used = _gauge("gpu_slices_used", "Slices held by participants' servers here", ["gpu"])
    slices_total = _gauge("gpu_slices_total", "Slices this machine's engine advertises", ["gpu"])
    if last is not None:
        held: dict[str, int] = {}
        for s in last.servers.values():
            held[s.gpu_uuid] = held.get(s.gpu_uuid, 0) + s.slices
        for uuid, n in sorted(held.items()):
            slices_used.add_metric([machine, uuid], n)
        for uuid, n in sorted(last.slices.items()):
            slices_total.add_metric([machine, uuid], n)
    return [slices_used, slices_total]


def _participant_families(machine: str, last: Round | None) -> list:
    """Each participant's GPU memory in use and their budget; the memory of nobody's processes."""
    user_used = _gauge(
        "participant_gpu_memory_used_bytes", "A participant's GPU memory in use", ["gpu", "user"]
    )
    user_budget = _gauge(
        "participant_gpu_memory_budget_bytes", "A participant's GPU memory budget", ["gpu", "user"]
    )
    unowned = _gauge(
        "unattributed_gpu_memory_bytes", "GPU memory of processes of no participant", ["gpu"]
    )
    if last is not None:
        used, nobody = _memory_by_user(last)
        for s in last.servers.values():
            key = (s.gpu_uuid, s.user)
            user_used.add_metric([machine, *key], used.get(key, 0) * MiB)
            if s.budget_mb is not None:
                user_budget.add_metric([machine, *key], s.budget_mb * MiB)
        for uuid, mb in sorted(nobody.items()):
            unowned.add_metric([machine, uuid], mb * MiB)
    return [user_used, user_budget, unowned]


def _memory_by_user(last: Round) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """MiB in use by (GPU, user), and by GPU for the processes of no participant."""
    by_owner = {s.owner: s for s in last.servers.values()}
    used: dict[tuple[str, str], int] = {}
    nobody: dict[str, int] = {}
    for p in last.reading.processes if last.reading else ():
        server = by_owner.get(p.owner or "")
        if server is None:
            nobody[p.gpu_uuid] = nobody.get(p.gpu_uuid, 0) + p.used_mb
        else:
            key = (p.gpu_uuid, server.user)
            used[key] = used.get(key, 0) + p.used_mb
    return used, nobody


def _engine_family(machine: str, last: Round | None):
    """1 when the last round could read the engine's containers, 0 when it could not."""
    engine_up = _gauge("guard_engine_up", "1 when the guard could read the engine's containers", [])
    if last is not None:
        engine_up.add_metric([machine], 0 if last.reading is None else 1)
    return engine_up


def _counter_families(machine: str, warnings: dict, stops: dict, errors: dict):
    """Warnings begun and processes stopped, by user and GPU; problems met, by kind."""
    from prometheus_client.core import CounterMetricFamily

    counted = (
        ("participant_warnings", "Times a participant went over budget", warnings),
        ("participant_stops", "Processes the guard stopped", stops),
    )
    for name, doc, counts in counted:
        family = CounterMetricFamily(f"gpuhub_{name}", doc, labels=["machine", "user", "gpu"])
        for (user, uuid), n in sorted(counts.items()):
            family.add_metric([machine, user, uuid], n)
        yield family
    family = CounterMetricFamily(
        "gpuhub_guard_errors", "Problems met, by kind", labels=["machine", "kind"]
    )
    for kind, n in sorted(errors.items()):
        family.add_metric([machine, kind], n)
    yield family


def serve_metrics(guard: Guard, address: str, port: int):
    """Serve /metrics on ``address:port`` in a thread of its own."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    class Collector:
        def collect(self):
            return metric_families(guard)

    registry = CollectorRegistry()
    registry.register(Collector())
    return start_http_server(port, addr=address, registry=registry)
