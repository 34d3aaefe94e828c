"""MIG: a GPU in MIG mode is advertised as its MIG instances, each a GPU kind of its own that the
spawner places on like any GPU and hands to the container (fake NVML fixtures; no GPU here)."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from jupyterhub.objects import Hub

from deploy.status import render
from gpu_swarm_spawner import broker, contract, placement
from gpu_swarm_spawner.inventory import build_inventory, task_reservations
from gpu_swarm_spawner.spawner import GPUSwarmSpawner
from tests.fakes.nvml import FakeNVML, shim_env
from worker_setup import advertise, gpus, slicing

from .clusters import node, task
from .nvml_failures import (
    FIXTURES,
    MIG_FAILURES,
    MIXED_GPU_UUIDS,
    MIXED_MIG,
    MIXED_MIG_UUIDS,
    fixture_failing,
    run,
)

REPO = Path(__file__).resolve().parents[2]
H100_MIG = FIXTURES / "h100-mig-7x1g.json"
A100_MIXED = FIXTURES / "a100-mig-mixed.json"
NO_INSTANCES = FIXTURES / "h100-mig-none.json"
H100_PARENT = "GPU-7c1d4e2a-5b6f-4a3c-9d8e-000000000000"
H100_MIGS = [f"MIG-2a7e9c1b-3d4f-5a6b-8c9d-00000000000{i}" for i in range(7)]
A100_PARENT = "GPU-1e4b7a90-2c3d-4e5f-8a7b-000000000000"
A100_MIGS = [f"MIG-5f0c3a8d-1b2e-4c7d-9e6f-00000000000{i}" for i in range(3)]


# ---- discovery ----------------------------------------------------------------------------


def test_discover_reads_each_mig_instance_with_its_uuid_memory_and_profile():
    (gpu,) = gpus.discover(FakeNVML(json.loads(A100_MIXED.read_text())))
    assert gpu.uuid == A100_PARENT and gpu.mig_mode and not gpu.is_mig
    assert [
        (m.index, m.uuid, m.profile, m.memory_mb, m.parent_uuid) for m in gpu.mig_instances
    ] == [
        (0, A100_MIGS[0], "3g.40gb", 40192, A100_PARENT),
        (0, A100_MIGS[1], "2g.20gb", 19968, A100_PARENT),
        (0, A100_MIGS[2], "1g.10gb", 9728, A100_PARENT),
    ]
    assert gpu.mig_instances[0].name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"  # as NVML names it
    assert all(m.is_mig for m in gpu.mig_instances)


def test_gpus_without_mig_or_with_mig_off_are_whole_gpus():
    """No "mig_mode" in a fixture: NVML answers Not Supported (a K80); mig_mode 0: MIG off."""
    k80 = gpus.discover(FakeNVML(json.loads((FIXTURES / "k80x2.json").read_text())))
    mixed = gpus.discover(FakeNVML(json.loads(MIXED_MIG.read_text())))
    assert not any(g.mig_mode or g.mig_instances for g in k80)
    assert not mixed[0].mig_mode and mixed[1].mig_mode and mixed[2].mig_mode
    units, notes = gpus.advertised(k80)
    assert units == k80 and notes == []


def test_a_driver_without_mig_calls_gives_whole_gpus():
    nvml = FakeNVML(
        {
            **json.loads(H100_MIG.read_text()),
            "fail": {"nvmlDeviceGetMigMode": {"error": "FunctionNotFound"}},
        }
    )
    (gpu,) = gpus.discover(nvml)
    assert not gpu.mig_mode and gpus.advertised([gpu])[0] == [gpu]


def test_empty_mig_slots_are_skipped_and_the_parent_is_replaced_by_its_instances():
    found = gpus.discover(FakeNVML(json.loads(MIXED_MIG.read_text())))
    units, notes = gpus.advertised(found)
    assert [u.uuid for u in units] == [MIXED_GPU_UUIDS[0], *MIXED_MIG_UUIDS]
    assert MIXED_GPU_UUIDS[1] not in [u.uuid for u in units]  # the parent of the instances
    (note,) = notes
    assert note.startswith(f"GPU 2 ({MIXED_GPU_UUIDS[2]}) is in MIG mode but has no MIG instances")
    assert "nvidia-smi mig -i 2 -cgi" in note and "-C" in note and "\n" not in note


@pytest.mark.parametrize("call", list(MIG_FAILURES))
def test_a_failure_at_each_mig_call_is_one_line_with_the_fix(call):
    fail, line = MIG_FAILURES[call]
    nvml = FakeNVML({**json.loads(MIXED_MIG.read_text()), "fail": fail})
    with pytest.raises(gpus.GPUFailed) as failed:
        gpus.discover(nvml)
    assert str(failed.value).startswith(line) and "\n" not in str(failed.value)
    assert isinstance(failed.value.__cause__, pynvml.NVMLError)
    assert failed.value.index == 1 and nvml.shutdowns == 1


@pytest.mark.parametrize(
    "call, slot, named",
    [
        ("nvmlDeviceGetUUID", 2, f"{MIXED_GPU_UUIDS[1]}, MIG instance 2"),
        ("nvmlDeviceGetName", 0, f"{MIXED_GPU_UUIDS[1]}, MIG instance 0 {MIXED_MIG_UUIDS[0]}"),
        (
            "nvmlDeviceGetMemoryInfo",
            2,
            f"{MIXED_GPU_UUIDS[1]}, MIG instance 2 {MIXED_MIG_UUIDS[1]}",
        ),
    ],
)
def test_a_failing_mig_instance_is_named_by_its_gpu_and_slot(call, slot, named):
    fail = {call: {"gpu": 1, "mig": slot, "error": "GpuIsLost"}}
    nvml = FakeNVML({**json.loads(MIXED_MIG.read_text()), "fail": fail})
    with pytest.raises(gpus.GPUFailed, match=r"^GPU 1 \((.*)\) failed: GPU is lost") as failed:
        gpus.discover(nvml)
    assert failed.value.ident == named


def test_the_fake_checks_mig_instances_and_mig_failures():
    with pytest.raises(ValueError, match=r"mig_instances\[0\]: give each MIG instance a uuid"):
        FakeNVML({"gpus": [{"uuid": "GPU-1", "name": "A", "memory_mb": 1, "mig_instances": [{}]}]})
    with pytest.raises(ValueError, match="a MIG slot"):
        FakeNVML({"fail": {"nvmlDeviceGetUUID": {"gpu": 0, "mig": "x", "error": "GpuIsLost"}}})


# ---- advertising --------------------------------------------------------------------------


def test_h100_with_seven_instances_advertises_seven_kinds_and_not_the_gpu(tmp_path, capsys):
    rc, config = run(tmp_path, "--slices-per-gpu", "4", nvml=H100_MIG)
    assert rc == advertise.CHANGED
    # one slice each, and Swarm's spare unit (contract.SWARM_SPARE)
    assert config["node-generic-resources"] == [f"{uuid}=2" for uuid in H100_MIGS]
    assert H100_PARENT not in json.dumps(config)
    labels = config["labels"]
    for uuid in H100_MIGS:
        assert f"gpu-jupyterhub.memory-mb.{uuid}=9856" in labels
        assert f"gpu-jupyterhub.mig-profile.{uuid}=1g.10gb" in labels
    out = capsys.readouterr().out
    assert (
        f"GPU 0 MIG: {H100_MIGS[0]} NVIDIA H100 80GB HBM3 MIG 1g.10gb 9856 MiB -> 1 slices "
        "(MIG, hardware-isolated)" in out
    )


def test_mig_slices_split_each_instance(tmp_path):
    rc, config = run(tmp_path, "--mig-slices", "2", nvml=A100_MIXED)
    assert rc == advertise.CHANGED
    assert config["node-generic-resources"] == [f"{uuid}=3" for uuid in A100_MIGS]  # 2 + spare
    assert "gpu-jupyterhub.memory-mb." + A100_MIGS[1] + "=19968" in config["labels"]
    assert "gpu-jupyterhub.mig-profile." + A100_MIGS[1] + "=2g.20gb" in config["labels"]


def test_mig_slices_must_be_one_or_more(capsys):
    with pytest.raises(SystemExit):
        advertise.parse_args(["--mig-slices", "0"])
    assert "--mig-slices must be 1 or more, got 0" in capsys.readouterr().err


def test_slicing_gives_mig_instances_their_own_count():
    whole = gpus.GPUInfo(0, "GPU-a", "A100", 81920)
    mig = gpus.GPUInfo(1, "MIG-b", "A100 MIG 3g.40gb", 40192, parent_uuid="GPU-c")
    assert slicing.slices_per_gpu([whole, mig], fixed=3) == {"GPU-a": 3, "MIG-b": 1}
    by_memory = slicing.slices_per_gpu([whole, mig], slice_memory_mb=10240, mig_slices=2)
    assert by_memory == {"GPU-a": 8, "MIG-b": 2}
    with pytest.raises(ValueError, match="MIG instance must be 1 or more"):
        slicing.slices_per_gpu([mig], fixed=1, mig_slices=0)


def test_a_mixed_machine_advertises_whole_gpus_and_instances_and_names_the_empty_one(
    tmp_path, capsys
):
    rc, config = run(tmp_path, nvml=MIXED_MIG)
    assert rc == advertise.CHANGED
    assert config["node-generic-resources"] == [
        f"{MIXED_GPU_UUIDS[0]}=4",  # 3 slices and the spare unit
        *(f"{uuid}=2" for uuid in MIXED_MIG_UUIDS),
    ]
    assert MIXED_GPU_UUIDS[1] not in json.dumps(config)
    assert MIXED_GPU_UUIDS[2] not in json.dumps(config)
    out = capsys.readouterr().out
    assert f"GPU 2 ({MIXED_GPU_UUIDS[2]}) is in MIG mode but has no MIG instances" in out


def test_a_machine_whose_only_gpu_has_no_instances_stops_with_the_fix(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=NO_INSTANCES)
    assert rc == 1 and config is None
    (line,) = capsys.readouterr().err.splitlines()
    assert "is in MIG mode but has no MIG instances" in line
    assert "nvidia-smi mig -i 0 -cgi" in line and "never changes MIG mode" in line


def test_a_manager_with_an_empty_mig_gpu_advertises_nothing_when_gpus_are_optional(tmp_path):
    rc, config = run(tmp_path, "--none-if-no-gpu", nvml=NO_INSTANCES)
    assert rc == 0 and config is None


def test_instances_gone_since_the_last_run_are_taken_out(tmp_path):
    """Re-running after an admin destroyed the instances (and turned MIG off) leaves no stale
    MIG kind or label behind."""
    run(tmp_path, nvml=H100_MIG)
    fixture = json.loads(H100_MIG.read_text())
    fixture["gpus"][0]["mig_mode"] = 0
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(fixture))
    rc, config = run(tmp_path, nvml=path)
    assert rc == advertise.CHANGED
    assert config["node-generic-resources"] == [f"{H100_PARENT}=4"]  # 3 and the spare
    assert "MIG-" not in json.dumps(config)


def test_remove_takes_the_mig_kinds_out_too(tmp_path):
    assert run(tmp_path, nvml=H100_MIG)[0] == advertise.CHANGED
    rc, config = run(tmp_path, "--remove")
    assert rc == advertise.CHANGED and config == {}


def test_a_failing_mig_call_stops_the_machine_with_one_line(tmp_path):
    fail, line = MIG_FAILURES["nvmlDeviceGetMaxMigDeviceCount"]
    result = subprocess.run(
        [sys.executable, "-m", "worker_setup.advertise", "--daemon-json",
         str(tmp_path / "daemon.json"), "--nvidia-runtime", "off"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env=shim_env(fixture_failing(tmp_path, fail, base=MIXED_MIG)),
    )  # fmt: skip
    assert result.returncode == 1
    fake, message = result.stderr.splitlines()
    assert fake.startswith("FAKE NVML: GPUs from the fixture ")
    assert message.startswith(line) and "not even the working ones" in message


def test_the_worker_setup_takes_mig_slices():
    from worker_setup.__main__ import parse_args

    args = parse_args(["--manager", "10.0.0.5", "--token", "SWMTKN-1-x", "--mig-slices", "3"])
    assert args.mig_slices == 3
    assert parse_args(["--manager", "10.0.0.5", "--token", "SWMTKN-1-x"]).mig_slices == 1


# ---- the spawner's side -------------------------------------------------------------------

MIG_NODE = {MIXED_GPU_UUIDS[0]: 3, MIXED_MIG_UUIDS[0]: 1, MIXED_MIG_UUIDS[1]: 2}


def test_contract_names_mig_kinds():
    assert contract.KIND_PREFIXES == ("GPU-", "MIG-")
    assert contract.is_mig(MIXED_MIG_UUIDS[0]) and not contract.is_mig(MIXED_GPU_UUIDS[0])


def test_inventory_counts_mig_kinds_and_their_reservations():
    nodes = [node("n1", "gpu-a", MIG_NODE)]
    tasks = [task("n1", {MIXED_MIG_UUIDS[1]: 1}, service_id="s1")]
    assert task_reservations(tasks[0]) == {MIXED_MIG_UUIDS[1]: 1}
    found = {g.uuid: g for g in build_inventory(nodes, tasks)}
    assert set(found) == set(MIG_NODE)  # "fpga" stays out
    assert found[MIXED_MIG_UUIDS[1]].used == 1 and found[MIXED_MIG_UUIDS[1]].free == 1
    assert found[MIXED_MIG_UUIDS[0]].mig and not found[MIXED_GPU_UUIDS[0]].mig
    # one prefix (the old gpu_kind_prefix) still selects only its kinds
    assert [g.uuid for g in build_inventory(nodes, tasks, "GPU-")] == [MIXED_GPU_UUIDS[0]]


def test_placement_lands_on_a_mig_instance_and_a_full_one_takes_all_its_slices():
    nodes = [node("n1", "gpu-a", {MIXED_MIG_UUIDS[0]: 1, MIXED_MIG_UUIDS[1]: 1})]
    tasks = [task("n1", {MIXED_MIG_UUIDS[0]: 1}, service_id="s1")]
    inventory = build_inventory(nodes, tasks)
    assert placement.choose(inventory, 1).uuid == MIXED_MIG_UUIDS[1]
    assert placement.choose(inventory, None).uuid == MIXED_MIG_UUIDS[1]
    full = build_inventory(nodes, [*tasks, task("n1", {MIXED_MIG_UUIDS[1]: 1}, service_id="s2")])
    assert placement.choose(full, 1) is None


def make_spawner(**kwargs):
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/")
    return GPUSwarmSpawner(user=user, hub=Hub(), **kwargs)


def hold(spawner, uuid, slices, total, memory_mb=40192):
    gpu = build_inventory(
        [{**node("n1", "gpu-a", {uuid: total}), "Description": {
            "Hostname": "gpu-a",
            "Resources": {"GenericResources": [
                {"DiscreteResourceSpec": {"Kind": uuid, "Value": total}}]},
            "Engine": {"Labels": {contract.MEMORY_LABEL + uuid: str(memory_mb)}},
        }}],
        [],
    )[0]  # fmt: skip
    spawner.attempt.progress.clear()
    spawner._hold(broker.Reservation(gpu, slices), 1)
    return spawner


def test_the_container_of_a_mig_instance_sees_it_and_is_told_it_is_isolated():
    spawner = hold(make_spawner(), MIXED_MIG_UUIDS[0], 1, 1)
    env = spawner.get_env()
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == MIXED_MIG_UUIDS[0]
    assert env["GPU_UUID"] == MIXED_MIG_UUIDS[0]
    assert env["GPU_ISOLATION"] == "mig"
    assert env["GPU_MEMORY_FRACTION"] == "1.000"
    assert env["GPU_MEMORY_LIMIT_MB"] == "40192"
    (event,) = spawner.attempt.progress
    assert event["message"] == (
        f"Reserving 1 slice(s) of MIG instance {MIXED_MIG_UUIDS[0]} on gpu-a (hardware-isolated)"
    )


def test_a_shared_gpu_is_said_to_be_shared_with_its_memory_fraction():
    spawner = hold(make_spawner(), MIXED_GPU_UUIDS[0], 1, 3, memory_mb=81920)
    env = spawner.get_env()
    assert env["GPU_ISOLATION"] == "shared"
    assert env["GPU_MEMORY_FRACTION"] == "0.333"
    assert env["GPU_MEMORY_LIMIT_MB"] == "27306"
    assert "hardware-isolated" not in spawner.attempt.progress[0]["message"]
    assert hold(make_spawner(), MIXED_GPU_UUIDS[0], 2, 3).get_env()["GPU_MEMORY_FRACTION"] == (
        "0.667"
    )
    assert hold(make_spawner(), MIXED_MIG_UUIDS[1], 1, 2).get_env()["GPU_MEMORY_FRACTION"] == (
        "0.500"
    )


def test_kind_prefixes_default_to_gpus_and_mig_and_the_old_name_still_works(caplog):
    assert make_spawner().gpu_kind_prefixes == ["GPU-", "MIG-"]
    old = make_spawner(gpu_kind_prefix="GPU-")
    assert old.gpu_kind_prefixes == ["GPU-"]
    assert "gpu_kind_prefix is deprecated" in caplog.text and "gpu_kind_prefixes" in caplog.text


def test_kind_prefixes_refuse_an_empty_prefix():
    from traitlets import TraitError

    with pytest.raises(TraitError, match="none may be empty"):
        make_spawner(gpu_kind_prefixes=["GPU-", ""])


def test_status_marks_mig_instances_and_servers_on_them():
    nodes = [node("n1", "gpu-a", MIG_NODE)]
    tasks = [task("n1", {MIXED_MIG_UUIDS[0]: 1}, service_id="s1")]
    services = [{"ID": "s1", "Spec": {"Name": "jy-alice", "Labels": {contract.USER_LABEL: "a"}}}]
    lines = render(nodes, tasks, services).splitlines()
    assert any(
        line.split()[:6] == ["gpu-a", "ready", "active", "3", "(2", "MIG)"] for line in lines
    )
    assert any(line.split()[:5] == ["jy-alice", "a", "gpu-a", MIXED_MIG_UUIDS[0], "(MIG)"]
               for line in lines)  # fmt: skip


@pytest.mark.parametrize(
    "isolation, says",
    [("mig", "hardware-isolated"), ("shared", "(guarded: above it you are warned")],
)
def test_gpu_info_says_whether_the_slice_is_isolated_in_hardware(isolation, says):
    env = {"PATH": "/usr/bin:/bin", "GPU_UUID": "MIG-x", "GPU_MEMORY_LIMIT_MB": "9856",
           "GPU_ISOLATION": isolation, "GPU_MEMORY_FRACTION": "1.000"}  # fmt: skip
    out = subprocess.run(
        ["sh", str(REPO / "images/singleuser/gpu-info")], env=env, capture_output=True, text=True
    ).stdout
    assert says in out and "memory budget: 9856 MiB" in out
    assert "not enforced" not in out
    assert ("hardware-isolated" in out) == (isolation == "mig")
    assert "memory share:  1.000" in out
