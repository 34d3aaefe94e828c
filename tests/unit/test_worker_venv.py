"""A GPU machine runs the worker code with the standard library and nvidia-ml-py only.

Without the repository's .venv, worker_setup/setup.sh makes a venv holding nothing but
nvidia-ml-py and runs ``python -m worker_setup`` from the checkout. These tests do the same with
venvs made here (no network: pynvml's single module file is copied in), so an import of jinja2,
dockerspawner or any other package of the hub's makes them fail; and they read every module
(and setup.sh, which runs no python of its own but the worker's) for imports that only a fuller
environment has.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.nvml import shim_env

from .imports import imports
from .nvml_failures import FIXTURES, K80_UUIDS, K80X2

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "worker_setup"
SETUP_SH = WORKER / "setup.sh"
WORKER_MODULES = sorted(p.stem for p in WORKER.glob("*.py"))
#: Beyond the standard library, what the worker code may import (deploy.settings: the one
#: reader of the settings, standard library only; checked below).
#: prometheus_client: the GPU guard serves its metrics with it (imported where it serves them;
#: setup.sh puts it into the worker venv beside nvidia-ml-py).
ALLOWED = {
    "pynvml",
    "prometheus_client",
    "gpu_swarm_spawner.contract",
    "worker_setup",
}
#: Packages of the hub's environment that a GPU machine does not have.
HUB_ONLY = ("jinja2", "traitlets", "jupyterhub", "dockerspawner", "docker")


def make_venv(path: Path, with_pynvml: bool) -> Path:
    """A venv at ``path`` without pip and without system site-packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    if with_pynvml:
        origin = importlib.util.find_spec("pynvml").origin
        assert origin.endswith("pynvml.py"), f"pynvml is no longer one file: {origin}"
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        shutil.copy(origin, purelib)
        # the worker venv's other package (the GPU guard's metrics), pure python too
        package = Path(importlib.util.find_spec("prometheus_client").origin).parent
        shutil.copytree(package, Path(purelib) / package.name)
    return python


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """(python with the standard library only, python with nvidia-ml-py only)."""
    root = tmp_path_factory.mktemp("venvs")
    return make_venv(root / "stdlib", False), make_venv(root / "nvml", True)


