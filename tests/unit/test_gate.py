"""The gate: a participant no slice can take is refused before JupyterHub's own spawn work.

Two halves: the spawner's ``refusal_before_spawn`` (the same decision as its start, nothing
claimed), and the handlers that ask it before JupyterHub's ``spawn_single_user``. A real hub
with the gate answers 100 and 500 refusals at once in ``make bench-scale``; the bed's
``test_full_hub`` checks the pages participants see.
"""

import asyncio
import inspect
import logging
import subprocess
from types import SimpleNamespace

import pytest
import sqlalchemy
import sqlalchemy.orm
from jupyterhub import apihandlers, handlers, orm
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.user import User
from tornado.httpserver import HTTPServer
from tornado.tcpserver import TCPServer

from gpu_swarm_spawner import NoGPUSliceAvailable, gate, hubdb, internals

from .clusters import node, task
from .fake_docker import RUNNING, UNPLACEABLE, make_fake

FULL = [task("n1", {"GPU-a0": 3}, service_id="s0"), task("n1", {"GPU-a1": 3}, service_id="s1")]


def fake_swarm(tasks, **kwargs):
    spawner = make_fake("bob", inventory_max_age=0, **kwargs)
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3, "GPU-a1": 3})]
    spawner.tasks = tasks
    return spawner


# ---- the spawner's answer ----------------------------------------------------------------------


async def test_a_full_swarm_is_refused_with_the_message_start_would_give():
    spawner = fake_swarm(FULL, waiting_line="off")
    refusal = await spawner.refusal_before_spawn({})
    assert isinstance(refusal, NoGPUSliceAvailable) and refusal.status_code == 503
    with pytest.raises(NoGPUSliceAvailable) as started:
        await spawner.reserve_gpu()
    assert refusal.jupyterhub_message == started.value.jupyterhub_message
    assert refusal.jupyterhub_message.startswith("All GPU slices are in use (6/6)")
    assert "alpha:GPU-a0=3/3" in refusal.log_message
    # its read of the swarm went to the broker's reading thread, not behind the burst's calls
    assert spawner.reads == len(spawner.calls) == 4  # nodes and tasks, twice


async def test_an_environment_not_offered_is_left_to_the_spawns_400_not_refused_for_slices():
    """On a full hub, asking for an image it does not offer is not answered "all slices in
    use" (nor a place in line): nothing is claimed, and JupyterHub's spawn then meets the
    options' 400 (``check_environment``) before the spawner's start."""
    spawner = fake_swarm(FULL, waiting_line="off")
    assert await spawner.refusal_before_spawn({"image": "Julia"}) is None
    assert spawner.broker.claimed() == {} and spawner.reads == 0


def counting_reserves(spawner) -> list:
    """The GPUs the hub's broker chooses from now on, one entry per ``reserve``."""
    broker, chosen = spawner.broker, []
    reserve = broker.reserve

    async def counted(*args, **kwargs):
        reservation = await reserve(*args, **kwargs)
        chosen.append(reservation.gpu.uuid)
        return reservation

    broker.reserve = counted
    return chosen


async def test_the_start_takes_the_gates_reservation_the_broker_chooses_once_per_spawn():
    """One reservation per spawn, handed from the gate to ``start``: the start neither reads
    the swarm for it nor chooses again, though spread would now pick the other GPU."""
    spawner = fake_swarm([task("n1", {"GPU-a0": 2})])
    chosen = counting_reserves(spawner)
    assert await spawner.refusal_before_spawn({}) is None
    (early,) = spawner.broker.claimed().values()
    assert early.uuid == "GPU-a1" and early.slices == 1 and chosen == ["GPU-a1"]
    spawner.tasks = [task("n1", {"GPU-a1": 2})]  # another server placed on it meanwhile
    reads = spawner.reads

    await asyncio.wait_for(spawner.start(), timeout=5)

    assert chosen == ["GPU-a1"], "start reserved again"
    assert spawner.holding.gpu == "GPU-a1" and spawner.attempt.reservation.gpu.uuid == "GPU-a1"
    assert spawner.reads == reads  # no read of the swarm for a choice made already
    assert spawner.broker.claimed() == {}  # Swarm counts the running server's slices
    spawner.forget_gate_reservation()  # the gate's clean-up: the start took it, nothing to do
    assert spawner.broker.claimed() == {}


