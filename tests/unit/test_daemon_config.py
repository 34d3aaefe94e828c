import json

import pytest

from worker_setup import advertise, daemon_config
from worker_setup.daemon_config import InvalidDaemonConfig, merge, parse, slice_resources


def test_merge_keeps_every_other_key_and_resource():
    config = {
        "log-driver": "json-file",
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
        "node-generic-resources": ["fpga=1", "GPU-old-0=2"],
    }
    merged = merge(config, slice_resources({"GPU-new-0": 3, "GPU-new-1": 3}))
    assert merged["log-driver"] == "json-file"
    assert merged["runtimes"] == config["runtimes"]
    # each GPU's slices and Swarm's spare unit (contract.SWARM_SPARE)
    assert merged["node-generic-resources"] == ["fpga=1", "GPU-new-0=4", "GPU-new-1=4"]
    assert config["node-generic-resources"] == ["fpga=1", "GPU-old-0=2"], "input not mutated"


def test_merge_is_idempotent():
    entries = slice_resources({"GPU-a": 2})
    once = merge({"debug": True}, entries)
    assert merge(once, entries) == once


def test_removing_all_gpus_drops_the_empty_key():
    assert merge({"node-generic-resources": ["GPU-a=3"]}, []) == {}


def test_parse_refuses_invalid_json_with_the_position():
    with pytest.raises(InvalidDaemonConfig, match=r"not valid JSON \(line 1, column 2"):
        parse("{oops", "/etc/docker/daemon.json")
    with pytest.raises(InvalidDaemonConfig, match="JSON object"):
        parse("[1, 2]")
    assert parse("   \n") == {}


def test_slices_must_be_positive():
    with pytest.raises(ValueError, match="1 or more"):
        slice_resources({"GPU-a": 0})


def run_advertise(tmp_path, *args):
    path = tmp_path / "daemon.json"
    return advertise.main(["--daemon-json", str(path), *args]), path


def test_advertise_simulated_writes_backup_and_is_a_no_op_the_second_time(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    path.write_text('{"debug": true}')
    rc, _ = run_advertise(tmp_path, "--simulate-gpus", "2", "--slices-per-gpu", "3")
    assert rc == advertise.CHANGED
    written = json.loads(path.read_text())
    assert written["debug"] is True
    kinds = written["node-generic-resources"]
    assert len(kinds) == 2 and all(
        k.startswith("GPU-simulated-") and k.endswith("=4")
        for k in kinds  # 3 and the spare
    )
    assert [p.name for p in tmp_path.glob("daemon.json.bak-*")], "old file backed up"
    assert "SIMULATED" in capsys.readouterr().out

    rc, _ = run_advertise(tmp_path, "--simulate-gpus", "2", "--slices-per-gpu", "3")
    assert rc == 0
    assert "nothing to change" in capsys.readouterr().out


def test_advertise_refuses_corrupt_file_and_leaves_it_alone(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    path.write_text("{not json")
    rc, _ = run_advertise(tmp_path, "--simulate-gpus", "1")
    assert rc == 1
    assert path.read_text() == "{not json"
    assert "not valid JSON" in capsys.readouterr().err


def test_advertise_dry_run_changes_nothing(tmp_path, capsys):
    rc, path = run_advertise(tmp_path, "--simulate-gpus", "1", "--dry-run")
    assert rc == advertise.CHANGED
    assert not path.exists()
    out = capsys.readouterr().out
    assert "would change" in out and "+++ " in out and '+    "GPU-simulated-' in out


def test_render_round_trips():
    config = {"b": 1, "node-generic-resources": ["GPU-a=1"]}
    assert json.loads(daemon_config.render(config)) == config


def test_named_slots_for_a_stock_spawner_are_added_and_replaced():
    entries = slice_resources({"GPU-a": 2}, named_kind="NVIDIA-GPU")
    assert entries == ["GPU-a=3", "NVIDIA-GPU=GPU-a/0", "NVIDIA-GPU=GPU-a/1"]  # 2 + spare
    old = {KEY_: ["fpga=1", "NVIDIA-GPU=GPU-old/0", "GPU-old=1"]}
    assert merge(old, entries, named_kind="NVIDIA-GPU")[KEY_] == ["fpga=1", *entries]
    # without named slots wanted, the old ones are still recognised and dropped
    assert merge(old, ["GPU-a=2"], named_kind="NVIDIA-GPU")[KEY_] == ["fpga=1", "GPU-a=2"]


KEY_ = daemon_config.KEY


def test_engine_labels_describe_the_machine_and_each_gpus_memory():
    from worker_setup.gpus import GPUInfo

    found = [
        GPUInfo(0, "GPU-k80-0", "Tesla K80", 11441),
        GPUInfo(1, "GPU-k80-1", "Tesla K80", 11441),
    ]
    labels = daemon_config.engine_labels(found, {"GPU-k80-0": 3, "GPU-k80-1": 3})
    assert labels == [
        "gpu-jupyterhub.gpu-count=2",
        "gpu-jupyterhub.gpu-model=Tesla K80",
        "gpu-jupyterhub.slices-per-gpu=3",
        "gpu-jupyterhub.slice-memory-mb=3813",
        "gpu-jupyterhub.simulated=false",
        "gpu-jupyterhub.swarm-spare=1",
        "gpu-jupyterhub.memory-mb.GPU-k80-0=11441",
        "gpu-jupyterhub.memory-mb.GPU-k80-1=11441",
    ]
    config = {"labels": ["rack=7", "gpu-jupyterhub.gpu-count=8"]}
    merged = daemon_config.merge(config, [], labels=labels)
    assert merged["labels"] == ["rack=7", *labels]
    assert daemon_config.merge(merged, [], labels=labels) == merged
    assert daemon_config.merge(merged, [], labels=[]) == {"labels": ["rack=7"]}
