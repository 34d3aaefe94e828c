"""The roster of GitHub usernames: plain lists, CSV exports, and errors that name the line."""

import pytest

from gpu_swarm_spawner.roster import RosterError, parse


def test_one_username_per_line_with_comments_at_signs_and_profile_urls():
    text = "# day 1\nAlice\n@bob  # late registration\n\nhttps://github.com/Carol-X/\n"
    assert parse(text) == {"alice", "bob", "carol-x"}


def test_a_csv_export_uses_its_username_column():
    text = "Name,Email,GitHub Username\nAda,ada@example.org,ada-l\nBo,bo@example.org,@BoB\n,,\n"
    assert parse(text, "form.csv") == {"ada-l", "bob"}


def test_a_csv_without_a_username_column_says_what_to_name_it():
    with pytest.raises(RosterError, match=r"form.csv line 1: no username column .*'username'"):
        parse("name,email\nada,ada@example.org\n", "form.csv")


@pytest.mark.parametrize(
    "text, line",
    [("alice\nnot a name\n", 2), ("alice\n-bob\n", 2), ("x" * 40 + "\n", 1), ("a--b\n", 1)],
)
def test_a_bad_username_names_its_line(text, line):
    with pytest.raises(RosterError, match=rf"roster.txt line {line}: .* is not a GitHub username"):
        parse(text, "roster.txt")


def test_an_empty_username_cell_in_a_csv_names_its_line():
    with pytest.raises(RosterError, match="line 3: the username column is empty"):
        parse("username,email\nada,a@x\n,b@x\n", "form.csv")
