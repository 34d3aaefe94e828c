"""GPU discovery: NVML at the edge, simulated GPUs for machines without one.

``discover`` takes the NVML module as an argument so tests hand it a double explicitly. NVML
comes from one place, ``load_nvml``: ``import pynvml`` (package nvidia-ml-py); every command
(advertise, the join, the GPU guard, gpu_check) gets it there and has no option for anything
else. The tests' fake NVML is found there only where a test puts it first on PYTHONPATH and
names its fixture (docs/development.md), and it says FAKE NVML when it is. Every NVML failure, at
start-up or on one GPU, comes out as ``NVMLUnavailable`` with one line naming what failed and
the fix.

A GPU in MIG mode is read with its MIG instances (``GPUInfo.mig_instances``); ``advertised``
turns the GPUs into what Swarm is told about: each MIG instance in place of its GPU, and a
line for each GPU in MIG mode that has no instance to offer.

Its NVML helpers are public for the other readers of NVML on this machine (``telemetry``, the
guard's reading every few seconds; ``gpu_check``, ``make gpu-check``), so all of them read
NVML's text, errors and MIG instances the one way: ``nvml_text``, ``nvml_reason``,
``fix_for`` (the advice for an NVML message), ``read_gpus``/``read_gpu`` (the join's reading),
``in_mig_mode``, ``mig_handle`` and ``pci_bus_id``. It imports only the contract.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from gpu_swarm_spawner.contract import simulated_uuid


class NVMLUnavailable(RuntimeError):
    """NVML cannot be used here: it did not load or start, or a GPU failed while being read.

    The message is one line: what failed, NVML's reason and the fix.
    """


class GPUFailed(NVMLUnavailable):
    """NVML started, but one GPU failed while being read (e.g. "GPU is lost")."""

    def __init__(self, index: int, ident: str, reason: str):
        self.index, self.ident, self.reason = index, ident, reason
        named = f"GPU {index} ({ident})" if ident else f"GPU {index}"
        super().__init__(f"{named} failed: {reason}; {fix_for(reason, GPU_FIX)}")


@dataclass(frozen=True)
class GPUInfo:
    """A GPU, or one MIG instance of a GPU (``parent_uuid`` set; ``index`` is its GPU's)."""

    index: int
    uuid: str
    name: str
    memory_mb: int
    simulated: bool = False
    #: The GPU is in MIG mode (only its instances can be used), and its instances.
    mig_mode: bool = False
    mig_instances: tuple[GPUInfo, ...] = ()
    #: For a MIG instance: the GPU it is part of, and its profile as NVML names it (1g.10gb).
    parent_uuid: str = ""
    profile: str = ""

    @property
    def is_mig(self) -> bool:
        return bool(self.parent_uuid)

    @property
    def described(self) -> str:
        """How a line names it: ``GPU 1 (GPU-..., Tesla K80, 11441 MiB)``, or ``MIG instance
        MIG-... of GPU 1 (NVIDIA A100-SXM4-80GB MIG 1g.10gb, 9728 MiB)``."""
        if self.is_mig:
            return (
                f"MIG instance {self.uuid} of GPU {self.index} ({self.name}, {self.memory_mb} MiB)"
            )
        return f"GPU {self.index} ({self.uuid}, {self.name}, {self.memory_mb} MiB)"


def load_nvml():
    """The NVML bindings: ``pynvml`` as this python imports it."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NVMLUnavailable("pynvml is missing; install nvidia-ml-py") from e
    return pynvml


def nvml_text(value) -> str:
    """NVML's text as str: bytes (older pynvml) decoded, bytes that are not UTF-8 replaced."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _read_text(call, handle) -> str:
    """The text ``call`` answers for ``handle``. Newer pynvml decodes it itself and raises
    UnicodeDecodeError when it is not UTF-8 (a corrupted VBIOS or InfoROM): read with the bad
    bytes replaced instead."""
    try:
        return nvml_text(call(handle))
    except UnicodeDecodeError as e:
        return nvml_text(e.object)


def _name(text: str) -> str:
    """A GPU's name fit for a label and one line: control characters (a newline, a tab) as
    spaces, runs of spaces as one, none at the ends; ``unnamed GPU`` when nothing is left."""
    cleaned = " ".join("".join(" " if unicodedata.category(c) == "Cc" else c for c in text).split())
    return cleaned or "unnamed GPU"


def nvml_reason(error: Exception) -> str:
    """NVML's message for an error, without its trailing full stop."""
    return str(error).strip().rstrip(".") or type(error).__name__


def discover(nvml) -> list[GPUInfo]:
    """Every GPU NVML reports: index, UUID, name and total memory.

    Raises ``NVMLUnavailable`` when NVML does not start, cannot count the GPUs, fails on any
    one GPU (``GPUFailed``) or fails to shut down: a machine whose NVML reports a fault is not
    advertised by halves.
    """
    try:
        nvml.nvmlInit()
    except Exception as e:
        reason = nvml_reason(e)
        raise NVMLUnavailable(
            f"NVML did not initialise: {reason} ({fix_for(reason, INIT_FIX)})"
        ) from e
    try:
        found = read_gpus(nvml)
    except BaseException:
        with contextlib.suppress(Exception):  # the first failure is the one to report
            nvml.nvmlShutdown()
        raise
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as e:
        reason = nvml_reason(e)
        raise NVMLUnavailable(
            f"NVML failed while shutting down: {reason}; {fix_for(reason, GPU_FIX)}"
        ) from e
    return found


def read_gpus(nvml) -> list[GPUInfo]:
    """Every GPU as the join reads it (``discover`` without starting NVML: it is started)."""
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        reason = nvml_reason(e)
        raise NVMLUnavailable(
            f"NVML could not count the GPUs: {reason}; {fix_for(reason, GPU_FIX)}"
        ) from e
    return [read_gpu(nvml, index) for index in range(count)]


def read_gpu(nvml, index: int) -> GPUInfo:
    """The GPU at ``index`` with its MIG instances; ``GPUFailed`` naming it when NVML fails."""
    ident = ""  # how the message names the GPU besides its index: UUID, else PCI bus id
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            uuid = _read_text(nvml.nvmlDeviceGetUUID, handle)
        except nvml.NVMLError:
            ident = pci_bus_id(nvml, handle)
            raise
        ident = uuid
        name = _name(_read_text(nvml.nvmlDeviceGetName, handle))
        memory_mb = _memory_mb(nvml, handle)
        mig_mode = in_mig_mode(nvml, handle)
        instances = _read_mig_instances(nvml, index, uuid, handle) if mig_mode else ()
    except nvml.NVMLError as e:
        raise GPUFailed(index, ident, nvml_reason(e)) from e
    return GPUInfo(index, uuid, name, memory_mb, mig_mode=mig_mode, mig_instances=instances)


def _memory_mb(nvml, handle) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)


