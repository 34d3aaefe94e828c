"""GPUHUB_TUTORIAL_TOKEN_FILE as organizers write it, checked before `make up` without showing it,
copied into the sync service's Docker secret, and answered to real git by the credential
helper for the right host only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploy import settings, stack, tls
from deploy.limits import Machine
from deploy.values import GIB
from tutorial_sync import credentials
from tutorial_sync.credentials import Credential, TokenFileError, parse_tokens

from .repo_entries import GHP, GLDT, GLPAT, TOKENS

G = "gpu101=https://github.com/gpu-school/gpu101.git"
ML = "ml=https://gitlab.com/gpu-school/ml-course.git"

READ = {
    "the token alone, as GitHub shows it": (f"{GHP}\n", [Credential("", "x-access-token", GHP)]),
    "no line end (echo -n)": (GHP, [Credential("", "x-access-token", GHP)]),
    "Windows line ends and a BOM (Notepad)": (
        f"\ufeff{GHP}\r\n",
        [Credential("", "x-access-token", GHP)],
    ),
    "a comment and blank lines": (
        f"# workshop token, expires 2026-09-30\n\n  {GHP}  \n",
        [Credential("", "x-access-token", GHP)],
    ),
    "a deploy token with its user": (
        f"gitlab+deploy-token-7:{GLDT}\n",
        [Credential("", "gitlab+deploy-token-7", GLDT)],
    ),
    "one line per host, git's credential file format": (
        f"https://x-access-token:{GHP}@github.com\nhttps://oauth2:{GLPAT}@gitlab.com/\n",
        [
            Credential("github.com", "x-access-token", GHP),
            Credential("gitlab.com", "oauth2", GLPAT),
        ],
    ),
    "a host with a port": (
        f"https://tutor:{GLPAT}@git.uni.example:8443\n",
        [Credential("git.uni.example:8443", "tutor", GLPAT)],
    ),
}

REFUSED = {
    "empty": ("", "holds no token"),
    "only a comment": ("# paste the token here\n", "holds no token"),
    "a blank inside": (f"token {GHP}\n", "line 1 holds a blank"),
    "the whole clone URL": (
        f"https://x-access-token:{GHP}@github.com/org/repo.git\nada@github.com\n",
        "line 2 is not a token",
    ),
    "over http": (f"http://x-access-token:{GHP}@github.com\n", "over https only"),
    "a URL without the token": ("https://github.com\n", "names no user and token"),
    "two tokens without a host": (f"{GHP}\n{GLPAT}\n", "line 2 is a second token without a host"),
    "no user before ':'": (f":{GHP}\n", "has no user"),
}


@pytest.mark.parametrize("text, read", READ.values(), ids=READ.keys())
def test_each_form_of_the_token_file_is_read(text, read):
    assert parse_tokens(text) == read


@pytest.mark.parametrize("text, says", REFUSED.values(), ids=REFUSED.keys())
def test_each_unusable_token_file_is_told_by_line_without_its_text(text, says):
    with pytest.raises(TokenFileError) as refused:
        parse_tokens(text)
    assert says in str(refused.value)
    for token in TOKENS:
        assert token not in str(refused.value)
    assert GHP not in repr(Credential("github.com", "x", GHP))


# ---- the settings check ------------------------------------------------------------------------


def check(tmp_path: Path, repos: str, text: str | None, mode: int = 0o600, path: str = ""):
    """The demo check's lines about the tutorial settings."""
    if text is not None:
        file = tmp_path / "tutorial-token"
        file.write_text(text)
        file.chmod(mode)
        path = path or str(file)
    environ = {
        "GPUHUB_CONFIG": "none",
        "GPUHUB_STATE_DIR": str(tmp_path / "state"),
        "GPUHUB_TUTORIAL_REPOS": repos,
        "GPUHUB_TUTORIAL_TOKEN_FILE": path,
    }
    try:
        return settings.read("demo", environ, machine=Machine(4, 16 * GIB, 0))
    except settings.SettingsError as e:
        for token in TOKENS:
            assert token not in str(e)
        return [p for p in e.problems if "TUTORIAL" in p]


