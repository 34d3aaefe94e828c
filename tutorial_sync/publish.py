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

The files are what ``git archive`` writes, and the manifest records what was written. Authors'
``.gitattributes`` are applied as a release archive applies them: ``eol=crlf`` and ``text``
give the line endings a checkout gives, ``export-subst`` fills in ``$Format:...$``,
``export-ignore`` leaves a path out. Each written file is hashed after extraction (git's blob id
of the bytes on the share), so a home copy the participant never touched is always recognised
as such and no start looks for a file that was left out. (The tree's blob ids would differ from
the bytes for every converted file.) ``git archive`` runs without the machine's global and system
git configuration: the published bytes depend on the repository alone, and no filter driver
configured there (git-lfs's ``smudge``) runs or reaches a network.

Nothing is published that is not the file itself; each such path is in the manifest's
``skipped`` with the reason and the fix, shown on the service's ``/status`` and at every start:

- a Git LFS pointer (the file's content is on an LFS server, which the service does not reach);
- a submodule (its repository is not fetched: it may need other credentials);
- a name longer than the 255 bytes a Linux filesystem allows (Windows and macOS count 255
  characters, so a long name in Chinese or Greek can pass there);
- a link that does not lead to a file or folder inside the repository.

Git has no empty folders: a folder left empty (a submodule's, or one whose files are all
``export-ignore``) is not published. Nor is ``.gitmodules``, which serves a participant nothing
and whose URLs may carry a token.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
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
#: another format is published again even when its commit is current. 3: the manifest hashes the
#: bytes written (.gitattributes applied), no LFS pointers, submodules and overlong names listed.
#: 4: only what git-lfs takes for a pointer (with its oid and size) is left out.
FORMAT = 4
_LINK_MODE = "120000"  # git's file mode of a symbolic link
_GITLINK_MODE = "160000"  # git's file mode of a submodule
_MAX_LINK_TEXT = 4096  # PATH_MAX: a longer "link" is no path
NAME_MAX = 255  # bytes in one file name, on every Linux filesystem a share or home may use
#: git-lfs writes pointers of at most this many bytes (its own cut-off when it reads them)
_LFS_POINTER_MAX = 1024
_LFS_POINTER = re.compile(
    rb"version https://(git-lfs\.github\.com|hawser\.github\.com)/spec/v1\n"
    rb"(?:[a-z0-9.-]+ [^\n]*\n)*"
)
_ARCHIVE_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
LINK_ADVICE = (
    "a link is published, as a copy, only when it points to a file or folder inside the repository"
)


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


def name_too_long(path: str) -> int:
    """The length in bytes of ``path``'s longest name when it is over NAME_MAX, else 0."""
    longest = max(len(os.fsencode(part)) for part in path.split("/"))
    return longest if longest > NAME_MAX else 0


def _short_names(members, too_long: dict[str, str]):
    """The members whose every name fits a Linux filesystem; the files that do not go into
    ``too_long`` (``{path: why}``; a folder's files are listed, not the folder)."""
    for member in members:
        length = name_too_long(member.name.rstrip("/"))
        if not length:
            yield member
        elif member.isfile():
            too_long[member.name] = (
                f"has a name of {length} bytes (UTF-8), longer than the {NAME_MAX} a Linux "
                "filesystem allows (Windows and macOS count characters, not bytes): shorten it"
            )


def extract_regular(stream, target: Path, too_long: dict[str, str] | None = None) -> None:
    """The regular files and folders of the tar ``stream`` into ``target`` (regular_members);
    files with a name too long for the filesystem are left out and listed in ``too_long``."""
    data_filter = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    too_long = {} if too_long is None else too_long
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        members = _short_names(regular_members(archive), too_long)
        archive.extractall(target, members=members, **data_filter)


def lfs_pointer(data: bytes) -> str:
    """For the text of a Git LFS pointer file, the size of the file it stands for (``"1.2 GB"``);
    "" for anything else. A pointer, as git-lfs reads one: its version line, then ``key value``
    lines among which ``oid sha256:<64 hex>`` and ``size <bytes>`` (a text that only begins like
    one, a lesson about LFS, is a file like any other)."""
    if len(data) > _LFS_POINTER_MAX or not _LFS_POINTER.fullmatch(data):
        return ""
    size = re.search(rb"^size (\d+)$", data, re.MULTILINE)
    if not size or not re.search(rb"^oid sha256:[0-9a-f]{64}$", data, re.MULTILINE):
        return ""
    value = float(size.group(1))
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return ""  # not reached


def _blob_id(path: Path, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def written_files(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``{path: git blob id}`` of the files under ``root`` as written, and ``{path: why}`` of
    the Git LFS pointers, which are removed; folders left empty are removed too."""
    files, pointers = {}, {}
    for top, _dirs, names in os.walk(root, topdown=False):
        for name in names:
            path = Path(top, name)
            relative = path.relative_to(root).as_posix()
            size = path.lstat().st_size
            if size <= _LFS_POINTER_MAX:
                real_size = lfs_pointer(path.read_bytes())
                if real_size:
                    path.unlink()
                    pointers[relative] = (
                        f"is a Git LFS pointer: the file itself ({real_size}) is on an LFS server, "
                        "which this service does not reach; commit the file without LFS (GitHub "
                        "takes files up to 100 MB), or put the data in the datasets folder"
                    )
                    continue
            files[relative] = _blob_id(path, size)
        if Path(top) != root:
            with contextlib.suppress(OSError):  # only an empty folder is removed
                os.rmdir(top)
    return dict(sorted(files.items())), pointers


def public_url(url: str) -> str:
    """``url`` without a user name or password (a token) in it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url  # scp-like (git@host:path) or a local path: nothing secret
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


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
            files, links, gitlinks = self._tree(cached, commit)
            skipped: dict[str, str] = {}
            self._extract(cached, commit, tmp, skipped)
            skipped.update(self._publish_links(cached, tmp, files, links))
            skipped.update(self._submodules(cached, commit, gitlinks))
            (tmp / ".gitmodules").unlink(missing_ok=True)  # git's own; its URLs may hold tokens
            files, pointers = written_files(tmp)
            skipped = dict(sorted({**skipped, **pointers}.items()))
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
    def _extract(cached: git.Repo, commit: str, target: Path, too_long: dict[str, str]) -> None:
        """The commit's regular files into ``target`` (streamed: data files of a GB are fine),
        .gitattributes applied, the machine's git configuration not (see the module's doc)."""
        running = cached.git.archive("--format=tar", commit, as_process=True, env=_ARCHIVE_ENV)
        process = running.proc  # (``running`` terminates it when it is garbage: keep it)
        try:
            extract_regular(process.stdout, target, too_long)
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
    def _tree(
        cached: git.Repo, commit: str
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """``{path: git blob id}`` of the commit's regular files, and of its symbolic links
        (whose blob is the link's text); ``{path: commit}`` of its submodules."""
        files, links, gitlinks = {}, {}, {}
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
            elif mode == _GITLINK_MODE:
                gitlinks[path] = blob
        return files, links, gitlinks

    @staticmethod
    def _submodules(cached: git.Repo, commit: str, gitlinks: dict[str, str]) -> dict[str, str]:
        """``{path: why}`` of the submodules: not fetched (their repositories may need other
        credentials, and a tutorial's files should be in the tutorial's repository)."""
        urls = {}
        if gitlinks:
            try:
                listed = cached.git.config(
                    "--blob", f"{commit}:.gitmodules", "-z", "--get-regexp", r"^submodule\..*"
                )
            except git.GitCommandError:
                listed = ""  # no .gitmodules, or not readable: the paths alone are shown
            found: dict[str, dict[str, str]] = {}
            for item in filter(None, listed.split("\0")):
                key, _, value = item.partition("\n")
                section, _, field = key.rpartition(".")
                found.setdefault(section, {})[field] = value
            urls = {e["path"]: public_url(e.get("url", "")) for e in found.values() if "path" in e}
        return {
            path: (
                f"is a git submodule ({urls.get(path) or 'its URL is not in .gitmodules'} at "
                f"{sha[:12]}), which is not fetched: copy its files into this repository, or "
                "list its repository as a tutorial repository of its own"
            )
            for path, sha in gitlinks.items()
        }

    @staticmethod
    def _publish_links(
        cached: git.Repo, root: Path, files: dict[str, str], links: dict[str, str]
    ) -> dict[str, str]:
        """Copies of what the links point to inside the repository; ``{path: why}`` of the links
        not published."""
        texts, skipped = {}, {}
        for path, blob in links.items():
            info = cached.odb.info(bytes.fromhex(blob))
            if info.size > _MAX_LINK_TEXT:
                skipped[path] = f"is no path: its text has {info.size} bytes"
                continue
            text = cached.odb.stream(bytes.fromhex(blob)).read()
            texts[path] = text.decode("utf-8", "surrogateescape")
        plan = resolve_links(files, texts)
        skipped.update(plan.skipped)
        for copy, source in sorted(plan.copies.items()):
            try:
                _copy_inside(root, source, copy)
            except OSError as e:
                skipped[copy] = f"points to {source}, which could not be copied: {e.strerror or e}"
        return {path: f"{why} ({LINK_ADVICE})" for path, why in skipped.items()}

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
