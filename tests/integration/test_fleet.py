"""The hub's fleet on the bed (issue 41, docs/autoscaling.md): the stack deployed with
GPUHUB_FLEET=on (minimum 0, maximum 2, a machine given back after EMPTY_FOR_S empty seconds),
homes on the bed's shared storage as the fleet needs them (GPUHUB_HOMES_DIR), and the bed's
cloud (bed_cloud.py) as its provider: its grow and remove commands are one-line clients that
the hub runs in its own container (GPUHUB_FLEET_IMAGE empty), and its machines are fresh bed
machines that join with the line `make join-command` prints, after a boot delay.

A participant who finds no free slice joins the line and reads that a GPU machine is on its
way; the cloud is asked once, for one machine, which joins, and their server starts on it.
They stop; after EMPTY_FOR_S the machine is paused, then removed through the cloud, and no
server was ended. Then the idle stop (GPUHUB_FLEET_STOP_IDLE_AFTER): a second participant served
on a second machine does nothing, their server is stopped, the machine given back, their file
kept in their shared home. Then a machine whose Docker engine dies (still in the cloud's
group) is given back through the cloud, and a real new machine serves its participant. Last,
the cloud refuses a grow with Google Cloud's recorded quota error: the dashboard shows it within
a round (10 s) and the person in line is told.

The bed as the test finds it is 3 GPU machines (the manager and w1, w2; 18 slices), joined by
hand: fixed machines (docs/autoscaling.md), never given back, whose free slices would serve the
participant before any machine is asked for; the bed cloud's machines join with the start-up
script's mark, as the group's. A machine an organizer paused is left out altogether. So the
cheapest honest "no GPU machine at first" (minimum 0, as at the start of a day) is the
organizer's: the three paused (`make pause-node`) right after the stack is deployed with the
fleet on (soon after, as when every GPU machine counted as the group's and empty ones were
given back; the manager runs the hub). Nothing is started or stopped for it; the hub sees no
GPU slice at all, and the participant's request must still be able to wait in line for the
machine the fleet asks for. Afterwards the hub is scaled to nothing first, then the three are
resumed and the suite's own stack deployed again. Two fresh machines are made, one after the
other, then two more (2 simulated GPUs, 6 slices each).
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest
import requests

from gpu_swarm_spawner.capacity import ASKING_MESSAGE as ASKING
from gpu_swarm_spawner.capacity import DOWN_LEAST_S, on_its_way_message
from gpu_swarm_spawner.contract import USER_LABEL
from gpu_swarm_spawner.events import FLEET_STOP_IDLE, read_events
from gpu_swarm_spawner.provider import QUOTA, last_line
from gpu_swarm_spawner.tasks import is_live, running_since

from . import bed_cloud
from .aftermath import log_in, token_of
from .bed_cloud import Bed, BedCloud, recorded
from .conftest import HOMES
from .hub import BED_HOST, container_of, deploy
from .spawners import inventory, remove_services, wait_slices_free
from .test_line import PageWatch, progress

pytestmark = pytest.mark.integration

CLOUD_PORT = 18950
BOOT_S = 10  # the cloud's boot delay, before bed.sh fresh (which takes its own time)
EMPTY_FOR_S = 40
ROUND_S = 10  # the fleet's round (docs/autoscaling.md)
PARTICIPANT, LATER = "ci-fleet-p", "ci-fleet-q"
#: the idle stop's time (GPUHUB_FLEET_STOP_IDLE_AFTER): the least `make up` takes
IDLE_S = 60
#: the text people in line read while a machine is on its way (capacity.py), up to "(about"
ON_ITS_WAY = on_its_way_message(60).split(" (")[0]
#: the most seconds from joining the line to the cloud's ask, and from that ask to the page
TELL_S = 5


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
        "GPUHUB_FLEET_STOP_IDLE_AFTER": str(IDLE_S),
        **bed_cloud.commands(url),
        # the fleet needs homes on shared storage (docs/homes.md), which fresh machines mount
        "GPUHUB_HOMES_DIR": HOMES,
    }


class WatchedBed(Bed):
    """The bed's machines, and what the swarm says of each one as the cloud destroys it: its
    availability (given back "paused first": it must read "pause") and the participants'
    servers still running there (none may)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, tuple[str, int]] = {}

    def destroy(self, name: str) -> None:
        client = docker.from_env()
        nodes = [n for n in client.nodes.list() if n.attrs["Description"]["Hostname"] == name]
        if nodes:
            tasks = client.api.tasks(filters={"node": nodes[0].id})
            servers = [
                t
                for t in tasks
                if is_live(t) and USER_LABEL in t["Spec"].get("ContainerSpec", {}).get("Labels", {})
            ]
            self.seen[name] = (nodes[0].attrs["Spec"]["Availability"], len(servers))
        else:
            self.seen[name] = ("no node", 0)
        super().destroy(name)


