"""GPU discovery against an explicit fake NVML (no GPU on these machines)."""

import pytest

from worker_setup import gpus


class FakeMemory:
    def __init__(self, total):
        self.total = total


class FakeNVML:
    """The handful of pynvml calls discover() makes, over fixture GPUs."""

    def __init__(self, devices, init_error=None):
        self.devices = devices
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return FakeMemory(handle["memory"])


def test_discover_reports_uuid_name_memory_and_shuts_nvml_down():
    nvml = FakeNVML(
        [
            {"uuid": b"GPU-11111111-aaaa", "name": b"Tesla K80", "memory": 12 * 1024**3},
            {"uuid": "GPU-22222222-bbbb", "name": "NVIDIA H100 80GB HBM3", "memory": 80 * 1024**3},
        ]
    )
    found = gpus.discover(nvml)
    assert [(g.index, g.uuid, g.name, g.memory_mb) for g in found] == [
        (0, "GPU-11111111-aaaa", "Tesla K80", 12288),
        (1, "GPU-22222222-bbbb", "NVIDIA H100 80GB HBM3", 81920),
    ]
    assert not any(g.simulated for g in found)
    assert nvml.shutdowns == 1


def test_nvml_that_fails_to_initialise_is_reported():
    nvml = FakeNVML([], init_error=RuntimeError("Driver/library version mismatch"))
    with pytest.raises(gpus.NVMLUnavailable, match="version mismatch"):
        gpus.discover(nvml)


def test_simulated_gpus_are_marked():
    sim = gpus.simulated(2, "abcdef0123456789")
    assert [g.index for g in sim] == [0, 1]
    assert sim[0].uuid[:-1] == sim[1].uuid[:-1]
    assert [g.uuid[-2:] for g in sim] == ["-0", "-1"]
    assert all(g.simulated for g in sim)
