"""The one door to JupyterHub's internals (gpu_swarm_spawner/internals.py): what each reach-in
relies on, checked against the installed JupyterHub, dockerspawner, oauthenticator, tornado and
SQLAlchemy (the real classes, not stand-ins), the version check, the docs page that lists them,
and a reading of every module of the project that finds a reach-in outside the door.

A JupyterHub or dockerspawner upgrade that moves one of these fails here, with the reach-in's
name, before any hub runs it."""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib
import importlib.metadata
import inspect
import re
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from dockerspawner import DockerSpawner, SwarmSpawner
from jupyterhub import apihandlers, handlers, orm
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.app import JupyterHub
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.spawner import LocalProcessSpawner, Spawner
from jupyterhub.user import User, UserDict
from jupyterhub.utils import new_token
from oauthenticator.github import GitHubOAuthenticator
from oauthenticator.oauth2 import OAuthenticator
from sqlalchemy import create_engine, event, text
from tornado import web
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.tcpserver import TCPServer

from gpu_swarm_spawner import GPUSwarmSpawner, NoGPUSliceAvailable, gate, internals

from .test_gate import Refusing

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "internals.md"


def parameters(function) -> list[str]:
    return list(inspect.signature(inspect.unwrap(function)).parameters)


# ---- each reach-in against the real classes -------------------------------------------------


def contract_handler_tables():
    tables = [handlers.default_handlers, apihandlers.default_handlers]
    found = {h for table in tables for _, h, *_ in table}
    assert {SpawnHandler, UserServerAPIHandler} & found or set(gate.SWAPS.values()) & found
    assert all(isinstance(entry[0], str) for table in tables for entry in table)


def contract_get_spawner():
    assert parameters(User.get_spawner)[:3] == ["self", "server_name", "replace_failed"]
    replace_failed = inspect.signature(inspect.unwrap(User.get_spawner)).parameters[
        "replace_failed"
    ]
    assert replace_failed.default is False
    assert "self.spawners = " in inspect.getsource(User.__init__)


def contract_activity_writers():
    assert parameters(BaseHandler.get_current_user_token) == ["self"]
    assert parameters(BaseHandler._user_for_cookie)[:2] == ["self", "cookie_name"]
    assert parameters(BaseHandler._record_activity)[:3] == ["self", "obj", "timestamp"]


def contract_listen_backlog():
    assert "backlog" in parameters(TCPServer.listen)


def contract_hub_start():
    assert inspect.iscoroutinefunction(inspect.unwrap(JupyterHub.start))


def contract_sqlite_connect():
    seen = []

    def hook(connection, _record):
        seen.append(type(connection))

    internals.on_every_connection(hook)
    try:
        with create_engine("sqlite://").connect() as connection:
            connection.execute(text("SELECT 1"))
    finally:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.remove(Engine, "connect", hook)
    assert seen == [sqlite3.Connection]


def contract_spawn_future():
    assert Spawner._spawn_future is None  # JupyterHub's class default: no start yet


def contract_failed_start():
    assert isinstance(inspect.getattr_static(Spawner, "_failed"), property)


def contract_log_name():
    assert isinstance(inspect.getattr_static(Spawner, "_log_name"), property)


def contract_docker_calls():
    assert parameters(DockerSpawner._docker)[:2] == ["self", "method"]
    assert "_docker" in inspect.getsource(DockerSpawner.docker)  # its public call goes there


def contract_allowed_images():
    assert parameters(DockerSpawner._get_allowed_images) == ["self"]


def contract_object_name():
    handler = inspect.getattr_static(DockerSpawner, "_object_name_default")
    assert handler.trait_name == "object_name" and parameters(handler.func) == ["self"]
    assert SwarmSpawner._object_name_default is handler
    assert "self._object_name_default()" in inspect.getsource(DockerSpawner)  # called by name
    ours = inspect.getattr_static(GPUSwarmSpawner, "_object_name_default")
    assert ours is inspect.getattr_static(internals.SpawnerInternals, "_object_name_default")


def contract_docker_client():
    assert "_client" in vars(DockerSpawner) and DockerSpawner._client is None
    assert isinstance(inspect.getattr_static(DockerSpawner, "client"), property)


