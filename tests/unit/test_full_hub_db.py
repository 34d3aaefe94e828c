"""The hub's database refusing writes (its disk full): a request's user is still found.

JupyterHub writes down a user's last activity while it finds the user of a request, and took a
refused write for no user: "403: Missing or invalid credentials" for a participant pressing
Start on a full disk. ``gate.find_users_when_activity_cannot_be_written`` rolls the write back
and finds the user without it. Here JupyterHub's own handler finds users on a real SQLite
database whose connection answers every write as SQLite does on a full disk.
"""

from __future__ import annotations

import datetime
import sqlite3
from types import SimpleNamespace
from unittest import mock

import pytest
import sqlalchemy
import sqlalchemy.orm
from jupyterhub import orm
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.user import User
from tornado import web
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from gpu_swarm_spawner import gate, internals

WRITES = ("UPDATE", "INSERT", "DELETE")
HELD: dict[str, User] = {}
SECRET = b"s" * 32


class Cursor:
    """A sqlite3 cursor whose writes fail as on a full disk once its connection is full."""

    def __init__(self, cursor, connection):
        self._cursor, self._connection = cursor, connection

    def execute(self, statement, *args):
        if self._connection.full and statement.lstrip().upper().startswith(WRITES):
            raise sqlite3.OperationalError("database or disk is full")
        return self._cursor.execute(statement, *args)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


class FillingConnection:
    """A sqlite3 connection that can be made to answer as on a full disk."""

    full = False

    def __init__(self, path):
        self._connection = sqlite3.connect(path, check_same_thread=False)

    def cursor(self, *args, **kwargs):
        return Cursor(self._connection.cursor(*args, **kwargs), self)

    def __getattr__(self, name):
        return getattr(self._connection, name)


@pytest.fixture
def hub_db(tmp_path):
    connection = FillingConnection(str(tmp_path / "jupyterhub.sqlite"))
    engine = sqlalchemy.create_engine(
        "sqlite://", creator=lambda: connection, poolclass=sqlalchemy.pool.StaticPool
    )
    orm.Base.metadata.create_all(engine)
    db = sqlalchemy.orm.Session(engine)
    dana = orm.User(name="dana")
    db.add_all([dana, orm.OAuthClient(identifier="jupyterhub")])  # the hub's own, as at start
    db.commit()
    token = dana.new_api_token()
    # last seen an hour ago: the next request writes down its activity
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)  # as JupyterHub stores it
    hour_ago = now - datetime.timedelta(hours=1)
    dana.last_activity = hour_ago
    orm.APIToken.find(db, token).last_activity = hour_ago
    db.commit()
    HELD["dana"] = User(dana, settings={}, db=db)
    return connection, db, token


@pytest.fixture
def unwritten(monkeypatch):
    for name in (*internals.ACTIVITY_WRITERS, "_record_activity"):
        monkeypatch.setattr(BaseHandler, name, getattr(BaseHandler, name))  # put back after
    monkeypatch.setattr(gate, "_refused_write_logged", [-gate.REFUSED_WRITE_LOG_S])
    gate.find_users_when_activity_cannot_be_written()
    gate.find_users_when_activity_cannot_be_written()  # twice: as once


def handler_for(db, **headers):
    settings = {"db": db, "activity_resolution": 30, "hub": SimpleNamespace(base_url="/hub/")}
    settings.update(cookie_secret=SECRET, cookie_max_age_days=14)  # JupyterHub's default
    app = web.Application(**settings)
    request = HTTPServerRequest(
        start_line=RequestStartLine("POST", "/hub/api/users/dana/server", "HTTP/1.1"),
        headers=HTTPHeaders({"Host": "hub.example.org", **headers}),
        connection=mock.Mock(),
    )
    handler = BaseHandler(app, request)
    # the hub's users, as it holds them since its start (JupyterHub's UserDict)
    handler._user_from_orm = lambda orm_user: orm_user and HELD[orm_user.name]
    return handler


def find_by_token(db, token):
    """The user JupyterHub's handler finds for a REST API request with ``token``."""
    return handler_for(db, Authorization=f"token {token}").get_current_user_token()


def find_by_cookie(db, token):
    """The user JupyterHub's handler finds for a browser with dana's login cookie."""
    dana = db.query(orm.User).one()
    cookie = web.create_signed_value(SECRET, "jupyterhub-hub-login", dana.cookie_id)
    return handler_for(db)._user_for_cookie("jupyterhub-hub-login", cookie)


@pytest.mark.parametrize("find", [find_by_token, find_by_cookie])
def test_on_a_full_disk_a_request_s_user_is_found_without_writing_activity(
    hub_db, unwritten, caplog, find
):
    connection, db, token = hub_db
    connection.full = True
    user = find(db, token)
    assert user is not None and user.name == "dana"
    assert "refused to write down a request's activity" in caplog.text
    assert "database or disk is full" in caplog.text
    find(db, token)  # said once a minute, not for every request
    assert caplog.text.count("refused to write down") == 1
    connection.full = False  # space freed: activity is written again
    before = db.query(orm.User).one().last_activity
    assert find(db, token).name == "dana"
    assert db.query(orm.User).one().last_activity > before


@pytest.mark.parametrize("find", [find_by_token, find_by_cookie])
def test_jupyterhub_alone_takes_a_refused_activity_write_for_no_user(hub_db, find):
    connection, db, token = hub_db
    connection.full = True
    # JupyterHub's get_current_user logs it and finds nobody: "403: Missing or invalid credentials"
    with pytest.raises(sqlalchemy.exc.OperationalError):
        find(db, token)


def test_a_jupyterhub_that_finds_users_elsewhere_stops_the_hub_with_advice(monkeypatch):
    monkeypatch.delattr(BaseHandler, "_user_for_cookie")
    with pytest.raises(RuntimeError, match="no _user_for_cookie.*images/hub/requirements"):
        gate.find_users_when_activity_cannot_be_written()
