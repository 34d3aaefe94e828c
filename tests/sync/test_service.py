"""The sync service over HTTP on loopback: webhook, status, polling; real git remotes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from pathlib import Path
from urllib.parse import quote_plus

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from tutorial_sync import webhook
from tutorial_sync.publish import Publisher, Repo, SyncError
from tutorial_sync.service import SyncService, make_app, parse_args

from .gitrepos import Author

SECRET = "workshop-webhook-secret"
JSON = "application/json"  # a webhook's Content-Type when its "Content type" is JSON


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


@contextlib.contextmanager
def serving(tmp_path, repos, interval):
    """A sync service of ``repos`` answering on a port of 127.0.0.1 (``svc.url``)."""
    svc = SyncService(Publisher(tmp_path / "share", tmp_path / "cache"), repos, interval, SECRET)
    port = free_port()
    server = make_app(svc).listen(port, address="127.0.0.1")
    svc.url = f"http://127.0.0.1:{port}"
    yield svc
    server.stop()


@pytest.fixture
async def service(tmp_path, author):
    repos = [Repo("intro", author.url), Repo("broken", "file:///nonexistent/tutorials.git")]
    with serving(tmp_path, repos, 0.3) as svc:
        yield svc


def push_payload(author: Author) -> bytes:
    return json.dumps(
        {"ref": "refs/heads/main", "repository": {"full_name": "x/y", "clone_url": author.url}}
    ).encode()


async def post_webhook(
    svc, body: bytes, signature: str | None, delivery="d-1", event="push", content_type=JSON
):
    headers = {
        webhook.DELIVERY_HEADER: delivery,
        webhook.EVENT_HEADER: event,
        "Content-Type": content_type,
    }
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
    assert r.code == 200 and json.loads(r.body)["synced"] == ["intro"]
    assert service.status["intro"].commit == new, "published before the answer"

    again = await post_webhook(service, body, webhook.signature(SECRET, body))
    assert again.code == 200 and json.loads(again.body)["duplicate"] == "d-1"


def count_syncs_started(service, monkeypatch) -> list[str]:
    """The names of the repositories whose sync the service starts from now on."""
    started, sync = [], service.sync

    def counted(repo, reason):
        started.append(repo.name)
        return sync(repo, reason)

    monkeypatch.setattr(service, "sync", counted)
    return started


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, "sha1=abc"])
async def test_unsigned_or_badly_signed_deliveries_are_refused(
    service, author, signature, caplog, monkeypatch
):
    started = count_syncs_started(service, monkeypatch)
    body = push_payload(author)
    with caplog.at_level(logging.WARNING, "tutorial_sync"):
        r = await post_webhook(service, body, signature)
    assert r.code == 401
    assert "refused" in caplog.text
    assert started == [], "no sync was started (a webhook sync starts before the answer)"
    # the same delivery, signed: in this very setup a sync starts, and is counted
    r = await post_webhook(service, body, webhook.signature(SECRET, body))
    assert r.code == 200 and started == ["intro"]
    assert service.status["intro"].syncs == 1


# ---- GitHub's pings: ok only for a webhook whose pushes will work here ---------------------------

FIXTURES = Path(__file__).parent.parent / "fixtures" / "github"


def delivery(name: str, edit=None, **headers) -> tuple[bytes, dict]:
    """A recorded delivery as GitHub sends it: the body (JSON, or ``payload=<JSON>`` when the
    webhook is form-encoded) signed with the secret, and its headers (``headers`` replaces
    some). ``edit`` changes the payload first."""
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())
    payload = recorded["payload"]
    if edit:
        edit(payload)
    sent = {**recorded["headers"], **headers}
    text = json.dumps(payload)
    if webhook.is_form(sent["Content-Type"]):
        text = "payload=" + quote_plus(text)
    body = text.encode()
    return body, {**sent, webhook.SIGNATURE_HEADER: webhook.signature(SECRET, body)}


async def send(svc, body: bytes, headers: dict):
    return await AsyncHTTPClient().fetch(
        f"{svc.url}/webhook", method="POST", body=body, headers=headers, raise_error=False
    )


async def webhook_status(svc) -> list[dict]:
    r = await AsyncHTTPClient().fetch(f"{svc.url}/status")
    return json.loads(r.body)["webhook_deliveries"]


@pytest.fixture
async def github_service(tmp_path):
    """A service publishing two of gpu-school's repositories (never synced here)."""
    repos = [
        Repo("intro", "https://github.com/gpu-school/intro.git"),
        Repo("advanced", "https://github.com/gpu-school/advanced", poll=False),
    ]
    with serving(tmp_path, repos, 30) as svc:
        yield svc