def contract_database_rows():
    assert parameters(orm.APIToken.find)[:2] == ["db", "token"]
    assert {"user_options", "state"} <= set(orm.Spawner.__table__.columns.keys())
    assert isinstance(inspect.getattr_static(Spawner, "orm_spawner"), object)


def contract_login_sessions():
    column = orm.User.__table__.columns["cookie_id"]
    assert column.unique and column.default.arg.__name__ == new_token.__name__
    assert "orm.User.cookie_id == cookie_id" in inspect.getsource(BaseHandler._user_for_cookie)
    assert orm.User.api_tokens.property.mapper.class_ is orm.APIToken


def contract_idle_servers():
    from jupyterhub.apihandlers.base import APIHandler
    from jupyterhub.proxy import Proxy

    assert "last_activity" in orm.Spawner.__table__.columns
    model = inspect.getsource(APIHandler.server_model)  # what the idle culler reads
    assert "'last_activity': isoformat(orm_spawner.last_activity)" in model
    for name in ("active", "pending"):
        assert isinstance(inspect.getattr_static(Spawner, name), property), name
    assert parameters(Proxy.delete_user) == ["self", "user", "server_name"]
    assert parameters(User.stop) == ["self", "server_name"]
    assert inspect.iscoroutinefunction(User.stop)
    stop = inspect.getsource(BaseHandler.stop_single_user)  # JupyterHub's stop, as we do it
    assert stop.index("self.proxy.delete_user(user, server_name)") < stop.index(
        "user.stop(server_name)"
    )
    assert "object_id" in SwarmSpawner.class_trait_names()


def contract_start_handlers():
    assert parameters(BaseHandler.spawn_single_user) == [
        "self",
        "user",
        "server_name",
        "display_name",
        "options",
    ]
    defaults = inspect.signature(BaseHandler.spawn_single_user).parameters
    assert (defaults["server_name"].default, defaults["options"].default) == ("", None)
    assert inspect.iscoroutinefunction(BaseHandler.spawn_single_user)
    assert parameters(BaseHandler.find_user) == ["self", "name"]
    for handler in (SpawnHandler, UserServerAPIHandler):  # they start and find through these
        assert handler.spawn_single_user is BaseHandler.spawn_single_user, handler
        assert handler.find_user is BaseHandler.find_user, handler
        source = inspect.getsource(handler)
        assert "self.spawn_single_user(" in source and "self.find_user(" in source, handler
    for gated in gate.SWAPS.values():  # the door's methods come before JupyterHub's
        mro = gated.__mro__
        assert mro.index(internals.StartHandlerInternals) < mro.index(BaseHandler)
        assert gated.spawn_single_user is internals.StartHandlerInternals.spawn_single_user


def contract_held_users():
    assert issubclass(UserDict, dict) and "get" in vars(UserDict)  # its own get queries
    assert "self.settings.setdefault('users'" in inspect.getsource(BaseHandler.users.fget)
    db = orm.new_session_factory("sqlite://")()
    ada = orm.User(name="ada")
    db.add(ada)
    db.commit()
    users = UserDict(lambda: db, {})
    assert internals.held_user(users, ada.id) is None  # not held: no query, no user made
    assert users.get(ada.id) is not None  # JupyterHub's get: queried, and now held
    assert internals.held_user(users, ada.id) is users[ada.id]


def contract_server_rows():
    assert isinstance(inspect.getattr_static(orm.User, "orm_spawners"), property)
    db = orm.new_session_factory("sqlite://")()
    ada = orm.User(name="ada")
    db.add(ada)
    db.commit()
    user = User(ada, settings={"spawner_class": LocalProcessSpawner}, db=db)
    rows = internals.server_rows(user)  # JupyterHub's User hands it on from orm.User
    assert list(rows) == [""] and isinstance(rows[""], orm.Spawner)
    assert user.spawners == {}  # none made


def contract_ready():
    assert isinstance(inspect.getattr_static(Spawner, "ready"), property)
    assert GPUSwarmSpawner.ready is internals.SpawnerInternals.ready


