"""The one door to JupyterHub's, dockerspawner's, oauthenticator's, tornado's and SQLAlchemy's
internals.

Everything the hub needs that those projects offer no setting, hook or public method for goes
through this module, and nothing else in the project touches their private names or replaces
their methods: a unit test reads every module of the project
(``test_no_module_but_the_door_reaches_into_a_library``) and fails on a private name of another
object, a ``super(X, self)`` and a method or attribute named like a library's private one.
Where a public way exists the project takes it instead: aiohttp's resolver is made at the first
lookup rather than given a loop (``keeper.FreshResolver``), the dashboard reads tornado's
reason phrase as tornado makes it, and the deploy tool connects through ``http.client``'s
public ``connect``. The deploy tool and the GPU machines' code do not import this module (they
run where the hub's packages are not installed): they reach into no library at all.

Each function says what it relies on; ``RELIES_ON`` lists it all, the contract tests
(tests/unit/test_internals.py) check each item against the installed classes, and
docs/internals.md says what to re-check when JupyterHub or dockerspawner is upgraded.

``check_versions`` runs first in ``jupyterhub_config.py``: a hub whose JupyterHub,
dockerspawner, oauthenticator, tornado, SQLAlchemy or aiohttp (JupyterHub's HTTP client, which
``keeper.FreshResolver`` plugs into) is not the series this module was written for stops at
start-up with an error naming the pin, rather than losing one of these changes quietly. The
policies that use the door stay where they belong: the gate (gate.py) decides which spawners to
keep and which handlers to put in front, hubdb.py what to tell SQLite, priority.py what to do
once the hub has started, the spawner what to write down.

The reach-ins:

- process-wide changes, made once in the hub's process by ``jupyterhub_config.py`` (each is
  idempotent, marks what it put in place, and ``wired`` reports which are in place);
- ``SpawnerInternals``, the spawner's base, naming the private attributes of JupyterHub's
  ``Spawner`` and dockerspawner's ``DockerSpawner`` it reads or calls, and holding the methods
  of theirs it replaces (``ready``, ``run_pre_spawn_hook``, dockerspawner's
  ``_object_name_default``), each handing over to a method of ours;
- ``StartHandlerInternals``, the base of the gate's handlers, holding the two methods of
  JupyterHub's ``BaseHandler`` the gate replaces (``spawn_single_user``, ``find_user``), each
  handing over to a method of ours; and small readers of JupyterHub's objects
  (``server_rows``, ``held_user``, ``oauthenticator_check_allowed``);
- the hub's servers read with their last activity (``running_servers``) and stopped as
  JupyterHub's REST API stops them (``stop_server``: the disk check's, the access check's and
  the fleet's idle stop's, ``stop_idle_server``).

Each entry of ``RELIES_ON`` has a contract test of the same name (``contract_<name>``) that
checks it against the installed library; a library that changes what it relies on fails there,
by name, before any hub runs it. Why there is no public way, per entry:

- ``start handlers``: JupyterHub has no hook before a handler's spawn work; the gate must run
  before it (gate.py). If ``spawn_single_user`` or ``find_user`` is renamed or its parameters
  change, the gate is skipped or fails: ``contract_start_handlers`` and the real-handler test
  ``test_the_gate_works_through_jupyterhubs_real_spawn_handler`` hold it.
- ``held users``: ``UserDict.get`` and ``[]`` query the database for a user not held; the gate
  wants only the held one. If ``UserDict`` stops being a dict keyed by id, the gate's index
  finds nobody (and falls back to JupyterHub's query): ``contract_held_users``.
- ``server rows``: ``User.spawners`` makes spawners; the gate and the keeper need the servers
  the database holds without making any. If ``orm_spawners`` goes, both fail with an
  AttributeError: ``contract_server_rows``.
- ``ready``: JupyterHub reads ``Spawner.ready`` to say a server is ready and has no setting for
  "not yet"; a spawn cancelled in the line must not be called ready. If ``ready`` stops being a
  property, the override is read wrong: ``contract_ready``.
- ``start timeout``: JupyterHub bounds the whole ``start`` by ``start_timeout`` and has no
  separate bound for the server's own start; the spawner lengthens it for the line in
  ``run_pre_spawn_hook``, relying on JupyterHub reading ``start_timeout`` after that call. If
  the order changes, the line's waits time out at ``start_timeout``: ``contract_start_timeout``.
- ``oauthenticator rules``: GitHubOAuthenticator's ``check_allowed`` runs its own organization
  check, which the authenticator replaces (telling a refused member why); OAuthenticator's
  rules (admins, allowed users) have no public entry but that method. If the class order
  changes, the wrong check runs: ``contract_oauthenticator_rules``.
- ``object name``: dockerspawner calls its default by the private name when the image changes,
  so the spawner's default must have that name. If dockerspawner renames it, service names are
  no longer fitted to Swarm's limit: ``contract_object_name``.
- ``idle servers``: JupyterHub has no call that stops a server from inside the hub but its REST
  API's handler (``BaseHandler.stop_single_user``, bound to a request); ``stop_server`` does
  what it does (the route removed, then ``User.stop``) for the hub's own stops (disk.py,
  access.py, fleet.py), and the fleet's idle stop reads each server's last activity from its
  row, as the idle culler reads it through the REST API. If the column or the calls change,
  those stops fail with an AttributeError and stop nothing: ``contract_idle_servers``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import threading
from dataclasses import dataclass
from datetime import timezone
from typing import Callable

from dockerspawner import SwarmSpawner
from jupyterhub import apihandlers, handlers, orm
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.user import User
from jupyterhub.utils import new_token
from oauthenticator.github import GitHubOAuthenticator
from sqlalchemy import event
from sqlalchemy.engine import Engine
from tornado.tcpserver import TCPServer
from traitlets import default

#: The series of each package this module was written for and tested with (a version matches
#: when it starts with the series and a dot, or equals it). Pinned in images/hub/requirements.txt
#: and pyproject.toml.
WRITTEN_FOR = {
    "jupyterhub": "6.1",
    "dockerspawner": "14",
    "oauthenticator": "17",
    "tornado": "6",
    "sqlalchemy": "2",
    "aiohttp": "3",
}
PINS = "images/hub/requirements.txt and pyproject.toml"

#: what each reach-in relies on, as docs/internals.md lists it (the contract tests check each)
RELIES_ON = {
    "handler tables": "jupyterhub.handlers.default_handlers and "
    "jupyterhub.apihandlers.default_handlers: lists of (pattern, handler class, ...) that "
    "JupyterHub reads when it starts, holding SpawnHandler and UserServerAPIHandler",
    "get_spawner": "User.get_spawner(self, server_name='', replace_failed=False), which every "
    "start goes through, and User.spawners, a dict whose get makes no spawner",
    "activity writers": "BaseHandler.get_current_user_token(self) and "
    "BaseHandler._user_for_cookie(self, cookie_name, cookie_value=None), which find a request's "
    "user and write its last activity through BaseHandler._record_activity(self, obj, "
    "timestamp=None); a refused write raises sqlalchemy.exc.OperationalError",
    "listen backlog": "tornado.tcpserver.TCPServer.listen(self, port, address=None, *, "
    "backlog=..., ...), which JupyterHub's HTTP server listens with",
    "hub start": "jupyterhub.app.JupyterHub.start(self), a coroutine that returns once the hub "
    "serves",
    "sqlite connect": "SQLAlchemy's 'connect' event on Engine, given the DB-API connection",
    "spawn future": "Spawner._spawn_future: the running or last start (JupyterHub's spawn-pending "
    "page and progress stream read it; None when none)",
    "failed start": "Spawner._failed: the exception of the last start, if it failed",
    "log name": "Spawner._log_name: 'user:server' for the log",
    "docker calls": "DockerSpawner._docker(self, method, *args, **kwargs): a coroutine calling "
    "the Docker client's method in dockerspawner's thread pool",
    "allowed images": "DockerSpawner._get_allowed_images(self): allowed_images, called if callable",
    "object name": "DockerSpawner._object_name_default(self): dockerspawner's default name of "
    "the service, which it calls again by this name when the image changes (so the spawner's "
    "own default has this name)",
    "docker client": "DockerSpawner._client: the class's one Docker client (None until made) "
    "and DockerSpawner.client, the property that makes it",
    "database rows": "orm.APIToken.find(db, token), Spawner.orm_spawner (its user_options and "
    "state columns) and Spawner.user.db, the hub's database session",
    "start handlers": "BaseHandler.spawn_single_user(self, user, server_name='', "
    "display_name='', options=None), through which SpawnHandler and UserServerAPIHandler start "
    "every server, and BaseHandler.find_user(self, name), by which they find the user; "
    "neither overridden by those two handlers",
    "held users": "BaseHandler.users: JupyterHub's UserDict, a dict of the users it holds by "
    "id, whose own get and [] query the database for one it does not hold",
    "server rows": "User.orm_spawners (orm.User's): {server name: orm.Spawner row} of every "
    "server the user has in the database, made into a spawner or not",
    "ready": "Spawner.ready: a property, JupyterHub's 'the server is ready to use'",
    "start timeout": "User.spawn calls Spawner.run_pre_spawn_hook() and then bounds the whole "
    "Spawner.start by Spawner.start_timeout, read after that call",
    "oauthenticator rules": "GitHubOAuthenticator.check_allowed(self, username, auth_model): "
    "OAuthenticator's check_allowed (admins, allowed users), then its organization check; "
    "OAuthenticator's is the next in its classes' order",
    "login sessions": "orm.User.cookie_id, which a browser's hub login cookie holds and "
    "BaseHandler._user_for_cookie looks the user up by (a new value, from "
    "jupyterhub.utils.new_token, makes every such cookie of the user invalid), and "
    "orm.User.api_tokens, every API and OAuth token of the user (their servers' and the "
    "tokens their browsers hold for their servers)",
    "idle servers": "orm.Spawner.last_activity (naive UTC; the REST API's server model gives it "
    "as last_activity, which jupyterhub-idle-culler reads), Spawner.active, Spawner.pending, "
    "User.spawners and JupyterHub.users (held users); a server stopped as "
    "BaseHandler.stop_single_user does: Proxy.delete_user(user, server_name), then "
    "User.stop(server_name)",
}

#: the attribute a process-wide change carries: which change it is
MARK = "gpuhub_door"


# ---- versions -------------------------------------------------------------------------------


def version_problems(installed: Callable[[str], str] | None = None) -> list[str]:
    """One line per package of WRITTEN_FOR whose installed version (``installed(package)``,
    by default importlib.metadata's) is not its series."""
    installed = installed or importlib.metadata.version
    problems = []
    for package, series in WRITTEN_FOR.items():
        try:
            version = installed(package)
        except importlib.metadata.PackageNotFoundError:
            problems.append(
                f"{package} is not installed, but gpu_swarm_spawner/internals.py was written "
                f"for {package} {series}.x: install the pinned versions ({PINS})"
            )
            continue
        if version != series and not version.startswith(series + "."):
            problems.append(
                f"{package} {version} is installed, but gpu_swarm_spawner/internals.py was "
                f"written for {package} {series}.x: install the pinned versions "
                f"({PINS}), or re-check each reach-in of docs/internals.md against {package} "
                f"{version} and change WRITTEN_FOR"
            )
    return problems


def check_versions(installed: Callable[[str], str] | None = None) -> None:
    """Stop the hub with one error naming each package not of its pinned series."""
    problems = version_problems(installed)
    if problems:
        raise RuntimeError("; ".join(problems))


def unknown(what: str) -> RuntimeError:
    return RuntimeError(
        f"{what}: this is not the JupyterHub gpu_swarm_spawner/internals.py was written for. "
        f"Install the pinned versions ({PINS}), or see docs/internals.md."
    )


# ---- process-wide changes -------------------------------------------------------------------


def _replace(owner, name: str, tag: str, make: Callable[[Callable], Callable]) -> None:
    """``owner.name`` replaced by ``make(owner.name)``, once: marked ``tag``, it is not
    replaced again."""
    current = getattr(owner, name, None)
    if current is None:
        raise unknown(f"{owner.__name__} has no {name}")
    if getattr(current, MARK, None) == tag:
        return
    replacement = functools.wraps(current)(make(current))
    setattr(replacement, MARK, tag)
    setattr(owner, name, replacement)


def _replaced(owner, name: str, tag: str) -> bool:
    return getattr(getattr(owner, name, None), MARK, None) == tag


def _handler_tables() -> list[list[tuple]]:
    return [handlers.default_handlers, apihandlers.default_handlers]


def replace_handlers(swaps: dict[type, type]) -> None:
    """Each handler class of ``swaps``' keys replaced by its value in JupyterHub's handler
    tables, which it reads when it starts (so: from the config file). Each must be found.
    Idempotent."""
    found = set()
    for table in _handler_tables():
        for i, (pattern, handler, *rest) in enumerate(table):
            for original, replacement in swaps.items():
                if handler in (original, replacement):
                    table[i] = (pattern, replacement, *rest)
                    found.add(original)
    missing = [cls.__name__ for cls in swaps if cls not in found]
    if missing:
        raise unknown(f"JupyterHub's handler tables have no {', '.join(missing)}")


def handlers_replaced(swaps: dict[type, type]) -> bool:
    in_tables = {handler for table in _handler_tables() for _, handler, *_ in table}
    return all(replacement in in_tables for replacement in swaps.values())


def keep_spawners(keep: Callable[[object], bool]) -> None:
    """``User.get_spawner`` returns the spawner it holds when ``keep(spawner)`` says so, even
    where it would replace one whose last start failed (``replace_failed``). Idempotent."""

    def make(get_spawner):
        def get_spawner_keeping(self, server_name="", replace_failed=False):
            spawner = dict.get(self.spawners, server_name)  # dict.get: makes none
            if spawner is not None and keep(spawner):
                return spawner
            return get_spawner(self, server_name, replace_failed)

        return get_spawner_keeping

    _replace(User, "get_spawner", "keep spawners", make)


#: JupyterHub's methods that find a request's user and write down their last activity
ACTIVITY_WRITERS = ("get_current_user_token", "_user_for_cookie")


def find_users_despite_refused_writes(
    refused: type[Exception], on_refused: Callable[[BaseHandler, Exception], None]
) -> None:
    """When writing a request's last activity raises ``refused`` while JupyterHub finds the
    request's user (ACTIVITY_WRITERS), ``on_refused(handler, error)`` is called and the user is
    found again without writing it (``_record_activity`` then writes nothing for that request).
    Idempotent."""
    missing = [n for n in (*ACTIVITY_WRITERS, "_record_activity") if not hasattr(BaseHandler, n)]
    if missing:
        raise unknown(f"JupyterHub's BaseHandler has no {', '.join(missing)}")

    def finding(method):
        def find(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except refused as e:
                on_refused(self, e)
                self.gpuhub_activity_refused = True
                return method(self, *args, **kwargs)

        return find

    def recording(record):
        def record_unless_refused(self, obj, timestamp=None):
            if getattr(self, "gpuhub_activity_refused", False):
                return False
            return record(self, obj, timestamp)

        return record_unless_refused

    for name in ACTIVITY_WRITERS:
        _replace(BaseHandler, name, "users found", finding)
    _replace(BaseHandler, "_record_activity", "users found", recording)


def _users_found() -> bool:
    return all(
        _replaced(BaseHandler, n, "users found") for n in (*ACTIVITY_WRITERS, "_record_activity")
    )


def deepen_listen_backlog(backlog: int) -> None:
    """Every tornado server of this process listens with room for ``backlog`` waiting
    connections unless told otherwise (tornado's default: 128; JupyterHub has no setting).
    Idempotent: the first backlog stays."""

    def make(listen):
        def deep_listen(self, port, address=None, **kwargs):
            kwargs.setdefault("backlog", backlog)
            return listen(self, port, address, **kwargs)

        return deep_listen

    _replace(TCPServer, "listen", "listen backlog", make)


def after_hub_start(then: Callable[[object], None]) -> None:
    """``then(hub)`` once JupyterHub has started (it has no hook for that), after those given
    before. Idempotent: a ``then`` given again (an equal one) is not added twice."""
    from jupyterhub.app import JupyterHub

    def make(start):
        async def start_then(hub):
            await start(hub)
            for each in list(start_then.gpuhub_then):
                each(hub)

        return start_then

    _replace(JupyterHub, "start", "after start", make)
    thens = JupyterHub.start.__dict__.setdefault("gpuhub_then", [])
    if then not in thens:
        thens.append(then)


def _after_start() -> bool:
    from jupyterhub.app import JupyterHub

    return _replaced(JupyterHub, "start", "after start")


def on_every_connection(hook: Callable[[object, object], None]) -> None:
    """``hook(dbapi_connection, record)`` for every database connection SQLAlchemy opens in this
    process from now on (the hub's engine is made after its config is read). Idempotent."""
    if not event.contains(Engine, "connect", hook):
        event.listen(Engine, "connect", hook)


def on_every_connection_wired(hook) -> bool:
    return event.contains(Engine, "connect", hook)


def wired(swaps: dict[type, type], connection_hook) -> dict[str, bool]:
    """Which process-wide changes are in place in this process (``swaps``: the gate's handlers;
    ``connection_hook``: hubdb's)."""
    return {
        "handler tables": handlers_replaced(swaps),
        "get_spawner": _replaced(User, "get_spawner", "keep spawners"),
        "activity writers": _users_found(),
        "listen backlog": _replaced(TCPServer, "listen", "listen backlog"),
        "hub start": _after_start(),
        "sqlite connect": on_every_connection_wired(connection_hook),
    }


# ---- the spawner's reach-ins ----------------------------------------------------------------


def spawn_future(spawner):
    """JupyterHub's record of the spawner's running or last start (None: none)."""
    return spawner._spawn_future


def set_spawn_future(spawner, future) -> None:
    """Make ``future`` the spawner's last start, as JupyterHub's pages read it."""
    spawner._spawn_future = future


def log_name(spawner) -> str:
    """JupyterHub's name of any spawner for the log (``user:server``)."""
    return spawner._log_name


class SpawnerInternals(SwarmSpawner):
    """dockerspawner's ``SwarmSpawner`` with its and JupyterHub's private attributes that the
    spawner uses, under names of ours (RELIES_ON)."""

    _client_made = threading.Lock()

    @property
    def client(self):
        """dockerspawner's one Docker client, made once under a lock. dockerspawner makes it on
        first use with no lock (its pool has one thread); the broker's threads reaching it at
        once each made one and replaced the others while a thread read it, and CPython 3.11
        crashed (a segmentation fault: the replaced client's connections were closed while the
        class attribute was being set)."""
        made = type(self)._client
        if made is not None:
            return made
        with self._client_made:
            return super().client

    @property
    def log_name(self) -> str:
        return log_name(self)

    @property
    def ready(self):
        """JupyterHub's ``Spawner.ready``, except while ``ready_withheld`` is true."""
        return False if self.ready_withheld else super().ready

    @property
    def ready_withheld(self) -> bool:
        """True: JupyterHub is told the server is not ready, whatever it would say."""
        return False

    _configured_start_timeout = None  # start_timeout as configured (the server's own start)

    def run_pre_spawn_hook(self):
        """JupyterHub's last call before ``start``, whose whole run it then bounds by
        ``start_timeout`` (read after this call): that bound becomes the configured
        ``start_timeout`` plus ``time_before_server_start()``; ``server_start_timeout`` keeps
        the configured one."""
        if self._configured_start_timeout is None:
            self._configured_start_timeout = self.start_timeout
        self.start_timeout = self._configured_start_timeout + self.time_before_server_start()
        return super().run_pre_spawn_hook()

    def time_before_server_start(self) -> int:
        """Seconds a start may spend before the server's own start begins (0)."""
        return 0

    @property
    def server_start_timeout(self) -> int:
        """Seconds the server's own start may take (the configured ``start_timeout``)."""
        if self._configured_start_timeout is None:
            return self.start_timeout
        return self._configured_start_timeout

    @default("object_name")
    def _object_name_default(self):  # this name: dockerspawner calls it again by it
        """``object_name``'s default, which dockerspawner also calls when the image changes:
        ``fitted_object_name()``."""
        return self.fitted_object_name()

    def fitted_object_name(self) -> str:
        """The service's name: dockerspawner's (``dockerspawner_object_name``)."""
        return self.dockerspawner_object_name()

    @property
    def last_start_error(self) -> BaseException | None:
        """The exception of the last start, if it failed."""
        return self._failed

    def docker_call(self, method: str, *args, **kwargs):
        """dockerspawner's call of a Docker client method in its thread pool (a coroutine)."""
        return self._docker(method, *args, **kwargs)

    def allowed_images_now(self):
        """``allowed_images``, called if it is callable (dockerspawner's reading)."""
        return self._get_allowed_images()

    def dockerspawner_object_name(self) -> str:
        """dockerspawner's default service name (``jy-<escaped user>[--<server>]``)."""
        return SwarmSpawner._object_name_default(self)

    def saved_user_options(self) -> dict:
        """The options of the last start, as this spawner's row of the hub's database keeps
        them (JupyterHub starts with them when given none); {} outside a hub (no row)."""
        return getattr(self.orm_spawner, "user_options", None) or {}

    def write_row_now(self, **fields) -> None:
        """Set ``fields`` on this spawner's row of the hub's database and commit (JupyterHub
        writes it only once a start or stop has finished); nothing outside a hub (no row)."""
        if self.orm_spawner is None:
            return
        for name, value in fields.items():
            setattr(self.orm_spawner, name, value)
        db = getattr(self.user, "db", None)
        if db is not None:
            db.commit()

    def delete_api_token(self, token: str) -> None:
        """Remove the API token ``token`` from the hub's database, if it is there."""
        db = getattr(self.user, "db", None)
        found = orm.APIToken.find(db, token) if db is not None else None
        if found is not None:
            db.delete(found)
            db.commit()


# ---- the handlers that start servers, and what they read --------------------------------------


class StartHandlerInternals:
    """The base of a subclass of JupyterHub's ``SpawnHandler`` or ``UserServerAPIHandler``
    (put before it): the two methods of JupyterHub's ``BaseHandler`` such a handler starts a
    server with, handing over to methods of ours (RELIES_ON "start handlers")."""

    async def spawn_single_user(self, user, server_name="", display_name="", options=None):
        """JupyterHub's start of ``user``'s server by this handler: ``spawn_asked``."""
        jupyterhubs = functools.partial(
            super().spawn_single_user, user, server_name, display_name, options=options
        )
        return await self.spawn_asked(user, server_name, options, jupyterhubs)

    async def spawn_asked(self, user, server_name: str, options, spawn: Callable):
        """A start of ``user``'s ``server_name`` with ``options``; ``await spawn()`` is
        JupyterHub's (its limits, its spawn work). Here: JupyterHub's alone."""
        return await spawn()

    def find_user(self, name):
        """``held_user_named(name)``, else JupyterHub's lookup (a database query)."""
        user = self.held_user_named(name)
        return user if user is not None else super().find_user(name)

    def held_user_named(self, name):
        """A user JupyterHub holds by that name, found without its database (here: None)."""
        return None


def held_user(users, user_id):
    """The user JupyterHub's ``users`` (its UserDict) holds under ``user_id``, else None,
    without its database query for one it does not hold."""
    return dict.get(users, user_id)


def server_rows(user) -> dict:
    """{server name: database row} of every server ``user`` has, made into a spawner or not
    (``user.spawners`` would make them)."""
    return user.orm_spawners


# ---- the authenticator ----------------------------------------------------------------------


async def oauthenticator_check_allowed(authenticator, username: str, auth_model: dict) -> bool:
    """OAuthenticator's own ``check_allowed`` for ``authenticator`` (a GitHubOAuthenticator):
    admins and allowed users, without GitHubOAuthenticator's organization check."""
    return await super(GitHubOAuthenticator, authenticator).check_allowed(username, auth_model)


# ---- a user's logins ------------------------------------------------------------------------


def end_sessions(user) -> int:
    """Every login of JupyterHub's ``user`` ended: the hub cookie of each of their browsers no
    longer names them (JupyterHub clears it and sends them to the login page), and every API
    and OAuth token of theirs is removed (their server's, and those their browsers hold for
    it). Returns how many tokens were removed. The user and their servers' state are kept."""
    orm_user = user.orm_user
    db = user.db
    orm_user.cookie_id = new_token()
    tokens = list(orm_user.api_tokens)
    for token in tokens:
        db.delete(token)
    db.commit()
    return len(tokens)


# ---- the hub's servers, read and stopped ------------------------------------------------------


@dataclass(frozen=True)
class HubServer:
    """A server JupyterHub has, as the fleet's idle stop reads it."""

    user: str
    server: str  # "" for the default server
    service_id: str  # its Swarm service (dockerspawner's object_id); "" before it exists
    last_activity: float | None  # epoch seconds, JupyterHub's; None: starting or stopping


def _epoch(when) -> float | None:
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)  # JupyterHub's columns are naive UTC
    return when.timestamp()


def running_servers(hub) -> list[HubServer]:
    """Every server of the users JupyterHub holds that is running, starting or stopping, with
    its last activity as jupyterhub-idle-culler reads it (the server's row's
    ``last_activity``, the REST API's server model's); None while it starts or stops."""
    found = []
    for user in list(hub.users.values()):
        for name, spawner in list(user.spawners.items()):
            if not spawner.active:
                continue
            row = spawner.orm_spawner
            last = None if spawner.pending else _epoch(getattr(row, "last_activity", None))
            service = getattr(spawner, "object_id", "") or ""
            found.append(HubServer(user.name, name or "", service, last))
    return found


async def stop_server(hub, user, server_name: str) -> None:
    """Stop JupyterHub's ``user``'s ``server_name`` ("" for the default server) as its REST
    API does (``BaseHandler.stop_single_user``): its route removed first, then ``User.stop``,
    which stops the spawner and writes its state; the home is kept. The hub's own stops (the
    disk check, the access check, the fleet's idle stop) all go through here."""
    await hub.proxy.delete_user(user, server_name)
    await user.stop(server_name)


async def stop_idle_server(
    hub, user_name: str, server_name: str, idle_since: float, why: str = ""
) -> bool:
    """Stop ``user_name``'s ``server_name`` (``stop_server``) only if it is still running,
    neither starting nor stopping, and had no activity after ``idle_since`` (epoch seconds);
    its participant reads ``why`` on their page until their next start (the spawner's
    ``stopped_by_hub``; "": nothing said). Returns whether it was stopped."""
    user = next((u for u in list(hub.users.values()) if u.name == user_name), None)
    spawner = dict.get(user.spawners, server_name) if user is not None else None
    if spawner is None or not spawner.active or spawner.pending:
        return False
    last = _epoch(getattr(spawner.orm_spawner, "last_activity", None))
    if last is None or last > idle_since:
        return False
    if why:
        spawner.stopped_by_hub(why)
    await stop_server(hub, user, server_name)
    return True
