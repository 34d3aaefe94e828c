"""GPUHUB_TUTORIAL_REPOS as organizers write it (tests/sync/repo_entries.py), through its one
reader and on: the settings check, the typed Config, what the stack hands on, the sync
service's command line. What the check accepts is what the service uses; what it refuses,
it refuses with the fix, never showing a credential."""

from __future__ import annotations

import json

import pytest
from tornado.httpclient import AsyncHTTPClient

from deploy import settings, stack
from deploy.limits import Machine
from deploy.values import GIB
from tutorial_sync import MANIFEST
from tutorial_sync.publish import Publisher
from tutorial_sync.repos import Repo, ReposError, format_repos, parse_repos, redact
from tutorial_sync.service import SyncService, make_app, parse_args

from .gitrepos import Author
from .repo_entries import ACCEPTED, GHP, REFUSED, TOKENS
from .test_service import free_port


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
    checked = settings.read("demo", environ, machine=Machine(4, 16 * GIB, 0))
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


# ---- on to the share and the status page -------------------------------------------------------


async def test_odd_forms_of_real_repositories_are_published_and_shown_as_read(tmp_path):
    """Local remotes written as organizers write URLs (upper-case scheme, trailing slash, the
    branch as a ref, a capitalised :Webhook, tabs and Windows line ends between entries), checked,
    handed on, synced: the status page and each manifest show the URL and branch as read."""
    remotes = {}
    for name in ("one", "two", "three"):
        (tmp_path / name).mkdir()
        remotes[name] = Author(tmp_path / name)
        remotes[name].write("notebook.ipynb", f'{{"name": "{name}"}}')
        remotes[name].commit_and_push("first")
    path = {name: str(author.remote) for name, author in remotes.items()}
    text = (
        f"\tIntro=FILE://{path['one']}/\r\n"
        f"day_2=file://{path['two']}#refs/heads/main\r\n"
        f" \thooked=file://{path['three']}#main:Webhook\r\n"
    )
    checked = settings.read(
        "demo",
        {
            "GPUHUB_CONFIG": "none",
            "GPUHUB_STATE_DIR": str(tmp_path / "state"),
            "GPUHUB_TUTORIAL_REPOS": text,
        },
        machine=Machine(4, 16 * GIB, 0),
    )
    handed_on = format_repos(checked.tutorial_repos)
    args = parse_args(
        ["--root", str(tmp_path / "share")], environ={"GPUHUB_TUTORIAL_REPOS": handed_on}
    )
    service = SyncService(Publisher(tmp_path / "share", tmp_path / "cache"), args.repos, 30, "")
    port = free_port()
    server = make_app(service).listen(port, address="127.0.0.1")
    try:
        await service.sync_all("start")
        page = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}/status")
    finally:
        server.stop()
    shown = {s["name"]: s for s in json.loads(page.body)["repos"]}
    expected = {
        "Intro": (f"file://{path['one']}", "main", True),
        "day_2": (f"file://{path['two']}", "main", True),
        "hooked": (f"file://{path['three']}", "main", False),
    }
    assert {n: (s["url"], s["branch"], s["polled"]) for n, s in shown.items()} == expected
    for name, (url, branch, _) in expected.items():
        assert shown[name]["last_error"] == "" and shown[name]["commit"]
        manifest = json.loads((tmp_path / "share" / name / MANIFEST).read_text())
        assert (manifest["repo"], manifest["url"], manifest["branch"]) == (name, url, branch)