def contract_start_timeout():
    source = inspect.getsource(User.spawn)
    hook = source.index("spawner.run_pre_spawn_hook()")
    assert hook < source.index("spawner.start()") < source.index("timeout=spawner.start_timeout")
    assert GPUSwarmSpawner.run_pre_spawn_hook is internals.SpawnerInternals.run_pre_spawn_hook


def contract_oauthenticator_rules():
    after = GitHubOAuthenticator.__mro__[
        GitHubOAuthenticator.__mro__.index(GitHubOAuthenticator) + 1
    ]
    assert after is OAuthenticator and "check_allowed" in vars(OAuthenticator)
    assert parameters(OAuthenticator.check_allowed) == ["self", "username", "auth_model"]
    source = inspect.getsource(GitHubOAuthenticator.check_allowed)
    assert "super().check_allowed(username, auth_model)" in source
    assert "allowed_organizations" in source  # what the authenticator replaces
    authenticator = GitHubOAuthenticator(allowed_users={"ada"}, allowed_organizations={"org"})
    for name, admin, allowed in [("ada", False, True), ("eve", True, True), ("bob", False, False)]:
        model = {"auth_state": {}, "admin": admin}  # no GitHub asked about "org"
        check = internals.oauthenticator_check_allowed(authenticator, name, model)
        assert asyncio.run(check) is allowed, name


CONTRACTS = {name: globals()[f"contract_{name.replace(' ', '_')}"] for name in internals.RELIES_ON}


@pytest.mark.parametrize("name", sorted(internals.RELIES_ON))
def test_what_each_reach_in_relies_on_is_in_the_installed_versions(name):
    CONTRACTS[name]()


def test_every_reach_in_has_a_contract():
    defined = {n[len("contract_") :] for n in globals() if n.startswith("contract_")}
    assert defined == {name.replace(" ", "_") for name in internals.RELIES_ON}


# ---- the reach-ins do what they say on the real classes ---------------------------------------


def test_the_spawner_is_built_on_the_door():
    assert internals.SpawnerInternals in GPUSwarmSpawner.__mro__
    assert GPUSwarmSpawner.client is internals.SpawnerInternals.client


