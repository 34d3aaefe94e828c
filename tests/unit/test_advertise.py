"""The worker's daemon.json plan: slice maths, fake-NVML fixtures through the CLI, the NVIDIA
runtime, --dry-run and --remove."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import imported, shim_env
from worker_setup import advertise, slicing
from worker_setup.gpus import GPUInfo

from .nvml_failures import FAILURES, FIXTURES, K80_UUIDS, K80X2, fixture_failing, run

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text, mb",
    [("4GiB", 4096), ("4G", 4096), ("4096MiB", 4096), ("4096", 4096), ("1.5GiB", 1536)],
)
def test_sizes_are_read_in_mib(text, mb):
    assert slicing.parse_size_mb(text) == mb


@pytest.mark.parametrize("text", ["four", "4TB", "", "0"])
def test_unreadable_sizes_say_how_to_write_them(text):
    with pytest.raises(ValueError, match="4GiB|some memory"):
        slicing.parse_size_mb(text)


def test_slices_fixed_or_from_a_memory_budget():
    k80 = GPUInfo(0, "GPU-k", "Tesla K80", 11441)
    h100 = GPUInfo(1, "GPU-h", "H100", 81559)
    tiny = GPUInfo(2, "GPU-t", "tiny", 2048)
    assert slicing.slices_per_gpu([k80, h100], fixed=3) == {"GPU-k": 3, "GPU-h": 3}
    assert slicing.slices_per_gpu([k80, h100, tiny], slice_memory_mb=3800) == {
        "GPU-k": 3,
        "GPU-h": 21,
        "GPU-t": 1,  # smaller than a slice: still one
    }
    with pytest.raises(ValueError, match="either"):
        slicing.slices_per_gpu([k80], fixed=3, slice_memory_mb=4096)
    with pytest.raises(ValueError, match="1 or more"):
        slicing.slices_per_gpu([k80], fixed=0)


def test_k80_fixture_gives_three_slices_each_and_labels(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=FIXTURES / "k80x2.json")
    assert rc == advertise.CHANGED
    resources = config["node-generic-resources"]
    # 3 slices and Swarm's spare unit (contract.SWARM_SPARE), which the label records
    assert resources == [
        "GPU-6b3c1f0e-4a5d-2c8e-9f1a-000000000000=4",
        "GPU-6b3c1f0e-4a5d-2c8e-9f1a-000000000001=4",
    ]
    assert "gpu-jupyterhub.swarm-spare=1" in config["labels"]
    assert "gpu-jupyterhub.gpu-model=Tesla K80" in config["labels"]
    assert "gpu-jupyterhub.slice-memory-mb=3813" in config["labels"]
    assert "Tesla K80 11441 MiB -> 3 slices" in capsys.readouterr().out


def test_h100_fixture_sliced_by_memory(tmp_path):
    rc, config = run(tmp_path, "--slice-memory", "10GiB", nvml=FIXTURES / "h100x8.json")
    assert rc == advertise.CHANGED
    resources = config["node-generic-resources"]
    assert len(resources) == 8 and all(r.endswith("=8") for r in resources)  # 7 + spare
    assert "gpu-jupyterhub.gpu-count=8" in config["labels"]
    assert "gpu-jupyterhub.slices-per-gpu=7" in config["labels"]


@pytest.mark.parametrize(
    "fixture, advice", [("no-driver.json", "install the driver"), ("mismatch.json", "reboot")]
)
def test_nvml_failures_stop_with_advice_and_write_nothing(tmp_path, capsys, fixture, advice):
    rc, config = run(tmp_path, nvml=FIXTURES / fixture)
    assert rc == 1 and config is None
    (line,) = capsys.readouterr().err.splitlines()
    assert advice in line and "--simulate-gpus" in line


def test_plan_says_why_there_is_no_gpu(tmp_path):
    """The worker setup's way in: an exception with the one line, nothing written."""
    args = advertise.parse_args([])
    with imported(FIXTURES / "no-driver.json"), pytest.raises(advertise.PlanError, match="install"):
        advertise.plan(args, tmp_path / "daemon.json")
    assert not (tmp_path / "daemon.json").exists()


def test_plan_gives_the_gpus_the_change_and_its_diff_without_writing(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    args = advertise.parse_args(["--nvidia-runtime", "off"])
    notes = []
    with imported(K80X2):
        planned = advertise.plan(args, path, say=notes.append)
        assert [g.uuid for g in planned.gpus] == K80_UUIDS
        assert planned.slices == dict.fromkeys(K80_UUIDS, 3)
        assert planned.changes and planned.current == {"debug": True}
        assert f'+    "{K80_UUIDS[0]}=4",' in planned.diff()  # 3 slices and the spare
        assert planned.gpu_lines()[0] == f"GPU 0: {K80_UUIDS[0]} Tesla K80 11441 MiB -> 3 slices"
        assert planned.runtime_lines()[0].startswith("warning: nvidia-container-runtime not found")
        assert notes == []
        assert path.read_text() == '{"debug": true}'
        advertise.write(path, planned.wanted)
        again = advertise.plan(args, path, say=notes.append)
        assert not again.changes and again.diff() == ""
        removed = advertise.plan(args, path, remove=True)
        assert removed.changes and removed.wanted == {"debug": True} and removed.gpus == []


def test_nvml_failure_falls_back_to_simulated_only_when_asked(tmp_path, capsys):
    rc, config = run(tmp_path, "--simulate-if-no-gpu", "2", nvml=FIXTURES / "mismatch.json")
    assert rc == advertise.CHANGED
    assert "gpu-jupyterhub.simulated=true" in config["labels"]
    assert "advertising SIMULATED GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("fixture", ["no-driver.json", "mismatch.json"])
def test_a_manager_without_gpu_advertises_nothing_when_gpus_are_optional(tmp_path, fixture):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"debug": True}))
    assert run(tmp_path, "--simulate-gpus", "2")[0] == advertise.CHANGED
    rc, config = run(tmp_path, "--none-if-no-gpu", nvml=FIXTURES / fixture)
    assert rc == advertise.CHANGED  # the simulated slices of an earlier demo are taken out
    assert config == {"debug": True}
    assert run(tmp_path, "--none-if-no-gpu", nvml=FIXTURES / fixture)[0] == 0