async def test_a_race_lost_on_the_gates_gpu_reserves_anew_without_it():
    spawner = fake_swarm([])
    spawner.task_states = [UNPLACEABLE, RUNNING]  # another server took the gate's slice
    chosen = counting_reserves(spawner)
    assert await spawner.refusal_before_spawn({}) is None
    await asyncio.wait_for(spawner.start(), timeout=5)
    first, second = chosen
    assert first != second and spawner.holding.gpu == second
    assert spawner.broker.claimed() == {}


async def test_a_start_asking_for_something_else_than_the_gate_reserved_reserves_anew():
    spawner = fake_swarm([])
    chosen = counting_reserves(spawner)
    assert await spawner.refusal_before_spawn({}) is None  # one slice
    spawner.full_gpu_requested = True  # the start asks for a whole GPU
    await asyncio.wait_for(spawner.start(), timeout=5)
    assert len(chosen) == 2 and spawner.holding.slices == 3
    assert spawner.broker.claimed() == {}


async def test_a_gate_reservation_no_start_took_is_freed():
    spawner = fake_swarm([task("n1", {"GPU-a0": 3})])
    assert await spawner.refusal_before_spawn({}) is None
    spawner.forget_gate_reservation()
    assert spawner.broker.claimed() == {}
    spawner.forget_gate_reservation()  # twice is fine


async def test_a_server_without_a_gpu_frees_the_gates_reservation():
    spawner = fake_swarm([], cpu_only_servers=True)
    assert await spawner.refusal_before_spawn({}) is None
    spawner.cpu_only_requested = True  # as JupyterHub applied other options
    await asyncio.wait_for(spawner.start(), timeout=5)
    assert spawner.broker.claimed() == {} and spawner.holding.cpu_only


async def test_in_a_burst_those_let_through_hold_the_slices_the_next_are_refused_for():
    """Six ask at once for the last three slices: three go on, three are told."""
    first = fake_swarm([task("n1", {"GPU-a0": 3})], waiting_line="off")
    crowd = [first] + [
        make_fake(f"p{i}", inventory_max_age=0, waiting_line="off") for i in range(5)
    ]
    for spawner in crowd[1:]:
        spawner.nodes, spawner.tasks = first.nodes, first.tasks
    answers = await asyncio.gather(*(s.refusal_before_spawn({}) for s in crowd))
    assert sum(a is None for a in answers) == 3
    assert all(a.jupyterhub_message.startswith("All GPU slices") for a in answers if a)


async def test_slices_claimed_by_spawns_under_way_count():
    spawner = fake_swarm([task("n1", {"GPU-a0": 3})])
    other = make_fake("carol", inventory_max_age=0)
    other.nodes, other.tasks = spawner.nodes, spawner.tasks
    await asyncio.gather(*(make_claim(other, i) for i in range(3)))
    assert sum(c.slices for c in spawner.broker.claimed().values()) == 3
    assert isinstance(await spawner.refusal_before_spawn({}), NoGPUSliceAvailable)


async def make_claim(template, i):
    """A spawn under way that has claimed one slice (its service not made yet)."""
    claimer = make_fake(f"claimer-{i}", inventory_max_age=0)
    claimer.nodes, claimer.tasks = template.nodes, template.tasks
    await claimer.reserve_gpu()


