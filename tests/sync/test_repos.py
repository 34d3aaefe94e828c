"""GPUHUB_TUTORIAL_REPOS as organizers write it (tests/sync/repo_entries.py), through its one
reader and on: the settings check, the typed Config, what the stack hands on, the sync
service's command line. What the check accepts is what the service uses; what it refuses,
it refuses with the fix, never showing a credential."""

from __future__ import annotations

import pytest

from deploy import settings, stack
from tutorial_sync.repos import Repo, ReposError, format_repos, parse_repos, redact
from tutorial_sync.service import parse_args

from .repo_entries import ACCEPTED, GHP, REFUSED, TOKENS


def problems_of(text: str) -> list[str]:
    try:
        parse_repos(text)
    except ReposError as e:
        return e.problems
    return []


def no_token_in(text: str) -> None:
    for token in TOKENS:
        assert token not in text
    assert "Winter2026" not in text


@pytest.mark.parametrize("text, entries", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_each_accepted_form_is_read_as_the_service_will_fetch_it(text, entries):
    repos = parse_repos(text)
    assert [r.entry() for r in repos] == entries
    assert parse_repos(format_repos(repos)) == repos, "what the stack hands on reads back the same"


@pytest.mark.parametrize("text, says", REFUSED.values(), ids=REFUSED.keys())
def test_each_refused_form_is_told_with_its_fix_and_no_credential(text, says):
    found = problems_of(text)
    assert found, f"{text!r} was accepted"
    assert len(found) == 1, found  # one line per real problem
    for words in says:
        assert words in found[0]
    no_token_in(found[0])


@pytest.mark.parametrize("text, says", REFUSED.values(), ids=REFUSED.keys())
def test_the_settings_check_refuses_what_the_reader_refuses(text, says):
    values = settings.merge(settings.read_defaults(str(settings.DEFAULTS)), {}, {}).values
    said = settings.problems({**values, "GPUHUB_TUTORIAL_REPOS": text}, mode="demo")
    mine = [line for line in said if line.startswith("GPUHUB_TUTORIAL_REPOS: ")]
    assert mine == [f"GPUHUB_TUTORIAL_REPOS: {p}" for p in problems_of(text)]
    with pytest.raises(settings.SettingsError) as refused:  # the typed Config, as the hub reads
        settings.from_environment({"GPUHUB_TUTORIAL_REPOS": text})
    assert "GPUHUB_TUTORIAL_REPOS" in str(refused.value)
    no_token_in(str(refused.value))


@pytest.mark.parametrize("text, entries", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_the_check_accepts_is_what_the_sync_service_uses(text, entries, tmp_path):
    environ = {
        "GPUHUB_CONFIG": "none",
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_TUTORIAL_REPOS": text,
    }
    checked = settings.read("demo", environ, machine=settings.Machine(4, 16 * settings.GIB, 0))
    assert [r.entry() for r in checked.tutorial_repos] == entries
    handed_on = stack.stack_environment(
        checked.with_values(
            {"GPUHUB_TUTORIAL_REPOS": format_repos(checked.tutorial_repos)}, "deploy"
        ),
        {},
    )["GPUHUB_TUTORIAL_REPOS"]
    args = parse_args(
        ["--root", str(tmp_path / "share")], environ={"GPUHUB_TUTORIAL_REPOS": handed_on}
    )
    assert args.repos == checked.tutorial_repos
    # and the raw text too: the service reads it by the same rule
    assert parse_args(["--root", "/s"], environ={"GPUHUB_TUTORIAL_REPOS": text}).repos == args.repos


@pytest.mark.parametrize("text, says", REFUSED.values(), ids=REFUSED.keys())
def test_the_sync_service_refuses_the_same_without_showing_a_credential(text, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--root", "/s"], environ={"GPUHUB_TUTORIAL_REPOS": text})
    err = capsys.readouterr().err
    assert problems_of(text)[0] in err
    no_token_in(err)


def test_every_problem_of_a_list_is_told_at_once():
    text = "\n".join(REFUSED[k][0] for k in ("Code button, SSH", "no name", "an unknown suffix"))
    assert (
        len(problems_of(text + f"\nok={ACCEPTED['Code button, HTTPS'][0].split('=', 1)[1]}")) == 3
    )


def test_no_repository_can_hold_a_credential():
    with pytest.raises(ValueError, match="holds a credential") as refused:
        Repo("gpu101", f"https://x-access-token:{GHP}@github.com/o/r.git")
    no_token_in(str(refused.value))


@pytest.mark.parametrize(
    "text",
    [
        f"fatal: unable to access 'https://x-access-token:{GHP}@github.com/o/r.git/': 403",
        f"remote: Invalid username or password. {GHP}",
        "https://oauth2:glpat-TestOnly-NotReal-0123@gitlab.com/x?private_token=abc",
    ],
)
def test_redact_hides_credentials_in_gits_words(text):
    shown = redact(text)
    no_token_in(shown)
    assert "private_token" not in shown and "***" in shown
