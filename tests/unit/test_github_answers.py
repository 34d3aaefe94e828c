"""GitHub's answers to the login's organization and team checks, replayed over loopback HTTP.

A stand-in for github.com (a tornado app on 127.0.0.1, reached through oauthenticator's
``github_url`` as a GitHub Enterprise server is) answers the OAuth token exchange and ``/user``,
then replays GitHub's recorded answers (``tests/fixtures/github/*.json``: status, headers and
body as GitHub documents them) for the membership endpoints. The login goes through
JupyterHub's ``Authenticator.get_authenticated_user``, as the OAuth callback page calls it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from tornado import web
from tornado.httpclient import HTTPClientError

from gpu_swarm_spawner import auth as auth_module
from gpu_swarm_spawner import github_membership as gm
from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator

FIXTURES = Path(__file__).parent.parent / "fixtures" / "github"
NOW = 1_700_000_000  # the recorded rate limits reset at NOW + 42


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def answer(name: str) -> gm.Answer:
    """A recorded answer as the hub's HTTP client hands it over."""
    f = fixture(name)
    body = "" if f["body"] is None else f["body"]
    text = body if isinstance(body, str) else json.dumps(body)
    return gm.Answer(f["status"], f["headers"], text.encode())


# ---- the stand-in ---------------------------------------------------------------------------


async def replay(handler: web.RequestHandler, name: str) -> None:
    """Answer with the recorded answer ``name`` ("slow": none for 5 s)."""
    if name == "slow":
        await asyncio.sleep(5)
        return handler.finish({})
    if name == "not_found":
        return handler.send_error(404)
    f = fixture(name)
    handler.set_status(f["status"])
    for key, value in f["headers"].items():
        if key == "location":  # where GitHub redirects, on this stand-in
            value = value.replace(
                "https://api.github.com", handler.settings["github"].url + "/api/v3"
            )
        handler.set_header(key, value)
    if f["body"] is not None:
        body = f["body"]
        handler.finish(body if isinstance(body, str) else json.dumps(body))


class Replay(web.RequestHandler):
    """Answers a GET of the REST API with the recorded answer its path is given (``/user``:
    olga, unless given one)."""

    async def get(self, path):
        github = self.settings["github"]
        github.asked.append(path)
        if path == "user" and path not in github.routes:
            return self.finish({"login": "olga", "id": 1234567, "name": "Olga", "email": None})
        await replay(self, github.routes.get(path, "not_found"))


class Token(web.RequestHandler):
    """The token exchange: a token, unless given a recorded answer (route "token")."""

    async def post(self):
        github = self.settings["github"]
        github.asked.append("token")
        if "token" in github.routes:
            return await replay(self, github.routes["token"])
        self.finish({"access_token": "gho_standin", "token_type": "bearer", "scope": "read:org"})


@pytest.fixture
async def github():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = SimpleNamespace(url=f"http://127.0.0.1:{port}", routes={}, asked=[])
    app = web.Application(
        [(r"/login/oauth/access_token", Token), (r"/api/v3/(.*)", Replay)], github=state
    )
    server = app.listen(port, address="127.0.0.1")
    yield state
    server.stop()


def authenticator(github, orgs, **config) -> WorkshopGitHubOAuthenticator:
    return WorkshopGitHubOAuthenticator(
        github_url=github.url,
        client_id="Ov23liStandinClient",
        client_secret="standin-secret",
        oauth_callback_url="https://hub.example.org/hub/oauth_callback",
        enable_pkce=False,
        allowed_organizations=set(orgs),
        scope=["read:org"],
        **config,
    )


class Callback:
    """What oauthenticator reads of the OAuth callback's request: the code GitHub sent."""

    def get_argument(self, name, default=None):
        return "standin-code" if name == "code" else default


async def log_in(auth):
    """The login as the OAuth callback page runs it; what JupyterHub would get."""
    return await auth.get_authenticated_user(Callback(), None)


def hub_log(caplog) -> list[logging.LogRecord]:
    """The hub's log records about olga (not the stand-in's access log)."""
    return [r for r in caplog.records if "olga" in r.getMessage() and r.name != "tornado.access"]


