"""`make gpu-check` (worker_setup/gpu_check.py) over the fake NVML: what it prints of the GPUs,
the slices and the guard's reading, its exit status, the allocation read back from NVML (with a
stand-in for torch), and that it runs with nothing but the standard library and nvidia-ml-py.
On a machine with a GPU, the test of the real NVML runs it against the driver too."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
import weakref
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import FakeNVML, imported, shim_env
from worker_setup import gpu_check

from .nvml_failures import FIXTURES, K80_UUIDS, K80X2, MIXED_GPU_UUIDS, MIXED_MIG, MIXED_MIG_UUIDS
from .test_worker_venv import run_in

REPO = Path(__file__).resolve().parents[2]
LOST = FIXTURES / "h100x4-gpu1-lost.json"
H100 = [f"GPU-5d1e7a20-9c3b-4f61-b8d2-00000000000{i}" for i in range(4)]
MiB = 1024 * 1024
RESET = "reboot the machine or reset the GPU with nvidia-smi -r, then run this again"


def check(capsys, *argv: str, nvml: Path) -> tuple[int, list[str], list[str]]:
    """``python -m worker_setup.gpu_check ARGV`` in this process, NVML the fake over the
    fixture ``nvml``: status, stdout and stderr lines."""
    with imported(nvml):
        status = gpu_check.main(list(argv))
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


def section(lines: list[str], title: str) -> list[str]:
    """The lines of the section that starts with ``title``, up to the next empty line."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


# ---- what it prints -----------------------------------------------------------------------


def test_two_k80s_their_slices_and_the_guards_reading(capsys):
    status, out, err = check(capsys, "--no-allocation", nvml=K80X2)
    assert status == 0 and err == []
    assert out[0] == "NVIDIA driver 550.54.15-FAKE, NVML 12.550.54.15-FAKE"
    assert section(out, "GPUs (NVML)") == [
        "GPUs (NVML): 2",
        f"  GPU 0: {K80_UUIDS[0]}  Tesla K80  11441 MiB  MIG off",
        f"  GPU 1: {K80_UUIDS[1]}  Tesla K80  11441 MiB  MIG off",
    ]
    # as the join's gpus row says it
    assert section(out, "Slices") == [
        "Slices the join would advertise (3 a GPU, 1 a MIG instance):",
        "  2 GPU(s): 2 Tesla K80 11441 MiB -> 3 slices",
        f"  GPU 0: {K80_UUIDS[0]} -> 3 slices",
        f"  GPU 1: {K80_UUIDS[1]} -> 3 slices",
    ]
    assert section(out, "The GPU guard's reading") == [
        "The GPU guard's reading (one round, as every 5 s):",
        f"  GPU 0: {K80_UUIDS[0]}  Tesla K80  0 of 11441 MiB used  0% busy  40 C  60 W",
        f"  GPU 1: {K80_UUIDS[1]}  Tesla K80  0 of 11441 MiB used  0% busy  40 C  60 W",
    ]
    assert section(out, "Allocation") == [
        "Allocation (256 MiB on cuda:0, read back from NVML):",
        "  skipped (--no-allocation)",
    ]
    assert out[-1] == "GPU check: NVML works; the join would advertise 6 slices"


def test_the_guards_reading_shows_each_process_and_what_nvml_cannot_say(tmp_path, capsys):
    fixture = json.loads(K80X2.read_text())
    fixture["gpus"][0].update(utilization_percent=87, temperature_c=71, power_w=148.5)
    fixture["processes"] = [{"pid": 4242, "gpu": 0, "used_mb": 3000},
                            {"pid": 77, "gpu": 1, "used_mb": None}]  # fmt: skip
    path = tmp_path / "k80.json"
    path.write_text(json.dumps({**fixture, "scan_processes": False}))
    _, out, _ = check(capsys, "--no-allocation", nvml=path)
    assert section(out, "The GPU guard's reading")[1:] == [
        f"  GPU 0: {K80_UUIDS[0]}  Tesla K80  3000 of 11441 MiB used  87% busy  71 C  148 W",
        "    pid 4242: 3000 MiB",
        f"  GPU 1: {K80_UUIDS[1]}  Tesla K80  0 of 11441 MiB used  0% busy  40 C  60 W",
        "    pid 77: ? MiB (NVML cannot say)",
    ]