@pytest.mark.parametrize("name", ["webhook_ping_json", "webhook_ping_organization"])
async def test_a_ping_of_a_webhook_set_up_right_is_ok(github_service, name):
    r = await send(github_service, *delivery(name))
    assert r.code == 200 and json.loads(r.body) == {"ok": True, "event": "ping"}
    [shown] = await webhook_status(github_service)
    assert shown["event"] == "ping" and shown["code"] == 200


def other_org(payload):
    payload["organization"]["login"] = "elsewhere"


@pytest.mark.parametrize(
    "name, edit, code, says",
    [
        ("webhook_ping_form", None, 415, "set Content type to application/json and save"),
        (
            "webhook_ping_other_repository",
            None,
            422,
            "no tutorial uses the repository gpu-school/homework; this service publishes "
            "github.com/gpu-school/advanced, github.com/gpu-school/intro",
        ),
        ("webhook_ping_no_push", None, 422, "sends issues events but no push events"),
        (
            "webhook_ping_organization",
            other_org,
            422,
            "no tutorial repository is in the organization elsewhere",
        ),
    ],
)
async def test_a_ping_of_a_webhook_whose_pushes_would_fail_says_what_to_change(
    github_service, name, edit, code, says
):
    r = await send(github_service, *delivery(name, edit))
    assert r.code == code, r.body
    assert says in json.loads(r.body)["error"]  # what GitHub shows under Recent Deliveries
    [shown] = await webhook_status(github_service)
    assert shown["code"] == code and says in shown["answer"]
    assert shown["delivery"] == "6cbe20b0-19d6-11ef-8f59-32629cd4200a"


async def test_a_form_encoded_push_is_refused_with_what_to_change(github_service):
    form = "application/x-www-form-urlencoded"
    r = await send(github_service, *delivery("webhook_push", **{"Content-Type": form}))
    assert r.code == 415 and "set Content type to application/json" in json.loads(r.body)["error"]


# ---- a push is answered once synced: a failed sync is not taken as handled ----------------------


async def test_a_push_whose_sync_failed_is_answered_502_and_its_redelivery_syncs(
    service, author, monkeypatch
):
    real, calls = service.publisher.sync, []

    def fails_once(repo):
        calls.append(repo.name)
        if len(calls) == 1:
            raise SyncError(
                "fetching branch 'main' of https://x-access-token:ghp_0123456789@github.com/o/r"
                ".git failed: fatal: unable to access: Could not resolve host: github.com"
            )
        return real(repo)

    monkeypatch.setattr(service.publisher, "sync", fails_once)
    body = push_payload(author)
    first = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-f")
    assert first.code == 502, first.body
    error = json.loads(first.body)["error"]
    assert "Could not resolve host" in error and "Redeliver" in error
    assert "ghp_0123456789" not in error, "no token in what GitHub shows"
    assert not service.deliveries.seen("d-f")
    assert (await webhook_status(service))[0]["code"] == 502

    again = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-f")
    assert again.code == 200 and json.loads(again.body)["synced"] == ["intro"]
    assert calls == ["intro", "intro"]
    assert service.status["intro"].commit == author.git("rev-parse", "HEAD")
    third = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-f")
    assert json.loads(third.body) == {"ok": True, "duplicate": "d-f"}


async def test_a_push_git_could_not_fetch_is_not_handled_until_a_redelivery_publishes_it(
    service, author
):
    """git itself fails, not a stand-in: the repository is away from its remote when GitHub's
    push arrives (renamed on the server), then back; Redeliver of that delivery publishes."""
    author.write("intro.ipynb", '{"cells": ["second"]}')
    author.commit_and_push("second")
    away = author.remote.with_name("moved.git")
    author.remote.rename(away)
    body = push_payload(author)
    first = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-away")
    assert first.code == 502, first.body
    assert "remote.git" in json.loads(first.body)["error"]  # git's words: what could not be read
    assert "Redeliver" in json.loads(first.body)["error"]
    assert not service.deliveries.seen("d-away") and service.status["intro"].commit == ""
    [shown] = await webhook_status(service)
    assert shown["delivery"] == "d-away" and shown["code"] == 502

    away.rename(author.remote)
    again = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-away")
    assert again.code == 200 and json.loads(again.body)["synced"] == ["intro"], again.body
    assert service.status["intro"].commit == author.git("rev-parse", "HEAD")
    assert (service.publisher.root / "intro" / "intro.ipynb").read_text() == '{"cells": ["second"]}'


