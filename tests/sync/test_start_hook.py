"""The start hook against a real published share: copy, follow upstream, never lose edits."""

from __future__ import annotations

import pytest

from tutorial_sync import start_hook
from tutorial_sync.publish import Publisher, Repo

from .gitrepos import Author


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
