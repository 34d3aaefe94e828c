"""The hub's fleet on the bed (issue 41, docs/autoscaling.md): the stack deployed with
GPUHUB_FLEET=on (minimum 0, maximum 2, a machine given back after EMPTY_FOR_S empty seconds)
and the bed's cloud (bed_cloud.py) as its provider: its grow and remove commands are one-line
clients that the hub runs in its own container (GPUHUB_FLEET_IMAGE empty), and its machines
are fresh bed machines that join with the line `make join-command` prints, after a boot delay.

A participant who finds no free slice joins the line and reads that a GPU machine is on its
way; the cloud is asked once, for one machine, which joins, and their server starts on it.
They stop; after EMPTY_FOR_S the machine is paused, then removed through the cloud, and no
server was ended. Last, the cloud refuses a grow with Google Cloud's recorded quota error: the
dashboard shows it within a round (10 s) and the person in line is told.

The bed as the test finds it is 3 GPU machines (the manager and w1, w2; 18 slices), and with
GPUHUB_FLEET=on every GPU machine is the fleet's (an organizer's fixed machines count toward
the minimum; an empty one is given back). The cheapest honest "no free slice" is therefore:
w1 and w2 stopped for the module (bed.sh stop: machines that are down hold no slice the hub
can use; bed.sh workers brings them back), and the manager's slices held by participants'
servers (the admin's full GPU, one-slice servers on the rest), started *before* the fleet is
switched on: the manager, which runs the hub, is then never an empty machine the fleet may
pause and give back. Filling every slice of three machines would start 18 servers; servers of
nobody the hub knows (fillers) would leave the machines "empty" to the fleet. At most one
fresh machine is made (2 simulated GPUs, 6 slices).
"""

from __future__ import annotations

import json
import os
import time

import docker
import pytest
import requests

from gpu_swarm_spawner.capacity import on_its_way_message
from gpu_swarm_spawner.provider import QUOTA, last_line

from . import bed_cloud
from .aftermath import token_of
from .bed_cloud import Bed, BedCloud, recorded
from .hub import BED_HOST, deploy
from .spawners import inventory, remove_services, wait_slices_free
from .test_line import progress

pytestmark = pytest.mark.integration

CLOUD_PORT = 18950
BOOT_S = 10  # the cloud's boot delay, before bed.sh fresh (which takes its own time)
EMPTY_FOR_S = 40
ROUND_S = 10  # the fleet's round (docs/autoscaling.md)
FIXED = ("w1", "w2")
PARTICIPANT, LATER = "ci-fleet-p", "ci-fleet-q"
#: the text people in line read while a machine is on its way (capacity.py), up to "(about"
ON_ITS_WAY = on_its_way_message(60).split(" (")[0]


def fleet_settings(url: str) -> dict[str, str]:
    return {
        "GPUHUB_FLEET": "on",
        "GPUHUB_FLEET_MIN_MACHINES": "0",
        "GPUHUB_FLEET_MAX_MACHINES": "2",
        "GPUHUB_FLEET_EMPTY_FOR": str(EMPTY_FOR_S),
        # what a bed machine takes from asking to ready, before any join was seen
        "GPUHUB_FLEET_BOOT_AND_JOIN": "120",
        "GPUHUB_FLEET_JOIN_WITHIN": "600",
        "GPUHUB_FLEET_COMMAND_TIMEOUT": "60",
        **bed_cloud.commands(url),
    }


class WatchedBed(Bed):
    """The bed's machines, and the swarm's availability of each one as the cloud destroys it
    (given back "paused first": it must read "pause")."""

    def __init__(self):
        super().__init__()
        self.availability: dict[str, str] = {}

    def destroy(self, name: str) -> None:
        nodes = [
            n for n in docker.from_env().nodes.list() if n.attrs["Description"]["Hostname"] == name
        ]
        self.availability[name] = nodes[0].attrs["Spec"]["Availability"] if nodes else "no node"
        super().destroy(name)


class Fleet:
    def __init__(self, cloud: BedCloud, bed: WatchedBed, holders: list[str], admin_token: str):
        self.cloud, self.bed, self.holders = cloud, bed, holders
        self.admin = requests.Session()
        self.admin.headers["Authorization"] = f"token {admin_token}"
        self.machine = ""  # the machine the cloud made for the participant


