"""The participants' roster: GitHub usernames allowed to log in without organization membership.

GitHub limits how many organization invitations can be sent a day, so a workshop's list of
participants is often a file instead: one username per line, or a CSV export (a registration
form's) with a username column. Pure: text in, usernames or errors with line numbers out.
"""

from __future__ import annotations

import csv
import io
import re

# GitHub's rule: 1-39 letters, digits or single hyphens, not starting or ending with a hyphen.
_GITHUB_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}$")
# header names accepted for the username column of a CSV roster (compared case-insensitively)
USERNAME_COLUMNS = ("username", "github", "github_username", "github username", "login")


class RosterError(ValueError):
    """A roster that cannot be used; the message names the file's line and the fix."""


def _clean(value: str) -> str:
    value = value.strip()
    if value.startswith("https://github.com/"):
        value = value[len("https://github.com/") :].strip("/")
    return value.lstrip("@")


def _check(name: str, where: str) -> str:
    if not _GITHUB_LOGIN.match(name):
        raise RosterError(
            f"{where}: {name!r} is not a GitHub username "
            "(letters, digits and single hyphens, at most 39); fix or remove that line"
        )
    # JupyterHub lower-cases usernames; GitHub's are case-insensitive
    return name.lower()


def _from_csv(text: str, source: str) -> set[str]:
    rows = list(csv.reader(io.StringIO(text)))
    header = [h.strip().lower() for h in rows[0]]
    column = next((header.index(c) for c in USERNAME_COLUMNS if c in header), None)
    if column is None:
        raise RosterError(
            f"{source} line 1: no username column in the CSV header ({', '.join(rows[0])}); "
            f"name the column with GitHub usernames 'username'"
        )
    names = set()
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        cell = _clean(row[column]) if column < len(row) else ""
        if not cell:
            raise RosterError(f"{source} line {number}: the username column is empty")
        names.add(_check(cell, f"{source} line {number}"))
    return names


def parse(text: str, source: str = "roster") -> set[str]:
    """The lower-cased GitHub usernames in a roster: one per line (``#`` starts a comment,
    a leading ``@`` or a github.com profile URL is fine), or a CSV whose header has a
    ``username`` column."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    first = next((line for line in lines if line), "")
    if "," in first:
        return _from_csv(text, source)
    return {
        _check(_clean(line), f"{source} line {number}")
        for number, line in enumerate(lines, start=1)
        if line
    }
