"""The GPU guard's reading of NVML (worker_setup.telemetry) against the fake NVML: what it reads
from whole GPUs and MIG instances, and that a failure leaves out only what it must."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeNVML
from worker_setup import telemetry
from worker_setup.telemetry import GPUStats, ProcessUse, Snapshot

from .nvml_failures import FIXTURES, K80_UUIDS, K80X2, MIXED_GPU_UUIDS, MIXED_MIG_UUIDS

TELEMETRY_PY = Path(telemetry.__file__)
H100_PARENT = "GPU-7c1d4e2a-5b6f-4a3c-9d8e-000000000000"
H100_MIGS = [f"MIG-2a7e9c1b-3d4f-5a6b-8c9d-00000000000{i}" for i in range(7)]
A100_PARENT = "GPU-1e4b7a90-2c3d-4e5f-8a7b-000000000000"
A100_MIGS = [f"MIG-5f0c3a8d-1b2e-4c7d-9e6f-00000000000{i}" for i in range(3)]


def fixture(name, **extra) -> dict:
    """A fixture of tests/fixtures/nvml, changed by ``extra``; /proc is not looked at."""
    return {**json.loads((FIXTURES / name).read_text()), "scan_processes": False, **extra}


def read(fixture: dict, nvml_class=FakeNVML) -> Snapshot:
    nvml = nvml_class(fixture)
    nvml.nvmlInit()
    return telemetry.read(nvml)


def k80s(**extra) -> dict:
    """Two K80s with readings of their own: GPU 0 busy, GPU 1 idle."""
    base = fixture(K80X2.name)
    base["gpus"][0].update(utilization_percent=87, temperature_c=71, power_w=148.5,
                           memory_used_mb=200)  # fmt: skip
    base["gpus"][1].update(temperature_c=33, power_w=25)
    base["processes"] = [
        {"pid": 4242, "gpu": 0, "used_mb": 3000},
        {"pid": 4243, "gpu": 0, "used_mb": 1500},
        {"pid": 77, "gpu": 1, "used_mb": None},
    ]
    return {**base, **extra}


def by_uuid(snapshot: Snapshot) -> dict[str, GPUStats]:
    return {gpu.uuid: gpu for gpu in snapshot.gpus}


# ---- what is read ------------------------------------------------------------------------


def test_whole_gpus_with_their_memory_readings_and_processes():
    snapshot = read(k80s())
    assert snapshot.gpus == (
        GPUStats(K80_UUIDS[0], 0, "Tesla K80", 11441, 200 + 3000 + 1500, 87, 71, 148.5),
        GPUStats(K80_UUIDS[1], 1, "Tesla K80", 11441, 0, 0, 33, 25.0),
    )
    assert snapshot.processes == (
        ProcessUse(4242, K80_UUIDS[0], 3000),
        ProcessUse(4243, K80_UUIDS[0], 1500),
        ProcessUse(77, K80_UUIDS[1], None),  # usedGpuMemory not available
    )
    assert snapshot.errors == ()


def test_the_defaults_of_a_fixture_without_readings():
    (gpu, _) = read(fixture("k80x2.json")).gpus
    assert (gpu.memory_used_mb, gpu.utilization_percent, gpu.temperature_c, gpu.power_w) == (
        0, 0, 40, 60.0)  # fmt: skip


def test_a_gpu_in_mig_mode_is_read_with_each_instance_and_their_processes():
    processes = [
        {"pid": 1000 + slot, "gpu": 0, "mig": slot, "used_mb": 100 * slot} for slot in range(7)
    ]
    snapshot = read(fixture("h100-mig-7x1g.json", processes=processes))
    parent, *instances = snapshot.gpus
    assert parent == GPUStats(H100_PARENT, 0, "NVIDIA H100 80GB HBM3", 81559, 2100, None, 40, 60.0)
    assert [g.uuid for g in instances] == H100_MIGS
    assert instances[3] == GPUStats(H100_MIGS[3], 0, "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9856,
                                    300, None, None, None, parent_uuid=H100_PARENT)  # fmt: skip
    assert all(g.parent_uuid == H100_PARENT and g.index == 0 for g in instances)
    # on its instance, never (again) on the GPU, whose handle NVML also lists them on
    assert snapshot.processes == tuple(
        ProcessUse(1000 + slot, H100_MIGS[slot], 100 * slot) for slot in range(7)
    )
    assert snapshot.errors == ()


def test_mixed_mig_profiles_are_read_with_their_own_names_and_memory():
    snapshot = read(fixture("a100-mig-mixed.json"))
    assert [(g.uuid, g.name, g.memory_total_mb, g.parent_uuid) for g in snapshot.gpus] == [
        (A100_PARENT, "NVIDIA A100-SXM4-80GB", 81920, None),
        (A100_MIGS[0], "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192, A100_PARENT),
        (A100_MIGS[1], "NVIDIA A100-SXM4-80GB MIG 2g.20gb", 19968, A100_PARENT),
        (A100_MIGS[2], "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, A100_PARENT),
    ]


def test_a_mixed_machine_whole_gpu_mig_gpu_and_mig_gpu_without_instances():
    processes = [
        {"pid": 10, "gpu": 0, "used_mb": 5000},
        {"pid": 11, "gpu": 1, "mig": 0, "used_mb": 7000},
        {"pid": 12, "gpu": 1, "mig": 2, "used_mb": 9000},
    ]
    snapshot = read(fixture("mixed-mig.json", processes=processes))
    gpus = by_uuid(snapshot)
    assert [g.uuid for g in snapshot.gpus] == [
        MIXED_GPU_UUIDS[0], MIXED_GPU_UUIDS[1], *MIXED_MIG_UUIDS, MIXED_GPU_UUIDS[2]]  # fmt: skip
    assert gpus[MIXED_GPU_UUIDS[0]].utilization_percent == 0  # MIG off: supported
    assert gpus[MIXED_GPU_UUIDS[1]].utilization_percent is None  # MIG mode: Not Supported
    assert gpus[MIXED_GPU_UUIDS[1]].memory_used_mb == 16000  # both instances
    assert gpus[MIXED_GPU_UUIDS[2]].memory_used_mb == 0
    assert snapshot.processes == (
        ProcessUse(10, MIXED_GPU_UUIDS[0], 5000),
        ProcessUse(11, MIXED_MIG_UUIDS[0], 7000),
        ProcessUse(12, MIXED_MIG_UUIDS[1], 9000),
    )
    assert snapshot.errors == ()


class GraphicsToo(FakeNVML):
    """Lists graphics processes too: pid 4242 with more memory than compute says, 4243 with
    some where compute cannot say, 4244 with less, 5000 as a graphics process only."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        found = super().nvmlDeviceGetComputeRunningProcesses(handle)
        for process in found:
            if process.pid == 4243:
                process.usedGpuMemory = None
        return found

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        super().nvmlDeviceGetGraphicsRunningProcesses(handle)
        if handle.index != 0:
            return []
        return [fake_nvml._Process(pid, mb * fake_nvml.MIB)
                for pid, mb in ((4242, 3100), (4243, 20), (4244, 700), (5000, 64))]  # fmt: skip


