"""GPU machines as NVML reports them (issue 30, class 6): each fixture of the corpus fed through
the join's plan (``python -m worker_setup.advertise``, the steps ``python -m worker_setup``
takes), on to the daemon.json it writes, the node Docker then reports, the spawner's inventory,
the budget label of a server's container and the GPU guard's budgets. Every answer is either
advertised so that each slice has a budget the guard holds, or skipped or refused with one
line naming it and the fix."""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Hub

from deploy import settings
from gpu_swarm_spawner import broker, contract
from gpu_swarm_spawner.contract import MAX_SLICES_PER_GPU
from gpu_swarm_spawner.inventory import build_inventory
from gpu_swarm_spawner.spawner import GPUSwarmSpawner
from tests.fakes.nvml import FakeNVML
from worker_setup import advertise, daemon_config, gpus, guard_attribution, slicing, usable

from .clusters import node_from_daemon_json
from .nvml_failures import FIXTURES, K80X2, run

H100X4_ZERO = FIXTURES / "h100x4-gpu2-zero-memory.json"
H100_ZERO_UUIDS = [f"GPU-0a6f3c91-7d2e-4b58-a1c4-00000000000{i}" for i in range(4)]
MIG_ZERO = FIXTURES / "a100-mig-instance-zero-memory.json"
MIG_ZERO_UUIDS = [f"MIG-c41a9e27-5d3b-4f80-a6e2-00000000000{i}" for i in range(3)]
ODD_NAMES = FIXTURES / "odd-names.json"
SAME_UUID = "GPU-5f8c2e61-0b4d-4a97-8e3c-6d1f0a2b9c74"
REPO = Path(__file__).resolve().parents[2]


def make_spawner():
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/")
    return GPUSwarmSpawner(user=user, hub=Hub())


def guard_budget(gpu, slices: int) -> int | None:
    """The budget the GPU guard holds a server of ``slices`` slices of ``gpu`` to: the spawner
    labels its container, the guard reads the labels back (None: no budget, not guarded)."""
    spawner = make_spawner()
    spawner.attempt.progress.clear()
    spawner._hold(broker.Reservation(gpu, slices), 1)
    container = {
        "Id": "c" * 64,
        "Labels": {**spawner.container_labels(), contract.DOCKER_SERVICE_LABEL: "jy-alice"},
    }
    servers, problems = guard_attribution.servers_from([container])
    assert problems == []
    budget = guard_attribution.budgets_of(servers.values()).get("jy-alice")
    return None if budget is None else budget.limit_mb


def follow(config: dict) -> list:
    """What the hub makes of a machine with daemon.json ``config``: its inventory, checked to
    hold every promise the labels make and to give every slice a budget the guard holds."""
    labels = config["labels"]
    keys = [label.split("=", 1)[0] for label in labels]
    assert len(keys) == len(set(keys)), "Docker refuses daemon.json labels given twice"
    for label in labels:
        assert not any(unicodedata.category(c) == "Cc" for c in label), label
        assert label.split("=", 1)[0].strip() == label.split("=", 1)[0], label
    inventory = build_inventory([node_from_daemon_json(config)], [])
    by_key = dict(label.split("=", 1) for label in labels)
    assert int(by_key["gpu-jupyterhub.gpu-count"]) == len(inventory)
    assert int(by_key["gpu-jupyterhub.slice-memory-mb"]) >= slicing.MIN_SLICE_MB
    for gpu in inventory:
        assert 1 <= gpu.slices <= MAX_SLICES_PER_GPU
        assert gpu.memory_mb > 0
        budget = guard_budget(gpu, 1)
        assert budget is not None and budget >= slicing.MIN_SLICE_MB, (gpu.uuid, budget)
        assert guard_budget(gpu, gpu.slices) == gpu.memory_mb  # a full GPU: all of it
    return inventory


# ---- the corpus: what is advertised, skipped or refused ----------------------------------


def test_a_well_reported_machine_gives_every_slice_a_guarded_budget(tmp_path):
    """The corpus's baseline: two K80 halves, 3 slices each, 3813 MiB a slice."""
    rc, config = run(tmp_path, nvml=K80X2)
    assert rc == advertise.CHANGED
    inventory = follow(config)
    assert [(g.slices, g.memory_budget_mb(1)) for g in inventory] == [(3, 3813), (3, 3813)]