class Fleet:
    def __init__(self, cloud: BedCloud, bed: WatchedBed, admin_token: str):
        self.cloud, self.bed = cloud, bed
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


def availability(node: str, to: str) -> None:
    """An organizer's `make pause-node` / `make resume-node` (to: "pause" or "active")."""
    deploy("pause-node" if to == "pause" else "resume-node", node)


def hub_down(hub) -> None:
    """The hub scaled to nothing, until its task has ended (its fleet keeper with it)."""
    service = docker.from_env().services.get(f"{hub.stack}_hub")
    service.scale(0)
    wait_for(
        "the hub's task ended",
        lambda: not [t for t in service.tasks() if t["Status"]["State"] == "running"],
        120,
        seen=lambda: [t["Status"]["State"] for t in service.tasks()],
    )


@pytest.fixture(scope="module")
def fleet(hub):
    """The stack deployed with the fleet on and the bed's cloud as its provider, the bed's own
    GPU machines paused by the organizer; afterwards the suite's own stack on the bed as it
    was, the cloud's machines removed."""
    remove_services(hub.stack)
    wait_slices_free()
    organizers = sorted(nodes_of_gpus())
    added: dict[str, str] = {}
    cloud = server = None
    paused: list[str] = []
    try:
        # set before the join line is printed: it names the shared folders the join checks
        added = fleet_settings(f"http://{BED_HOST}:{CLOUD_PORT}")
        os.environ.update(added)
        watched = WatchedBed()
        watched.prepare()  # the image file, so that no machine's boot waits for it
        printed = bed_cloud.join_command()
        assert f" --shared-folder {HOMES}=" in printed, printed  # each machine's join checks it
        cloud = BedCloud(watched, printed, boot_s=BOOT_S)
        server = bed_cloud.serve(cloud, BED_HOST, CLOUD_PORT)
        deploy("stack")
        deployed = time.monotonic()
        for node in organizers:
            availability(node, "pause")
            paused.append(node)
        assert time.monotonic() - deployed < EMPTY_FOR_S / 2, "paused too late to be safe"
        wait_for("no GPU slice left", lambda: not inventory(), 30, seen=inventory)
        yield Fleet(cloud, watched, token_of(hub, "admin", hub.admin_password))
    finally:
        for key in added:
            del os.environ[key]
        try:
            if paused:
                hub_down(hub)
            for node in paused:
                availability(node, "active")
            deploy("stack")  # the suite's own stack, the fleet off
        finally:
            for user in (PARTICIPANT, LATER):
                hub.stop(user)
                hub.api("DELETE", f"/users/{user}")  # the admin page's first page never sees them
            if server is not None:
                server.shutdown()
            if cloud is not None:
                cloud.close()
            wait_for(
                "the bed's own GPU machines back",
                lambda: set(organizers) <= nodes_of_gpus(),
                60,
                seen=nodes_of_gpus,
            )


def user_state(hub, user: str) -> dict:
    server = hub.server(user) or {}
    return server.get("state") or {}


def joined_line(hub, user: str) -> float:
    """When the hub put ``user`` in the waiting line (its "joined line" event)."""
    return next(e.time for e in hub_events(hub) if e.kind == "joined line" and e.user == user)


