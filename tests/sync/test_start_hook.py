"""The start hook against a real published share: copy, follow upstream, never lose edits."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tutorial_sync import MANIFEST, start_hook
from tutorial_sync.publish import Publisher, Repo

from .gitrepos import (
    INSIDE,
    SECRET,
    SKIPPED,
    Author,
    add_every_kind_of_link,
    every_entry,
    make_outside,
)


@pytest.fixture
def env(tmp_path):
    author = Author(tmp_path)
    author.write("01-intro.ipynb", '{"v": 1}')
    author.write("02-train.ipynb", '{"v": 1}')
    author.write("data/table.csv", "a,b\n")
    author.commit_and_push("first")
    publisher = Publisher(tmp_path / "share", tmp_path / "cache")
    repo = Repo("gpu101", author.url)
    publisher.sync(repo)

    def publish(message):
        author.commit_and_push(message)
        publisher.sync(repo)

    home = tmp_path / "home" / "tutorials"
    state = tmp_path / "home" / ".local" / "tutorials.json"
    run = lambda *args: start_hook.main(  # noqa: E731
        ["--share", str(publisher.root), "--home", str(home), "--state", str(state), *args]
    )
    return author, publish, home, run


def test_first_start_copies_and_a_second_changes_nothing(env, capsys):
    author, publish, home, run = env
    assert run() == 0
    assert (home / "gpu101" / "01-intro.ipynb").read_text() == '{"v": 1}'
    assert (home / "gpu101" / "data" / "table.csv").exists()
    assert "3 copy" in capsys.readouterr().out
    run()
    assert "3 keep" in capsys.readouterr().out


def test_edits_are_never_lost_and_new_versions_come_beside_them(env, capsys):
    author, publish, home, run = env
    run()
    mine = home / "gpu101" / "01-intro.ipynb"
    mine.write_text('{"v": "my answer"}')
    author.write("01-intro.ipynb", '{"v": 2}')
    author.write("02-train.ipynb", '{"v": 2}')
    author.write("03-new.ipynb", "{}")
    (author.work / "data" / "table.csv").unlink()
    publish("second")
    run()
    assert mine.read_text() == '{"v": "my answer"}', "the participant's edit stays"
    beside = list((home / "gpu101").glob("01-intro.new-*.ipynb"))
    assert len(beside) == 1 and beside[0].read_text() == '{"v": 2}'
    assert (home / "gpu101" / "02-train.ipynb").read_text() == '{"v": 2}', "unmodified: updated"
    assert (home / "gpu101" / "03-new.ipynb").exists()
    assert not (home / "gpu101" / "data" / "table.csv").exists(), "unmodified, deleted upstream"
    notice = (home / start_hook.NOTICE).read_text()
    assert "gpu101/01-intro.ipynb" in notice and beside[0].name in notice

    # reset: the pristine version comes back, the participant's is kept beside it
    capsys.readouterr()
    assert run("--reset", "gpu101/01-intro.ipynb") == 0
    assert mine.read_text() == '{"v": 2}'
    (kept,) = (home / "gpu101").glob("01-intro.mine-*.ipynb")
    assert kept.read_text() == '{"v": "my answer"}'
    assert "restored 1 file(s)" in capsys.readouterr().out
    assert run("--reset", "gpu101/nope.ipynb") == 1


def test_a_deleted_copy_stays_deleted_until_upstream_changes_it(env):
    author, publish, home, run = env
    run()
    (home / "gpu101" / "02-train.ipynb").unlink()
    run()
    assert not (home / "gpu101" / "02-train.ipynb").exists()
    author.write("02-train.ipynb", '{"v": 3}')
    publish("third")
    run()
    assert (home / "gpu101" / "02-train.ipynb").read_text() == '{"v": 3}'


def test_no_share_is_not_an_error(tmp_path, capsys):
    code = start_hook.main(
        ["--share", str(tmp_path / "none"), "--home", str(tmp_path / "h")]
        + ["--state", str(tmp_path / "state.json")]
    )
    assert code == 0 and "none published" in capsys.readouterr().out


def test_a_folder_or_link_of_the_participant_at_a_tutorial_path_is_left_alone(env, capsys):
    author, publish, home, run = env
    run()
    intro, train = home / "gpu101" / "01-intro.ipynb", home / "gpu101" / "02-train.ipynb"
    intro.unlink()
    intro.mkdir()
    (intro / "notes.md").write_text("mine")
    train.unlink()
    train.symlink_to("/etc/passwd")
    author.write("01-intro.ipynb", '{"v": 2}')
    author.write("02-train.ipynb", '{"v": 2}')
    publish("second")
    capsys.readouterr()
    assert run() == 0
    assert (intro / "notes.md").read_text() == "mine"
    assert os.readlink(train) == "/etc/passwd"
    assert "2 beside" in capsys.readouterr().out
    assert len(list((home / "gpu101").glob("0*.new-*.ipynb"))) == 2


def test_a_file_of_the_participant_where_a_folder_goes_is_moved_aside_not_lost(env, capsys):
    author, publish, home, run = env
    (home / "gpu101").mkdir(parents=True)
    (home / "gpu101" / "data").write_text("mine: a file where the tutorials have a folder")
    assert run() == 0
    assert "3 copy" in capsys.readouterr().out
    assert (home / "gpu101" / "data" / "table.csv").read_text() == "a,b\n"
    (aside,) = (home / "gpu101").glob("data.mine-*")
    assert aside.read_text() == "mine: a file where the tutorials have a folder"
    notice = (home / start_hook.NOTICE).read_text()
    assert f"`gpu101/data` is now `gpu101/{aside.name}`" in notice
    run()
    assert "3 keep" in capsys.readouterr().out


# ---- symbolic links ------------------------------------------------------------------------------


@pytest.fixture
def linked(tmp_path):
    """A repository with links of every kind (tests/sync/gitrepos.py), and a hook to run."""
    outside = make_outside(tmp_path)
    (tmp_path / "repo").mkdir()
    author = Author(tmp_path / "repo")
    add_every_kind_of_link(author, outside)
    author.commit_and_push("links of every kind")
    share, home = tmp_path / "share", tmp_path / "home" / "tutorials"
    state = tmp_path / "home" / ".local" / "tutorials.json"

    def run():
        args = ["--share", str(share), "--home", str(home), "--state", str(state)]
        return start_hook.main(args)

    return author, share, home, state, run


def no_link_and_no_secret(home: Path) -> None:
    entries = every_entry(home)
    assert [p for p, st in entries.items() if stat.S_ISLNK(st.st_mode)] == []
    contents = [p.read_bytes() for p in home.rglob("*") if p.is_file()]
    assert not [c for c in contents if SECRET.encode() in c or c.startswith(b"root:")]


def test_links_arrive_in_the_home_as_copies_that_follow_upstream(linked, capsys):
    author, share, home, state, run = linked
    publisher = Publisher(share, share.parent / "cache")
    repo = Repo("linked", author.url)
    publisher.sync(repo)
    assert run() == 0
    assert f"{len(INSIDE)} copy" in capsys.readouterr().out
    for path, source in INSIDE.items():
        assert (home / "linked" / path).read_bytes() == (author.work / source).read_bytes(), path
    for path in SKIPPED:
        assert not (home / "linked" / path).exists(), path
    no_link_and_no_secret(home)

    run()
    assert f"{len(INSIDE)} keep" in capsys.readouterr().out
    (home / "linked" / "chain.ipynb").write_text("my answer")
    author.write("notebooks/01.ipynb", '{"cells": ["two"]}')
    author.commit_and_push("second")
    publisher.sync(repo)
    run()
    assert (home / "linked" / "alias.ipynb").read_text() == '{"cells": ["two"]}', "followed"
    assert (home / "linked" / "chain.ipynb").read_text() == "my answer", "the edit stays"
    (beside,) = (home / "linked").glob("chain.new-*.ipynb")
    assert beside.read_text() == '{"cells": ["two"]}'


def publish_with_links_kept(author: Author, share: Path, name: str) -> None:
    """A version holding the repository's links as links, as the previous publisher wrote in-repo
    ones (and a share written by hand may hold any): the commit checked out by git, every blob
    of the tree (links too) in the manifest."""
    version = share / ".versions" / name / "old"
    version.parent.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", author.url, str(version)], check=True)
    shutil.rmtree(version / ".git")
    files = {}
    for line in filter(None, author.git("ls-tree", "-r", "-z", "HEAD").split("\0")):
        meta, path = line.split("\t", 1)
        files[path] = meta.split()[2]
    manifest = {"commit": author.git("rev-parse", "HEAD"), "published_at": 1.0, "files": files}
    (version / MANIFEST).write_text(json.dumps(manifest))
    (share / name).symlink_to(f".versions/{name}/old")


def test_links_on_the_share_are_never_followed_and_never_stop_the_copy(linked, capsys):
    author, share, home, state, run = linked
    publish_with_links_kept(author, share, "linked")
    real = share / ".versions" / "linked" / "old"
    links = sorted(p for p, st in every_entry(real).items() if stat.S_ISLNK(st.st_mode))
    assert len(links) == 15 and "notebooks/data" in links, "the share holds every kind of link"

    assert run() == 0
    out, err = capsys.readouterr()
    assert f"3 copy, {len(links)} failed" in out
    for path in links:
        assert f"could not copy linked/{path}:" in err, path
    assert "symbolic link on the share; not followed" in err
    notice = (home / start_hook.NOTICE).read_text()
    assert all(f"`linked/{path}`: " in notice for path in links), "the participant is told"
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) == [
        start_hook.NOTICE,
        "linked/data/sub/deep.csv",
        "linked/data/table.csv",
        "linked/notebooks/01.ipynb",
    ]
    no_link_and_no_secret(home)
    assert not set(json.loads(state.read_text())["files"]) & {f"linked/{p}" for p in links}


def test_a_share_entry_or_a_manifest_path_leading_out_is_skipped(tmp_path, capsys):
    """A share not written by the publisher: an entry pointing elsewhere, a loop, paths climbing
    out, a folder on the way that is a link, a fifo."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.txt").write_text(SECRET)
    manifest = {"commit": "0" * 40, "files": {"x.txt": "1" * 40}}
    (elsewhere / MANIFEST).write_text(json.dumps(manifest))
    share = tmp_path / "share"
    version = share / ".versions" / "gpu101" / "v"
    version.mkdir(parents=True)
    (version / "ok.txt").write_text("ok")
    (version / "via").symlink_to(elsewhere)  # a folder on the way is a link
    os.mkfifo(version / "pipe")  # opening it for reading would wait for a writer forever
    bad = ["../../../escaped.txt", "/abs.txt", "a/./b.txt", "a//b.txt", ""]
    files = {"ok.txt": "2" * 40, "via/x.txt": "5" * 40, "pipe": "6" * 40}
    files.update({p: "3" * 40 for p in bad})
    (version / MANIFEST).write_text(json.dumps({"commit": "4" * 40, "files": files}))
    (share / "gpu101").symlink_to(".versions/gpu101/v")
    (share / "elsewhere").symlink_to(elsewhere)
    (share / "loop").symlink_to("loop")
    home = tmp_path / "home" / "tutorials"
    code = start_hook.main(
        ["--share", str(share), "--home", str(home), "--state", str(tmp_path / "state.json")]
    )
    assert code == 0
    out, err = capsys.readouterr()
    assert "1 copy, 2 failed" in out
    assert "elsewhere: points outside" in err
    assert "loop: a loop of symbolic links" in err
    assert "gpu101/via/x.txt: " in err and "symbolic link on the share" in err
    assert "gpu101/pipe: " in err and "pipe is not a regular file" in err
    for path in bad:
        assert f"gpu101/{path}: not a plain relative path" in err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.txt")) == [
        "elsewhere/x.txt",
        "home/tutorials/gpu101/ok.txt",
        "share/.versions/gpu101/v/ok.txt",
    ]
