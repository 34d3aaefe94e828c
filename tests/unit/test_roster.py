"""The roster: registration exports as Excel, Google Forms, Microsoft Forms and Notepad write
them (tests/fixtures/rosters/), read by the one reader (gpu_swarm_spawner/roster.py) and followed
on through `make roster` (deploy/steps.py) to the hub's login check (auth.py). Each file is read
right, or refused with its line, what is wrong and the fix, one line per kind of problem."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from deploy import settings, steps
from deploy.console import DeployError
from gpu_swarm_spawner import roster
from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator
from gpu_swarm_spawner.roster import Roster, RosterError, parse, parse_bytes

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "rosters"

# file: the usernames read, the column they came from ("" for a list), and people in the file
# who are no participant's GitHub account and must not get in
READ = {
    "excel-csv-utf8.csv": ({"jnunez", "zoeo", "ada-l"}, "D 'GitHub'", {"jose.nunez", "ada"}),
    "excel-csv-semicolon.csv": (
        {"jmueller", "ada-l", "gretew"},
        "D 'GitHub-Benutzername'",
        {"muller", "lovelace"},
    ),
    "excel-csv-windows-1252.csv": (
        {"hdubois", "renee-f", "oedipe"},
        "C 'GitHub username'",
        {"helene"},
    ),
    "excel-sep-line.csv": ({"ada-l", "grace-h"}, "B 'GitHub'", {"sep", "name", "github"}),
    "excel-unicode-text.txt": ({"ada-l", "soren-k"}, "B 'GitHub'", {"name", "github"}),
    "google-forms.csv": (
        {"ada-l", "grace-h", "linus-t"},
        "E 'What is your GitHub username?'",
        {"yes", "timestamp"},
    ),
    "microsoft-forms.csv": (
        {"ada-l", "grace-h", "aturing"},
        "G 'What is your GitHub username?'",
        {"anonymous", "morning", "1"},
    ),
    "google-sheets.tsv": ({"ada-l", "grace-h"}, "C 'GitHub'", {"name", "github"}),
    "notepad-list.txt": ({"ada-l", "grace-h", "linus-t", "aturing"}, "", set()),
    "one-line-list.txt": ({"ada-l", "grace-h", "linus-t", "aturing"}, "", set()),
    "one-column-github.csv": ({"ada-l", "grace-h"}, "", {"github"}),
    # R's write.csv (and LibreOffice's "quote all text cells"): every cell in quotes
    "r-write-csv-one-column.csv": ({"ada-l", "grace-h", "linus-t", "aturing"}, "", {"github"}),
    "comment-above-header.csv": ({"ada-l", "linus-t"}, "C 'GitHub'", {"grace-h", "name"}),
    "legacy-logins.txt": ({"name-", "a--b", "x", "9"}, "", set()),
    # the university's logins in Username, the GitHub accounts in GitHub (issue 30, class 1)
    "university-username-and-github.csv": (
        {"ada-l", "grace-h"},
        "E 'GitHub'",
        {"ab12cde", "gh34ijk", "username"},
    ),
}

# file: the problems, one line each, in order (regular expressions after the file's name)
WORKBOOK = r"save it as 'CSV UTF-8 \(Comma delimited\)' \(Excel: File > Save As"
REFUSED = {
    "registrations.xlsx": [
        rf": is an Excel workbook \(\.xlsx\), not a CSV; open it and {WORKBOOK}"
    ],
    "google-forms-download.zip": [
        r": is a zip archive holding 'Workshop registration \(Responses\)\.csv' .*; unzip it "
        "and name that file"
    ],
    "several-login-columns.csv": [
        r" line 1: several columns could hold GitHub usernames \(B 'Username', C 'Login'\), .*; "
        "name that column 'GitHub' and rename or delete the others"
    ],
    "no-github-column.csv": [
        r" line 1: no column is named GitHub \(this line reads A 'Name', B 'Email', "
        r"C 'Matriculation number'\); name the column with the GitHub usernames 'GitHub'"
    ],
    "google-forms-emails.csv": [
        r" line 3 \(and line 5\): 'grace@example.org' is not a GitHub username but an email "
        r"address; ask for the GitHub username .*github.com/settings/profile\)$",
        r" line 4: 'Linus Torvalds' is not a GitHub username: it has a space .*; write the "
        "participant's GitHub username there$",
        r" line 6: no GitHub username in column C 'GitHub username'; fill it in or delete that "
        "row$",
    ],
    "bad-values.txt": [
        r" line 2 \(and line 9\): 'ada@uni.edu' is not a GitHub username but an email address",
        r" line 3: 'https://github.com/ada-l/tutorial' is not a GitHub username but an address "
        r"on GitHub other than a profile .*; write just the account's username \('ada-l'\)$",
        r" line 4: 'Ada Lovelace' is not a GitHub username: it has a space .*; write one "
        "username per line, or separate them with commas$",
        r" line 5 \(and line 6\): 'ada_l' is not a GitHub username: only letters, digits and "
        "hyphens, not starting with a hyphen; fix it or delete it$",
        r" line 7: 'a{40}' is not a GitHub username: it is longer than 39 characters",
        r" line 8: 'https://gitlab.com/ada-l' is not a GitHub username but a web address; "
        "write just the username",
    ],
}


def test_the_corpus_is_covered():
    files = {p.name for p in CORPUS.iterdir() if not p.name.startswith(".")}
    assert files == set(READ) | set(REFUSED)


@pytest.mark.parametrize("name", sorted(READ))
def test_an_export_is_read_right(name):
    names, column, strangers = READ[name]
    found = roster.read(CORPUS / name)
    assert found == Roster(frozenset(names), column)
    assert not found.names & strangers


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_export_that_cannot_be_read_right_is_refused_with_its_lines_and_the_fix(name):
    with pytest.raises(RosterError) as refused:
        roster.read(CORPUS / name)
    problems = refused.value.problems
    assert len(problems) == len(REFUSED[name]), "\n".join(problems)
    for problem, expected in zip(problems, REFUSED[name]):
        assert re.match(re.escape(str(CORPUS / name)) + expected, problem), problem


# ---- on to the hub --------------------------------------------------------------------------


def config_for(tmp_path: Path, roster_file: Path) -> settings.Config:
    environ = {
        "GPUHUB_CONFIG": "none",
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_ROSTER": str(roster_file),
    }
    return settings.read(None, environ)


def model(name: str) -> dict:
    return {"name": name, "admin": False, "auth_state": {"token_response": {}}}


def in_the_hub(config: settings.Config) -> Path:
    """The file `make roster` left for the hub (its mount of the state directory's roster/)."""
    return Path(config.state_dir, "roster", Path(steps.ROSTER_IN_HUB).name)


@pytest.mark.parametrize("name", sorted(READ))
async def test_make_roster_hands_the_hub_the_usernames_it_lets_in(tmp_path, name):
    names, column, strangers = READ[name]
    config = config_for(tmp_path, CORPUS / name)
    lines = []
    steps.ensure_roster(config, lines.append)
    said = f"roster: {len(names)} GitHub usernames" + (f" (from column {column})" if column else "")
    assert lines == [said]
    handed = in_the_hub(config).read_text()
    # the usernames alone: no name or email address of the export reaches the hub
    assert "@" not in handed and sorted(handed.splitlines()[1:]) == sorted(names)
    auth = WorkshopGitHubOAuthenticator(roster_file=str(in_the_hub(config)))
    for user in names:
        assert await auth.check_allowed(user, model(user)), user
    for user in strangers:
        assert not await auth.check_allowed(user, model(user)), user


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_make_roster_refuses_an_export_and_the_hub_keeps_its_list(tmp_path, name):
    good = tmp_path / "good.txt"
    good.write_text("ada-l\n")
    config = config_for(tmp_path, good)
    steps.ensure_roster(config, lambda line: None)
    before = in_the_hub(config).read_text()
    config = config_for(tmp_path, CORPUS / name)
    with pytest.raises(DeployError) as refused:
        steps.ensure_roster(config, lambda line: None)
    lines = str(refused.value).splitlines()
    assert len(lines) == len(REFUSED[name])
    assert all(line.startswith(f"GPUHUB_ROSTER: {CORPUS / name}") for line in lines)
    assert in_the_hub(config).read_text() == before


def test_the_deploy_check_names_the_roster_problems_one_line_each(tmp_path):
    export = CORPUS / "google-forms-emails.csv"
    found, problems = settings.read_roster(str(export))
    assert found.names == frozenset()
    with pytest.raises(RosterError) as refused:
        roster.read(export)
    assert problems == [f"GPUHUB_ROSTER: {line}" for line in refused.value.problems]
    empty = tmp_path / "empty.csv"
    empty.write_text("Name,GitHub\n")
    assert settings.read_roster(str(empty))[1] == [
        f"GPUHUB_ROSTER: {empty} lists no GitHub username; add them"
    ]


@pytest.mark.parametrize("name", sorted(READ))
async def test_a_hub_pointed_at_an_export_itself_reads_it_with_the_same_reader(name):
    names, _, strangers = READ[name]
    auth = WorkshopGitHubOAuthenticator(roster_file=str(CORPUS / name))
    for user in names:
        assert await auth.check_allowed(user, model(user)), user
    for user in strangers:
        assert not await auth.check_allowed(user, model(user)), user


async def test_an_edit_that_makes_the_github_column_unclear_keeps_the_hub_s_last_list(tmp_path):
    export = tmp_path / "moodle.csv"
    export.write_bytes((CORPUS / "university-username-and-github.csv").read_bytes())
    auth = WorkshopGitHubOAuthenticator(roster_file=str(export))
    assert await auth.check_allowed("ada-l", model("ada-l"))
    export.write_text("Username,GitHub,GitHub\nab12cde,ada-l,ab12cde\n")
    stat = export.stat()
    os.utime(export, (stat.st_atime, stat.st_mtime + 5))
    assert await auth.check_allowed("ada-l", model("ada-l"))
    assert not await auth.check_allowed("ab12cde", model("ab12cde"))


# ---- the rules, one by one ------------------------------------------------------------------


def test_one_username_per_line_with_comments_at_signs_and_profile_urls():
    text = "# day 1\nAlice\n@bob  # late registration\n\nhttps://github.com/Carol-X/\n"
    assert parse(text).names == {"alice", "bob", "carol-x"}


@pytest.mark.parametrize(
    "value, name",
    [
        ("https://github.com/ada", "ada"),
        ("http://www.github.com/Ada/", "ada"),
        ("github.com/ada?tab=repositories", "ada"),
        ("  @Ada\u200b ", "ada"),
        ("12345+ada-l@users.noreply.github.com", "ada-l"),
        ("name-", "name-"),
        ("a--b", "a--b"),
        ("x" * 39, "x" * 39),
    ],
)
def test_a_username_may_be_written_as_github_shows_it(value, name):
    assert parse(f"{value}\n").names == {name}


@pytest.mark.parametrize(
    "value, why",
    [
        ("-ada", "only letters, digits and hyphens, not starting with a hyphen"),
        ("ada_l", "only letters, digits and hyphens"),
        ("x" * 40, "longer than 39 characters"),
        ("@@ada", "only letters, digits and hyphens"),
        ("ada@example.org", "but an email address"),
        ("https://github.com/", "address on GitHub other than a profile"),
        ("https://github.com/orgs/gpu-school/teams", "write just the account's username$"),
        ("https://github.com/ada/tutorial", "write just the account's username \\('ada'\\)"),
        ("https://ada.github.io", "but a web address"),
        ("ada grace", "it has a space"),
    ],
)
def test_a_value_that_is_no_username_names_its_line_and_why(value, why):
    with pytest.raises(RosterError, match=rf"^roster.txt line 2: .* {why}"):
        parse(f"ada\n{value}\n", "roster.txt")


def test_duplicates_and_blank_lines_count_once():
    assert parse("Ada\n\nada\n@ADA\n   \r\nbob\n,,\n").names == {"ada", "bob"}


def test_a_list_may_be_separated_by_commas_semicolons_or_tabs_over_ragged_lines():
    assert parse("ada, grace;linus\n\talan\n").names == {"ada", "grace", "linus", "alan"}


def test_rows_of_equal_width_without_a_github_header_are_a_table_and_refused():
    with pytest.raises(RosterError, match="line 1: no column is named GitHub .*per line$"):
        parse("ada,grace\nlinus,alan\n")


def test_a_column_named_github_wins_over_one_that_only_mentions_it():
    text = "Do you have a GitHub account?,GitHub username\nYes,ada\nNo,\n"
    with pytest.raises(RosterError, match="line 3: no GitHub username in column B"):
        parse(text)
    assert parse(text.replace("No,\n", "Yes,grace\n")) == Roster(
        frozenset({"ada", "grace"}), "B 'GitHub username'"
    )


@pytest.mark.parametrize(
    "header, named",
    [
        ("GitHub,Name,GitHub", "several columns name GitHub \\(A 'GitHub', C 'GitHub'\\)"),
        ("GitHub (personal),GitHub (work)", "several columns name GitHub"),
        ("Name,GitHub repository,GitHub team", "several columns name GitHub \\(B .*, C .*\\)"),
    ],
)
def test_several_github_columns_are_refused_naming_them(header, named):
    with pytest.raises(RosterError, match=f"^form.csv line 2: {named}"):
        parse(f"# export\n{header}\na,b,c\n", "form.csv")


def test_a_profile_address_column_is_a_github_column():
    text = "Do you have a GitHub account?,GitHub profile URL\nYes,https://github.com/ada-l\n"
    assert parse(text) == Roster(frozenset({"ada-l"}), "B 'GitHub profile URL'")


def test_a_lone_username_column_is_taken_when_nothing_names_github():
    assert parse("Name,Username\nAda,ada-l\n").column == "B 'Username'"


def test_a_header_repeated_mid_file_is_no_participant():
    text = "Name,GitHub\nAda,ada-l\nName,GitHub\nGrace,grace-h\n"
    assert parse(text).names == {"ada-l", "grace-h"}


def test_a_cell_may_list_a_team_separated_by_commas():
    assert parse('Team,GitHub\nRed,"ada-l, grace-h"\n').names == {"ada-l", "grace-h"}


def test_a_delimiter_inside_cells_does_not_fool_the_choice_of_delimiter():
    text = "Name,GitHub,Notes\nAda,ada-l,vegan; no nuts\nGrace,grace-h,late; day 2\n"
    assert parse(text).names == {"ada-l", "grace-h"}
    text = "Name;GitHub\nLovelace, Ada;ada-l\nHopper, Grace;grace-h\n"
    assert parse(text).names == {"ada-l", "grace-h"}


def test_line_numbers_count_the_file_s_lines_past_multi_line_cells():
    text = 'Name,Notes,GitHub\nAda,"arrives\nlate",ada-l\n\n# cancelled\nGrace,,grace h\n'
    with pytest.raises(RosterError, match="^form.csv line 6: 'grace h'"):
        parse(text, "form.csv")


def test_a_quote_that_never_closes_is_refused_not_read_as_one_cell():
    text = 'GitHub;Notes\r\nada-l;"arrives\r\nlate"\r\nbob;"vegan\r\ncarol;\r\n'
    with pytest.raises(
        RosterError, match=r"^form.csv line 4: a quote \(\"\) opens a cell that nev"
    ):
        parse(text, "form.csv")
    closed = text.replace('"vegan', '"vegan"')
    assert parse(closed, "form.csv").names == {"ada-l", "bob", "carol"}
    quotes = 'GitHub,Notes\nbob,4"3\nada-l,"Call me ""Ada""\n"\ncarol,\n'
    assert parse(quotes).names == {"ada-l", "bob", "carol"}


def test_many_rows_of_one_problem_are_one_line():
    rows = "".join(f"Student {i},s{i}@uni.edu,s{i}@uni.edu\n" for i in range(5000))
    with pytest.raises(RosterError) as refused:
        parse("Name,Email,GitHub\n" + rows, "form.csv")
    assert refused.value.problems == [
        "form.csv line 2 (and lines 3, 4, 5 and 4996 more): 's0@uni.edu' is not a GitHub "
        "username but an email address; ask for the GitHub username (each participant's is "
        "shown at https://github.com/settings/profile)"
    ]


def test_a_big_text_file_given_by_mistake_is_a_few_lines():
    log = "".join(
        f"2024-05-02 09:14:{i % 60:02d} INFO request {i} took 3 ms\n" for i in range(90001)
    )
    with pytest.raises(RosterError) as refused:
        parse(log, "hub.log")
    assert len(refused.value.problems) == 1
    assert refused.value.problems[0].startswith("hub.log line 1 (and lines 2, 3, 4 and 89997 more)")


@pytest.mark.parametrize(
    "data, said",
    [
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(500), "an Excel 97-2003 workbook \\(.xls\\)"),
        (b"PK\x03\x04garbage", "a zip file, not text; open it and save it as 'CSV UTF-8"),
        (b"%PDF-1.7\n", "a PDF"),
        (b"{\\rtf1\\ansi ada-l\\par}", "a rich-text document \\(RTF"),
        ("GitHub\nada-l\n".encode("utf-16-le"), "holds NUL characters.*UTF-16 without a byte"),
        (b"\n <!DOCTYPE html><html>", "a web page \\(HTML\\)"),
    ],
)
def test_a_file_that_is_no_text_roster_is_one_line_with_the_fix(data, said):
    with pytest.raises(RosterError) as refused:
        parse_bytes(data, "roster.csv")
    assert len(refused.value.problems) == 1
    assert re.match(f"roster.csv: is {said}|roster.csv: {said}", refused.value.problems[0])


