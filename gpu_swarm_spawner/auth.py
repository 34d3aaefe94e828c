"""GitHub login for a workshop: organizations, teams and a reloadable roster file."""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import quote

from oauthenticator.github import GitHubOAuthenticator
from tornado.httpclient import HTTPClientError, HTTPRequest, HTTPResponse
from traitlets import Float, TraitError, Unicode, default, validate

from . import contract, github_membership, internals, roster
from .github_membership import Answer, Membership


class WorkshopGitHubOAuthenticator(GitHubOAuthenticator):
    """GitHubOAuthenticator that also lets in the GitHub usernames listed in a roster file.

    Organizations and ``org:team`` entries work as in GitHubOAuthenticator
    (``allowed_organizations``); admins (``admin_users``) are always let in. The roster is read
    again whenever the file changes, so participants can be added during the workshop without
    restarting the hub or anyone's server.

    A participant none of whose organizations and teams let them in reads why when GitHub said
    more than "not a member" (``github_membership.py``): GitHub could not be asked (rate limit,
    an error, no answer: "log in again in N minutes", HTTP 503), the organization hides its
    private members from unapproved OAuth apps, or the invitation is not accepted yet. The hub
    log gets one line with GitHub's answers. The login's first two requests (the token exchange
    and ``GET /user``) that GitHub does not answer get the same "log in again in N minutes".
    """

    membership_check_timeout = Float(
        10.0,
        help="""
        Seconds to wait for each of GitHub's answers about a participant's organization or team
        membership at login (e.g. 10). No answer in time: the participant is asked to log in
        again, never told they are not on the list. `http_request_kwargs`' `request_timeout`,
        when set, wins.
        """,
    ).tag(config=True)

    roster_file = Unicode(
        "",
        help="""
        A file of GitHub usernames allowed to log in, as docs/input-roster.md describes: one
        per line (`#` comments, `@name` and profile addresses are fine) or a registration
        export with a GitHub column, e.g. `/srv/jupyterhub/roster/roster.txt` (what `make
        roster` writes). Read again when it changes, with the reader `make roster` checks
        with; a file that cannot be read keeps the previous list (and the error is logged).
        Empty: no roster.
        """,
    ).tag(config=True, allow_config=True)  # counts as "who may log in" for the hub's check

    @validate("allowed_organizations")
    def _validate_allowed_organizations(self, proposal):
        """Each entry as the settings' check reads it (``contract.organization``): a team's
        display name ("my-org:My Team") is refused with its slug, not asked about at every
        login and never matched; GitHub's addresses become ORG or ORG:TEAM."""
        names, wrong = set(), []
        for entry in sorted(proposal.value):
            try:
                names.add(contract.organization(entry))
            except ValueError as error:
                wrong.append(str(error))
        if wrong:
            raise TraitError(f"{type(self).__name__}.allowed_organizations: " + "; ".join(wrong))
        return names

    access_check_interval = Float(
        30.0,
        help="""
        Seconds between the hub's checks that everyone with a running server or a recent login
        may still be here (on the roster, or a member of `allowed_organizations`, asked of
        GitHub with their own stored token); the access of those nothing lets in any more is
        ended: their logins end and their servers stop, their files kept (access.py). 30 stops
        a removed participant's server well within a minute. 0: only at their next login.
        Needs `enable_auth_state` (and a crypt key) for the organization checks.
        """,
    ).tag(config=True)

    @default("custom_403_message")
    def _default_custom_403_message(self):
        return (
            "Your GitHub account is not on this workshop's participant list. "
            "Ask an organizer to add your GitHub username to the roster (or the workshop's "
            "GitHub organization or team), then log in again."
        )

    _roster: frozenset[str] = frozenset()
    # the version (roster.version) of the file the names were read from, and of the last one
    # refused as no roster (RosterError: its text is wrong, so it is read again once it changes)
    _roster_version: tuple | None = None
    _roster_refused_version: tuple | None = None
    _roster_lock: asyncio.Lock | None = None

    async def roster_usernames(self) -> frozenset[str]:
        """The roster's usernames, re-read if the file changed since the last call.

        The file is read in a worker thread, so a large one (a file given by mistake) holds up
        no other request of the hub; logins that come while it is read wait for that reading
        instead of reading it again.
        """
        if not self.roster_file:
            return frozenset()
        try:
            version = roster.version(os.stat(self.roster_file))
        except FileNotFoundError:
            self.log.error("Roster %s does not exist; nobody is let in by it", self.roster_file)
            return frozenset()
        self._roster_lock = self._roster_lock or asyncio.Lock()
        async with self._roster_lock:  # a login before this one may be reading this version
            if version not in (self._roster_version, self._roster_refused_version):
                await self._reload_roster(version)
        return self._roster

    async def current_roster(self) -> frozenset[str] | None:
        """The roster's usernames as ``roster_usernames`` reads them, or None when no reading
        of the file in use succeeded (it is missing, or it never could be read): nobody then
        knows who is on it."""
        names = await self.roster_usernames()
        if not os.path.exists(self.roster_file) or self._roster_version is None:
            return None
        return names

    async def refresh_user(self, user, handler=None):
        """Whether ``user``'s login still holds (JupyterHub asks every ``auth_refresh_age``
        seconds on their requests, and before a spawn): the access check's judgement (access.py;
        never a "no" GitHub did not give). Without the check, a login holds until its cookie
        expires (oauthenticator's refresh would ask GitHub's ``/user`` instead, and turn its
        failures into error pages)."""
        check = getattr(self, "access_check", None)
        return True if check is None else await check.refresh(user)

    async def _reload_roster(self, version: tuple) -> None:
        """Read the roster off the event loop; a file that cannot be read keeps the names."""
        try:
            found = await asyncio.to_thread(roster.read, self.roster_file)
        except OSError as e:  # read again at the next login: a fixed permission is no change
            self.log.error("Roster not reloaded, keeping %d names: %s", len(self._roster), e)
        except roster.RosterError as e:
            self.log.error(
                "Roster not reloaded, keeping %d names: %s",
                len(self._roster),
                "; ".join(e.problems),
            )
            self._roster_refused_version = version
        else:
            self.log.info("Roster %s: %s", self.roster_file, found.describe())
            self._roster, self._roster_version = found.names, version

    async def get_token_info(self, handler, params):
        """oauthenticator's token exchange; see ``_unless_unanswered``."""
        try:
            return await super().get_token_info(handler, params)
        except (HTTPClientError, OSError) as e:
            self._unless_unanswered("the token exchange", e)
            raise

    async def token_to_user(self, token_info):
        """oauthenticator's ``GET /user``; see ``_unless_unanswered``."""
        try:
            return await super().token_to_user(token_info)
        except (HTTPClientError, OSError) as e:
            self._unless_unanswered("GET /user", e)
            raise

    def _unless_unanswered(self, step: str, error: Exception) -> None:
        """Raise the "log in again in N minutes" refusal (503) when ``error`` is GitHub not
        answering ``step`` (a rate limit, a 5xx, a timeout, no connection), which JupyterHub
        would show as "500 : Unhandled error"; return for any other error, which stands."""
        refused = github_membership.unanswered(step, _answer_of(error), time.time())
        if refused is not None:
            self.log.warning("%s", refused.get_message())
            raise refused from error

    async def check_allowed(self, username, auth_model):
        if username in await self.roster_usernames():
            return True
        # OAuthenticator's rules (admins, allowed_users); GitHubOAuthenticator's organization
        # check is replaced by the one below, which tells a refused member what happened
        if await internals.oauthenticator_check_allowed(self, username, auth_model):
            return True
        if not self.allowed_organizations:
            return False
        token = auth_model["auth_state"]["token_response"]
        answers = []
        for entry in sorted(self.allowed_organizations):
            answer = await self.membership(entry, username, token)
            if answer.state == github_membership.MEMBER:
                self.log.debug("%s is let in as a member of %s", username, entry)
                return True
            answers.append(answer)
        refused = github_membership.refusal(username, answers, self.client_id)
        if refused is None:
            self.log.warning(
                "Login of %s refused: not a member of %s, and not on the roster",
                username,
                " ".join(a.entry for a in answers),
            )
            return False
        self.log.warning("%s", refused.get_message())
        raise refused

    async def membership(self, entry: str, username: str, token: dict) -> Membership:
        """What GitHub says about ``username`` in ``entry`` (``org`` or ``org:team``), asked
        with their own token."""
        org, _, team = (quote(part, safe="") for part in entry.partition(":"))
        user = quote(username, safe="")
        if team:
            answer = await self._ask(f"/orgs/{org}/teams/{team}/memberships/{user}", token)
            return github_membership.read_membership(entry, answer, time.time())
        answer = await self._ask(f"/orgs/{org}/members/{user}", token)
        seen = github_membership.read_member_check(entry, answer, time.time())
        if seen is not None:
            return seen
        answer = await self._ask(f"/user/memberships/orgs/{org}", token)
        return github_membership.read_membership(entry, answer, time.time())

    async def _ask(self, path: str, token: dict) -> Answer:
        """GET ``path`` of GitHub's REST API with the participant's token; never raises."""
        headers = self.build_userdata_request_headers(
            token["access_token"], token.get("token_type", "bearer")
        )
        kwargs = {"request_timeout": self.membership_check_timeout, **self.http_request_kwargs}
        kwargs.update(headers=headers, validate_cert=self.validate_server_cert)
        try:
            response = await self.http_client.fetch(
                HTTPRequest(self.github_api + path, **kwargs), raise_error=False
            )
        except (HTTPClientError, OSError) as e:  # a timeout, no connection
            return _answer_of(e)
        return _answer(response)


def _answer(response: HTTPResponse) -> Answer:
    headers = {name.lower(): value for name, value in response.headers.get_all()}
    return Answer(response.code, headers, response.body or b"")


def _answer_of(error: Exception) -> Answer:
    """The answer an HTTP client's error carries (an error code), or none came (a timeout, no
    connection)."""
    response = getattr(error, "response", None)
    if response is not None:
        return _answer(response)
    return Answer(github_membership.NO_ANSWER, error=f"{type(error).__name__}: {error}")