def in_mig_mode(nvml, handle) -> bool:
    """Whether MIG mode is on now (a mode pending until the next GPU reset does not count).

    GPUs without MIG (before Ampere) answer "Not Supported", drivers before MIG have no such
    call: both are GPUs used whole."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
        return False
    return current == nvml.NVML_DEVICE_MIG_ENABLE


def _read_mig_instances(nvml, index: int, parent_uuid: str, handle) -> tuple[GPUInfo, ...]:
    """The MIG instances of a GPU in MIG mode; an empty slot answers "Not Found"."""
    instances = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = mig_handle(nvml, handle, slot)
        if mig is None:
            continue
        ident = f"{parent_uuid}, MIG instance {slot}"
        try:
            uuid = _read_text(nvml.nvmlDeviceGetUUID, mig)
            ident += f" {uuid}"
            name = _name(_read_text(nvml.nvmlDeviceGetName, mig))
            memory_mb = _memory_mb(nvml, mig)
        except nvml.NVMLError as e:
            raise GPUFailed(index, ident, nvml_reason(e)) from e
        # NVML names an instance after its GPU and profile: "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        profile = name.rpartition(" MIG ")[2] if " MIG " in name else ""
        instances.append(
            GPUInfo(index, uuid, name, memory_mb, parent_uuid=parent_uuid, profile=profile)
        )
    return tuple(instances)


def mig_handle(nvml, handle, slot: int):
    """The handle of the MIG instance in ``slot`` of a GPU in MIG mode, or None for an empty
    slot (NVML answers "Not Found"); other NVML errors are raised."""
    try:
        return nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
    except nvml.NVMLError_NotFound:
        return None


def advertised(found: list[GPUInfo]) -> tuple[list[GPUInfo], list[str]]:
    """What of ``found`` is advertised: each GPU, or for a GPU in MIG mode its MIG instances
    (never the GPU itself: its memory and compute belong to the instances). Also one line
    for each GPU in MIG mode without instances, which advertises nothing: that is how an
    admin left it, not a fault, so the other GPUs are still advertised."""
    units: list[GPUInfo] = []
    notes: list[str] = []
    for gpu in found:
        if not gpu.mig_mode:
            units.append(gpu)
        elif gpu.mig_instances:
            units.extend(gpu.mig_instances)
        else:
            notes.append(no_mig_instances(gpu))
    return units, notes


def no_mig_instances(gpu: GPUInfo) -> str:
    """The one line for a GPU in MIG mode without MIG instances, naming the fix."""
    i = gpu.index
    return (
        f"GPU {i} ({gpu.uuid}) is in MIG mode but has no MIG instances, so it advertises "
        f"nothing; as an admin, create them (profiles: nvidia-smi mig -i {i} -lgip; e.g. "
        f"nvidia-smi mig -i {i} -cgi 1g.10gb,1g.10gb -C) or turn MIG mode off "
        f"(nvidia-smi -i {i} -mig 0, then reset the GPU), then run this again; this setup "
        "never changes MIG mode"
    )


def pci_bus_id(nvml, handle) -> str:
    """``PCI <bus id>`` of a GPU whose UUID could not be read, or "" when that fails too."""
    try:
        return f"PCI {nvml_text(nvml.nvmlDeviceGetPciInfo(handle).busId)}"
    except nvml.NVMLError:
        return ""


#: The fix for a GPU failing after NVML started, unless its message matches one in _ADVICE.
GPU_FIX = (
    "look at nvidia-smi and the kernel log (dmesg | grep -i xid), fix the GPU, then run this again"
)
#: The fix for NVML failing to start, unless its message matches one in _ADVICE.
INIT_FIX = "check the NVIDIA driver with nvidia-smi"
_RESET = "reboot the machine or reset the GPU with nvidia-smi -r, then run this again"

#: What to do about NVML's errors, by a word of its message (pynvml's messages, e.g.
#: "Driver Not Loaded", "GPU is lost", "RM has detected an NVML/RM version mismatch").
_ADVICE = {
    "mismatch": "the NVIDIA kernel driver and its library differ, usually after a driver "
    "upgrade: reboot the machine",
    "not loaded": "the NVIDIA kernel driver is not loaded: install the driver "
    "(e.g. apt-get install nvidia-driver) and reboot",
    "library not found": "the NVIDIA driver's library libnvidia-ml.so is missing: "
    "install the driver",
    "permission": "run the setup as root",
    "gpu is lost": _RESET,
    "requires restart": _RESET,
    "inforom": "the GPU's infoROM is corrupted: have the GPU serviced or take it out",
    "power": "connect the GPU's power cables",
}


def fix_for(message: str, default: str) -> str:
    """The fix for an NVML ``message`` (its reason), by a word of it; else ``default``."""
    for word, advice in _ADVICE.items():
        if word in message.lower():
            return advice
    return default


def machine_id() -> str:
    """A stable id for this machine: /etc/machine-id, else a hash of the hostname."""
    path = Path("/etc/machine-id")
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()


def simulated(count: int, machine: str, memory_mb: int = 16384) -> list[GPUInfo]:
    """``count`` simulated GPUs whose UUIDs say they are simulated."""
    return [
        GPUInfo(i, simulated_uuid(machine, i), "Simulated GPU", memory_mb, simulated=True)
        for i in range(count)
    ]