def test_a_participant_in_line_is_told_a_machine_comes_and_is_served_on_it(hub, fleet):
    """They join the line: the cloud is asked at once (the newcomer wakes the fleet's round),
    and their page, open all along, reads that the hub is asking, then that a machine is on its
    way, within seconds; the machine joins and their server starts on it."""
    cloud = fleet.cloud
    hub.api("POST", f"/users/{PARTICIPANT}")
    page = PageWatch(hub, PARTICIPANT)  # the spawn page, as a browser keeps it open
    try:
        # (the REST API answers after JupyterHub's slow_spawn_timeout, 10 s; the page is read
        # all along)
        r = hub.api("POST", f"/users/{PARTICIPANT}/server", json={"line": "join"})
        assert r.status_code == 202, (r.status_code, r.text)  # no free slice: in line
        told = wait_for(
            f"{PARTICIPANT}'s page reads that a machine is on its way",
            lambda: page.first(ON_ITS_WAY),
            3 * ROUND_S + 10,
            seen=lambda: (page.seen, cloud.listing()),
            every=0.1,
        )
    finally:
        page.stop()
    joined = joined_line(hub, PARTICIPANT)
    grows = cloud.asked("grow")
    assert grows, [(r.at - joined, r.op, r.args, r.status) for r in cloud.requests]
    asked = grows[0].at
    asking = page.first(ASKING)
    assert asking is not None and asking <= told, page.seen  # asking, then on its way
    print(
        f"after joining the line: the cloud asked {asked - joined:.1f} s, the page read "
        f"'{ASKING}' {asking - joined:.1f} s and '{ON_ITS_WAY}' {told - joined:.1f} s"
    )
    assert asked - joined <= TELL_S, f"the cloud was asked {asked - joined:.1f} s after joining"
    assert told - asked <= TELL_S, f"the page read it {told - asked:.1f} s after the cloud's ask"
    hub.wait_ready(PARTICIPANT, timeout=600)
    ready = time.time()
    grows = cloud.asked("grow")
    # once, for one machine: the group is the cloud's machines only (the manager is not in it)
    assert [(r.args, r.status) for r in grows] == [(["1"], 0)], [
        (r.at - joined, r.op, r.args, r.status, r.output) for r in cloud.requests
    ]
    assert len(cloud.instances) == 1, cloud.listing()
    (instance,) = cloud.instances.values()
    fleet.machine = instance.name
    assert instance.startup == "joined", cloud.listing()
    state = user_state(hub, PARTICIPANT)
    assert state.get("gpu_node") == instance.name, state
    print(
        f"after joining the line: the machine made {instance.made - joined:.1f} s, joined the "
        f"swarm {instance.started - joined:.1f} s, the server ready {ready - joined:.1f} s"
    )


def wait_forgotten(machine: str) -> None:
    """The swarm forgets a machine given back once it is down (the hub's part after the
    cloud's): until then the next test's fleet still sees it."""
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


def test_the_empty_machine_is_paused_then_given_back_and_no_server_ended(hub, fleet):
    cloud, machine = fleet.cloud, fleet.machine
    assert machine, "the participant was not served on a machine of the cloud"
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
    wait_for(f"{machine} destroyed", lambda: machine in fleet.bed.seen, 60)
    # paused first, and no participant's server on it as it went
    assert fleet.bed.seen[machine] == ("pause", 0), fleet.bed.seen
    assert cloud.size == 0 and [r.op for r in cloud.requests].count("grow") == 1
    wait_forgotten(machine)
    # and the hub's own record: no server of anyone ended there after it was given back
    ended = [
        e
        for e in hub_events(hub)
        if e.node == machine
        and e.time >= removal[0].at
        and e.kind in ("stopped", "failed", "healed")
    ]
    assert ended == [], ended


def hub_events(hub) -> list:
    """The hub's events (events.jsonl in its dashboard folder)."""
    (container,) = docker.from_env().containers.list(filters={"name": f"{hub.stack}_hub."})
    out = container.exec_run(["cat", "/srv/jupyterhub/data/dashboard/events.jsonl"])
    return read_events(out.output.splitlines())


def dashboard_state(hub, fleet: Fleet) -> str:
    r = fleet.admin.get(f"{hub.url}/services/dashboard/api/state", timeout=30)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return json.dumps(r.json())


