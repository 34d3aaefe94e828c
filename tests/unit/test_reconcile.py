"""The hub's view, Swarm's and the proxy's brought back into agreement: the pure rules
(``reconcile.py``), what the spawner does with them after a hub restart and at a new start,
and the keeper's loops (``keeper.py``) against stand-ins for the proxy and the swarm."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import sqlalchemy
import sqlalchemy.orm
from jupyterhub import orm

from gpu_swarm_spawner import contract, events, healing, reconcile
from gpu_swarm_spawner.holding import Holding
from gpu_swarm_spawner.keeper import KeepingProxy
from gpu_swarm_spawner.reconcile import Health

from .clusters import node
from .fake_docker import make_fake

NET = "jhub"


def task(state, desired="running", node_id="n1", address="10.0.8.5", err="", created="1"):
    return {
        "ID": f"t{created}",
        "CreatedAt": created,
        "NodeID": node_id,
        "DesiredState": desired,
        "Status": {"State": state, **({"Err": err} if err else {})},
        "NetworksAttachments": [
            {"Network": {"Spec": {"Name": NET}}, "Addresses": [f"{address}/24"]}
        ],
    }


# ---- verdict -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tasks_, states, health, reason",
    [
        ([task("running")], {"n1": "ready"}, Health.RUNNING, ""),
        ([task("running")], {"n1": "down"}, Health.RECOVERING, "its machine is down"),
        ([task("running")], {"n1": "unknown"}, Health.RECOVERING, "its machine is unknown"),
        # the engine restarted: the old task failed, its replacement is on its way
        (
            [task("failed", "shutdown"), task("preparing", created="2")],
            {},
            Health.RECOVERING,
            "Swarm is restarting it (task preparing)",
        ),
        # rejected and retried (Docker 20.10's network attachment bug; a missing NFS mount)
        (
            [task("rejected", err="bind source path does not exist: /srv/x")],
            {},
            Health.RECOVERING,
            "Swarm is restarting it (task rejected: bind source path does not exist: /srv/x)",
        ),
        # it ran; its replacement cannot be placed (its machine, with its GPU, is away)
        (
            [
                task("running", "shutdown"),
                task("pending", node_id="", err="no suitable node (1 node)", created="2"),
            ],
            {},
            Health.RECOVERING,
            "Swarm cannot place it again yet (no suitable node (1 node))",
        ),
        # never placed: a start that lost its slice, not a server coming back
        (
            [task("pending", node_id="", err="no suitable node (1 node)")],
            {},
            Health.GONE,
            "cannot be placed: no suitable node (1 node)",
        ),
        ([task("failed", err="exit 137")], {}, Health.RECOVERING, "Swarm is replacing it"),
        ([task("complete", "shutdown")], {}, Health.GONE, "task complete: "),
        ([], {}, Health.GONE, "its service is gone"),
    ],
)
def test_what_a_servers_tasks_say(tasks_, states, health, reason):
    seen = reconcile.verdict(tasks_, states, NET)
    assert seen.health is health
    assert seen.reason.startswith(reason), seen.reason
    assert seen.address == ("10.0.8.5" if health is Health.RUNNING else "")


def test_slices_held_by_a_users_live_tasks_are_counted_from_their_containers_labels():
    def held(user, slices, state="running"):
        labels = {contract.USER_LABEL: user, contract.SLICES_LABEL: str(slices)}
        return {"Status": {"State": state}, "Spec": {"ContainerSpec": {"Labels": labels}}}

    read = [held("ada", 1), held("ada", 3, "shutdown"), held("bob", 2), {"Status": {}}]
    assert reconcile.held_by_user(read, "ada") == 1
    assert reconcile.held_by_user(read, "bob") == 2
    assert reconcile.held_by_user(read, "carol") == 0


# ---- services nobody owns ------------------------------------------------------------------------


def service(sid, name, user="ada"):
    labels = {contract.USER_LABEL: user} if user else {}
    return {"ID": sid, "Spec": {"Name": name, "Labels": labels}}


def test_a_service_nobody_owns_is_due_after_the_grace_and_one_owned_again_is_forgotten():
    seen = reconcile.Sightings()
    listed = [service("s1", "jy-ada"), service("s2", "jy-bob", "bob"), service("s3", "x", "")]
    assert seen.due(listed, owned={"jy-bob"}, now=100.0, grace=30) == []
    assert seen.due(listed, owned={"jy-bob"}, now=129.0, grace=30) == []
    (due,) = seen.due(listed, owned={"jy-bob"}, now=130.0, grace=30)
    assert (due.service_id, due.name, due.user, due.seen_for) == ("s1", "jy-ada", "ada", 30.0)
    # owned again (its participant started it meanwhile): the count starts afresh later
    assert seen.due(listed, owned={"jy-ada", "jy-bob"}, now=131.0, grace=30) == []
    assert seen.due(listed, owned={"jy-bob"}, now=140.0, grace=30) == []
    seen.removed("s1")
    assert seen.first_seen == {}


def test_routes_the_proxy_lacks_or_points_elsewhere_are_mended():
    routes = {"/": {"target": "http://hub:8081"}, "/user/a/": {"target": "http://10.0.0.1:8888"}}
    wanted = {
        "/": "http://hub:8081",
        "/user/a/": "http://10.0.0.9:8888",  # moved
        "/user/b/": "http://10.0.0.2:8888",  # missing
    }
    assert reconcile.routes_to_mend(routes, wanted) == ["/user/a/", "/user/b/"]
    assert reconcile.routes_to_mend({}, {}) == []


# ---- the spawner after a hub restart, and at a new start ---------------------------------------


def with_reservation(svc: dict, uuid: str, slices: int, user: str) -> None:
    """Make a fake service's task hold ``slices`` of ``uuid`` as Swarm would count them."""
    generic = [{"DiscreteResourceSpec": {"Kind": uuid, "Value": slices}}]
    labels = {contract.USER_LABEL: user, contract.SLICES_LABEL: str(slices)}
    svc["task"]["Spec"] = {
        "Resources": {"Reservations": {"GenericResources": generic}},
        "ContainerSpec": {"Labels": labels},
    }