ORG = "/orgs/gpu-school/members/olga"
WHY = "/user/memberships/orgs/gpu-school"
PUBLIC = "/orgs/gpu-school/public_members/olga"
TEAM = "/orgs/gpu-school/teams/tutors/memberships/olga"


def routes(**by_path) -> dict:
    return {path.lstrip("/"): name for path, name in by_path.items()}


# ---- the login through the stand-in ---------------------------------------------------------


async def test_a_member_is_let_in_by_the_204(github):
    github.routes = routes(**{ORG: "member_check_member"})
    user = await log_in(authenticator(github, ["gpu-school"]))
    assert user["name"] == "olga"
    assert github.asked == ["token", "user", ORG[1:]], "one question about the organization"


async def test_a_public_member_seen_through_the_redirect_is_let_in(github):
    github.routes = routes(**{ORG: "member_check_not_visible", PUBLIC: "member_check_member"})
    assert (await log_in(authenticator(github, ["gpu-school"])))["name"] == "olga"
    assert PUBLIC[1:] in github.asked


async def test_someone_github_says_is_no_member_reads_the_roster_message(github, caplog):
    github.routes = routes(**{ORG: "member_check_not_member", WHY: "membership_not_found"})
    with caplog.at_level(logging.WARNING):
        assert await log_in(authenticator(github, ["gpu-school"])) is None
    assert "Login of olga refused: not a member of gpu-school" in caplog.text


@pytest.mark.parametrize(
    "fixture_name, wait",
    [
        ("rate_limited_primary_403", 42),  # until x-ratelimit-reset
        ("rate_limited_primary_429", 42),
        ("rate_limited_secondary", 60),  # retry-after
        ("server_error_502", 30),
        ("server_error_500", 30),
    ],
)
async def test_a_member_github_cannot_be_asked_about_is_told_to_try_again(
    github, monkeypatch, caplog, fixture_name, wait
):
    monkeypatch.setattr(auth_module.time, "time", lambda: NOW)
    github.routes = routes(**{ORG: fixture_name})
    with caplog.at_level(logging.WARNING), pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    e = refused.value
    assert e.status_code == 503 and e.headers == {"Retry-After": str(wait)}
    assert e.jupyterhub_message == (
        "GitHub could not be asked whether you are a member of gpu-school just now. "
        "Please log in again in 1 minute."
    )
    assert "participant list" not in e.jupyterhub_message
    lines = hub_log(caplog)
    assert len(lines) == 1, "one line in the hub log"
    logged = lines[0].getMessage()
    assert logged.startswith(f"Login of olga not decided, asked to retry in {wait} s")
    assert str(fixture(fixture_name)["status"]) in logged
    assert WHY[1:] not in github.asked, "not asked again while limited"


async def test_no_answer_in_time_or_no_connection_is_not_a_refusal(github):
    github.routes = routes(**{ORG: "slow"})
    slow = authenticator(github, ["gpu-school"], membership_check_timeout=0.3)
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(slow)
    assert refused.value.status_code == 503 and "no answer (HTTPTimeoutError" in str(refused.value)

    closed = authenticator(github, ["gpu-school"])
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed.github_api = f"http://127.0.0.1:{s.getsockname()[1]}/api/v3"
    auth_model = {
        "name": "olga",
        "admin": False,
        "auth_state": {"token_response": {"access_token": "t", "token_type": "bearer"}},
    }
    with pytest.raises(gm.LoginRefused) as refused:
        await closed.check_allowed("olga", auth_model)
    assert refused.value.status_code == 503 and "ConnectionRefusedError" in str(refused.value)


async def test_a_private_member_hidden_by_oauth_app_restrictions_is_told_what_to_do(github, caplog):
    # the organization's members are not visible to the app: redirected to the public check
    github.routes = routes(
        **{
            ORG: "member_check_not_visible",
            PUBLIC: "public_member_check_not_public",
            WHY: "oauth_app_restricted",
        }
    )
    with caplog.at_level(logging.WARNING), pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    e = refused.value
    assert e.status_code == 403 and not e.headers and e.reason == "Forbidden"
    message = e.jupyterhub_message
    assert "restricts third-party (OAuth) apps" in message
    assert "https://github.com/orgs/gpu-school/people" in message  # make it public
    assert "https://github.com/settings/connections/applications/Ov23liStandinClient" in message
    assert "participant list" not in message
    logged = [r.getMessage() for r in hub_log(caplog)]
    assert len(logged) == 1, "one line in the hub log"
    assert logged[0].startswith("Login of olga refused: gpu-school: hidden (")
    assert "has enabled OAuth App access restrictions" in logged[0]


