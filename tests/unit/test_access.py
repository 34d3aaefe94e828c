"""Access ends when the organizer says so (gpu_swarm_spawner/access.py): the decision without a
hub, then the periodic check against a stand-in hub (its users, the proxy, the stop) and an
authenticator whose GitHub answers are recorded ones."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from gpu_swarm_spawner import access, github_membership, internals
from gpu_swarm_spawner.github_membership import Membership

MEMBER, NOT = github_membership.MEMBER, github_membership.NOT_MEMBER
ENTRIES = ("org", "org:team")
BOTH = access.Rules(roster=frozenset({"rosa"}), roster_in_use=True, entries=ENTRIES)


def said(**states) -> list[Membership]:
    return [Membership(entry.replace("_", ":"), state, "detail") for entry, state in states.items()]


# ---- the decision -----------------------------------------------------------------------------


def test_someone_nothing_lets_in_any_more_is_removed_with_what_let_them_in_before():
    nobody = said(org=NOT, org_team=NOT)
    assert access.judge("tom", False, BOTH, nobody, before="org:team") == access.Judgement(
        "tom", access.REMOVE, "no longer a member of org:team, nor of org, nor on the roster"
    )
    assert access.judge("rick", False, BOTH, nobody, before=access.ROSTER).reason == (
        "not on the roster any more, nor a member of org or org:team"
    )
    assert access.judge("zed", False, BOTH, nobody).reason == (
        "not a member of org or org:team, nor on the roster"
    )
    roster_only = access.Rules(roster=frozenset(), roster_in_use=True)
    assert access.judge("rick", False, roster_only, None) == access.Judgement(
        "rick", access.REMOVE, "not on the roster any more"
    )
    teams_only = access.Rules(entries=("org:team",))
    assert access.judge("tom", False, teams_only, said(org_team=NOT), "org:team").reason == (
        "no longer a member of org:team"
    )
    # an invitation not accepted is no membership
    invited = said(org=github_membership.INVITED, org_team=NOT)
    assert access.judge("ivy", False, BOTH, invited).state == access.REMOVE


def test_the_roster_a_membership_an_admin_or_allowed_users_keep_them():
    nobody = said(org=NOT, org_team=NOT)
    assert access.judge("rosa", False, BOTH, None) == access.Judgement(
        "rosa", access.KEEP, access.ROSTER
    )
    assert access.judge("tom", False, BOTH, said(org=NOT, org_team=MEMBER)).reason == "org:team"
    assert access.judge("ada", True, BOTH, nobody).state == access.KEEP
    allowed = access.Rules(roster=frozenset(), roster_in_use=True, allowed=frozenset({"bo"}))
    assert access.judge("bo", False, allowed, None).state == access.KEEP
    assert access.judge("x", False, access.Rules(allow_all=True, entries=ENTRIES), []).state == (
        access.KEEP
    )
    assert access.judge("x", False, access.Rules(), None).state == access.KEEP  # no rules at all


@pytest.mark.parametrize(
    "answers",
    [
        None,  # no token stored: GitHub not asked
        said(org=NOT, org_team=github_membership.UNAVAILABLE),  # rate limit, 5xx, timeout
        said(org=NOT, org_team=github_membership.HIDDEN),
        said(org=NOT, org_team=github_membership.REFUSED),
        said(org=NOT),  # not every entry answered
    ],
)
def test_what_github_did_not_say_never_removes_anyone(answers):
    judged = access.judge("tom", False, BOTH, answers, before="org:team")
    assert judged.state == access.UNSURE and judged.reason


def test_a_roster_that_could_not_be_read_removes_nobody():
    rules = access.Rules(roster=None, roster_in_use=True, entries=ENTRIES)
    assert access.judge("rosa", False, rules, said(org=NOT, org_team=NOT)).state == access.UNSURE
    assert not access.needs_github("rosa", False, rules)


def test_github_is_asked_only_when_nothing_cheaper_lets_them_in():
    assert access.needs_github("tom", False, BOTH)
    assert not access.needs_github("rosa", False, BOTH)  # on the roster
    assert not access.needs_github("ada", True, BOTH)
    assert not access.needs_github("tom", False, access.Rules(roster_in_use=True))


# ---- the check against a stand-in hub --------------------------------------------------------

NOW = datetime.now(timezone.utc)


class Spawner:
    def __init__(self, active=True, pending=None):
        self.active, self.pending = active, pending


class User:
    def __init__(self, name, server=True, admin=False, seen=NOW, token=True, pending=None):
        self.name, self.admin = name, admin
        self.spawners = {"": Spawner(pending=pending)} if server else {}
        self.last_activity = seen.replace(tzinfo=None)  # JupyterHub's: naive UTC
        self.token = {"access_token": f"t-{name}"} if token else None
        self.stopped = []

    @property
    def active(self):
        return any(s.active for s in self.spawners.values())

    async def get_auth_state(self):
        return {"token_response": self.token} if self.token else None

    async def stop(self, server_name=""):
        self.stopped.append(server_name)
        self.spawners[server_name].active = False


class Authenticator:
    def __init__(self, roster=frozenset({"rosa"}), teams=None):
        self.roster_file = "roster.txt"
        self.roster = roster
        self.teams = teams if teams is not None else {"org:team": {"tom"}, "org": {"alice"}}
        self.allowed_organizations = set(self.teams)
        self.allowed_users, self.allow_all, self.admin_users = set(), False, {"ada"}
        self.log = logging.getLogger("test-access")
        self.asked = []
        self.failing = ""  # "rate" or "5xx"

    async def current_roster(self):
        return self.roster

    async def membership(self, entry, username, token):
        assert token == {"access_token": f"t-{username}"}  # their own
        self.asked.append((username, entry))
        if self.failing == "5xx":
            return Membership(entry, github_membership.UNAVAILABLE, "GitHub failed: 502")
        if self.failing == "rate":
            return Membership(entry, github_membership.UNAVAILABLE, "rate limited: 403")
        return Membership(entry, MEMBER if username in self.teams[entry] else NOT)


class Hub:
    def __init__(self, users, authenticator):
        self.users = {u.name: u for u in users}
        self.db = SimpleNamespace(query=lambda _model: list(self.users))
        self.authenticator = authenticator
        self.routes_removed = []

        async def delete_user(user, server_name):
            self.routes_removed.append(user.name)

        self.proxy = SimpleNamespace(delete_user=delete_user)


@pytest.fixture
def ended(monkeypatch):
    ended = []
    monkeypatch.setattr(internals, "end_sessions", lambda user: ended.append(user.name) or 2)
    return ended


def check_of(users, authenticator=None):
    authenticator = authenticator or Authenticator()
    hub = Hub(users, authenticator)
    return access.AccessCheck(hub, authenticator, 30), hub


async def test_a_removed_participant_is_logged_out_and_stopped_and_others_stay(ended, caplog):
    users = [User("rosa"), User("tom"), User("alice"), User("ada"), User("zed")]
    check, hub = check_of(users)
    check.let_in["zed"] = "org:team"
    with caplog.at_level(logging.INFO, "test-access"):
        removed = await check.check()
    assert [r.name for r in removed] == ["zed"]
    assert ended == ["zed"] and hub.routes_removed == ["zed"]
    assert hub.users["zed"].stopped == [""]  # the way JupyterHub stops one: route, then stop
    assert all(not hub.users[n].stopped for n in ("rosa", "tom", "alice", "ada"))
    (line,) = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    assert line == (
        "Access of zed ended: no longer a member of org:team, nor of org, nor on the roster; "
        "logins ended (2 token(s) removed), stopped their server (files kept)"
    )
    # GitHub: once per entry at most, stopping at the first "member"; never about the roster's
    # or the admin's
    assert ("rosa", "org") not in hub.authenticator.asked
    assert not [a for a in hub.authenticator.asked if a[0] == "ada"]
    assert hub.authenticator.asked.count(("alice", "org")) == 1
    assert ("alice", "org:team") not in hub.authenticator.asked
    # the next round: zed is not seen again, so not ended again
    hub.authenticator.asked.clear()
    assert await check.check() == []
    assert ended == ["zed"] and ("zed", "org") not in hub.authenticator.asked


async def test_a_participant_taken_off_the_roster_is_removed(ended):
    authenticator = Authenticator()
    check, hub = check_of([User("rosa")], authenticator)
    assert await check.check() == []
    authenticator.roster = frozenset()
    (removed,) = await check.check()
    assert removed.reason.startswith("not on the roster any more")
    assert ended == ["rosa"] and hub.users["rosa"].stopped == [""]


@pytest.mark.parametrize("failing", ["rate", "5xx"])
async def test_github_failing_removes_nobody_and_is_said_once(ended, caplog, failing):
    authenticator = Authenticator()
    authenticator.failing = failing
    users = [User("tom"), User("zed"), User("yan"), User("xia"), User("wu")]
    check, hub = check_of(users, authenticator)
    with caplog.at_level(logging.WARNING, "test-access"):
        assert await check.check() == []
        assert await check.check() == []
    assert ended == [] and not hub.users["zed"].stopped
    (kept,) = [r.getMessage() for r in caplog.records if "kept" in r.getMessage()]  # once
    assert kept.startswith("Access kept, not checked, of 5 participant(s): tom: GitHub did not")
    # GitHub failing: after 3 answers in a row that were none, nobody else is asked that round
    assert len(authenticator.asked) == 2 * access.FAILING_AFTER
    assert "(not asked: " in kept


async def test_who_is_checked_running_servers_and_recent_logins(ended):
    old = NOW - access.RECENTLY_ACTIVE - timedelta(minutes=1)
    users = [User("zed"), User("yan", server=False), User("old", server=False, seen=old)]
    check, hub = check_of(users)
    removed = await check.check()
    assert sorted(r.name for r in removed) == ["yan", "zed"]
    assert not [a for a in hub.authenticator.asked if a[0] == "old"]
    # without a stored token (logged in before the hub kept them): kept
    check, hub = check_of([User("zed", token=False)])
    assert await check.check() == [] and ended == ["zed", "yan"]


async def test_a_starting_server_is_left_for_the_next_round_but_the_logins_end(ended):
    check, hub = check_of([User("zed", pending="spawn")])
    await check.check()
    assert ended == ["zed"] and hub.users["zed"].stopped == []


async def test_a_request_of_a_removed_participant_is_refused_without_asking_github(ended):
    check, hub = check_of([User("zed"), User("tom")])
    assert await check.refresh(hub.users["zed"]) is True  # not judged yet
    await check.check()
    asked = list(hub.authenticator.asked)
    assert await check.refresh(hub.users["tom"]) is True
    assert await check.refresh(hub.users["zed"]) is False
    assert hub.authenticator.asked == asked  # from memory
    hub.authenticator.roster = None  # the next round cannot say: kept, and let through
    back = datetime.now(timezone.utc) + timedelta(seconds=1)
    hub.users["zed"].last_activity = back.replace(tzinfo=None)  # seen since: checked again
    await check.check()
    assert check.finished["zed"].state == access.UNSURE
    assert await check.refresh(hub.users["zed"]) is True


async def test_one_failing_round_does_not_stop_the_loop(ended, caplog, monkeypatch):
    check, _ = check_of([])
    calls = []

    async def check_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database locked")
        if len(calls) == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(check, "check", check_once)
    check.interval = 0
    with caplog.at_level(logging.INFO, "test-access"), pytest.raises(asyncio.CancelledError):
        await check.keep()
    assert len(calls) == 3
    assert "The access check failed; trying again" in caplog.text
    assert "The access check works again" in caplog.text


async def test_the_check_starts_with_the_hub_when_it_has_an_interval(ended):
    authenticator = Authenticator()
    hub = Hub([], authenticator)
    authenticator.access_check_interval = 0
    access.start(hub)
    assert not hasattr(hub, "gpuhub_access_check")
    authenticator.access_check_interval = 30
    access.start(hub)
    assert authenticator.access_check.interval == 30
    hub.gpuhub_access_check.cancel()


# ---- the authenticator's side -----------------------------------------------------------------


async def test_the_check_reads_the_roster_only_when_it_could_be_read(tmp_path):
    from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator

    path = tmp_path / "roster.txt"
    auth = WorkshopGitHubOAuthenticator(roster_file=str(path))
    assert await auth.current_roster() is None  # missing: nobody knows who is on it
    path.write_text("rosa\n")
    assert await auth.current_roster() == frozenset({"rosa"})
    path.write_text("rosa\n" + "\0" * 10)  # no text: the names read before stand
    assert await auth.current_roster() == frozenset({"rosa"})
    path.unlink()
    assert await auth.current_roster() is None


async def test_a_login_refreshes_on_the_checks_judgement_without_asking_github_itself(ended):
    from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator

    auth = WorkshopGitHubOAuthenticator()
    zed = User("zed")
    assert await auth.refresh_user(zed) is True  # no check: the login holds
    fake = Authenticator()
    auth.access_check = access.AccessCheck(Hub([zed], fake), fake, 30)
    await auth.access_check.check()
    assert await auth.refresh_user(zed) is False
    assert await auth.refresh_user(User("tom")) is True