@pytest.mark.parametrize(
    "repos, text, mode, says",
    [
        (G, f"{GHP}\n", 0o644, "others than its owner may read it; run: chmod 600"),
        (G, f"{GHP}\n", 0o640, "chmod 600"),
        (G, "", 0o600, "holds no token"),
        (G, f"token {GHP}\n", 0o600, "line 1 holds a blank"),
        (f"{G} {ML}", f"{GHP}\n", 0o600, "on 2 hosts (github.com, gitlab.com); say which host"),
    ],
)
def test_the_check_refuses_a_token_file_it_could_not_use_safely(tmp_path, repos, text, mode, says):
    found = check(tmp_path, repos, text, mode)
    assert isinstance(found, list) and len(found) == 1, found
    assert found[0].startswith("the environment: GPUHUB_TUTORIAL_TOKEN_FILE: ") and says in found[0]


def test_the_check_wants_an_existing_absolute_path(tmp_path):
    assert "cannot be read (No such file" in check(tmp_path, G, None, path="/nonexistent/t")[0]
    assert "write the file's absolute path" in check(tmp_path, G, None, path="token.txt")[0]


def test_tokens_for_each_host_serve_repositories_on_several(tmp_path):
    text = f"https://x-access-token:{GHP}@github.com\nhttps://oauth2:{GLPAT}@gitlab.com\n"
    checked = check(tmp_path, f"{G} {ML}", text)
    assert isinstance(checked, settings.Config), checked
    assert checked.tutorial_token_file == str(tmp_path / "tutorial-token")


# ---- the deploy: the Docker secret ------------------------------------------------------------


class Log:
    def __init__(self):
        self.lines = []

    def __call__(self, line):
        self.lines.append(line)


def test_the_token_file_becomes_the_sync_services_secret_and_is_never_logged(tmp_path):
    config = check(tmp_path, G, f"{GHP}\n")
    assert [p.name for p in stack.stack_files(config)][-1] == "stack.tutorial-token.yml"
    log = Log()
    version = tls.ensure_tutorial_token(config, log)
    copy = tmp_path / "state" / "tutorial_token"
    assert copy.read_text() == f"{GHP}\n" and copy.stat().st_mode & 0o777 == 0o600
    assert version == {"GPUHUB_TUTORIAL_TOKEN_VERSION": tls.content_version(copy)}
    assert tls.ensure_tutorial_token(config, log) == version
    assert log.lines[-1].startswith("tutorial token: unchanged")
    assert GHP not in "\n".join(log.lines)
    overlay = (stack.DEPLOY_DIR / "stack.tutorial-token.yml").read_text()
    assert "${GPUHUB_STATE_DIR}/tutorial_token" in overlay and "tutorial_token" in str(
        stack.VERSIONED_SECRETS
    )
    without = check(tmp_path, G, None)
    assert "stack.tutorial-token.yml" not in [p.name for p in stack.stack_files(without)]


# ---- git asks the helper -----------------------------------------------------------------------


def git_credential_fill(token_file: Path, hosts: list[str], url: str) -> dict[str, str]:
    """What real git's ``credential fill`` gets for ``url`` with the sync service's environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(token_file.parent)}
    env.update(credentials.git_environment(str(token_file), hosts))
    done = subprocess.run(
        ["git", "credential", "fill"],
        input=f"url={url}\n\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def test_git_gets_a_token_for_the_repositories_hosts_only(tmp_path):
    file = tmp_path / "token"
    file.write_text(f"{GHP}\nhttps://oauth2:{GLPAT}@gitlab.com\n")
    hosts = ["github.com"]
    given = git_credential_fill(file, hosts, "https://github.com/gpu-school/gpu101.git")
    assert given["username"] == "x-access-token" and given["password"] == GHP
    assert git_credential_fill(file, hosts, "https://gitlab.com/x/y.git")["password"] == GLPAT
    # a host no repository is on (a redirect, say), or plain http: nothing
    assert "password" not in git_credential_fill(file, hosts, "https://evil.example/x.git")
    assert "password" not in git_credential_fill(file, hosts, "http://github.com/x.git")
