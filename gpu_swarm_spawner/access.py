"""Access ends when the organizer says so, not at the participant's next login.

Every ``access_check_interval`` seconds (and once when the hub has started) the hub asks again,
for each participant who has a server running or was active in the hub lately, whether they
may still be here: on the roster (read again when the file changed), or a member of one of
``allowed_organizations`` (asked of GitHub with the participant's own token, which the hub
keeps encrypted in their ``auth_state``). Someone nothing lets in any more has their access
ended: every login of theirs ended (their browsers' hub cookies and every API and OAuth token,
``internals.end_sessions``) and their servers stopped the way JupyterHub stops one (the proxy's
route removed, then the spawner's stop; the home is kept). The log gets one line per person,
with the reason. Their next page is the login page, and logging in again shows the
authenticator's "not on the participant list" page.

What GitHub could not answer (a rate limit, an error, no answer, an organization that hides
memberships from the hub, no token stored) never ends anyone's access: they are kept, and the
log says so once. Admins are never removed.

``judge`` is the decision, a pure function of the person, the rules and GitHub's answers; the
I/O (GitHub, the hub's users, the stop) is in ``AccessCheck``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from jupyterhub import orm

from . import github_membership, internals, periodic
from .github_membership import Membership

KEEP = "keep"
REMOVE = "remove"
UNSURE = "unsure"  # kept: nobody could say

#: Participants without a server are checked while they were active in the hub this lately
#: (JupyterHub records a browser's activity at most every 30 s); others are asked at their
#: next request (``refresh``).
RECENTLY_ACTIVE = timedelta(minutes=15)
#: GitHub answers asked at once in a round (each with its participant's own token).
CONCURRENT_ASKS = 8
#: GitHub is taken as failing (a 5xx, no answer, every token limited) after this many answers
#: in a row gave no answer: nobody else is asked in that round.
FAILING_AFTER = 3
#: What the states of a definite "no" are: not a member, or invited and not accepted.
NOT_IN = (github_membership.NOT_MEMBER, github_membership.INVITED)


@dataclass(frozen=True)
class Rules:
    """Who may be here, as the authenticator says at login."""

    roster: frozenset[str] | None = frozenset()  # None: the roster in use could not be read
    roster_in_use: bool = False
    entries: tuple[str, ...] = ()  # allowed_organizations: "org" and "org:team"
    allowed: frozenset[str] = frozenset()  # allowed_users
    allow_all: bool = False


@dataclass(frozen=True)
class Judgement:
    name: str
    state: str  # KEEP, REMOVE or UNSURE
    reason: str = ""  # REMOVE: why, for the log; UNSURE: what could not be said


def needs_github(name: str, admin: bool, rules: Rules) -> bool:
    """Whether GitHub must be asked about ``name``: nothing cheaper lets them in."""
    if admin or rules.allow_all or name in rules.allowed:
        return False
    if rules.roster_in_use and (rules.roster is None or name in rules.roster):
        return False
    return bool(rules.entries)


ROSTER = "the roster"


def judge(
    name: str, admin: bool, rules: Rules, answers: list[Membership] | None, before: str = ""
) -> Judgement:
    """Whether ``name`` stays. ``answers``: GitHub's, for the entries asked (the last one asked
    may be the first "member"); None when GitHub was not asked (no token stored, or GitHub was
    failing this round). ``before``: what let them in at the last check (ROSTER or an entry;
    "" when unknown), for the reason. A KEEP's reason says what lets them in."""
    if admin or rules.allow_all or name in rules.allowed:
        return Judgement(name, KEEP)
    if rules.roster_in_use:
        if rules.roster is None:
            return Judgement(name, UNSURE, "the roster could not be read")
        if name in rules.roster:
            return Judgement(name, KEEP, ROSTER)
    if not rules.entries and not rules.roster_in_use:
        return Judgement(name, KEEP)  # neither a roster nor organizations: nothing to check
    if rules.entries:
        if answers is None:
            return Judgement(name, UNSURE, "GitHub was not asked (no token of theirs is stored)")
        member = [a.entry for a in answers if a.state == github_membership.MEMBER]
        if member:
            return Judgement(name, KEEP, member[0])
        unsure = [a for a in answers if a.state not in NOT_IN]
        if unsure or {a.entry for a in answers} != set(rules.entries):
            said = "; ".join(f"{a.entry}: {a.state} ({a.detail})" for a in unsure)
            return Judgement(name, UNSURE, f"GitHub did not say: {said or 'not every entry'}")
    return Judgement(name, REMOVE, removal_reason(rules, before))