def test_nvidia_runtime_becomes_the_default_and_other_runtimes_stay(tmp_path):
    runtime = tmp_path / "nvidia-container-runtime"
    runtime.write_text("#!/bin/sh\n")
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"runtimes": {"runc-debug": {"path": "/usr/bin/runc"}}}))
    args = ["--daemon-json", str(path), "--nvidia-runtime", str(runtime)]
    with imported(K80X2):
        assert advertise.main(args) == advertise.CHANGED
        config = json.loads(path.read_text())
        assert config["default-runtime"] == "nvidia"
        assert config["runtimes"]["nvidia"]["path"] == str(runtime)
        assert config["runtimes"]["runc-debug"] == {"path": "/usr/bin/runc"}
        assert advertise.main(args) == 0


def test_the_managers_registry_is_trusted_once(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"insecure-registries": ["old:5000"]}))
    args = ["--simulate-gpus", "1", "--registry", "10.0.0.5:5000"]
    rc, config = run(tmp_path, *args)
    assert rc == advertise.CHANGED
    assert config["insecure-registries"] == ["old:5000", "10.0.0.5:5000"]
    assert run(tmp_path, *args)[0] == 0


def test_remove_takes_out_only_what_advertise_added(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"debug": True, "labels": ["rack=7"]}))
    assert run(tmp_path, "--simulate-gpus", "2")[0] == advertise.CHANGED
    rc, config = run(tmp_path, "--remove")
    assert rc == advertise.CHANGED
    assert config == {"debug": True, "labels": ["rack=7"]}
    assert run(tmp_path, "--remove")[0] == 0


# A GPU failing after NVML started (or NVML failing at any other call) is a machine without a
# usable GPU: one line naming the GPU and the fix, then simulate / none / stop as the options say.


@pytest.mark.parametrize("call", list(FAILURES))
def test_a_failing_nvml_call_stops_with_one_line_and_changes_nothing(tmp_path, call):
    fail, line = FAILURES[call]
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    result = subprocess.run(
        [sys.executable, "-m", "worker_setup.advertise", "--daemon-json", str(path),
         "--nvidia-runtime", "off"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=shim_env(fixture_failing(tmp_path, fail)),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    fake, *lines = result.stderr.splitlines()
    assert fake.startswith("FAKE NVML: GPUs from the fixture ")
    assert len(lines) == 1, result.stderr  # no traceback
    assert lines[0].startswith(line)
    assert lines[0].endswith("pass --simulate-gpus N instead.")
    if call in fake_nvml.GPU_CALLS:
        assert "this machine advertises none of its GPUs, not even the working ones" in lines[0]
    assert path.read_text() == '{"debug": true}'
    assert not list(tmp_path.glob("daemon.json.bak-*"))


@pytest.mark.parametrize("call", list(FAILURES))
def test_a_failing_nvml_call_falls_back_to_simulated_gpus_when_asked(tmp_path, capsys, call):
    fail, line = FAILURES[call]
    fixture = str(fixture_failing(tmp_path, fail))
    rc, config = run(tmp_path, "--simulate-if-no-gpu", "2", nvml=fixture)
    assert rc == advertise.CHANGED
    resources = config["node-generic-resources"]
    assert len(resources) == 2 and all(r.startswith("GPU-simulated-") for r in resources)
    assert not any(uuid in json.dumps(config) for uuid in K80_UUIDS), "no real GPU of the two"
    assert "gpu-jupyterhub.simulated=true" in config["labels"]
    out = capsys.readouterr().out
    assert f"no NVIDIA GPU usable here ({line}" in out and "advertising SIMULATED GPUs" in out


@pytest.mark.parametrize("call", list(FAILURES))
def test_a_failing_nvml_call_advertises_nothing_when_gpus_are_optional(tmp_path, capsys, call):
    fail, line = FAILURES[call]
    assert run(tmp_path, nvml=K80X2)[0] == advertise.CHANGED
    fixture = str(fixture_failing(tmp_path, fail))
    rc, config = run(tmp_path, "--none-if-no-gpu", nvml=fixture)
    assert rc == advertise.CHANGED  # the two GPUs advertised before are taken out, GPU 0 too
    assert config == {}
    out = capsys.readouterr().out
    assert f"no NVIDIA GPU usable here ({line}" in out
    assert "this machine advertises no GPU slices" in out


def test_one_lost_gpu_of_four_stops_the_machine_naming_that_gpu(tmp_path, capsys):
    rc, _ = run(tmp_path, nvml=FIXTURES / "h100x4-gpu1-lost.json")
    assert rc == 1
    (message,) = capsys.readouterr().err.splitlines()
    assert message.startswith(
        "GPU 1 (PCI 00000000:2A:00.0) failed: GPU is lost; reboot the machine or reset the GPU "
        "with nvidia-smi -r, then run this again. "
    )
    assert "none of its GPUs, not even the working ones" in message
    assert not (tmp_path / "daemon.json").exists()
