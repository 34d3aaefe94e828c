"""tests/gpu/prove.sh without a GPU: its parsing, comparisons and report (tests/gpu/prove.py)
with nvidia-smi's recorded answers on H100 and H200 machines, and the script itself run end to
end here: with no GPU it skips every section and exits 0; with the fake NVML (selected by
name), a stand-in nvidia-smi and a stand-in PyTorch, the sections' own code runs (discovery,
the guard's enforcement with real signals to processes it started, the caps, the devices).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fakes.nvml import FakeNVML
from tests.gpu import prove, run, sections
from tests.gpu.prove import FAIL, PASS, SKIP, Check
from worker_setup import gpus

REPO = Path(__file__).resolve().parents[2]
PROVE = REPO / "tests" / "gpu" / "prove.sh"
FIXTURES = REPO / "tests" / "fixtures" / "nvml"

# nvidia-smi's answers, recorded (--format=csv,noheader,nounits)
H100 = "GPU-3f2a9c4e-81b7-4d2e-a6c5-000000000000"
H100_QUERY = f"0, {H100}, NVIDIA H100 80GB HBM3, 81559, Disabled\n"
H100_LIST = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {H100})\n"
H200_QUERY = "0, GPU-a41c07e2-5f3d-9b18-c6e0-2d7f4b8a1e93, NVIDIA H200, 143771, Disabled\n"
MIG_GPU = "GPU-7c1d4e2a-5b6f-4a3c-9d8e-000000000000"
MIG = [f"MIG-2a7e9c1b-3d4f-5a6b-8c9d-00000000000{i}" for i in range(7)]
MIG_QUERY = f"0, {MIG_GPU}, NVIDIA H100 80GB HBM3, 81559, Enabled\n"
MIG_LIST = f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {MIG_GPU})\n" + "".join(
    f"  MIG 1g.10gb     Device  {i}: (UUID: {uuid})\n" for i, uuid in enumerate(MIG)
)
# a GPU without MIG (N/A) beside one that fails to say its memory
T4_QUERY = (
    "0, GPU-6b0e5a77-2c1d-4e3f-8a9b-0c1d2e3f4a5b, Tesla T4, 15360, [N/A]\n"
    "1, GPU-6b0e5a77-2c1d-4e3f-8a9b-0c1d2e3f4a5c, Tesla T4, [Unknown Error], [N/A]\n"
)
APPS = f"48211, {H100}, 1536\n48230, {H100}, 1040\n"
APPS_MIG = f"51002, {MIG_GPU}, [N/A]\n"


# ---- parsing ------------------------------------------------------------------------------


def test_query_gpu_of_an_h100_and_an_h200():
    assert prove.parse_query_gpu(H100_QUERY) == [
        {
            "index": 0,
            "uuid": H100,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_mb": 81559,
            "mig_mode": False,
        }
    ]
    (h200,) = prove.parse_query_gpu(H200_QUERY)
    assert (h200["name"], h200["memory_mb"], h200["mig_mode"]) == ("NVIDIA H200", 143771, False)
    assert prove.parse_query_gpu(MIG_QUERY)[0]["mig_mode"] is True


def test_query_gpu_fields_nvidia_smi_cannot_say_are_none():
    first, second = prove.parse_query_gpu(T4_QUERY)
    assert first["mig_mode"] is None and first["memory_mb"] == 15360
    assert second["memory_mb"] is None and second["index"] == 1


def test_query_gpu_refuses_a_line_of_other_fields():
    with pytest.raises(ValueError, match="4 fields"):
        prove.parse_query_gpu(f"0, {H100}, NVIDIA H100 80GB HBM3, 81559\n")


def test_list_gives_each_gpu_with_its_mig_devices():
    (gpu,) = prove.parse_list("Warning: something\n" + MIG_LIST)
    assert gpu["uuid"] == MIG_GPU and gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert [m["uuid"] for m in gpu["mig"]] == MIG
    assert gpu["mig"][3] == {"profile": "1g.10gb", "slot": 3, "uuid": MIG[3]}
    assert prove.parse_list("No devices were found\n") == []


def test_compute_apps():
    assert prove.parse_compute_apps(APPS) == [
        {"pid": 48211, "gpu_uuid": H100, "used_mb": 1536},
        {"pid": 48230, "gpu_uuid": H100, "used_mb": 1040},
    ]
    assert prove.parse_compute_apps(APPS_MIG)[0]["used_mb"] is None
    assert prove.parse_compute_apps("") == []
    assert prove.parse_compute_apps("No running processes found\n") == []


# ---- comparisons --------------------------------------------------------------------------


def joined(fixture: str) -> list[dict]:
    """What the join reads from the fake NVML over ``fixture``, as the discovery section has it."""
    return sections.described(gpus.discover(FakeNVML.from_file(str(FIXTURES / fixture))))


def statuses(checks: list[Check]) -> dict[str, str]:
    return {c.what: c.status for c in checks}


def test_discovery_agrees_with_nvidia_smi_on_an_h100_in_mig_mode():
    checks = prove.compare_discovery(
        joined("h100-mig-7x1g.json"), prove.parse_query_gpu(MIG_QUERY), prove.parse_list(MIG_LIST)
    )
    assert set(statuses(checks).values()) == {PASS}, checks
    assert "GPU 0 MIG instances" in statuses(checks)


def test_discovery_names_each_difference():
    ours = joined("h100-mig-7x1g.json")
    other_memory = MIG_QUERY.replace("81559", "81920")
    fewer = MIG_LIST.rsplit("  MIG", 1)[0] + "\n"
    checks = statuses(
        prove.compare_discovery(ours, prove.parse_query_gpu(other_memory), prove.parse_list(fewer))
    )
    assert checks["GPU 0 memory"] == FAIL
    assert checks["GPU 0 MIG instances"] == FAIL
    assert checks["GPU 0 UUID"] == PASS
    off = prove.parse_query_gpu(MIG_QUERY.replace("Enabled", "Disabled"))
    assert statuses(prove.compare_discovery(ours, off, []))["GPU 0 MIG mode"] == FAIL
    two = prove.parse_query_gpu(H100_QUERY + H100_QUERY.replace("0, ", "1, ", 1))
    checks = statuses(prove.compare_discovery(ours, two, []))
    assert checks["count"] == FAIL and checks["GPU 0 UUID"] == FAIL and checks["GPUs"] == FAIL


def test_discovery_takes_n_a_mig_mode_for_a_gpu_used_whole():
    ours = [dict(index=0, uuid=H100, name="NVIDIA H100 80GB HBM3", memory_mb=81559, mig_mode=False)]
    smi = prove.parse_query_gpu(H100_QUERY.replace("Disabled", "[N/A]"))
    assert set(statuses(prove.compare_discovery(ours, smi, [])).values()) == {PASS}


def test_process_figures():
    good = prove.compare_process(48211, "torch 1024 MiB", 1024, 1536, 1536, 1536)
    assert set(statuses(good).values()) == {PASS}
    assert "+512 MiB" in good[0].detail
    assert set(statuses(prove.compare_process(1, "x", 1024, 1536, 1536, 1537)).values()) == {PASS}
    off = statuses(prove.compare_process(1, "x", 1024, 1500, 1536, 1600))
    assert off["x (pid 1) guard"] == FAIL and off["x (pid 1) nvidia-smi"] == FAIL
    assert statuses(prove.compare_process(1, "x", 1024, 900, 900, None))["x (pid 1) NVML"] == FAIL
    (unseen,) = prove.compare_process(1, "x", 1024, None, None, None)
    assert unseen.status == FAIL and "PID namespace" in unseen.detail


@pytest.mark.parametrize(
    "overhead, reserve", [(0, 64), (-20, 64), (500, 576), (512, 576), (513, 640)]
)
def test_reserve_suggestion_covers_the_overhead_and_a_margin(overhead, reserve):
    assert prove.reserve_suggestion(overhead) == reserve


def test_caps_checks():
    under = {"mb": 3268, "ok": True, "held_mb": 3268.0}
    oom = {"mb": 4036, "ok": False, "oom": True, "error": "OutOfMemoryError: CUDA out of memory"}
    # one slice of an H100 at --slice-memory 4GiB: budget 4292, cap 3780
    checks, found = prove.caps_checks("torch", 4292, 3780, 512, under, oom, 3268 + 400, 3268.0)
    assert set(statuses(checks).values()) == {PASS}, checks
    assert found["overhead_mb"] == 400 and found["suggested_reserve_mb"] == 512
    checks, found = prove.caps_checks("torch", 4292, 3780, 512, under, oom, 3268 + 530, 3268.0)
    assert statuses(checks)["torch: a full cap within the budget"] == FAIL
    assert found["above_budget_mb"] == 18 and found["suggested_reserve_mb"] == 640
    held = {**oom, "ok": True}
    other = {**oom, "oom": False, "error": "RuntimeError: CUDA driver error"}
    for past in (held, other):
        checks, _ = prove.caps_checks("torch", 4292, 3780, 512, under, past, 3700, 3268.0)
        assert statuses(checks)["torch: 4036 MiB past the cap"] == FAIL
    checks, _ = prove.caps_checks("jax", 4292, 3780, 512, under, oom, None, None)
    assert statuses(checks)["jax: NVML's figure"] == FAIL


def test_visible_devices():
    bare = H100.removeprefix("GPU-")
    assert prove.visible_check("torch", H100, {"count": 1, "uuid": bare}).status == PASS
    assert prove.visible_check("jax", H100, {"count": 1, "uuid": None}).status == PASS
    assert prove.visible_check("torch", H100, {"count": 2, "uuid": bare}).status == FAIL
    other = "GPU-00000000-0000-0000-0000-000000000000"
    assert prove.visible_check("torch", H100, {"count": 1, "uuid": other}).status == FAIL
    assert prove.visible_check("cupy", other, {"count": 0}, present=False).status == PASS
    assert prove.visible_check("cupy", other, {"count": 1}, present=False).status == FAIL
    assert prove.visible_check("jax", H100, {"error": "exit 1: boom"}).status == FAIL
    assert prove.same_uuid("MIG-ABC", "abc") and not prove.same_uuid(None, "abc")


# ---- the report ---------------------------------------------------------------------------


def test_a_section_concludes_from_its_checks():
    s = prove.Section("x", "X", checks=[Check("a", PASS), Check("b", FAIL, "why")]).conclude()
    assert (s.status, s.reason) == (FAIL, "b: why")
    s = prove.Section("x", "X", checks=[Check("a", SKIP, "no torch")]).conclude()
    assert (s.status, s.reason) == (SKIP, "no torch")
    assert (
        prove.Section("x", "X", checks=[Check("a", PASS), Check("b", SKIP)]).conclude().status
        == PASS
    )
    assert prove.Section("x", "X").conclude().status == SKIP


def test_the_report_says_the_whole_and_each_section():
    machine = {
        "hostname": "gpu-1",
        "gpus": "GPU 0: NVIDIA H200 (143771 MiB)",
        "driver": "580.159.03",
    }
    sections = [
        prove.Section("discovery", "D", checks=[Check("count", PASS, "1 / 1")]).conclude(),
        prove.Section("mps", "M", SKIP, "no MPS here"),
    ]
    report = prove.build_report(machine, sections, "2026-11-26 10:00:00 UTC", 93.42)
    assert report["status"] == PASS and report["summary"] == "1 passed, 0 failed, 1 skipped"
    text = prove.render(report)
    assert "NVIDIA H200 (143771 MiB); driver 580.159.03" in text
    assert "[SKIP] mps: M" in text and "no MPS here" in text and "pass count: 1 / 1" in text
    sections[1] = prove.Section("mps", "M", checks=[Check("x", FAIL, "no")]).conclude()
    assert prove.build_report(machine, sections, "t", 1)["status"] == FAIL
    skipped = prove.build_report({}, sections, "t", 1, no_gpu="nvidia-smi is not installed")
    assert skipped["status"] == SKIP
    assert skipped["summary"] == "skipped: no GPU (nvidia-smi is not installed)"
    back = prove.Section.from_dict(json.loads(json.dumps(report["sections"][0])))
    assert back == sections[0]


# ---- the script, end to end ---------------------------------------------------------------


def prove_sh(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 120):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(PROVE), str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PROVE_PYTHON": sys.executable, "TMPDIR": str(tmp_path), **(env or {})},
        check=False,
    )
    report = out / "report.json"
    return done, json.loads(report.read_text()) if report.exists() else None


def test_without_a_gpu_every_section_is_skipped_and_it_exits_0(tmp_path):
    done, report = prove_sh(tmp_path, env={"PROVE_NVIDIA_SMI": str(tmp_path / "no-nvidia-smi")})
    assert done.returncode == 0, done.stderr
    assert report["status"] == SKIP
    assert report["summary"].startswith("skipped: no GPU (")
    assert "no-nvidia-smi is not installed" in report["summary"]
    assert [s["name"] for s in report["sections"]] == list(run.SECTIONS)
    assert {s["status"] for s in report["sections"]} == {SKIP}
    assert "skipped: no GPU" in done.stdout
    assert (tmp_path / "out" / "report.txt").read_text().rstrip().endswith(report["summary"])
    assert (tmp_path / "out" / "logs.txt").read_text() == "(no logs)\n"
    # nvidia-ml-py came from the script's own wheels, and its scratch folder is gone
    assert "/gpu-prove." in report["machine"]["pynvml"]
    assert not list(tmp_path.glob("gpu-prove.*"))


def test_an_outdir_is_required(tmp_path):
    done = subprocess.run(["bash", str(PROVE)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "usage: tests/gpu/prove.sh OUTDIR" in done.stderr


def fake_nvidia_smi(tmp_path: Path, query: str, listed: str) -> str:
    """A stand-in nvidia-smi answering -L and --query-gpu with recorded outputs."""
    (tmp_path / "query.txt").write_text(query)
    (tmp_path / "list.txt").write_text(listed)
    (tmp_path / "machine.txt").write_text("NVIDIA H100 80GB HBM3, 81559, 580.159.04\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        textwrap.dedent(f"""\
            #!/bin/sh
            case "$1" in
              -L) cat {tmp_path}/list.txt ;;
              --query-gpu=name,memory.total,driver_version) cat {tmp_path}/machine.txt ;;
              --query-gpu=*) cat {tmp_path}/query.txt ;;
              *) exit 0 ;;
            esac
            """)
    )
    smi.chmod(0o755)
    return str(smi)


def test_discovery_with_the_fake_nvml_beside_a_recorded_nvidia_smi(tmp_path):
    fixture = str(FIXTURES / "h100-mig-7x1g.json")
    smi = fake_nvidia_smi(tmp_path, MIG_QUERY, MIG_LIST)
    args = ("--only", "discovery", "--nvml-fixture", fixture)
    done, report = prove_sh(tmp_path, *args, env={"PROVE_NVIDIA_SMI": smi})
    assert done.returncode == 0, done.stdout + done.stderr
    (section,) = report["sections"]
    assert section["status"] == PASS, section
    assert report["summary"].startswith("FAKE NVML (")
    advertised = {a["option"]: a["summary"] for a in section["findings"]["advertised"]}
    assert "7 GPU(s)" in advertised["--slices-per-gpu 3"]

    smi = fake_nvidia_smi(tmp_path, MIG_QUERY.replace("81559", "81920"), MIG_LIST)
    done, report = prove_sh(tmp_path, *args, env={"PROVE_NVIDIA_SMI": smi})
    assert done.returncode == 1
    (section,) = report["sections"]
    assert section["status"] == FAIL
    assert section["reason"] == "GPU 0 memory: NVML 81559 MiB / nvidia-smi 81920 MiB"


def test_a_section_without_its_framework_is_skipped_with_the_reason(tmp_path):
    here = [m for m in ("torch", "cupy", "jax") if importlib.util.find_spec(m) is not None]
    if here:
        pytest.skip(f"this python has {here}")
    smi = fake_nvidia_smi(tmp_path, H100_QUERY, H100_LIST)
    args = ("--nvml-fixture", str(FIXTURES / "h100x8.json"))
    # a python with none of the frameworks (the test's own), the fake NVML's GPUs
    done, report = prove_sh(tmp_path, *args, env={"PROVE_NVIDIA_SMI": smi})
    sections = {s["name"]: s for s in report["sections"]}
    assert sections["discovery"]["status"] == FAIL  # 8 GPUs in the fixture, 1 in nvidia-smi
    for name, framework in [
        ("guard-enforce", "neither torch nor cupy"),
        ("caps-torch", "torch cannot be imported"),
        ("caps-jax", "jax cannot be imported"),
        ("check-environment", "torch cannot be imported"),
    ]:
        assert sections[name]["status"] == SKIP
        assert sections[name]["reason"].startswith(framework), sections[name]
    assert [c["what"] for c in sections["visible-devices"]["checks"]] == ["torch", "cupy", "jax"]
    assert report["summary"].endswith("0 passed, 1 failed, 7 skipped")
    assert done.returncode == 1


#: PyTorch's calls that holder.py and the probes make, on no GPU: allocations are counted
#: against set_per_process_memory_fraction's share, and CUDA_VISIBLE_DEVICES is honoured.
FAKE_TORCH = """
import os
__version__ = "0.0+fake"
uint8 = "uint8"
MIB = 1 << 20
TOTAL = 81559 * MIB
UUID = "3f2a9c4e-81b7-4d2e-a6c5-000000000000"
_state = {"held": 0, "limit": TOTAL, "queued": []}

