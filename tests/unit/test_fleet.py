"""The hub's fleet keeper (gpu_swarm_spawner/fleet.py), round by round against the fake swarm
manager (fake_engine.py's low-level API: nodes, tasks, node updates and removals) and a fake
cloud standing in for the provider's commands: it grows once for the people in line (not twice
across rounds or a hub restart), pauses then removes a machine left empty, never one with a
server, resumes a paused machine for the line, tells a refusal at once, goes on while a provider
call hangs, and writes the dashboard's snapshot."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from gpu_swarm_spawner import capacity, contract, events, fleet, line, periodic, provider
from gpu_swarm_spawner.capacity import Settings
from gpu_swarm_spawner.line import Entry
from gpu_swarm_spawner.placement import Request

from .clusters import node, task
from .fake_engine import FakeAPI, FakeDocker
from .waiting import until

NOW = 1_800_000_000.0
SETTINGS = Settings(min_machines=0, max_machines=4, slices_per_machine=3, empty_for=600)
QUOTA = (
    "ERROR: (gcloud.compute.instance-groups.managed.resize) Quota 'NVIDIA_T4_GPUS' exceeded. "
    "Limit: 4.0 in region europe-west4."
)
LOG = logging.getLogger("test_fleet")


def gpu_node(
    name: str, slices: int = 3, state: str = "ready", availability: str = "active", group=True
):
    """A GPU machine of the swarm: one of the cloud's group (joined by its start-up script,
    with the group's mark), or with ``group`` False a fixed one, joined by hand."""
    made = node(f"id-{name}", name, {f"GPU-{name}": slices}, state, availability)
    made["Version"] = {"Index": 7}
    if group:
        made["Description"]["Engine"] = {"Labels": {contract.FLEET_LABEL: contract.FLEET_GROUP}}
    return made


def server(name: str, slices: int = 1, service: str = "svc"):
    """A participant's server on ``name`` holding ``slices`` of its GPU."""
    return task(f"id-{name}", {f"GPU-{name}": slices}, service_id=service)


class Cloud:
    """The provider's commands, answered: ``said[action]`` the outcomes to give next (then
    ok), ``hang`` actions that never answer, ``held[action]`` an event each call of that
    action waits for before answering, ``calls`` each call made."""

    def __init__(self, why: str = ""):
        self.commands = SimpleNamespace(why=why)
        self.calls: list[tuple] = []
        self.said: dict[str, list[provider.Outcome]] = {}
        self.hang: set[str] = set()
        self.held: dict[str, asyncio.Event] = {}
        self.in_flight = 0
        self.most_at_once = 0

    async def _answer(self, action: str, what: str) -> provider.Outcome:
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        try:
            if action in self.hang:
                await asyncio.Event().wait()
            if action in self.held:
                await self.held[action].wait()
            await asyncio.sleep(0)
            queued = self.said.get(action) or []
            if queued:
                return queued.pop(0)
            return provider.Outcome(True, "", 0, "", 0.1, 1, what)
        finally:
            self.in_flight -= 1

    async def grow(self, count: int) -> provider.Outcome:
        self.calls.append(("grow", count))
        return await self._answer("grow", f"grow the group to {count}")

    async def remove(self, machine: str) -> provider.Outcome:
        self.calls.append(("remove", machine))
        return await self._answer("remove", f"remove {machine}")

    async def why(self) -> provider.Outcome:
        self.calls.append(("why",))
        return await self._answer("why", "why")


def refused(kind_text: str, what: str) -> provider.Outcome:
    return provider.Outcome(False, provider.classify(kind_text), 1, kind_text, 0.5, 1, what)


class Line:
    """The hub's broker as the keeper sees it: the line, the shared read, the line's note."""

    def __init__(self, slices: list[int | None] = ()):
        self.entries = [Entry(f"p{i}", Request(s)) for i, s in enumerate(slices)]
        self.fleet_note = ""

    def waiting(self):
        return list(self.entries)

    def tell_fleet_note(self, note):
        self.fleet_note = note

    async def read_swarm(self, read):
        return await read()


class Hub:
    """A hub's keeper over the fake swarm, on a clock the test moves."""

    def __init__(self, tmp_path, settings=SETTINGS, api=None, cloud=None, **kwargs):
        self.engine = FakeDocker()
        self.engine.node_list = []
        self.api = api(self.engine) if api else self.engine.api
        self.cloud = cloud or Cloud()
        self.line = Line()
        self.now = NOW
        self.tmp_path = tmp_path
        self.settings = settings
        self.kwargs = kwargs
        self.keeper = self.start()

    def start(self) -> fleet.FleetKeeper:
        """The keeper as a (re)started hub makes it, from the same folders."""
        self.keeper = fleet.FleetKeeper(
            self.settings,
            self.cloud,
            self.tmp_path / "data",
            self.tmp_path / "dashboard",
            log=LOG,
            client=self.api,
            broker_of=lambda: self.line,
            clock=lambda: self.now,
            **self.kwargs,
        )
        return self.keeper

    async def round(self, settle: bool = True):
        decisions = await asyncio.wait_for(self.keeper.round(), 2)
        if settle and self.keeper.call_task is not None:
            await asyncio.wait_for(asyncio.shield(self.keeper.call_task), 2)
        return [(d.action, d.machine or d.target) for d in decisions]

    def snapshot(self) -> dict:
        return json.loads((self.tmp_path / "dashboard" / fleet.SNAPSHOT_FILE).read_text())

    def events(self) -> list[events.Event]:
        path = self.tmp_path / "dashboard" / events.EVENTS_FILE
        return events.read_events(path.read_text().splitlines()) if path.exists() else []

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events()]

    def availability(self, name: str) -> str:
        return self.engine.api_node(name)["Spec"]["Availability"]


