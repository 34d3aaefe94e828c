"""Telling a participant no GPU slice is free before JupyterHub does its work for a spawn.

For every spawn it begins, JupyterHub does about 12 ms of database work on its one thread (the
server's API token and OAuth client, and their removal when the start fails) around the
spawner's ``start``. When many press Start at once on a full hub, each refusal waits behind
all of that work: with a spawner that refuses at once, 100 at a time were told after
1.2-1.6 s and 500 (the waiting line lifts JupyterHub's concurrent-spawn limit) after up to
7 s, on a 2-core machine. The gate asks the spawner first
(``GPUSwarmSpawner.refusal_before_spawn``: the same inventory, claims and rules as its
``start``) and answers its refusal without that work. A spawn it lets through has its
slices reserved at once, so that in a burst the next ones asking see them taken; its ``start``
takes that reservation as its own (the broker chooses once per spawn), and one no start took
is freed when JupyterHub's spawn returns. Whatever the gate does not refuse, and any error
while asking, goes JupyterHub's usual way. The gate comes before the checks of JupyterHub's
``spawn_single_user`` (its concurrent-spawn limit, ``refresh_pre_spawn``): on a full hub,
those over the limit are told there is no slice rather than "429: too many users".

The refusal looks as it always did: the same exception, raised where JupyterHub's own spawn
raises it (the error page, the spawn form, the REST API's 503), and kept as the server's
failed spawn, as JupyterHub keeps one, so the spawn-pending page and the progress stream say
"Spawn failed: ..." too. When that participant presses Start again, JupyterHub would throw
the spawner away as one whose start failed, and make two new ones (the handler's, then its
spawn's); a spawner the gate refused never started, so it is kept (``keep_refused_spawners``).

JupyterHub has no hook before that work, so ``install`` (called by ``jupyterhub_config.py``)
puts subclasses of the handlers that start servers (``SpawnHandler``: the spawn page;
``UserServerAPIHandler``: the REST API) in JupyterHub's handler tables. It checks that it
found them: a JupyterHub that moved them fails at start-up with an error instead of quietly
losing the gate.

On a full disk the spawner refuses every start with a message that says so
(``hub_disk_refusal``), but JupyterHub found no user for the request before asking it: it
writes down the user's last activity while it finds them, and takes a refused write for no
user ("403: Missing or invalid credentials"). ``install`` also lets it find the user without
that write (``find_users_when_activity_cannot_be_written``).
"""

from __future__ import annotations

import asyncio
import time

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.handlers.pages import SpawnHandler
from sqlalchemy.exc import OperationalError

from . import internals

#: Connections the hub's port holds while its one thread is busy; tornado's default is 128. With
#: 500 spawn requests at once (through the proxy, one connection each), the kernel dropped what
#: did not fit in 128, and those requests were sent again after 1, 3 or 7 s. The kernel caps it
#: at net.core.somaxconn (4096 by default in each network namespace).
LISTEN_BACKLOG = 2048


class RefuseFirst(internals.StartHandlerInternals):
    """For a handler that starts servers: ask the spawner whether it would refuse at once."""

    async def spawn_asked(self, user, server_name, options, spawn):
        spawner = self._spawner_to_ask(user, server_name)
        if spawner is None:
            return await spawn()
        refusal = await self._ask(spawner, options)
        if refusal is not None:
            # kept as JupyterHub keeps a failed spawn (its spawn-pending page reads it)
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(refusal)
            failed.exception()  # read here, so asyncio does not warn it was never read
            spawner.gpuhub_refusal = failed
            internals.set_spawn_future(spawner, failed)
            raise refusal
        try:
            return await spawn()
        finally:
            spawner.forget_gate_reservation()  # one start did not take (it never ran)

    #: ``(the hub's users, {name: user})``: find_user's index, rebuilt when a name is not in it
    #: or its user has been renamed or removed since (one hub per process)
    _by_name: tuple = (None, {})

    def held_user_named(self, name):
        """The user the hub already holds by that name, for ``find_user`` without JupyterHub's
        database query (with its relationships: a third of each refusal's time in a burst);
        None: JupyterHub's lookup. Found through an index: going through all 500 users for
        each of 500 requests at once was 6% of the hub's time."""
        users = self.users
        held, by_name = RefuseFirst._by_name
        user = by_name.get(name) if held is users else None
        if user is None or user.name != name or internals.held_user(users, user.id) is not user:
            by_name = {u.name: u for u in users.values()}
            RefuseFirst._by_name = (users, by_name)
            user = by_name.get(name)
        return user

    @staticmethod
    def _spawner_to_ask(user, server_name):
        """The spawner JupyterHub's spawn would use, if it can be asked; else None."""
        if server_name not in internals.server_rows(user):
            return None  # JupyterHub's checks come first (the handler made it if it may)
        # made from its database row if need be, as JupyterHub's spawn would; one whose last
        # start failed is asked all the same (a refusal replaces that failure)
        spawner = user.spawners[server_name]
        if not hasattr(spawner, "refusal_before_spawn") or spawner.active:
            return None  # another spawner class, or JupyterHub says it runs or is pending
        return spawner

    async def _ask(self, spawner, options):
        try:
            return await spawner.refusal_before_spawn(options)
        except Exception:
            self.log.exception(
                "Could not ask %s before the spawn; starting as usual",
                internals.log_name(spawner),
            )
            return None