@pytest.mark.parametrize(
    "settings, options, why",
    [
        ({"waiting_line": "auto"}, {}, "the line takes everyone"),
        ({"waiting_line": "offer"}, {"line": "join"}, "they asked to wait"),
        ({"cpu_only_servers": True}, {"gpu": "none"}, "no GPU asked for"),
        ({"waiting_line": "off"}, {"gpu": "nonsense"}, "bad options: the spawn says why"),
        ({"waiting_line": "off"}, {"gpu": "full"}, "a full GPU not offered: idem"),
        ({"waiting_line": "off"}, {"line": "later"}, "an unknown line choice: idem"),
    ],
)
async def test_what_the_spawn_itself_must_decide_is_not_refused_early(settings, options, why):
    spawner = fake_swarm(FULL, **settings)
    assert await spawner.refusal_before_spawn(options) is None, why
    assert spawner.broker.claimed() == {}


async def test_the_refusal_offers_the_line_and_keeps_the_chosen_environment():
    images = {"PyTorch": "img/torch", "TensorFlow": "img/tf"}
    spawner = fake_swarm(FULL, waiting_line="offer", allowed_images=images)
    refusal = await spawner.refusal_before_spawn({"image": "TensorFlow"})
    offer = refusal.jupyterhub_html_message
    assert "opt-line=join" in offer and "opt-image=TensorFlow" in offer


async def test_without_options_the_last_start_s_options_are_asked_about():
    spawner = fake_swarm(FULL, waiting_line="offer")
    spawner.orm_spawner = SimpleNamespace(user_options={"line": "join"}, server=None, name="")
    assert await spawner.refusal_before_spawn(None) is None  # they wait in line, as last time
    spawner.orm_spawner = SimpleNamespace(user_options={}, server=None, name="")
    assert await spawner.refusal_before_spawn(None) is not None


# ---- the handlers ------------------------------------------------------------------------------


class JupyterHubSpawn:
    """Stands for JupyterHub's BaseHandler: records that its spawn work began; ``fails``: it
    raises that (its limits, a failed start)."""

    log = logging.getLogger("test_gate")

    def __init__(self, fails=None):
        self.spawned, self.fails = [], fails
        self.users, self.looked_up = {}, []  # the hub's users by id; its database lookups

    def find_user(self, name):
        self.looked_up.append(name)

    async def spawn_single_user(self, user, server_name="", display_name="", options=None):
        self.spawned.append((user.name, server_name, options))
        if self.fails:
            raise self.fails


class Handler(gate.RefuseFirst, JupyterHubSpawn):
    pass


class Spawner:
    _log_name = "dana"

    def __init__(self, answer, active=False):
        self.answer, self.active, self.asked = answer, active, []
        self._spawn_future = None
        self.forgotten = 0

    def forget_gate_reservation(self):
        self.forgotten += 1

    async def refusal_before_spawn(self, options):
        self.asked.append(options)
        if isinstance(self.answer, Exception) and not isinstance(self.answer, NoGPUSliceAvailable):
            raise self.answer
        return self.answer


def user_with(spawner, server_name=""):
    return SimpleNamespace(
        name="dana", orm_spawners={server_name: object()}, spawners={server_name: spawner}
    )


async def test_a_refusal_is_raised_before_jupyterhub_begins_and_kept_as_the_failed_spawn():
    refusal = NoGPUSliceAvailable("All GPU slices are in use (6/6)", "log")
    spawner, handler = Spawner(refusal), Handler()
    with pytest.raises(NoGPUSliceAvailable) as raised:
        await handler.spawn_single_user(user_with(spawner), "", "", {"gpu": "slice"})
    assert raised.value is refusal and handler.spawned == []
    assert spawner.asked == [{"gpu": "slice"}]
    # what JupyterHub's spawn-pending page and progress stream read
    assert spawner._spawn_future.done() and spawner._spawn_future.exception() is refusal