async def test_a_sync_slower_than_githubs_patience_is_answered_202_and_a_failure_stays_open(
    service, author, monkeypatch
):
    service.webhook_wait = 0.2
    real = service.publisher.sync

    def slow_failure(repo):
        time.sleep(0.6)
        raise SyncError("the remote end hung up unexpectedly")

    monkeypatch.setattr(service.publisher, "sync", slow_failure)
    body = push_payload(author)
    r = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-slow")
    assert r.code == 202 and "Redeliver" in json.loads(r.body)["note"]
    await wait_for(lambda: not service._tasks)  # the sync, and what follows it, ended
    assert "hung up" in service.status["intro"].last_error
    assert not service.deliveries.seen("d-slow"), "failed: left for Redeliver"

    monkeypatch.setattr(service.publisher, "sync", real)
    # GitHub's patience again: the real sync may take longer than 0.2 s on a busy machine, and
    # the redelivery's answer is what is checked here, not the wait (it was answered 202)
    service.webhook_wait = 30
    again = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-slow")
    assert again.code == 200 and service.deliveries.seen("d-slow")


async def test_a_push_no_tutorial_publishes_is_handled_and_says_so(service, author):
    payload = json.loads(push_payload(author))
    body = json.dumps({**payload, "ref": "refs/heads/other"}).encode()
    r = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-o")
    assert r.code == 200 and "no tutorial publishes branch 'other'" in json.loads(r.body)["ignored"]
    assert service.deliveries.seen("d-o")


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
        (["--root", "/s", "--repo", "a=file:///x", "--repo", "a=file:///y"], "given twice"),
        (["--root", "/s", "--repo", "oops"], "NAME=URL"),
        (["--root", "/s", "--repo", "a=file:///x", "--interval", "0"], "must be positive"),
    ],
)
def test_bad_command_lines_say_what_to_fix(argv, says, capsys, monkeypatch):
    monkeypatch.delenv("GPUHUB_TUTORIAL_REPOS", raising=False)  # the fallback for --repo
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err


# ---- bodies of an unexpected shape, redeliveries, the size cap -----------------------------------

ODD_BODIES = {
    "an array": b"[]",
    "repository as a string": b'{"ref": "refs/heads/main", "repository": "x/y"}',
    "no ref": b'{"repository": {"full_name": "x/y"}}',
    "no repository": b'{"ref": "refs/heads/main"}',
    "an empty object": b"{}",
    "not JSON": b"payload=%7B%7D",
    "not UTF-8": b'{"ref": "\xff"}',
    "nested too deeply": b"[" * 100_000,
}


@pytest.mark.parametrize("body", ODD_BODIES.values(), ids=ODD_BODIES.keys())
async def test_a_malformed_push_is_refused_and_its_redelivery_handled(
    service, author, body, caplog
):
    with caplog.at_level(logging.WARNING, "tutorial_sync"):
        r = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="odd")
    assert r.code == 400, r.body
    reason = json.loads(r.body)["error"]
    assert reason == webhook_reason(body) and reason in caplog.text
    assert service.status["intro"].commit == ""
    # GitHub's redelivery of the same delivery id (here with the body fixed) is handled
    good = push_payload(author)
    again = await post_webhook(service, good, webhook.signature(SECRET, good), delivery="odd")
    assert again.code == 200 and json.loads(again.body)["synced"] == ["intro"]
    assert service.status["intro"].commit == author.git("rev-parse", "HEAD")


def webhook_reason(body: bytes) -> str:
    with pytest.raises(webhook.Malformed) as malformed:
        webhook.parse_push(body)
    return str(malformed.value)


async def test_a_delivery_that_failed_is_handled_when_redelivered(service, author, monkeypatch):
    real, calls = service.repos_for_push, []

    def fails_once(push):
        calls.append(push)
        if len(calls) == 1:
            raise RuntimeError("a passing failure")
        return real(push)

    monkeypatch.setattr(service, "repos_for_push", fails_once)
    body = push_payload(author)
    first = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-9")
    assert first.code == 500
    again = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-9")
    assert again.code == 200, "not answered as a duplicate: it was never handled"
    assert service.status["intro"].commit == author.git("rev-parse", "HEAD")
    third = await post_webhook(service, body, webhook.signature(SECRET, body), delivery="d-9")
    assert json.loads(third.body) == {"ok": True, "duplicate": "d-9"}


