"""The GPU guards' metrics, as the organizer's tools read them (``make status``, the dashboard).

Each GPU machine's guard (``worker_setup/guard.py``) serves Prometheus metrics on its port.
``scrape`` fetches them from every machine with real GPUs (I/O); ``read_metrics`` is the one
reader of that text (pure): per GPU its utilisation and memory, per participant their GPU
memory against their budget, and how often the guard warned them or stopped a process.
"""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .contract import is_simulated
from .inventory import gpu_kinds

#: (user, GPU UUID)
Key = tuple[str, str]


@dataclass
class GuardFigures:
    #: GPU UUID -> {"util": percent, "used": bytes, "total": bytes} (what the guard read)
    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    #: (user, GPU) -> (bytes in use, bytes of the budget or None)
    participants: dict[Key, tuple[float, float | None]] = field(default_factory=dict)
    warnings: dict[Key, float] = field(default_factory=dict)  # times over budget
    stops: dict[Key, float] = field(default_factory=dict)  # processes stopped


_GPU_SAMPLES = {
    "gpuhub_gpu_utilization_percent": "util",
    "gpuhub_gpu_memory_used_bytes": "used",
    "gpuhub_gpu_memory_total_bytes": "total",
}


def read_metrics(texts: list[str]) -> GuardFigures:
    """The guards' metrics texts (Prometheus exposition format) read into figures; a text
    that does not parse is skipped (its machine then shows no figures)."""
    from prometheus_client.parser import text_string_to_metric_families

    figures = GuardFigures()
    used: dict[Key, float] = {}
    budget: dict[Key, float] = {}
    counters = {
        "gpuhub_participant_warnings_total": figures.warnings,
        "gpuhub_participant_stops_total": figures.stops,
    }
    for text in texts:
        try:
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        except ValueError:
            continue
        for sample in samples:
            gpu = sample.labels.get("gpu", "")
            key = (sample.labels.get("user", ""), gpu)
            if sample.name in _GPU_SAMPLES:
                figures.gpus.setdefault(gpu, {})[_GPU_SAMPLES[sample.name]] = sample.value
            elif sample.name == "gpuhub_participant_gpu_memory_used_bytes":
                used[key] = sample.value
            elif sample.name == "gpuhub_participant_gpu_memory_budget_bytes":
                budget[key] = sample.value
            elif sample.name in counters:
                counters[sample.name][key] = sample.value
    figures.participants = {key: (value, budget.get(key)) for key, value in used.items()}
    return figures


def guarded(node: dict) -> bool:
    """A machine whose guard is expected to answer: it has GPUs, real ones, and an address."""
    kinds = gpu_kinds(node)
    addr = node.get("Status", {}).get("Addr", "")
    return bool(kinds and addr) and not is_simulated(next(iter(kinds)))


def scrape(nodes: list[dict], port: int, timeout: float = 2.0) -> tuple[list[str], tuple[str, ...]]:
    """The metrics text of the guard of each guarded machine, straight (no proxy), all at
    once with ``timeout`` each; and the ids of the machines whose guard did not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    wanted = [n for n in nodes if guarded(n)]

    def fetch(node: dict) -> str | None:
        url = f"http://{node['Status']['Addr']}:{port}/metrics"
        try:
            with opener.open(url, timeout=timeout) as response:
                return response.read().decode()
        except (OSError, ValueError):
            return None

    if not wanted:
        return [], ()
    with ThreadPoolExecutor(min(len(wanted), 16)) as pool:
        answers = list(pool.map(fetch, wanted))
    texts = [a for a in answers if a is not None]
    silent = tuple(n["ID"] for n, a in zip(wanted, answers) if a is None)
    return texts, silent