def run_in(
    python: Path, *args: str, cwd: Path, nvml: Path | None = None, **env: str
) -> subprocess.CompletedProcess:
    """``python ARGS`` with the checkout on PYTHONPATH (as setup.sh runs it) and nothing else
    of this environment: not its PATH, not its venv; NVML the fake over the fixture ``nvml``
    when given."""
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONNOUSERSITE": "1",
             "HOME": str(cwd), "LC_ALL": "C.UTF-8"}  # fmt: skip
    if nvml:
        clean = shim_env(nvml, clean)
    return subprocess.run(
        [str(python), *args], cwd=cwd, env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_venvs_hold_nothing_of_the_hubs(venvs, tmp_path):
    """Else the tests below could not fail."""
    stdlib, nvml = venvs
    assert run_in(nvml, "-c", "import pynvml", cwd=tmp_path).returncode == 0
    assert run_in(stdlib, "-c", "import pynvml", cwd=tmp_path).returncode != 0
    for name in HUB_ONLY:
        result = run_in(nvml, "-c", f"import {name}", cwd=tmp_path)
        assert "ModuleNotFoundError" in result.stderr, f"{name} is importable in the venv"


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_each_worker_module_imports_with_nvidia_ml_py_alone(venvs, tmp_path, module):
    result = run_in(venvs[1], "-c", f"import worker_setup.{module}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_advertise_runs_with_nvidia_ml_py_alone(venvs, tmp_path):
    daemon_json = tmp_path / "daemon.json"
    args = ["-m", "worker_setup.advertise", "--daemon-json", str(daemon_json),
            "--nvidia-runtime", "off"]  # fmt: skip
    result = run_in(venvs[1], *args, cwd=tmp_path, nvml=K80X2)
    assert result.returncode == 3, result.stderr
    config = json.loads(daemon_json.read_text())
    assert config["node-generic-resources"] == [f"{uuid}=4" for uuid in K80_UUIDS]  # 3 + spare
    assert "gpu-jupyterhub.gpu-model=Tesla K80" in config["labels"]

    result = run_in(venvs[1], *args, "--simulate-gpus", "2", "--dry-run", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "GPU-simulated-" in result.stdout

    # pynvml's own exception for a lost GPU, in the venv: one line, no traceback
    lost = str(FIXTURES / "h100x4-gpu1-lost.json")
    result = run_in(venvs[1], *args, cwd=tmp_path, nvml=lost)
    assert result.returncode == 1
    fake, *lines = result.stderr.splitlines()
    assert fake == f"FAKE NVML: GPUs from the fixture {lost}, not a driver (tests/fakes/nvml.py)"
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("GPU 1 (PCI 00000000:2A:00.0) failed: GPU is lost;")


def allowed(module: str, extra: set[str] = ALLOWED) -> bool:
    top = module.split(".")[0]
    return (
        top in sys.stdlib_module_names
        or top == "__future__"
        or any(module == a or module.startswith(a + ".") for a in extra)
    )


def test_worker_code_imports_only_the_standard_library_nvml_and_the_contract():
    """Also the imports inside functions, which the venv runs above may not reach."""
    wrong = [
        f"worker_setup/{path.name}:{line}: {module}"
        for path in sorted(WORKER.glob("*.py"))
        for line, module in imports(path.read_text())
        if not allowed(module)
    ]
    assert not wrong, "the worker may import the standard library, pynvml and the contract"


def test_the_settings_import_only_the_standard_library_and_nine_pure_modules():
    """deploy/settings.py runs with a bare python3 (before anything is installed) and on the
    GPU machines: beyond the standard library only the typed values' readers, the roster and
    tutorial-repository readers, the tutorial token file's reader and the contract with the GPU
    machines (the hub's limit of slices a GPU, the GPU guard's settings), the servers'
    egress setting's reader, the settings table (every setting, declared once), the fleet's
    schedule reader and the provider's settings' readers, themselves standard library only; and
    the deploy package's __init__ imports nothing."""
    pure = {
        "deploy.values",
        "gpu_swarm_spawner.roster",
        "gpu_swarm_spawner.contract",
        "gpu_swarm_spawner.egress",
        "gpu_swarm_spawner.settings_table",
        "gpu_swarm_spawner.schedule",
        "gpu_swarm_spawner.provider_settings",
        "tutorial_sync.repos",
        "tutorial_sync.credentials",
    }
    deploy = REPO / "deploy"
    spawner = REPO / "gpu_swarm_spawner"
    wrong = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in (deploy / "settings.py", deploy / "values.py", spawner / "roster.py",
                     spawner / "contract.py", spawner / "egress.py",
                     spawner / "settings_table.py", spawner / "schedule.py",
                     spawner / "provider_settings.py",
                     REPO / "tutorial_sync" / "repos.py",
                     REPO / "tutorial_sync" / "credentials.py")
        for line, module in imports(path.read_text())
        if not allowed(module, pure)
    ]  # fmt: skip
    assert not wrong
    assert imports((deploy / "__init__.py").read_text()) == []


def test_setup_sh_only_finds_the_python_and_hands_over_to_the_worker_package():
    """No shell library (deploy/lib.sh), no python of its own: the probe for pynvml, then
    ``python -m worker_setup``."""
    text = SETUP_SH.read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.match(r"\s*(\.|source)\s", line)], "sources a file"
    assert "lib.sh" not in "\n".join(code)
    snippets = re.findall(r"\s-c\s+'([^']*)'", text)
    assert snippets == ["import pynvml, prometheus_client"]
    assert not re.search(r"<<'?\w+'?", text), "a here-document"
    assert set(re.findall(r"\s-m\s+([\w.]+)", text)) == {"worker_setup", "venv"}


# setup.sh itself on a machine without the repository's .venv: python3 has the standard library
# only, the worker python nvidia-ml-py only. Always with --dry-run, and docker, id and everything
# that could install or start an engine are stand-ins, pid and log files in tmp_path: these
# tests never reach this machine's Docker engine or packages.
DOCKER_STUB = """#!/bin/sh
echo "$*" >>"$(dirname "$0")/docker.log"
case "$STUB_ENGINE:$1:$2" in
  up:info:--format) echo '{"Name": "gpu-7", "Swarm": {"LocalNodeState": "inactive"}}' ;;
  up:info:*) echo 'Server: ...' ;;
  up:version:*) echo '"20.10.24"' ;;
  up:ps:*) printf '"jy-alice"\\n"other_service"\\n"jy-bob--gpu"\\n' ;;
  *) exit 1 ;;
esac
"""


def run_setup_sh(venvs, tmp_path, *args, engine="down", python3=True, nvml=None, **environ):
    """setup.sh ARGS with the stand-ins; ``environ`` changes its environment (None: unset);
    ``python3=False``: a python3 that fails; NVML the fake over the fixture ``nvml`` when
    given."""
    assert "--dry-run" in args, "only ever a dry run here"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "docker").write_text(DOCKER_STUB)
    (stubs / "id").write_text("#!/bin/sh\necho 0\n")
    for name in ("dockerd", "apt-get", "systemctl", "setsid", "nohup"):
        (stubs / name).write_text(f"#!/bin/sh\necho '{name} must not run here' >&2\nexit 1\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    if python3:
        (stubs / "python3").symlink_to(venvs[0])
    else:
        (stubs / "python3").write_text("#!/bin/sh\necho 'python3 must not run here' >&2\nexit 1\n")
        (stubs / "python3").chmod(0o755)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GPUHUB_CONFIG": "none",
        "GPUHUB_VENV": str(tmp_path / "no-venv"),
        "GPUHUB_WORKER_PYTHON": str(venvs[1]),
        "GPUHUB_DAEMON_JSON": str(tmp_path / "daemon.json"),
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
        "GPUHUB_DOCKERD_CMD": "exit 1",
        "GPUHUB_DOCKERD_PIDFILE": str(tmp_path / "docker.pid"),
        "GPUHUB_DOCKERD_LOG": str(tmp_path / "dockerd.log"),
        "GPUHUB_ENGINE_WAIT": "1",
        "STUB_ENGINE": engine,
        # python (3.11+) then leaves the current directory off sys.path: the checkout must
        # come from setup.sh's PYTHONPATH
        "PYTHONSAFEPATH": "1",
    }
    env.update(environ)
    env = {k: v for k, v in env.items() if v is not None}
    if nvml:
        env = shim_env(nvml, env)
    with socket.socket() as manager:  # the manager's swarm port answers
        manager.bind(("127.0.0.1", 0))
        manager.listen()
        join = ["--manager", f"127.0.0.1:{manager.getsockname()[1]}", "--token", "SWMTKN-1-abc-def"]
        result = subprocess.run(
            [str(SETUP_SH), *join, *args], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    docker_log = stubs / "docker.log"
    return result, docker_log.read_text() if docker_log.exists() else ""


def test_setup_sh_plans_a_join_with_nvidia_ml_py_alone(venvs, tmp_path):
    result, docker = run_setup_sh(venvs, tmp_path, "--dry-run", nvml=K80X2)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "2 GPU(s): 2 Tesla K80 11441 MiB -> 3 slices" in out
    assert f'+    "{K80_UUIDS[0]}=4",' in out  # the daemon.json diff (3 slices and the spare)
    # the image's name from deploy.settings' defaults (GPUHUB_CONFIG=none)
    assert "would pull gpu-jupyterhub/singleuser:latest" in out
    for step in ("checks", "engine", "gpus", "swarm", "image", "daemon.json"):
        assert f"\n  {step} " in out, f"no summary row {step}:\n{out}"
    assert out.endswith("\ndry run: nothing was changed\n")
    assert not (tmp_path / "daemon.json").exists()
    assert docker and not re.search(r"^(swarm|pull|load)", docker, re.M), docker


@pytest.mark.parametrize("which", ["stdlib", "nvml"])
def test_the_worker_setup_explains_itself_without_nvidia_ml_py(venvs, tmp_path, which):
    python = venvs[0] if which == "stdlib" else venvs[1]
    result = run_in(python, "-m", "worker_setup", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sudo ./worker_setup/setup.sh --leave" in result.stdout
    options = "--manager --token --image-tar --registry --slices-per-gpu --slice-memory "
    options += "--simulate-gpus --nvidia-runtime --wait --force --dry-run"
    for option in options.split():
        assert option in result.stdout
    assert "fixture" not in result.stdout  # the tests' fake NVML is no option of the product


def test_setup_sh_help_needs_no_root_and_no_worker_python(tmp_path):
    """--help before the root check: nothing is installed for it."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUHUB_WORKER_PYTHON": "/nonexistent"}
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SETUP_SH), "--help"]
        if shutil.which("setpriv") and os.geteuid() == 0 else [str(SETUP_SH), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "--manager ADDR[:PORT]" in result.stdout


def test_setup_sh_takes_the_repositorys_venv_when_it_has_nvidia_ml_py(venvs, tmp_path):
    """No GPUHUB_WORKER_PYTHON: the venv of GPUHUB_VENV, and no venv of its own is made (the
    python3 here fails, and so would apt-get)."""
    venv = str(venvs[1].parent.parent)
    result, _ = run_setup_sh(
        venvs, tmp_path, "--simulate-gpus", "1", "--dry-run",
        python3=False, GPUHUB_WORKER_PYTHON=None, GPUHUB_VENV=venv,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dry run: nothing was changed" in result.stdout


def test_setup_sh_stops_before_joining_when_a_gpu_is_lost(venvs, tmp_path):
    lost = str(FIXTURES / "h100x4-gpu1-lost.json")
    result, docker = run_setup_sh(venvs, tmp_path, "--dry-run", nvml=lost)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "GPU 1 (PCI 00000000:2A:00.0) failed: GPU is lost;" in result.stderr
    assert "swarm join" not in docker


def test_setup_sh_finds_participants_servers_by_the_contracts_prefix(venvs, tmp_path):
    result, _ = run_setup_sh(venvs, tmp_path, "--leave", "--dry-run", engine="up")
    assert result.returncode == 1
    assert "participants' servers still run here: jy-alice jy-bob--gpu;" in result.stderr
