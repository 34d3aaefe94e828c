"""Real git repositories for the tutorial-sync tests: a bare "GitHub" remote and a clone that
commits and pushes to it, as a tutorial author would."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tutorial_sync import webhook


def signed_push(clone_url: str, secret: str, delivery: str) -> tuple[bytes, dict[str, str]]:
    """GitHub's push event for ``main`` of ``clone_url``, signed with ``secret``: body, headers."""
    body = json.dumps({"ref": "refs/heads/main", "repository": {"clone_url": clone_url}})
    headers = {
        webhook.SIGNATURE_HEADER: webhook.signature(secret, body.encode()),
        webhook.DELIVERY_HEADER: delivery,
        webhook.EVENT_HEADER: "push",
        "Content-Type": "application/json",  # as GitHub sends it for a JSON webhook
    }
    return body.encode(), headers


def blob_id(data: bytes) -> str:
    """git's id for a file's content (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Author:
    """A working clone of ``remote`` (a bare repository, reached by file:// URL)."""

    def __init__(self, tmp: Path, branch: str = "main"):
        self.remote = tmp / "remote.git"
        self.work = tmp / "author"
        self.branch = branch
        self.git("init", "--bare", "-b", branch, str(self.remote), cwd=tmp)
        self.git("init", "-b", branch, str(self.work), cwd=tmp)
        self.git("config", "user.email", "author@example.org")
        self.git("config", "user.name", "Tutorial Author")
        self.git("remote", "add", "origin", self.url)

    @property
    def url(self) -> str:
        return f"file://{self.remote}"

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd or self.work, check=True, capture_output=True, text=True
        ).stdout.strip()

    def write(self, path: str, content: str | bytes) -> None:
        target = self.work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        target.write_bytes(content)

    def link(self, path: str, target: str) -> None:
        """A symbolic link at ``path`` whose text is ``target`` (committed as a link)."""
        where = self.work / path
        where.parent.mkdir(parents=True, exist_ok=True)
        where.symlink_to(target)

    def commit_and_push(self, message: str, force: bool = False, add: bool = True) -> str:
        """Commit (everything in the work tree, or with ``add=False`` the index as it is) and
        push."""
        if add:
            self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        self.git("push", "-q", *(["--force"] if force else []), "origin", self.branch)
        return self.git("rev-parse", "HEAD")


GIT_PORT = 9418


def listening(address: str, port: int) -> bool:
    """Whether a TCP socket of this machine listens on address:port (read from /proc/net/tcp:
    a connection attempt says nothing where the network answers for any address)."""
    want = f"{socket.inet_aton(address)[::-1].hex().upper()}:{port:04X}"
    with open("/proc/net/tcp") as table:
        return any(
            line.split()[1] == want and line.split()[3] == "0A"  # 0A: LISTEN
            for line in list(table)[1:]
        )


class ServedRemote:
    """A bare repository NAME.git under ``base``, an author's clone pushing to it, and
    git daemon serving it at git://ADDRESS:9418/NAME.git (the tests' stand-in for GitHub)."""

    def __init__(self, base: Path, name: str, address: str = "10.199.0.1"):
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        self.base, self.url = base, f"git://{address}:{GIT_PORT}/{name}.git"
        self.author = Author(base)
        self.author.git("init", "--bare", "-q", "-b", "main", str(base / f"{name}.git"), cwd=base)
        self.author.git("remote", "set-url", "origin", f"file://{base / f'{name}.git'}")
        if listening(address, GIT_PORT):
            raise RuntimeError(
                f"{address}:{GIT_PORT} is taken (an earlier git daemon still running? "
                f"pkill -f 'git daemon'), so this one could not serve {name}"
            )
        with tempfile.TemporaryFile() as errors:
            self.daemon = subprocess.Popen(
                ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={base}"]
                + [f"--listen={address}", f"--port={GIT_PORT}", str(base)],
                stdout=subprocess.DEVNULL,
                stderr=errors,
            )
            deadline = time.monotonic() + 10
            while self.daemon.poll() is None and time.monotonic() < deadline:
                if listening(address, GIT_PORT):
                    return
                time.sleep(0.05)
            if self.daemon.poll() is None:
                self.daemon.kill()
            self.daemon.wait()
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip()
        raise RuntimeError(f"git daemon on {address}:{GIT_PORT} did not start: {said}")

    def close(self) -> None:
        self.daemon.terminate()
        self.daemon.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


