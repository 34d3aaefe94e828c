"""Publish a git branch onto the tutorial share, atomically.

The share (mounted read-only in every user container) looks like::

    <root>/<name>                      -> .versions/<name>/<commit>-<time>   (a symlink)
    <root>/.versions/<name>/<commit>-<time>/...files...
    <root>/.versions/<name>/<commit>-<time>/.tutorial-manifest.json

A new commit is fetched into a bare cache (outside the share), written into a fresh version
directory with its manifest, and the symlink is switched with one ``rename``: a reader sees the
old tree or the new one, never a mix. Force-pushes, deletions and renames need nothing special
(every version is a fresh tree); old versions are removed once no reader can need them.

A version holds regular files and folders only. The repository's own symbolic links are never
written: one pointing inside the repository is published as a copy of what it points to (a hard
link to the extracted file where the filesystem allows), any other is skipped and listed in the
manifest's ``skipped`` (see tutorial_sync.links).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tarfile
import time
from pathlib import Path, PurePosixPath

import git

from . import MANIFEST, credentials, versions
from .links import resolve as resolve_links
from .repos import Repo, redact

VERSIONS = ".versions"
#: The layout of a published version. 2: links published as copies, never as links. A version in
#: another format is published again even when its commit is current.
FORMAT = 2
_LINK_MODE = "120000"  # git's file mode of a symbolic link
_MAX_LINK_TEXT = 4096  # PATH_MAX: a longer "link" is no path


#: git's words when a server wants credentials it was not given (or refused those given).
_NO_ACCESS = ("could not read Username", "terminal prompts disabled", "Authentication failed")


class SyncError(RuntimeError):
    """A repository could not be synced; the last good version stays published."""


def _first_reason(stderr: str) -> str:
    """git's own reason, one line: its first ``fatal:``/``error:`` line (else its first)."""
    lines = [x.strip().removeprefix("stderr: ").strip("'") for x in stderr.splitlines()]
    lines = [x for x in lines if x]
    return next((x for x in lines if x.startswith(("fatal:", "error:"))), lines[0] if lines else "")


def _git_reason(error: git.GitCommandError) -> str:
    """git's reason, credentials hidden (git's messages echo the URL it was given)."""
    return redact(_first_reason(str(error.stderr)) or str(error).replace("\n", " "))


def regular_members(archive: tarfile.TarFile):
    """The archive's regular files and folders, refusing a member whose name would land outside
    the target folder.

    Links (symbolic or hard), devices and fifos are never extracted: what a repository's links
    point to is published from the tree (tutorial_sync.links), so no member can be written
    through a link. Used on every Python; tarfile's "data" filter is added where the Python has
    one (3.11.4 and later), which older ones (the range this project supports starts at 3.9) lack.
    """
    for member in archive:
        name = PurePosixPath(member.name)
        if name.is_absolute() or ".." in name.parts:
            raise SyncError(
                f"refusing {member.name!r} from the repository: it would land outside it; "
                "remove it from the branch's history (git fsck names such trees)"
            )
        if member.isfile() or member.isdir():
            yield member


def extract_regular(stream, target: Path) -> None:
    """The regular files and folders of the tar ``stream`` into ``target`` (regular_members)."""
    data_filter = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        archive.extractall(target, members=regular_members(archive), **data_filter)