@pytest.mark.parametrize(
    "spawner, why",
    [
        (Spawner(None), "a GPU fits"),
        (Spawner(RuntimeError("manager down")), "asking failed: the spawn says why"),
        (Spawner(NoGPUSliceAvailable("full", "log"), active=True), "running or pending"),
        (SimpleNamespace(active=False), "another spawner class"),
    ],
)
async def test_otherwise_jupyterhub_spawns_as_usual(spawner, why, caplog):
    handler = Handler()
    await handler.spawn_single_user(user_with(spawner, "gpu"), "gpu", "", None)
    assert handler.spawned == [("dana", "gpu", None)], why
    if isinstance(getattr(spawner, "answer", None), RuntimeError):
        assert "starting as usual" in caplog.text


async def test_a_spawn_let_through_has_its_gate_reservation_forgotten_however_it_ends():
    for fails in (None, RuntimeError("429: too many users")):
        spawner, handler = Spawner(None), Handler(fails)
        try:
            await handler.spawn_single_user(user_with(spawner), "", "", {})
        except RuntimeError:
            assert fails is not None
        assert spawner.forgotten == 1 and handler.spawned


async def test_a_server_jupyterhub_has_not_made_is_left_to_jupyterhub():
    handler = Handler()
    user = SimpleNamespace(name="dana", orm_spawners={}, spawners={})
    await handler.spawn_single_user(user, "new", "", None)
    assert handler.spawned == [("dana", "new", None)] and user.spawners == {}


class Refusing(LocalProcessSpawner):
    """A spawner JupyterHub's ``User`` makes, that the gate can ask."""

    answer = None

    async def refusal_before_spawn(self, options):
        return self.answer

    def forget_gate_reservation(self):
        pass


def hub_user(name="dana"):
    """JupyterHub's own ``User``, on an in-memory database, making ``Refusing`` spawners."""
    engine = sqlalchemy.create_engine("sqlite://")
    orm.Base.metadata.create_all(engine)  # the tables (JupyterHub's migrations take seconds)
    db = sqlalchemy.orm.Session(engine)
    orm_user = orm.User(name=name)
    db.add(orm_user)
    db.commit()
    return User(orm_user, settings={"spawner_class": Refusing}, db=db)


def failed_with(error):
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    future.exception()
    return future


async def test_a_spawner_the_gate_refused_is_kept_when_its_participant_asks_again(monkeypatch):
    monkeypatch.setattr(User, "get_spawner", User.get_spawner)  # put back afterwards
    gate.keep_refused_spawners()
    gate.keep_refused_spawners()  # twice: as once
    user = hub_user()
    # as JupyterHub's spawn page and REST API find the spawner, then its spawn
    spawner = user.get_or_create_spawner("", "", replace_failed=True)
    spawner.answer = NoGPUSliceAvailable("All GPU slices are in use (6/6)", "log")
    for _ in range(2):
        with pytest.raises(NoGPUSliceAvailable):
            await Handler().spawn_single_user(user, "", "", {})
        assert spawner._failed  # JupyterHub's pages say the last start failed
        assert user.get_or_create_spawner("", "", replace_failed=True) is spawner
        assert user.spawners[""] is spawner

    # a start that began and failed leaves a spawner JupyterHub replaces, as it always did
    spawner._spawn_future = failed_with(RuntimeError("the image could not be pulled"))
    replaced = user.get_or_create_spawner("", "", replace_failed=True)
    assert replaced is not spawner and replaced.user is user
    # and with replace_failed=False, JupyterHub's answer is the failed one
    user.spawners[""] = spawner
    assert user.get_spawner("") is spawner


class Users(dict):
    """The hub's users by id; counts the walks through all of them."""

    walks = 0

    def values(self):
        self.walks += 1
        return super().values()


def test_a_user_the_hub_holds_is_found_without_a_database_query():
    handler = Handler()
    dana = SimpleNamespace(name="dana", id=8)
    handler.users = Users({7: SimpleNamespace(name="eve", id=7), 8: dana})
    assert handler.find_user("dana") is dana and handler.looked_up == []
    dana.name = "dana2"  # renamed by an admin: found by the new name only
    assert handler.find_user("dana") is None and handler.looked_up == ["dana"]
    assert handler.find_user("dana2") is dana