def test_compute_and_graphics_processes_give_each_pid_once_with_the_most_memory_said():
    processes = [
        {"pid": 4242, "gpu": 0, "used_mb": 3000},
        {"pid": 4243, "gpu": 0, "used_mb": 1500},
        {"pid": 4244, "gpu": 0, "used_mb": 800},
        {"pid": 77, "gpu": 1, "used_mb": None},
    ]
    snapshot = read(k80s(processes=processes), GraphicsToo)
    assert snapshot.processes == (
        ProcessUse(4242, K80_UUIDS[0], 3100),
        ProcessUse(4243, K80_UUIDS[0], 20),
        ProcessUse(4244, K80_UUIDS[0], 800),
        ProcessUse(5000, K80_UUIDS[0], 64),
        ProcessUse(77, K80_UUIDS[1], None),
    )


class MemoryNotAvailable(FakeNVML):
    def nvmlDeviceGetMemoryInfo(self, handle):
        memory = super().nvmlDeviceGetMemoryInfo(handle)
        memory.used = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE
        return memory


def test_memory_used_that_nvml_cannot_say_is_none():
    snapshot = read(k80s(), MemoryNotAvailable)
    assert [g.memory_used_mb for g in snapshot.gpus] == [None, None]
    assert [g.memory_total_mb for g in snapshot.gpus] == [11441, 11441]


