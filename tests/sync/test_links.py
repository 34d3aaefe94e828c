"""What a repository's symbolic links publish: resolved in the tree, never on a filesystem."""

from __future__ import annotations

import pytest

from tutorial_sync import links

FILES = ["notebooks/01.ipynb", "data/table.csv", "data/sub/deep.csv"]


def test_links_inside_the_repository_become_copies_of_what_they_point_to():
    published = links.resolve(
        FILES,
        {
            "alias.ipynb": "notebooks/01.ipynb",  # a file
            "chain.ipynb": "alias.ipynb",  # a link to a link
            "notebooks/data": "../data",  # a folder, reached by climbing
            "via-folder.csv": "./notebooks/data//sub/../table.csv",  # through a linked folder
        },
    )
    assert published.copies == {
        "alias.ipynb": "notebooks/01.ipynb",
        "chain.ipynb": "notebooks/01.ipynb",
        "notebooks/data/table.csv": "data/table.csv",
        "notebooks/data/sub/deep.csv": "data/sub/deep.csv",
        "via-folder.csv": "data/table.csv",
    }
    assert published.skipped == {}


@pytest.mark.parametrize(
    "link, target, says",
    [
        ("passwd", "/etc/passwd", "outside the repository (/etc/passwd)"),
        ("up", "../../x", "outside the repository"),
        ("data/escape", "../../x", "outside the repository"),
        ("sneaky", "data/../../x", "outside the repository"),
        ("via-link", "linked/../../x", "outside the repository"),  # .. of data, then out
        ("dangling.ipynb", "nowhere.ipynb", "not in the repository (dangling)"),
        ("empty", "", "empty link"),
        ("into-a-file", "notebooks/01.ipynb/x", "is a file, not a folder"),
        ("self", "self", "loop of links"),
        ("everything", ".", "the repository's root, a folder holding the link itself"),
        ("data/sub/up", "..", "points to data, a folder holding the link itself"),
    ],
)
def test_links_that_cannot_be_published_safely_are_skipped_with_the_reason(link, target, says):
    published = links.resolve(FILES, {link: target, "linked": "data"})
    assert says in published.skipped[link]
    assert not any(p == link or p.startswith(f"{link}/") for p in published.copies)


def test_a_loop_of_links_and_folders_linking_each_other_end():
    files = ["a/f.txt", "c/g.txt"]
    published = links.resolve(files, {"a/to-c": "../c", "c/to-a": "../a", "x": "y", "y": "x"})
    assert published.copies == {"a/to-c/g.txt": "c/g.txt", "c/to-a/f.txt": "a/f.txt"}
    assert set(published.skipped) == {"a/to-c/to-a", "c/to-a/to-c", "x", "y"}
    assert "a folder holding the link itself" in published.skipped["a/to-c/to-a"]
    assert "loop of links" in published.skipped["x"]


def test_chains_are_followed_up_to_the_limit():
    chain = {"l0": "f"} | {f"l{i}": f"l{i - 1}" for i in range(1, links.MAX_HOPS + 2)}
    published = links.resolve(["f"], chain)
    assert published.copies[f"l{links.MAX_HOPS}"] == "f"
    assert "chain of more than" in published.skipped[f"l{links.MAX_HOPS + 1}"]


def test_links_that_multiply_stop_at_the_cap():
    """Two links to the previous folder at each of 20 levels would copy 2**20 files."""
    files = ["a0/f"]
    folders = {f"a{i}/{side}": f"../a{i - 1}" for i in range(1, 21) for side in "xy"}
    published = links.resolve(files, folders, max_copies=100)
    assert len(published.copies) + len(published.skipped) <= 100
    assert "more than 100 files" in published.skipped["a20/x"]
    assert published.copies["a1/x/f"] == "a0/f", "the small ones are still published"


def test_a_name_that_is_a_link_and_a_folder_is_skipped():
    published = links.resolve(["a/f"], {"a": "b"})
    assert "a link and a folder" in published.skipped["a"]