# ---- growing --------------------------------------------------------------------------------


async def test_people_in_line_are_asked_for_once_not_again_next_round_nor_after_a_restart(
    tmp_path,
):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    hub.engine.swarm_tasks = [server("gpu-1", service=f"s{i}") for i in range(3)]  # full
    hub.line = Line([1, 1, 1, 1])
    assert await hub.round() == [("grow", 3)]  # 4 slices missing: two machines of 3
    assert hub.cloud.calls == [("grow", 3)]
    assert [m["state"] for m in hub.snapshot()["machines"]] == ["ready", "asked", "asked"]
    assert hub.snapshot()["coming"]["machines"] == 2
    assert hub.kinds() == [events.FLEET_GROW]

    assert await hub.round() == [("nothing", 0)]  # the machines on their way cover them
    hub.now += 60
    hub.start()  # the hub restarts: what it asked for is still on its way
    assert await hub.round() == [("nothing", 0)]
    assert hub.cloud.calls == [("grow", 3)]
    assert hub.snapshot()["coming"]["machines"] == 2


async def test_a_machine_that_joins_takes_the_place_of_one_asked_for(tmp_path):
    hub = Hub(tmp_path)
    hub.line = Line([1, 1])
    await hub.round()
    assert hub.cloud.calls == [("grow", 1)]
    hub.now += 240
    hub.engine.node_list = [gpu_node("gpu-new", slices=4)]
    await hub.round()
    (machine,) = hub.snapshot()["machines"]
    assert (machine["name"], machine["state"], machine["slices"]) == ("gpu-new", "ready", 4)
    assert machine["reason"].startswith("asked at ")
    assert hub.snapshot()["coming"] is None
    assert hub.keeper.state.joins == [240.0]  # the line's next estimate learns from it
    assert hub.keeper.state.memory["gpu-new"].start == NOW  # paid for since it was asked for


