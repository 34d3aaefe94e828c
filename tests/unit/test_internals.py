"""The one door to JupyterHub's internals (gpu_swarm_spawner/internals.py): what each reach-in
relies on, checked against the installed JupyterHub, dockerspawner, tornado and SQLAlchemy (the
real classes, not stand-ins), the version check, and the docs page that lists them.

A JupyterHub or dockerspawner upgrade that moves one of these fails here, with the reach-in's
name, before any hub runs it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from dockerspawner import DockerSpawner, SwarmSpawner
from jupyterhub import apihandlers, handlers, orm
from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.app import JupyterHub
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.spawner import Spawner
from jupyterhub.user import User
from jupyterhub.utils import new_token
from sqlalchemy import create_engine, text
from tornado.tcpserver import TCPServer

from gpu_swarm_spawner import GPUSwarmSpawner, gate, internals

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


#: JupyterHub's and dockerspawner's private names, and replacing their classes' methods
THEIR_PRIVATE_NAMES = re.compile(
    r"\._(spawn_future|failed|log_name|get_allowed_images|user_for_cookie|record_activity|"
    r"object_name_default)\b|default_handlers|"
    r"\b(User|BaseHandler|TCPServer|JupyterHub|Engine|Spawner|SwarmSpawner)\.\w+\s*=[^=]|"
    r"event\.listen\("
)
#: dockerspawner's, in the modules whose classes derive from it or are parts of the spawner
#: (spawner_*.py; others have their own _docker)
DOCKERSPAWNERS_PRIVATE_NAMES = re.compile(r"\._(docker|client)\b")
DERIVED = {"spawner.py", "traits.py"}


def test_no_module_but_the_door_touches_their_private_names():
    """gpu_swarm_spawner's modules reach JupyterHub's, dockerspawner's, tornado's and
    SQLAlchemy's private names (and replace their methods) only through internals.py."""
    offenders = []
    for path in sorted((REPO / "gpu_swarm_spawner").rglob("*.py")):
        if path.name == "internals.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            derived = path.name in DERIVED or path.name.startswith("spawner_")
            if THEIR_PRIVATE_NAMES.search(line) or (
                derived and DOCKERSPAWNERS_PRIVATE_NAMES.search(line)
            ):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_private_names_check_finds_a_reach_in():
    for line in [
        "future = spawner._spawn_future",
        "User.get_spawner = keep",
        "event.listen(Engine, 'connect', hook)",
        "name = super()._object_name_default()",
    ]:
        assert THEIR_PRIVATE_NAMES.search(line), line
    assert DOCKERSPAWNERS_PRIVATE_NAMES.search("await self._docker('tasks')")
    assert not THEIR_PRIVATE_NAMES.search("if User.get_spawner == other:")


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
    for name in internals.RELIES_ON:
        assert f"| {name} |" in page, f"docs/internals.md has no row for {name!r}"
    for package, series in internals.WRITTEN_FOR.items():
        assert f"{package} {series}" in page