def test_idle_servers_are_stopped_so_that_their_machine_is_given_back_files_kept(hub, fleet):
    """GPUHUB_FLEET_STOP_IDLE_AFTER (IDLE_S): LATER, in line with no GPU machine (the first one
    was given back), is served on the machine the hub asks for (a second fresh machine).
    They write a file and do nothing more: IDLE_S after their server began running it is
    stopped (a 'fleet stop idle' naming them; their hub home page says why), the machine is
    given back after EMPTY_FOR_S, paused first with no server on it, and the file is in their
    shared home."""
    cloud = fleet.cloud
    start(hub, LATER, line="join")
    waited = hub.wait_ready(LATER, timeout=300)
    machine = user_state(hub, LATER).get("gpu_node")
    assert machine in cloud.instances and machine != fleet.machine, (machine, cloud.listing())
    service = "jy-ci-2dfleet-2dq"  # LATER's, escaped as dockerspawner does
    (task,) = [
        t
        for t in docker.from_env().services.get(service).tasks()
        if t["Status"]["State"] == "running"
    ]
    began = running_since(task)
    print(f"{LATER} served on {machine} after {waited:.0f} s in line")
    wrote = container_of(service).exec_run(
        ["sh", "-c", "echo kept > ~/idle-notes.txt"], user="jovyan"
    )
    assert wrote.exit_code == 0, wrote.output
    (stop,) = wait_for(
        f"{LATER}'s idle server stopped",
        lambda: [e for e in hub_events(hub) if e.kind == FLEET_STOP_IDLE and e.node == machine],
        IDLE_S + 3 * ROUND_S + 30,
        seen=lambda: (hub.server(LATER), [(e.kind, e.node) for e in hub_events(hub)][-5:]),
    )
    print(f"stopped {stop.time - began:.1f} s after it began running: {stop.reason}")
    assert stop.time - began >= IDLE_S, "stopped before it was idle for IDLE_S"
    assert stop.reason.endswith(f"(files kept, kernels lost): {LATER}"), stop.reason
    assert hub.server(LATER) is None  # their next visit: the spawn page
    # ... and their hub home page says why (capacity.idle_stop_message), as a browser of
    # theirs reads it after a login
    session, _ = log_in(hub, LATER, hub.password)
    home = session.get(f"{hub.url}/hub/home", timeout=30, verify=hub.verify)
    told = re.search(r'id="last-start-failed">(.*?)<br>', home.text, re.S)
    assert told is not None, home.text[-2000:]
    said = " ".join(re.sub(r"<[^>]+>", " ", told.group(1)).split())
    print(f"{LATER}'s home page: {said}")
    assert re.fullmatch(
        r"Your server was stopped\. Stopped at \d\d:\d\d after \d+ minutes? "
        r"without activity, so that its GPU machine could be given back\. Your files are kept; "
        r"start your server again when you are back\.",
        said,
    ), said
    removal = wait_for(
        f"{machine} removed through the cloud",
        lambda: [r for r in cloud.asked("remove") if r.args == [machine]],
        EMPTY_FOR_S + 4 * ROUND_S + 30,
        seen=lambda: (cloud.listing(), [(r.op, r.args, r.status) for r in cloud.requests]),
    )
    assert removal[0].at - stop.time >= EMPTY_FOR_S - 1, "given back before its empty time"
    wait_for(f"{machine} destroyed", lambda: machine in fleet.bed.seen, 60)
    assert fleet.bed.seen[machine] == ("pause", 0), fleet.bed.seen
    print(f"{machine} given back {removal[0].at - stop.time:.1f} s after the stop")
    wait_forgotten(machine)
    kept = Path(HOMES) / "ci-2dfleet-2dq" / "idle-notes.txt"
    assert kept.read_text() == "kept\n"


