"""Publishing tutorials from a real git remote onto a share, atomically."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from tutorial_sync import publish, versions
from tutorial_sync.publish import FORMAT, MANIFEST, Publisher, Repo, SyncError

from .gitrepos import (
    INSIDE,
    SECRET,
    SKIPPED,
    Author,
    add_every_kind_of_link,
    blob_id,
    every_entry,
    make_outside,
)


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


def between_every_step(module, check):
    """Run ``check()`` before each line ``module``'s code executes (sys.settrace, this thread),
    so a reader looks at the share at every moment between the publisher's steps: not at
    moments a reader thread happens to sample. A reader elsewhere sees no other states."""

    def calls(frame, event, arg):
        return lines if frame.f_code.co_filename == module.__file__ else None

    def lines(frame, event, arg):
        if event == "line":
            check()
        return lines

    return calls


def test_readers_never_see_a_mix_of_two_versions(author, publisher):
    """A reader resolves the name once and reads manifest and files from that directory; at
    every step of every publish it finds one whole version (deterministic: the reader runs
    between the publisher's steps, ``between_every_step``)."""
    repo = Repo("intro", author.url)
    publisher.sync(repo)
    problems, reads = [], [0]

    def reader():
        try:
            real = Path(os.path.realpath(publisher.root / "intro"))
            manifest = json.loads((real / MANIFEST).read_text())
            seen = {
                str(p.relative_to(real)): blob_id(p.read_bytes())
                for p in real.rglob("*")
                if p.is_file() and p.name != MANIFEST
            }
        except (OSError, ValueError) as e:  # the name or a file missing at that moment
            problems.append(repr(e))
            return
        if seen != manifest["files"]:
            problems.append((manifest["commit"], sorted(set(seen) ^ set(manifest["files"]))))
        reads[0] += 1

    for i in range(4):
        for j in range(5):
            author.write(f"part-{i % 3}/{j}.txt", f"version {i}")
        if i % 2:
            author.git("rm", "-q", "-r", f"part-{(i + 1) % 3}", "--ignore-unmatch")
        author.commit_and_push(f"update {i}")
        tracer = sys.gettrace()
        sys.settrace(between_every_step(publish, reader))
        try:
            publisher.sync(repo)
        finally:
            sys.settrace(tracer)
    assert reads[0] > 100  # every step of four publishes
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
        (
            "hook=git://10.0.0.1:9418/gpu.git#main:webhook",
            Repo("hook", "git://10.0.0.1:9418/gpu.git", "main", poll=False),
        ),
        ("hook=https://x/y.git#:webhook", Repo("hook", "https://x/y.git", poll=False)),
    ],
)
def test_repo_settings_are_read(text, parsed):
    assert Repo.parse(text) == parsed


@pytest.mark.parametrize(
    "text",
    ["intro", "=https://x", "a/b=https://x", ".hidden=https://x", "a=https://x#main:webhok"],
)
def test_bad_repo_settings_say_how_to_write_them(text):
    with pytest.raises(ValueError, match="NAME=URL|no NAME|plain folder name|only :webhook"):
        Repo.parse(text)


# ---- symbolic links in a repository ----------------------------------------------------------


@pytest.fixture(params=["data filter", "own filter only"])
def tar_filter(request, monkeypatch):
    """Each test twice: with tarfile's "data" filter, and as on Pythons without it (3.9 to
    3.11.3), where the project's own regular_members is all that stands."""
    if request.param == "data filter" and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile data filter")
    if request.param == "own filter only":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


@pytest.fixture
def outside(tmp_path):
    return make_outside(tmp_path)


def test_links_inside_are_published_as_copies_and_no_link_is_followed(
    tmp_path, outside, tar_filter
):
    (tmp_path / "repo").mkdir()
    author = Author(tmp_path / "repo")
    add_every_kind_of_link(author, outside)
    author.commit_and_push("links of every kind")
    publisher = Publisher(tmp_path / "share", tmp_path / "cache")
    assert publisher.sync(Repo("linked", author.url)) is True

    manifest = publisher.published("linked")
    assert manifest["files"] == {
        path: blob_id((author.work / source).read_bytes()) for path, source in INSIDE.items()
    }
    assert set(manifest["skipped"]) == set(SKIPPED)
    for path, says in SKIPPED.items():
        assert says in manifest["skipped"][path], path

    versions = publisher.root / ".versions"
    entries = every_entry(versions)
    links = [p for p, st in entries.items() if stat.S_ISLNK(st.st_mode)]
    assert links == [], "the share holds regular files and folders only"
    real = Path(os.path.realpath(publisher.root / "linked"))
    assert published_files(publisher.root, "linked") == manifest["files"]
    assert (real / "alias.ipynb").read_text() == '{"cells": ["one"]}'
    assert (real / "notebooks" / "data" / "sub" / "deep.csv").read_text() == "deep\n"
    for st in entries.values():
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
    contents = [p.read_bytes() for p in versions.rglob("*") if p.is_file()]
    assert not [c for c in contents if SECRET.encode() in c or c.startswith(b"root:")]
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], "nothing written there"


