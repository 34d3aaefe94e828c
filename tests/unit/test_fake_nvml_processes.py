"""The fake NVML's GPU processes and readings: processes listed in the fixture, real processes
found in /proc by their environment (a fake /proc tree here, and once the real one), the fixture
file followed while a guard runs, and the checks of the new fixture keys."""

from __future__ import annotations

import json
import os
import subprocess

import pynvml
import pytest

from tests.fakes.nvml import MIB, FakeNVML, ProcScan
from worker_setup import telemetry

from .nvml_failures import FIXTURES, MIXED_GPU_UUIDS, MIXED_MIG, MIXED_MIG_UUIDS

GUARD = FIXTURES / "guard-2gpus.json"
A10 = ["GPU-9a3e0000-0000-4000-8000-00000000a101", "GPU-9a3e0000-0000-4000-8000-00000000a102"]
ELSEWHERE = "GPU-9a3e0000-0000-4000-8000-00000000b201"  # a GPU of another (simulated) machine


class Proc:
    """A fake /proc: ``add(pid, env)`` writes /proc/PID/environ and /proc/PID/stat."""

    def __init__(self, root):
        self.root = root
        root.mkdir()
        (root / "self").mkdir()  # not a pid: never read

    def add(self, pid: int, env: dict | None = None, start: int = 1000, state: str = "S",
            comm: str = "python") -> None:  # fmt: skip
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        self.environ(pid, env or {})
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        # utime stime cutime cstime priority nice threads itrealvalue starttime ...
        fields = [state, "1", str(pid), str(pid), "0", "-1", "4194560", *["0"] * 8, "20", "0",
                  "1", "0", str(start), "1000000", "100"]  # fmt: skip
        (directory / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")

    def environ(self, pid: int, env: dict) -> None:
        text = "".join(f"{key}={value}\0" for key, value in {"HOME": "/root", **env}.items())
        (self.root / str(pid) / "environ").write_text(text)

    def remove(self, pid: int) -> None:
        for name in ("environ", "stat"):
            (self.root / str(pid) / name).unlink(missing_ok=True)
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path):
    return Proc(tmp_path / "proc")


def guard_nvml(proc: Proc, **extra) -> FakeNVML:
    nvml = FakeNVML({**json.loads(GUARD.read_text()), **extra}, proc_root=str(proc.root))
    nvml.nvmlInit()
    return nvml


def uses(nvml) -> list[tuple[int, str, int | None]]:
    """A round of telemetry.read: (pid, GPU, MiB) of each process."""
    snapshot = telemetry.read(nvml)
    assert snapshot.errors == ()
    return [(p.pid, p.gpu_uuid, p.used_mb) for p in snapshot.processes]


# ---- processes found in /proc ---------------------------------------------------------------


def test_a_process_names_its_gpu_with_fake_nvml_gpu_or_nvidia_visible_devices(proc):
    proc.add(100, {"FAKE_NVML_GPU_MB": "1200", "FAKE_NVML_GPU": A10[1],
                   "NVIDIA_VISIBLE_DEVICES": A10[0]})  # fmt: skip
    # the first visible GPU that is this machine's
    proc.add(101, {"FAKE_NVML_GPU_MB": "300", "NVIDIA_VISIBLE_DEVICES": f"{ELSEWHERE}, {A10[0]}"})
    proc.add(102, {"NVIDIA_VISIBLE_DEVICES": A10[0]})  # uses no GPU memory: not a GPU process
    proc.add(103, {"FAKE_NVML_GPU_MB": "0", "NVIDIA_VISIBLE_DEVICES": A10[1]})
    assert uses(guard_nvml(proc)) == [(101, A10[0], 300), (100, A10[1], 1200), (103, A10[1], 0)]


