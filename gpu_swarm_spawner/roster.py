"""The participants' roster: GitHub usernames allowed to log in without organization membership.

GitHub limits how many organization invitations can be sent a day, so a workshop's list of
participants is often a file instead: usernames one per line (or separated by commas), or a
registration form's export (Excel, Google Forms, Microsoft Forms) with a GitHub column.

``read(path)`` is the one reader: the deploy's check (deploy/settings.py's ``read_roster``)
and the hub (auth.py) both call it, and `make roster` hands the hub ``text(roster)``, the
usernames it found and nothing else of the export. Pure but for ``read``: bytes in, a
``Roster`` or a ``RosterError`` out, whose problems name the line, what is wrong and the fix,
one line per kind of problem. docs/input-roster.md is the organizer's side of this module.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: GitHub's limit on a username's length.
MAX_LOGIN = 39
# Letters, digits and hyphens, not starting with a hyphen. GitHub refuses new usernames with a
# trailing or doubled hyphen, but older accounts have them (`name-`, `a--b`) and log in.
_LOGIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
_PROFILE = re.compile(r"^(?:https?://)?(?:www\.)?github\.com(?:/(?P<path>[^?#]*))?(?:[?#].*)?$")
_NOREPLY = re.compile(r"^(?:\d+\+)?(?P<login>[A-Za-z0-9-]+)@users\.noreply\.github\.com$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# github.com/orgs/..., github.com/settings/...: pages of GitHub, not accounts
_NOT_ACCOUNTS = {"orgs", "users", "settings", "sponsors", "apps", "marketplace", "topics"}
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://|^www\.", re.IGNORECASE)
# Whitespace a copy from a web page or a spreadsheet leaves around a cell: str.strip() keeps
# the zero-width space and a stray byte-order mark.
_AROUND = " \t\r\n\f\v\u00a0\u200b\u2060\ufeff"
_SEPARATORS = re.compile(r"[,;\t]")
_DELIMITERS = (",", ";", "\t")
_EXCEL_SEP = re.compile(r"^sep=(.)\s*$", re.IGNORECASE)

# A column holding GitHub usernames, by its header (lower-cased, punctuation and the words of a
# question dropped): these names are taken over any other column that mentions GitHub.
_GITHUB_HEADERS = {
    "github", "github username", "github user name", "github user", "github login",
    "github handle", "github account", "github id", "github name", "github profile",
    "github profile url", "github profile link", "github url", "github benutzername",
    "github nutzername", "github konto", "username github", "nom d utilisateur github",
    "utilisateur github", "compte github", "usuario github", "usuario de github",
    "nombre de usuario de github",
}  # fmt: skip
# A column that may hold GitHub usernames though it does not say so: taken only when it is
# the only one and no column mentions GitHub (a university's "Username" is not a GitHub login).
_LOGIN_HEADERS = {"username", "user name", "user", "login", "handle", "benutzername"}
# a question's words around the column's name ("What is your GitHub username?")
_QUESTION_WORDS = {
    "what", "whats", "is", "s", "your", "my", "please", "enter", "the", "give", "provide",
    "write", "here", "ihr", "dein", "deinen", "ihren", "votre", "ton", "tu", "su",
}  # fmt: skip
_MENTIONS_GITHUB = re.compile(r"git\s*hub", re.IGNORECASE)

CSV_FIX = (
    "open it and save it as 'CSV UTF-8 (Comma delimited)' (Excel: File > Save As; LibreOffice:"
    " File > Save As > Text CSV; Google Sheets: File > Download > Comma-separated values), "
    "then name that file"
)


@dataclass(frozen=True)
class Roster:
    """The lower-cased GitHub usernames of a roster, and where in the file they were found."""

    names: frozenset[str]
    #: the table column read, as ``C 'GitHub username'``; "" for a list of usernames
    column: str = ""

    def describe(self) -> str:
        """``12 GitHub usernames`` and, for a table, ``from column C 'GitHub'``."""
        said = f"{len(self.names)} GitHub username{'' if len(self.names) == 1 else 's'}"
        return f"{said} (from column {self.column})" if self.column else said


class RosterError(ValueError):
    """A roster that cannot be used. ``problems`` holds one line each, naming the file's line,
    what is wrong and the fix; ``str()`` is all of them, one per line."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class _Bad(ValueError):
    """One value that is not a GitHub username; ``kind`` groups the lines with one fix."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ---- one username -----------------------------------------------------------------------------


def _login(value: str, in_table: bool = False) -> str:
    """The lower-cased GitHub username that ``value`` names: itself, with a leading ``@``, or
    a profile address (``https://github.com/ada``); raises _Bad saying why not and the fix."""
    fix = "fix it or delete that row" if in_table else "fix it or delete it"
    name = value.strip(_AROUND)
    if name.startswith("@"):
        name = name[1:]
    profile = _PROFILE.match(name)
    if profile:
        parts = [p for p in (profile["path"] or "").split("/") if p]
        if len(parts) != 1:
            owner = f" ({parts[0]!r})" if parts and parts[0] not in _NOT_ACCOUNTS else ""
            raise _Bad(
                "address",
                f"{value!r} is not a GitHub username but an address on GitHub other than a "
                f"profile (https://github.com/NAME); write just the account's username{owner}",
            )
        name = parts[0]
    elif _URL.match(name):
        raise _Bad(
            "url",
            f"{value!r} is not a GitHub username but a web address; write just the username "
            "(or the profile address https://github.com/NAME)",
        )
    noreply = _NOREPLY.match(name)
    if noreply:
        name = noreply["login"]
    elif _EMAIL.match(name):
        raise _Bad(
            "email",
            f"{value!r} is not a GitHub username but an email address; ask for the GitHub "
            "username (each participant's is shown at https://github.com/settings/profile)",
        )
    if any(ch.isspace() for ch in name):
        raise _Bad(
            "space",
            f"{value!r} is not a GitHub username: it has a space (a person's name?); "
            + (
                "write the participant's GitHub username there"
                if in_table
                else "write one username per line, or separate them with commas"
            ),
        )
    if len(name) > MAX_LOGIN:
        raise _Bad(
            "long",
            f"{value!r} is not a GitHub username: it is longer than {MAX_LOGIN} characters; {fix}",
        )
    if not _LOGIN.match(name):
        raise _Bad(
            "characters",
            f"{value!r} is not a GitHub username: only letters, digits and hyphens, not "
            f"starting with a hyphen; {fix}",
        )
    # JupyterHub lower-cases usernames; GitHub's are case-insensitive
    return name.lower()


# ---- the file -------------------------------------------------------------------------------


def version(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    """What tells one content of a roster file from another without reading it: its file (device,
    inode: a new file moved into place), size, and modification and change times in nanoseconds.
    The modification time alone misses a copy that keeps the old one (``cp -p``, ``rsync -t``, an
    unpacked archive) and two saves within one tick of a coarse clock (FAT, some network shares);
    the change time moves with any write or rename and cannot be set back."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def read(path: str | Path) -> Roster:
    """The roster in the file at ``path``; raises OSError, or RosterError with its problems."""
    return parse_bytes(Path(path).read_bytes(), str(path))


def parse_bytes(data: bytes, source: str = "roster") -> Roster:
    """The roster in a file's bytes: UTF-8 with or without a byte-order mark, UTF-16 with one
    (Excel's "Unicode Text"), else Windows-1252 (Excel's "CSV" on Windows)."""
    return parse(decode(data, source), source)


def _container(data: bytes, source: str) -> str | None:
    """What a zip file given as a roster is, with the fix."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.namelist()
    except (zipfile.BadZipFile, ValueError):
        return f"{source}: is a zip file, not text; {CSV_FIX}"
    if any(m.startswith("xl/") for m in members):
        return f"{source}: is an Excel workbook (.xlsx), not a CSV; {CSV_FIX}"
    if any(m.startswith("word/") for m in members):
        return f"{source}: is a Word document (.docx), not a CSV; {CSV_FIX}"
    if "content.xml" in members:
        return f"{source}: is an OpenDocument spreadsheet (.ods), not a CSV; {CSV_FIX}"
    csvs = [m for m in members if m.lower().endswith((".csv", ".tsv", ".txt"))]
    if len(csvs) == 1:
        return (
            f"{source}: is a zip archive holding {csvs[0]!r} (Google Forms downloads "
            "responses so); unzip it and name that file"
        )
    return f"{source}: is a zip archive, not text; unzip it and name the CSV inside"


def decode(data: bytes, source: str = "roster") -> str:
    """The text of a roster file, or RosterError when it is no text (a workbook, a PDF)."""
    if data.startswith(b"PK\x03\x04") or data.startswith(b"PK\x05\x06"):
        raise RosterError(_container(data, source))
    if data.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        raise RosterError(f"{source}: is an Excel 97-2003 workbook (.xls), not a CSV; {CSV_FIX}")
    if data.startswith(b"%PDF-"):
        raise RosterError(f"{source}: is a PDF, not text; export the list as CSV and name that")
    if data.startswith(b"{\\rtf"):
        raise RosterError(
            f"{source}: is a rich-text document (RTF, TextEdit's default); save it as plain "
            "text (TextEdit: Format > Make Plain Text) and name that"
        )
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        text = data.decode("utf-32", errors="replace")
    elif data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        text = data.decode("utf-16", errors="replace")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            # not UTF-8: Excel's "CSV (Comma delimited)" on Windows writes Windows-1252;
            # usernames are ASCII, so only the other columns could read wrong
            text = data.decode("cp1252", errors="replace")
    if "\x00" in text:
        raise RosterError(
            f"{source}: holds NUL characters, so it is not text (or UTF-16 without a byte-order"
            f" mark); {CSV_FIX}"
        )
    start = text.lstrip(_AROUND)[:15].lower()
    if start.startswith(("<!doctype html", "<html")):
        raise RosterError(
            f"{source}: is a web page (HTML), not a CSV (a shared sheet's link gives its page);"
            " download the sheet itself: Google Sheets: File > Download > Comma-separated values"
        )
    return text


def _records(text: str, delimiter: str, limit: int | None = None):
    """(line number, cells) of each row that is neither blank nor a comment (``#`` first)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    out, last = [], 0
    while limit is None or len(out) < limit:
        try:
            row = next(reader)
        except StopIteration:
            break
        start, last = last + 1, reader.line_num
        if not any(cell.strip(_AROUND) for cell in row):
            continue
        if row[0].lstrip(_AROUND).startswith("#"):
            continue
        out.append((start, row))
    return out


def _records_or_refuse(text: str, delimiter: str, source: str, limit: int | None = None):
    try:
        return _records(text, delimiter, limit)
    except csv.Error as e:  # a huge cell: a quote that never closes, or no CSV at all
        raise RosterError(
            f'{source}: cannot be read as a table ({e}): a quote (") opens a cell that never '
            f"closes, or this is no roster; close the quote, or {CSV_FIX}"
        ) from None


def _unclosed_quote(text: str, delimiter: str) -> int | None:
    """The line of a quote that opens a cell and never closes (the csv module then reads the
    rest of the file as that cell, rows and all), or None."""
    line, quoted, opened, field_start, skip = 1, False, 0, 0, -1
    for token in re.finditer(rf'"|\r\n|\r|\n|{re.escape(delimiter)}', text):
        at = token.start()
        if at == skip:  # the second quote of "" inside a quoted cell
            continue
        if token[0] == '"':
            if quoted and text.startswith('"', at + 1):
                skip = at + 1
            elif quoted:
                quoted = False
            elif at == field_start:
                quoted, opened = True, line
        elif token[0] != delimiter:
            line += 1
        if not quoted and token[0] != '"':
            field_start = token.end()
    return opened if quoted else None


def _delimiter(text: str, source: str) -> str:
    """The delimiter under which the first rows line up best (the most rows as wide as the
    header, then the widest header)."""
    best, score = ",", (0, 1)
    for delimiter in _DELIMITERS:
        rows = _records_or_refuse(text, delimiter, source, limit=50)
        width = len(rows[0][1]) if rows else 1
        if width < 2:
            continue
        candidate = (sum(len(cells) == width for _, cells in rows), width)
        if candidate > score:
            best, score = delimiter, candidate
    return best


def _words(header: str) -> str:
    header = re.sub(r"\([^)]*\)|\[[^\]]*\]", " ", header.lower())
    words = re.findall(r"[^\W_]+", header)
    return " ".join(w for w in words if w not in _QUESTION_WORDS)


def _letter(index: int) -> str:
    """Excel's name of a column: A, B, ..., Z, AA, ..."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def _named(header: list[str], indexes: list[int]) -> str:
    return ", ".join(f"{_letter(i)} {header[i].strip(_AROUND)!r}" for i in indexes)


def _column(header: list[str], line: int, source: str) -> int | None:
    """The column of GitHub usernames: the one whose header says so; None when no header
    names one; RosterError when several could be it."""
    words = [_words(h) for h in header]
    exact = [i for i, w in enumerate(words) if w in _GITHUB_HEADERS]
    # "github-fan" or https://github.com/ada is a participant (a list on one line), not a header
    mentions = [i for i, h in enumerate(header) if _MENTIONS_GITHUB.search(h) and not _is_login(h)]
    generic = [i for i, w in enumerate(words) if w in _LOGIN_HEADERS]
    for found in (exact, mentions, generic):
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            which = "name GitHub" if found is not generic else "could hold GitHub usernames"
            raise RosterError(
                f"{source} line {line}: several columns {which} ({_named(header, found)}), so "
                "which holds the participants' GitHub usernames is not clear; name that column "
                "'GitHub' and rename or delete the others"
            )
    return None


def _is_login(value: str) -> bool:
    try:
        _login(value)
    except _Bad:
        return False
    return True


def _one_column_header(cell: str) -> bool:
    """Whether the first line of a one-column file is its header, not a participant."""
    words = _words(cell)
    if words in _GITHUB_HEADERS or words in _LOGIN_HEADERS:
        return True
    return bool(_MENTIONS_GITHUB.search(cell)) and not _is_login(cell)


class _Problems:
    """The problems found, one line per kind (a handful: see ``_login``): its first line and
    value, then the next three lines of that kind and how many more."""

    def __init__(self, source: str):
        self.source = source
        self.kinds: dict[str, tuple[str, list[int]]] = {}

    def add(self, kind: str, line: int, message: str) -> None:
        first = self.kinds.setdefault(kind, (message, []))
        first[1].append(line)

    def lines(self) -> list[str]:
        out = []
        for message, lines in self.kinds.values():
            also = ""
            if len(lines) > 1:
                shown = ", ".join(map(str, lines[1:4]))
                more = f" and {len(lines) - 4} more" if len(lines) > 4 else ""
                also = f" (and line{'s' if len(lines) > 2 else ''} {shown}{more})"
            out.append(f"{self.source} line {lines[0]}{also}: {message}")
        return out


def _unquoted(line: str) -> str:
    """A list's line written as a quoted CSV cell (R's write.csv, LibreOffice's "quote all text
    cells" write a one-column file so): the text inside the quotes; any other line as it is."""
    bare = line.strip(_AROUND)
    if len(bare) > 1 and bare[0] == bare[-1] == '"':
        return bare[1:-1].replace('""', '"')
    return line


def _take(cell: str, line: int, names: set[str], problems: _Problems, in_table: bool) -> None:
    for value in _SEPARATORS.split(cell):
        if not value.strip(_AROUND):
            continue
        try:
            names.add(_login(value, in_table))
        except _Bad as e:
            problems.add(e.kind, line, str(e))


def parse(text: str, source: str = "roster") -> Roster:
    """The roster in a file's text: either a list (one username per line or several separated
    by commas, ``#`` starts a comment, ``@name`` and profile addresses are fine) or a table
    (CSV, ``;``- or tab-separated) whose header names its GitHub column."""
    lines = re.split(r"\r\n|\r|\n", text)
    excel = _EXCEL_SEP.match(lines[0])
    if excel:  # Excel's "sep=;" line: the delimiter, not a row
        text = text[len(lines[0]) :]
        delimiter = excel[1]
    else:
        delimiter = _delimiter(text, source)
    rows = _records_or_refuse(text, delimiter, source)
    if not rows:
        return Roster(frozenset())
    first, header = rows[0]
    column = _column(header, first, source) if len(header) > 1 else None
    if column is None and sum(len(cells) == len(header) for _, cells in rows) > 1 < len(header):
        # a header and rows as wide: a table, which names no GitHub column
        raise RosterError(
            f"{source} line {first}: no column is named GitHub (this line reads "
            f"{_named(header, list(range(min(len(header), 6))))}"
            f"{', ...' if len(header) > 6 else ''}); name the column with the GitHub usernames"
            " 'GitHub' (add that header line if there is none), or write one username per line"
        )
    # a one-column file's first line may be its header ("GitHub username"), not a participant
    skip = first if len(header) == 1 and _one_column_header(header[0]) else 0
    names: set[str] = set()
    problems = _Problems(source)
    if column is None:  # a list: every line, every value between commas, is a username
        for number, line in enumerate(lines, start=1):
            if number != skip and not (excel and number == 1):
                _take(_unquoted(line.split("#", 1)[0]), number, names, problems, in_table=False)
    else:
        unclosed = _unclosed_quote(text, delimiter)
        if unclosed:
            raise RosterError(
                f'{source} line {unclosed}: a quote (") opens a cell that never closes, so '
                "the rest of the file would read as that one cell; close it with another quote "
                "or delete it"
            )
        label = header[column].strip(_AROUND)
        for number, cells in rows[1:]:
            if cells == header:  # the header again: two exports pasted together
                continue
            cell = cells[column] if column < len(cells) else ""
            if not cell.strip(_AROUND):
                problems.add(
                    "empty",
                    number,
                    f"no GitHub username in column {_letter(column)} {label!r}; fill it in or "
                    "delete that row",
                )
                continue
            _take(cell, number, names, problems, in_table=True)
    if problems.kinds:
        raise RosterError(problems.lines())
    if column is None:
        return Roster(frozenset(names))
    return Roster(frozenset(names), f"{_letter(column)} {header[column].strip(_AROUND)!r}")


def text(roster: Roster) -> str:
    """The roster as `make roster` hands it to the hub: the usernames, one per line, sorted."""
    said = "# written by `make roster` from GPUHUB_ROSTER: edit that file, then run it again\n"
    return said + "".join(f"{name}\n" for name in sorted(roster.names))