# ---- a repository with symbolic links of every kind ---------------------------------------------

SECRET = "outside the repository: never published"


def make_outside(tmp: Path) -> Path:
    """``tmp/outside/secret.txt``: what a link followed out of the repository would reach."""
    folder = tmp / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET)
    return folder


def add_every_kind_of_link(author: Author, outside: Path) -> None:
    """Files, and links of every kind; ``outside`` (a folder beside the share, holding
    secret.txt) is what a followed link would reach."""
    author.write("notebooks/01.ipynb", '{"cells": ["one"]}')
    author.write("data/table.csv", "a,b\n")
    author.write("data/sub/deep.csv", "deep\n")
    author.link("alias.ipynb", "notebooks/01.ipynb")
    author.link("chain.ipynb", "alias.ipynb")
    author.link("notebooks/data", "../data")
    author.link("via-folder.csv", "notebooks/data/table.csv")
    author.link("dangling.ipynb", "nowhere.ipynb")
    author.link("passwd", "/etc/passwd")
    author.link("secret-absolute.txt", str(outside / "secret.txt"))
    author.link("outside-folder", str(outside))
    # from <share>/.versions/<name>/<version>/ four levels up is the test's tmp_path
    author.link("climb-from-share.txt", f"../../../../{outside.name}/secret.txt")
    author.link("climb-from-clone.txt", f"../../{outside.name}/secret.txt")
    author.link("climb-folder", f"../../../../{outside.name}")
    author.link("loop-a", "loop-b")
    author.link("loop-b", "loop-a")
    author.link("everything", ".")
    author.link("data/sub/up", "..")


INSIDE = {  # path -> the file it holds
    "notebooks/01.ipynb": "notebooks/01.ipynb",
    "data/table.csv": "data/table.csv",
    "data/sub/deep.csv": "data/sub/deep.csv",
    "alias.ipynb": "notebooks/01.ipynb",
    "chain.ipynb": "notebooks/01.ipynb",
    "notebooks/data/table.csv": "data/table.csv",
    "notebooks/data/sub/deep.csv": "data/sub/deep.csv",
    "via-folder.csv": "data/table.csv",
}
SKIPPED = {
    "dangling.ipynb": "dangling",
    "passwd": "outside the repository (/etc/passwd)",
    "secret-absolute.txt": "outside the repository",
    "outside-folder": "outside the repository",
    "climb-from-share.txt": "outside the repository",
    "climb-from-clone.txt": "outside the repository",
    "climb-folder": "outside the repository",
    "loop-a": "loop of links",
    "loop-b": "loop of links",
    "everything": "a folder holding the link itself",
    "data/sub/up": "a folder holding the link itself",
    "notebooks/data/sub/up": "a folder holding the link itself",
}


def every_entry(folder: Path) -> dict[str, os.stat_result]:
    """lstat of everything under ``folder``, links not followed."""
    found = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(top, name)
            found[str(path.relative_to(folder))] = path.lstat()
    return found


# ---- what tutorial authors' repositories hold --------------------------------------------------

#: what ``git lfs track "*.pt"`` writes into .gitattributes
LFS_TRACK = "{pattern} filter=lfs diff=lfs merge=lfs -text\n"


def lfs_pointer(data: bytes) -> str:
    """The pointer text git-lfs commits in place of ``data`` (spec v1: version, oid, size, each
    line ending in LF, keys sorted after version)."""
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n"


def add_submodule(author: Author, tmp: Path, path: str, shown_url: str) -> str:
    """A real submodule at ``path`` (``git submodule add`` of a repository beside the author's),
    its URL in .gitmodules then set to ``shown_url``, as a clone from GitHub would name it; the
    submodule's commit."""
    (tmp / "lib").mkdir()
    lib = Author(tmp / "lib")
    lib.write("lib.py", "def helper():\n    return 42\n")
    commit = lib.commit_and_push("library")
    author.git("-c", "protocol.file.allow=always", "submodule", "add", "-q", lib.url, path)
    author.git("config", "-f", ".gitmodules", f"submodule.{path}.url", shown_url)
    return commit


def add_by_plumbing(author: Author, path: str, data: bytes, mode: str = "100644") -> None:
    """``path`` into the index without a file in the work tree (a name this filesystem cannot
    hold: Windows counts 255 characters, Linux 255 bytes); commit with ``add=False``."""
    blob = (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=author.work,
            input=data,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    author.git("update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}")