def test_a_version_published_before_links_were_copied_is_published_again(tmp_path, outside):
    (tmp_path / "repo").mkdir()
    author = Author(tmp_path / "repo")
    add_every_kind_of_link(author, outside)
    author.commit_and_push("links")
    publisher = Publisher(tmp_path / "share", tmp_path / "cache")
    repo = Repo("linked", author.url)
    publisher.sync(repo)
    manifest_file = publisher.root / "linked" / MANIFEST
    old = json.loads(manifest_file.read_text())
    del old["format"]  # as the previous publisher wrote it (its versions held the links)
    manifest_file.write_text(json.dumps(old))
    assert publisher.sync(repo) is True, "same commit, older layout: published again"
    assert publisher.published("linked")["format"] == FORMAT
    assert publisher.sync(repo) is False


def git_with_input(author: Author, args: list[str], text: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=author.work, input=text, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_tree_entry_that_would_land_outside_is_refused(author, publisher):
    """A hand-made tree holding a ``..`` folder (git fsck warns; a push accepts it)."""
    repo = Repo("intro", author.url)
    publisher.sync(repo)
    good = publisher.published("intro")
    blob = git_with_input(author, ["hash-object", "-w", "--stdin"], "escaped\n")
    inner = git_with_input(author, ["mktree"], f"100644 blob {blob}\tescaped.txt\n")
    top = git_with_input(
        author, ["mktree"], f"040000 tree {inner}\t..\n100644 blob {blob}\tok.txt\n"
    )
    commit = git_with_input(author, ["commit-tree", "-m", "hostile", top], "")
    author.git("push", "-q", "--force", "origin", f"{commit}:refs/heads/main")
    with pytest.raises(SyncError, match="'../escaped.txt' from the repository: it would land"):
        publisher.sync(repo)
    assert publisher.published("intro") == good
    assert not (publisher.root / ".versions" / "escaped.txt").exists()
    assert not (publisher.root / "escaped.txt").exists()


def test_a_refused_archive_member_stops_git_instead_of_hanging(author, publisher, monkeypatch):
    """git archive blocks writing into a full pipe when extraction stops early: it is stopped."""
    author.write("data/big.bin", os.urandom(4 * 1024 * 1024))
    author.commit_and_push("bigger than a pipe")

    def refuse_all(archive):
        raise SyncError("refused by the test")
        yield  # a generator, as regular_members is

    monkeypatch.setattr(publish, "regular_members", refuse_all)
    outcome = []

    def run():
        try:
            publisher.sync(Repo("intro", author.url))
        except SyncError as e:
            outcome.append(str(e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome == ["refused by the test"], "publish hung on git archive, or did not refuse"
    assert list((publisher.root / ".versions" / "intro").iterdir()) == [], "temporary removed"


# ---- the archive filter, against hand-made tar archives -----------------------------------------


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    buffer.seek(0)
    return buffer


def member(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


@pytest.mark.parametrize(
    "name", ["{tmp}/up.txt", "../up.txt", "a/../../up.txt", "./../up.txt", "a/b/../../../up.txt"]
)
def test_the_filter_refuses_names_outside_the_target(tmp_path, tar_filter, name):
    target = tmp_path / "target"
    target.mkdir()
    archive = tar_of((member("ok.txt"), b"ok"), (member(name.format(tmp=tmp_path)), b"escaped"))
    with pytest.raises(SyncError, match="would land outside it"):
        publish.extract_regular(archive, target)
    assert not (tmp_path / "up.txt").exists()


def test_the_filter_never_writes_links_nor_through_them(tmp_path, outside, tar_filter):
    """The classic attacks on tar extraction: a link leading out, then a file written "into" it;
    hard links to files outside; devices and fifos."""
    target = tmp_path / "target"
    target.mkdir()
    archive = tar_of(
        (member("ok.txt"), b"ok"),
        (member("abs", tarfile.SYMTYPE, str(outside)), b""),
        (member("abs/planted.txt"), b"planted"),
        (member("rel", tarfile.SYMTYPE, "../outside"), b""),
        (member("rel/planted.txt"), b"planted"),
        (member("inside", tarfile.SYMTYPE, "ok.txt"), b""),
        (member("hard", tarfile.LNKTYPE, str(outside / "secret.txt")), b""),
        (member("hard-rel", tarfile.LNKTYPE, "../outside/secret.txt"), b""),
        (member("fifo", tarfile.FIFOTYPE), b""),
        (member("device", tarfile.CHRTYPE), b""),
        (member("folder", tarfile.DIRTYPE), b""),
        (member("folder/last.txt"), b"last"),
    )
    publish.extract_regular(archive, target)
    entries = every_entry(target)
    assert sorted(entries) == [
        "abs",
        "abs/planted.txt",
        "folder",
        "folder/last.txt",
        "ok.txt",
        "rel",
        "rel/planted.txt",
    ]
    assert all(stat.S_ISREG(s.st_mode) or stat.S_ISDIR(s.st_mode) for s in entries.values())
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").stat().st_nlink == 1, "no hard link made to it"
    assert (target / "abs" / "planted.txt").read_text() == "planted", "a folder of the target"