@pytest.mark.parametrize(
    "encoding, data",
    [
        ("UTF-8 with a byte-order mark", "\ufeffGitHub\nada-l\n".encode()),
        (
            "a byte-order mark before Excel's sep= line",
            "\ufeffsep=;\nName;GitHub\nA;ada-l".encode(),
        ),
        ("UTF-16 big-endian", b"\xfe\xff" + "GitHub\tName\nada-l\tAdé\n".encode("utf-16-be")),
        ("UTF-32", "GitHub\nada-l\n".encode("utf-32")),
        ("Windows-1252", "Name;GitHub\nRenée;ada-l\n".encode("cp1252")),
        ("Mac line ends (CR)", b"Name,GitHub\rAda,ada-l\r"),
    ],
)
def test_the_encodings_and_line_ends_of_spreadsheets_are_read(encoding, data):
    assert parse_bytes(data).names == {"ada-l"}, encoding


def test_the_hub_s_copy_is_the_usernames_read_again_the_same():
    found = parse("Name,GitHub\nAda,@Ada-L\nGrace,https://github.com/grace-h\n")
    assert roster.text(found).splitlines()[1:] == ["ada-l", "grace-h"]
    assert parse(roster.text(found)).names == found.names


def test_the_organizer_s_page_shows_a_list_that_reads_as_it_says():
    page = (Path(__file__).resolve().parents[2] / "docs" / "input-roster.md").read_text()
    example = re.search(r"```text\n(# day 1.*?)```", page, re.DOTALL)[1]
    assert parse(example).names == {"ada-l", "grace-h", "linus-t", "alan-t", "barbara-l", "edsger"}
