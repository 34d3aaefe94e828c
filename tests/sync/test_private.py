"""A private tutorial repository: its token goes from GPUHUB_TUTORIAL_TOKEN_FILE to git at fetch
time, through the settings check, the sync service's command line and git's credential helper,
and to nothing else: not the status page, the manifest, the share, the git cache, the log."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient

from deploy import settings
from deploy.limits import Machine
from deploy.values import GIB
from tutorial_sync import MANIFEST, credentials
from tutorial_sync.publish import Publisher
from tutorial_sync.repos import format_repos
from tutorial_sync.service import SyncService, make_app, parse_args

from .private_remote import PrivateRemote
from .repo_entries import GHP

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")


@pytest.fixture
def remote(tmp_path):
    served = PrivateRemote(tmp_path / "github", "x-access-token", GHP)
    served.author.write("01-intro.ipynb", '{"cells": []}')
    served.author.commit_and_push("first")
    yield served
    served.close()


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "tutorial-token"
    path.write_text(text)
    path.chmod(mode)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def every_byte_under(*folders: Path) -> bytes:
    found = []
    for folder in folders:
        for top, _, files in os.walk(folder):
            for name in files:
                path = Path(top, name)
                if not path.is_symlink():
                    found.append(path.read_bytes())
    return b"\n".join(found)


async def served_status(tmp_path, remote, token_text: str | None):
    """The checked settings handed on to the sync service as the stack does, one sync, and the
    status page's JSON."""
    environ = {
        "GPUHUB_CONFIG": "none",
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_TUTORIAL_REPOS": f"private={remote.url}/",
    }
    if token_text is not None:
        environ["GPUHUB_TUTORIAL_TOKEN_FILE"] = str(token_file(tmp_path, token_text))
    checked = settings.read("demo", environ, machine=Machine(4, 16 * GIB, 0))
    service_env = {"GPUHUB_TUTORIAL_REPOS": format_repos(checked.tutorial_repos)}
    if checked.tutorial_token_file:  # the Docker secret's path in the service's container
        service_env["GPUHUB_TUTORIAL_TOKEN_FILE"] = checked.tutorial_token_file
    args = parse_args(["--root", str(tmp_path / "share")], environ=service_env)
    git_env = credentials.git_environment(args.token_file, args.hosts)
    git_env["GIT_SSL_CAINFO"] = str(remote.cert)  # the test's certificate authority
    publisher = Publisher(tmp_path / "share", tmp_path / "cache", git_env=git_env)
    service = SyncService(publisher, args.repos, 30.0, "")
    port = free_port()
    server = make_app(service).listen(port, address="127.0.0.1")
    try:
        started = time.monotonic()
        await service.sync_all("start")
        took = time.monotonic() - started
        r = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/status")
    finally:
        server.stop()
    return json.loads(r.body)["repos"][0], r.body, took


async def test_the_token_reaches_git_and_nothing_else(tmp_path, remote, caplog):
    caplog.set_level(logging.DEBUG)
    status, page, _ = await served_status(tmp_path, remote, f"{GHP}\n")
    commit = remote.author.git("rev-parse", "HEAD")
    assert status["commit"] == commit and status["last_error"] == ""
    assert status["url"] == remote.url  # as read: the trailing slash gone, no credential
    manifest = json.loads((tmp_path / "share" / "private" / MANIFEST).read_text())
    assert manifest["url"] == remote.url and manifest["commit"] == commit
    assert (tmp_path / "share" / "private" / "01-intro.ipynb").is_file()
    # git used it, in a header only
    assert any(auth for _, auth in remote.requests)
    assert not [path for path, _ in remote.requests if GHP in path or "@" in path]
    # and nothing kept it: page, share, cache, log
    assert GHP.encode() not in page
    assert GHP.encode() not in every_byte_under(tmp_path / "share", tmp_path / "cache")
    assert GHP not in caplog.text


async def test_without_a_token_it_fails_at_once_with_gits_reason(tmp_path, remote):
    status, page, took = await served_status(tmp_path, remote, None)
    assert status["commit"] == ""
    assert "terminal prompts disabled" in status["last_error"]
    assert "GPUHUB_TUTORIAL_TOKEN_FILE" in status["last_error"]
    assert took < 20, "git waited for a password nobody types"


async def test_a_wrong_token_is_refused_and_not_shown(tmp_path, remote):
    wrong = "ghp_TestOnlyWrongToken000000000000000000"
    status, page, _ = await served_status(tmp_path, remote, f"{wrong}\n")
    assert status["commit"] == ""
    assert "Authentication failed" in status["last_error"]
    assert wrong.encode() not in page and GHP.encode() not in page


async def test_a_token_for_another_host_is_never_sent_here(tmp_path, remote):
    status, _, _ = await served_status(
        tmp_path, remote, f"https://x-access-token:{GHP}@git.other.example\n"
    )
    assert status["commit"] == ""
    assert remote.requests and not [auth for _, auth in remote.requests if auth]
