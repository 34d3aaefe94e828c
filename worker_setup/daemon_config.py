"""Merge GPU slices into Docker's daemon.json: pure functions, no I/O.

Only the ``node-generic-resources`` entries that are GPUs (kind starting with the GPU prefix) are
replaced; every other key and every other generic resource is kept as it was.
"""

from __future__ import annotations

import difflib
import json

from gpu_swarm_spawner.contract import (
    KIND_PREFIX,
    LABEL_PREFIX,
    MEMORY_LABEL,
    SPARE_LABEL,
    SWARM_SPARE,
)

KEY = "node-generic-resources"
LABELS_KEY = "labels"
REGISTRIES_KEY = "insecure-registries"


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


def slice_resources(slices: dict[str, int], named_kind: str = "") -> list[str]:
    """The generic-resource entries advertising each GPU (``{uuid: slices}``) as its slices.

    One discrete kind per GPU (``<uuid>=<slices + SWARM_SPARE>``), whose slices GPUSwarmSpawner
    reserves (the spare unit, which no server takes, keeps Swarm from killing a server on a
    full GPU whenever the machine is updated: ``contract.SWARM_SPARE``). With
    ``named_kind``, also one named slot per slice (``<named_kind>=<uuid>/<n>``): the form a
    stock SwarmSpawner asks for with ``{"generic_resources": {named_kind: 1}}``, as in the
    original workshop. Swarm accounts the two forms separately: let one hub use them, not two.
    """
    for uuid, count in slices.items():
        if count < 1:
            raise ValueError(f"slices per GPU must be 1 or more, got {count} for {uuid}")
    entries = [f"{uuid}={count + SWARM_SPARE}" for uuid, count in slices.items()]
    if named_kind:
        entries += [
            f"{named_kind}={uuid}/{n}" for uuid, count in slices.items() for n in range(count)
        ]
    return entries


def engine_labels(gpus: list, slices: dict[str, int]) -> list[str]:
    """The engine labels describing a machine's GPUs, as daemon.json ``labels`` entries.

    ``gpus``: objects with uuid, name, memory_mb and simulated; ``slices``: ``{uuid: slices}``.
    Per machine: GPU count, model(s), slices per GPU, the memory of one slice (the smallest
    over its GPUs), and whether the GPUs are simulated; per GPU: its total memory, which the
    spawner turns into the ``GPU_MEMORY_LIMIT_MB`` of a server.
    """
    labels = {
        "gpu-count": str(len(gpus)),
        "gpu-model": ", ".join(sorted({g.name for g in gpus})),
        "slices-per-gpu": ",".join(str(n) for n in sorted(set(slices.values()))),
        "slice-memory-mb": str(min((g.memory_mb // slices[g.uuid] for g in gpus), default=0)),
        "simulated": "true" if any(g.simulated for g in gpus) else "false",
    }
    entries = [f"{LABEL_PREFIX}{key}={value}" for key, value in labels.items()]
    entries.append(f"{SPARE_LABEL}={SWARM_SPARE}")  # (slice_resources' spare unit)
    return entries + [f"{MEMORY_LABEL}{g.uuid}={g.memory_mb}" for g in gpus]


def with_nvidia_runtime(config: dict, runtime_path: str) -> dict:
    """A copy of ``config`` with the NVIDIA container runtime registered as the default.

    With it, ``NVIDIA_VISIBLE_DEVICES=<uuid>`` (set by the spawner) gives a container exactly
    that GPU. Other runtimes are kept.
    """
    merged = dict(config)
    runtimes = dict(config.get("runtimes") or {})
    runtimes["nvidia"] = {**(runtimes.get("nvidia") or {}), "path": runtime_path}
    runtimes["nvidia"].setdefault("runtimeArgs", [])
    merged["runtimes"] = runtimes
    merged["default-runtime"] = "nvidia"
    return merged


def diff(old: dict | None, new: dict, path: str) -> str:
    """A unified diff of two configurations as they would be written to ``path``."""
    before = render(old).splitlines(keepends=True) if old is not None else []
    after = render(new).splitlines(keepends=True)
    label = path if old is not None else "/dev/null"
    return "".join(difflib.unified_diff(before, after, label, path))


def _is_gpu_entry(entry: str, kind_prefix: str, named_kind: str) -> bool:
    kind = entry.split("=", 1)[0]
    return kind.startswith(kind_prefix) or (bool(named_kind) and kind == named_kind)


def merge(
    config: dict,
    entries: list[str],
    kind_prefix: str = KIND_PREFIX,
    named_kind: str = "",
    labels: list[str] = (),
) -> dict:
    """A copy of ``config`` whose GPU generic resources are exactly ``entries`` and whose
    ``gpu-jupyterhub.*`` engine labels are exactly ``labels``.

    GPU entries are the discrete kinds starting with ``kind_prefix`` and, when given, the
    named ``named_kind`` slots; every other entry, label and key is kept.
    """
    merged = dict(config)
    kept = [e for e in config.get(KEY, []) if not _is_gpu_entry(e, kind_prefix, named_kind)]
    merged[KEY] = kept + list(entries)
    kept_labels = [e for e in config.get(LABELS_KEY, []) if not e.startswith(LABEL_PREFIX)]
    merged[LABELS_KEY] = kept_labels + list(labels)
    for key in (KEY, LABELS_KEY):
        if not merged[key]:
            del merged[key]
    return merged


def with_insecure_registry(config: dict, address: str) -> dict:
    """A copy of ``config`` that lets the engine pull from the plain-HTTP registry at
    ``address`` (HOST:PORT, the manager's); other entries are kept."""
    merged = dict(config)
    registries = list(config.get(REGISTRIES_KEY, []))
    if address not in registries:
        merged[REGISTRIES_KEY] = registries + [address]
    return merged


def render(config: dict) -> str:
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
