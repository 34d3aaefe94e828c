"""A stand-in for ``pynvml`` over fixture GPUs, for machines without an NVIDIA GPU.

Only ever used when asked for by name (``--nvml-fixture FILE``); the setup then says FAKE NVML in
its output. A fixture is JSON: ``{"gpus": [{"uuid", "name", "memory_mb"}, ...]}``, or
``{"init_error": "Driver/library version mismatch"}`` for a machine where NVML fails to start.
See tests/fixtures/nvml/ for examples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class NVMLError(Exception):
    """What pynvml raises (its NVMLError subclasses carry NVML's message)."""


@dataclass
class _Memory:
    total: int  # bytes, as pynvml reports


class FakeNVML:
    """The pynvml calls worker_setup.gpus.discover makes."""

    def __init__(self, fixture: dict, source: str = "fixture"):
        self.source = source
        self.gpus = list(fixture.get("gpus", []))
        self.init_error = fixture.get("init_error", "")
        self.shutdowns = 0

    @classmethod
    def from_file(cls, path: str) -> FakeNVML:
        try:
            return cls(json.loads(Path(path).read_text()), source=path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read the NVML fixture {path}: {e}") from None

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return _Memory(int(handle["memory_mb"]) * 1024 * 1024)
