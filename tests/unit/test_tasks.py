"""The one reader of Swarm's task dicts: what a task says about a starting or running server."""

import re
from datetime import datetime, timezone

import pytest

from gpu_swarm_spawner import tasks
from gpu_swarm_spawner.inventory import build_inventory
from gpu_swarm_spawner.tasks import LIVE_STATES, STAGES, Phase, newest, read_task

from .clusters import node, task


def swarm_task(state, err="", message="", node_id="n1", address=""):
    t = {"ID": "t1", "NodeID": node_id, "Status": {"State": state, "Err": err, "Message": message}}
    if address:
        t["NetworksAttachments"] = [
            {"Network": {"Spec": {"Name": "jhub"}}, "Addresses": [f"{address}/24"]}
        ]
    return t


@pytest.mark.parametrize(
    "state, err, phase",
    [
        ("pending", "no suitable node (insufficient resources on 3 nodes)", Phase.UNPLACEABLE),
        ("pending", "", Phase.STARTING),
        ("preparing", "", Phase.STARTING),
        ("running", "", Phase.RUNNING),
        ("rejected", "No such image: 10.0.0.5:5000/gpu-jupyterhub/singleuser", Phase.NO_IMAGE),
        ("rejected", "node is missing network attachments", Phase.RETRYING),
        (
            "rejected",
            'invalid mount config for type "bind": bind source path does not exist: '
            "/var/lib/gpu-jupyterhub/hub/tutorials",
            Phase.NO_MOUNT,
        ),
        ("failed", "task: non-zero exit (1)", Phase.ENDED),
        ("shutdown", "", Phase.ENDED),
        ("orphaned", "", Phase.ENDED),
    ],
)
def test_each_task_state_reads_as_the_phase_the_spawn_acts_on(state, err, phase):
    assert read_task(swarm_task(state, err), "jhub").phase is phase


def test_a_task_not_created_yet_is_starting_and_unplaced():
    reading = read_task(None, "jhub")
    assert (reading.phase, reading.state, reading.placed) == (Phase.STARTING, "new", False)
    assert reading.stage("w1") == (35, "Waiting for Swarm to place the server")


def test_placed_means_swarm_decided_on_a_node_or_refused():
    assert read_task(swarm_task("assigned", node_id="n2")).placed
    assert read_task(swarm_task("pending", "no suitable node", node_id="")).placed
    assert not read_task(swarm_task("pending", node_id="")).placed


def test_the_reading_carries_the_address_the_detail_and_the_stage():
    reading = read_task(swarm_task("starting", message="starting", address="10.0.8.5"), "jhub")
    assert (reading.address, reading.detail, reading.task_id) == ("10.0.8.5", "starting", "t1")
    assert reading.stage("w1") == (75, "Container starting on w1")
    assert read_task(swarm_task("failed", err="boom", message="m")).detail == "boom"
    assert read_task(swarm_task("rejected", "x")).stage("w1") is None


def test_one_set_of_live_states_for_the_stages_and_the_inventory():
    assert set(STAGES) == LIVE_STATES
    nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    counted = {
        state: build_inventory(nodes, [task("n1", {"GPU-a0": 1}, state=state)])[0].used
        for state in [*LIVE_STATES, "failed", "shutdown", "rejected", "complete"]
    }
    assert {s for s, used in counted.items() if used} == LIVE_STATES


def test_the_newest_task_meant_to_run_speaks_for_the_service():
    old = {"ID": "a", "DesiredState": "running", "CreatedAt": "2026-01-01T10:00:00Z"}
    new = {"ID": "b", "DesiredState": "running", "CreatedAt": "2026-01-01T10:00:05Z"}
    stopping = {"ID": "c", "DesiredState": "shutdown", "CreatedAt": "2026-01-01T10:00:09Z"}
    assert newest([old, stopping, new])["ID"] == "b"
    assert newest([stopping])["ID"] == "c"
    assert newest([]) is None


def on_network(address: str, state: str = "running", network: str = "hubnet") -> dict:
    task = {"Status": {"State": state}, "DesiredState": "running"}
    attachment = {"Network": {"Spec": {"Name": network}}, "Addresses": [f"{address}/28"]}
    return {**task, "NetworksAttachments": [attachment] if address else []}


def test_addresses_left_counts_live_tasks_on_the_network_and_what_swarm_keeps():
    held = [on_network(f"10.9.0.{i}") for i in range(2, 11)]  # 9 servers
    # /28: 16 addresses, 3 Swarm's own, 3 nodes' endpoints, 9 servers
    assert tasks.addresses_left(["10.9.0.0/28"], held, "hubnet", 3) == 1
    others = [
        on_network("10.9.0.12", state="shutdown"),  # ended: its address is free again
        on_network("10.8.0.2", network="elsewhere"),
        on_network(""),  # not given one yet
    ]
    assert tasks.addresses_left(["10.9.0.0/28"], held + others, "hubnet", 3) == 1
    full = held + [on_network("10.9.0.13")]
    assert tasks.addresses_left(["10.9.0.0/28"], full, "hubnet", 3) == 0
    # a network of two ranges; a range written with host bits (as `docker network` shows some)
    assert tasks.addresses_left(["10.9.0.0/28", "10.9.1.5/28"], full, "hubnet", 3) == 13


class Py39Datetime(datetime):
    """``datetime`` as Python 3.9 and 3.10 read ISO times: no Z, three or six digits of a
    second, else ValueError (the project runs from 3.9: pyproject.toml)."""

    @classmethod
    def fromisoformat(cls, text):
        fraction = re.search(r"\.(\d+)", text)
        if text.endswith("Z") or (fraction and len(fraction.group(1)) not in (3, 6)):
            raise ValueError(f"Invalid isoformat string: {text!r}")
        return super().fromisoformat(text)


@pytest.mark.parametrize("reader", [datetime, Py39Datetime])
def test_swarm_times_read_with_nanoseconds_trimmed_zeros_or_none_on_every_python(
    reader, monkeypatch
):
    monkeypatch.setattr(tasks, "datetime", reader)
    at = datetime(2026, 11, 28, 9, 5, 12, tzinfo=timezone.utc).timestamp()
    assert tasks.swarm_time("2026-11-28T09:05:12.123456789Z") == pytest.approx(at + 0.123456)
    assert tasks.swarm_time("2026-11-28T09:05:12.1Z") == pytest.approx(at + 0.1)
    assert tasks.swarm_time("2026-11-28T09:05:12Z") == at
    assert tasks.swarm_time("2026-11-28T10:05:12.5+01:00") == pytest.approx(at + 0.5)
    assert tasks.swarm_time("yesterday") is None
    assert tasks.swarm_time(None) is None


def test_running_since_reads_swarms_nanosecond_timestamp_of_a_running_task_only():
    def at(stamp, state="running"):
        return tasks.running_since({"Status": {"State": state, "Timestamp": stamp}})

    assert at("2026-11-28T12:00:00.123456789Z") == pytest.approx(1795867200.123456)
    assert at("2026-11-28T12:00:00Z") == 1795867200.0
    assert at("2026-11-28T13:00:00.5+01:00") == 1795867200.5
    assert at("2026-11-28T12:00:00Z", state="starting") is None  # not running yet
    assert at("yesterday") is None and tasks.running_since({}) is None