@pytest.mark.parametrize(
    "options, whole, mig",
    [([], 3, 1), (["--slices-per-gpu", "4", "--mig-slices", "2"], 4, 2),
     (["--slice-memory", "20GiB"], 4, 1)],
)  # fmt: skip
def test_a_mixed_mig_machine_with_its_instances_and_the_gpu_without(capsys, options, whole, mig):
    status, out, err = check(capsys, "--no-allocation", *options, nvml=MIXED_MIG)
    assert status == 0 and err == []
    a100 = "NVIDIA A100-SXM4-80GB"
    assert section(out, "GPUs (NVML)") == [
        "GPUs (NVML): 3",
        f"  GPU 0: {MIXED_GPU_UUIDS[0]}  {a100}  81920 MiB  MIG off",
        f"  GPU 1: {MIXED_GPU_UUIDS[1]}  {a100}  81920 MiB  MIG on, 2 instance(s):",
        f"    {MIXED_MIG_UUIDS[0]}  3g.40gb  40192 MiB",
        f"    {MIXED_MIG_UUIDS[1]}  3g.40gb  40192 MiB",
        f"  GPU 2: {MIXED_GPU_UUIDS[2]}  {a100}  81920 MiB  MIG on, no instances",
    ]
    slices = section(out, "Slices")
    assert slices[1] == (
        f"  3 GPU(s): 1 {a100} 81920 MiB -> {whole} slices; 2 {a100} MIG 3g.40gb 40192 MiB "
        f"-> {mig} slices (MIG, hardware-isolated)"
    )
    assert slices[2:5] == [
        f"  GPU 0: {MIXED_GPU_UUIDS[0]} -> {whole} slices",
        f"  GPU 1 MIG: {MIXED_MIG_UUIDS[0]} -> {mig} slices",
        f"  GPU 1 MIG: {MIXED_MIG_UUIDS[1]} -> {mig} slices",
    ]
    assert slices[5].startswith(f"  GPU 2 ({MIXED_GPU_UUIDS[2]}) is in MIG mode but has no MIG")
    # the instances in the guard's reading, without what NVML has not for them
    reading = section(out, "The GPU guard's reading")
    assert f"  GPU 1 MIG: {MIXED_MIG_UUIDS[0]}  {a100} MIG 3g.40gb  0 of 40192 MiB used" in reading
    assert out[-1].endswith(f"would advertise {whole + 2 * mig} slices")


# ---- exit status --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, line",
    [("no-driver", "NVML cannot start: Driver Not Loaded; the NVIDIA kernel driver is not "
      "loaded: install the driver (e.g. apt-get install nvidia-driver) and reboot"),
     ("mismatch", "NVML cannot start: RM has detected an NVML/RM version mismatch; the NVIDIA "
      "kernel driver and its library differ, usually after a driver upgrade: reboot the "
      "machine")],
)  # fmt: skip
def test_nvml_that_cannot_start_is_one_line_and_status_1(capsys, name, line):
    path = FIXTURES / f"{name}.json"
    status, out, err = check(capsys, nvml=path)
    assert status == 1
    assert err == [line]
    assert out == []