def test_a_gpu_advertised_with_0_mib_as_before_would_run_unguarded():
    """What the join wrote for a GPU reporting 0 MiB before it was screened: slices whose
    servers get no budget, so the guard never holds them to one. ``follow`` refuses it."""
    zero = gpus.GPUInfo(2, H100_ZERO_UUIDS[2], "NVIDIA H100 80GB HBM3", 0)
    slices = {zero.uuid: 3}
    config = {
        "node-generic-resources": daemon_config.slice_resources(slices),
        "labels": daemon_config.engine_labels([zero], slices),
    }
    (gpu,) = build_inventory([node_from_daemon_json(config)], [])
    assert gpu.slices == 3 and guard_budget(gpu, 1) is None
    with pytest.raises(AssertionError):
        follow(config)


def test_a_gpu_reporting_0_mib_is_skipped_with_a_warning_and_the_rest_are_advertised(
    tmp_path, capsys
):
    rc, config = run(tmp_path, nvml=H100X4_ZERO)
    assert rc == advertise.CHANGED
    inventory = follow(config)
    kept = [H100_ZERO_UUIDS[i] for i in (0, 1, 3)]
    assert [g.uuid for g in inventory] == kept
    assert H100_ZERO_UUIDS[2] not in json.dumps(config)
    assert "gpu-jupyterhub.gpu-count=3" in config["labels"]
    out = capsys.readouterr().out
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: GPU")]
    assert warning.startswith(
        f"warning: GPU 2 ({H100_ZERO_UUIDS[2]}, NVIDIA H100 80GB HBM3, 0 MiB) reports 0 MiB of "
        "memory, less than the 256 MiB one slice needs, so it is skipped"
    )
    assert "nvidia-smi -i 2" in warning and "nvidia-smi -r -i 2" in warning
    assert warning.endswith("then run this again")


def test_a_mig_instance_reporting_0_mib_is_skipped_and_its_siblings_advertised(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=MIG_ZERO)
    assert rc == advertise.CHANGED
    assert [g.uuid for g in follow(config)] == MIG_ZERO_UUIDS[:2]
    out = capsys.readouterr().out
    assert (
        f"warning: MIG instance {MIG_ZERO_UUIDS[2]} of GPU 0 (NVIDIA A100-PCIE-40GB MIG 1g.5gb, "
        "0 MiB) reports 0 MiB of memory" in out
    )
    assert "nvidia-smi mig -i 0 -lgi" in out


def test_memory_nvml_cannot_give_is_skipped_like_none(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=FIXTURES / "h100x2-memory-not-available.json")
    assert rc == advertise.CHANGED
    (gpu,) = follow(config)
    assert gpu.uuid.endswith("000000000000")
    assert "reports 17592186044415 MiB of memory, more than any GPU has" in capsys.readouterr().out


def test_a_machine_whose_every_gpu_reports_0_mib_is_refused(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=FIXTURES / "t4x2-zero-memory.json")
    assert rc == 1 and config is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("GPU 0 (GPU-9e2d4b17-3c8a-4f06-b5e1-000000000000, Tesla T4, 0 MiB)")
    assert "; GPU 1 (" in line and line.endswith("pass --simulate-gpus N instead.")


def test_two_gpus_with_one_uuid_are_refused_naming_both_and_the_fix(tmp_path, capsys):
    """Refused, not advertised as one: the runtime gives a container the GPU by UUID and the
    guard reads memory by UUID, so neither can tell the two apart."""
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    rc, config = run(tmp_path, nvml=FIXTURES / "t4x2-passthrough-same-uuid.json")
    assert rc == 1 and config == {"debug": True}
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"GPU 0 and GPU 1 report one UUID, {SAME_UUID}: ")
    assert "give each GPU its own UUID" in line and "pass each GPU through" in line
    assert not list(tmp_path.glob("daemon.json.bak-*"))


def test_two_gpus_with_one_uuid_fall_back_to_simulated_ones_only_when_asked(tmp_path, capsys):
    rc, config = run(
        tmp_path, "--simulate-if-no-gpu", "1", nvml=FIXTURES / "t4x2-passthrough-same-uuid.json"
    )
    assert rc == advertise.CHANGED and SAME_UUID not in json.dumps(config)
    assert "no NVIDIA GPU usable here (GPU 0 and GPU 1 report one UUID" in capsys.readouterr().out


