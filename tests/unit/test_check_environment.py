"""images/singleuser/check-environment: what it concludes from what it ran.

The checks themselves run in a real image (`make bench-images`) and in the stand-in
(tests/integration/test_production.py); here, the decisions no machine of this kind can
exercise: the device check wants a GPU, and what a stand-in or a failing framework reports."""

import importlib.util
import subprocess
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "images/singleuser/check-environment")
check = importlib.util.module_from_spec(
    importlib.util.spec_from_loader(
        "check_environment", SourceFileLoader("check_environment", SCRIPT)
    )
)
check.__spec__.loader.exec_module(check)

UUID = "GPU-2f4c8a10-1111-2222-3333-444455556666"


def answered(stdout, returncode=0, stderr=""):
    return subprocess.CompletedProcess([], returncode, stdout=stdout, stderr=stderr)


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(check, "gpu_visible", lambda: True)
    monkeypatch.setenv("GPU_UUID", UUID)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", UUID)


@pytest.mark.parametrize(
    "seen, status",
    [
        (f"1 {UUID}\n", "ok"),
        (f"2 {UUID}\n", "FAILED"),  # the container sees more than its slice's GPU
        ("1 GPU-99999999-0000-0000-0000-000000000000\n", "FAILED"),  # another GPU
        ("0\n", "FAILED"),  # the framework sees none (no CUDA in the image, a wrong wheel)
    ],
)
def test_on_a_gpu_the_framework_must_see_exactly_the_gpu_the_server_holds(
    on_a_gpu, monkeypatch, seen, status
):
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: answered(seen))
    result = check.check_devices("torch")
    assert result.status == status, result.detail


# PyTorch's device properties: its uuid prints without NVML's "GPU-" prefix
FAKE_TORCH = """
import uuid
class cuda:
    device_count = staticmethod(lambda: 1)
    get_device_properties = staticmethod(
        lambda i: type("Props", (), {"uuid": uuid.UUID("2f4c8a10-1111-2222-3333-444455556666")})
    )
"""


def test_what_pytorch_reports_is_compared_as_nvml_writes_it(on_a_gpu, tmp_path, monkeypatch):
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    result = check.check_devices("torch")
    assert result.status == "ok", result.detail
    assert result.detail.startswith(f"1 device(s), {UUID}")


def test_without_a_gpu_the_device_check_says_it_was_skipped(monkeypatch):
    monkeypatch.setattr(check, "gpu_visible", lambda: False)
    result = check.check_devices("tensorflow")
    assert result.status == "skipped" and "GPU machine" in result.detail


@pytest.mark.parametrize(
    "visible, devices, seen",
    [
        ("void", ["/dev/nvidia0"], False),  # the spawner's CPU-only server
        (UUID, [], False),  # no device in the container (no NVIDIA runtime)
        (UUID, ["/dev/nvidia0"], True),
        ("", ["/dev/nvidia0"], True),  # docker run --gpus sets no variable
    ],
)
def test_a_gpu_is_visible_with_a_device_unless_the_runtime_was_told_none(
    monkeypatch, visible, devices, seen
):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(check.glob, "glob", lambda pattern: devices)
    assert check.gpu_visible() is seen


def test_without_a_uuid_to_compare_one_device_is_enough(monkeypatch):
    monkeypatch.setattr(check, "gpu_visible", lambda: True)
    monkeypatch.delenv("GPU_UUID", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    one = answered(f"1 {UUID}\n")
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: one)
    assert check.check_devices("torch").status == "ok"
    two = answered(f"2 {UUID}\n")
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: two)
    assert check.check_devices("torch").status == "FAILED"


def test_a_stand_in_skips_the_framework_checks_and_runs_the_others(monkeypatch):
    monkeypatch.setenv("GPUHUB_ENVIRONMENT", "pytorch-standin")
    ran = []
    for name in ("server_start", "kernel", "gpu_info", "tensorboard"):
        monkeypatch.setattr(
            check,
            f"check_{name}",
            lambda *a, name=name: ran.append(name) or check.Result(name, "ok", ""),
        )
    results = {r.name: r.status for r in check.run_checks()}
    assert ran == ["server_start", "kernel", "gpu_info", "tensorboard"]
    assert results["import"] == results["train"] == results["caps"] == "skipped"
    assert "devices" not in results


def test_a_framework_that_fails_to_import_fails_the_check_with_its_error(monkeypatch):
    error = answered("", 1, "Traceback ...\nImportError: libcudnn.so.9: cannot open shared object")
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: error)
    result = check.check_import("torch")
    assert result.status == "FAILED" and "libcudnn.so.9" in result.detail


def test_a_loss_that_does_not_go_down_fails_training(monkeypatch):
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: answered("0.5 0.9\n"))
    assert check.check_train("torch").status == "FAILED"
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: answered("0.9 0.2\n"))
    assert check.check_train("torch").status == "ok"


def test_the_server_check_fails_when_a_module_that_only_slows_every_start_is_imported(
    tmp_path, monkeypatch
):
    """Run for real in a fresh process: a stand-in rfc3987_syntax imported by a stand-in server
    module fails the check with the fix; without it, the check passes and times the imports."""
    (tmp_path / "server_mod.py").write_text("import rfc3987_syntax\n")
    (tmp_path / "rfc3987_syntax.py").write_text("")
    (tmp_path / "quick_mod.py").write_text("import json\n")
    real = check.python
    here = {"PYTHONPATH": str(tmp_path)}
    monkeypatch.setattr(check, "python", lambda code, env=None, timeout=600: real(code, here))
    monkeypatch.setattr(check, "SERVER_MODULES", ("quick_mod", "server_mod"))
    slow = check.check_server_start(repeats=1)
    assert slow.status == "FAILED"
    assert "rfc3987_syntax is imported" in slow.detail
    assert "pip uninstall -y rfc3987-syntax" in slow.detail
    monkeypatch.setattr(check, "SERVER_MODULES", ("quick_mod",))
    quick = check.check_server_start(repeats=1)
    assert quick.status == "ok", quick.detail
    assert "the server's modules import in" in quick.detail