async def test_an_invited_participant_is_told_to_accept(github):
    github.routes = routes(**{ORG: "member_check_not_member", WHY: "membership_pending"})
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    assert "https://github.com/orgs/gpu-school/invitation" in refused.value.jupyterhub_message


async def test_the_membership_endpoint_lets_in_an_active_member_the_first_check_missed(github):
    github.routes = routes(**{ORG: "member_check_not_member", WHY: "membership_active"})
    assert (await log_in(authenticator(github, ["gpu-school"])))["name"] == "olga"


async def test_sso_is_named_with_where_to_authorize(github):
    github.routes = routes(**{ORG: "saml_sso_required", WHY: "saml_sso_required"})
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    message = refused.value.jupyterhub_message
    assert "https://github.com/orgs/gpu-school/sso?authorization_request=" in message
    assert "SAML enforcement" in message


@pytest.mark.parametrize(
    "fixture_name, outcome",
    [
        ("team_membership_active", "in"),
        ("team_membership_pending", "invitation"),
        ("team_membership_not_found", None),
        ("oauth_app_restricted", "restricts third-party"),
        ("rate_limited_secondary", "log in again in 1 minute."),
    ],
)
async def test_teams_are_asked_by_their_membership(github, fixture_name, outcome):
    github.routes = routes(**{TEAM: fixture_name})
    auth = authenticator(github, ["gpu-school:tutors"])
    if outcome == "in":
        assert (await log_in(auth))["name"] == "olga"
    elif outcome is None:
        assert await log_in(auth) is None
    else:
        with pytest.raises(gm.LoginRefused) as refused:
            await log_in(auth)
        assert outcome in refused.value.jupyterhub_message


async def test_one_entry_that_lets_in_wins_over_one_github_cannot_answer(github):
    github.routes = routes(
        **{ORG: "rate_limited_secondary", "/orgs/gpu-workshop/members/olga": "member_check_member"}
    )
    assert (await log_in(authenticator(github, ["gpu-school", "gpu-workshop"])))["name"] == "olga"


async def test_the_roster_and_admins_are_not_asked_about(github, tmp_path):
    github.routes = routes(**{ORG: "server_error_502"})
    roster = tmp_path / "roster.txt"
    roster.write_text("olga\n")
    assert await log_in(authenticator(github, ["gpu-school"], roster_file=str(roster)))
    assert ORG[1:] not in github.asked


# ---- the login's own requests: the token exchange and GET /user ----------------------------


@pytest.mark.parametrize(
    "step, fixture_name, now, wait, words",
    [
        ("user", "rate_limited_primary_403", NOW, 42, "1 minute"),  # until x-ratelimit-reset
        ("user", "rate_limited_primary_403", NOW - 100, 142, "3 minutes"),
        ("user", "rate_limited_primary_429", NOW, 42, "1 minute"),
        ("user", "rate_limited_secondary", NOW, 60, "1 minute"),  # retry-after
        ("user", "server_error_502", NOW, 30, "1 minute"),
        ("token", "rate_limited_secondary", NOW, 60, "1 minute"),
        ("token", "server_error_500", NOW, 30, "1 minute"),
    ],
)
async def test_a_login_github_cannot_answer_is_asked_to_try_again_in_minutes(
    github, monkeypatch, caplog, step, fixture_name, now, wait, words
):
    """Was "500 : Unhandled error": oauthenticator's HTTP error, which JupyterHub shows so."""
    monkeypatch.setattr(auth_module.time, "time", lambda: now)
    github.routes = {step: fixture_name}
    with caplog.at_level(logging.WARNING), pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    e = refused.value
    assert e.status_code == 503 and e.headers == {"Retry-After": str(wait)}
    assert e.reason == "Service Unavailable", "the page's heading, not the log message"
    asked = "who you are" if step == "user" else "to confirm your login"
    assert e.jupyterhub_message == (
        f"GitHub could not be asked {asked} just now. Please log in again in {words}."
    )
    logged = [r.getMessage() for r in caplog.records if r.name != "tornado.access"][-1]
    step_name = "GET /user" if step == "user" else "the token exchange"
    assert logged.startswith(f"Login not decided, asked to retry in {wait} s: {step_name}: ")
    assert str(fixture(fixture_name)["status"]) in logged
    assert ORG[1:] not in github.asked, "no membership asked without knowing who"