class GatedSpawnHandler(RefuseFirst, SpawnHandler):
    """JupyterHub's spawn page (GET starts a server without a form, POST with one)."""


class GatedUserServerAPIHandler(RefuseFirst, UserServerAPIHandler):
    """JupyterHub's REST API: ``POST /hub/api/users/:name/server[s/:server]``."""


#: JupyterHub's handler, the gated one in its place
SWAPS = {SpawnHandler: GatedSpawnHandler, UserServerAPIHandler: GatedUserServerAPIHandler}


def refused_by_the_gate(spawner) -> bool:
    """Was the last start asked of ``spawner`` refused by the gate (and none begun since)?"""
    future = internals.spawn_future(spawner)
    return future is not None and future is getattr(spawner, "gpuhub_refusal", None)


#: the refused activity writes are logged at most this often (every request meets one)
REFUSED_WRITE_LOG_S = 60.0
_refused_write_logged = [-REFUSED_WRITE_LOG_S]  # when it was last logged (time.monotonic)


def _refused_write(handler, error: OperationalError) -> None:
    """The hub's database refused to write a request's activity (its disk full: SQLite's
    "database or disk is full"): the write is rolled back, and said once a minute."""
    handler.db.rollback()
    now = time.monotonic()
    if now - _refused_write_logged[0] >= REFUSED_WRITE_LOG_S:
        _refused_write_logged[0] = now
        handler.log.warning(
            "The hub's database refused to write down a request's activity (%s): "
            "requests go on without (said once a minute). Free space on the hub's "
            "data volume if it is full.",
            error.orig,
        )


def deepen_listen_backlog(backlog: int = LISTEN_BACKLOG) -> None:
    """JupyterHub's HTTP server listens with room for ``backlog`` waiting connections instead
    of tornado's 128 (JupyterHub has no setting for it). Idempotent."""
    internals.deepen_listen_backlog(backlog)


def keep_refused_spawners() -> None:
    """A spawner whose last start the gate refused is kept when a start is asked again, where
    JupyterHub's ``User.get_spawner(replace_failed=True)`` replaces a spawner whose last start
    failed (its state may be half-made; one the gate refused has none). JupyterHub's
    replacement made two spawners per refusal (the handler's, then its spawn's): with 500
    refused participants asking again at once, the last was told after 1.12-1.37 s instead of
    0.54-0.62 s (a hub outside Docker). Any other failed spawner is replaced as before.
    Idempotent."""
    internals.keep_spawners(refused_by_the_gate)


def find_users_when_activity_cannot_be_written() -> None:
    """A request's user is found even when the hub's database refuses to write down their last
    activity (its disk full: SQLite's "database or disk is full"). JupyterHub writes it while it
    finds the user of a request (at most every ``activity_resolution``) and takes a failed
    write for no user: on a full disk, a participant pressing Start read "403: Missing or
    invalid credentials", a logged-in one was sent to log in again (whose own writes fail too),
    and running servers checking their participants were refused. Now the write is rolled back
    and the user found again without writing their activity; a start then reaches the spawner,
    whose refusal says the hub's disk is full (``hub_disk_refusal``), and everything that only
    reads goes on. Idempotent."""
    internals.find_users_despite_refused_writes(OperationalError, _refused_write)


def install() -> None:
    """JupyterHub's spawn page and REST API ask the spawner before any spawn work, refused
    spawners are kept, and a request's user is found on a full disk too. Call it from the hub's
    config file (JupyterHub reads its handler tables after loading the config). Idempotent."""
    internals.replace_handlers(SWAPS)
    keep_refused_spawners()
    find_users_when_activity_cannot_be_written()
