"""GPU discovery against an explicit fake NVML (no GPU on these machines)."""

import pytest

from worker_setup import gpus
from worker_setup.fake_nvml import FakeNVML


def test_discover_reports_uuid_name_memory_and_shuts_nvml_down():
    nvml = FakeNVML(
        {
            "gpus": [  # older pynvml returns bytes, newer str: both are read
                {"uuid": b"GPU-11111111-aaaa", "name": b"Tesla K80", "memory_mb": 12288},
                {"uuid": "GPU-22222222-bbbb", "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81920},
            ]
        }
    )
    found = gpus.discover(nvml)
    assert [(g.index, g.uuid, g.name, g.memory_mb) for g in found] == [
        (0, "GPU-11111111-aaaa", "Tesla K80", 12288),
        (1, "GPU-22222222-bbbb", "NVIDIA H100 80GB HBM3", 81920),
    ]
    assert not any(g.simulated for g in found)
    assert nvml.shutdowns == 1


def test_nvml_that_fails_to_initialise_is_reported():
    nvml = FakeNVML({"init_error": "Driver/library version mismatch"})
    with pytest.raises(gpus.NVMLUnavailable, match="version mismatch"):
        gpus.discover(nvml)


def test_simulated_gpus_are_marked():
    sim = gpus.simulated(2, "abcdef0123456789")
    assert [g.index for g in sim] == [0, 1]
    assert sim[0].uuid[:-1] == sim[1].uuid[:-1]
    assert [g.uuid[-2:] for g in sim] == ["-0", "-1"]
    assert all(g.simulated for g in sim)
