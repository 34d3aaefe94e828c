"""The tutorial repositories an organizer lists (GPUHUB_TUTORIAL_REPOS), read by one rule.

``parse_repos(text)`` is the one reader of the setting: the settings check (deploy.settings),
the typed ``Config`` and the sync service all call it, and ``format_repos`` writes its result
back in the form the stack hands to the sync service, which reads back the same ``Repo`` values.
An entry is refused, with what to write instead, when the sync service could not use it: a URL
holding a credential (it would be shown on the status page and written into the manifest
every participant reads: tokens go in GPUHUB_TUTORIAL_TOKEN_FILE, see
tutorial_sync.credentials), an SSH URL (the service has no key), a web page's URL, a name given
twice. No message of this module shows a credential (``redact``).

Standard library only: the settings check runs with a bare python3 before anything is
installed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_BRANCH = "main"
WEBHOOK = "webhook"
#: The schemes the sync service fetches with. ``file`` and ``git`` (git daemon) serve local
#: mirrors and the tests; a private repository is reached over https with a token file.
SCHEMES = ("https", "http", "git", "file")
SSH_SCHEMES = ("ssh", "git+ssh", "ssh+git")
#: A NAME is a folder on the share and in every home: letters, digits, ., _ and -.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
MAX_NAME = 100
_SCP = re.compile(
    r"^(?:(?P<user>[^@/\s]+)@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):(?!//)(?P<path>[^@]+)$"
)
_GITHUB_HOSTS = ("github.com", "www.github.com")
# Tokens by their published prefixes: GitHub (classic, OAuth, app, refresh, fine-grained) and
# GitLab (personal, deploy, pipeline trigger, OAuth app ...).
_TOKEN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_\w{16,}|gl[a-z]{2,5}-[\w-]{16,})")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")
# USER:PASSWORD@ without a scheme before it (an SSH address, git@host:path, has no ':' there)
_BARE_USERINFO = re.compile(r"(?<![\w/:.@-])[^\s/@:=]+:[^\s/@]+@(?=[A-Za-z0-9])")
_QUERY = re.compile(r"(?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://\S*?)\?\S*")
SHOWN = "***"


def redact(text: str) -> str:
    """``text`` with what may be a credential replaced by ``***``: a URL's user and password
    (``https://***@github.com/...``), its query, and tokens known by their prefixes (``ghp_``,
    ``github_pat_``, ``glpat-``, ...). For every message that shows a URL or git's words."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{SHOWN}@", text)
    text = _BARE_USERINFO.sub(f"{SHOWN}@", text)
    text = _QUERY.sub(lambda m: f"{m['url']}?{SHOWN}", text)
    return _TOKEN.sub(SHOWN, text)


def has_credentials(url: str) -> bool:
    """A user, password or token in the URL (``https://USER:TOKEN@host/...``, ``ghp_...``)."""
    return bool(_USERINFO.search(url)) or bool(_TOKEN.search(url))