def test_processes_of_another_machines_gpus_are_left_out(proc):
    proc.add(200, {"FAKE_NVML_GPU_MB": "500", "FAKE_NVML_GPU": ELSEWHERE})
    # FAKE_NVML_GPU names the GPU: NVIDIA_VISIBLE_DEVICES is not looked at then
    proc.add(201, {"FAKE_NVML_GPU_MB": "500", "FAKE_NVML_GPU": ELSEWHERE,
                   "NVIDIA_VISIBLE_DEVICES": A10[0]})  # fmt: skip
    proc.add(202, {"FAKE_NVML_GPU_MB": "500", "NVIDIA_VISIBLE_DEVICES": f"{ELSEWHERE},all"})
    proc.add(203, {"FAKE_NVML_GPU_MB": "500"})
    proc.add(204, {"FAKE_NVML_GPU_MB": "lots", "FAKE_NVML_GPU": A10[0]})  # not a number
    nvml = guard_nvml(proc)
    assert uses(nvml) == []
    assert [g.memory_used_mb for g in telemetry.read(nvml).gpus] == [0, 0]


def test_memory_used_counts_the_processes_found_and_the_fixtures(proc):
    proc.add(300, {"FAKE_NVML_GPU_MB": "7000", "FAKE_NVML_GPU": A10[0]})
    proc.add(301, {"FAKE_NVML_GPU_MB": "1000", "FAKE_NVML_GPU": A10[0]})
    fixture = json.loads(GUARD.read_text())
    fixture["gpus"][0]["memory_used_mb"] = 500
    fixture["processes"] = [{"pid": 5, "gpu": 0, "used_mb": 250}]
    nvml = FakeNVML(fixture, proc_root=str(proc.root))
    assert uses(nvml) == [(5, A10[0], 250), (300, A10[0], 7000), (301, A10[0], 1000)]
    memory = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    assert (memory.total, memory.used, memory.free) == (
        24576 * MIB, 8750 * MIB, (24576 - 8750) * MIB)  # fmt: skip


def test_a_mig_instance_is_found_by_its_uuid_and_its_gpu_counts_it(proc):
    proc.add(400, {"FAKE_NVML_GPU_MB": "6000", "NVIDIA_VISIBLE_DEVICES": MIXED_MIG_UUIDS[1]})
    proc.add(401, {"FAKE_NVML_GPU_MB": "100", "FAKE_NVML_GPU": MIXED_GPU_UUIDS[0]})
    nvml = FakeNVML(json.loads(MIXED_MIG.read_text()), proc_root=str(proc.root))
    assert uses(nvml) == [(401, MIXED_GPU_UUIDS[0], 100), (400, MIXED_MIG_UUIDS[1], 6000)]
    gpu1 = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMemoryInfo(gpu1).used == 6000 * MIB
    # NVML lists an instance's processes on its GPU's handle too
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu1)] == [400]
    mig0 = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(mig0) == []


def test_processes_that_end_or_vanish_while_read_are_skipped(proc):
    nvml = guard_nvml(proc)
    proc.add(500, {"FAKE_NVML_GPU_MB": "800", "FAKE_NVML_GPU": A10[0]})
    proc.add(501, {"FAKE_NVML_GPU_MB": "900", "FAKE_NVML_GPU": A10[0]})
    assert uses(nvml) == [(500, A10[0], 800), (501, A10[0], 900)]
    proc.remove(500)
    (proc.root / "501" / "stat").unlink()  # going: its directory is still listed
    (proc.root / "502").mkdir()  # coming: nothing to read yet
    proc.add(503, {"FAKE_NVML_GPU_MB": "20", "FAKE_NVML_GPU": A10[0]})
    (proc.root / "503" / "environ").unlink()  # its environment not readable yet
    assert uses(nvml) == []
    proc.add(501, {"FAKE_NVML_GPU_MB": "900", "FAKE_NVML_GPU": A10[0]})
    proc.add(502, {"FAKE_NVML_GPU_MB": "10", "FAKE_NVML_GPU": A10[0]})
    proc.environ(503, {"FAKE_NVML_GPU_MB": "20", "FAKE_NVML_GPU": A10[0]})
    assert uses(nvml) == [(501, A10[0], 900), (502, A10[0], 10), (503, A10[0], 20)]


