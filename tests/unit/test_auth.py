"""WorkshopGitHubOAuthenticator's roster: who it lets in, reloading (in a worker thread, once per
change), and a broken edit; its organizations and teams, read as the settings' check reads
them."""

import asyncio
import os
import threading

import pytest
from traitlets import TraitError
from traitlets.config import Config

from deploy import values
from gpu_swarm_spawner import roster
from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator


def model(name):
    return {"name": name, "admin": False, "auth_state": {"token_response": {}}}


def touch_later(path, seconds):
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + seconds))


async def test_the_roster_lets_in_its_users_and_is_reread_when_it_changes(tmp_path):
    roster = tmp_path / "roster.txt"
    roster.write_text("rosa\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(roster))
    assert await auth.check_allowed("rosa", model("rosa"))
    assert not await auth.check_allowed("rick", model("rick"))

    roster.write_text("rosa\n@Rick\n")
    touch_later(roster, 1)
    assert await auth.check_allowed("rick", model("rick"))

    # a broken edit keeps the last good list (and is logged)
    roster.write_text("rosa\nnot a name\n")
    touch_later(roster, 2)
    assert await auth.check_allowed("rick", model("rick"))


async def test_admins_are_let_in_without_the_roster(tmp_path):
    auth = WorkshopGitHubOAuthenticator(roster_file=str(tmp_path / "missing.txt"))
    assert await auth.check_allowed("ada", dict(model("ada"), admin=True))
    assert not await auth.check_allowed("nina", model("nina"))


def test_a_refused_user_is_told_how_to_get_in():
    message = WorkshopGitHubOAuthenticator().custom_403_message
    assert "participant list" in message and "roster" in message


# ---- organizations and teams ----------------------------------------------------------------


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "my-org:my team",  # the team's display name
            "'my-org:my team' holds a blank: a team's display name? Write the team's slug, "
            "my-org:my-team (the end of the team's page address, "
            "https://github.com/orgs/my-org/teams/my-team)",
        ),
        (
            "my-org: team",
            "'my-org: team' holds a blank: a team's display name? Write the team's slug, "
            "my-org:team (the end of the team's page address, "
            "https://github.com/orgs/my-org/teams/team)",
        ),
        ("my org", "'my org' holds a blank; write the organization as in https://github.com/ORG"),
    ],
)
def test_the_authenticator_refuses_an_entry_with_blanks_saying_what_to_write(entry, says):
    """GitHub would be asked about a team that cannot exist at every login, and nobody let in
    by it: the hub does not start with it, however it was set."""
    config = Config()
    config.WorkshopGitHubOAuthenticator.allowed_organizations = {entry, "gpu-school"}
    with pytest.raises(TraitError) as refused:
        WorkshopGitHubOAuthenticator(config=config)
    assert str(refused.value) == f"WorkshopGitHubOAuthenticator.allowed_organizations: {says}"
    auth = WorkshopGitHubOAuthenticator()
    with pytest.raises(TraitError, match="holds a blank"):
        auth.allowed_organizations = {entry}


def test_the_authenticator_takes_githubs_names_for_an_org_or_team_as_the_settings_do():
    auth = WorkshopGitHubOAuthenticator(
        allowed_organizations={
            "GPU-School:Tutors",
            "@gpu-school/tas",
            "https://github.com/orgs/gpu-lab/people",
        }
    )
    assert auth.allowed_organizations == {"gpu-school:tutors", "gpu-school:tas", "gpu-lab"}


@pytest.mark.parametrize(
    "entry",
    [
        "gpu-school",
        "GPU-School:Tutors",
        "@gpu-school/tutors",
        "https://github.com/orgs/gpu-school/teams/tutors/members",
        "https://github.com/gpu-school",
        "my-org:My Team",
        "my-org: team",
        "my org",
        "a:b:c",
        "gpu_school",
        "gpu-school:-tas",
        "https://github.com/gpu-school/gpu101",
        "https://gitlab.com/gpu-school",
    ],
)
def test_the_authenticator_and_the_settings_read_an_entry_alike(entry):
    """One reader (contract.organization): what GPUHUB_ALLOWED_ORGS lets through the hub takes,
    and what it refuses the hub refuses with the same advice."""
    try:  # with a comma, the setting's list is split at commas only: the entry stays whole
        settings = set(values.organizations(entry + ","))
    except values.Entries as e:
        (line,) = e.lines
        with pytest.raises(TraitError) as refused:
            WorkshopGitHubOAuthenticator(allowed_organizations={entry})
        advice = str(refused.value).removeprefix(
            "WorkshopGitHubOAuthenticator.allowed_organizations: "
        )
        assert line.startswith(advice), (line, advice)  # the settings add "use commas"
    else:
        assert (
            WorkshopGitHubOAuthenticator(allowed_organizations={entry}).allowed_organizations
            == settings
        )


