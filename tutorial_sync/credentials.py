"""Tokens for private tutorial repositories (GPUHUB_TUTORIAL_TOKEN_FILE), and the git credential
helper that gives one to git when a server asks for it, over https only.

The token file (on the manager, mode 0600; `make up` makes it the sync service's Docker secret)
holds one credential per line; blank lines and lines starting with ``#`` are ignored::

    TOKEN                        for the host of the https repositories (all on one host)
    USER:TOKEN                   the same with a user name (a GitLab deploy token's)
    https://USER:TOKEN@HOST      for HOST only (git's own credential file format)

A bare TOKEN goes with the user ``x-access-token``, which GitHub takes with every kind of token.
A token never enters a URL, the settings, the stack's environment, the status page or the
manifest: the sync service's git fetches run with ``git_environment``, which makes this file
(run as a script: ``python3 credentials.py TOKEN_FILE HOST... get``) git's only credential
helper, and git asks it only after the server answered 401. No message here shows a token.

Standard library only, and no import of this package: git runs this file as a script, and the
settings check reads the file before anything is installed.
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

DEFAULT_USER = "x-access-token"
#: The most bytes a token file may hold: a file of tokens, not something chosen by mistake.
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Credential:
    host: str  # "" : the host of the https repositories
    username: str
    password: str = field(repr=False)


class TokenFileError(ValueError):
    """A token file that cannot be used: ``problems`` holds one line each (never its text)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _one(line: str) -> Credential:
    """One line's credential; ValueError (whose message never holds the line) otherwise."""
    if any(ch.isspace() for ch in line):
        raise ValueError("holds a blank; write TOKEN, USER:TOKEN or https://USER:TOKEN@HOST")
    if not line.isascii() or not line.isprintable():
        raise ValueError("holds a character no token has; write the token again")
    if "://" in line:
        parts = urlsplit(line)
        if parts.scheme.lower() != "https":
            raise ValueError(
                f"is for {parts.scheme}://, but a token is given over https only; "
                "write https://USER:TOKEN@HOST"
            )
        if parts.password is None or not parts.username or not parts.hostname:
            raise ValueError("names no user and token; write https://USER:TOKEN@HOST")
        host = parts.netloc.rpartition("@")[2].lower()
        return Credential(host, unquote(parts.username), unquote(parts.password))
    user, colon, token = line.rpartition(":")
    if colon and not user:
        raise ValueError("has no user before ':'; write TOKEN or USER:TOKEN")
    if "@" in line or "/" in line:
        raise ValueError("is not a token; write TOKEN, USER:TOKEN or https://USER:TOKEN@HOST")
    return Credential("", user or DEFAULT_USER, token)


def parse_tokens(text: str) -> list[Credential]:
    """The credentials of a token file's text (a BOM and CRLF line ends are fine); raises
    TokenFileError naming each line that cannot be used, and never showing it."""
    credentials, problems = [], []
    for number, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            credential = _one(line)
        except ValueError as e:
            problems.append(f"line {number} {e}")
            continue
        if any(c.host == credential.host for c in credentials):
            where = f"for {credential.host}" if credential.host else "without a host"
            problems.append(
                f"line {number} is a second token {where}; keep one, or say which host each is "
                "for: https://USER:TOKEN@HOST"
            )
            continue
        credentials.append(credential)
    if not credentials and not problems:
        problems.append("holds no token; write the token on a line of its own")
    if problems:
        raise TokenFileError(problems)
    return credentials


def https_hosts(urls) -> list[str]:
    """The hosts (with a port where one is given) of the https URLs, as git names them."""
    hosts = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme == "https" and parts.netloc.lower() not in hosts:
            hosts.append(parts.netloc.lower())
    return hosts