class OutOfMemoryError(RuntimeError):
    pass

class _Props:
    name = "NVIDIA H100 80GB HBM3"
    total_memory = TOTAL
    uuid = UUID

class cuda:
    OutOfMemoryError = OutOfMemoryError

    @staticmethod
    def _lazy_call(call, **kwargs):
        _state["queued"].append(call)

    @staticmethod
    def init():
        for call in _state["queued"]:
            call()

    @staticmethod
    def device_count():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 1 if visible is None or visible.endswith(UUID) else 0

    get_device_properties = staticmethod(lambda i: _Props())
    synchronize = staticmethod(lambda: None)
    empty_cache = staticmethod(lambda: None)
    memory_reserved = staticmethod(lambda i=0: _state["held"])

    @staticmethod
    def set_per_process_memory_fraction(fraction, device=0):
        _state["limit"] = int(fraction * TOTAL)

class _Buffer:
    def __init__(self, n):
        self.n = n
        _state["held"] += n

    def __del__(self):
        _state["held"] -= self.n

def empty(n, dtype=None, device=None):
    if _state["held"] + n > _state["limit"]:
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n // MIB} MiB")
    return _Buffer(n)

def zeros(n, device=None, dtype=None):
    return empty(n)
"""


def test_the_sections_code_runs_with_the_fake_nvml_and_a_stand_in_pytorch(tmp_path):
    """The guard stops the one process it was pointed at (a real SIGTERM to a process the
    script started) and leaves the other; the caps hold; the device is the one asked for."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
    smi = fake_nvidia_smi(tmp_path, H100_QUERY, H100_LIST)
    env = {
        "PROVE_NVIDIA_SMI": smi,
        "PYTHONPATH": str(fake),
        "FAKE_NVML_GPU": H100,  # the fake NVML counts the holders on this GPU
    }
    only = ["--only", "guard-enforce", "--only", "caps-torch", "--only", "visible-devices"]
    args = (*only, "--nvml-fixture", str(FIXTURES / "h100x8.json"))
    done, report = prove_sh(tmp_path, *args, env=env)
    sections = {s["name"]: s for s in report["sections"]}
    for name in ("guard-enforce", "caps-torch", "visible-devices"):
        assert sections[name]["status"] == PASS, (name, sections[name], done.stdout)
    enforce = sections["guard-enforce"]["findings"]
    assert enforce["signals_sent"] == [[enforce["target_pid"], signal.SIGTERM]]
    assert enforce["signals_refused"] == [] and enforce["target_exit"] == -signal.SIGTERM
    caps = sections["caps-torch"]["findings"]
    assert caps["budget_mb"] == 81559 // 19 and caps["applied"]["torch"].startswith("fraction")
    assert caps["past"]["oom"] and "OutOfMemoryError" in caps["past"]["error"]
    assert done.returncode == 0
    logs = (tmp_path / "out" / "logs.txt").read_text()
    assert "==> enforce-target.stderr" in logs and "==> caps-torch.log" in logs


def test_a_section_past_its_time_is_killed_with_what_it_started(tmp_path, monkeypatch):
    hang = tmp_path / "hang.py"
    pid_file = tmp_path / "child.pid"
    hang.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    monkeypatch.setattr(run, "SECTION_COMMAND", [sys.executable, str(hang)])
    args = SimpleNamespace(work=tmp_path, nvidia_smi="nvidia-smi", nvml_fixture="")
    t0 = time.monotonic()
    section = run.run_section("mps", 1, args, dict(os.environ))
    assert time.monotonic() - t0 < 30
    assert section.status == FAIL and section.reason.startswith("did not finish within 1 s")
    child = int(pid_file.read_text())
    try:
        for _ in range(50):
            if _state(child) in ("gone", "Z"):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the section's child {child} is still running")
    finally:
        if _state(child) not in ("gone", "Z"):
            os.kill(child, signal.SIGKILL)  # the test's own stray, when it failed


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