def test_a_process_whose_environment_may_not_be_read_is_not_tried_again(proc, monkeypatch):
    proc.add(510, {"FAKE_NVML_GPU_MB": "20", "FAKE_NVML_GPU": A10[0]})
    proc.add(511, {"FAKE_NVML_GPU_MB": "30", "FAKE_NVML_GPU": A10[0]})
    tried = []
    original = type(proc.root).read_bytes

    def read_bytes(path):
        if path.parent.name == "510" and path.name == "environ":
            tried.append(path)
            raise PermissionError(13, "Permission denied", str(path))
        return original(path)

    monkeypatch.setattr(type(proc.root), "read_bytes", read_bytes)
    nvml = guard_nvml(proc)
    assert uses(nvml) == [(511, A10[0], 30)]
    assert uses(nvml) == [(511, A10[0], 30)]
    assert len(tried) == 1


def test_a_process_both_listed_and_found_is_reported_once(proc):
    proc.add(520, {"FAKE_NVML_GPU_MB": "20", "FAKE_NVML_GPU": A10[0]})
    nvml = guard_nvml(proc, processes=[{"pid": 520, "gpu": 0, "used_mb": 400}])
    assert uses(nvml) == [(520, A10[0], 400)]  # the fixture's
    assert telemetry.read(nvml).gpus[0].memory_used_mb == 400


def test_a_zombie_uses_no_gpu(proc):
    proc.add(550, {"FAKE_NVML_GPU_MB": "800", "FAKE_NVML_GPU": A10[0]})
    nvml = guard_nvml(proc)
    assert uses(nvml) == [(550, A10[0], 800)]
    proc.add(550, {"FAKE_NVML_GPU_MB": "800", "FAKE_NVML_GPU": A10[0]}, state="Z")
    assert uses(nvml) == []


def test_a_name_with_spaces_and_parentheses_does_not_hide_the_start_time(proc):
    env = {"FAKE_NVML_GPU_MB": "64", "FAKE_NVML_GPU": A10[0]}
    proc.add(560, env, comm="a) b (c")
    nvml = guard_nvml(proc)
    assert uses(nvml) == [(560, A10[0], 64)]
    proc.add(560, {**env, "FAKE_NVML_GPU_MB": "65"}, start=2000, comm="a) b (c")
    assert uses(nvml) == [(560, A10[0], 65)]


def test_each_environment_is_read_once_until_its_pid_is_a_new_process(proc):
    proc.add(600, {"FAKE_NVML_GPU_MB": "800", "FAKE_NVML_GPU": A10[0]}, start=5000)
    proc.add(601, {"PATH": "/usr/bin"}, start=5000)
    nvml = guard_nvml(proc)
    assert uses(nvml) == [(600, A10[0], 800)]
    # changed environments are not read again: the same processes
    proc.environ(600, {"FAKE_NVML_GPU_MB": "2000", "FAKE_NVML_GPU": A10[1]})
    proc.environ(601, {"FAKE_NVML_GPU_MB": "50", "FAKE_NVML_GPU": A10[1]})
    assert uses(nvml) == [(600, A10[0], 800)]
    # pid 600 is a new process (another start time): read again
    proc.add(600, {"FAKE_NVML_GPU_MB": "2000", "FAKE_NVML_GPU": A10[1]}, start=9000)
    assert uses(nvml) == [(600, A10[1], 2000)]
    # pid 601 is only read again once it was seen gone
    proc.remove(601)
    assert uses(nvml) == [(600, A10[1], 2000)]
    proc.add(601, {"FAKE_NVML_GPU_MB": "50", "FAKE_NVML_GPU": A10[1]}, start=9100)
    assert uses(nvml) == [(600, A10[1], 2000), (601, A10[1], 50)]


