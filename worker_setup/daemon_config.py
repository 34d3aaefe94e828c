"""Merge GPU slices into Docker's daemon.json: pure functions, no I/O.

Only the ``node-generic-resources`` entries that are GPUs (kind starting with the GPU prefix) are
replaced; every other key and every other generic resource is kept as it was.
"""

from __future__ import annotations

import json

from gpu_swarm_spawner.inventory import DEFAULT_KIND_PREFIX

KEY = "node-generic-resources"


class InvalidDaemonConfig(ValueError):
    """daemon.json exists but is not a JSON object."""


def parse(text: str, path: str = "daemon.json") -> dict:
    """The daemon configuration in ``text``; an empty file is an empty configuration."""
    if not text.strip():
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidDaemonConfig(
            f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "fix or move it, then run this again. Nothing was changed."
        ) from e
    if not isinstance(config, dict):
        raise InvalidDaemonConfig(f"{path} must hold a JSON object, not {type(config).__name__}")
    return config


def slice_resources(gpu_uuids: list[str], slices_per_gpu: int) -> list[str]:
    """The generic-resource entries advertising each GPU as ``slices_per_gpu`` slices."""
    if slices_per_gpu < 1:
        raise ValueError(f"slices per GPU must be 1 or more, got {slices_per_gpu}")
    return [f"{uuid}={slices_per_gpu}" for uuid in gpu_uuids]


def merge(config: dict, entries: list[str], kind_prefix: str = DEFAULT_KIND_PREFIX) -> dict:
    """A copy of ``config`` whose GPU generic resources are exactly ``entries``."""
    kept = [e for e in config.get(KEY, []) if not e.startswith(kind_prefix)]
    merged = dict(config)
    merged[KEY] = kept + list(entries)
    if not merged[KEY]:
        del merged[KEY]
    return merged


def render(config: dict) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