def _copy_inside(root: Path, source: str, copy: str) -> None:
    """The extracted file ``source`` under ``root`` also at ``copy``: a hard link, or a copy
    where the filesystem has none. Nothing under ``root`` is a symbolic link (regular_members),
    so neither path leads outside it."""
    original, target = root / source, root / copy
    if not stat.S_ISREG(os.lstat(original).st_mode):
        raise OSError(errno.EINVAL, f"{source} is not a regular file")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(original, target, follow_symlinks=False)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        with original.open("rb") as src, target.open("xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


class Publisher:
    """Fetches repositories into ``cache`` and publishes them under ``root``. ``git_env``: the
    fetches' environment (tutorial_sync.credentials.git_environment: never a prompt, and the
    token file's helper for private repositories)."""

    def __init__(
        self, root: Path, cache: Path, keep_seconds: float = 600, git_env: dict | None = None
    ):
        self.root = Path(root)
        self.cache = Path(cache)
        self.keep_seconds = keep_seconds
        self.git_env = credentials.git_environment() if git_env is None else git_env

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
            cached.git.fetch("--force", "--no-tags", "origin", f"+{ref}:{ref}", env=self.git_env)
        except git.GitCommandError as e:
            reason = _git_reason(e)
            if any(words in reason for words in _NO_ACCESS):
                reason += (
                    "; a private repository needs a token for it in GPUHUB_TUTORIAL_TOKEN_FILE "
                    "(docs/input-tutorial-repos.md)"
                )
            raise SyncError(
                f"fetching branch {repo.branch!r} of {repo.url} failed: {reason}"
            ) from None
        return cached, cached.git.rev_parse(ref)

    # ---- publishing -----------------------------------------------------------------------

    def sync(self, repo: Repo) -> bool:
        """Publish the branch's newest commit; False when it is already published."""
        cached, commit = self.fetch(repo)
        current = self.published(repo.name)
        if current and current.get("commit") == commit and current.get("format") == FORMAT:
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
            files, links = self._tree(cached, commit)
            self._extract(cached, commit, tmp)
            files, skipped = self._publish_links(cached, tmp, files, links)
            manifest = {
                "format": FORMAT,
                "repo": repo.name,
                "url": repo.url,
                "branch": repo.branch,
                "commit": commit,
                "published_at": now,
                "files": files,
                "skipped": skipped,
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
        """The commit's regular files into ``target`` (streamed: data files of a GB are fine)."""
        running = cached.git.archive("--format=tar", commit, as_process=True)
        process = running.proc  # (``running`` terminates it when it is garbage: keep it)
        try:
            extract_regular(process.stdout, target)
            process.stdout.read()  # tar's padding: let git finish writing
        except BaseException as e:
            if process.poll() is None:
                process.kill()  # else it waits forever to write what nobody reads
            process.wait()
            reason = _first_reason(process.stderr.read().decode(errors="replace"))
            if process.returncode > 0 and reason:
                raise SyncError(f"git archive {commit[:12]} failed: {reason}") from None
            if isinstance(e, tarfile.TarError):
                raise SyncError(f"git archive {commit[:12]} gave an unreadable tar: {e}") from None
            raise
        if process.wait():
            reason = _first_reason(process.stderr.read().decode(errors="replace"))
            raise SyncError(f"git archive {commit[:12]} failed: {reason}")

    @staticmethod
    def _tree(cached: git.Repo, commit: str) -> tuple[dict[str, str], dict[str, str]]:
        """``{path: git blob id}`` of the commit's regular files, and of its symbolic links
        (whose blob is the link's text); submodules are left out, as ``git archive`` does."""
        files, links = {}, {}
        for line in cached.git.ls_tree("-r", "-z", commit).split("\0"):
            if not line:
                continue
            meta, path = line.split("\t", 1)
            mode, kind, blob = meta.split()
            if path.startswith("/") or ".." in path.split("/"):
                raise SyncError(
                    f"refusing {path!r} from the repository: it would land outside it; "
                    "remove it from the branch's history (git fsck names such trees)"
                )
            if kind == "blob":
                (links if mode == _LINK_MODE else files)[path] = blob
        return files, links

    @staticmethod
    def _publish_links(
        cached: git.Repo, root: Path, files: dict[str, str], links: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Copies of what the links point to inside the repository; the manifest's ``files``
        (``{path: blob id}``, copies included) and ``skipped`` (``{path: why}``)."""
        texts, skipped = {}, {}
        for path, blob in links.items():
            info = cached.odb.info(bytes.fromhex(blob))
            if info.size > _MAX_LINK_TEXT:
                skipped[path] = f"is no path: its text has {info.size} bytes"
                continue
            text = cached.odb.stream(bytes.fromhex(blob)).read()
            texts[path] = text.decode("utf-8", "surrogateescape")
        plan = resolve_links(files, texts)
        published = dict(files)
        skipped.update(plan.skipped)
        for copy, source in sorted(plan.copies.items()):
            try:
                _copy_inside(root, source, copy)
            except OSError as e:
                skipped[copy] = f"points to {source}, which could not be copied: {e.strerror or e}"
            else:
                published[copy] = files[source]
        return published, dict(sorted(skipped.items()))

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