# ---- reading the roster off the event loop --------------------------------------------------


class Reads:
    """roster.read as the authenticator calls it, recording the thread of each call; a read
    can be held until ``release`` is set (a large file being read)."""

    def __init__(self, monkeypatch):
        self.threads: list[int] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        real = roster.read

        def read(path):
            self.threads.append(threading.get_ident())
            self.started.set()
            self.release.wait(timeout=3)  # on the event loop, nothing else could set it
            return real(path)

        monkeypatch.setattr(roster, "read", read)


@pytest.fixture
def reads(monkeypatch):
    return Reads(monkeypatch)


async def test_the_roster_is_read_in_a_worker_thread_not_the_event_loop_s(tmp_path, reads):
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    assert await WorkshopGitHubOAuthenticator(roster_file=str(path)).check_allowed(
        "rosa", model("rosa")
    )
    assert len(reads.threads) == 1
    assert reads.threads[0] != threading.get_ident()


async def test_the_hub_answers_other_requests_while_a_large_roster_is_read(tmp_path, reads):
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    reads.release.clear()
    done = []

    async def login():
        assert await auth.check_allowed("rosa", model("rosa"))
        done.append("login")

    async def other_request():
        while not reads.started.is_set():
            await asyncio.sleep(0.01)
        done.append("other request")  # answered while the roster is still being read
        reads.release.set()

    await asyncio.wait_for(asyncio.gather(login(), other_request()), timeout=10)
    assert done == ["other request", "login"]


async def test_an_unchanged_roster_is_not_read_again_and_a_changed_one_is(tmp_path, reads):
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    assert await auth.check_allowed("rosa", model("rosa"))
    assert not await auth.check_allowed("rick", model("rick"))
    assert len(reads.threads) == 1

    path.write_text("rosa\nrick\n")
    touch_later(path, 1)
    assert await auth.check_allowed("rick", model("rick"))
    assert await auth.check_allowed("rosa", model("rosa"))
    assert len(reads.threads) == 2


async def test_a_roster_copied_over_with_its_old_time_kept_is_read_again(tmp_path, reads):
    """`cp -p`, `rsync -t` or an unpacked archive keep a file's modification time: an edit that
    keeps the size and the time is still a new roster."""
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    before = path.stat()
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    assert not await auth.check_allowed("rick", model("rick"))

    path.write_text("rick\n")  # as long as the old list
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert await auth.check_allowed("rick", model("rick"))
    assert not await auth.check_allowed("rosa", model("rosa"))
    assert len(reads.threads) == 2


async def test_a_roster_moved_into_place_with_the_same_time_is_read_again(tmp_path, reads):
    """A list made elsewhere and moved over the roster (`mv`, an unpacked archive) is another file,
    even with the old one's size and modification time."""
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    before = path.stat()
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    assert not await auth.check_allowed("rick", model("rick"))

    download = tmp_path / "download.txt"
    download.write_text("rick\n")
    os.utime(download, ns=(before.st_atime_ns, before.st_mtime_ns))
    download.replace(path)
    assert await auth.check_allowed("rick", model("rick"))
    assert len(reads.threads) == 2


async def test_logins_during_a_reload_share_that_one_reading(tmp_path, reads):
    path = tmp_path / "roster.txt"
    path.write_text("rosa\nrick\nrita\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    reads.release.clear()

    async def release_once_all_wait():
        while not reads.started.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the other logins reach the roster meanwhile
        reads.release.set()

    let_in = await asyncio.wait_for(
        asyncio.gather(
            *(auth.check_allowed(name, model(name)) for name in ("rosa", "rick", "rita")),
            release_once_all_wait(),
        ),
        timeout=10,
    )
    assert let_in[:3] == [True, True, True]
    assert len(reads.threads) == 1


async def test_a_roster_refused_once_is_not_read_again_until_it_changes(tmp_path, reads, caplog):
    path = tmp_path / "roster.txt"
    path.write_text("rosa\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    assert await auth.check_allowed("rosa", model("rosa"))
    path.write_text("rosa\nRosa Lopez\n")
    touch_later(path, 1)
    for _ in range(3):
        assert await auth.check_allowed("rosa", model("rosa"))
    assert len(reads.threads) == 2
    refused = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(refused) == 1 and refused[0].startswith("Roster not reloaded, keeping 1 names: ")

    path.write_text("rosa\nrosa-l\n")
    touch_later(path, 2)
    assert await auth.check_allowed("rosa-l", model("rosa-l"))
    assert len(reads.threads) == 3