def test_processes_read_again_each_round():
    nvml = FakeNVML(k80s())
    nvml.nvmlInit()
    assert len(telemetry.read(nvml).processes) == 3
    nvml.fixture = nvml._checked(k80s(processes=[]))  # the processes ended
    snapshot = telemetry.read(nvml)
    assert snapshot.processes == () and snapshot.gpus[0].memory_used_mb == 200


# ---- failures ------------------------------------------------------------------------------


def test_nvml_failing_to_count_the_gpus_gives_an_empty_snapshot_with_one_line():
    snapshot = read(k80s(fail={"nvmlDeviceGetCount": {"error": "GpuIsLost"}}))
    assert snapshot == Snapshot((), (), ("NVML could not count the GPUs: GPU is lost",))


GPU1 = f"GPU 1 ({K80_UUIDS[1]})"

#: {call failing on GPU 1: its error line}; GPU 1 (and its process) is left out of the snapshot.
LEFT_OUT = {
    "nvmlDeviceGetHandleByIndex": "GPU 1: GPU is lost (reading its handle)",
    "nvmlDeviceGetUUID": "GPU 1 (PCI 00000000:02:00.0): GPU is lost (reading its UUID)",
    "nvmlDeviceGetName": f"{GPU1}: GPU is lost (reading its name)",
    "nvmlDeviceGetMemoryInfo": f"{GPU1}: GPU is lost (reading its memory)",
    "nvmlDeviceGetMigMode": f"{GPU1}: GPU is lost (reading its MIG mode)",
    "nvmlDeviceGetComputeRunningProcesses": f"{GPU1}: GPU is lost (reading its compute processes)",
    "nvmlDeviceGetGraphicsRunningProcesses": f"{GPU1}: GPU is lost (reading its graphics "
    "processes)",
}
#: {call failing on GPU 1: (the field that is None, the error line)}; GPU 1 stays.
FIELD_NONE = {
    "nvmlDeviceGetUtilizationRates": ("utilization_percent", f"{GPU1}: GPU is lost (reading "
                                      "its utilization)"),
    "nvmlDeviceGetTemperature": ("temperature_c", f"{GPU1}: GPU is lost (reading its "
                                 "temperature)"),
    "nvmlDeviceGetPowerUsage": ("power_w", f"{GPU1}: GPU is lost (reading its power)"),
}  # fmt: skip


def test_every_call_telemetry_makes_can_be_failed_and_is_tested_failing():
    """A new NVML call in telemetry.py fails here until the fake and these tests know it."""
    tree = ast.parse(TELEMETRY_PY.read_text())
    called = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "nvml"
        and node.attr.startswith("nvml")
    }
    assert called - set(fake_nvml.CALLS) == set(fake_nvml.GUARD_CALLS)
    assert called <= set(fake_nvml.FAILABLE_CALLS)
    assert set(fake_nvml.GUARD_CALLS) <= set(LEFT_OUT) | set(FIELD_NONE)


@pytest.mark.parametrize("call", list(LEFT_OUT))
def test_a_gpu_that_cannot_be_read_is_left_out_with_its_processes(call):
    snapshot = read(k80s(fail={call: {"gpu": 1, "error": "GpuIsLost"}}))
    assert [g.uuid for g in snapshot.gpus] == [K80_UUIDS[0]]
    assert [p.pid for p in snapshot.processes] == [4242, 4243]  # GPU 0's, not GPU 1's
    assert snapshot.errors == (LEFT_OUT[call],)


@pytest.mark.parametrize("call", list(FIELD_NONE))
def test_a_reading_that_fails_is_none_and_the_gpu_stays(call):
    field, line = FIELD_NONE[call]
    snapshot = read(k80s(fail={call: {"gpu": 1, "error": "GpuIsLost"}}))
    gpu0, gpu1 = snapshot.gpus
    assert getattr(gpu1, field) is None and getattr(gpu0, field) is not None
    assert gpu1.memory_used_mb == 0 and [p.pid for p in snapshot.processes] == [4242, 4243, 77]
    assert snapshot.errors == (line,)