async def test_a_full_gpu_in_line_counts_as_that_gpus_slices(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1", slices=4)]
    hub.engine.swarm_tasks = [server("gpu-1", slices=4)]
    hub.line = Line([None, 1])
    assert await hub.round() == [("grow", 3)]  # 5 slices: two machines of 4


def created(seconds_ago: float) -> str:
    """A task's ``CreatedAt`` as the Engine API writes it (nanoseconds, UTC), before NOW."""
    when = datetime.fromtimestamp(NOW - seconds_ago, tz=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


async def test_in_a_rush_the_servers_started_and_the_lines_joins_keep_slices_free(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    old, new = server("gpu-1", service="s0"), server("gpu-1", service="s1")
    hub.engine.swarm_tasks = [old, new, task("id-gpu-1", {}, service_id="no-gpu")]
    hub.line = Line([1])
    old["CreatedAt"], new["CreatedAt"] = created(3600), created(301)
    hub.engine.swarm_tasks[2]["CreatedAt"] = created(10)  # holds no slice: not counted
    hub.line.entries = [replace(e, joined=time.monotonic() - 400) for e in hub.line.entries]
    assert await hub.round() == [("nothing", 0)]  # 1 waits for gpu-1's 1 free slice
    # one server started 2 min ago, one person joined the line 30 s ago: 2 came in 5 min
    new["CreatedAt"] = created(120)
    hub.line.entries = [replace(e, joined=time.monotonic() - 30) for e in hub.line.entries]
    assert await hub.round() == [("grow", 2)]
    assert (
        "1 wait for 1 slice and 2 people came in the last 5 min, so 2 slices are kept free for "
        "the next; 1 slice free now" in hub.events()[-1].reason
    )


async def test_a_fixed_machine_covers_the_line_but_is_not_in_the_count_the_cloud_is_given(
    tmp_path,
):
    hub = Hub(tmp_path)
    own_2 = gpu_node("own-2", state="unknown", group=False)  # joining: not the cloud's to await
    hub.engine.node_list = [gpu_node("own-1", group=False), gpu_node("gpu-1"), own_2]
    hub.engine.swarm_tasks = [server("gpu-1", service=f"s{i}") for i in range(3)]  # full
    hub.line = Line([1, 1, 1])
    assert await hub.round() == [("nothing", 0)]  # own-1's free slices hold them
    assert hub.line.fleet_note == ""  # no machine on its way
    hub.line = Line([1, 1, 1, 1])
    assert await hub.round() == [("grow", 2)]  # gpu-1 and one more: own-1 is not the group's
    assert hub.cloud.calls == [("grow", 2)]
    made = hub.snapshot()
    assert {m["name"]: m["fixed"] for m in made["machines"]} == {
        "own-1": True, "own-2": True, "gpu-1": False, "asked-1": False,
    }  # fmt: skip
    assert made["group"] == 2
    assert made["machines"][1]["reason"].startswith("fixed: joined without the group's mark")
    assert made["coming"]["machines"] == 1  # asked-1, not own-2


async def test_a_fixed_machine_is_never_given_back_nor_in_the_cost(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("own-1", group=False), gpu_node("gpu-1")]
    assert await hub.round() == [("nothing", 0)]
    hub.now += 3600  # both empty for an hour: only the group's is given back
    assert await hub.round() == [("drain", "gpu-1")]
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]
    hub.engine.api_node("gpu-1")["Status"]["State"] = "down"  # the cloud ended it
    for _ in range(3):
        hub.now += 3600
        assert await hub.round() == [("nothing", 0)]
    assert hub.cloud.calls == [("remove", "gpu-1")]
    assert hub.availability("own-1") == "active"
    assert [(m["name"], m["state"]) for m in hub.snapshot()["machines"]] == [("own-1", "ready")]
    # the cost is the group's: gpu-1's, until its node was seen down, not own-1's four hours
    assert hub.snapshot()["cost"]["machine_hours"] == pytest.approx(7210 / 3600, abs=0.001)
    hub.start()  # a restart remembers own-1 as fixed...
    hub.engine.node_list = []  # ...when the organizer takes it out of the swarm
    hub.now += 10
    await hub.round()
    assert [(h["name"], h.get("fixed")) for h in hub.keeper.state.history] == [
        ("gpu-1", None), ("own-1", True),
    ]  # fmt: skip
    assert hub.snapshot()["cost"]["machine_hours"] == pytest.approx(7210 / 3600, abs=0.001)


async def test_a_machine_given_up_unseen_stays_in_the_groups_count_for_join_within(tmp_path):
    hub = Hub(tmp_path)
    hub.line = Line([1])
    await hub.round()
    hub.now += 901  # the join limit, 900 s, passed: asked-1 never joined
    assert await hub.round() == [("give up", "asked-1"), ("grow", 2)]
    # the cloud still holds asked-1: "grow to 1" would ask it for nothing
    assert hub.cloud.calls == [("grow", 1), ("grow", 2)]
    given = {m["name"]: m for m in hub.snapshot()["machines"]}["asked-1"]
    assert given["state"] == capacity.GIVEN_UP and given["since"] == NOW + 901
    assert "remove it in the cloud's console, the hub cannot name it" in given["reason"]
    assert hub.snapshot()["group"] == 2
    assert hub.kinds() == [events.FLEET_GROW, events.FLEET_GIVE_UP, events.FLEET_GROW]
    hub.now += 300
    hub.engine.node_list = [gpu_node("gpu-5")]
    hub.start()  # a restart keeps it counted
    assert await hub.round() == [("nothing", 0)]
    assert [g.name for g in hub.keeper.state.given_up] == ["asked-1"]
    assert hub.keeper.state.memory["gpu-5"].asked == NOW + 901  # asked-2's place
    hub.now += 601  # join_within after it was given up: taken to be removed by the organizer
    await hub.round()
    assert hub.keeper.state.given_up == [] and hub.snapshot()["group"] == 1
    assert [m["name"] for m in hub.snapshot()["machines"]] == ["gpu-5"]
    (ended,) = hub.keeper.state.history
    assert (ended["name"], ended["start"], ended["end"]) == ("asked-1", NOW, NOW + 1802)


async def test_a_machine_late_by_the_joins_seen_is_replaced_once_and_the_spare_given_back(
    tmp_path,
):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    hub.engine.swarm_tasks = [server("gpu-1", service=f"s{i}") for i in range(3)]  # full
    hub.keeper.state.joins = [100.0, 120.0, 110.0]  # 110 s here; the setting says 300
    hub.line = Line([1])
    assert await hub.round() == [("grow", 2)]
    hub.now += 160
    assert await hub.round() == [("nothing", 0)]  # late after 1.5 x 110 s
    hub.now += 10
    assert await hub.round() == [("grow", 3)]
    hub.now += 10
    assert await hub.round() == [("nothing", 0)]  # asked-2 on its way covers the line
    assert hub.cloud.calls == [("grow", 2), ("grow", 3)]
    assert hub.snapshot()["group"] == 3
    reason = hub.events()[-1].reason
    assert reason.endswith(
        "asked-1 is late: asked 170 s ago, a machine usually joins in 110 s; one more asked in "
        "its place"
    )
    # asked-1 joins after all and the one waiting starts there; asked-2 joins and stays empty
    hub.now += 60
    hub.engine.node_list += [gpu_node("gpu-late"), gpu_node("gpu-spare")]
    hub.engine.swarm_tasks += [server("gpu-late", service="s9")]
    hub.line = Line()
    assert await hub.round() == [("nothing", 0)]
    assert hub.keeper.state.memory["gpu-late"].asked == NOW  # asked-1's place
    hub.now += 601
    assert await hub.round() == [("drain", "gpu-spare")]


# ---- giving back ----------------------------------------------------------------------------


async def test_an_empty_machine_is_paused_after_empty_for_then_removed_then_forgotten(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    assert await hub.round() == [("nothing", 0)]
    hub.now += 599
    assert await hub.round() == [("nothing", 0)]  # not yet: empty for 599 s of 600
    hub.now += 2
    assert await hub.round() == [("drain", "gpu-1")]
    assert hub.availability("gpu-1") == "pause"
    assert hub.cloud.calls == []  # paused first
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]
    assert hub.engine.node_task_reads[-1] == "id-gpu-1"  # its tasks read right before
    assert hub.cloud.calls == [("remove", "gpu-1")]
    assert hub.snapshot()["machines"][0]["state"] == "leaving"
    hub.engine.api_node("gpu-1")["Status"]["State"] = "down"  # the cloud ended it
    hub.now += 10
    await hub.round()
    assert ("node rm", "id-gpu-1") in hub.engine.changes
    assert hub.snapshot()["machines"] == []
    assert hub.kinds() == [events.FLEET_DRAIN, events.FLEET_REMOVE]
    assert hub.snapshot()["cost"]["machine_hours"] == pytest.approx(621 / 3600, abs=0.001)


async def test_a_machine_with_a_server_is_never_paused_nor_removed(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1"), gpu_node("gpu-2")]
    hub.engine.swarm_tasks = [server("gpu-2")]
    for _ in range(5):
        await hub.round()
        for removed in hub.engine.node_list:
            if ("remove", removed["Description"]["Hostname"]) in hub.cloud.calls:
                removed["Status"]["State"] = "down"  # the cloud ended it
        hub.now += 3600
    assert hub.availability("gpu-2") == "active"
    assert ("remove", "gpu-2") not in hub.cloud.calls
    assert ("remove", "gpu-1") in hub.cloud.calls  # the empty one went


AWS_GONE = (
    "An error occurred (ValidationError) when calling the TerminateInstanceInAutoScalingGroup "
    "operation: Instance Id not found - No managed instance found for instance ID gpu-1"
)


def down(hub, name: str) -> None:
    hub.engine.api_node(name)["Status"]["State"] = "down"


async def test_a_group_machine_down_counts_in_the_group_then_is_removed_then_forgotten(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1"), gpu_node("gpu-2")]
    hub.engine.swarm_tasks = [server("gpu-1")]  # Swarm still lists it once the node is down
    await hub.round()
    down(hub, "gpu-1")  # its engine died: the cloud still has it, and bills it
    hub.now += 10
    assert await hub.round() == [("nothing", 0)]
    assert hub.snapshot()["group"] == 2
    hub.line = Line([1, 1, 1, 1])  # gpu-2's 3 free slices do not cover them
    hub.now += 10
    assert await hub.round() == [("grow", 3)]  # gpu-1 is in the cloud's 2
    hub.line = Line()
    hub.now += 290  # down for 300 s, the expected boot-and-join: not yet
    await hub.round()
    assert ("remove", "gpu-1") not in hub.cloud.calls
    # paid for while down: gpu-1's 310 s, gpu-2's, and asked-1's since NOW + 20
    hours = (310 + 310 + 290) / 3600
    assert hub.snapshot()["cost"]["machine_hours"] == pytest.approx(hours, abs=0.001)
    hub.now += 1
    hub.cloud.held["remove"] = asyncio.Event()
    assert ("remove", "gpu-1") in await hub.round(settle=False)
    assert hub.cloud.calls[-1] == ("remove", "gpu-1")  # with a server still listed on it
    assert "id-gpu-1" not in hub.engine.node_task_reads  # its tasks not read again: it is down
    reason = hub.snapshot()["decisions"][-1]["reason"]
    assert reason.startswith("gpu-1 has been down for 5 min (limit 5 min): given back")
    hub.now += 10
    await hub.round(settle=False)  # its node stays while the cloud has not answered
    assert ("node rm", "id-gpu-1") not in hub.engine.changes
    hub.cloud.held["remove"].set()
    await asyncio.wait_for(hub.keeper.call_task, 2)
    hub.now += 10
    await hub.round()
    assert ("node rm", "id-gpu-1") in hub.engine.changes
    assert hub.snapshot()["group"] == 2  # gpu-2 and the one asked for
    assert hub.kinds()[-1] == events.FLEET_REMOVE
    (ended,) = hub.keeper.state.history
    assert (ended["name"], ended["end"]) == ("gpu-1", NOW + 331)  # paid for until removed


async def test_a_machine_the_cloud_took_back_ends_cleanly_when_the_remove_says_not_found(
    tmp_path,
):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    down(hub, "gpu-1")  # a spot machine taken back
    hub.cloud.said["remove"] = [
        provider.Outcome(False, provider.NOT_IN_GROUP, 254, AWS_GONE, 0.5, 1, "remove gpu-1")
    ]
    hub.now += 10
    await hub.round()
    hub.now += 301
    assert await hub.round() == [("remove", "gpu-1")]
    last = hub.snapshot()["provider"]["last"]
    assert (last["ok"], last["kind"]) == (True, "")
    assert last["told"] == "remove gpu-1: already gone in the cloud"
    assert hub.snapshot()["provider"]["blocked_until"] is None  # no back-off
    assert hub.kinds() == [events.FLEET_REMOVE]
    assert hub.events()[-1].reason == "remove gpu-1: already gone in the cloud"
    hub.now += 10
    hub.line = Line([1])
    assert await hub.round() == [("grow", 1)]  # forgotten, and a grow not held back
    assert ("node rm", "id-gpu-1") in hub.engine.changes
    assert hub.cloud.calls == [("remove", "gpu-1"), ("grow", 1)]


async def test_a_failed_removal_of_a_machine_down_is_asked_again_then_left_to_the_organizer(
    tmp_path,
):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    down(hub, "gpu-1")
    failed = provider.Outcome(False, provider.UNKNOWN, 1, "boom", 0.5, 3, "remove gpu-1")
    hub.cloud.said["remove"] = [failed] * 10
    hub.now += 10
    await hub.round()
    hub.now += 301
    assert await hub.round() == [("remove", "gpu-1")]
    assert hub.kinds() == [events.FLEET_FAILED]
    assert hub.events()[-1].reason.endswith("; gpu-1 is down: asked again after the back-off")
    assert hub.snapshot()["group"] == 1  # still counted: the cloud may have it
    hub.now += 10
    await hub.round()
    assert len(hub.cloud.calls) == 1  # the back-off (30 s) first
    hub.now += 30
    await hub.round()
    assert len(hub.cloud.calls) == 2
    hub.now += 600  # down for twice the bound
    await hub.round()
    assert hub.events()[-1].reason.endswith(
        "gpu-1 has been down for 16 min and is no longer counted in the cloud's group: if it "
        "is still there, remove it in the cloud's console"
    )
    hub.now += 10
    await hub.round()
    assert ("node rm", "id-gpu-1") in hub.engine.changes and hub.snapshot()["group"] == 0
    assert len(hub.cloud.calls) == 3


async def test_a_fixed_machine_down_is_never_removed_nor_in_the_groups_count(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("own-1", group=False)]
    await hub.round()
    down(hub, "own-1")
    for _ in range(3):
        hub.now += 3600
        await hub.round()
    assert hub.cloud.calls == [] and hub.snapshot()["group"] == 0
    assert ("node rm", "id-own-1") not in hub.engine.changes


async def test_a_restart_during_the_removal_of_a_machine_down_asks_again(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    down(hub, "gpu-1")
    hub.now += 10
    await hub.round()
    hub.now += 301
    hub.cloud.hang.add("remove")
    await hub.round(settle=False)
    hub.keeper.call_task.cancel()
    hub.cloud.hang.clear()
    hub.start()  # the hub restarts: the removal's answer never came
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]
    assert hub.cloud.calls == [("remove", "gpu-1"), ("remove", "gpu-1")]


class PlacedMeanwhile(FakeAPI):
    """Swarm places a server on the paused machine between the round's read and the removal's
    (a spawn that chose it before the pause)."""

    def tasks(self, filters=None):
        if (filters or {}).get("node") == "id-gpu-1":
            self.engine.swarm_tasks.append(server("gpu-1"))
        return super().tasks(filters)


async def test_a_server_placed_between_the_read_and_the_removal_stops_it_and_resumes(tmp_path):
    hub = Hub(tmp_path, api=PlacedMeanwhile)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    hub.now += 700
    assert await hub.round() == [("drain", "gpu-1")]
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]  # the round saw it empty
    assert hub.cloud.calls == []  # ... but the second look found a server
    assert hub.availability("gpu-1") == "active"
    assert hub.snapshot()["machines"][0]["state"] == "ready"
    assert hub.kinds()[-1] == events.FLEET_RESUME


async def test_a_paused_machine_is_resumed_when_people_wait_instead_of_asking_the_cloud(
    tmp_path,
):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    hub.now += 700
    assert await hub.round() == [("drain", "gpu-1")]
    assert hub.availability("gpu-1") == "pause"
    hub.line = Line([1])
    hub.now += 10
    assert await hub.round() == [("resume", "gpu-1")]
    assert hub.availability("gpu-1") == "active"
    assert hub.cloud.calls == []


# ---- the cloud says no -------------------------------------------------------------------------


async def test_a_refusal_is_in_the_snapshot_the_events_and_the_lines_words_at_once(tmp_path):
    hub = Hub(tmp_path)
    hub.cloud.said["grow"] = [refused(QUOTA, "grow the group to 1")]
    hub.line = Line([1])
    await hub.round()  # the grow is answered before the next round
    last = hub.snapshot()["provider"]["last"]
    assert (last["action"], last["ok"], last["kind"]) == ("grow", False, provider.QUOTA)
    assert "Quota 'NVIDIA_T4_GPUS' exceeded" in last["output"]
    assert "ask the cloud for a higher quota" in last["told"]
    assert hub.snapshot()["provider"]["blocked_until"] == NOW + 600
    (failed,) = [e for e in hub.events() if e.kind == events.FLEET_FAILED]
    assert failed.action == provider.QUOTA and "quota" in failed.reason
    assert hub.line.fleet_note == provider.FOR_THE_LINE[provider.QUOTA].strip()
    assert hub.snapshot()["coming"] is None  # not counted as on its way
    said = line.waiting_message(1, 1, None, False, hub.line.fleet_note)
    assert "No more GPU machines can be added right now" in said
    hub.now += 60
    await hub.round()
    assert hub.cloud.calls == [("grow", 1)]  # not again during the back-off
    hub.now += 600
    await hub.round()
    assert hub.cloud.calls == [("grow", 1), ("grow", 1)]


async def test_a_launch_the_cloud_failed_later_is_told_by_the_why_command(tmp_path):
    hub = Hub(tmp_path, cloud=Cloud(why="gcloud compute instance-groups managed list-errors"))
    hub.line = Line([1])
    await hub.round()
    assert hub.line.fleet_note.startswith("A GPU machine is on its way (about 5 minutes)")
    hub.now += 200
    await hub.round()
    assert hub.cloud.calls == [("grow", 1)]  # not late yet
    stockout = "ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources"
    hub.cloud.said["why"] = [refused(stockout, "why")]
    hub.now += 120
    await hub.round()
    assert hub.cloud.calls == [("grow", 1), ("why",)]
    assert hub.snapshot()["provider"]["last"]["kind"] == provider.NO_CAPACITY
    assert hub.snapshot()["coming"] is None
    assert hub.line.fleet_note == provider.FOR_THE_LINE[provider.NO_CAPACITY].strip()


async def test_a_provider_call_that_hangs_holds_no_round_and_no_second_call_starts(tmp_path):
    hub = Hub(tmp_path)
    hub.cloud.hang.add("grow")
    hub.engine.node_list = [gpu_node("gpu-1"), gpu_node("gpu-2")]
    hub.engine.swarm_tasks = [server("gpu-1", 3)]
    hub.line = Line([3, 3])
    await hub.round(settle=False)
    for _ in range(3):
        hub.now += 3600  # gpu-2 has long been empty, and more people wait
        hub.line = Line([3, 3, 3, 3])
        await hub.round(settle=False)  # each within 2 s
    assert hub.snapshot()["provider"]["busy"] is True
    assert hub.cloud.calls == [("grow", 3)]
    assert hub.cloud.most_at_once == 1
    hub.keeper.call_task.cancel()


# ---- the line's words ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer, then",
    [
        (None, "A GPU machine is on its way (about 5 minutes)."),
        (QUOTA, provider.FOR_THE_LINE[provider.QUOTA].strip()),
    ],
)
async def test_the_line_reads_that_the_hub_asks_until_the_cloud_said_yes_or_no(
    tmp_path, answer, then
):
    """While the grow command runs (Azure's waits until the machines are made), nobody is told
    a machine is on its way: they read that the hub is asking; then what the cloud said."""
    hub = Hub(tmp_path)
    hub.cloud.held["grow"] = asked = asyncio.Event()
    if answer:
        hub.cloud.said["grow"] = [refused(answer, "grow the group to 1")]
    hub.line = Line([1])
    assert await hub.round(settle=False) == [("grow", 1)]
    assert hub.line.fleet_note == capacity.ASKING_MESSAGE
    assert hub.snapshot()["coming"]["machines"] == 1  # the organizer sees it asked for
    hub.now += 10
    await hub.round(settle=False)  # a round during the call says the same
    assert hub.line.fleet_note == capacity.ASKING_MESSAGE
    asked.set()
    await asyncio.wait_for(hub.keeper.call_task, 2)
    assert hub.line.fleet_note == then
    assert hub.cloud.calls == [("grow", 1)]


async def test_someone_joining_the_line_starts_a_round_at_once_not_at_the_next(tmp_path):
    """The keeper's rounds are an hour apart here: the newcomer's bell (the broker's
    ``line_joined``) is what brings the round that asks for a machine."""
    bell = asyncio.Event()
    hub = Hub(tmp_path, every=3600, soonest=0, line_joined=lambda: bell)
    keeping = asyncio.ensure_future(hub.keeper.keep())
    await until(lambda: hub.keeper.state.last_round)  # the first round, at once
    hub.line = Line([1])
    await asyncio.sleep(0.1)
    assert hub.cloud.calls == []  # nobody rang: the next round is an hour away
    bell.set()
    await until(lambda: hub.cloud.calls == [("grow", 1)])
    await until(lambda: hub.line.fleet_note.startswith("A GPU machine is on its way"))
    bell.set()  # another newcomer: a round, and never a second grow for the same people
    await until(lambda: not bell.is_set())
    await asyncio.sleep(0.1)
    assert hub.cloud.calls == [("grow", 1)]
    keeping.cancel()


async def test_a_burst_of_wake_ups_brings_one_round_no_sooner_than_the_least_gap():
    gate, began = asyncio.Event(), []
    wake = asyncio.Event()

    async def one_round():
        began.append(asyncio.get_running_loop().time())
        if len(began) == 1:
            await gate.wait()

    keeping = asyncio.ensure_future(periodic.keep(one_round, 3600, LOG, "round", wake, 0.3))
    await until(lambda: began)
    for _ in range(20):  # twenty newcomers during the first round
        wake.set()
        await asyncio.sleep(0)
    gate.set()
    await until(lambda: len(began) == 2)
    await asyncio.sleep(0.4)
    assert len(began) == 2  # one round for all of them, then the hour's wait
    assert began[1] - began[0] >= 0.29
    keeping.cancel()


async def test_people_in_line_read_that_a_machine_is_on_its_way(tmp_path):
    from .test_waiting_line import full_hub, messages

    spawner = full_hub(waiting_line="auto")
    start = asyncio.ensure_future(spawner.start())
    await until(lambda: any("in line" in m for m in messages(spawner)))
    hub = Hub(tmp_path)
    hub.line = spawner.broker  # the hub's own broker: its line and its read
    hub.engine.node_list = [gpu_node("gpu-1")]
    hub.engine.swarm_tasks = [server("gpu-1", 3)]
    await hub.round()
    assert hub.cloud.calls == [("grow", 2)]
    await until(lambda: "A GPU machine is on its way (about 5 minutes)." in messages(spawner)[-1])
    assert messages(spawner)[-1].startswith("No GPU has room for your server right now.")
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start


# ---- what is kept, what is shown ----------------------------------------------------------------


async def test_a_restart_keeps_how_long_a_machine_has_been_empty(tmp_path):
    hub = Hub(tmp_path)
    hub.engine.node_list = [gpu_node("gpu-1")]
    await hub.round()
    hub.now += 601
    hub.start()
    assert await hub.round() == [("drain", "gpu-1")]
    hub.start()
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]  # it knows it paused it


async def test_a_state_file_it_cannot_read_is_set_aside_and_the_fleet_starts_afresh(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / fleet.STATE_FILE).write_text("{cut short")
    hub = Hub(tmp_path)
    assert hub.keeper.state == fleet.State()
    assert (tmp_path / "data" / (fleet.STATE_FILE + ".unreadable")).exists()


async def test_the_snapshot_has_the_plans_schema(tmp_path):
    hub = Hub(tmp_path, price_per_hour=2.5)
    hub.engine.node_list = [gpu_node("gpu-1")]
    hub.engine.swarm_tasks = [server("gpu-1", 2)]
    hub.line = Line([1, 1])
    await hub.round()
    hub.now += 400  # the machine asked for is not late yet (capacity.late_after)
    await hub.round()
    made = hub.snapshot()
    assert set(made) == {
        "at", "fleet", "min", "max", "floor", "group", "machines", "coming", "provider", "cost",
        "decisions",
    }  # fmt: skip
    assert (made["at"], made["fleet"], made["min"], made["max"], made["floor"]) == (
        NOW + 400, "on", 0, 4, 0,
    )  # fmt: skip
    assert made["group"] == 2  # gpu-1 and the machine asked for
    for machine in made["machines"]:
        assert set(machine) == {
            "name", "state", "since", "servers", "free", "slices", "reason", "fixed",
        }  # fmt: skip
        assert machine["state"] in capacity.STATES and machine["fixed"] is False
    ready = made["machines"][0]
    assert (ready["name"], ready["servers"], ready["free"], ready["slices"]) == ("gpu-1", 1, 1, 3)
    assert set(made["coming"]) == {"machines", "ready_in"}
    assert set(made["provider"]) == {"busy", "last", "blocked_until"}
    assert set(made["provider"]["last"]) == {"action", "at", "ok", "kind", "told", "output"}
    cost = made["cost"]
    # gpu-1 and the machine asked for, 400 s each
    assert cost["machine_hours"] == pytest.approx(2 * 400 / 3600, abs=0.001)
    assert cost["slice_hours_used"] == pytest.approx(2 * fleet.GAP_S / 3600, abs=0.001)
    assert cost["estimated"] == pytest.approx(cost["machine_hours"] * 2.5, abs=0.01)
    assert cost["price_per_hour"] == 2.5
    (grow,) = made["decisions"]
    assert set(grow) == {"at", "action", "machine", "target", "reason"}
    assert (grow["action"], grow["target"]) == ("grow", 2)
    assert "2 wait for 2 slices" in grow["reason"]

    unpriced = Hub(tmp_path / "unpriced")
    await unpriced.round()
    assert unpriced.snapshot()["cost"]["price_per_hour"] is None
    assert unpriced.snapshot()["cost"]["estimated"] is None


# ---- the idle stop ---------------------------------------------------------------------------


class Servers:
    """JupyterHub's servers as the keeper reads and stops them (``internals.running_servers``,
    ``internals.stop_idle_server``): a stop removes the server's service's tasks from the
    swarm unless ``linger`` (Swarm still lists them for a while)."""

    def __init__(self, hub: Hub, idle: dict[str, float | None], linger: bool = False):
        self.hub, self.linger = hub, linger
        self.idle = dict(idle)  # user: last activity
        self.stops: list[tuple[str, float]] = []
        self.told: dict[str, str] = {}  # user: what their page reads, once stopped
        self.reads = 0
        hub.engine.swarm_tasks = hub.engine.swarm_tasks or []

    def place(self, machine: str, *users: str, running_since: str = "") -> None:
        """Their servers on ``machine``, their tasks running since ``running_since`` (Swarm's
        timestamp; "": not said)."""
        placed = [server(machine, service=f"svc-{u}") for u in users]
        for t in placed:
            if running_since:
                t["Status"]["Timestamp"] = running_since
        self.hub.engine.swarm_tasks += placed

    def running(self):
        self.reads += 1
        return [fleet.HubServer(u, "", f"svc-{u}", seen) for u, seen in self.idle.items()]

    async def stop(self, running, idle_since: float, why: str) -> bool:
        self.stops.append((running.user, idle_since))
        if (self.idle[running.user] or idle_since + 1) > idle_since:
            return False  # active again since the round read it
        del self.idle[running.user]
        self.told[running.user] = why
        if not self.linger:
            gone = f"svc-{running.user}"
            self.hub.engine.swarm_tasks = [
                t for t in self.hub.engine.swarm_tasks if t["ServiceID"] != gone
            ]
        return True


IDLE = replace(SETTINGS, stop_idle_after=1200)


def idle_hub(tmp_path, idle, settings=IDLE, linger=False, nodes=("gpu-1", "gpu-2")):
    hub = Hub(tmp_path, settings=settings)
    hub.engine.node_list = [gpu_node(n) if isinstance(n, str) else n for n in nodes]
    servers = Servers(hub, idle, linger)
    hub.kwargs = {"hub_servers": servers.running, "stop_server": servers.stop}
    hub.start()
    return hub, servers


async def test_a_machine_whose_servers_are_all_idle_is_emptied_then_given_back(tmp_path):
    hub, servers = idle_hub(tmp_path, {"al": NOW - 1300, "bo": NOW - 1250, "cy": NOW - 5})
    servers.place("gpu-1", "al", "bo")
    servers.place("gpu-2", "cy")
    assert await hub.round() == [("stop idle", "gpu-1")]
    assert servers.stops == [("al", NOW - 1200), ("bo", NOW - 1200)]  # cy is at work
    # each told on their page why, with their own time without activity
    assert servers.told == {
        "al": capacity.idle_stop_message(NOW, 1300),
        "bo": capacity.idle_stop_message(NOW, 1250),
    }
    assert "after 21 minutes without activity" in servers.told["al"]
    assert "after 20 minutes without activity" in servers.told["bo"]
    last = hub.snapshot()["decisions"][-1]
    assert (last["action"], last["machine"]) == ("stop idle", "gpu-1")
    assert last["reason"].startswith("gpu-1's 2 servers idle for 20+ min")
    assert last["reason"].endswith("(files kept, kernels lost): al, bo")
    (event,) = hub.events()
    assert (event.kind, event.node, event.reason) == (
        events.FLEET_STOP_IDLE,
        "gpu-1",
        last["reason"],
    )
    machines = {m["name"]: m for m in hub.snapshot()["machines"]}
    assert machines["gpu-1"]["reason"] == last["reason"]  # the GPU machines' table says why
    hub.now += 300
    assert await hub.round() == [("nothing", 0)]  # cy's machine kept: cy is at work
    hub.now += 301
    assert await hub.round() == [("drain", "gpu-1")]  # empty for GPUHUB_FLEET_EMPTY_FOR
    hub.now += 10
    assert await hub.round() == [("remove", "gpu-1")]
    assert [s for s, _ in servers.stops] == ["al", "bo"]
    assert hub.availability("gpu-2") == "active"


async def test_never_a_server_in_use_nor_while_people_wait_nor_with_the_setting_at_0(tmp_path):
    hub, servers = idle_hub(tmp_path / "in use", {"al": NOW - 1300, "bo": NOW - 1100})
    servers.place("gpu-1", "al", "bo")
    assert await hub.round() == [("nothing", 0)]
    assert servers.stops == []

    hub, servers = idle_hub(tmp_path / "line", {"al": NOW - 1300})
    servers.place("gpu-1", "al")
    hub.line = Line([1])
    await hub.round()
    assert servers.stops == []

    hub, servers = idle_hub(tmp_path / "off", {"al": NOW - 99999}, settings=SETTINGS)
    servers.place("gpu-1", "al")
    assert await hub.round() == [("nothing", 0)]
    assert (servers.stops, servers.reads) == ([], 0)  # JupyterHub not even read

    own = gpu_node("own-1", group=False)
    hub, servers = idle_hub(tmp_path / "fixed", {"al": NOW - 99999}, nodes=[own])
    servers.place("own-1", "al")
    await hub.round()
    assert servers.stops == []


async def test_a_server_is_not_idle_before_it_runs_though_its_wait_in_line_was_long(tmp_path):
    # JupyterHub wrote al's activity when the start began; al then waited in line 25 min
    hub, servers = idle_hub(tmp_path, {"al": NOW - 1500}, nodes=["gpu-1"])
    started = datetime.fromtimestamp(NOW - 60, tz=timezone.utc).isoformat()
    servers.place("gpu-1", "al", running_since=started.replace("+00:00", ".000000001Z"))
    assert await hub.round() == [("nothing", 0)]
    hub.now += 1139
    assert await hub.round() == [("nothing", 0)]
    hub.now += 1  # 20 min after its task began running
    assert await hub.round() == [("stop idle", "gpu-1")]


async def test_a_server_active_again_before_its_stop_is_kept_and_said(tmp_path):
    hub, servers = idle_hub(tmp_path, {"al": NOW - 1300, "bo": NOW - 1300})
    servers.place("gpu-1", "al", "bo")
    real = servers.running

    def read_then_bo_comes_back():
        running = real()
        servers.idle["bo"] = NOW  # between the round's read and the stop
        return running

    servers.running = read_then_bo_comes_back
    hub.kwargs = {"hub_servers": servers.running, "stop_server": servers.stop}
    hub.start()
    assert await hub.round() == [("stop idle", "gpu-1")]
    assert list(servers.told) == ["al"]  # bo's page says nothing: still running
    (event,) = hub.events()
    assert event.reason.endswith("al, bo; kept, active again or not stopped: bo")
    assert "bo" in servers.idle and "al" not in servers.idle


async def test_a_machine_emptied_counts_as_given_back_while_its_stopped_servers_linger(tmp_path):
    floor_1 = replace(IDLE, min_machines=1)
    hub, servers = idle_hub(tmp_path, {"al": NOW - 1800, "bo": NOW - 1300}, floor_1, linger=True)
    servers.place("gpu-1", "al")
    servers.place("gpu-2", "bo")
    assert await hub.round() == [("stop idle", "gpu-1")]
    hub.now += 10  # al's task is still listed: gpu-1 is not one that keeps servers
    assert await hub.round() == [("nothing", 0)]
    assert [s for s, _ in servers.stops] == ["al"]


def test_the_fleets_events_read_back_without_a_participant():
    written = events.Event(NOW, events.FLEET_DRAIN, "", node="gpu-1", reason="empty")
    assert events.read_events([events.encode(written)]) == [written]
    assert events.read_events(['{"time": 1, "kind": "started"}']) == []  # a start has a user