class ReposError(ValueError):
    """GPUHUB_TUTORIAL_REPOS cannot be used: ``problems`` holds one line per problem, each
    naming the entry (credentials hidden) and what to write instead."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems) if len(problems) < 2 else "\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Repo:
    """A tutorial repository: ``name`` is its folder on the share (and in homes), ``url``
    never holds a credential."""

    name: str
    url: str
    branch: str = DEFAULT_BRANCH
    poll: bool = True  # False: synced at start and on its push webhooks only

    def __post_init__(self):
        if has_credentials(self.url):
            raise ValueError(
                f"{self.name}: the URL {redact(self.url)} holds a credential; "
                "give it in GPUHUB_TUTORIAL_TOKEN_FILE instead"
            )

    def entry(self) -> str:
        """The entry that reads back as this repository: ``NAME=URL#BRANCH[:webhook]``."""
        return f"{self.name}={self.url}#{self.branch}" + ("" if self.poll else f":{WEBHOOK}")

    @classmethod
    def parse(cls, text: str) -> Repo:
        """One entry, ``NAME=URL[#BRANCH][:webhook]``, e.g.
        ``intro=https://github.com/org/intro.git#main``; raises ValueError saying what to write.

        ``:webhook`` after the branch (a branch name never holds ``:``): never polled."""
        shown = redact(text)
        name, sep, rest = text.partition("=")
        if not sep or "://" in name or _SCP.match(name) or "@" in name:
            url = text if not sep or "://" in name or "@" in name else rest
            guess = _name_from(url.partition("#")[0]) or "intro"
            raise ValueError(
                f"{shown!r} has no NAME; write NAME=URL, e.g. {guess}={redact(url)}"
                if "/" in url or ":" in url
                else f"cannot read {shown!r}; write NAME=URL or NAME=URL#BRANCH (blanks separate "
                "entries: a NAME, URL or branch has none)"
            )
        url, _, spec = rest.partition("#")
        branch, colon, option = spec.partition(":")
        name, url, branch = name.strip(), url.strip(), branch.strip()
        if not name:
            guess = _name_from(url) or "intro"
            raise ValueError(f"{shown!r} has no NAME before '='; write e.g. {guess}={redact(rest)}")
        _check_name(name)
        if not url:
            raise ValueError(f"{shown!r} has no URL after '='; write {name}=https://...")
        if colon and option.strip().lower() != WEBHOOK:
            raise ValueError(
                f"cannot read {shown!r}: after the branch only :webhook may follow "
                f"(e.g. {name}=URL#{branch or DEFAULT_BRANCH}:webhook, never polled)"
            )
        try:
            url, found_branch = _checked_url(name, url)
        except ValueError as e:  # no message shows a credential, whatever its form
            raise ValueError(redact(str(e))) from None
        branch = branch.removeprefix("refs/heads/") or found_branch or DEFAULT_BRANCH
        _check_branch(name, url, branch)
        return cls(name, url, branch, poll=not colon)


def _name_from(url: str) -> str:
    """A NAME for the repository at ``url``: its last path part without .git, as NAME allows."""
    last = url.strip().rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    last = re.sub(r"[^A-Za-z0-9._-]", "-", last.partition("?")[0]).lstrip(".-")
    return last[:MAX_NAME] if _NAME.match(last) else ""


def _check_name(name: str) -> None:
    if not _NAME.match(name) or len(name) > MAX_NAME:
        guess = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:MAX_NAME] or "intro"
        raise ValueError(
            f"the NAME {name!r} is not a plain folder name; use letters, digits, '.', '_' "
            f"and '-' (not first), at most {MAX_NAME}, e.g. {guess}"
        )


def _odd_character(text: str) -> str | None:
    for ch in text:
        if not ch.isascii() or not ch.isprintable():
            name = unicodedata.name(ch, "")
            return f"U+{ord(ch):04X}" + (f" ({name.lower()})" if name else "")
    return None


def _https_form(host: str, path: str) -> str:
    path = path.strip("/")
    return f"https://{host}/{path}" + ("" if path.endswith(".git") else ".git")