def test_the_scan_reads_each_environment_once(proc, monkeypatch):
    for pid in range(700, 710):
        proc.add(pid, {"FAKE_NVML_GPU_MB": "1", "FAKE_NVML_GPU": A10[0]} if pid % 2 else {})
    scan = ProcScan(str(proc.root))
    read = []
    original = type(proc.root).read_bytes

    def read_bytes(path):
        read.append(path.name)
        return original(path)

    monkeypatch.setattr(type(proc.root), "read_bytes", read_bytes)
    assert [pid for pid, _, _ in scan.scan()] == [701, 703, 705, 707, 709]
    assert read.count("environ") == 10
    read.clear()
    for _ in range(3):
        assert len(scan.scan()) == 5
    assert read == ["stat"] * 15  # only the GPU processes' start times


def test_proc_is_read_once_a_round(proc):
    nvml = guard_nvml(proc)
    gpu0 = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(gpu0) == []
    proc.add(800, {"FAKE_NVML_GPU_MB": "5", "FAKE_NVML_GPU": A10[0]})
    assert nvml.nvmlDeviceGetComputeRunningProcesses(gpu0) == []  # the same round
    nvml.nvmlDeviceGetCount()  # the next round
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu0)] == [800]


def test_scan_processes_false_reads_only_the_fixtures_processes(proc):
    proc.add(900, {"FAKE_NVML_GPU_MB": "5", "FAKE_NVML_GPU": A10[0]})
    processes = [{"pid": 901, "gpu": 1, "used_mb": None}]
    nvml = guard_nvml(proc, scan_processes=False, processes=processes)
    assert uses(nvml) == [(901, A10[1], None)]


def test_a_missing_proc_is_no_processes(tmp_path):
    nvml = FakeNVML(json.loads(GUARD.read_text()), proc_root=str(tmp_path / "nowhere"))
    assert uses(nvml) == []


def test_a_real_process_is_found_by_its_real_pid_until_it_ends():
    env = {**os.environ, "FAKE_NVML_GPU_MB": "777", "FAKE_NVML_GPU": A10[1]}
    nvml = FakeNVML(json.loads(GUARD.read_text()))  # the real /proc
    sleeper = subprocess.Popen(["sleep", "30"], env=env)
    try:
        assert (sleeper.pid, A10[1], 777) in uses(nvml)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.pid not in [pid for pid, _, _ in uses(nvml)]


# ---- the readings -------------------------------------------------------------------------


def test_the_readings_of_a_gpu_and_what_mig_does_not_support():
    fixture = json.loads(MIXED_MIG.read_text())
    fixture["gpus"][0].update(utilization_percent=55, temperature_c=66, power_w=212.25)
    nvml = FakeNVML({**fixture, "scan_processes": False})
    gpu0, gpu1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    utilization = nvml.nvmlDeviceGetUtilizationRates(gpu0)
    assert (utilization.gpu, utilization.memory) == (55, 55)
    assert nvml.nvmlDeviceGetTemperature(gpu0, pynvml.NVML_TEMPERATURE_GPU) == 66
    assert nvml.nvmlDeviceGetPowerUsage(gpu0) == 212250  # milliwatts
    assert nvml.nvmlDeviceGetGraphicsRunningProcesses(gpu0) == []
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetTemperature(gpu0, pynvml.NVML_TEMPERATURE_GPU + 5)
    # a GPU in MIG mode has no utilization; its instances neither, nor temperature or power
    assert nvml.nvmlDeviceGetTemperature(gpu1, pynvml.NVML_TEMPERATURE_GPU) == 40
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(gpu1)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)
    for call, args in [
        (nvml.nvmlDeviceGetUtilizationRates, ()),
        (nvml.nvmlDeviceGetTemperature, (pynvml.NVML_TEMPERATURE_GPU,)),
        (nvml.nvmlDeviceGetPowerUsage, ()),
    ]:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(mig, *args)


