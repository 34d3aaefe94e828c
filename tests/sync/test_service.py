"""The sync service over HTTP on loopback: webhook, status, polling; real git remotes."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from tutorial_sync import webhook
from tutorial_sync.publish import Publisher, Repo
from tutorial_sync.service import SyncService, make_app, parse_args

from .gitrepos import Author

SECRET = "workshop-webhook-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def author(tmp_path):
    (tmp_path / "good").mkdir()
    a = Author(tmp_path / "good")
    a.write("intro.ipynb", "{}")
    a.commit_and_push("first")
    return a


@pytest.fixture
async def service(tmp_path, author):
    repos = [Repo("intro", author.url), Repo("broken", "file:///nonexistent/tutorials.git")]
    svc = SyncService(Publisher(tmp_path / "share", tmp_path / "cache"), repos, 0.3, SECRET)
    port = free_port()
    server = make_app(svc).listen(port, address="127.0.0.1")
    svc.url = f"http://127.0.0.1:{port}"
    yield svc
    server.stop()


def push_payload(author: Author) -> bytes:
    return json.dumps(
        {"ref": "refs/heads/main", "repository": {"full_name": "x/y", "clone_url": author.url}}
    ).encode()


async def post_webhook(svc, body: bytes, signature: str | None, delivery="d-1", event="push"):
    headers = {webhook.DELIVERY_HEADER: delivery, webhook.EVENT_HEADER: event}
    if signature is not None:
        headers[webhook.SIGNATURE_HEADER] = signature
    return await AsyncHTTPClient().fetch(
        f"{svc.url}/webhook", method="POST", body=body, headers=headers, raise_error=False
    )


async def wait_for(condition, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.05)


async def test_a_signed_push_publishes_at_once(service, author):
    await service.sync_all("start")
    commit = author.git("rev-parse", "HEAD")
    assert service.status["intro"].commit == commit
    author.write("intro.ipynb", '{"v": 2}')
    new = author.commit_and_push("second")
    body = push_payload(author)
    r = await post_webhook(service, body, webhook.signature(SECRET, body))
    assert r.code == 202 and json.loads(r.body)["syncing"] == ["intro"]
    await wait_for(lambda: service.status["intro"].commit == new, timeout=5)

    again = await post_webhook(service, body, webhook.signature(SECRET, body))
    assert again.code == 200 and json.loads(again.body)["duplicate"] == "d-1"


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, "sha1=abc"])
async def test_unsigned_or_badly_signed_deliveries_are_refused(service, author, signature, caplog):
    body = push_payload(author)
    with caplog.at_level(logging.WARNING, "tutorial_sync"):
        r = await post_webhook(service, body, signature)
    assert r.code == 401
    assert "refused" in caplog.text
    assert service.status["intro"].syncs == 0


async def test_ping_is_answered(service):
    r = await post_webhook(service, b"{}", webhook.signature(SECRET, b"{}"), event="ping")
    assert r.code == 200


async def test_status_shows_each_repo_and_a_broken_one_does_not_stop_the_others(service, author):
    poller = asyncio.ensure_future(service.poll_forever())
    try:
        await wait_for(
            lambda: service.status["intro"].commit and service.status["broken"].last_error
        )
        author.write("more.ipynb", "{}")
        new = author.commit_and_push("polled")
        await wait_for(lambda: service.status["intro"].commit == new, timeout=0.3 + 2)
        r = await AsyncHTTPClient().fetch(f"{service.url}/status")
        status = {s["name"]: s for s in json.loads(r.body)["repos"]}
        assert status["intro"]["commit"] == new and status["intro"]["last_error"] == ""
        assert status["intro"]["last_sync"] > 0
        assert "does not appear to be a git repository" in status["broken"]["last_error"]
        assert status["broken"]["commit"] == ""
    finally:
        poller.cancel()


async def test_health(service):
    r = await AsyncHTTPClient().fetch(f"{service.url}/healthz")
    assert r.body == b"ok\n"
    with pytest.raises(HTTPClientError):
        await AsyncHTTPClient().fetch(f"{service.url}/nothing-here")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--root", "/s"], "no --repo given"),
        (["--root", "/s", "--repo", "a=x", "--repo", "a=y"], "share a NAME"),
        (["--root", "/s", "--repo", "oops"], "NAME=URL"),
        (["--root", "/s", "--repo", "a=x", "--interval", "0"], "must be positive"),
    ],
)
def test_bad_command_lines_say_what_to_fix(argv, says, capsys, monkeypatch):
    monkeypatch.delenv("GPUHUB_TUTORIAL_REPOS", raising=False)  # the fallback for --repo
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err
