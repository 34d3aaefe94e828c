"""The tests' stand-in for ``pynvml`` over fixture GPUs, for machines without an NVIDIA GPU.

The product (worker_setup) gets NVML in one place, ``worker_setup.gpus.load_nvml``: ``import
pynvml``. The tests put this double there, at that edge, and only when asked for by name:

- in another process (a command, the join on a bed machine, the GPU guard it starts): the
  folder tests/fakes/pynvml_shim first on PYTHONPATH *and* the fixture in FAKE_NVML_FIXTURE
  (``shim_env``); that folder's ``pynvml`` refuses to load without a fixture named;
- in the test's own process: ``imported(path)``, which puts the double in ``sys.modules``.

Either way ``serve`` makes it; in another process it says "FAKE NVML: GPUs from the fixture X,
not a driver" on stderr (the GPU guard's log), and the driver's version it answers says FAKE,
so whatever prints the driver shows it.

A fixture is JSON (see tests/fixtures/nvml/ for examples)::

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

What the GPU guard reads (worker_setup.telemetry) is optional in a GPU: ``utilization_percent``
(0), ``temperature_c`` (40), ``power_w`` (60) and ``memory_used_mb`` (0: MiB in use besides its
processes'; a MIG instance may have one too). Memory used is that plus the memory of the
processes on the GPU or instance (a GPU in MIG mode: on all its instances). As on real GPUs,
utilization is "Not Supported" on a GPU in MIG mode and on a MIG instance, temperature and
power on a MIG instance.

GPU processes (``nvmlDeviceGetComputeRunningProcesses``; graphics processes: none) come from two
places, merged:

- ``"processes": [{"pid": 1234, "gpu": 0, "used_mb": 300}, {"pid": 99, "gpu": 1, "mig": 2,
  "used_mb": null}]``: listed in the fixture (``gpu``: its index; ``mig``: the instance's slot,
  needed on a GPU in MIG mode; ``used_mb`` null: NVML cannot say);
- real processes: every process in ``/proc`` whose environment has ``FAKE_NVML_GPU_MB=<MiB>``
  uses that much of the GPU or MIG instance named by ``FAKE_NVML_GPU=<uuid>``, else of the first
  of its ``NVIDIA_VISIBLE_DEVICES`` that is in this fixture; one whose GPU is not in this
  fixture is another (simulated) machine's and is left out. ``/proc`` is read at most once a
  round (``nvmlDeviceGetCount`` starts one), each process's environment once;
  ``"scan_processes": false`` turns this off.

A handle of a GPU reports its processes and those of its MIG instances; an instance's handle
only its own.

The driver's and NVML's versions (``nvmlSystemGetDriverVersion``, ``nvmlSystemGetNVMLVersion``,
which ``make gpu-check`` prints) are always ``DRIVER_VERSION`` and ``NVML_VERSION``: a 550
driver's, marked FAKE.

``fail`` makes pynvml calls (any of ``FAILABLE_CALLS``) raise pynvml's own exception
``NVMLError_<error>`` (``GpuIsLost``, ``DriverNotLoaded``, ``LibRmVersionMismatch``, ...), so
the code under test meets the real types and messages. For the calls about one GPU,
``gpu`` (an index, or a list of them) limits the failure to those GPUs; without it every GPU
fails; ``mig`` (a slot, or a list) limits it further to those MIG instances of those GPUs
(``nvmlDeviceGetMigDeviceHandleByIndex`` and the calls on an instance's handle; without ``mig``
a GPU's failure covers its instances too). NVML failing to start:
``"fail": {"nvmlInit": {"error": "DriverNotLoaded"}}``.

A fixture read from a file (``from_file``) is read again when the file changes (checked at
``nvmlDeviceGetCount``, once a round), so a test can make a GPU fail, or recover, under a
running guard. A changed file that cannot be read or is invalid leaves the last good fixture in
use and says why in ``reload_error``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from worker_setup import gpus as _gpus

#: The folder whose ``pynvml`` is this double (first on PYTHONPATH, with FAKE_NVML_FIXTURE).
SHIM = Path(__file__).resolve().parent / "pynvml_shim"
#: The variable that names the fixture the shim serves.
FIXTURE_VARIABLE = "FAKE_NVML_FIXTURE"

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
#: Every pynvml call the worker's setup makes (worker_setup.gpus).
CALLS = MACHINE_CALLS + GPU_CALLS
#: The calls only the GPU guard makes (worker_setup.telemetry), each about one GPU.
GUARD_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
)
#: The calls only ``make gpu-check`` makes (worker_setup.gpu_check), about the whole machine.
CHECK_CALLS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion")
#: Every call a fixture can fail.
FAILABLE_CALLS = CALLS + GUARD_CALLS + CHECK_CALLS
#: What the fake answers for the driver's and NVML's versions (a 550 driver's, as pynvml gives
#: them, marked so that no output that prints them passes for a real GPU's).
DRIVER_VERSION = "550.54.15-FAKE"
NVML_VERSION = "12.550.54.15-FAKE"
_KEYS = {"description", "gpus", "fail", "processes", "scan_processes"}
#: MIG slots of an A100 or H100.
MIG_SLOTS = 7
MIB = 1024 * 1024

#: The optional readings of a GPU: {key: (default, what to write)}.
_READINGS = {
    "utilization_percent": (0, "a whole number of percent from 0 to 100, e.g. 35"),
    "temperature_c": (40, "a whole number of degrees Celsius, e.g. 40"),
    "power_w": (60, "watts, 0 or more, e.g. 60 or 72.5"),
    "memory_used_mb": (0, "whole MiB in use besides its processes', 0 up to its memory_mb"),
}
_PROCESS_KEYS = {"pid", "gpu", "mig", "used_mb"}
_PROCESSES_EXAMPLE = '"processes": [{"pid": 1234, "gpu": 0, "used_mb": 300}]'


class _Memory:
    """pynvml's memory info in bytes. ``used`` and ``free`` are worked out when first read, so
    what reads only ``total`` (GPU discovery) never looks for processes."""

    def __init__(self, total: int, used):
        self.total = total
        self._used = used  # a function giving the bytes used

    @functools.cached_property
    def used(self) -> int:
        return self._used()

    @property
    def free(self) -> int:
        return max(self.total - self.used, 0)


@dataclass
class _PciInfo:
    busId: str  # pynvml's field name


@dataclass
class _Utilization:
    gpu: int  # percent, pynvml's field names
    memory: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # bytes; None: not available (pynvml's field names)


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


@dataclass(frozen=True)
class _Use:
    """A process using ``used_mb`` (None: NVML cannot say) of GPU ``index`` (instance ``slot``)."""

    pid: int
    index: int
    slot: int | None
    used_mb: int | None

    def on(self, handle: _Handle) -> bool:
        """Whether ``handle`` reports it: its GPU's handle, or its own instance's."""
        return self.index == handle.index and handle.mig in (None, self.slot)


@dataclass(frozen=True)
class _Fixture:
    """A fixture, checked: what FakeNVML answers from."""

    gpus: list
    failures: dict
    processes: tuple[_Use, ...]
    scan: bool
    units: dict  # uuid of each GPU and MIG instance: (index, slot or None)


class FakeNVML:
    """The pynvml calls worker_setup.gpus.discover and worker_setup.telemetry.read make, over a
    fixture's GPUs (and the processes in ``proc_root`` that say they use one)."""

    def __init__(self, fixture: dict, source: str = "fixture", proc_root: str = "/proc"):
        self.pynvml = real_pynvml()  # for its constants and exception classes only
        self.NVMLError = self.pynvml.NVMLError
        self.source = source
        self._use(self._checked(fixture))
        self.procs = ProcScan(proc_root)
        self._round: tuple[_Use, ...] | None = None  # the processes found in /proc this round
        self._path: str | None = None  # the file to follow (from_file)
        self._signature: tuple | None = None
        self.reload_error: str | None = None
        self.calls: list[str] = []
        self.shutdowns = 0

    def _use(self, fixture: _Fixture) -> None:
        self.fixture = fixture
        self.gpus = fixture.gpus
        self.failures = fixture.failures

    # ---- the fixture -------------------------------------------------------------------------

    def _checked(self, fixture) -> _Fixture:
        """``fixture`` checked; ValueError naming the mistake and what to write instead."""
        if not isinstance(fixture, dict):
            raise ValueError('write it as a JSON object: {"gpus": [...], "fail": {...}}')
        unknown = sorted(set(fixture) - _KEYS)
        if unknown:
            raise ValueError(
                f"unknown key {unknown[0]!r}; a fixture has {', '.join(sorted(_KEYS))} "
                '(NVML failing to start: "fail": {"nvmlInit": {"error": "DriverNotLoaded"}})'
            )
        gpus = list(fixture.get("gpus", []))
        units: dict[str, tuple[int, int | None]] = {}
        for index, gpu in enumerate(gpus):
            if not (isinstance(gpu, dict) and {"uuid", "name", "memory_mb"} <= set(gpu)):
                raise ValueError(f"gpus[{index}]: give each GPU a uuid, name and memory_mb")
            _check_readings(f"gpus[{index}]", gpu, _READINGS)
            units[_gpus.nvml_text(gpu["uuid"])] = (index, None)
            for slot, mig in enumerate(gpu.get("mig_instances", [])):
                if mig is not None and not (
                    isinstance(mig, dict) and {"uuid", "profile", "memory_mb"} <= set(mig)
                ):
                    raise ValueError(
                        f"gpus[{index}].mig_instances[{slot}]: give each MIG instance a uuid, "
                        "profile and memory_mb (null: an empty slot)"
                    )
                if mig is not None:
                    where = f"gpus[{index}].mig_instances[{slot}]"
                    _check_readings(where, mig, {"memory_used_mb": _READINGS["memory_used_mb"]})
                    units[_gpus.nvml_text(mig["uuid"])] = (index, slot)
        fail = fixture.get("fail", {})
        if not (isinstance(fail, dict) and all(isinstance(s, dict) for s in fail.values())):
            raise ValueError('fail: write it as {"<call>": {"error": "GpuIsLost", "gpu": 1}, ...}')
        failures = {call: self._failure(call, spec) for call, spec in fail.items()}
        scan = fixture.get("scan_processes", True)
        if not isinstance(scan, bool):
            raise ValueError(
                f"scan_processes is {scan!r}; write true (processes in /proc that say "
                "FAKE_NVML_GPU_MB=<MiB> use a GPU) or false (only those under processes)"
            )
        processes = _static_processes(fixture.get("processes", []), gpus)
        return _Fixture(gpus, failures, processes, scan, units)

    def _failure(self, call: str, spec: dict) -> _Failure:
        where = f"fail.{call}"
        if call not in FAILABLE_CALLS:
            raise ValueError(
                f"{where}: not a call the worker makes; use one of {', '.join(FAILABLE_CALLS)}"
            )
        name = str(spec.get("error", ""))
        error = getattr(self.pynvml, "NVMLError_" + name.removeprefix("NVMLError_"), None)
        if not (isinstance(error, type) and issubclass(error, self.NVMLError)):
            raise ValueError(
                f"{where}.error: pynvml has no NVMLError_{name}; give the part after "
                "NVMLError_, e.g. GpuIsLost, DriverNotLoaded or LibRmVersionMismatch"
            )
        if "gpu" not in spec:
            return _Failure(error, None)
        if call in MACHINE_CALLS or call in CHECK_CALLS:
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
    def from_file(cls, path: str, proc_root: str = "/proc") -> FakeNVML:
        """The fixture in ``path``, read again whenever the file changes."""
        try:
            signature = _signature(path)
            nvml = cls(json.loads(Path(path).read_text()), source=path, proc_root=proc_root)
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot read the NVML fixture {path}: {e}") from None
        nvml._path, nvml._signature = path, signature
        return nvml

    def _reload_if_changed(self) -> None:
        if self._path is None:
            return
        try:
            signature = _signature(self._path)
            if signature == self._signature:
                return
            self._signature = signature  # a broken file is reported once, not every round
            self._use(self._checked(json.loads(Path(self._path).read_text())))
        except (OSError, ValueError) as e:
            self.reload_error = (
                f"cannot read the changed NVML fixture {self._path}: {e}; "
                "still using the one read before"
            )
        else:
            self.reload_error = None

    # ---- processes ---------------------------------------------------------------------------

    def _processes(self, handle: _Handle) -> list[_Use]:
        """The processes ``handle`` reports: the fixture's, then the ones in /proc."""
        if self._round is None:
            self._round = self._scanned() if self.fixture.scan else ()
        found, pids = [], set()
        for use in (*self.fixture.processes, *self._round):
            if use.on(handle) and use.pid not in pids:
                found.append(use)
                pids.add(use.pid)
        return found

    def _scanned(self) -> tuple[_Use, ...]:
        units = self.fixture.units
        found = []
        for pid, used_mb, uuids in self.procs.scan():
            uuid = next((u for u in uuids if u in units), None)
            if uuid is not None:  # else another machine's (or no GPU's)
                found.append(_Use(pid, *units[uuid], used_mb))
        return tuple(found)

    def _used_bytes(self, handle: _Handle) -> int:
        if handle.mig is not None:
            own = [_mig_instance(handle)]
        else:  # a GPU in MIG mode: its instances' too
            own = [handle.gpu, *(m for m in handle.gpu.get("mig_instances", []) if m)]
        used_mb = sum(int(unit.get("memory_used_mb", 0)) for unit in own)
        used_mb += sum(use.used_mb or 0 for use in self._processes(handle))
        return used_mb * MIB

    # ---- pynvml ------------------------------------------------------------------------------

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

    def nvmlSystemGetDriverVersion(self):
        self._call("nvmlSystemGetDriverVersion")
        return DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self):
        self._call("nvmlSystemGetNVMLVersion")
        return NVML_VERSION

    def nvmlDeviceGetCount(self):
        """Starts a round: the fixture file is checked for changes, /proc read again."""
        self._reload_if_changed()
        self._round = None
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
        return _Memory(int(memory["memory_mb"]) * MIB, lambda: self._used_bytes(handle))

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

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            _Process(use.pid, None if use.used_mb is None else use.used_mb * MIB)
            for use in self._processes(handle)
        ]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        self._call("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return []

    def nvmlDeviceGetUtilizationRates(self, handle):
        """The fixture's ``utilization_percent``, for the GPU and (the same) its memory."""
        self._call("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig is not None or handle.gpu.get("mig_mode"):
            raise self.pynvml.NVMLError_NotSupported()
        percent = int(handle.gpu.get("utilization_percent", 0))
        return _Utilization(percent, percent)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._call("nvmlDeviceGetTemperature", handle)
        if sensor != self.pynvml.NVML_TEMPERATURE_GPU:
            raise self.pynvml.NVMLError_InvalidArgument()
        if handle.mig is not None:
            raise self.pynvml.NVMLError_NotSupported()
        return int(handle.gpu.get("temperature_c", _READINGS["temperature_c"][0]))

    def nvmlDeviceGetPowerUsage(self, handle):
        """Milliwatts, as NVML says."""
        self._call("nvmlDeviceGetPowerUsage", handle)
        if handle.mig is not None:
            raise self.pynvml.NVMLError_NotSupported()
        return round(float(handle.gpu.get("power_w", _READINGS["power_w"][0])) * 1000)


def _signature(path: str) -> tuple:
    """What changes when the file is written: its time, size and (replaced) inode."""
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size, st.st_ino


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_readings(where: str, unit: dict, readings: dict) -> None:
    for key, (_default, advice) in readings.items():
        if key not in unit:
            continue
        value = unit[key]
        if key == "power_w":
            ok = (_is_int(value) or isinstance(value, float)) and 0 <= value < float("inf")
        elif key == "utilization_percent":
            ok = _is_int(value) and 0 <= value <= 100
        elif key == "memory_used_mb":
            ok = _is_int(value) and 0 <= value <= int(unit["memory_mb"])
        else:
            ok = _is_int(value)
        if not ok:
            raise ValueError(f"{where}.{key} is {value!r}; write {advice}")


def _static_processes(processes, gpus: list) -> tuple[_Use, ...]:
    """The fixture's ``processes``, checked."""
    if not (isinstance(processes, list) and all(isinstance(p, dict) for p in processes)):
        raise ValueError(f"processes: write it as a list, e.g. {_PROCESSES_EXAMPLE}")
    found: list[_Use] = []
    for n, process in enumerate(processes):
        where = f"processes[{n}]"
        unknown = sorted(set(process) - _PROCESS_KEYS)
        if unknown or not {"pid", "gpu", "used_mb"} <= set(process):
            raise ValueError(
                f"{where}: give a pid, gpu (its index), used_mb (MiB, or null: NVML cannot "
                f'say) and, on a GPU in MIG mode, mig (the slot), e.g. {{"pid": 1234, "gpu": 0, '
                '"used_mb": 300}'
            )
        pid, index, used_mb = process["pid"], process["gpu"], process["used_mb"]
        if not (_is_int(pid) and pid > 0):
            raise ValueError(f"{where}.pid is {pid!r}; write a process id, e.g. 1234")
        if not (_is_int(index) and 0 <= index < len(gpus)):
            raise ValueError(
                f"{where}.gpu is {index!r}; write the index of one of the {len(gpus)} GPUs "
                f"(0 to {len(gpus) - 1})"
            )
        if not (used_mb is None or (_is_int(used_mb) and used_mb >= 0)):
            raise ValueError(f"{where}.used_mb is {used_mb!r}; write whole MiB, e.g. 300, or null")
        gpu = gpus[index]
        instances = gpu.get("mig_instances", [])
        slot = process.get("mig")
        if slot is None and gpu.get("mig_mode"):
            raise ValueError(
                f"{where}: GPU {index} is in MIG mode, so its processes run on an instance: "
                'add "mig": the instance\'s slot, e.g. 0'
            )
        if slot is not None and not (
            _is_int(slot) and 0 <= slot < len(instances) and instances[slot] is not None
        ):
            raise ValueError(
                f"{where}.mig is {slot!r}; write the slot of one of GPU {index}'s MIG instances "
                f"({', '.join(str(s) for s, m in enumerate(instances) if m) or 'it has none'})"
            )
        if any(u.pid == pid and (u.index, u.slot) == (index, slot) for u in found):
            raise ValueError(f"{where}: pid {pid} is listed twice on the same GPU; list it once")
        found.append(_Use(pid, index, slot, used_mb))
    return tuple(found)


@dataclass(frozen=True)
class _Seen:
    """A process whose environment says it uses a GPU: read when it had start time ``start``."""

    start: bytes
    used_mb: int
    uuids: tuple[str, ...]  # its GPU: the first of these that is in the fixture


class ProcScan:
    """The processes under ``root`` (``/proc``) whose environment says they use a GPU.

    Each process's environment is read once: what it said is remembered by pid (a process
    without ``FAKE_NVML_GPU_MB``, or unreadable, as "no GPU"), and read again only when the
    pid's start time changed (a new process with an old pid; checked for GPU processes only).
    Pids that are gone are forgotten. A zombie uses no GPU. Processes that vanish while being
    read, or cannot be read, are skipped.
    """

    def __init__(self, root: str = "/proc"):
        self.root = Path(root)
        self._seen: dict[int, _Seen | None] = {}

    def scan(self) -> list[tuple[int, int, tuple[str, ...]]]:
        """``(pid, MiB, uuids)`` of each GPU process: ``uuids`` its GPU, in order of preference."""
        try:
            pids = {int(name) for name in os.listdir(self.root) if name.isdigit()}
        except OSError:
            return []
        for gone in self._seen.keys() - pids:
            del self._seen[gone]
        found = []
        for pid in sorted(pids):
            if pid in self._seen and self._seen[pid] is None:
                continue  # no GPU process
            stat = self._stat(pid)
            if stat is None:
                self._seen.pop(pid, None)  # gone
                continue
            start, zombie = stat
            seen = self._seen.get(pid)
            if seen is None or seen.start != start:
                if not self._read(pid, start):
                    continue
                seen = self._seen[pid]
                if seen is None:
                    continue
            if not zombie:
                found.append((pid, seen.used_mb, seen.uuids))
        return found

    def _stat(self, pid: int) -> tuple[bytes, bool] | None:
        """Its start time (field 22 of /proc/PID/stat) and whether it is a zombie."""
        try:
            stat = (self.root / str(pid) / "stat").read_bytes()
        except OSError:
            return None
        fields = stat.rpartition(b")")[2].split()  # the name may hold spaces and parentheses
        if len(fields) < 20:
            return None
        return fields[19], fields[0] in (b"Z", b"X")

    def _read(self, pid: int, start: bytes) -> bool:
        """Remember what ``pid``'s environment says; False when it is gone."""
        try:
            environ = (self.root / str(pid) / "environ").read_bytes()
        except PermissionError:
            self._seen[pid] = None
            return True
        except OSError:
            self._seen.pop(pid, None)
            return False
        env = dict(
            entry.decode(errors="replace").partition("=")[::2]
            for entry in environ.split(b"\0")
            if entry.startswith((b"FAKE_NVML_GPU", b"NVIDIA_VISIBLE_DEVICES="))
        )
        try:
            used_mb = int(env["FAKE_NVML_GPU_MB"])
        except (KeyError, ValueError):
            used_mb = -1
        if used_mb < 0:
            self._seen[pid] = None
            return True
        if "FAKE_NVML_GPU" in env:
            uuids = (env["FAKE_NVML_GPU"].strip(),)
        else:
            visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
            uuids = tuple(u.strip() for u in visible.split(",") if u.strip())
        self._seen[pid] = _Seen(start, used_mb, uuids)
        return True


# ---- where the tests put it -------------------------------------------------------------------


@functools.cache
def real_pynvml():
    """nvidia-ml-py's ``pynvml``, for its constants and exception classes: the one ``import
    pynvml`` finds, or (where the shim is first on the path) the one after it."""
    if not any(_is_shim(entry) for entry in sys.path):
        import pynvml

        return pynvml
    path = [entry for entry in sys.path if not _is_shim(entry)]
    spec = importlib.machinery.PathFinder.find_spec("pynvml", path)
    if spec is None or spec.loader is None:
        raise ImportError(
            "the fake NVML takes pynvml's exception classes from nvidia-ml-py, which this "
            "python cannot import; install it (pip install nvidia-ml-py)"
        )
    module = importlib.util.module_from_spec(spec)
    shim = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module  # pynvml makes its NVMLError_* classes on sys.modules' own
    try:
        spec.loader.exec_module(module)
    finally:
        if shim is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = shim
    return module


def _is_shim(entry: str) -> bool:
    return Path(entry or ".").resolve() == SHIM


def serve(path: str, say: Callable[[str], None] | None = None) -> FakeNVML:
    """The double over the fixture in ``path``, announced (on stderr unless ``say``)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    nvml = FakeNVML.from_file(path)
    say(f"FAKE NVML: GPUs from the fixture {path}, not a driver (tests/fakes/nvml.py)")
    return nvml


@contextlib.contextmanager
def imported(path: str | os.PathLike) -> Iterator[FakeNVML]:
    """In this process, ``import pynvml`` (worker_setup.gpus.load_nvml) gives the double over
    ``path`` while inside, as the shim does in a process started with ``shim_env``; unannounced
    (the test named it), its driver's version still says FAKE."""
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = nvml = serve(str(path), say=lambda line: None)
    try:
        yield nvml
    finally:
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved


def shim_env(path: str | os.PathLike, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` for a process whose ``import pynvml`` gives the double over ``path``: the
    shim first on PYTHONPATH, the fixture (absolute) in FAKE_NVML_FIXTURE."""
    pythonpath = os.pathsep.join(p for p in (str(SHIM), environ.get("PYTHONPATH", "")) if p)
    fixture = str(Path(path).resolve())
    return {**environ, "PYTHONPATH": pythonpath, FIXTURE_VARIABLE: fixture}


def shim_words(fixture: str, checkout: str = "$PWD") -> str:
    """What goes before a shell command run in a copy of this repository (``checkout``, e.g. a
    bed machine's) so that its ``import pynvml`` gives the double over ``fixture`` (a path
    inside the checkout): ``PYTHONPATH=... FAKE_NVML_FIXTURE=...``."""
    shim = SHIM.relative_to(Path(__file__).resolve().parents[2])
    return f"PYTHONPATH={checkout}/{shim} {FIXTURE_VARIABLE}={checkout}/{fixture}"
