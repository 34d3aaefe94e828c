"""GitHub login for a workshop: organizations, teams and a reloadable roster file."""

from __future__ import annotations

import os

from oauthenticator.github import GitHubOAuthenticator
from traitlets import Unicode, default

from . import roster


class WorkshopGitHubOAuthenticator(GitHubOAuthenticator):
    """GitHubOAuthenticator that also lets in the GitHub usernames listed in a roster file.

    Organizations and ``org:team`` entries work as in GitHubOAuthenticator
    (``allowed_organizations``); admins (``admin_users``) are always let in. The roster is read
    again whenever the file changes, so participants can be added during the workshop without
    restarting the hub or anyone's server.
    """

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

    @default("custom_403_message")
    def _default_custom_403_message(self):
        return (
            "Your GitHub account is not on this workshop's participant list. "
            "Ask an organizer to add your GitHub username to the roster (or the workshop's "
            "GitHub organization or team), then log in again."
        )

    _roster: frozenset[str] = frozenset()
    _roster_mtime: float | None = None

    def roster_usernames(self) -> frozenset[str]:
        """The roster's usernames, re-read if the file changed since the last call."""
        if not self.roster_file:
            return frozenset()
        try:
            mtime = os.stat(self.roster_file).st_mtime
        except FileNotFoundError:
            self.log.error("Roster %s does not exist; nobody is let in by it", self.roster_file)
            return frozenset()
        if mtime != self._roster_mtime:
            try:
                found = roster.read(self.roster_file)
            except OSError as e:
                self.log.error("Roster not reloaded, keeping %d names: %s", len(self._roster), e)
            except roster.RosterError as e:
                self.log.error(
                    "Roster not reloaded, keeping %d names: %s",
                    len(self._roster),
                    "; ".join(e.problems),
                )
            else:
                self.log.info("Roster %s: %s", self.roster_file, found.describe())
                self._roster, self._roster_mtime = found.names, mtime
        return self._roster

    async def check_allowed(self, username, auth_model):
        if username in self.roster_usernames():
            return True
        return await super().check_allowed(username, auth_model)
