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
        A file of GitHub usernames allowed to log in: one per line (`#` comments, a leading
        `@` is fine) or a CSV with a `username` column, e.g. `/srv/jupyterhub/roster/roster.txt`.
        Read again when it changes. A file that cannot be parsed keeps the previous list
        (and the error is logged); empty: no roster.
        """,
    ).tag(config=True, allow_config=True)  # counts as "who may log in" for the hub's check

    @default("custom_403_message")
    def _default_custom_403_message(self):
        return (
            "Your GitHub account is not on this workshop's participant list. "
            "Ask an organizer to add your GitHub username to the roster (or the workshop's "
            "GitHub organization or team), then log in again."
        )

    _roster: set[str] = set()
    _roster_mtime: float | None = None

    def roster_usernames(self) -> set[str]:
        """The roster's usernames, re-read if the file changed since the last call."""
        if not self.roster_file:
            return set()
        try:
            mtime = os.stat(self.roster_file).st_mtime
        except FileNotFoundError:
            self.log.error("Roster %s does not exist; nobody is let in by it", self.roster_file)
            return set()
        if mtime != self._roster_mtime:
            try:
                with open(self.roster_file, encoding="utf-8") as f:
                    names = roster.parse(f.read(), self.roster_file)
            except (OSError, UnicodeDecodeError, roster.RosterError) as e:
                self.log.error("Roster not reloaded, keeping %d names: %s", len(self._roster), e)
            else:
                self.log.info("Roster %s: %d GitHub usernames", self.roster_file, len(names))
                self._roster, self._roster_mtime = names, mtime
        return self._roster

    async def check_allowed(self, username, auth_model):
        if username in self.roster_usernames():
            return True
        return await super().check_allowed(username, auth_model)