def count_hmacs(monkeypatch) -> list[int]:
    """Count the HMACs the service computes (webhook.signature, which the check calls)."""
    counted, signature = [], webhook.signature

    def counting(secret, body):
        counted.append(len(body))
        return signature(secret, body)

    monkeypatch.setattr(webhook, "signature", counting)
    return counted


async def raw_post(svc, head: dict[str, str], parts=()) -> tuple[int, dict]:
    """POST /webhook over a plain socket: ``head`` as headers, then ``parts`` of the body as
    they are (nothing more, so a body can be left unfinished); the status and JSON answer."""
    port = int(svc.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = ["POST /webhook HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in head.items())]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    for part in parts:
        writer.write(part)
        await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)  # the server closes the connection
    writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(body)


def signed_headers(body: bytes, delivery: str) -> dict[str, str]:
    return {
        webhook.SIGNATURE_HEADER: webhook.signature(SECRET, body),
        webhook.DELIVERY_HEADER: delivery,
        webhook.EVENT_HEADER: "push",
        "Content-Type": JSON,
    }


async def test_a_body_above_githubs_cap_is_refused_before_any_hmac(service, author, monkeypatch):
    small = push_payload(author)
    headers = signed_headers(small, "big-1")
    hmacs = count_hmacs(monkeypatch)
    # the same request with a small body: its HMAC is computed (the counter works)
    code, _ = await raw_post(
        service, {**headers, "Content-Length": str(len(small)), "Connection": "close"}, [small]
    )
    assert code == 200 and hmacs == [len(small)]
    hmacs.clear()
    # declared above the cap: refused from the headers, the body never read
    code, answer = await raw_post(
        service, {**headers, "Content-Length": str(webhook.MAX_PAYLOAD + 1)}
    )
    assert code == 413 and "larger than GitHub's" in answer["error"]
    assert hmacs == []


async def test_a_chunked_body_is_cut_off_at_the_cap_before_any_hmac(service, author, monkeypatch):
    """No Content-Length: the body is counted while it arrives, and refused as soon as it passes
    the cap (the client here never ends it: waiting for its end would never answer). Tornado
    hands a chunk's data over in 64 KiB pieces, so the cap is passed by one such piece: all of
    it is read before the server closes (closing on unread data would reset the connection)."""
    headers = signed_headers(b"", "big-2")
    hmacs = count_hmacs(monkeypatch)
    size = webhook.MAX_PAYLOAD + 64 * 1024
    piece = b" " * (1024 * 1024)
    parts = [f"{size:x}\r\n".encode()] + [piece] * (size // len(piece))
    parts.append(b" " * (size % len(piece)))
    code, answer = await raw_post(service, {**headers, "Transfer-Encoding": "chunked"}, parts)
    assert code == 413 and "larger than GitHub's" in answer["error"]
    assert hmacs == []


async def test_a_webhook_only_repository_is_synced_at_start_and_on_pushes_never_polled(
    tmp_path, author
):
    repos = [Repo("polled", author.url), Repo("hooked", author.url, poll=False)]
    svc = SyncService(Publisher(tmp_path / "share", tmp_path / "cache"), repos, 0.2, SECRET)
    port = free_port()
    server = make_app(svc).listen(port, address="127.0.0.1")
    svc.url = f"http://127.0.0.1:{port}"
    poller = asyncio.ensure_future(svc.poll_forever())
    try:
        first = author.git("rev-parse", "HEAD")
        await wait_for(lambda: svc.status["hooked"].commit == first, timeout=5)
        assert svc.status["hooked"].polled is False and svc.status["polled"].polled is True
        author.write("more.ipynb", "{}")
        new = author.commit_and_push("second")
        await wait_for(lambda: svc.status["polled"].commit == new, timeout=5)
        await asyncio.sleep(3 * 0.2)  # three more polls
        assert svc.status["hooked"].commit == first, "polled, though webhook only"
        body = push_payload(author)
        r = await post_webhook(svc, body, webhook.signature(SECRET, body))
        assert sorted(json.loads(r.body)["synced"]) == ["hooked", "polled"]
        assert svc.status["hooked"].commit == new
    finally:
        poller.cancel()
        server.stop()