@pytest.mark.parametrize("call", [*FIELD_NONE, "nvmlDeviceGetGraphicsRunningProcesses"])
def test_not_supported_is_none_without_an_error(call):
    snapshot = read(k80s(fail={call: {"error": "NotSupported"}}))
    assert len(snapshot.gpus) == 2 and len(snapshot.processes) == 3
    assert snapshot.errors == ()
    if call in FIELD_NONE:
        assert all(getattr(g, FIELD_NONE[call][0]) is None for g in snapshot.gpus)


def test_a_uuid_and_pci_bus_id_both_failing_name_the_gpu_by_index():
    fail = {
        "nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"},
        "nvmlDeviceGetPciInfo": {"gpu": 1, "error": "GpuIsLost"},
    }
    assert read(k80s(fail=fail)).errors == ("GPU 1: GPU is lost (reading its UUID)",)


def test_every_gpu_failing_gives_a_line_each_and_never_raises():
    snapshot = read(k80s(fail={"nvmlDeviceGetMemoryInfo": {"error": "Unknown"}}))
    assert snapshot.gpus == () and snapshot.processes == ()
    assert snapshot.errors == (
        f"GPU 0 ({K80_UUIDS[0]}): Unknown Error (reading its memory)",
        f"{GPU1}: Unknown Error (reading its memory)",
    )


MIG_GPU1 = f"GPU 1 ({MIXED_GPU_UUIDS[1]}"
MIXED_PROCESSES = [
    {"pid": 10, "gpu": 0, "used_mb": 5000},
    {"pid": 11, "gpu": 1, "mig": 0, "used_mb": 7000},
    {"pid": 12, "gpu": 1, "mig": 2, "used_mb": 9000},
]


@pytest.mark.parametrize(
    "call, line",
    [
        ("nvmlDeviceGetUUID", f"{MIG_GPU1}, MIG instance 2): GPU is lost (reading its UUID)"),
        ("nvmlDeviceGetMemoryInfo",
         f"{MIG_GPU1}, MIG instance 2 {MIXED_MIG_UUIDS[1]}): GPU is lost (reading its memory)"),
        ("nvmlDeviceGetComputeRunningProcesses",
         f"{MIG_GPU1}, MIG instance 2 {MIXED_MIG_UUIDS[1]}): GPU is lost (reading its compute "
         "processes)"),
        ("nvmlDeviceGetMigDeviceHandleByIndex",
         f"{MIG_GPU1}, MIG instance 2): GPU is lost (reading its handle)"),
    ],
)  # fmt: skip
def test_a_mig_instance_that_cannot_be_read_is_left_out_alone(call, line):
    fail = {call: {"gpu": 1, "mig": 2, "error": "GpuIsLost"}}
    snapshot = read(fixture("mixed-mig.json", processes=MIXED_PROCESSES, fail=fail))
    assert [g.uuid for g in snapshot.gpus] == [
        MIXED_GPU_UUIDS[0], MIXED_GPU_UUIDS[1], MIXED_MIG_UUIDS[0], MIXED_GPU_UUIDS[2]]  # fmt: skip
    assert [p.pid for p in snapshot.processes] == [10, 11]
    assert snapshot.errors == (line,)


def test_mig_instances_that_cannot_be_counted_leave_their_gpu_there_without_them():
    fail = {"nvmlDeviceGetMaxMigDeviceCount": {"gpu": 1, "error": "GpuIsLost"}}
    snapshot = read(fixture("mixed-mig.json", processes=MIXED_PROCESSES, fail=fail))
    assert [g.uuid for g in snapshot.gpus] == [MIXED_GPU_UUIDS[0], MIXED_GPU_UUIDS[1],
                                               MIXED_GPU_UUIDS[2]]  # fmt: skip
    assert [p.pid for p in snapshot.processes] == [10]
    assert snapshot.errors == (f"{MIG_GPU1}): GPU is lost (reading its MIG instances)",)


def test_a_driver_without_mig_reads_every_gpu_whole():
    fail = {"nvmlDeviceGetMigMode": {"error": "FunctionNotFound"}}
    snapshot = read(fixture("h100-mig-7x1g.json", fail=fail))
    assert [g.uuid for g in snapshot.gpus] == [H100_PARENT] and snapshot.errors == ()