def _checked_url(name: str, url: str) -> tuple[str, str]:
    """The URL as the sync service fetches it (scheme and host in lower case, no trailing
    slash), and a branch it names (a GitHub page's /tree/BRANCH); ValueError otherwise."""
    shown = redact(url)
    odd = _odd_character(url)
    if odd:
        raise ValueError(
            f"{name}: the URL {shown!r} holds {odd}, which no repository URL has; type it "
            "again (copies from web pages and chats bring these)"
        )
    if url.endswith(":" + WEBHOOK):
        raise ValueError(
            f"{name}: ':webhook' follows the branch; write {name}={shown[: -len(WEBHOOK) - 1]}"
            f"#{DEFAULT_BRANCH}:webhook"
        )
    scp = None if "://" in url else _SCP.match(url)
    if scp:
        https = _https_form(scp["host"], scp["path"])
        raise ValueError(
            f"{name}: {shown!r} is an SSH URL, and the sync service has no SSH key; write "
            f"{name}={https} (a private repository: also GPUHUB_TUTORIAL_TOKEN_FILE, "
            "docs/input-tutorial-repos.md)"
        )
    if "://" not in url and ("@" in url or _TOKEN.search(url)):
        host, _, path = url.rpartition("@")[2].partition("/")
        raise ValueError(
            f"{name}: the URL holds a credential; write {name}={redact(_https_form(host, path))} "
            "without it and put the token in the file named by GPUHUB_TUTORIAL_TOKEN_FILE "
            "(docs/input-tutorial-repos.md)"
        )
    if "://" not in url:
        bare = url.strip("/").removeprefix("www.")
        full = _https_form("github.com", bare.removeprefix("github.com/"))
        raise ValueError(f"{name}: {shown!r} is not a URL; write the full one, e.g. {name}={full}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in SSH_SCHEMES:
        raise ValueError(
            f"{name}: {shown!r} is an SSH URL, and the sync service has no SSH key; write "
            f"{name}={_https_form(parts.hostname or 'HOST', parts.path)} (a private "
            "repository: also GPUHUB_TUTORIAL_TOKEN_FILE, docs/input-tutorial-repos.md)"
        )
    if has_credentials(url):
        raise ValueError(
            f"{name}: the URL {shown} holds a credential, which would be shown on the status "
            "page and in the tutorials every participant reads; write the URL without it "
            f"({name}={_without_credentials(url)}) and put the token in the file named by "
            "GPUHUB_TUTORIAL_TOKEN_FILE (docs/input-tutorial-repos.md)"
        )
    if parts.query or url.endswith("?"):
        raise ValueError(
            f"{name}: {shown!r} has a '?' part, which is no part of a repository's URL (a "
            f"token goes in GPUHUB_TUTORIAL_TOKEN_FILE); write {name}={_without_credentials(url)}"
        )
    if scheme not in SCHEMES:
        inner = re.search(r"https://\S+", url[len(scheme) + 3 :])
        fix = f"{name}={redact(inner.group(0))}" if inner else f"{name}=https://HOST/OWNER/REPO.git"
        raise ValueError(
            f"{name}: {shown!r} is not a git URL the sync service can fetch "
            f"({', '.join(s + '://' for s in SCHEMES)}); write {fix}"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        raise ValueError(f"{name}: {shown!r} has a port that is no number; correct it") from None
    host = (parts.hostname or "").lower()
    netloc = parts.netloc.lower()
    path = parts.path.rstrip("/") or parts.path
    if scheme == "file":
        if host not in ("", "localhost") or not path.startswith("/"):
            raise ValueError(f"{name}: {shown!r}: write a local path as file:///PATH/REPO.git")
    elif not host or not path.strip("/"):
        raise ValueError(
            f"{name}: {shown!r} names no repository; write {scheme}://HOST/OWNER/REPO.git"
        )
    pinned = re.fullmatch(r"(?P<repo>.+\.git)@(?P<ref>[^/@]+)", path)
    if pinned:  # pip's form, git+https://HOST/OWNER/REPO.git@REF
        raise ValueError(
            f"{name}: {shown!r} names a version after '@', as pip does; write "
            f"{name}={scheme}://{netloc}{pinned['repo']}#{pinned['ref']} (the branch after '#')"
        )
    branch = ""
    if host in _GITHUB_HOSTS:
        parts_of_path = [p for p in path.split("/") if p]
        if len(parts_of_path) != 2:
            owner_repo = "/".join(parts_of_path[:2]) or "OWNER/REPO"
            if len(parts_of_path) > 3 and parts_of_path[2] == "tree":
                branch = "/".join(parts_of_path[3:])
            fix = f"{name}={_https_form('github.com', owner_repo)}" + (
                f"#{branch}" if branch else ""
            )
            raise ValueError(
                f"{name}: {shown!r} is a page of GitHub's website, not the repository; write {fix}"
            )
    elif "/-/" in path:
        fix = f"{name}={_https_form(netloc, path.split('/-/', 1)[0])}"
        raise ValueError(
            f"{name}: {shown!r} is a page of a website, not the repository; write {fix}"
        )
    return f"{scheme}://{netloc}{path}", branch


def _without_credentials(url: str) -> str:
    url = _USERINFO.sub(lambda m: m["scheme"], url)
    return redact(url.partition("?")[0])


_BAD_REF = re.compile(r"(^[-/.]|\.\.|@\{|[~^:?*\[\\\s]|//|/\.|\.lock$|\.lock/|[/.]$)")


def _check_branch(name: str, url: str, branch: str) -> None:
    """A branch name git accepts (git check-ref-format's rules), and no commit id."""
    if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", branch):
        raise ValueError(
            f"{name}: {branch[:12]}... is a commit id, but the sync service publishes a branch "
            f"and follows it; write the branch, e.g. {name}={url}#{DEFAULT_BRANCH} (to keep one "
            "version: git branch NAME COMMIT, git push origin NAME, and write #NAME)"
        )
    if branch == "@" or _BAD_REF.search(branch) or _odd_character(branch):
        raise ValueError(
            f"{name}: {branch!r} is not a branch name git accepts; write the branch as "
            f"GitHub shows it, e.g. {name}=URL#{DEFAULT_BRANCH}"
        )


# ---- the whole setting ----------------------------------------------------------------------

_COMMAND = re.compile(
    r"(?:(?P<name>[^\s=]+)=)?(?P<command>gh\s+repo\s+clone|git\s+clone)\s+(?P<what>\S+)"
)
_SEPARATOR = re.compile(r"[,;](?=[A-Za-z0-9_][A-Za-z0-9._-]*=)|[,;]$|^[,;]")


def _entry_like(token: str) -> bool:
    """``NAME=...``: an '=' before any '/' or ':' (a URL's query holds '=' after them)."""
    name, sep, _ = token.partition("=")
    return bool(sep) and "/" not in name and ":" not in name


def _tokens(text: str, problems: list[str]) -> list[str]:
    """The entries of the setting, split at blanks (spaces, tabs, new lines); pasted commands,
    quotes, commas and blanks around '=' are problems, told with their fix."""

    def command(match: re.Match) -> str:
        what, name = match["what"], match["name"]
        repo = what if "://" in what or "@" in what else _https_form("github.com", what)
        name = name or _name_from(what) or "intro"
        problems.append(
            f"{redact(match.group(0))!r} is a command, not a repository; write "
            f"{name}={redact(repo)}"
        )
        return " "

    tokens = _COMMAND.sub(command, text).split()
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if "=" not in token and following.startswith("="):
            taken = tokens[i : i + (3 if following == "=" and i + 2 < len(tokens) else 2)]
            problems.append(
                f"{redact(' '.join(taken))!r}: no blanks around '='; write {redact(''.join(taken))}"
            )
            i += len(taken)
            continue
        if _entry_like(token) and token.endswith("=") and following and not _entry_like(following):
            problems.append(
                f"{redact(token + ' ' + following)!r}: no blanks around '='; "
                f"write {redact(token + following)}"
            )
            i += 2
            continue
        if "=" not in token and "/" not in token and _entry_like(following):
            problems.append(
                f"{redact(token + ' ' + following)!r}: a NAME has no blanks; write "
                f"{redact(token + '-' + following)}"
            )
            i += 2
            continue
        if "'" in token or '"' in token:
            problems.append(
                f"{redact(token)!r}: quotes are taken literally here; remove them "
                "(entries are separated by blanks, nothing else)"
            )
        elif _SEPARATOR.search(token):
            fixed = " ".join(p for p in re.split(r"[,;]", token) if p)
            problems.append(
                f"{redact(token)!r}: separate entries with spaces or new lines, not commas or "
                f"semicolons; write {redact(fixed)}"
            )
        else:
            out.append(token)
        i += 1
    return out


def parse_repos(text: str) -> list[Repo]:
    """GPUHUB_TUTORIAL_REPOS: ``NAME=URL[#BRANCH][:webhook]`` entries separated by blanks
    (spaces, tabs, new lines), in order. Raises ReposError with every problem, one line each,
    naming the entry and what to write instead."""
    problems: list[str] = []
    repos: list[Repo] = []
    for token in _tokens(text, problems):
        try:
            repos.append(Repo.parse(token))
        except ValueError as e:
            problems.append(str(e))
    seen: dict[str, Repo] = {}
    for repo in repos:
        first = seen.setdefault(repo.name.lower(), repo)
        if first is repo:
            continue
        same = "twice" + (
            ""
            if first.name == repo.name
            else f", as {first.name!r} and {repo.name!r} (case does not make two names)"
        )
        problems.append(
            f"the NAME {repo.name!r} is given {same} ({redact(first.url)} and "
            f"{redact(repo.url)}); each repository is its own folder on the share: give each a "
            f"NAME of its own, e.g. {repo.name}-2 (or list a repository once)"
        )
    if problems:
        raise ReposError(problems)
    return repos


def format_repos(repos: list[Repo]) -> str:
    """The setting that ``parse_repos`` reads back as ``repos``: what the stack hands on."""
    return " ".join(repo.entry() for repo in repos)