async def test_after_a_hub_killed_mid_spawn_the_server_is_found_where_it_runs_with_its_slices():
    """The hub saved neither the service's id nor the GPU before it died; the server runs."""
    spawner = make_fake(server_lost_after=5)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    spawner.holding = Holding(gpu="GPU-a0", slices=1)
    await spawner.create_object()
    spawner.clear_state()  # what the hub's database had: nothing of it
    spawner.object_id = ""
    spawner.server = SimpleNamespace(proto="http", ip="", port=0, base_url="/user/alice-smith/")
    assert await spawner.poll() is None
    url = await spawner.get_url()
    assert url == f"http://{spawner.task_address}:8888/user/alice-smith/"
    assert (spawner.holding.gpu, spawner.holding.slices) == ("GPU-a0", 1)
    assert spawner.object_id == "svc1"


async def test_after_a_hub_restart_a_server_swarm_is_replacing_is_waited_for():
    spawner = make_fake(server_lost_after=5)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.create_object()
    (svc,) = spawner.services.values()
    svc["task"]["Status"] = {"State": "starting"}
    spawner.server = SimpleNamespace(proto="http", ip="10.0.0.1", port=8888, base_url="/u/")
    calls = []

    async def running_soon(delay):
        calls.append(delay)
        svc["task"]["Status"] = {"State": "running"}

    import gpu_swarm_spawner.spawner as module

    real_sleep = module.asyncio.sleep
    module.asyncio.sleep = running_soon
    try:
        url = await spawner.get_url()
    finally:
        module.asyncio.sleep = real_sleep
    assert calls == [1.0]
    assert url == f"http://{spawner.task_address}:8888/u/"


async def with_leftover(**traits):
    """A spawner whose hub forgot its server (no id, no GPU in its state) while the server's
    service goes on holding the only slice of GPU-a0."""
    spawner = make_fake(dashboard_dir="", **traits)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 1})]
    spawner.holding = Holding(gpu="GPU-a0", slices=1)
    await spawner.create_object()
    (leftover,) = spawner.services.values()
    with_reservation(leftover, "GPU-a0", 1, "alice-smith")
    spawner.clear_state()
    spawner.object_id = ""
    return spawner


async def test_a_participant_is_never_refused_for_the_slices_their_own_leftover_server_holds():
    """The event day: the hub had let a server go that Swarm went on running; its
    participant pressed Start and read "All GPU slices are in use (1/1)"."""
    spawner = await with_leftover(inventory_max_age=0)
    # another participant is refused: that slice is taken
    other = make_fake("bob", inventory_max_age=0)
    other.nodes, other.services = spawner.nodes, spawner.services
    assert await other.refusal_before_spawn({}) is not None
    # its own participant is let through, and the start removes the leftover first
    assert await spawner.refusal_before_spawn({}) is None
    spawner.forget_gate_reservation()
    await spawner.start()
    assert spawner.called("remove_service")[0] == ("svc1",)
    assert list(spawner.services) == ["svc2"] and spawner.holding.gpu == "GPU-a0"