def test_no_traceback_from_the_command_line():
    fixture = FIXTURES / "no-driver.json"
    result = subprocess.run(
        [sys.executable, "-m", "worker_setup.gpu_check"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=shim_env(fixture),
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"FAKE NVML: GPUs from the fixture {fixture}, not a driver (tests/fakes/nvml.py)",
        "NVML cannot start: Driver Not Loaded; the NVIDIA kernel driver is not loaded: install "
        "the driver (e.g. apt-get install nvidia-driver) and reboot",
    ]


def test_a_lost_gpu_prints_the_others_and_fails_as_the_join_would(capsys):
    status, out, err = check(capsys, "--no-allocation", nvml=LOST)
    assert status == 1
    h100 = "NVIDIA H100 80GB HBM3"
    assert section(out, "GPUs (NVML)") == [
        "GPUs (NVML): 4",
        f"  GPU 0: {H100[0]}  {h100}  81559 MiB  MIG off",
        f"  GPU 1 (PCI 00000000:2A:00.0) failed: GPU is lost; {RESET}",
        f"  GPU 2: {H100[2]}  {h100}  81559 MiB  MIG off",
        f"  GPU 3: {H100[3]}  {h100}  81559 MiB  MIG off",
    ]
    assert section(out, "Slices") == [
        "Slices the join would advertise: none, while a GPU has failed"
    ]
    reading = section(out, "The GPU guard's reading")
    assert [line.split()[2] for line in reading[1:4]] == [H100[0], H100[2], H100[3]]
    assert reading[4:] == ["  error: GPU 1 (PCI 00000000:2A:00.0): GPU is lost (reading its UUID)"]
    assert err == [
        f"GPU check failed: GPU 1 (PCI 00000000:2A:00.0) failed: GPU is lost; {RESET}. The join "
        "would stop there too: this machine advertises none of its GPUs until it is fixed"
    ]


def test_a_machine_with_nothing_to_advertise_fails_as_the_join_would(capsys):
    status, out, err = check(capsys, nvml=FIXTURES / "h100-mig-none.json")
    assert status == 1
    assert section(out, "Slices")[-1] == "  none"
    assert err == ["GPU check failed: no GPU of this machine can be advertised; the join would "
                   "stop there (see above)"]  # fmt: skip


H100_LEFT = "  3 GPU(s): 3 NVIDIA H100 80GB HBM3 81559 MiB -> 3 slices; 1 skipped (see the warning)"
MIG_LEFT = (
    "  2 GPU(s): 1 NVIDIA A100-PCIE-40GB MIG 2g.10gb 9856 MiB -> 1 slices (MIG, hardware-isolated);"
    " 1 NVIDIA A100-PCIE-40GB MIG 3g.20gb 19968 MiB -> 1 slices (MIG, hardware-isolated);"
    " 1 skipped (see the warning)"
)


@pytest.mark.parametrize(
    "fixture, argv, says, left",
    [
        ("h100x4-gpu2-zero-memory.json", [], "  warning: GPU 2 (GPU-0a6f3c91-", H100_LEFT),
        (
            "a100-mig-instance-zero-memory.json",
            [],
            "  warning: MIG instance MIG-c41a9e27-5d3b-4f80-a6e2-000000000002 of GPU 0",
            MIG_LEFT,
        ),
        ("t4x2-passthrough-same-uuid.json", [], "  GPU 0 and GPU 1 report one UUID", None),
        ("k80x2.json", ["--slices-per-gpu", "64"], "  --slices-per-gpu 64 leaves GPU 0", None),
    ],
)
def test_what_the_join_would_skip_or_refuse_is_said_as_it_would(capsys, fixture, argv, says, left):
    """``left``: what the join would still advertise; None: it would refuse the machine."""
    rc, out, err = check(capsys, *argv, nvml=FIXTURES / fixture)
    assert rc == (0 if left else 1)
    slices = section(out, "Slices")
    assert any(line.startswith(says) for line in slices), slices
    if left:
        assert slices[1] == left
    else:
        assert slices[-1] == "  none" and err[0].startswith("GPU check failed: no GPU of")


def test_the_real_nvml_of_this_machine():
    """No fixture: the driver's NVML, as on a GPU machine. Without a driver (here, usually),
    one line and status 1."""
    result = subprocess.run(
        [sys.executable, "-m", "worker_setup.gpu_check", "--no-allocation"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "FAKE NVML" not in result.stdout + result.stderr
    if result.returncode == 1 and not result.stdout:
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("NVML cannot start: ")
    else:
        assert result.stdout.startswith("NVIDIA driver "), result.stdout + result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("call", fake_nvml.CHECK_CALLS)
def test_a_version_nvml_cannot_give_is_a_question_mark(tmp_path, capsys, call):
    path = tmp_path / "k80.json"
    path.write_text(json.dumps({**json.loads(K80X2.read_text()),
                                "fail": {call: {"error": "Unknown"}}}))  # fmt: skip
    status, out, _ = check(capsys, "--no-allocation", nvml=path)
    assert status == 0
    driver = "? (Unknown Error)" if call == "nvmlSystemGetDriverVersion" else "550.54.15-FAKE"
    nvml = "? (Unknown Error)" if call == "nvmlSystemGetNVMLVersion" else "12.550.54.15-FAKE"
    assert out[0] == f"NVIDIA driver {driver}, NVML {nvml}"


def test_every_nvml_call_it_makes_can_be_failed_and_its_own_are_tested():
    """A new NVML call in gpu_check.py fails here until the fake and these tests know it."""
    tree = ast.parse(Path(gpu_check.__file__).read_text())
    called = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "nvml"
        and node.attr.startswith("nvml")
    }
    assert called - set(fake_nvml.CALLS) == set(fake_nvml.CHECK_CALLS)
    assert called <= set(fake_nvml.FAILABLE_CALLS)
    with pytest.raises(ValueError, match="nvmlSystemGetDriverVersion is not about one GPU; leave"):
        FakeNVML({"fail": {"nvmlSystemGetDriverVersion": {"gpu": 0, "error": "Unknown"}}})


@pytest.mark.parametrize("option", ["--slices-per-gpu=0", "--mig-slices=x", "--slice-memory=4"
                                    "Q"])  # fmt: skip
def test_options_out_of_range_are_refused(capsys, option):
    with pytest.raises(SystemExit) as refused:
        gpu_check.main([option])
    assert refused.value.code == 2
    assert option.split("=")[0] in capsys.readouterr().err


# ---- the allocation, read back from NVML ------------------------------------------------------


class Buffer:
    """What the stand-in's empty() gives: only its lifetime matters."""


class FakeTorch(types.ModuleType):
    """The calls gpu_check makes of torch: cuda.is_available(), empty(n, dtype=uint8,
    device="cuda:0"), cuda.empty_cache(). ``on_allocate`` runs when memory is allocated,
    ``on_free`` when the cache is emptied; ``events`` records each call."""

    uint8 = "torch.uint8"

    def __init__(self, on_allocate=lambda: None, on_free=lambda: None, available=True):
        super().__init__("torch")
        self.events: list[tuple] = []
        self.buffer = lambda: None
        self._on_allocate, self._on_free = on_allocate, on_free
        self.cuda = types.SimpleNamespace(
            is_available=lambda: available, empty_cache=self._empty_cache
        )

    def empty(self, n, dtype, device):
        self.events.append(("empty", n, dtype, device))
        buffer = Buffer()
        self.buffer = weakref.ref(buffer)
        self._on_allocate()
        return buffer

    def _empty_cache(self):
        # the cache can only give back what nothing holds any more
        self.events.append(("empty_cache", "buffer dropped" if self.buffer() is None else "held"))
        self._on_free()


def following(tmp_path, processes=()) -> tuple[Path, FakeNVML]:
    """Two K80s as a fixture file that the fake NVML follows; started."""
    path = tmp_path / "k80.json"
    write(path, list(processes), 1_000_000_000)
    nvml = FakeNVML.from_file(str(path))
    nvml.nvmlInit()
    return path, nvml


def write(path: Path, processes: list, mtime: int) -> None:
    fixture = {**json.loads(K80X2.read_text()), "processes": processes, "scan_processes": False}
    fixture["gpus"][0]["memory_used_mb"] = 1200  # the driver's own, and others'
    path.write_text(json.dumps(fixture))
    os.utime(path, ns=(mtime, mtime))  # as a later write would: the clock may be coarse


def allocating(path: Path, used_mb: int | None = 770, pid: int | None = None):
    """What happens on the GPU when this process allocates: NVML lists its pid on GPU 0."""
    me = {"pid": pid or os.getpid(), "gpu": 0, "used_mb": used_mb}
    return lambda: write(path, [me], 2_000_000_000)


def test_nvml_reports_this_processs_memory_beside_what_was_allocated(tmp_path):
    path, nvml = following(tmp_path)
    reads_when_freed = []  # NVML's rounds read when the memory is given back

    def freed():
        reads_when_freed.append(nvml.calls.count("nvmlDeviceGetCount"))

    torch = FakeTorch(allocating(path), on_free=freed)
    said = []
    assert gpu_check.check_allocation(torch, nvml, say=said.append) is True
    pid = os.getpid()
    assert said == [
        f"  allocated 256 MiB on cuda:0 with torch in this process (pid {pid}), freed again",
        f"  NVML: pid {pid} holds 770 MiB on {K80_UUIDS[0]}, for 256 MiB allocated (the CUDA "
        "context counts too: this is what the guard holds against a budget)",
        f"  {K80_UUIDS[0]}: 1200 MiB in use before, 1970 MiB with it",
    ]
    assert torch.events == [("empty", 256 * MiB, "torch.uint8", "cuda:0"),
                            ("empty_cache", "buffer dropped")]  # fmt: skip
    assert reads_when_freed == [2]  # read before and with it, then freed


def test_memory_nvml_cannot_say_for_the_process_is_said(tmp_path):
    path, nvml = following(tmp_path)
    said = []
    gpu_check.check_allocation(FakeTorch(allocating(path, used_mb=None)), nvml, say=said.append)
    assert f"  NVML: pid {os.getpid()} holds ? MiB (NVML cannot say) on {K80_UUIDS[0]}" in (
        said[1].split(", for")[0])  # fmt: skip


def test_a_process_nvml_does_not_list_is_a_warning(tmp_path):
    """In a container NVML gives the host's pids: this one's is not among them."""
    path, nvml = following(tmp_path)
    said = []
    torch = FakeTorch(allocating(path, pid=os.getpid() + 100000))
    assert gpu_check.check_allocation(torch, nvml, say=said.append) is False
    assert said[1].startswith(f"  warning: NVML lists no GPU process with pid {os.getpid()}, so")
    assert torch.events[-1] == ("empty_cache", "buffer dropped")


def test_torch_without_cuda_allocates_nothing(tmp_path):
    _, nvml = following(tmp_path)
    said = []
    torch = FakeTorch(available=False)
    assert gpu_check.check_allocation(torch, nvml, say=said.append) is False
    assert said == ["  torch could not allocate 256 MiB on cuda:0: torch.cuda.is_available() is "
                    "False (no CUDA device, or a CPU torch)"]  # fmt: skip
    assert torch.events == []


def test_the_command_allocates_with_the_framework_it_finds(tmp_path, capsys, monkeypatch):
    path, _ = following(tmp_path)
    torch = FakeTorch(allocating(path))
    monkeypatch.setattr(gpu_check, "cuda_framework", lambda: torch)
    status, out, _ = check(capsys, nvml=path)
    assert status == 0
    assert section(out, "Allocation")[2].startswith(f"  NVML: pid {os.getpid()} holds 770 MiB")
    # and not when told
    torch.events.clear()
    status, out, _ = check(capsys, "--no-allocation", nvml=path)
    assert section(out, "Allocation")[1:] == ["  skipped (--no-allocation)"]
    assert torch.events == []


def test_without_a_cuda_framework_the_allocation_is_skipped_with_a_line(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "FRAMEWORKS", ("no_such_torch", "no_such_cupy"))
    _, out, _ = check(capsys, nvml=K80X2)
    assert section(out, "Allocation")[1].startswith(
        f"  skipped: neither no_such_torch nor no_such_cupy can be imported by {sys.executable}"
    )
    assert gpu_check.cuda_framework(("no_such_torch", "json")) is json


# ---- with nvidia-ml-py alone -----------------------------------------------------------------

#: Runs gpu_check as ``python -m`` would, then lists every module it loaded (not those the
#: interpreter had loaded at start, e.g. a venv's .pth hooks) that is not the standard library's.
LIST_IMPORTS = """
import atexit, runpy, sys
start = set(sys.modules)
atexit.register(lambda: print("IMPORTED", *sorted(
    m for m in set(sys.modules) - start if m.split(".")[0] not in sys.stdlib_module_names
), file=sys.stderr))
sys.argv[0] = "gpu_check"
runpy.run_module("worker_setup.gpu_check", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def nvml_only(tmp_path_factory) -> Path:
    """A venv with nvidia-ml-py alone (its one module copied in: no network); its python."""
    root = tmp_path_factory.mktemp("nvml-only")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    shutil.copy(importlib.util.find_spec("pynvml").origin, purelib)
    return python


@pytest.mark.parametrize("venv", ["nvml-only", "this"])
def test_it_imports_only_the_standard_library_nvml_and_the_repository(nvml_only, tmp_path, venv):
    """On a bare checkout with nvidia-ml-py alone; and here, where much more is importable."""
    python = nvml_only if venv == "nvml-only" else Path(sys.executable)
    result = run_in(python, "-c", LIST_IMPORTS, cwd=tmp_path, nvml=K80X2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("GPU check: NVML works")
    [imported] = [line.split()[1:] for line in result.stderr.splitlines() if "IMPORTED" in line]
    repository = ("worker_setup", "gpu_swarm_spawner.contract", "deploy.settings")
    allowed = {"pynvml", "gpu_swarm_spawner", "deploy"}
    allowed |= {"tests", "tests.fakes", "tests.fakes.nvml"}  # the fake NVML, as `import pynvml`
    wrong = [m for m in imported if m not in allowed and not m.startswith(repository)]
    assert not wrong
    assert "pynvml" in imported and "worker_setup.telemetry" in imported


def test_make_gpu_check_runs_the_venvs_python_without_root_or_docker(nvml_only, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPUHUB_VENV": str(nvml_only.parents[1])}
    result = subprocess.run(
        ["make", "-s", "-C", str(REPO), "gpu-check"],
        cwd=tmp_path, env=shim_env(K80X2, env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"can be imported by {nvml_only} (" in result.stdout
    assert (
        result.stdout.splitlines()[-1] == "GPU check: NVML works; the join would advertise 6 slices"
    )
    assert "NVIDIA driver 550.54.15-FAKE, NVML 12.550.54.15-FAKE" in result.stdout
    assert result.stderr.startswith(f"FAKE NVML: GPUs from the fixture {K80X2}, not a driver")