def test_the_new_calls_fail_for_the_gpus_and_instances_named():
    fail = {"nvmlDeviceGetComputeRunningProcesses": {"gpu": 1, "mig": 2, "error": "GpuIsLost"},
            "nvmlDeviceGetPowerUsage": {"gpu": [0], "error": "Unknown"}}  # fmt: skip
    nvml = FakeNVML({**json.loads(MIXED_MIG.read_text()), "fail": fail, "scan_processes": False})
    gpu0, gpu1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(gpu1) == []
    assert nvml.nvmlDeviceGetComputeRunningProcesses(
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 0)) == []  # fmt: skip
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu1, 2))
    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetPowerUsage(gpu0)
    assert nvml.nvmlDeviceGetPowerUsage(gpu1) == 60000


def test_memory_used_is_worked_out_only_when_read(proc):
    """GPU discovery reads only the total: it never looks for processes."""
    nvml = guard_nvml(proc)
    nvml.procs.scan = None  # would fail if called
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).total == 24576 * MIB


# ---- the fixture file, followed -------------------------------------------------------------


def write(path, fixture: dict, mtime: int) -> None:
    path.write_text(json.dumps(fixture))
    os.utime(path, ns=(mtime, mtime))  # as a later write would: the clock may be coarse


def test_a_changed_fixture_file_is_read_again_at_the_next_round(tmp_path, proc):
    path = tmp_path / "nvml.json"
    fixture = json.loads(GUARD.read_text())
    write(path, fixture, 1_000_000_000)
    nvml = FakeNVML.from_file(str(path), proc_root=str(proc.root))
    nvml.nvmlInit()
    assert [g.uuid for g in telemetry.read(nvml).gpus] == A10
    # GPU 1 falls off the bus while the guard runs
    write(path, {**fixture, "fail": {"nvmlDeviceGetUUID": {"gpu": 1, "error": "GpuIsLost"}}},
          2_000_000_000)  # fmt: skip
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1)) == A10[1]  # not yet
    snapshot = telemetry.read(nvml)
    assert [g.uuid for g in snapshot.gpus] == A10[:1]
    assert snapshot.errors == ("GPU 1 (PCI 00000000:65:00.0): GPU is lost (reading its UUID)",)
    # an unreadable change keeps the fixture read before
    write(path, {**fixture, "gpus": [{"uuid": "GPU-x"}]}, 3_000_000_000)
    assert [g.uuid for g in telemetry.read(nvml).gpus] == A10[:1]
    assert nvml.reload_error.startswith(f"cannot read the changed NVML fixture {path}: gpus[0]")
    assert nvml.reload_error.endswith("still using the one read before")
    # and it recovers
    write(path, fixture, 4_000_000_000)
    assert [g.uuid for g in telemetry.read(nvml).gpus] == A10
    assert nvml.reload_error is None
    # unchanged, it is not read again
    read_before = nvml.fixture
    telemetry.read(nvml)
    assert nvml.fixture is read_before


def test_a_fixture_file_that_goes_away_keeps_the_last_one(tmp_path):
    path = tmp_path / "nvml.json"
    write(path, json.loads(GUARD.read_text()), 1_000_000_000)
    nvml = FakeNVML.from_file(str(path))
    path.unlink()
    assert nvml.nvmlDeviceGetCount() == 2
    assert "No such file" in nvml.reload_error


def test_a_fixture_given_as_a_dict_is_never_read_again(tmp_path):
    nvml = FakeNVML(json.loads(GUARD.read_text()), source=str(GUARD))
    nvml.gpus.pop()
    assert nvml.nvmlDeviceGetCount() == 1 and nvml.reload_error is None


# ---- checks of the new keys -----------------------------------------------------------------


def a10(**keys) -> dict:
    return {"gpus": [{"uuid": A10[0], "name": "NVIDIA A10", "memory_mb": 24576, **keys}]}


MIG = json.loads(MIXED_MIG.read_text())