async def test_a_removed_leftover_makes_the_broker_read_the_swarm_afresh():
    """The hub shares one read of the swarm among the spawns of a burst (``inventory_max_age``,
    60 s here). The read the start was let through on shows the leftover's slice taken; once
    the start has removed the leftover, the broker forgets that read (``forget_read``), and the
    start reserves from one that shows the slice free."""
    spawner = await with_leftover(inventory_max_age=60)
    assert await spawner.refusal_before_spawn({}) is None  # its own: let through, read shared
    spawner.forget_gate_reservation()
    await spawner.start()
    assert list(spawner.services) == ["svc2"] and spawner.holding.gpu == "GPU-a0"


async def test_a_server_swarm_moved_is_at_its_new_address_in_the_hubs_database(tmp_path):
    """Swarm gave a server a new container at a new address (its engine restarted): the
    spawner's poll sees it running there, and the hub's database says so at once (a hub
    restarted later routes to the new address, not the old one)."""
    spawner = make_fake(inventory_max_age=0)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.start()
    url = f"sqlite:///{tmp_path}/jupyterhub.sqlite"
    engine = sqlalchemy.create_engine(url)
    orm.Base.metadata.create_all(engine)
    db = sqlalchemy.orm.Session(engine)
    orm_server = orm.Server(ip=spawner.task_address, port=8888, base_url="/user/alice-smith/")
    orm_spawner = orm.Spawner(user=orm.User(name="alice-smith"), name="", server=orm_server)
    db.add(orm_spawner)
    db.commit()
    spawner.orm_spawner, spawner.user.db = orm_spawner, db  # as JupyterHub's User gives them
    (svc,) = spawner.services.values()
    svc["task"] = {**svc["task"], "ID": "task-new", "CreatedAt": "2025-01-01T00:05:00Z"}
    svc["task"]["NetworksAttachments"] = [
        {"Network": {"Spec": {"Name": spawner.network_name}}, "Addresses": ["10.0.8.9/24"]}
    ]
    assert await spawner.poll() is None
    assert spawner.server.ip == "10.0.8.9"
    with sqlalchemy.orm.Session(sqlalchemy.create_engine(url)) as hub_after_restart:
        assert hub_after_restart.query(orm.Server).one().ip == "10.0.8.9"


# ---- healing: logged, counted, recorded ------------------------------------------------------


def counted(action: str) -> float:
    return healing.HEALED.labels(action)._value.get()


def test_each_healing_is_counted_and_recorded_for_the_dashboard(tmp_path, caplog):
    journal = events.Journal(tmp_path)
    before = counted("orphan removed")
    healing.record(
        __import__("logging").getLogger("t"), journal, "orphan removed", "jy-x removed", "x"
    )
    assert counted("orphan removed") == before + 1
    (event,) = events.read_events(events.tail(tmp_path / events.EVENTS_FILE))
    assert (event.kind, event.action, event.user, event.reason) == (
        "healed",
        "orphan removed",
        "x",
        "jy-x removed",
    )
    assert "Healed (orphan removed): jy-x removed" in caplog.text
    with pytest.raises(ValueError, match="unknown healing action"):
        healing.record(__import__("logging").getLogger("t"), None, "fixed", "?")


# ---- the keeper ------------------------------------------------------------------------------


class FakeProxy:
    """What JupyterHub's check_routes calls on the proxy, answered from a dict of routes."""

    def __init__(self, keeper: KeepingProxy):
        self.routes: dict[str, dict] = {}
        keeper.get_all_routes = self.get_all_routes
        keeper.add_user = self.add_user
        keeper.add_hub_route = self.add_hub_route
        keeper.add_route = self.add_route
        keeper.delete_route = self.delete_route

    async def get_all_routes(self):
        return json.loads(json.dumps(self.routes))

    async def add_route(self, spec, target, data):
        self.routes[spec] = {"routespec": spec, "target": target, "data": data}

    async def add_hub_route(self, hub):
        await self.add_route("/", hub.host, {"hub": True})

    async def add_user(self, user, name=""):
        spawner = user.spawners[name]
        await self.add_route(spawner.proxy_spec, spawner.server.host, {"user": user.name})

    async def delete_route(self, spec):
        self.routes.pop(spec, None)


class SpawnerDict(dict):
    pass


