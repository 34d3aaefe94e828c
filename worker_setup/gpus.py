"""GPU discovery: NVML at the edge, simulated GPUs for machines without one.

``discover`` takes the NVML module as an argument so tests hand it a fake explicitly; the real
``pynvml`` (package nvidia-ml-py) is only imported by ``load_nvml``.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path

from gpu_swarm_spawner.contract import simulated_uuid


class NVMLUnavailable(RuntimeError):
    """NVML could not be loaded or initialised: no NVIDIA driver, or a driver/library mismatch."""


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


def discover(nvml) -> list[GPUInfo]:
    """Every GPU NVML reports: index, UUID, name and total memory."""
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise NVMLUnavailable(f"NVML did not initialise: {e}{_advice(str(e))}") from e
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GPUInfo(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mb=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


#: What to do about NVML's start-up errors, by a word of its message.
_ADVICE = {
    "mismatch": "the NVIDIA kernel driver and its library differ, usually after a driver "
    "upgrade: reboot the machine",
    "not loaded": "the NVIDIA kernel driver is not loaded: install the driver "
    "(e.g. apt-get install nvidia-driver) and reboot",
    "not found": "the NVIDIA driver's library libnvidia-ml.so is missing: install the driver",
    "permission": "run the setup as root",
}


def _advice(message: str) -> str:
    for word, advice in _ADVICE.items():
        if word in message.lower():
            return f" ({advice})"
    return ""


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