def check_tokens(credentials: list[Credential], hosts: list[str]) -> list[str]:
    """What stops the credentials serving repositories on ``hosts`` (https_hosts): a token
    without a host where the repositories are on more than one (it would go to all of them)."""
    if len(hosts) > 1 and any(not c.host for c in credentials):
        return [
            f"a token without a host, but the https repositories are on {len(hosts)} hosts "
            f"({', '.join(hosts)}); say which host it is for: https://USER:TOKEN@HOST"
        ]
    return []


def read_token_file(path: str, private: bool = True) -> list[Credential]:
    """The credentials in the file at ``path``; TokenFileError otherwise. ``private``: refuse a
    file that others than its owner may read (the organizer's file; a Docker secret is 0444
    inside its container, which only the sync service runs in)."""
    try:
        info = os.stat(path)
    except OSError as e:
        raise TokenFileError([f"cannot be read ({e.strerror}); check the path"]) from None
    if not stat.S_ISREG(info.st_mode):
        raise TokenFileError(["is not a file; name the file that holds the token"])
    if private and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileError([f"others than its owner may read it; run: chmod 600 {path}"])
    if info.st_size > MAX_BYTES:
        raise TokenFileError([f"has {info.st_size} bytes, not a token file; name the right one"])
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise TokenFileError([f"cannot be read ({e.strerror}); run this as its owner"]) from None
    except UnicodeDecodeError:
        raise TokenFileError(["is not UTF-8 text; write the token again in a text file"]) from None
    return parse_tokens(text)


def find(credentials: list[Credential], protocol: str, host: str, hosts) -> Credential | None:
    """The credential git may give ``host``: over https only, the one for that host, else a
    token without a host when ``host`` is one of the repositories' ``hosts``."""
    if protocol != "https":
        return None
    host = host.lower()
    for credential in credentials:
        if credential.host == host:
            return credential
    if host in hosts:
        return next((c for c in credentials if not c.host), None)
    return None


def git_environment(token_file: str = "", hosts=()) -> dict[str, str]:
    """The environment of the sync service's git commands: git never prompts (a private
    repository without a token fails at once, with git's own reason), no helper of the
    system's git configuration is asked, and with ``token_file`` this file is git's only
    credential helper, for the repositories' https ``hosts``. Nothing here holds a token."""
    env = {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GCM_INTERACTIVE": "never",
    }
    helpers = [""]  # the empty value empties git's list of helpers
    if token_file:
        command = [sys.executable, os.path.abspath(__file__), token_file, *hosts]
        helpers.append("!" + " ".join(shlex.quote(part) for part in command))
    env["GIT_CONFIG_COUNT"] = str(len(helpers))
    for number, helper in enumerate(helpers):
        env[f"GIT_CONFIG_KEY_{number}"] = "credential.helper"
        env[f"GIT_CONFIG_VALUE_{number}"] = helper
    return env


def helper(argv: list[str], stdin, stdout, stderr) -> int:
    """git's credential helper protocol: ``TOKEN_FILE HOST... get`` reads ``key=value`` lines
    and answers ``username``/``password`` when it has a credential for them; ``store`` and
    ``erase`` are ignored (the file is the organizer's)."""
    if len(argv) < 2:
        print("usage: credentials.py TOKEN_FILE [HOST...] get", file=stderr)
        return 2
    token_file, hosts, action = argv[0], argv[1:-1], argv[-1]
    if action != "get":
        return 0
    asked = {}
    for line in stdin:
        line = line.rstrip("\n")
        if not line:
            break
        key, _, value = line.partition("=")
        asked[key] = value
    try:
        credentials = read_token_file(token_file, private=False)
    except TokenFileError as e:
        print(f"tutorial token file {token_file}: {e}", file=stderr)
        return 0  # git goes on without, and says the server refused it
    found = find(credentials, asked.get("protocol", ""), asked.get("host", ""), hosts)
    if found:
        stdout.write(f"username={found.username}\npassword={found.password}\n")
    return 0


if __name__ == "__main__":
    sys.exit(helper(sys.argv[1:], sys.stdin, sys.stdout, sys.stderr))
