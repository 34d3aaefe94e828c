"""The tutorial repositories an organizer lists (GPUHUB_TUTORIAL_REPOS), read by one rule.

Standard library only: the settings check (deploy.settings, run with a bare python3
before anything is installed) and the sync service read the setting with the same ``parse``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Repo:
    """A tutorial repository: ``name`` is its directory on the share."""

    name: str
    url: str
    branch: str = "main"
    poll: bool = True  # False: synced at start and on its push webhooks only

    @classmethod
    def parse(cls, text: str) -> Repo:
        """``NAME=URL[#BRANCH[:webhook]]``, e.g. ``intro=https://github.com/org/intro.git#main``.

        ``:webhook`` after the branch (a branch name never holds ``:``): never polled.
        """
        name, sep, rest = text.partition("=")
        url, _, branch = rest.partition("#")
        branch, colon, option = branch.partition(":")
        if not sep or not name.strip() or not url.strip():
            raise ValueError(f"cannot read {text!r}; write NAME=URL or NAME=URL#BRANCH")
        if "/" in name or name.startswith("."):
            raise ValueError(f"repository name {name!r} must be a plain directory name")
        if colon and option.strip() != "webhook":
            raise ValueError(
                f"cannot read {text!r}: after the branch only :webhook may follow "
                "(e.g. NAME=URL#main:webhook, never polled)"
            )
        return cls(name.strip(), url.strip(), branch.strip() or "main", poll=not colon)
