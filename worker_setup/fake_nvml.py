"""A stand-in for ``pynvml`` over fixture GPUs, for machines without an NVIDIA GPU.

Only ever used when asked for by name (``--nvml-fixture FILE``); the setup then says FAKE NVML in
its output. A fixture is JSON (see tests/fixtures/nvml/ for examples)::

    {"description": "what machine this is",
     "gpus": [{"uuid": "GPU-...", "name": "Tesla K80", "memory_mb": 11441,
               "pci_bus_id": "00000000:04:00.0"}, ...],
     "fail": {"nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"}}}

``pci_bus_id`` is optional. A GPU with MIG has ``"mig_mode": 1`` (0: off; without the key the
GPU has no MIG at all, as before Ampere: NVML answers "Not Supported"), its instances in
``mig_instances`` (``null`` for an empty slot) and optionally ``mig_max`` (slots, 7)::

    {"uuid": "GPU-...", "name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920, "mig_mode": 1,
     "mig_instances": [{"uuid": "MIG-...", "profile": "3g.40gb", "memory_mb": 40192}, null]}

An instance's name is NVML's: the GPU's name, ``MIG`` and the profile.

``fail`` makes pynvml calls (any of ``CALLS``) raise pynvml's own exception
``NVMLError_<error>`` (``GpuIsLost``, ``DriverNotLoaded``, ``LibRmVersionMismatch``, ...), so
the code under test meets the real types and messages. For the calls about one GPU,
``gpu`` (an index, or a list of them) limits the failure to those GPUs; without it every GPU
fails; ``mig`` (a slot, or a list) limits it further to those MIG instances of those GPUs
(``nvmlDeviceGetMigDeviceHandleByIndex`` and the calls on an instance's handle; without ``mig``
a GPU's failure covers its instances too). NVML failing to start:
``"fail": {"nvmlInit": {"error": "DriverNotLoaded"}}``.
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
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
)
#: Every pynvml call the worker makes (worker_setup.gpus); a fixture can fail each of them.
CALLS = MACHINE_CALLS + GPU_CALLS
_KEYS = {"description", "gpus", "fail"}
#: MIG slots of an A100 or H100.
MIG_SLOTS = 7


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
    mig: int | None = None  # the slot of a MIG instance's handle


def _mig_instance(handle: _Handle) -> dict:
    return handle.gpu["mig_instances"][handle.mig]


@dataclass(frozen=True)
class _Failure:
    error: type  # a pynvml NVMLError subclass
    gpus: frozenset | None  # GPU indexes; None: all (and the machine calls)
    migs: frozenset | None = None  # MIG slots of those GPUs; None: the GPUs and all instances


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
            for slot, mig in enumerate(gpu.get("mig_instances", [])):
                if mig is not None and not (
                    isinstance(mig, dict) and {"uuid", "profile", "memory_mb"} <= set(mig)
                ):
                    raise ValueError(
                        f"gpus[{index}].mig_instances[{slot}]: give each MIG instance a uuid, "
                        "profile and memory_mb (null: an empty slot)"
                    )
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
        if "mig" not in spec:
            return _Failure(error, frozenset(indexes))
        slots = spec["mig"] if isinstance(spec["mig"], list) else [spec["mig"]]
        if not all(isinstance(i, int) for i in slots):
            raise ValueError(f"{where}.mig: a MIG slot (0, 1, ...) or a list of them")
        return _Failure(error, frozenset(indexes), frozenset(slots))

    @classmethod
    def from_file(cls, path: str) -> FakeNVML:
        try:
            return cls(json.loads(Path(path).read_text()), source=path)
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read the NVML fixture {path}: {e}") from None

    def __getattr__(self, name: str):
        """pynvml's constants and exception classes (``NVML_DEVICE_MIG_ENABLE``,
        ``NVMLError_NotFound``), as the code under test reads them from the module."""
        if name.startswith(("NVML_", "NVMLError_")):
            return getattr(self.pynvml, name)
        raise AttributeError(name)

    def _call(self, call: str, handle: _Handle | None = None) -> None:
        """Record ``call``; raise the fixture's error when it fails there."""
        self.calls.append(call)
        failure = self.failures.get(call)
        if not failure:
            return
        if failure.gpus is None:
            raise failure.error()
        if handle is None or handle.index not in failure.gpus:
            return
        if failure.migs is None or handle.mig in failure.migs:
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
        return handle.gpu["uuid"] if handle.mig is None else _mig_instance(handle)["uuid"]

    def nvmlDeviceGetPciInfo(self, handle):
        self._call("nvmlDeviceGetPciInfo", handle)
        return _PciInfo(handle.gpu.get("pci_bus_id", f"00000000:{handle.index + 1:02X}:00.0"))

    def nvmlDeviceGetName(self, handle):
        self._call("nvmlDeviceGetName", handle)
        if handle.mig is None:
            return handle.gpu["name"]
        return f"{handle.gpu['name']} MIG {_mig_instance(handle)['profile']}"

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo", handle)
        memory = handle.gpu if handle.mig is None else _mig_instance(handle)
        return _Memory(int(memory["memory_mb"]) * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, handle):
        self._call("nvmlDeviceGetMigMode", handle)
        if "mig_mode" not in handle.gpu:
            raise self.pynvml.NVMLError_NotSupported()
        mode = int(handle.gpu["mig_mode"])
        return [mode, mode]  # current, pending

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        self._call("nvmlDeviceGetMaxMigDeviceCount", handle)
        if "mig_mode" not in handle.gpu:
            raise self.pynvml.NVMLError_NotSupported()
        return int(handle.gpu.get("mig_max", MIG_SLOTS))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        slots = int(handle.gpu.get("mig_max", MIG_SLOTS))
        if not handle.gpu.get("mig_mode") or not 0 <= index < slots:
            raise self.pynvml.NVMLError_InvalidArgument()
        mig = _Handle(handle.index, handle.gpu, index)
        self._call("nvmlDeviceGetMigDeviceHandleByIndex", mig)
        instances = handle.gpu.get("mig_instances", [])
        if index >= len(instances) or instances[index] is None:
            raise self.pynvml.NVMLError_NotFound()
        return mig
