"""What GitHub's answers to the login's organization and team checks mean, and what a refused
participant and the organizer are told. Pure functions over recorded answers; the HTTP calls
are in ``auth.py``.

The hub asks with the participant's own OAuth token (scope ``read:org``), about themselves:

- ``GET /orgs/{org}/members/{user}``: 204 a member. 302 to ``/orgs/{org}/public_members/{user}``
  when the token may not see the organization's members (the HTTP client follows it: 204 a
  public member, 404 not); 404 not a member. On anything but 204 the hub asks why:
- ``GET /user/memberships/orgs/{org}``: 200 with ``state`` ``active`` or ``pending`` (invited,
  not accepted); 404 not a member; 403 "... has enabled OAuth App access restrictions ..." when
  the organization restricts OAuth apps (GitHub's default) and has not approved the hub's app:
  then GitHub hides a private member's membership from the hub.
- ``GET /orgs/{org}/teams/{team}/memberships/{user}`` for ``org:team``: 200 with ``state``,
  404, or that 403.

Any of them may be rate limited instead (403 or 429 with ``x-ratelimit-remaining: 0`` until
``x-ratelimit-reset``, or with ``retry-after`` seconds, or a "secondary rate limit" message)
or fail (5xx, a timeout, no connection): then nobody knows, and the participant is told to
try again, never that they are not on the list. The same holds for the login's own two
requests before these (oauthenticator's): the token exchange and ``GET /user`` (``unanswered``).
The wait is told in whole minutes (``wait_words``), the log and ``Retry-After`` keep GitHub's
seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from http import HTTPStatus

from tornado import web

MEMBER = "member"
NOT_MEMBER = "not a member"
INVITED = "invited"  # state "pending": invited, the invitation not accepted yet
HIDDEN = "hidden"  # the organization restricts OAuth apps and has not approved this one
REFUSED = "refused"  # GitHub refused to answer for another reason (SAML single sign-on, ...)
UNAVAILABLE = "unavailable"  # rate limited, a server error, no answer: try again

#: GitHub's words in the 403 it gives an OAuth app an organization has not approved.
RESTRICTED = "OAuth App access restrictions"

#: Seconds to wait when GitHub limits the rate and says no more (its documented minimum).
DEFAULT_RETRY_AFTER = 60

#: An answer that never came: a timeout or no connection (tornado's code for it).
NO_ANSWER = 599


@dataclass(frozen=True)
class Answer:
    """One answer of GitHub's REST API, as the hub received it."""

    code: int  # NO_ANSWER (599) when none came
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    body: bytes = b""
    error: str = ""  # why no answer came

    @property
    def message(self) -> str:
        """GitHub's ``message`` in a JSON error body ("" when there is none)."""
        try:
            payload = json.loads(self.body.decode("utf-8", "replace"))
        except ValueError:
            return ""
        message = payload.get("message") if isinstance(payload, dict) else None
        return " ".join(message.split()) if isinstance(message, str) else ""

    def json(self) -> dict:
        try:
            payload = json.loads(self.body.decode("utf-8", "replace"))
        except ValueError:
            return {}
        return payload if isinstance(payload, dict) else {}


@dataclass(frozen=True)
class Membership:
    """What GitHub said about one ``org`` or ``org:team`` entry of ``allowed_organizations``."""

    entry: str
    state: str  # one of MEMBER ... UNAVAILABLE
    detail: str = ""  # for the log: the answer's code and GitHub's message
    retry_after: int = 0  # UNAVAILABLE: seconds until asking again makes sense
    sso_url: str = ""  # REFUSED by SAML single sign-on: where to authorize the hub's app

    @property
    def org(self) -> str:
        return self.entry.split(":", 1)[0]


def rate_limited(answer: Answer) -> bool:
    """GitHub's rate limit answers: 403 or 429 with ``x-ratelimit-remaining: 0``, a
    ``retry-after``, or a message about a (secondary) rate limit."""
    if answer.code not in (403, 429):
        return False
    if answer.code == 429 or answer.headers.get("x-ratelimit-remaining") == "0":
        return True
    return "retry-after" in answer.headers or "rate limit" in answer.message.lower()