def test_a_machine_whose_docker_dies_is_given_back_and_a_new_one_serves_its_participant(hub, fleet):
    """PARTICIPANT is served on a machine the hub asks for; that machine's Docker engine is
    killed (the machine still runs, and is still in the cloud's group). The hub reports the
    server stopped; PARTICIPANT asks again and waits in line. The grow counts the dead machine
    in the group's size, so the cloud makes a real new machine (the bed's cloud, like the
    clouds' groups, makes none for a size it already has), and PARTICIPANT is served on it;
    the dead machine is given back through the cloud, not before capacity.DOWN_LEAST_S, and
    its node leaves the swarm. Then PARTICIPANT stops and the new machine is given back."""
    cloud = fleet.cloud
    start(hub, PARTICIPANT, line="join")
    hub.wait_ready(PARTICIPANT, timeout=300)
    dead = user_state(hub, PARTICIPANT).get("gpu_node")
    assert dead in cloud.instances, (dead, cloud.listing())
    grows = len(cloud.asked("grow"))
    fleet.bed.run("on", dead, "pkill -KILL -x dockerd")
    killed = time.time()
    wait_for(
        f"{PARTICIPANT}'s server on {dead} reported stopped",
        lambda: hub.server(PARTICIPANT) is None,
        180,
        seen=lambda: hub.server(PARTICIPANT),
        every=2,
    )
    lost = time.time()
    start(hub, PARTICIPANT, line="join")
    hub.wait_ready(PARTICIPANT, timeout=420)
    served = time.time()
    again = user_state(hub, PARTICIPANT).get("gpu_node")
    assert again in cloud.instances and again != dead, (again, dead, cloud.listing())
    # one grow, by one machine past the dead one: the cloud still counted it
    new_grows = cloud.asked("grow")[grows:]
    assert [(r.args, r.status) for r in new_grows] == [(["2"], 0)], new_grows
    removal = wait_for(
        f"{dead} removed through the cloud",
        lambda: [r for r in cloud.asked("remove") if r.args == [dead]],
        DOWN_LEAST_S + 4 * ROUND_S + 60,
        seen=lambda: (cloud.listing(), [(r.op, r.args, r.status) for r in cloud.requests]),
    )
    assert removal[0].status == 0, removal
    print(
        f"{dead}'s engine killed: the server reported stopped {lost - killed:.0f} s later, the "
        f"machine given back {removal[0].at - killed:.0f} s after the kill, {PARTICIPANT} "
        f"served again on {again} {served - lost:.0f} s after asking again"
    )
    assert removal[0].at - killed >= DOWN_LEAST_S, "given back before it was surely lost"
    wait_forgotten(dead)
    hub.stop(PARTICIPANT)
    wait_for(
        f"{again} removed through the cloud",
        lambda: [r for r in cloud.asked("remove") if r.args == [again]],
        EMPTY_FOR_S + 4 * ROUND_S + 30,
        seen=lambda: (cloud.listing(), [(r.op, r.args, r.status) for r in cloud.requests]),
    )
    wait_forgotten(again)
    assert cloud.size == 0, cloud.listing()


def test_a_refused_grow_is_on_the_dashboard_within_a_round_and_the_line_is_told(hub, fleet):
    cloud = fleet.cloud
    made = len(cloud.instances)  # none made for the refused grow
    text = recorded(bed_cloud.QUOTA_TEXT)
    said = last_line(text)  # what the organizer's line quotes of the cloud's answer
    assert said not in dashboard_state(hub, fleet)
    cloud.refuse_next_grow(text)
    # the start's REST call answers after JupyterHub's slow_spawn_timeout (10 s), and the cloud
    # is asked as LATER joins the line: the dashboard is watched meanwhile
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(start, hub, LATER, line="join")
        refused = wait_for(
            "the cloud asked to grow again",
            lambda: [r for r in cloud.asked("grow") if r.status == 1],
            3 * ROUND_S + 10,
            seen=lambda: [(r.op, r.args, r.status) for r in cloud.requests],
            every=0.1,
        )
        shown = wait_for(
            "the refusal on the dashboard",
            lambda: (
                said in (state := dashboard_state(hub, fleet)) and QUOTA in state and time.time()
            ),
            30,
            seen=lambda: dashboard_state(hub, fleet)[-2000:],
            every=0.25,
        )
        joining.result()
    late = shown - refused[0].at
    print(f"the refusal on the dashboard {late:.1f} s after the cloud's answer")
    assert late <= ROUND_S, f"the refusal reached the dashboard after {late:.1f} s"
    wait_for(
        f"{LATER} told that no machine can come now",
        lambda: [m for m in progress(hub, LATER) if "No more GPU machines" in m],
        ROUND_S + 10,
        seen=lambda: progress(hub, LATER),
    )
    assert cloud.size == 0 and len(cloud.instances) == made, cloud.listing()