@pytest.mark.parametrize(
    "fixture, advice",
    [
        (a10(utilization_percent=101), "gpus[0].utilization_percent is 101; write a whole "
         "number of percent from 0 to 100"),
        (a10(utilization_percent="35"), "utilization_percent is '35'; write a whole number"),
        (a10(temperature_c=40.5), "gpus[0].temperature_c is 40.5; write a whole number of "
         "degrees Celsius"),
        (a10(power_w=-1), "gpus[0].power_w is -1; write watts, 0 or more"),
        (a10(power_w=True), "gpus[0].power_w is True"),
        (a10(memory_used_mb=30000), "gpus[0].memory_used_mb is 30000; write whole MiB in use "
         "besides its processes', 0 up to its memory_mb"),
        ({**MIG, "gpus": [MIG["gpus"][0], {**MIG["gpus"][1], "mig_instances": [
            {**MIG["gpus"][1]["mig_instances"][0], "memory_used_mb": -5}]}]},
         "gpus[1].mig_instances[0].memory_used_mb is -5"),
        ({**a10(), "scan_processes": "no"}, "scan_processes is 'no'; write true"),
        ({**a10(), "processes": {"pid": 1}}, 'processes: write it as a list, e.g. "processes": ['),
        ({**a10(), "processes": [{"pid": 1, "gpu": 0}]}, "processes[0]: give a pid, gpu (its "
         "index), used_mb (MiB, or null: NVML cannot say)"),
        ({**a10(), "processes": [{"pid": 1, "gpu": 0, "used_mb": 1, "mb": 1}]},
         "processes[0]: give a pid"),
        ({**a10(), "processes": [{"pid": 0, "gpu": 0, "used_mb": 1}]},
         "processes[0].pid is 0; write a process id"),
        ({**a10(), "processes": [{"pid": 1, "gpu": 1, "used_mb": 1}]},
         "processes[0].gpu is 1; write the index of one of the 1 GPUs (0 to 0)"),
        ({**a10(), "processes": [{"pid": 1, "gpu": 0, "used_mb": "300"}]},
         "processes[0].used_mb is '300'; write whole MiB, e.g. 300, or null"),
        ({**MIG, "processes": [{"pid": 1, "gpu": 1, "used_mb": 1}]},
         'processes[0]: GPU 1 is in MIG mode, so its processes run on an instance: add "mig"'),
        ({**MIG, "processes": [{"pid": 1, "gpu": 1, "mig": 1, "used_mb": 1}]},
         "processes[0].mig is 1; write the slot of one of GPU 1's MIG instances (0, 2)"),
        ({**MIG, "processes": [{"pid": 1, "gpu": 0, "mig": 0, "used_mb": 1}]},
         "processes[0].mig is 0; write the slot of one of GPU 0's MIG instances (it has none)"),
        ({**a10(), "processes": [{"pid": 1, "gpu": 0, "used_mb": 1}] * 2},
         "processes[1]: pid 1 is listed twice on the same GPU"),
        ({"fail": {"nvmlDeviceGetTemperature": {"gpu": "0", "error": "GpuIsLost"}}},
         "fail.nvmlDeviceGetTemperature.gpu: a GPU index"),
        ({"fail": {"nvmlDeviceGetFanSpeed": {"error": "GpuIsLost"}}},
         "use one of nvmlInit, nvmlDeviceGetCount"),
    ],
)  # fmt: skip
def test_mistakes_in_the_new_keys_are_refused_with_how_to_write_them(fixture, advice):
    with pytest.raises(ValueError) as refused:
        FakeNVML(fixture)
    assert advice in str(refused.value)


def test_the_readings_accepted_as_written():
    fixture = a10(utilization_percent=100, temperature_c=0, power_w=0, memory_used_mb=24576)
    processes = [{"pid": 1, "gpu": 0, "used_mb": 100}]  # more than the GPU has: free is 0
    nvml = FakeNVML({**fixture, "processes": processes, "scan_processes": False})
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerUsage(handle) == 0
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (memory.used, memory.free) == (24676 * MIB, 0)


def test_the_guard_fixture_is_two_a10s():
    nvml = FakeNVML.from_file(str(GUARD))
    assert [(g["uuid"], g["name"], g["memory_mb"]) for g in nvml.gpus] == [
        (uuid, "NVIDIA A10", 24576) for uuid in A10]  # fmt: skip
    assert "guard" in json.loads(GUARD.read_text())["description"]
