"""The participant's own GPU figures, as the GPU guard writes them into their container.

Every round (5 s) the guard on the GPU machine measures each participant's GPU processes and
writes ``usage.json`` beside ``notices.json`` (atomically), at least every 30 s and whenever the
figures change::

    {"time": 1732350000.5, "gpu": "GPU-...", "used_mb": 2150, "budget_mb": 8192,
     "gpu_utilization": 45.0, "gpu_memory_used_mb": 30500, "gpu_memory_total_mb": 81559}

``used_mb`` is the memory of this participant's processes; ``budget_mb`` their share of the
GPU's memory (null: no budget); the ``gpu_*`` figures are the whole GPU's, which the holders of
its slices share (null: not read). ``parse_usage`` is the one reader: whatever the file holds, it
never raises, and anything that is not this format reads as no figures. The JupyterLab status
bar (``gpuhub/usage``) and ``gpu-info`` read it here. Standard library only.
"""

from __future__ import annotations

import json
import math
import os

DEFAULT_PATH = "/tmp/gpuhub-guard/usage.json"
#: figures older than this (the guard stopped, the server moved) are not shown as current
STALE_S = 60
MAX_BYTES = 64 * 1024


def usage_path(environ=os.environ) -> str:
    """The usage file: ``GPUHUB_USAGE_FILE`` (tests), else the guard's fixed path."""
    return environ.get("GPUHUB_USAGE_FILE") or DEFAULT_PATH


def _figure(value, optional: bool = True) -> float | None:
    """A finite number of at least 0 (bool, NaN, negatives are not); None where left out."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(value)
    if value < 0:
        raise ValueError(value)
    return float(value)


def parse_usage(text: str | bytes) -> dict | None:
    """The figures of a usage file's text, or None when it is not that format."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), str) or not data["gpu"]:
        return None
    try:
        usage = {
            "time": _figure(data.get("time"), optional=False),
            "gpu": data["gpu"],
            "used_mb": _figure(data.get("used_mb"), optional=False),
            "budget_mb": _figure(data.get("budget_mb")),
            "gpu_utilization": _figure(data.get("gpu_utilization")),
            "gpu_memory_used_mb": _figure(data.get("gpu_memory_used_mb")),
            "gpu_memory_total_mb": _figure(data.get("gpu_memory_total_mb")),
        }
    except ValueError:
        return None
    if usage["budget_mb"] == 0 or (usage["gpu_utilization"] or 0) > 100:
        return None
    return usage


def read_usage(path: str | None = None) -> dict | None:
    """The figures in the usage file (None: missing, unreadable, oversized or not the format)."""
    try:
        with open(path or usage_path(), "rb") as f:
            text = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(text) > MAX_BYTES:
        return None
    return parse_usage(text)


def describe(usage: dict | None, now: float) -> str:
    """One line for ``gpu-info``; "" when there are no current figures."""
    if usage is None or not (now - usage["time"] <= STALE_S):
        return ""
    gb = 1024.0
    line = f"GPU memory in use: {usage['used_mb'] / gb:.1f} GB"
    if usage["budget_mb"]:
        share = usage["used_mb"] / usage["budget_mb"]
        line += f" of your {usage['budget_mb'] / gb:.1f} GB budget ({share:.0%})"
        if share > 1:
            line += ": OVER BUDGET"
    if usage["gpu_utilization"] is not None:
        line += f"; the GPU is {usage['gpu_utilization']:.0f}% busy (all its users)"
    return line
