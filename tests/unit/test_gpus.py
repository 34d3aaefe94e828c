"""GPU discovery against an explicit fake NVML (no GPU on these machines)."""

import ast
import json
from pathlib import Path

import pynvml
import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeNVML
from worker_setup import gpus

from .nvml_failures import FAILURES, K80_UUIDS, K80X2, MIG_FAILURES

GPUS_PY = Path(gpus.__file__)


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
    nvml = FakeNVML({"fail": {"nvmlInit": {"error": "LibRmVersionMismatch"}}})
    with pytest.raises(gpus.NVMLUnavailable, match="version mismatch.*reboot the machine"):
        gpus.discover(nvml)
    assert nvml.shutdowns == 0


def test_every_nvml_call_the_worker_makes_can_be_failed_and_is_tested():
    """The fake fails at any call gpus.py makes, and FAILURES tests each: a new NVML call in
    gpus.py fails here until the fake and the tests know it."""
    tree = ast.parse(GPUS_PY.read_text())
    called = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "nvml"
        and node.attr.startswith("nvml")
    }
    assert called == set(fake_nvml.CALLS) == set(FAILURES) | set(MIG_FAILURES)


@pytest.mark.parametrize("call", list(FAILURES))
def test_a_failure_at_each_nvml_call_is_one_line_with_the_fix(call):
    fail, line = FAILURES[call]
    nvml = FakeNVML({**json.loads(K80X2.read_text()), "fail": fail})
    with pytest.raises(gpus.NVMLUnavailable) as failed:
        gpus.discover(nvml)
    message = str(failed.value)
    assert message.startswith(line)
    assert "\n" not in message
    # the code under test met pynvml's own exception type
    assert isinstance(failed.value.__cause__, pynvml.NVMLError)
    assert isinstance(failed.value, gpus.GPUFailed) == (call in fake_nvml.GPU_CALLS)
    if call in fake_nvml.GPU_CALLS:
        assert failed.value.index == 1
    # NVML is shut down again whenever it started (nvmlShutdown itself: tried once)
    assert nvml.shutdowns == (0 if call == "nvmlInit" else 1)


def test_a_failing_shutdown_does_not_hide_the_gpu_that_failed_first():
    fail = {
        "nvmlDeviceGetName": {"gpu": 0, "error": "GpuIsLost"},
        "nvmlShutdown": {"error": "Unknown"},
    }
    nvml = FakeNVML({**json.loads(K80X2.read_text()), "fail": fail})
    with pytest.raises(gpus.GPUFailed, match=f"^GPU 0 \\({K80_UUIDS[0]}\\) failed: GPU is lost"):
        gpus.discover(nvml)
    assert nvml.shutdowns == 1


def test_the_fake_raises_pynvmls_own_exceptions_for_the_gpus_named():
    nvml = FakeNVML(
        {
            **json.loads(K80X2.read_text()),
            "fail": {"nvmlDeviceGetUUID": {"gpu": [1], "error": "NVMLError_GpuIsLost"}},
        }
    )
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0)) == K80_UUIDS[0]
    with pytest.raises(pynvml.NVMLError_GpuIsLost, match="GPU is lost"):
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)


@pytest.mark.parametrize(
    "fixture, advice",
    [
        ({"init_error": "Driver Not Loaded"}, '"fail": {"nvmlInit": {"error": "DriverNotLoaded"}}'),
        ({"fail": {"nvmlDeviceGetSerial": {"error": "GpuIsLost"}}}, "use one of nvmlInit, "),
        ({"fail": {"nvmlInit": {"error": "GPUIsLost"}}}, "e.g. GpuIsLost"),
        ({"fail": {"nvmlInit": {"gpu": 1, "error": "GpuIsLost"}}}, 'leave out "gpu"'),
        ({"fail": {"nvmlDeviceGetName": {"gpu": "1", "error": "GpuIsLost"}}}, "a GPU index"),
        ({"fail": ["nvmlInit"]}, '{"<call>": {"error": "GpuIsLost", "gpu": 1}'),
        ({"gpus": [{"uuid": "GPU-a"}]}, "gpus[0]: give each GPU a uuid, name and memory_mb"),
    ],
)
def test_fixture_mistakes_are_refused_with_how_to_write_them(fixture, advice):
    with pytest.raises(ValueError) as refused:
        FakeNVML(fixture)
    assert advice in str(refused.value)


def test_a_broken_fixture_file_stops_with_its_name(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps({"fail": {"nvmlInit": {"error": "Nope"}}}))
    with pytest.raises(SystemExit, match=f"cannot read the NVML fixture {path}: fail.nvmlInit"):
        FakeNVML.from_file(str(path))


def test_simulated_gpus_are_marked():
    sim = gpus.simulated(2, "abcdef0123456789")
    assert [g.index for g in sim] == [0, 1]
    assert sim[0].uuid[:-1] == sim[1].uuid[:-1]
    assert [g.uuid[-2:] for g in sim] == ["-0", "-1"]
    assert all(g.simulated for g in sim)
