"""GPU discovery: NVML at the edge, simulated GPUs for machines without one.

``discover`` takes the NVML module as an argument so tests hand it a fake explicitly; the real
``pynvml`` (package nvidia-ml-py) is only imported by ``load_nvml``. Every NVML failure, at
start-up or on one GPU, comes out as ``NVMLUnavailable`` with one line naming what failed and
the fix.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
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
        super().__init__(f"{named} failed: {reason}; {_advice(reason, GPU_FIX)}")


@dataclass(frozen=True)
class GPUInfo:
    index: int
    uuid: str
    name: str
    memory_mb: int
    simulated: bool = False


def load_nvml():
    """The real NVML bindings."""
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NVMLUnavailable("pynvml is missing; install nvidia-ml-py") from e
    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(error: Exception) -> str:
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
        reason = _reason(e)
        raise NVMLUnavailable(
            f"NVML did not initialise: {reason} ({_advice(reason, INIT_FIX)})"
        ) from e
    try:
        found = _read_gpus(nvml)
    except BaseException:
        with contextlib.suppress(Exception):  # the first failure is the one to report
            nvml.nvmlShutdown()
        raise
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as e:
        reason = _reason(e)
        raise NVMLUnavailable(
            f"NVML failed while shutting down: {reason}; {_advice(reason, GPU_FIX)}"
        ) from e
    return found


def _read_gpus(nvml) -> list[GPUInfo]:
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as e:
        reason = _reason(e)
        raise NVMLUnavailable(
            f"NVML could not count the GPUs: {reason}; {_advice(reason, GPU_FIX)}"
        ) from e
    return [_read_gpu(nvml, index) for index in range(count)]


def _read_gpu(nvml, index: int) -> GPUInfo:
    ident = ""  # how the message names the GPU besides its index: UUID, else PCI bus id
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        except nvml.NVMLError:
            ident = _pci_bus_id(nvml, handle)
            raise
        ident = uuid
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    except nvml.NVMLError as e:
        raise GPUFailed(index, ident, _reason(e)) from e
    return GPUInfo(index=index, uuid=uuid, name=name, memory_mb=memory_mb)


def _pci_bus_id(nvml, handle) -> str:
    """``PCI <bus id>`` of a GPU whose UUID could not be read, or "" when that fails too."""
    try:
        return f"PCI {_text(nvml.nvmlDeviceGetPciInfo(handle).busId)}"
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


def _advice(message: str, default: str) -> str:
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