def test_mig_instances_named_as_drivers_before_r470_did_are_refused(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=FIXTURES / "a100-mig-old-driver-uuid.json")
    assert rc == 1 and config is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "MIG instance of GPU 0 (NVIDIA A100-SXM4-40GB MIG 3g.20gb) reports the UUID "
        "'MIG-GPU-2c9f6a13-4e7b-4d20-95a8-000000000000/1/0', which cannot name a GPU to Swarm"
    )
    assert "update the NVIDIA driver (470 or newer)" in line


def test_an_unknown_error_on_one_gpu_stops_the_machine_naming_it(tmp_path, capsys):
    """NVML_ERROR_UNKNOWN, as a GPU mid-reset answers: a failed GPU, like a lost one."""
    rc, config = run(tmp_path, nvml=FIXTURES / "h100x2-gpu1-unknown-error.json")
    assert rc == 1 and config is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "GPU 1 (GPU-b82e5d19-6a07-4c3f-9e14-000000000001) failed: Unknown Error; look at "
        "nvidia-smi and the kernel log (dmesg | grep -i xid)"
    )
    assert "none of its GPUs, not even the working ones" in line


def test_odd_names_become_one_clean_line_and_label_each(tmp_path, capsys):
    rc, config = run(tmp_path, nvml=ODD_NAMES)
    assert rc == advertise.CHANGED
    assert len(follow(config)) == 4
    model = next(x for x in config["labels"] if x.startswith("gpu-jupyterhub.gpu-model="))
    assert model == (
        "gpu-jupyterhub.gpu-model=GRID A100D-4C, NVIDIA Graphics Device, "
        "Quadro RTX 5000 with Max-Q Design, rev a1, unnamed GPU"
    )
    out = capsys.readouterr().out
    assert "GPU 2: GPU-e15b7c02-9a4f-4d38-8c61-000000000002 Quadro RTX 5000 with Max-Q " in out


def test_names_and_uuids_that_are_not_utf8_are_read_with_the_bad_bytes_replaced():
    """Older pynvml hands bytes over; newer decodes them itself and raises UnicodeDecodeError
    on bytes that are not UTF-8 (a corrupted VBIOS): neither is a traceback."""

    class StrictPynvml(FakeNVML):
        def nvmlDeviceGetName(self, handle):  # as pynvml's convertStrBytes does
            return super().nvmlDeviceGetName(handle).decode()

    spec = {"gpus": [{"uuid": "GPU-a1b2", "name": b"Tesla\xff T4", "memory_mb": 15360}]}
    (old,) = gpus.discover(FakeNVML(spec))
    (new,) = gpus.discover(StrictPynvml(spec))
    assert old.name == new.name == "Tesla\ufffd T4"
    bad_uuid = {"gpus": [{"uuid": b"GPU-a1\xffb2", "name": "Tesla T4", "memory_mb": 15360}]}
    (gpu,) = gpus.discover(FakeNVML(bad_uuid))
    assert "cannot name a GPU to Swarm" in usable.screen([gpu]).refusal


# ---- slices the hub would not use ----------------------------------------------------------


SLICE_KEYS = ("GPUHUB_SLICES_PER_GPU", "GPUHUB_SLICES_PER_SERVER")


def test_the_hub_and_the_join_share_one_limit_of_slices_a_gpu(monkeypatch, capsys):
    """The hub's check of GPUHUB_SLICES_PER_GPU and the join take the limit from one place:
    changed there, both move."""
    defaults = settings.read_defaults(str(REPO / "deploy" / "settings.env"))
    values = settings.merge(defaults, {}, {}).values
    machine = settings.Machine(cpus=16, memory=64 * 1024**3, gpus=0)
    hub = settings.resolve_auto(settings.Settings(values, {}), machine).values
    assert settings.problems(hub, mode="demo") == []
    # the check's range is the contract's limit, as the join's is
    ranges = {s.name: (s.low, s.high) for s in settings.DECLARED if s.name in SLICE_KEYS}
    assert ranges == dict.fromkeys(SLICE_KEYS, (1, MAX_SLICES_PER_GPU))
    assert advertise.MAX_SLICES_PER_GPU == MAX_SLICES_PER_GPU
    for limit in (MAX_SLICES_PER_GPU, 8):
        declared = tuple(
            dataclasses.replace(s, high=limit) if s.name in SLICE_KEYS else s
            for s in settings.DECLARED
        )
        monkeypatch.setattr(settings, "DECLARED", declared)
        monkeypatch.setattr(advertise, "MAX_SLICES_PER_GPU", limit)
        over = {**hub, "GPUHUB_SLICES_PER_GPU": str(limit + 1)}
        assert f"GPUHUB_SLICES_PER_GPU is {limit + 1}; write at least 1 and at most {limit}" in (
            settings.problems(over, mode="demo")
        )
        assert settings.problems({**over, "GPUHUB_SLICES_PER_GPU": str(limit)}, mode="demo") == []
        with pytest.raises(SystemExit):
            advertise.parse_args(["--slices-per-gpu", str(limit + 1)])
        assert f"is more than the hub's limit of {limit}" in capsys.readouterr().err
        assert advertise.parse_args(["--slices-per-gpu", str(limit)]).slices_per_gpu == limit


