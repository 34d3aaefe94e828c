"""A stand-in for ``pynvml`` over fixture GPUs, for machines without an NVIDIA GPU.

Only ever used when asked for by name (``--nvml-fixture FILE``); the setup then says FAKE NVML in
its output. A fixture is JSON (see tests/fixtures/nvml/ for examples)::

    {"description": "what machine this is",
     "gpus": [{"uuid": "GPU-...", "name": "Tesla K80", "memory_mb": 11441,
               "pci_bus_id": "00000000:04:00.0"}, ...],
     "fail": {"nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"}}}

``pci_bus_id`` is optional. ``fail`` makes pynvml calls (any of ``CALLS``) raise pynvml's own
exception ``NVMLError_<error>`` (``GpuIsLost``, ``DriverNotLoaded``, ``LibRmVersionMismatch``,
...), so the code under test meets the real types and messages. For the calls about one GPU,
``gpu`` (an index, or a list of them) limits the failure to those GPUs; without it every GPU
fails. NVML failing to start: ``"fail": {"nvmlInit": {"error": "DriverNotLoaded"}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import gpus as _gpus

#: The calls about the whole machine, and those about one GPU (taking its handle).
MACHINE_CALLS = ("nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown")
GPU_CALLS = (
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
)
#: Every pynvml call the worker makes (worker_setup.gpus); a fixture can fail each of them.
CALLS = MACHINE_CALLS + GPU_CALLS
_KEYS = {"description", "gpus", "fail"}


@dataclass
class _Memory:
    total: int  # bytes, as pynvml reports


@dataclass
class _PciInfo:
    busId: str  # pynvml's field name


@dataclass(frozen=True)
class _Handle:
    index: int
    gpu: dict


@dataclass(frozen=True)
class _Failure:
    error: type  # a pynvml NVMLError subclass
    gpus: frozenset | None  # GPU indexes; None: all (and the machine calls)


class FakeNVML:
    """The pynvml calls worker_setup.gpus.discover makes, over a fixture's GPUs."""

    def __init__(self, fixture: dict, source: str = "fixture"):
        self.pynvml = _gpus.load_nvml()  # for its exception classes only
        self.NVMLError = self.pynvml.NVMLError
        self.source = source
        if not isinstance(fixture, dict):
            raise ValueError('write it as a JSON object: {"gpus": [...], "fail": {...}}')
        unknown = sorted(set(fixture) - _KEYS)
        if unknown:
            raise ValueError(
                f"unknown key {unknown[0]!r}; a fixture has {', '.join(sorted(_KEYS))} "
                '(NVML failing to start: "fail": {"nvmlInit": {"error": "DriverNotLoaded"}})'
            )
        self.gpus = list(fixture.get("gpus", []))
        for index, gpu in enumerate(self.gpus):
            if not (isinstance(gpu, dict) and {"uuid", "name", "memory_mb"} <= set(gpu)):
                raise ValueError(f"gpus[{index}]: give each GPU a uuid, name and memory_mb")
        fail = fixture.get("fail", {})
        if not (isinstance(fail, dict) and all(isinstance(s, dict) for s in fail.values())):
            raise ValueError('fail: write it as {"<call>": {"error": "GpuIsLost", "gpu": 1}, ...}')
        self.failures = {call: self._failure(call, spec) for call, spec in fail.items()}
        self.calls: list[str] = []
        self.shutdowns = 0

    def _failure(self, call: str, spec: dict) -> _Failure:
        where = f"fail.{call}"
        if call not in CALLS:
            raise ValueError(f"{where}: not a call the worker makes; use one of {', '.join(CALLS)}")
        name = str(spec.get("error", ""))
        error = getattr(self.pynvml, "NVMLError_" + name.removeprefix("NVMLError_"), None)
        if not (isinstance(error, type) and issubclass(error, self.NVMLError)):
            raise ValueError(
                f"{where}.error: pynvml has no NVMLError_{name}; give the part after "
                "NVMLError_, e.g. GpuIsLost, DriverNotLoaded or LibRmVersionMismatch"
            )
        if "gpu" not in spec:
            return _Failure(error, None)
        if call in MACHINE_CALLS:
            raise ValueError(f'{where}: {call} is not about one GPU; leave out "gpu"')
        indexes = spec["gpu"] if isinstance(spec["gpu"], list) else [spec["gpu"]]
        if not all(isinstance(i, int) for i in indexes):
            raise ValueError(f"{where}.gpu: a GPU index (0, 1, ...) or a list of them")
        return _Failure(error, frozenset(indexes))

    @classmethod
    def from_file(cls, path: str) -> FakeNVML:
        try:
            return cls(json.loads(Path(path).read_text()), source=path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read the NVML fixture {path}: {e}") from None

    def _call(self, call: str, handle: _Handle | None = None) -> None:
        """Record ``call``; raise the fixture's error when it fails there."""
        self.calls.append(call)
        failure = self.failures.get(call)
        if failure and (failure.gpus is None or (handle and handle.index in failure.gpus)):
            raise failure.error()

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlShutdown(self):
        self.shutdowns += 1
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.gpus):
            raise self.pynvml.NVMLError_InvalidArgument()
        handle = _Handle(index, self.gpus[index])
        self._call("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def nvmlDeviceGetUUID(self, handle):
        self._call("nvmlDeviceGetUUID", handle)
        return handle.gpu["uuid"]

    def nvmlDeviceGetPciInfo(self, handle):
        self._call("nvmlDeviceGetPciInfo", handle)
        return _PciInfo(handle.gpu.get("pci_bus_id", f"00000000:{handle.index + 1:02X}:00.0"))

    def nvmlDeviceGetName(self, handle):
        self._call("nvmlDeviceGetName", handle)
        return handle.gpu["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo", handle)
        return _Memory(int(handle.gpu["memory_mb"]) * 1024 * 1024)
