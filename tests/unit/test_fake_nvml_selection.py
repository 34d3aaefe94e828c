"""The fake NVML is the tests' alone and never picked silently: the product has one way to NVML
(worker_setup.gpus.load_nvml: ``import pynvml``) and no option for anything else; the tests'
``pynvml`` (tests/fakes/pynvml_shim) serves only when a fixture is named, and says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.nvml import SHIM, shim_env, shim_words
from worker_setup import guard_service

from .nvml_failures import K80X2

REPO = Path(__file__).resolve().parents[2]
#: The product: what pyproject.toml packages, and what the images and the organizer run.
PRODUCT = ("gpu_swarm_spawner", "worker_setup", "tutorial_sync", "deploy")
#: What would mean the double, or a way to pick it, in the product.
DOUBLE = re.compile(r"fake_nvml|FakeNVML|nvml[-_]fixture|FAKE_NVML|tests\.fakes|pynvml_shim")
#: What a process with the shim first on its path reads, as worker_setup gets NVML.
READ = (
    "from worker_setup import gpus; nvml = gpus.load_nvml(); nvml.nvmlInit(); "
    "print(nvml.nvmlSystemGetDriverVersion(), nvml.nvmlDeviceGetCount())"
)


def python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def without(*names: str) -> dict:
    return {k: v for k, v in os.environ.items() if k not in names}


def test_the_shim_serves_the_named_fixture_and_says_so():
    done = python(READ, shim_env(K80X2, without("PYTHONPATH")))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "550.54.15-FAKE 2\n"  # the driver's version says FAKE wherever printed
    assert (
        done.stderr
        == f"FAKE NVML: GPUs from the fixture {K80X2}, not a driver (tests/fakes/nvml.py)\n"
    )


def test_the_shim_without_a_fixture_named_refuses_with_one_line():
    env = {**without("FAKE_NVML_FIXTURE"), "PYTHONPATH": str(SHIM)}
    done = python(READ, env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: FAKE NVML refused: {SHIM} is on PYTHONPATH, so `import pynvml` finds the tests' "
        "fake NVML, but FAKE_NVML_FIXTURE names no fixture. For the fake, set "
        "FAKE_NVML_FIXTURE=/path/to/tests/fixtures/nvml/<file>.json; for the real NVML, take "
        "that folder off PYTHONPATH"
    ]


def test_a_fixture_named_without_the_shim_on_the_path_gets_the_real_nvml():
    env = {**without("PYTHONPATH"), "FAKE_NVML_FIXTURE": str(K80X2)}
    code = "from worker_setup import gpus; print(gpus.load_nvml().__file__)"
    done = python(code, env)
    assert done.returncode == 0, done.stderr
    assert "FAKE" not in done.stdout + done.stderr
    assert Path(done.stdout.strip()).name == "pynvml.py"
    assert not Path(done.stdout.strip()).resolve().is_relative_to(REPO / "tests")


def test_on_a_bed_machine_the_words_name_the_shim_and_the_fixture_in_its_checkout():
    words = shim_words("tests/fixtures/nvml/k80x2.json", "/root/repo")
    assert words == (
        "PYTHONPATH=/root/repo/tests/fakes/pynvml_shim "
        "FAKE_NVML_FIXTURE=/root/repo/tests/fixtures/nvml/k80x2.json"
    )
    assert (REPO / "tests/fakes/pynvml_shim/pynvml.py").is_file()


def test_the_guard_imports_what_the_join_imports():
    """The join's PYTHONPATH (setup.sh: this checkout, then the caller's) reaches the guard's
    service after this checkout, under systemd and without; nothing else is made of it."""
    environ = {"PYTHONPATH": f"/site/a{os.pathsep}{guard_service.REPO}{os.pathsep}/site/b"}
    wanted = guard_service.wanted(["--mode", "warn"], environ)
    path = os.pathsep.join([str(guard_service.REPO), "/site/a", "/site/b"])
    assert wanted.env == {"PYTHONPATH": path}
    assert f"Environment=PYTHONPATH={path}\n" in guard_service.unit_text(wanted)
    assert guard_service.wanted([], {}).env == {"PYTHONPATH": str(guard_service.REPO)}


# ---- the product ----------------------------------------------------------------------------


def test_the_packaged_product_holds_no_double():
    # [tool.setuptools.packages.find]'s include: the packages and their subpackages' patterns
    (listed,) = re.findall(r"(?m)^include = \[(.*)\]$", (REPO / "pyproject.toml").read_text())
    packages = re.findall(r'"([\w.]+)(?:\.\*)?"', listed)
    roots = {name.split(".")[0] for name in packages}
    assert roots == set(PRODUCT), "a new package: add it to PRODUCT so it is scanned below"
    for name in packages:
        folder = REPO / name.replace(".", "/")
        assert not list(folder.glob("*nvml*fake*")) and not list(folder.glob("*fake*nvml*"))


@pytest.mark.parametrize("package", PRODUCT)
def test_no_product_code_names_the_double_or_an_option_for_it(package):
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / package).rglob("*"))
        if path.is_file() and path.suffix in {".py", ".sh", ".yml", ".env", ".html", ".j2", ""}
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if DOUBLE.search(line)
    ]
    assert found == []
