"""Publishing tutorials from a real git remote onto a share, atomically."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tutorial_sync import versions
from tutorial_sync.publish import MANIFEST, Publisher, Repo, SyncError

from .gitrepos import Author, blob_id


@pytest.fixture
def author(tmp_path):
    a = Author(tmp_path)
    a.write("01-intro.ipynb", '{"cells": []}')
    a.write("data/small.csv", "x,y\n1,2\n")
    a.commit_and_push("first")
    return a


@pytest.fixture
def publisher(tmp_path):
    return Publisher(tmp_path / "share", tmp_path / "cache")


def published_files(share: Path, name: str) -> dict[str, str]:
    """{path: blob id} of the tree ``name`` points at, read from one resolved directory."""
    real = Path(os.path.realpath(share / name))
    return {
        str(p.relative_to(real)): blob_id(p.read_bytes())
        for p in real.rglob("*")
        if p.is_file() and p.name != MANIFEST
    }


def test_first_publish_makes_the_tree_and_its_manifest(author, publisher):
    repo = Repo("intro", author.url)
    assert publisher.sync(repo) is True
    share = publisher.root
    assert (share / "intro").is_symlink()
    assert not os.readlink(share / "intro").startswith("/"), "relative: resolves in containers"
    manifest = publisher.published("intro")
    assert manifest["commit"] == author.git("rev-parse", "HEAD")
    assert published_files(share, "intro") == manifest["files"]
    assert set(manifest["files"]) == {"01-intro.ipynb", "data/small.csv"}
    assert publisher.sync(repo) is False, "same commit: nothing to do"


def test_changed_new_deleted_and_renamed_files(author, publisher):
    repo = Repo("intro", author.url)
    publisher.sync(repo)
    author.write("01-intro.ipynb", '{"cells": [1]}')
    author.write("02-new.ipynb", "{}")
    (author.work / "data" / "small.csv").unlink()
    author.git("mv", "01-intro.ipynb", "00-start.ipynb")
    author.commit_and_push("second")
    assert publisher.sync(repo) is True
    files = published_files(publisher.root, "intro")
    assert set(files) == {"00-start.ipynb", "02-new.ipynb"}
    assert files["00-start.ipynb"] == blob_id(b'{"cells": [1]}')
    assert files == publisher.published("intro")["files"]


def test_force_push_replaces_history(author, publisher):
    repo = Repo("intro", author.url)
    author.write("mistake.txt", "oops")
    author.commit_and_push("a mistake")
    publisher.sync(repo)
    author.git("reset", "-q", "--hard", "HEAD~1")
    author.write("fixed.txt", "better")
    commit = author.commit_and_push("rewritten", force=True)
    assert publisher.sync(repo) is True
    assert publisher.published("intro")["commit"] == commit
    assert set(published_files(publisher.root, "intro")) == {
        "01-intro.ipynb",
        "data/small.csv",
        "fixed.txt",
    }


def test_binary_data_files_arrive_intact(author, publisher):
    data = os.urandom(3 * 1024 * 1024) + bytes(range(256)) * 1024
    author.write("data/weights.bin", data)
    author.commit_and_push("binary data")
    publisher.sync(Repo("intro", author.url))
    real = Path(os.path.realpath(publisher.root / "intro"))
    assert (real / "data" / "weights.bin").read_bytes() == data


@pytest.mark.parametrize(
    "url, branch, says",
    [
        ("file:///nonexistent/remote.git", "main", "does not appear to be a git repository"),
        (None, "no-such-branch", "couldn't find remote ref"),
    ],
)
def test_a_broken_remote_keeps_the_last_good_version(author, publisher, url, branch, says):
    publisher.sync(Repo("intro", author.url))
    good = publisher.published("intro")
    with pytest.raises(SyncError, match=says) as failed:
        publisher.sync(Repo("intro", url or author.url, branch))
    assert f"fetching branch '{branch}'" in str(failed.value)
    assert "\n" not in str(failed.value), "one line for the log and the status page"
    assert publisher.published("intro") == good


def test_readers_never_see_a_mix_of_two_versions(author, publisher):
    """A reader resolves the name once and reads manifest and files from that directory."""
    repo = Repo("intro", author.url)
    publisher.sync(repo)
    problems, reads, done = [], [0], threading.Event()

    def reader():
        while not done.is_set():
            try:
                real = Path(os.path.realpath(publisher.root / "intro"))
                manifest = json.loads((real / MANIFEST).read_text())
                seen = {
                    str(p.relative_to(real)): blob_id(p.read_bytes())
                    for p in real.rglob("*")
                    if p.is_file() and p.name != MANIFEST
                }
            except (OSError, ValueError) as e:  # a file vanished under the reader
                problems.append(repr(e))
                continue
            if seen != manifest["files"]:
                problems.append((manifest["commit"], sorted(set(seen) ^ set(manifest["files"]))))
            reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(12):
            for j in range(5):
                author.write(f"part-{i % 3}/{j}.txt", f"version {i}")
            if i % 2:
                author.git("rm", "-q", "-r", f"part-{(i + 1) % 3}", "--ignore-unmatch")
            author.commit_and_push(f"update {i}")
            publisher.sync(repo)
    finally:
        done.set()
        thread.join()
    assert reads[0] > 10
    assert problems == []


def test_superseded_versions_are_pruned_after_the_grace_period(author, tmp_path):
    publisher = Publisher(tmp_path / "share", tmp_path / "cache", keep_seconds=0)
    repo = Repo("intro", author.url)
    for i in range(4):
        author.write("n.txt", str(i))
        author.commit_and_push(f"c{i}")
        publisher.sync(repo)
    kept = sorted(p.name for p in (publisher.root / ".versions" / "intro").iterdir())
    assert len(kept) == 2, "the current version and the one before it"
    assert os.readlink(publisher.root / "intro").rsplit("/", 1)[-1] in kept


def test_which_versions_may_go():
    v = [versions.Version(name, t) for name, t in [("a", 0), ("b", 100), ("c", 200), ("d", 900)]]
    # at 1000 with a 600 s grace: a (superseded at 100) and b (at 200) may go; c was superseded
    # at 900 and is the newest previous version anyway; d is current
    assert versions.to_delete(v, "d", 1000, 600) == ["a", "b"]
    assert versions.to_delete(v, "d", 1000, 10_000) == []
    assert versions.to_delete(v[:1], "a", 1000, 0) == []


@pytest.mark.parametrize(
    "text, parsed",
    [
        (
            "intro=https://github.com/org/intro.git",
            Repo("intro", "https://github.com/org/intro.git"),
        ),
        ("gpu=file:///srv/gpu.git#2026", Repo("gpu", "file:///srv/gpu.git", "2026")),
    ],
)
def test_repo_settings_are_read(text, parsed):
    assert Repo.parse(text) == parsed


@pytest.mark.parametrize("text", ["intro", "=https://x", "a/b=https://x", ".hidden=https://x"])
def test_bad_repo_settings_say_how_to_write_them(text):
    with pytest.raises(ValueError, match="NAME=URL|plain directory name"):
        Repo.parse(text)