def retry_after(answer: Answer, now: float) -> int:
    """Seconds to wait before asking again, as GitHub documents it: ``retry-after`` seconds
    when given, else until ``x-ratelimit-reset`` (epoch seconds) when none remain, else a
    minute. At least 1."""
    try:
        return max(1, math.ceil(float(answer.headers["retry-after"])))
    except (KeyError, ValueError):
        pass
    if answer.headers.get("x-ratelimit-remaining") == "0":
        try:
            return max(1, math.ceil(float(answer.headers["x-ratelimit-reset"]) - now))
        except (KeyError, ValueError):
            pass
    return DEFAULT_RETRY_AFTER


def _said(answer: Answer) -> str:
    """The answer, for the log: ``403 "API rate limit exceeded ..."``."""
    if answer.code == NO_ANSWER:
        return f"no answer ({answer.error or 'timeout'})"
    message = answer.message
    return f"{answer.code} {message[:200]!r}" if message else str(answer.code)


def _failure(entry: str, answer: Answer, now: float) -> Membership | None:
    """The Membership of an answer that says nothing about membership; None otherwise."""
    if rate_limited(answer):
        wait = retry_after(answer, now)
        remaining = answer.headers.get("x-ratelimit-remaining")
        limits = f", x-ratelimit-remaining {remaining}" if remaining is not None else ""
        return Membership(
            entry,
            UNAVAILABLE,
            f"rate limited: {_said(answer)}{limits}, retry in {wait} s",
            retry_after=wait,
        )
    if answer.code == NO_ANSWER or answer.code >= 500:
        return Membership(
            entry,
            UNAVAILABLE,
            f"GitHub failed: {_said(answer)}",
            retry_after=DEFAULT_RETRY_AFTER if answer.code == 503 else 30,
        )
    if answer.code == 403 and RESTRICTED.lower() in answer.message.lower():
        return Membership(entry, HIDDEN, f"hidden by OAuth app restrictions: {_said(answer)}")
    if answer.code in (401, 403):
        return Membership(entry, REFUSED, _said(answer), sso_url=_sso_url(answer))
    return None


def _sso_url(answer: Answer) -> str:
    """The authorization URL in ``x-github-sso: required; url=...`` ("" when none)."""
    for part in answer.headers.get("x-github-sso", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == "url" and value.startswith("https://"):
            return value
    return ""


def read_member_check(entry: str, answer: Answer, now: float) -> Membership | None:
    """``GET /orgs/{org}/members/{user}``, redirects followed: a Membership, or None when the
    membership endpoint must be asked why the user is not seen as a member."""
    if answer.code == 204:
        return Membership(entry, MEMBER)
    failure = _failure(entry, answer, now)
    if failure is not None and failure.state == UNAVAILABLE:
        return failure
    return None  # 404, a 302 not followed, or a refusal the next answer explains


def read_membership(entry: str, answer: Answer, now: float) -> Membership:
    """``GET /user/memberships/orgs/{org}`` or ``/orgs/{org}/teams/{team}/memberships/{user}``."""
    if answer.code == 200:
        state = answer.json().get("state")
        if state == "active":
            return Membership(entry, MEMBER)
        if state == "pending":
            return Membership(entry, INVITED, "invited (state pending), not accepted yet")
        return Membership(entry, REFUSED, f"unexpected state {state!r} in {_said(answer)}")
    if answer.code == 404:
        return Membership(entry, NOT_MEMBER, _said(answer))
    failure = _failure(entry, answer, now)
    if failure is not None:
        return failure
    return Membership(entry, REFUSED, f"unexpected answer {_said(answer)}")


class LoginRefused(web.HTTPError):
    """A login GitHub's answers did not let in, with what happened. JupyterHub's error page
    shows ``jupyterhub_message`` under the code's own phrase ("503 : Service Unavailable": the
    page's heading is the log message when no ``reason`` is given) and sends ``headers``; the
    log gets ``get_message()``."""

    def __init__(self, status_code: int, message: str, log_message: str, headers=None):
        super().__init__(status_code, log_message, reason=HTTPStatus(status_code).phrase)
        self.jupyterhub_message = message
        self.headers = headers or {}


def wait_words(seconds: float) -> str:
    """A wait as a participant reads it: whole minutes, rounded up, at least one ("1 minute",
    "2 minutes"), never "0 minutes" or a count of seconds."""
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes} minute" if minutes == 1 else f"{minutes} minutes"