def hub_user(name: str, host: str | None, pending=None):
    server = SimpleNamespace(host=host) if host else None
    spawner = SimpleNamespace(
        ready=bool(host) and not pending,
        pending=pending,
        proxy_spec=f"/user/{name}/",
        server=server,
        service_name=f"jy-{name}",
    )
    orm = SimpleNamespace(server=server)
    return SimpleNamespace(name=name, spawners=SpawnerDict({"": spawner}), orm_spawners={"": orm})


def keeper_for(users, tmp_path, **kwargs) -> tuple[KeepingProxy, FakeProxy]:
    hub = SimpleNamespace(host="http://hub:8081", routespec="/")
    keeper = KeepingProxy(
        auth_token="t",
        app=SimpleNamespace(hub=hub),
        hub=hub,
        dashboard_dir=str(tmp_path),
        route_check_interval=0,  # the loops are driven by the test
        orphan_check_interval=0,
        **kwargs,
    )
    keeper._users, keeper._services = {u.name: u for u in users}, {}
    keeper._sightings, keeper._last_wanted, keeper._failing = reconcile.Sightings(), {}, ""
    return keeper, FakeProxy(keeper)


async def test_routes_a_restarted_proxy_lacks_come_back_at_the_next_check(tmp_path):
    users = [hub_user("ada", "http://10.0.0.1:8888"), hub_user("bob", "http://10.0.0.2:8888")]
    keeper, proxy = keeper_for(users, tmp_path)
    await keeper.mend_routes()  # the servers' routes as the hub's first check saw them
    assert proxy.routes == {}  # nothing steady yet: a server that just started adds its own
    await keeper.mend_routes()
    assert set(proxy.routes) == {"/", "/user/ada/", "/user/bob/"}
    before = counted("routes restored")
    proxy.routes.clear()  # the proxy restarted
    await keeper.mend_routes()
    assert proxy.routes["/user/ada/"]["target"] == "http://10.0.0.1:8888"
    assert set(proxy.routes) == {"/", "/user/ada/", "/user/bob/"}
    assert counted("routes restored") == before + 3
    (event,) = [
        e
        for e in events.read_events(events.tail(tmp_path / events.EVENTS_FILE))
        if e.action == "routes restored"
    ][-1:]
    assert "lacked 3 route(s)" in event.reason
    await keeper.mend_routes()  # nothing missing: nothing done, nothing counted
    assert counted("routes restored") == before + 3


async def test_a_route_follows_a_server_swarm_moved(tmp_path):
    ada = hub_user("ada", "http://10.0.0.1:8888")
    keeper, proxy = keeper_for([ada], tmp_path)
    await keeper.mend_routes()
    await keeper.mend_routes()
    ada.spawners[""].server.host = "http://10.0.0.7:8888"  # poll followed its new address
    await keeper.mend_routes()  # seen once: its spawn or poll may still be adding it
    await keeper.mend_routes()
    assert proxy.routes["/user/ada/"]["target"] == "http://10.0.0.7:8888"


async def test_services_nobody_owns_are_removed_after_the_grace_and_owned_ones_never(tmp_path):
    users = [
        hub_user("ada", "http://10.0.0.1:8888"),
        hub_user("bob", None, pending="spawn"),  # starting: its service is its own
        hub_user("carol", None),  # stopped
    ]
    keeper, _ = keeper_for(users, tmp_path, server_labels={"stack": "s"}, orphan_grace=0)
    listed = [
        service("s1", "jy-ada"),
        service("s2", "jy-bob", "bob"),
        service("s3", "jy-carol", "carol"),
    ]
    calls = []

    async def docker(method, *args, **kwargs):
        calls.append((method, args, kwargs))
        return listed if method == "services" else None

    keeper._docker = docker
    await keeper.sweep_services()
    assert calls[0] == ("services", (), {"filters": {"label": ["stack=s", contract.USER_LABEL]}})
    assert calls[1:] == [("remove_service", ("s3",), {})]


async def test_without_the_hubs_labels_no_service_is_ever_swept(tmp_path):
    keeper, _ = keeper_for([hub_user("carol", None)], tmp_path, orphan_grace=0)

    async def docker(method, *args, **kwargs):
        raise AssertionError("no Docker call without server_labels")

    keeper._docker = docker
    await keeper.sweep_services()


# ---- how the hub is wired ---------------------------------------------------------------------


async def test_the_hubs_resolver_asks_afresh_and_needs_no_loop_when_made():
    from gpu_swarm_spawner.keeper import FreshResolver

    resolver = FreshResolver()  # as jupyterhub_config.py makes it, before any loop runs
    (found, *_) = await resolver.resolve("127.0.0.1", 8001)
    assert (found["host"], found["port"]) == ("127.0.0.1", 8001)
