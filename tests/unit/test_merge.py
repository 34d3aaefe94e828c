"""The start hook's rules: new, unchanged, changed by the participant, deleted on either side."""

import pytest

from tutorial_sync.merge import (
    BESIDE,
    COPY,
    KEEP,
    REMOVE,
    UPDATE,
    beside_name,
    marked_name,
    plan,
    reset_plan,
)


def kinds(actions):
    return {a.path: a.kind for a in actions}


def test_first_start_copies_everything():
    actions, record = plan({"a.ipynb": "1", "d/b.csv": "2"}, {}, {})
    assert kinds(actions) == {"a.ipynb": COPY, "d/b.csv": COPY}
    assert record == {"a.ipynb": "1", "d/b.csv": "2"}


def test_unmodified_files_follow_upstream_and_modified_ones_are_kept():
    upstream = {"same": "1", "changed-up": "9", "mine": "3", "both": "8"}
    recorded = {"same": "1", "changed-up": "2", "mine": "3", "both": "4"}
    home = {"same": "1", "changed-up": "2", "mine": "user", "both": "user"}
    actions, record = plan(upstream, recorded, home)
    assert kinds(actions) == {"same": KEEP, "changed-up": UPDATE, "mine": KEEP, "both": BESIDE}
    assert [a.blob for a in actions if a.kind == BESIDE] == ["8"]
    assert record == upstream

    # next start, upstream unchanged: the participant's file is not offered again
    again, _ = plan(upstream, record, {**home, "changed-up": "9"})
    assert set(kinds(again).values()) == {KEEP}


def test_deletions_on_either_side():
    upstream = {"kept": "1", "deleted-here": "2"}
    recorded = {"kept": "1", "deleted-here": "2", "gone-up": "3", "gone-up-mine": "4"}
    home = {"kept": "1", "gone-up": "3", "gone-up-mine": "user"}
    actions, record = plan(upstream, recorded, home)
    assert kinds(actions) == {"kept": KEEP, "deleted-here": KEEP, "gone-up": REMOVE}
    assert record == {"kept": "1", "deleted-here": "2"}  # gone-up-mine is the participant's now
    # a file the participant deleted comes back when upstream changes it
    actions, _ = plan({"deleted-here": "5"}, record, {})
    assert kinds(actions) == {"deleted-here": COPY}


def test_a_file_the_participant_made_under_an_upstream_name_is_theirs():
    actions, _ = plan({"notes.md": "1"}, {}, {"notes.md": "user"})
    assert kinds(actions) == {"notes.md": BESIDE}


def test_beside_names_are_clear_and_keep_the_extension():
    assert beside_name("intro/01 start.ipynb", "1a2b3c4d5e") == "intro/01 start.new-1a2b3c4.ipynb"
    assert beside_name("Makefile", "abcdef0123") == "Makefile.new-abcdef0"


@pytest.mark.parametrize(
    "name",
    [
        "λ" * 120 + ".ipynb",  # 246 bytes: the mark would pass 255
        "Übung-" + "λ" * 124 + ".ipynb",  # 255 bytes, the longest a Linux name can be
        "x" * 255,  # no extension
        "a." + "b" * 200,  # an "extension" that is most of the name
    ],
)
def test_marked_names_fit_in_255_bytes_and_cut_no_character_in_half(name):
    for marked in (beside_name(f"d/{name}", "1a2b3c4d"), marked_name(name, "mine-20240102-030405")):
        last = marked.rsplit("/", 1)[-1]
        assert len(last.encode()) <= 255, last
        assert ".new-1a2b3c4" in last or ".mine-20240102-030405" in last
        assert last.encode().decode() == last and "\ufffd" not in last
    if name.endswith(".ipynb"):
        assert beside_name(name, "1a2b3c4d").endswith(".new-1a2b3c4.ipynb")


def test_reset_restores_changed_files_only_and_names_unknown_ones():
    upstream = {"a": "1", "b": "2"}
    assert [a.path for a in reset_plan(upstream, {"a": "x", "b": "2"}, [])] == ["a"]
    assert [a.path for a in reset_plan(upstream, {}, ["b"])] == ["b"]
    with pytest.raises(ValueError, match="not a tutorial file: c"):
        reset_plan(upstream, {}, ["c"])