def removal_reason(rules: Rules, before: str) -> str:
    """Why someone is removed, for the log: first what let them in before, when known."""
    entries = " or ".join(rules.entries)
    if before == ROSTER or (rules.roster_in_use and not rules.entries):
        return "not on the roster any more" + (f", nor a member of {entries}" if entries else "")
    roster = ", nor on the roster" if rules.roster_in_use else ""
    if before in rules.entries:
        others = [e for e in rules.entries if e != before]
        also = f", nor of {' or '.join(others)}" if others else ""
        return f"no longer a member of {before}{also}{roster}"
    return f"not a member of {entries}{roster}"


def to_check(users, now: datetime, ended: dict[str, datetime]) -> list:
    """The hub's users whose access the round checks: those with a server running or starting,
    and those active in the hub within RECENTLY_ACTIVE, unless their access was ended and they
    were not seen since."""
    chosen = []
    for user in users:
        seen = user.last_activity
        if seen is not None and seen.tzinfo is None:
            seen = seen.replace(tzinfo=timezone.utc)  # JupyterHub's columns are naive UTC
        if user.name in ended and not user.active and (seen is None or seen <= ended[user.name]):
            continue
        if user.active or (seen is not None and now - seen <= RECENTLY_ACTIVE):
            chosen.append(user)
    return chosen


@dataclass
class Round:
    """One check's answers (each participant judged once)."""

    started: float
    judged: dict[str, Judgement] = field(default_factory=dict)
    unavailable: int = 0  # GitHub's answers in a row that were no answer (UNAVAILABLE)
    github_failing: str = ""  # GitHub is failing: nobody else is asked this round


