"""The cooperative GPU memory caps (images/singleuser/gpu_caps.py and gpu_caps.pth).

They are installed here as in the single-user image: both files in the site-packages of a venv,
so the .pth line runs at every start of its python. TensorFlow and PyTorch are fakes on
PYTHONPATH, narrow stand-ins for the few calls the caps make, which record them; the fake
``torch.cuda`` runs what is queued with ``_lazy_call`` when ``torch.cuda.init()`` is called, and
lets its exceptions through, as PyTorch's CUDA initialisation does.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .start_command import start_command

REPO = Path(__file__).resolve().parents[2]
SINGLEUSER = REPO / "images" / "singleuser"

spec = importlib.util.spec_from_file_location("gpu_caps", SINGLEUSER / "gpu_caps.py")
gpu_caps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_caps)

FAKE_TORCH_CUDA = """
import os
calls = []
_queued = []
_initialized = False
BROKEN = os.environ.get("FAKE_BROKEN", "")

def _lazy_call(callable, **kwargs):
    if BROKEN == "lazy_call":
        raise RuntimeError("lazy_call changed")
    if _initialized:
        callable()
    else:
        _queued.append(callable)

def init():
    global _initialized
    if not _initialized:
        _initialized = True
        for queued in _queued:
            queued()  # PyTorch raises what a queued call raises (DeferredCudaCallError)

def device_count():
    return int(os.environ.get("FAKE_GPUS", "1"))

class _Properties:
    total_memory = int(os.environ.get("FAKE_TOTAL_MB", "81559")) << 20

def get_device_properties(device):
    return _Properties()

def set_per_process_memory_fraction(fraction, device=None):
    if BROKEN == "fraction":
        raise RuntimeError("Invalid device")
    calls.append([fraction, device])
"""

FAKE_TF_CONFIG = """
import os
calls = []
BROKEN = os.environ.get("FAKE_BROKEN", "")

class LogicalDeviceConfiguration:
    def __init__(self, memory_limit=None):
        self.memory_limit = memory_limit

def list_physical_devices(device_type=None):
    count = int(os.environ.get("FAKE_GPUS", "1"))
    return [f"/physical_device:GPU:{i}" for i in range(count)] if device_type == "GPU" else []

def set_logical_device_configuration(device, logical_devices):
    if BROKEN == "tensorflow":
        raise RuntimeError("Virtual devices cannot be modified after being initialized")
    calls.append([device, [d.memory_limit for d in logical_devices]])
"""

#: run in the venv's python: import the framework (twice, and reload it), start CUDA, report
PROBE = """
import importlib, json, sys
name = sys.argv[1]
framework = importlib.import_module(name)
calls = framework.config.calls if name == "tensorflow" else framework.cuda.calls
at_import = list(calls)
loaders = {type(framework.__loader__).__name__, type(framework.__spec__.loader).__name__}
importlib.import_module(name)
importlib.reload(framework)
calls = framework.config.calls if name == "tensorflow" else framework.cuda.calls
if name == "torch":
    framework.cuda.init()
    framework.cuda.init()
