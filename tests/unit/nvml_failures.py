"""One failure of each pynvml call the worker makes, as fake-NVML fixtures, and the one line each
must give (shared by test_gpus.py, test_advertise.py and test_worker_venv.py); ``run``, the
advertise command in this process over a fixture."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from tests.fakes.nvml import imported
from worker_setup import advertise

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvml"
#: Two Tesla K80 halves; the failures below hit GPU 1 where the call is about one GPU.
K80X2 = FIXTURES / "k80x2.json"
K80_UUIDS = [
    "GPU-6b3c1f0e-4a5d-2c8e-9f1a-000000000000",
    "GPU-6b3c1f0e-4a5d-2c8e-9f1a-000000000001",
]
RESET = "reboot the machine or reset the GPU with nvidia-smi -r, then run this again"

#: {pynvml call: (the fixture's "fail", how the one line starts)}
FAILURES = {
    "nvmlInit": (
        {"nvmlInit": {"error": "DriverNotLoaded"}},
        "NVML did not initialise: Driver Not Loaded (the NVIDIA kernel driver is not loaded: "
        "install the driver",
    ),
    "nvmlDeviceGetCount": (
        {"nvmlDeviceGetCount": {"error": "GpuIsLost"}},
        f"NVML could not count the GPUs: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetHandleByIndex": (
        {"nvmlDeviceGetHandleByIndex": {"gpu": 1, "error": "GpuIsLost"}},
        f"GPU 1 failed: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetUUID": (  # named by its PCI bus id instead (the fake's default for GPU 1)
        {"nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"}},
        f"GPU 1 (PCI 00000000:02:00.0) failed: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetPciInfo": (  # read only to name a GPU whose UUID failed: both fail here
        {
            "nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"},
            "nvmlDeviceGetPciInfo": {"gpu": 1, "error": "GpuIsLost"},
        },
        f"GPU 1 failed: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetName": (
        {"nvmlDeviceGetName": {"gpu": 1, "error": "GpuIsLost"}},
        f"GPU 1 ({K80_UUIDS[1]}) failed: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetMemoryInfo": (
        {"nvmlDeviceGetMemoryInfo": {"gpu": 1, "error": "ResetRequired"}},
        f"GPU 1 ({K80_UUIDS[1]}) failed: GPU requires restart; {RESET}",
    ),
    "nvmlShutdown": (
        {"nvmlShutdown": {"error": "Unknown"}},
        "NVML failed while shutting down: Unknown Error; look at nvidia-smi and the kernel log",
    ),
}

#: A machine of three A100s: GPU 0 whole, GPU 1 in MIG mode with instances in slots 0 and 2,
#: GPU 2 in MIG mode without instances.
MIXED_MIG = FIXTURES / "mixed-mig.json"
MIXED_GPU_UUIDS = [f"GPU-4d8e2b6a-9c1f-4a3e-b7d5-00000000000{i}" for i in range(3)]
MIXED_MIG_UUIDS = [f"MIG-8b2c5e1f-6a4d-4b9c-a3e7-00000000000{i}" for i in (0, 2)]

#: The calls only a GPU with MIG meets, failed on GPU 1 of MIXED_MIG: {call: (fail, line)}
MIG_FAILURES = {
    "nvmlDeviceGetMigMode": (
        {"nvmlDeviceGetMigMode": {"gpu": 1, "error": "GpuIsLost"}},
        f"GPU 1 ({MIXED_GPU_UUIDS[1]}) failed: GPU is lost; {RESET}",
    ),
    "nvmlDeviceGetMaxMigDeviceCount": (
        {"nvmlDeviceGetMaxMigDeviceCount": {"gpu": 1, "error": "ResetRequired"}},
        f"GPU 1 ({MIXED_GPU_UUIDS[1]}) failed: GPU requires restart; {RESET}",
    ),
    "nvmlDeviceGetMigDeviceHandleByIndex": (
        {"nvmlDeviceGetMigDeviceHandleByIndex": {"gpu": 1, "mig": 2, "error": "GpuIsLost"}},
        f"GPU 1 ({MIXED_GPU_UUIDS[1]}) failed: GPU is lost; {RESET}",
    ),
}


def run(tmp_path: Path, *args: str, nvml: Path | None = None) -> tuple[int, dict | None]:
    """``python -m worker_setup.advertise ARGS`` in this process, NVML the fake over the fixture
    ``nvml`` when given: its status and the daemon.json it left."""
    path = tmp_path / "daemon.json"
    with imported(nvml) if nvml else contextlib.nullcontext():
        rc = advertise.main(["--daemon-json", str(path), "--nvidia-runtime", "off", *args])
    return rc, (json.loads(path.read_text()) if path.exists() else None)


def fixture_failing(tmp_path: Path, fail: dict, base: Path = K80X2) -> Path:
    """A copy of the fixture ``base`` whose NVML fails as ``fail`` says."""
    path = tmp_path / "nvml-fixture.json"
    path.write_text(json.dumps({**json.loads(base.read_text()), "fail": fail}))
    return path
