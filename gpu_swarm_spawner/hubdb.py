"""The hub's SQLite database in write-ahead-log mode.

JupyterHub writes its database from its one event-loop thread: each spawn commits several
times (its token, its OAuth client, its state), and with SQLite's default rollback journal
every commit waits for the disk (fsync, about 0.7 ms each on the test machine and more on a
busy disk); a burst of 50 participants queues behind those waits. In WAL mode with
``synchronous=NORMAL`` a commit is an append (fsync at checkpoints), about 0.01 ms, and a
committed transaction survives a crash of the hub; only a power loss may lose the last
commits (SQLite's documented trade-off). Readers (``make status`` through the API) are not
blocked by the writer either.
"""

from __future__ import annotations

import sqlite3

from . import internals

PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")


def on_connect(dbapi_connection, _record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return  # another database (MySQL, PostgreSQL): its own settings apply
    cursor = dbapi_connection.cursor()
    try:
        for pragma in PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def use_write_ahead_log() -> None:
    """Every SQLite connection SQLAlchemy opens from now on is in WAL mode (idempotent)."""
    internals.on_every_connection(on_connect)