def nodes_of_gpus() -> set[str]:
    return {g.node_name for g in inventory().values()}


def wait_for(what: str, check, timeout: float, seen=lambda: "", every: float = 0.5):
    """``check()``'s first true value within ``timeout`` s; else fail with what was last seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s; last seen: {seen()}")
        time.sleep(every)


def start(hub, user: str, **body) -> None:
    hub.api("POST", f"/users/{user}")
    r = hub.api("POST", f"/users/{user}/server", json=body or None)
    assert r.status_code in (201, 202), (user, r.status_code, r.text)


def hold_the_manager(hub) -> list[str]:
    """Every slice the bed has left (the manager's) held by participants' servers: the admin's
    full GPU (an admin's choice on the suite's stack), one-slice servers on the rest."""
    holders = ["admin"]
    start(hub, "admin", gpu="full")
    hub.wait_ready("admin", timeout=180)
    free = sum(g.free for g in inventory().values())
    holders += [f"ci-fleet-h{i}" for i in range(1, free + 1)]
    for user in holders[1:]:
        start(hub, user)
    for user in holders[1:]:
        hub.wait_ready(user, timeout=180)
    assert all(g.free == 0 for g in inventory().values()), inventory()
    return holders


@pytest.fixture(scope="module")
def fleet(hub, bed):
    """The bed with no free slice, the bed's cloud serving, the stack deployed with the fleet
    on; afterwards the suite's own stack, the cloud's machines removed, w1 and w2 back."""
    remove_services(hub.stack)
    wait_slices_free()
    added: dict[str, str] = {}
    cloud = server = None
    holders: list[str] = []
    try:
        for worker in FIXED:
            bed("stop", worker)
        wait_for(
            "w1 and w2 out of the GPU machines",
            lambda: not nodes_of_gpus() & set(FIXED),
            90,
            seen=nodes_of_gpus,
        )
        holders = hold_the_manager(hub)
        watched = WatchedBed()
        watched.prepare()  # the image file, so that no machine's boot waits for it
        cloud = BedCloud(watched, bed_cloud.join_command(), boot_s=BOOT_S)
        server = bed_cloud.serve(cloud, BED_HOST, CLOUD_PORT)
        added = fleet_settings(f"http://{BED_HOST}:{CLOUD_PORT}")
        os.environ.update(added)
        deploy("stack")
        yield Fleet(cloud, watched, holders, token_of(hub, "admin", hub.admin_password))
    finally:
        for key in added:
            del os.environ[key]
        try:
            deploy("stack")  # the suite's own stack, the fleet off, before anything empties
        finally:
            for user in [*holders, PARTICIPANT, LATER]:
                hub.stop(user)
                if user != "admin":  # later tests (the admin page's first page) never see them
                    hub.api("DELETE", f"/users/{user}")
            if server is not None:
                server.shutdown()
            if cloud is not None:
                cloud.close()
            bed("workers", str(len(FIXED)))
            wait_for(
                "w1 and w2 back among the GPU machines",
                lambda: set(FIXED) <= nodes_of_gpus(),
                120,
                seen=nodes_of_gpus,
            )


def user_state(hub, user: str) -> dict:
    server = hub.server(user) or {}
    return server.get("state") or {}


def test_a_participant_in_line_is_told_a_machine_comes_and_is_served_on_it(hub, fleet):
    cloud = fleet.cloud
    hub.api("POST", f"/users/{PARTICIPANT}")
    t0 = time.time()
    r = hub.api("POST", f"/users/{PARTICIPANT}/server", json={"line": "join"})
    assert r.status_code == 202, (r.status_code, r.text)  # no free slice: in line
    told = wait_for(
        f"{PARTICIPANT} reads that a machine is on its way",
        lambda: [m for m in progress(hub, PARTICIPANT) if ON_ITS_WAY in m],
        3 * ROUND_S + 10,
        seen=lambda: (progress(hub, PARTICIPANT), cloud.listing()),
    )
    print(f"told after {time.time() - t0:.1f} s: {told[-1]}")
    waited = hub.wait_ready(PARTICIPANT, timeout=600)
    (instance,) = cloud.instances.values()
    fleet.machine = instance.name
    assert instance.startup == "joined", cloud.listing()
    assert user_state(hub, PARTICIPANT).get("gpu_node") == instance.name, user_state(
        hub, PARTICIPANT
    )
    grows = cloud.asked("grow")
    assert [(r.args, r.status) for r in grows] == [(["1"], 0)], [
        (r.at - t0, r.op, r.args, r.status, r.output) for r in cloud.requests
    ]
    print(
        f"asked after {grows[0].at - t0:.1f} s, made after {instance.made - t0:.1f} s, joined "
        f"after {instance.started - t0:.1f} s, server ready after {waited:.1f} s in line"
    )


def test_the_empty_machine_is_paused_then_given_back_and_no_server_ended(hub, fleet):
    cloud, machine = fleet.cloud, fleet.machine
    assert machine, "the participant was not served on a machine of the cloud"
    before = {user: hub.server(user)["started"] for user in fleet.holders}
    hub.stop(PARTICIPANT)
    stopped = time.time()
    removal = wait_for(
        f"{machine} removed through the cloud",
        lambda: cloud.asked("remove"),
        EMPTY_FOR_S + 4 * ROUND_S + 30,
        seen=lambda: (cloud.listing(), [(r.op, r.args, r.status) for r in cloud.requests]),
    )
    assert [(r.args, r.status) for r in removal] == [([machine], 0)], removal
    assert removal[0].at - stopped >= EMPTY_FOR_S - 1, "given back before its empty time"
    wait_for(f"{machine} destroyed", lambda: machine in fleet.bed.availability, 60)
    assert fleet.bed.availability[machine] == "pause", "it was not paused first"
    assert cloud.size == 0 and [r.op for r in cloud.requests].count("grow") == 1
    # nobody's server ended: the holders' run on, the same servers
    assert {user: (hub.server(user) or {}).get("started") for user in fleet.holders} == before
    assert all(hub.server(user)["ready"] for user in fleet.holders)
    # the swarm forgets the machine once it is down (the hub's part after the cloud's)
    wait_for(
        f"{machine}'s node removed from the swarm",
        lambda: (
            machine
            not in {n.attrs["Description"]["Hostname"] for n in docker.from_env().nodes.list()}
        ),
        90,
        seen=lambda: [
            (n.attrs["Description"]["Hostname"], n.attrs["Status"]["State"])
            for n in docker.from_env().nodes.list()
        ],
    )


def dashboard_state(hub, fleet: Fleet) -> str:
    r = fleet.admin.get(f"{hub.url}/services/dashboard/api/state", timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return json.dumps(r.json())


def test_a_refused_grow_is_on_the_dashboard_within_a_round_and_the_line_is_told(hub, fleet):
    cloud = fleet.cloud
    text = recorded(bed_cloud.QUOTA_TEXT)
    said = last_line(text)  # what the organizer's line quotes of the cloud's answer
    assert said not in dashboard_state(hub, fleet)
    cloud.refuse_next_grow(text)
    start(hub, LATER, line="join")
    refused = wait_for(
        "the cloud asked to grow again",
        lambda: [r for r in cloud.asked("grow") if r.status == 1],
        3 * ROUND_S + 10,
        seen=lambda: [(r.op, r.args, r.status) for r in cloud.requests],
    )
    shown = wait_for(
        "the refusal on the dashboard",
        lambda: (QUOTA in (state := dashboard_state(hub, fleet)) and said in state) and time.time(),
        30,
        seen=lambda: dashboard_state(hub, fleet)[-2000:],
        every=0.25,
    )
    late = shown - refused[0].at
    print(f"the refusal on the dashboard {late:.1f} s after the cloud's answer")
    assert late <= ROUND_S, f"the refusal reached the dashboard after {late:.1f} s"
    wait_for(
        f"{LATER} told that no machine can come now",
        lambda: [m for m in progress(hub, LATER) if "No more GPU machines" in m],
        ROUND_S + 10,
        seen=lambda: progress(hub, LATER),
    )
    assert cloud.size == 0 and len(cloud.instances) == 1, cloud.listing()