class AccessCheck:
    """The periodic check of one hub, with its authenticator (WorkshopGitHubOAuthenticator)."""

    def __init__(self, hub, authenticator, interval: float):
        self.hub = hub
        self.authenticator = authenticator
        self.interval = interval
        self.log = authenticator.log
        self.round = Round(0.0)
        self.finished: dict[str, Judgement] = {}  # the last finished round's judgements
        self.ended: dict[str, datetime] = {}  # name: when their access was ended
        self.let_in: dict[str, str] = {}  # name: what let them in at the last check
        self._said_unsure: frozenset[str] = frozenset()  # who the last such line named

    # ---- the rules and GitHub's answers ----------------------------------------------------

    async def rules(self) -> Rules:
        auth = self.authenticator
        roster_in_use = bool(auth.roster_file)
        return Rules(
            roster=await auth.current_roster() if roster_in_use else frozenset(),
            roster_in_use=roster_in_use,
            entries=tuple(sorted(auth.allowed_organizations)),
            allowed=frozenset(auth.allowed_users),
            allow_all=bool(auth.allow_all),
        )

    async def ask(self, name: str, token: dict | None, entries: tuple[str, ...]):
        """GitHub's answers about ``name``, entry by entry until one says "member" (or GitHub
        cannot be asked); None when it is not asked."""
        if token is None:
            return None
        if self.round.github_failing:
            failing = f"not asked: {self.round.github_failing}"
            return [Membership(e, github_membership.UNAVAILABLE, failing) for e in entries]
        answers = []
        for entry in entries:
            answer = await self.authenticator.membership(entry, name, token)
            answers.append(answer)
            if answer.state == github_membership.MEMBER:
                break
            if answer.state == github_membership.UNAVAILABLE:
                self.round.unavailable += 1
                if self.round.unavailable >= FAILING_AFTER:
                    self.round.github_failing = answer.detail
                break
            self.round.unavailable = 0
        return answers

    async def judge_user(self, user, rules: Rules) -> Judgement:
        """This round's judgement of ``user`` (asked once per round)."""
        if user.name in self.round.judged:
            return self.round.judged[user.name]
        admin = bool(user.admin) or user.name in self.authenticator.admin_users
        answers = None
        if needs_github(user.name, admin, rules):
            state = await user.get_auth_state() or {}
            answers = await self.ask(user.name, state.get("token_response"), rules.entries)
        judged = judge(user.name, admin, rules, answers, self.let_in.get(user.name, ""))
        if judged.state == KEEP and judged.reason:
            self.let_in[user.name] = judged.reason
        self.round.judged[user.name] = judged
        return judged

    # ---- the round ---------------------------------------------------------------------------

    async def check(self) -> list[Judgement]:
        """One round: every participant to check judged, and the access of those nothing lets
        in any more ended. Returns the removals."""
        self.round = Round(time.monotonic())
        rules = await self.rules()
        everyone = [self.hub.users[u] for u in self.hub.db.query(orm.User)]
        users = to_check(everyone, datetime.now(timezone.utc), self.ended)
        limit = asyncio.Semaphore(CONCURRENT_ASKS)

        async def judged(user):
            async with limit:
                return user, await self.judge_user(user, rules)

        removed, unsure = [], []
        for user, judgement in await asyncio.gather(*(judged(u) for u in users)):
            if judgement.state == UNSURE:
                unsure.append(judgement)
            elif judgement.state == REMOVE:
                await self.end_access(user, judgement.reason)
                removed.append(judgement)
            else:  # let in (back on the roster, say): a later removal is ended anew
                self.ended.pop(user.name, None)
        self._say_unsure(unsure)
        self.finished = self.round.judged
        return removed

    def _say_unsure(self, unsure: list[Judgement]) -> None:
        """One line when who could not be checked changed since the last round."""
        names = frozenset(j.name for j in unsure)
        if names and names != self._said_unsure:
            shown = "; ".join(f"{j.name}: {j.reason}" for j in unsure[:5])
            more = f"; and {len(unsure) - 5} more" if len(unsure) > 5 else ""
            self.log.warning(
                "Access kept, not checked, of %d participant(s): %s%s", len(unsure), shown, more
            )
        self._said_unsure = names

    async def end_access(self, user, reason: str) -> None:
        """Every login of ``user`` ended and their servers stopped (their home kept)."""
        tokens = internals.end_sessions(user)
        stopped = []
        for server_name, spawner in list(user.spawners.items()):
            if not spawner.active:
                continue
            if spawner.pending:  # starting or stopping: stopped at the next round
                self.log.info("%s: %s, so the next check stops it", spawner.pending, user.name)
                continue
            await internals.stop_server(self.hub, user, server_name)
            stopped.append(server_name or "their server")
        self.ended[user.name] = datetime.now(timezone.utc)
        self.log.warning(
            "Access of %s ended: %s; logins ended (%d token(s) removed), %s",
            user.name,
            reason,
            tokens,
            f"stopped {', '.join(stopped)} (files kept)" if stopped else "no server was running",
        )

    async def keep(self) -> None:
        """The check at once, then every ``interval`` seconds (``periodic.keep``)."""
        await periodic.keep(lambda: self.check(), self.interval, self.log, "access check")

    # ---- a request of the user's -------------------------------------------------------------

    async def refresh(self, user) -> bool:
        """Whether ``user``'s request may go on (the authenticator's ``refresh_user``, on their
        requests and before their spawns): not when the last finished round found nothing lets
        them in. Read from memory, never asking GitHub, so no request or spawn waits for it; who
        was not in that round (away for a while) is in the next, their request being activity."""
        judged = self.finished.get(user.name)
        return judged is None or judged.state != REMOVE


def start(hub) -> None:
    """Start the hub's access check when its authenticator has one (``access_check_interval``
    above 0): called once JupyterHub has started (``internals.after_hub_start``)."""
    authenticator = hub.authenticator
    interval = getattr(authenticator, "access_check_interval", 0)
    if not interval:
        return
    check = AccessCheck(hub, authenticator, interval)
    authenticator.access_check = check
    hub.gpuhub_access_check = asyncio.ensure_future(check.keep())


def install() -> None:
    """Start the access check once JupyterHub has started (from the hub's config). Idempotent."""
    internals.after_hub_start(start)