def test_a_user_the_hub_no_longer_holds_is_not_found_in_the_index():
    handler = Handler()
    dana = SimpleNamespace(name="dana", id=8)
    handler.users = Users({8: dana})
    assert handler.find_user("dana") is dana
    del handler.users[8]  # deleted by an admin
    assert handler.find_user("dana") is None and handler.looked_up == ["dana"]


def test_users_the_hub_holds_are_found_without_walking_through_all_of_them_each_time():
    handler = Handler()
    handler.users = Users({i: SimpleNamespace(name=f"p{i}", id=i) for i in range(500)})
    for i in range(500):
        assert handler.find_user(f"p{i}").id == i
    assert handler.users.walks == 1 and handler.looked_up == []
    handler.users[500] = SimpleNamespace(name="p500", id=500)  # a new participant
    assert handler.find_user("p500").id == 500 and handler.users.walks == 2


def test_install_puts_the_gated_handlers_in_jupyterhub_s_tables(monkeypatch):
    monkeypatch.setattr(User, "get_spawner", User.get_spawner)  # put back afterwards
    for name in (*internals.ACTIVITY_WRITERS, "_record_activity"):
        monkeypatch.setattr(BaseHandler, name, getattr(BaseHandler, name))
    gate.install()
    gate.install()  # twice: as once
    tables = handlers.default_handlers + apihandlers.default_handlers
    used = {h for _, h, *_ in tables}
    assert SpawnHandler not in used and UserServerAPIHandler not in used
    spawn = [p for p, h, *_ in tables if h is gate.GatedSpawnHandler]
    api = [p for p, h, *_ in tables if h is gate.GatedUserServerAPIHandler]
    assert "/spawn/([^/]+)" in spawn and r"/api/users/([^/]+)/server" in api
    assert issubclass(gate.GatedSpawnHandler, SpawnHandler)
    wired = internals.wired(gate.SWAPS, hubdb.on_connect)
    assert wired["get_spawner"]  # and refused spawners are kept
    assert wired["activity writers"]  # and users found on a full disk (test_full_hub_db.py)


def test_a_jupyterhub_without_those_handlers_stops_the_hub_with_advice(monkeypatch):
    table = [("/spawn", SpawnHandler)]
    monkeypatch.setattr(internals, "_handler_tables", lambda: [table])
    with pytest.raises(RuntimeError, match="no UserServerAPIHandler.*images/hub/requirements"):
        internals.replace_handlers(gate.SWAPS)


def test_a_jupyterhub_whose_user_has_no_get_spawner_stops_the_hub_with_advice(monkeypatch):
    monkeypatch.delattr(User, "get_spawner")
    with pytest.raises(RuntimeError, match="User has no get_spawner.*images/hub/requirements"):
        gate.keep_refused_spawners()


def listen_queue(port):
    """The queue length the kernel gives a listening TCP port (``ss``' Send-Q)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
    return int(out.stdout.split()[2])


async def test_the_hubs_port_queues_a_burst_of_connections_instead_of_dropping_them(monkeypatch):
    # tornado's own (a test that loaded jupyterhub_config.py deepened it already); put back after
    monkeypatch.setattr(TCPServer, "listen", inspect.unwrap(TCPServer.listen))
    gate.deepen_listen_backlog(1500)
    gate.deepen_listen_backlog(1000)  # twice: as once
    server = HTTPServer(lambda request: None)
    server.listen(0, address="127.0.0.1")  # as JupyterHub calls it
    try:
        (sock,) = server._sockets.values()
        assert listen_queue(sock.getsockname()[1]) == 1500  # tornado's own: 128
    finally:
        server.stop()