@pytest.mark.parametrize(
    "option, says",
    [
        (["--slices-per-gpu", "1000"], "--slices-per-gpu 1000 is more than the hub's limit of 64"),
        (["--slices-per-gpu", "65"], "--slices-per-gpu 65 is more than the hub's limit of 64"),
        (["--mig-slices", "100"], "--mig-slices 100 is more than the hub's limit of 64"),
        (["--slice-memory", "100MiB"], "--slice-memory 100MiB is less than the 256 MiB"),
        (["--simulated-memory", "128"], "--simulated-memory 128 is less than the 256 MiB"),
        (["--slice-memory", "lots"], "--slice-memory: cannot read 'lots' as a memory size"),
    ],
)
def test_counts_and_sizes_the_hub_would_not_use_are_refused_before_nvml(capsys, option, says):
    with pytest.raises(SystemExit):
        advertise.parse_args(option)
    assert says in capsys.readouterr().err


def test_64_slices_is_the_most_the_join_accepts(tmp_path):
    rc, config = run(
        tmp_path, "--slices-per-gpu", str(MAX_SLICES_PER_GPU), nvml=FIXTURES / "h100x8.json"
    )
    assert rc == advertise.CHANGED
    assert {g.slices for g in follow(config)} == {MAX_SLICES_PER_GPU}


@pytest.mark.parametrize(
    "name, option, says",
    [
        (  # 81559 MiB / 1 GiB: 79 slices
            "h100x8.json",
            ["--slice-memory", "1GiB"],
            "--slice-memory 1GiB gives GPU 0 (GPU-3f2a9c4e-81b7-4d2e-a6c5-000000000000, NVIDIA "
            "H100 80GB HBM3, 81559 MiB) 79 slices, more than the hub's limit of 64 slices a GPU; "
            "give --slice-memory 1275MiB or more",
        ),
        (  # 11441 MiB / 64: 178 MiB a slice, too little for a CUDA context
            "k80x2.json",
            ["--slices-per-gpu", "64"],
            "--slices-per-gpu 64 leaves GPU 0 (GPU-6b3c1f0e-4a5d-2c8e-9f1a-000000000000, Tesla "
            "K80, 11441 MiB) 178 MiB a slice, less than the 256 MiB a CUDA program needs to "
            "start; give --slices-per-gpu 44 or less",
        ),
        (  # a 1g.10gb instance (9856 MiB) in 64: 154 MiB a slice
            "h100-mig-7x1g.json",
            ["--mig-slices", "64"],
            "--mig-slices 64 leaves MIG instance MIG-2a7e9c1b-3d4f-5a6b-8c9d-000000000000 of GPU "
            "0 (NVIDIA H100 80GB HBM3 MIG 1g.10gb, 9856 MiB) 154 MiB a slice",
        ),
    ],
)
def test_slices_a_gpu_cannot_hold_are_refused_with_what_fits(tmp_path, capsys, name, option, says):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    rc, config = run(tmp_path, *option, nvml=FIXTURES / name)
    assert rc == 1 and config == {"debug": True}
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(says) and line.endswith("Nothing was changed.")


def test_what_the_refusals_suggest_is_accepted(tmp_path):
    for name, option in [
        ("h100x8.json", ["--slice-memory", "1275MiB"]),
        ("k80x2.json", ["--slices-per-gpu", "44"]),
        ("h100-mig-7x1g.json", ["--mig-slices", "38"]),
    ]:
        rc, config = run(tmp_path, *option, nvml=FIXTURES / name)
        assert rc == advertise.CHANGED, (name, option)
        follow(config)
        (tmp_path / "daemon.json").unlink()