def real_spawn_handler():
    """JupyterHub's spawn page as the gate puts it in its tables, on the least of a hub it
    reads: its users (a UserDict) and database, its authenticator's one setting."""
    db = orm.new_session_factory("sqlite://")()
    db.add(orm.User(name="dana"))
    db.commit()
    settings = {
        "db": db,
        "hub": SimpleNamespace(base_url="/hub/"),
        "spawner_class": Refusing,  # the gate's spawner of test_gate
        "authenticator": SimpleNamespace(refresh_pre_spawn=False),
    }
    settings["users"] = UserDict(lambda: db, settings)
    request = HTTPServerRequest(
        start_line=RequestStartLine("POST", "/hub/spawn/dana", "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "hub"}),
        connection=SimpleNamespace(set_close_callback=lambda callback: None),
    )
    return gate.GatedSpawnHandler(web.Application([], **settings), request)


def test_the_gate_works_through_jupyterhubs_real_spawn_handler():
    """find_user: JupyterHub's database lookup once, then the users it holds; a refusal is
    raised before JupyterHub's spawn work; anything else reaches JupyterHub's own
    spawn_single_user (here its check of the server's name)."""
    handler = real_spawn_handler()
    queries = []

    def count(*args):
        queries.append(args[2])

    engine = handler.db.get_bind()
    event.listen(engine, "before_cursor_execute", count)
    try:
        dana = handler.find_user("dana")
        assert isinstance(dana, User) and queries  # JupyterHub's lookup
        queries.clear()
        assert handler.find_user("dana") is dana and queries == []  # held: no query
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert handler.find_user("nobody") is None

    spawner = dana.spawners[""]
    spawner.answer = NoGPUSliceAvailable("All GPU slices are in use (6/6)", "log")
    with pytest.raises(NoGPUSliceAvailable):
        asyncio.run(handler.spawn_single_user(dana, "", "", {}))
    assert internals.spawn_future(spawner).exception() is spawner.answer
    with pytest.raises(web.HTTPError, match="Invalid server_name"):  # JupyterHub's own answer
        asyncio.run(handler.spawn_single_user(dana, "a/b", "", {}))


# ---- no module but the door reaches into a library ----------------------------------------

#: The project's packages (anything else imported is the standard library or a dependency)
PROJECT = ("gpu_swarm_spawner", "worker_setup", "deploy", "tutorial_sync")
#: What the guard reads: all the product's code but the door itself (tests/ may reach in)
READ = [*PROJECT, "jupyterhub_config.py"]
DOOR = REPO / "gpu_swarm_spawner" / "internals.py"
#: Reach-ins allowed outside the door, each with its reason: none.
ALLOWED: dict[str, str] = {}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def local_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the project's modules and the module's own classes, names bound to a
    library by an import)."""
    ours, theirs = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                (ours if alias.name.split(".")[0] in PROJECT else theirs).add(bound)
        elif isinstance(node, ast.ImportFrom):
            project = node.level > 0 or (node.module or "").split(".")[0] in PROJECT
            for alias in node.names:
                (ours if project else theirs).add(alias.asname or alias.name)
    return ours, theirs - ours


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


@functools.cache
def project_classes() -> list[type]:
    """Every class defined at the top of a module the guard reads (imported)."""
    found = []
    for path in sources():
        tree = ast.parse(path.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        if names and path.name != "jupyterhub_config.py":
            module = importlib.import_module(module_name(path))
            found += [getattr(module, name) for name in names]
    return found


def ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in PROJECT or cls.__module__ == "builtins"


@functools.cache
def library_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def libraries_name(cls: type, name: str) -> str | None:
    """The library class that ``name`` is a private name of, in the classes of ``cls`` and of
    every project class built on it (a mixin's name meets its spawner's libraries); None if
    none has it."""
    family = [c for c in project_classes() if cls in c.__mro__] or [cls]
    for theirs in {k for c in family for k in c.__mro__ if not ours(k)}:
        if name in vars(theirs) or re.search(rf"\bself\.{name}\b", library_source(theirs)):
            return f"{theirs.__module__}.{theirs.__qualname__}"
    return None


def sources() -> list[Path]:
    paths = []
    for name in READ:
        path = REPO / name
        paths += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [p for p in paths if p != DOOR]


def reach_ins(path: Path, source: str, classes: dict[str, type] | None = None) -> list[str]:
    """Each reach-in into a library in ``source``: a private name of anything but ``self``,
    ``cls``, a module of the project or a class of this module; ``super(X, self)``; an
    assignment to an attribute or item of something imported from a library (replacing its
    method, changing its table); and in a class built on a library's (``classes``: name to
    class), a method defined or attribute used on ``self`` whose private name is the
    library's."""
    tree = ast.parse(source)
    project, imported = local_names(tree)
    found = []

    def flag(node, what):
        found.append(f"{path.relative_to(REPO)}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = root_name(node.value) if isinstance(node.value, ast.Name) else None
            if owner not in ("self", "cls") and owner not in project:
                flag(node, f"{ast.unparse(node)}: a private name of another object")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "super":
            if node.args:
                flag(node, f"{ast.unparse(node)}: super with arguments skips a class's method")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if not isinstance(target, ast.Name) and root_name(target) in imported:
                    flag(node, f"{ast.unparse(target)} = ...: changes a library's object")
    for node in tree.body:
        cls = (classes or {}).get(getattr(node, "name", None))
        if not isinstance(node, ast.ClassDef) or cls is None:
            continue
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(item.name):
                theirs = libraries_name(cls, item.name)
                if theirs:
                    flag(item, f"def {item.name}: overrides {theirs}'s private {item.name}")
        for used in ast.walk(node):
            if (
                isinstance(used, ast.Attribute)
                and private(used.attr)
                and getattr(used.value, "id", None) in ("self", "cls")
            ):
                theirs = libraries_name(cls, used.attr)
                if theirs:
                    flag(used, f"{ast.unparse(used)}: {theirs}'s private attribute")
    return found


def test_no_module_but_the_door_reaches_into_a_library():
    """The project reaches into JupyterHub's, dockerspawner's, oauthenticator's, tornado's,
    aiohttp's, SQLAlchemy's and the standard library's private names (and replaces their
    methods) only through internals.py: read from the code of every module."""
    by_module = {}
    for cls in project_classes():
        by_module.setdefault(cls.__module__, {})[cls.__name__] = cls
    found = []
    for path in sources():
        classes = by_module.get(module_name(path), {})
        found += reach_ins(path, path.read_text(), classes)
    assert [f for f in found if f.split(": ", 1)[0] not in ALLOWED] == []


def flagged(source: str, classes: dict[str, type] | None = None) -> list[str]:
    return reach_ins(REPO / "gpu_swarm_spawner" / "example.py", source, classes)


def test_the_reading_finds_each_kind_of_reach_in():
    assert flagged("def f(spawner):\n    return spawner._spawn_future\n")
    assert flagged("async def f(self):\n    return await super(GitHubOAuthenticator, self).x()\n")
    assert flagged("from jupyterhub.user import User\nUser.get_spawner = keep\n")
    assert flagged("from jupyterhub import handlers\nhandlers.default_handlers[0] = (1, 2)\n")
    reason = "class H(web.RequestHandler):\n    def f(self):\n        return self._reason\n"
    assert flagged(reason, {"H": type("H", (web.RequestHandler,), {})})
    named = "class S(SwarmSpawner):\n    def _object_name_default(self):\n        pass\n"
    assert flagged(named, {"S": type("S", (SwarmSpawner,), {})})
    # and what is not one
    assert not flagged("from . import gpus\ngpus._reason(e)\n")
    assert not flagged("class A:\n    _x = 1\n\ndef f():\n    A._x = 2\n")
    assert not flagged("def f(self):\n    return self._mine\n")
    own = "class S(SwarmSpawner):\n    def _my_own(self):\n        return self._mine\n"
    assert not flagged(own, {"S": type("S", (SwarmSpawner,), {})})
    assert not flagged("def f():\n    return super().x()\n")


def test_an_after_start_hook_runs_once_the_hub_has_started(monkeypatch):
    order = []

    async def start(hub):
        order.append("started")

    monkeypatch.setattr(JupyterHub, "start", start)

    def then(hub):
        order.append(("then", hub))

    internals.after_hub_start(then)
    internals.after_hub_start(lambda hub: order.append("a second hook"))
    internals.after_hub_start(then)  # idempotent: given again, run once
    asyncio.run(JupyterHub.start("hub"))
    assert order == ["started", ("then", "hub"), "a second hook"]


def test_ending_a_users_sessions_invalidates_their_cookie_and_tokens():
    """On JupyterHub's own database: the cookie's id changes (a browser's cookie then finds
    nobody), every token of theirs goes, and nobody else's."""
    db = orm.new_session_factory("sqlite://")()
    ada, bob = orm.User(name="ada"), orm.User(name="bob")
    db.add_all([ada, bob, orm.OAuthClient(identifier="jupyterhub")])
    db.commit()
    cookie = ada.cookie_id
    ada.new_api_token(note="server")
    ada.new_api_token(note="browser")
    kept = bob.new_api_token(note="bob's")

    user = SimpleNamespace(orm_user=ada, db=db)  # what of JupyterHub's User it reads
    assert internals.end_sessions(user) == 2
    assert ada.cookie_id != cookie and ada.cookie_id
    assert db.query(orm.User).filter(orm.User.cookie_id == cookie).first() is None
    assert ada.api_tokens == [] and orm.APIToken.find(db, kept) is not None
    assert db.query(orm.User).filter_by(name="ada").one().cookie_id == ada.cookie_id


class Stopping:
    """What of JupyterHub's hub, users and spawners the idle stop reads and calls."""

    def __init__(self):
        self.calls = []
        seen = datetime(2026, 11, 28, 9, 0)  # naive UTC, as JupyterHub's columns
        self.users = {
            1: self.user("ada", {"": self.spawner("svc-a", seen)}),
            2: self.user("bo", {"": self.spawner("svc-b", seen, pending="spawn")}),
            3: self.user("cy", {"": self.spawner("", None, active=False)}),
        }
        self.proxy = SimpleNamespace(delete_user=self.call("route"))

    def call(self, what):
        async def called(user, server_name):
            self.calls.append((what, user.name, server_name))

        return called

    def user(self, name, spawners):
        made = SimpleNamespace(name=name, spawners=spawners)
        made.stop = lambda server_name: self.call("stop")(made, server_name)
        return made

    def spawner(self, service, seen, pending=None, active=True):
        row = SimpleNamespace(last_activity=seen)
        made = SimpleNamespace(object_id=service, orm_spawner=row, pending=pending, active=active)
        made.stopped_by_hub = lambda why: self.calls.append(("told", why))
        return made


def test_the_hubs_servers_are_read_with_their_last_activity_and_an_idle_one_stopped():
    hub = Stopping()
    nine = datetime(2026, 11, 28, 9, 0, tzinfo=timezone.utc).timestamp()
    assert internals.running_servers(hub) == [
        internals.HubServer("ada", "", "svc-a", nine),
        internals.HubServer("bo", "", "svc-b", None),  # starting: never idle
    ]
    # active since: not stopped
    assert asyncio.run(internals.stop_idle_server(hub, "ada", "", nine - 1)) is False
    assert asyncio.run(internals.stop_idle_server(hub, "bo", "", nine + 60)) is False
    assert asyncio.run(internals.stop_idle_server(hub, "nobody", "", nine + 60)) is False
    assert hub.calls == []
    assert (
        asyncio.run(internals.stop_idle_server(hub, "ada", "", nine, "Idle, so stopped.")) is True
    )
    # told first (JupyterHub's stop writes the state, the reason with it), then the REST API's
    # order: the route, then the server
    assert hub.calls == [("told", "Idle, so stopped."), ("route", "ada", ""), ("stop", "ada", "")]


def test_the_hubs_stops_go_as_the_rest_apis_route_then_server_and_say_nothing_themselves():
    hub = Stopping()
    ada = hub.users[1]
    asyncio.run(internals.stop_server(hub, ada, ""))
    assert hub.calls == [("route", "ada", ""), ("stop", "ada", "")]
    hub.calls.clear()
    nine = datetime(2026, 11, 28, 9, 0, tzinfo=timezone.utc).timestamp()
    assert asyncio.run(internals.stop_idle_server(hub, "ada", "", nine)) is True  # no why
    assert hub.calls == [("route", "ada", ""), ("stop", "ada", "")]


# ---- versions ---------------------------------------------------------------------------------


def test_the_installed_versions_are_the_ones_the_door_was_written_for():
    assert internals.version_problems() == []


@pytest.mark.parametrize(
    "installed, ok",
    [("6.1.1", True), ("6.1", True), ("6.10.0", False), ("6.2.0", False), ("5.4.3", False)],
)
def test_a_jupyterhub_of_another_series_stops_the_hub_naming_the_pin(installed, ok):
    def versions(package):
        return installed if package == "jupyterhub" else importlib.metadata.version(package)

    problems = internals.version_problems(versions)
    assert (problems == []) is ok
    if not ok:
        (problem,) = problems
        assert problem.startswith(f"jupyterhub {installed} is installed")
        assert "images/hub/requirements.txt" in problem and "docs/internals.md" in problem
        with pytest.raises(RuntimeError, match=f"jupyterhub {re.escape(installed)}"):
            internals.check_versions(versions)


def test_a_package_that_is_missing_is_named():
    def versions(package):
        if package == "dockerspawner":
            raise importlib.metadata.PackageNotFoundError(package)
        return importlib.metadata.version(package)

    (problem,) = internals.version_problems(versions)
    assert problem.startswith("dockerspawner is not installed, but")
    assert "images/hub/requirements.txt" in problem


# ---- the docs page ----------------------------------------------------------------------------


def test_the_docs_page_lists_every_reach_in_and_what_it_relies_on():
    page = DOCS.read_text()
    assert f"{len(internals.RELIES_ON)} reach-ins" in page  # the count it gives
    for name in internals.RELIES_ON:
        assert f"| {name} |" in page, f"docs/internals.md has no row for {name!r}"
    for package, series in internals.WRITTEN_FOR.items():
        assert f"{package} {series}" in page
