"""One reading of this machine's GPUs for the GPU guard: each GPU and MIG instance with its
memory, utilization, temperature and power, and the processes using each.

``read(nvml)`` takes the NVML module (worker_setup.gpus.load_nvml's, or a test's double),
already initialised: the guard keeps NVML open across rounds. It runs every few seconds, so it
makes only the calls it needs, about ten a GPU.

What it reads:

- every GPU: UUID, name, memory (total and used, MiB), utilization (percent), temperature
  (Celsius) and power (watts);
- a GPU not in MIG mode: its processes (compute and graphics, once per pid), on its UUID;
- a GPU in MIG mode: the GPU itself (its processes are its instances'), then each MIG instance
  with its UUID (``MIG-...``), name and memory, and its processes on the instance's UUID. An
  instance has no utilization, temperature or power of its own in NVML: those are None.

Failures never stop the round, nor raise: each one is a line in ``Snapshot.errors`` naming the
GPU (``GPU 1 (GPU-...): GPU is lost (reading its memory)``).

- NVML cannot count the GPUs: an empty snapshot.
- A GPU or MIG instance whose handle, UUID, name, memory or processes cannot be read, or a GPU
  whose MIG mode cannot, is left out of the snapshot, its processes with it: a reading that
  lists a GPU lists all of its processes, so the guard can take a GPU it was given for read
  (and one missing for "not read this round"). A GPU whose MIG instances cannot be counted is
  there without them.
- Utilization, temperature or power that fail are None; "Not Supported" (utilization on a GPU
  in MIG mode, old GPUs) is not an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from .gpus import in_mig_mode, mig_handle, nvml_reason, nvml_text, pci_bus_id

MIB = 1024 * 1024
#: What NVML gives for a value it cannot say (pynvml's NVML_VALUE_NOT_AVAILABLE_ulonglong).
_NOT_AVAILABLE = 2**64 - 1


@dataclass(frozen=True)
class GPUStats:
    uuid: str  # GPU-... or, for a MIG instance, MIG-...
    index: int  # NVML index of the (parent) GPU
    name: str
    memory_total_mb: int
    memory_used_mb: int | None  # None: NVML could not say
    utilization_percent: int | None  # None: not supported (MIG instances) or failed
    temperature_c: int | None
    power_w: float | None
    parent_uuid: str | None = None  # the GPU of a MIG instance; None for a whole GPU


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    gpu_uuid: str  # the GPU or MIG instance it runs on
    used_mb: int | None  # None: NVML could not say (usedGpuMemory not available)


@dataclass(frozen=True)
class Snapshot:
    gpus: tuple[GPUStats, ...]  # every GPU and MIG instance read this round (a MIG-mode parent too)
    processes: tuple[ProcessUse, ...]
    errors: tuple[str, ...]  # one readable line per failure; the round goes on


def read(nvml) -> Snapshot:
    """This round's reading of every GPU NVML reports (NVML already initialised)."""
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        return Snapshot((), (), (f"NVML could not count the GPUs: {nvml_reason(e)}",))
    reading = _Reading(nvml)
    for index in range(count):
        with contextlib.suppress(_LeftOut):  # its error line is written
            reading.gpu(index)
    return Snapshot(tuple(reading.gpus), tuple(reading.processes), tuple(reading.errors))


class _LeftOut(Exception):
    """A GPU or MIG instance could not be read; its error line is written."""


def _mb(value) -> int | None:
    return None if value is None or value >= _NOT_AVAILABLE else int(value) // MIB