def _try_again(wait: int) -> str:
    return f"Please log in again in {wait_words(wait)}."


#: The login's own requests to GitHub (oauthenticator makes them): what the participant is told
#: GitHub could not be asked, by the name the log gives the request.
LOGIN_STEPS = {
    "the token exchange": "to confirm your login",
    "GET /user": "who you are",
}


def unanswered(step: str, answer: Answer, now: float) -> LoginRefused | None:
    """The refusal for one of the login's own requests (``LOGIN_STEPS``) that GitHub did not
    answer: rate limited, a server error, no answer (503, log in again later, as for the
    membership checks). None for any other answer, whose own error stands."""
    failure = _failure(step, answer, now)
    if failure is None or failure.state != UNAVAILABLE:
        return None
    wait = failure.retry_after
    return LoginRefused(
        503,
        f"GitHub could not be asked {LOGIN_STEPS[step]} just now. {_try_again(wait)}",
        f"Login not decided, asked to retry in {wait} s: {step}: {failure.detail}",
        {"Retry-After": str(wait)},
    )


def _names(entries: list[str]) -> str:
    return entries[0] if len(entries) == 1 else ", ".join(entries[:-1]) + " or " + entries[-1]


def refusal(username: str, answers: list[Membership], client_id: str = "") -> LoginRefused | None:
    """What to tell a participant none of whose entries said "member", and the organizer's one
    log line; None when every entry plainly said "not a member" (the roster message stands)."""
    if all(a.state == NOT_MEMBER for a in answers):
        return None
    said = {state: [a for a in answers if a.state == state] for state in (UNAVAILABLE, HIDDEN)}
    parts = []
    if said[UNAVAILABLE]:
        wait = max(a.retry_after for a in said[UNAVAILABLE])
        parts.append(
            "GitHub could not be asked whether you are a member of "
            f"{_names([a.entry for a in said[UNAVAILABLE]])} just now. {_try_again(wait)}"
        )
    for a in said[HIDDEN]:
        request = (
            f" (you can request it at https://github.com/settings/connections/applications/"
            f"{client_id})"
            if client_id
            else ""
        )
        parts.append(
            f"GitHub does not tell this hub whether you are a member of {a.entry}: the "
            f"organization {a.org} restricts third-party (OAuth) apps and has not approved "
            "this hub's. If you are a member, make your membership of "
            f"{a.org} public at https://github.com/orgs/{a.org}/people, or ask an owner of "
            f"{a.org} to approve the app{request}; then log in again."
        )
    for a in answers:
        if a.state == INVITED:
            parts.append(
                f"You are invited to {a.entry} but have not accepted yet: accept at "
                f"https://github.com/orgs/{a.org}/invitation, then log in again."
            )
        elif a.state == REFUSED:
            where = f" (authorize this hub for {a.org} at {a.sso_url})" if a.sso_url else ""
            parts.append(
                f"GitHub would not say whether you are a member of {a.entry}{where}: "
                f"{a.detail}. Ask an organizer."
            )
    log = "; ".join(
        f"{a.entry}: {a.state}" + (f" ({a.detail})" if a.detail else "") for a in answers
    )
    if said[UNAVAILABLE]:
        wait = max(a.retry_after for a in said[UNAVAILABLE])
        return LoginRefused(
            503,
            " ".join(parts),
            f"Login of {username} not decided, asked to retry in {wait} s: {log}",
            {"Retry-After": str(wait)},
        )
    return LoginRefused(403, " ".join(parts), f"Login of {username} refused: {log}")