caps = sys.modules.get("gpu_caps")
print(json.dumps({
    "at_import": at_import,
    "calls": calls,
    "loader": " ".join(sorted(loaders)),
    "finders": [type(f).__name__ for f in sys.meta_path],
    "applied": caps.applied if caps else None,
}))
"""


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """A venv's python with gpu_caps.py and gpu_caps.pth in its site-packages, as in the
    image."""
    root = tmp_path_factory.mktemp("caps-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for name in ("gpu_caps.py", "gpu_caps.pth"):
        shutil.copy(SINGLEUSER / name, purelib)
    return python


@pytest.fixture
def fakes(tmp_path) -> Path:
    """A folder with the fake torch and tensorflow packages."""
    root = tmp_path / "fakes"
    for package, module, source in (("torch", "cuda", FAKE_TORCH_CUDA),
                                    ("tensorflow", "config", FAKE_TF_CONFIG)):  # fmt: skip
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"from . import {module}\n")
        (root / package / f"{module}.py").write_text(textwrap.dedent(source))
    return root


def run(python: Path, fakes: Path, *args: str, **environ: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(fakes), "HOME": str(fakes),
           "PYTHONNOUSERSITE": "1", "LC_ALL": "C.UTF-8", **environ}  # fmt: skip
    return subprocess.run(
        [str(python), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def probe(python, fakes, framework, **environ) -> dict:
    result = run(python, fakes, "-c", PROBE, framework, **environ)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def floor4(value: float) -> float:
    return math.floor(value * 10000) / 10000


BUDGET = {"GPU_MEMORY_LIMIT_MB": "27186", "GPU_MEMORY_FRACTION": "0.333"}  # 80 GB / 3


def test_torch_gets_its_fraction_once_when_cuda_starts(python, fakes):
    seen = probe(python, fakes, "torch", **BUDGET)
    assert seen["at_import"] == [], "importing torch must not start CUDA"
    assert seen["calls"] == [[floor4(0.333 * (27186 - 512) / 27186), 0]]
    assert seen["calls"][0][0] == 0.3267
    assert seen["finders"][0] == "CapFinder"
    assert seen["loader"] == "SourceFileLoader", "the module keeps its own loader"
    assert seen["applied"]["torch"] == "fraction 0.3267 on 1 of 1 GPU(s)"


def test_torch_without_the_fraction_works_it_out_from_the_gpus_memory(python, fakes):
    seen = probe(python, fakes, "torch", GPU_MEMORY_LIMIT_MB="8192", FAKE_TOTAL_MB="24576",
                 FAKE_GPUS="2")  # fmt: skip
    fraction = floor4((8192 - 512) / 24576)
    assert seen["calls"] == [[fraction, 0], [fraction, 1]]


def test_tensorflow_gets_a_memory_limit_on_each_gpu_at_import(python, fakes):
    seen = probe(python, fakes, "tensorflow", FAKE_GPUS="2", **BUDGET)
    limit = 27186 - 512
    assert seen["at_import"] == [["/physical_device:GPU:0", [limit]],
                                 ["/physical_device:GPU:1", [limit]]]  # fmt: skip
    assert seen["calls"] == seen["at_import"], "applied once: not again on reload"
    assert seen["applied"]["tensorflow"] == f"memory limit {limit} MB on 2 GPU(s)"


def test_a_small_budget_keeps_three_quarters_and_the_reserve_can_be_set(python, fakes):
    seen = probe(python, fakes, "tensorflow", GPU_MEMORY_LIMIT_MB="1000")
    assert seen["calls"] == [["/physical_device:GPU:0", [750]]]
    seen = probe(python, fakes, "tensorflow", GPU_MEMORY_LIMIT_MB="1000", GPU_CAPS_RESERVE_MB="0")
    assert seen["calls"] == [["/physical_device:GPU:0", [1000]]]


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"GPU_MEMORY_FRACTION": "0.333"},
        {**BUDGET, "GPU_CAPS": "off"},
        {**BUDGET, "GPU_CAPS": " OFF "},
        {"GPU_MEMORY_LIMIT_MB": "", "GPU_MEMORY_FRACTION": "0.5"},
        {"GPU_MEMORY_LIMIT_MB": "lots"},
        {"GPU_MEMORY_LIMIT_MB": "0"},
        {"GPU_MEMORY_LIMIT_MB": "81559", "GPU_MEMORY_FRACTION": "1"},  # the whole GPU
    ],
    ids=["nothing", "no-limit", "off", "off-spaced", "empty", "not-a-number", "zero", "whole"],
)
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_no_cap_without_a_budget_or_when_turned_off(python, fakes, framework, environ):
    seen = probe(python, fakes, framework, **environ)
    assert seen["calls"] == []
    assert "CapFinder" not in seen["finders"]


@pytest.mark.parametrize("broken", ["fraction", "lazy_call"])
def test_a_failing_torch_call_never_breaks_import_or_cuda(python, fakes, broken):
    seen = probe(python, fakes, "torch", FAKE_BROKEN=broken, **BUDGET)
    assert seen["calls"] == []
    assert seen["loader"] == "SourceFileLoader"


def test_a_failing_tensorflow_call_never_breaks_the_import_and_says_so_when_asked(python, fakes):
    seen = probe(python, fakes, "tensorflow", FAKE_BROKEN="tensorflow", **BUDGET)
    assert seen["calls"] == []
    assert seen["applied"]["tensorflow"] == "not capped (RuntimeError)"
    result = run(python, fakes, "-c", "import tensorflow", FAKE_BROKEN="tensorflow",
                 GPU_CAPS="verbose", **BUDGET)  # fmt: skip
    assert result.returncode == 0
    assert result.stderr == (
        "gpu-caps: tensorflow: no cap (RuntimeError: Virtual devices cannot be modified after "
        "being initialized)\n"
    )


def test_a_framework_of_another_shape_imports_as_it_is(python, fakes):
    """A torch without torch.cuda._lazy_call, a tensorflow without tf.config."""
    (fakes / "torch" / "__init__.py").write_text("cuda = None\n")
    (fakes / "tensorflow" / "__init__.py").write_text("version = 3\n")
    script = "import torch, tensorflow, gpu_caps; print(sorted(gpu_caps.applied.items()))"
    result = run(python, fakes, "-c", script, **BUDGET)
    assert result.returncode == 0, result.stderr
    not_capped = "'not capped (AttributeError)'"
    assert result.stdout == f"[('tensorflow', {not_capped}), ('torch', {not_capped})]\n"


def test_a_framework_that_is_not_installed_still_fails_to_import_as_usual(python, fakes):
    shutil.rmtree(fakes / "torch")
    result = run(python, fakes, "-c", "import torch", **BUDGET)
    assert result.returncode == 1
    assert result.stderr.endswith("ModuleNotFoundError: No module named 'torch'\n")


def test_other_imports_are_left_alone(python, fakes):
    result = run(python, fakes, "-c", "import json, torch.cuda; print(json.__spec__.loader)",
                 **BUDGET)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "SourceFileLoader" in result.stdout


@pytest.mark.parametrize(
    "environ, expected",
    [
        (BUDGET, "0.3267"),
        ({"GPU_MEMORY_LIMIT_MB": "8192", "GPU_MEMORY_FRACTION": "0.5"}, "0.4687"),
        ({"GPU_MEMORY_LIMIT_MB": "8192"}, ""),  # the GPU's memory is not known here
        ({**BUDGET, "GPU_CAPS": "off"}, ""),
        ({"GPU_MEMORY_LIMIT_MB": "81559", "GPU_MEMORY_FRACTION": "1.0"}, ""),
        ({"GPU_MEMORY_FRACTION": "0.5"}, ""),
        ({"GPU_MEMORY_LIMIT_MB": "8192", "GPU_MEMORY_FRACTION": "1.5"}, ""),
    ],
)
def test_the_xla_fraction(environ, expected):
    assert gpu_caps.xla_fraction(environ) == expected


def start_singleuser(python: Path, tmp_path: Path, **environ: str) -> dict[str, str]:
    """start-singleuser with a jupyterhub-singleuser that prints its environment."""
    command, env = start_command(tmp_path, python, "#!/bin/sh\nenv -0\n", **environ)
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return dict(line.split("=", 1) for line in result.stdout.split("\0") if line)


def test_start_singleuser_tells_jax_the_budget(python, tmp_path):
    env = start_singleuser(python, tmp_path, **BUDGET)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3267"


@pytest.mark.parametrize(
    "environ",
    [{}, {**BUDGET, "GPU_CAPS": "off"}, {"GPU_MEMORY_LIMIT_MB": "8192"}],
    ids=["no-budget", "off", "no-fraction"],
)
def test_start_singleuser_leaves_jax_alone_without_a_budget(python, tmp_path, environ):
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in start_singleuser(python, tmp_path, **environ)


@pytest.mark.parametrize("mine", ["0.9", ""])
def test_start_singleuser_keeps_the_participants_own_jax_fraction(python, tmp_path, mine):
    env = start_singleuser(python, tmp_path, XLA_PYTHON_CLIENT_MEM_FRACTION=mine, **BUDGET)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == mine


def test_the_image_installs_both_files_into_site_packages():
    dockerfile = (SINGLEUSER / "Dockerfile").read_text()
    assert "COPY images/singleuser/gpu_caps.py images/singleuser/gpu_caps.pth" in dockerfile
    assert 'sysconfig.get_paths()["purelib"]' in dockerfile
    pth = (SINGLEUSER / "gpu_caps.pth").read_text().splitlines()
    assert len(pth) == 1 and pth[0].startswith("import "), "site runs only lines that import"
