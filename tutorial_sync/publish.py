"""Publish a git branch onto the tutorial share, atomically.

The share (mounted read-only in every user container) looks like::

    <root>/<name>                      -> .versions/<name>/<commit>-<time>   (a symlink)
    <root>/.versions/<name>/<commit>-<time>/...files...
    <root>/.versions/<name>/<commit>-<time>/.tutorial-manifest.json

A new commit is fetched into a bare cache (outside the share), written into a fresh version
directory with its manifest, and the symlink is switched with one ``rename``: a reader sees the
old tree or the new one, never a mix. Force-pushes, deletions and renames need nothing special
(every version is a fresh tree); old versions are removed once no reader can need them.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import git

from . import MANIFEST, versions

VERSIONS = ".versions"


class SyncError(RuntimeError):
    """A repository could not be synced; the last good version stays published."""


@dataclass(frozen=True)
class Repo:
    """A tutorial repository: ``name`` is its directory on the share."""

    name: str
    url: str
    branch: str = "main"

    @classmethod
    def parse(cls, text: str) -> Repo:
        """``NAME=URL[#BRANCH]``, e.g. ``intro=https://github.com/org/intro.git#main``."""
        name, sep, rest = text.partition("=")
        url, _, branch = rest.partition("#")
        if not sep or not name.strip() or not url.strip():
            raise ValueError(f"cannot read {text!r}; write NAME=URL or NAME=URL#BRANCH")
        if "/" in name or name.startswith("."):
            raise ValueError(f"repository name {name!r} must be a plain directory name")
        return cls(name.strip(), url.strip(), branch.strip() or "main")


def _git_reason(error: git.GitCommandError) -> str:
    """git's own reason, one line: its first ``fatal:``/``error:`` line."""
    lines = [x.strip().removeprefix("stderr: ").strip("'") for x in str(error.stderr).splitlines()]
    reasons = [x for x in lines if x.startswith(("fatal:", "error:"))] or [x for x in lines if x]
    return reasons[0] if reasons else str(error).replace("\n", " ")


def _inside(archive: tarfile.TarFile):
    """The archive's members, refusing any that would land outside the target directory
    (what tarfile's "data" filter does on Pythons that have it)."""
    for member in archive:
        parts = Path(member.name).parts
        link = Path(member.linkname).parts if member.issym() or member.islnk() else ()
        if member.name.startswith("/") or ".." in parts or link[:1] == ("/",) or ".." in link:
            raise SyncError(f"refusing {member.name!r} from the repository: it points outside")
        if not (member.isfile() or member.isdir() or member.issym()):
            continue  # devices, fifos: never in a tutorial
        yield member


class Publisher:
    """Fetches repositories into ``cache`` and publishes them under ``root``."""

    def __init__(self, root: Path, cache: Path, keep_seconds: float = 600):
        self.root = Path(root)
        self.cache = Path(cache)
        self.keep_seconds = keep_seconds

    # ---- reading the share ----------------------------------------------------------------

    def published(self, name: str) -> dict | None:
        """The manifest of the version ``name`` points at, or None before the first publish."""
        try:
            return json.loads((self.root / name / MANIFEST).read_text())
        except FileNotFoundError:
            return None

    # ---- git ------------------------------------------------------------------------------

    def _cache_of(self, repo: Repo) -> git.Repo:
        path = self.cache / f"{repo.name}.git"
        cached = git.Repo(path) if path.exists() else git.Repo.init(path, bare=True)
        with cached.config_writer() as config:
            config.set_value('remote "origin"', "url", repo.url)
        return cached

    def fetch(self, repo: Repo) -> tuple[git.Repo, str]:
        """Fetch the branch (force-pushes included); its commit."""
        cached = self._cache_of(repo)
        ref = f"refs/heads/{repo.branch}"
        try:
            cached.git.fetch("--force", "--no-tags", "origin", f"+{ref}:{ref}")
        except git.GitCommandError as e:
            raise SyncError(
                f"fetching branch {repo.branch!r} of {repo.url} failed: {_git_reason(e)}"
            ) from None
        return cached, cached.git.rev_parse(ref)

    # ---- publishing -----------------------------------------------------------------------

    def sync(self, repo: Repo) -> bool:
        """Publish the branch's newest commit; False when it is already published."""
        cached, commit = self.fetch(repo)
        current = self.published(repo.name)
        if current and current.get("commit") == commit:
            return False
        self.publish(repo, cached, commit)
        self.prune(repo.name)
        return True

    def publish(self, repo: Repo, cached: git.Repo, commit: str) -> Path:
        base = self.root / VERSIONS / repo.name
        base.mkdir(parents=True, exist_ok=True)
        now = time.time()
        final = base / f"{commit[:12]}-{int(now * 1000)}"
        tmp = base / f".tmp-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            self._extract(cached, commit, tmp)
            manifest = {
                "repo": repo.name,
                "url": repo.url,
                "branch": repo.branch,
                "commit": commit,
                "published_at": now,
                "files": self._blob_ids(cached, commit),
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            tmp.rename(final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        # switch the name in one rename: readers see the old tree or the new one
        link = self.root / repo.name
        tmp_link = self.root / f".{repo.name}.switch"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        tmp_link.symlink_to(final.relative_to(self.root))
        if link.exists() and not link.is_symlink():
            raise SyncError(f"{link} is a real directory, not the symlink this service manages")
        os.replace(tmp_link, link)
        return final

    @staticmethod
    def _extract(cached: git.Repo, commit: str, target: Path) -> None:
        """The commit's tree into ``target`` (streamed: data files of a GB are fine)."""
        process = cached.git.archive("--format=tar", commit, as_process=True)
        try:
            with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                    archive.extractall(target, filter="data")
                else:
                    archive.extractall(target, members=_inside(archive))
        finally:
            process.wait()

    @staticmethod
    def _blob_ids(cached: git.Repo, commit: str) -> dict[str, str]:
        """``{path: git blob id}`` of every file: what readers compare to detect changes."""
        files = {}
        for line in cached.git.ls_tree("-r", "-z", commit).split("\0"):
            if not line:
                continue
            meta, path = line.split("\t", 1)
            _mode, kind, blob = meta.split()
            if kind == "blob":
                files[path] = blob
        return files

    def prune(self, name: str) -> list[str]:
        """Delete versions no reader can still need (see tutorial_sync.versions)."""
        base = self.root / VERSIONS / name
        link = self.root / name
        current = os.readlink(link).rsplit("/", 1)[-1] if link.is_symlink() else ""
        found = []
        for entry in base.iterdir():
            if entry.name.startswith(".tmp-") or not entry.is_dir():
                continue
            try:
                manifest = json.loads((entry / MANIFEST).read_text())
            except (OSError, ValueError):
                continue  # not ours, or half-written by a crash: leave it for a person
            found.append(versions.Version(entry.name, manifest["published_at"]))
        doomed = versions.to_delete(found, current, time.time(), self.keep_seconds)
        for directory in doomed:
            shutil.rmtree(base / directory, ignore_errors=True)
        return doomed