async def test_no_answer_or_no_connection_at_login_is_not_an_error_page(github):
    github.routes = {"user": "slow"}
    slow = authenticator(github, ["gpu-school"], http_request_kwargs={"request_timeout": 0.3})
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(slow)
    assert refused.value.status_code == 503 and "who you are" in refused.value.jupyterhub_message
    assert "GET /user: GitHub failed: no answer (HTTPTimeoutError" in str(refused.value)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"], token_url=closed + "/token"))
    assert refused.value.status_code == 503 and "ConnectionRefusedError" in str(refused.value)
    with pytest.raises(gm.LoginRefused) as refused:
        await log_in(authenticator(github, ["gpu-school"], userdata_url=closed + "/user"))
    assert "GET /user: GitHub failed: no answer (ConnectionRefusedError" in str(refused.value)


async def test_an_answer_that_is_no_outage_keeps_its_own_error(github):
    """A token GitHub refuses (401 "Bad credentials") is no reason to wait: not a 503."""
    github.routes = {"user": "bad_credentials"}
    with pytest.raises(HTTPClientError) as refused:
        await log_in(authenticator(github, ["gpu-school"]))
    assert refused.value.code == 401


# ---- the reading of answers, without HTTP ---------------------------------------------------


def test_rate_limit_answers_and_the_wait_githubs_documentation_gives():
    assert gm.rate_limited(answer("rate_limited_primary_403"))
    assert gm.rate_limited(answer("rate_limited_secondary"))
    assert not gm.rate_limited(answer("oauth_app_restricted")), "a 403 that is no rate limit"
    assert gm.retry_after(answer("rate_limited_primary_403"), NOW) == 42
    assert gm.retry_after(answer("rate_limited_secondary"), NOW) == 60
    assert gm.retry_after(answer("rate_limited_primary_403"), NOW + 100) == 1, "reset passed"
    assert gm.retry_after(gm.Answer(403, {}, b'{"message": "rate limit"}'), NOW) == 60


def test_all_plainly_not_members_leaves_the_roster_message():
    assert gm.refusal("olga", [gm.Membership("a", gm.NOT_MEMBER)]) is None


def test_several_problems_are_each_said_the_retry_first():
    refused = gm.refusal(
        "olga",
        [
            gm.Membership("org-a", gm.HIDDEN, "h"),
            gm.Membership("org-b", gm.UNAVAILABLE, "r", retry_after=142),
            gm.Membership("org-c:tutors", gm.UNAVAILABLE, "r", retry_after=7),
        ],
    )
    assert refused.status_code == 503 and refused.headers == {"Retry-After": "142"}
    assert refused.jupyterhub_message.startswith(
        "GitHub could not be asked whether you are a member of org-b or org-c:tutors just now. "
        "Please log in again in 3 minutes. GitHub does not tell this hub whether you are a "
        "member of org-a"
    )


@pytest.mark.parametrize(
    "seconds, words",
    [
        (0, "1 minute"),  # never "0 minutes"
        (-5, "1 minute"),  # a reset already past
        (3, "1 minute"),  # never "in 3 seconds"
        (59.5, "1 minute"),
        (60, "1 minute"),
        (61, "2 minutes"),  # rounded up: never sooner than GitHub said
        (120, "2 minutes"),
        (3600, "60 minutes"),  # a primary limit's longest wait
    ],
)
def test_the_wait_is_told_in_whole_minutes_at_least_one(seconds, words):
    assert gm.wait_words(seconds) == words
