"""The hub's SQLite database in write-ahead-log mode (gpu_swarm_spawner/hubdb.py)."""

from sqlalchemy import create_engine, text

from gpu_swarm_spawner import hubdb


def pragmas(url: str) -> tuple[str, int]:
    with create_engine(url).connect() as connection:
        mode = connection.execute(text("PRAGMA journal_mode")).scalar()
        sync = connection.execute(text("PRAGMA synchronous")).scalar()
    return mode, sync


def test_the_hubs_sqlite_connections_use_the_write_ahead_log(tmp_path):
    hubdb.use_write_ahead_log()
    hubdb.use_write_ahead_log()  # twice: still one listener
    assert pragmas(f"sqlite:///{tmp_path}/jupyterhub.sqlite") == ("wal", 1)  # 1: NORMAL
    assert pragmas("sqlite://") == ("memory", 1)  # an in-memory database keeps its journal