class _Reading:
    """What one ``read`` collects, GPU by GPU."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.gpus: list[GPUStats] = []
        self.processes: list[ProcessUse] = []
        self.errors: list[str] = []

    def _failed(self, named: str, what: str, error: Exception) -> None:
        self.errors.append(f"{named}: {nvml_reason(error)} (reading its {what})")

    def _needed(self, named: str, what: str, call, *args):
        """``call(*args)``; a failure leaves the GPU (or instance) out."""
        try:
            return call(*args)
        except self.nvml.NVMLError as e:
            self._failed(named, what, e)
            raise _LeftOut from e

    def _optional(self, named: str, what: str, call, *args):
        """``call(*args)``, or None when it fails ("Not Supported": silently)."""
        nvml = self.nvml
        try:
            return call(*args)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return None
        except nvml.NVMLError as e:
            self._failed(named, what, e)
            return None

    def gpu(self, index: int) -> None:
        nvml = self.nvml
        handle = self._needed(f"GPU {index}", "handle", nvml.nvmlDeviceGetHandleByIndex, index)
        try:
            uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError as e:
            pci = pci_bus_id(nvml, handle)  # names it instead, where it can
            self._failed(f"GPU {index} ({pci})" if pci else f"GPU {index}", "UUID", e)
            raise _LeftOut from e
        named = f"GPU {index} ({uuid})"
        name, total_mb, used_mb = self._identity(named, handle)
        mig_mode = self._needed(named, "MIG mode", in_mig_mode, nvml, handle)
        processes = () if mig_mode else self._processes(named, handle, uuid)
        utilization = self._optional(named, "utilization", nvml.nvmlDeviceGetUtilizationRates,
                                     handle)  # fmt: skip
        temperature = self._optional(named, "temperature", nvml.nvmlDeviceGetTemperature,
                                     handle, nvml.NVML_TEMPERATURE_GPU)  # fmt: skip
        power_mw = self._optional(named, "power", nvml.nvmlDeviceGetPowerUsage, handle)
        self.gpus.append(
            GPUStats(
                uuid,
                index,
                name,
                total_mb,
                used_mb,
                utilization_percent=None if utilization is None else int(utilization.gpu),
                temperature_c=None if temperature is None else int(temperature),
                power_w=None if power_mw is None else power_mw / 1000,
            )
        )
        self.processes.extend(processes)
        if mig_mode:
            self._mig_instances(index, uuid, named, handle)

    def _identity(self, named: str, handle) -> tuple[str, int, int | None]:
        """Name, total and used memory (MiB) of a GPU or MIG instance."""
        name = nvml_text(self._needed(named, "name", self.nvml.nvmlDeviceGetName, handle))
        memory = self._needed(named, "memory", self.nvml.nvmlDeviceGetMemoryInfo, handle)
        return name, int(memory.total) // MIB, _mb(memory.used)

    def _mig_instances(self, index: int, parent_uuid: str, named: str, handle) -> None:
        nvml = self.nvml
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError as e:
            self._failed(named, "MIG instances", e)
            return
        for slot in range(slots):
            ident = f"GPU {index} ({parent_uuid}, MIG instance {slot}"
            try:
                mig = self._needed(f"{ident})", "handle", mig_handle, nvml, handle, slot)
                if mig is None:
                    continue  # an empty slot
                uuid = nvml_text(self._needed(f"{ident})", "UUID", nvml.nvmlDeviceGetUUID, mig))
                named = f"{ident} {uuid})"
                name, total_mb, used_mb = self._identity(named, mig)
                processes = self._processes(named, mig, uuid)
            except _LeftOut:
                continue
            self.gpus.append(GPUStats(uuid, index, name, total_mb, used_mb, None, None, None,
                                      parent_uuid=parent_uuid))  # fmt: skip
            self.processes.extend(processes)

    def _processes(self, named: str, handle, uuid: str) -> list[ProcessUse]:
        """The compute and graphics processes on ``handle``, each pid once (with the most
        memory either list gives it)."""
        nvml = self.nvml
        found: dict[int, ProcessUse] = {}
        for what, call in (
            ("compute processes", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics processes", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            try:
                listed = call(handle)
            except nvml.NVMLError_NotSupported:
                continue
            except nvml.NVMLError as e:
                self._failed(named, what, e)
                raise _LeftOut from e
            for process in listed:
                pid, used_mb = int(process.pid), _mb(process.usedGpuMemory)
                known = found.get(pid)
                if known is None or (
                    used_mb is not None and (known.used_mb is None or used_mb > known.used_mb)
                ):
                    found[pid] = ProcessUse(pid, uuid, used_mb)
        return list(found.values())
