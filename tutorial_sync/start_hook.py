"""Bring the published tutorials into the participant's home at server start.

    python -m tutorial_sync.start_hook [--share /srv/tutorials] [--home ~/tutorials]
    tutorials-reset [PATH ...]      (python -m tutorial_sync.start_hook --reset [PATH ...])

Runs inside the single-user container, as the participant, before the server starts (the
image's ``start-singleuser``). The share is read-only; each repository on it is resolved once,
so a publish during the copy cannot mix two versions. The rules are in tutorial_sync.merge;
what was copied is recorded (git blob ids, with size and mtime to skip re-hashing unchanged
files) in ``~/.local/share/gpu-jupyterhub/tutorials.json``, so "modified" is known without git.

Only regular files are copied, and never through a symbolic link on the share (the publisher
writes none; a share written otherwise has its links skipped). One file that cannot be copied
is reported and tried again at the next start; it never stops the others, nor the server.
A copy is written beside its place and renamed into it, so no half-written file is ever left:
when the home is full (or over its quota) the copies stop there, each one that did not fit is
named in one line, and the participant's files are as they were. A copy is executable where the
published file is.

Removals come first (they free room, and a folder they empty may be where a file now belongs),
and a folder they leave empty goes with them. A file of the participant's standing where the
tutorial now has a folder is moved aside (``NAME.mine-<time>``), never overwritten.

What the participant should know is in ``UPDATED-TUTORIALS.md`` in the tutorials folder: new
versions put beside their changed copies, files moved aside, what the sync service could not
publish (a Git LFS file, a submodule; the manifest's ``skipped``) and what did not fit.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import MANIFEST, merge

NOTICE = "UPDATED-TUTORIALS.md"
FAILED = "failed"  # the count of files that could not be written (reported, retried next start)
# what the home holds at a tutorial file's path when it is not a readable regular file: never a
# blob id, so the merge rules treat it as the participant's own (never overwritten)
NOT_A_FILE, UNREADABLE = "(not a regular file)", "(unreadable)"
#: errors that mean the home has no room: every further copy would fail the same way
FULL = (errno.ENOSPC, errno.EDQUOT)
SHOWN = 3  # names given in one line before "and N more"


class Refused(OSError):
    """A published file the hook will not read (a link, or not a regular file)."""


def open_published(source: Path):
    """``source`` opened for reading, refusing anything but a regular file reached without a
    symbolic link (``source`` is a resolved repository directory and a clean relative path, so
    any link on the way makes its real path differ)."""
    if os.path.realpath(source) != str(source):
        raise Refused(f"{source} is (or is inside) a symbolic link on the share; not followed")
    f = open(os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")  # noqa: SIM115
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise Refused(f"{source} is not a regular file on the share")
    return f


def clean(path: str) -> bool:
    """True for a plain relative path (``a/b.ipynb``): no ``..``, ``.``, empty or leading ``/``."""
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


def blob_id(path: Path) -> str:
    """git's blob id of a file, hashed in chunks (data files can be large)."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Share:
    """What the share offers: ``upstream`` (``{path: blob}``), ``sources`` (where each is read
    from), ``skipped`` (entries of the share left out, one line each) and ``unpublished``
    (``{path: why}``: what the sync service could not publish, from the manifests)."""

    upstream: dict[str, str] = field(default_factory=dict)
    sources: dict[str, Path] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    unpublished: dict[str, str] = field(default_factory=dict)


def published(share: Path) -> Share:
    """Every repository on the share; paths are ``<repository>/<file>``; each repository's
    directory is resolved once."""
    found = Share()
    upstream, sources, skipped = found.upstream, found.sources, found.skipped
    try:
        entries = sorted(share.iterdir()) if share.is_dir() else []
        root = share.resolve()
    except OSError as e:
        skipped.append(f"{share}: cannot be read ({e.strerror})")
        return found
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            real = entry.resolve()
        except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13)
            skipped.append(f"{entry.name}: a loop of symbolic links; not a published repository")
            continue
        if root not in real.parents:
            skipped.append(f"{entry.name}: points outside {share}; not a published repository")
            continue
        try:
            manifest = json.loads((real / MANIFEST).read_text())
            files = manifest["files"]
            items = [(p, b) for p, b in files.items() if isinstance(p, str) and isinstance(b, str)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a published repository
        for path, blob in items:
            key = f"{entry.name}/{path}"
            if not clean(path):
                skipped.append(f"{key}: not a plain relative path")
                continue
            upstream[key], sources[key] = blob, real / path
        left = manifest.get("skipped")
        for path, why in left.items() if isinstance(left, dict) else ():
            found.unpublished[f"{entry.name}/{path}"] = str(why)
    return found


class Home:
    """The participant's tutorials folder and the record of what was copied into it."""

    def __init__(self, root: Path, state: Path):
        self.root, self.state = root, state
        try:
            files = json.loads(state.read_text())["files"]
            self.files = {
                p: e
                for p, e in files.items()
                if isinstance(e, dict) and isinstance(e.get("blob"), str)
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.files = {}

    def recorded(self) -> dict[str, str]:
        return {path: entry["blob"] for path, entry in self.files.items()}

    def current(self, paths) -> dict[str, str]:
        """Blob ids of the files now in the home among ``paths`` (absent ones are left out)."""
        found = {}
        for path in paths:
            target = self.root / path
            try:
                st = target.lstat()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError:
                found[path] = UNREADABLE
                continue
            entry = self.files.get(path)
            if not stat.S_ISREG(st.st_mode):
                found[path] = NOT_A_FILE  # the participant's folder or link: theirs
            elif (
                entry
                and entry.get("size") == st.st_size
                and entry.get("mtime_ns") == st.st_mtime_ns
            ):
                found[path] = entry["blob"]  # untouched since written: no need to hash
            else:
                try:
                    found[path] = blob_id(target)
                except OSError:
                    found[path] = UNREADABLE
        return found

    def write(self, path: str, source: Path) -> None:
        """A copy of the published file ``source`` at ``path``, replacing what is there."""
        with open_published(source) as src:
            self.write_from(path, src)

    def write_from(self, path: str, src) -> None:
        """``src`` copied to ``path`` (executable where ``src`` is): written under a short
        temporary name beside it (a name of 255 bytes leaves no room for a longer one), then
        renamed. On any failure nothing is left: no partial copy, no folder made for it."""
        target = self.root / path
        made = [p for p in [target.parent, *target.parent.parents] if not os.path.lexists(p)]
        digest = hashlib.sha1(os.fsencode(target.name)).hexdigest()[:10]
        tmp = target.with_name(f".tutorial-tmp-{digest}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                if os.fstat(src.fileno()).st_mode & stat.S_IXUSR:
                    mode = os.fstat(dst.fileno()).st_mode & 0o777
                    os.fchmod(dst.fileno(), mode | (mode & 0o444) >> 2)  # x wherever r
            tmp.replace(target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            for folder in made:  # deepest first
                try:
                    folder.rmdir()
                except OSError:
                    break
            raise

    def remember(self, record: dict[str, str]) -> None:
        """Save ``record``, with size and mtime of the files that hold exactly that content."""
        files = {}
        for path, blob in record.items():
            target, old = self.root / path, self.files.get(path, {})
            entry = {"blob": blob, "size": -1, "mtime_ns": -1}
            try:
                st = target.lstat()
                if stat.S_ISREG(st.st_mode):
                    same = old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                    if (same and old.get("blob") == blob) or blob_id(target) == blob:
                        entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns)
            except OSError:
                pass  # absent or unreadable: hashed again next time
            files[path] = entry
        self.files = files
        self.state.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state.with_name(self.state.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
            tmp.replace(self.state)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def follow_mode(self, path: str, source: Path) -> None:
        """The copy at ``path`` (the published content) made executable when the published file
        has become so (``git update-index --chmod=+x``, as Windows authors fix it, changes the
        mode and not the content). Never made less: that may be the participant's choice."""
        try:
            published_mode = os.stat(source, follow_symlinks=False).st_mode
            target = self.root / path
            mode = target.lstat().st_mode
            if published_mode & stat.S_IXUSR and stat.S_ISREG(mode) and not mode & stat.S_IXUSR:
                os.chmod(target, (mode & 0o777) | (mode & 0o444) >> 2)
        except OSError:
            pass  # a mode is not worth a line: tried again next start

    def remove(self, path: str) -> None:
        """Remove the copy at ``path``, and the folders that leaves empty."""
        target = self.root / path
        target.unlink(missing_ok=True)
        for folder in target.parents:
            if folder == self.root or self.root not in folder.parents:
                break
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (the participant's files, or other tutorial files)

    def move_aside(self, path: str, stamp: str) -> tuple[str, str] | None:
        """When a file or link stands where ``path`` needs a folder, move it to
        ``NAME.mine-<stamp>``; what was moved and its new name (relative to the home), or None."""
        parts = PurePosixPath(path).parts
        for depth in range(1, len(parts)):
            here = PurePosixPath(*parts[:depth])
            try:
                st = (self.root / here).lstat()
            except FileNotFoundError:
                return None
            if not stat.S_ISDIR(st.st_mode):
                aside = merge.marked_name(str(here), f"mine-{stamp}")
                os.rename(self.root / here, self.root / aside)
                return str(here), aside
        return None


@dataclass
class Report:
    """What one start has to tell the participant."""

    beside: list[tuple[str, str, bool]] = field(default_factory=list)  # (path, new, a folder)
    moved: list[tuple[str, str]] = field(default_factory=list)  # (theirs, where it is now)
    unpublished: dict[str, str] = field(default_factory=dict)  # {path: why}
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    full: list[str] = field(default_factory=list)  # not copied: the home is full
    full_reason: str = ""

    def __bool__(self) -> bool:
        return bool(self.beside or self.moved or self.unpublished or self.failed or self.full)

    def full_line(self) -> str:
        names = ", ".join(self.full[:SHOWN])
        more = f" and {len(self.full) - SHOWN} more" if len(self.full) > SHOWN else ""
        return (
            f"tutorials: your home is full ({self.full_reason}): {len(self.full)} file(s) not "
            f"copied: {names}{more}; free some space and restart your server to get them"
        )


_BESIDE_LINE = re.compile(
    r"^- `(.+)`: new version in `(.+)`( \(your home has a folder or link there\))?$"
)
_MOVED_LINE = re.compile(r"^- `(.+)` is now `(.+)`$")


def carry_over(root: Path, report: Report) -> None:
    """Add to ``report`` what the last notice said about new versions beside changed copies
    and files moved aside, while those files are still in the home: a later start must not
    make the participant lose track of them."""
    try:
        old = (root / NOTICE).read_text().splitlines()
    except (OSError, ValueError):
        return
    have = {path for path, _, _ in report.beside}
    moved = {aside for _, aside in report.moved}
    for line in old:
        beside, aside = _BESIDE_LINE.match(line), _MOVED_LINE.match(line)
        if beside and beside[1] not in have and (root / beside[2]).exists():
            report.beside.append((beside[1], beside[2], bool(beside[3])))
            have.add(beside[1])
        elif aside and aside[2] not in moved and os.path.lexists(root / aside[2]):
            report.moved.append((aside[1], aside[2]))
            moved.add(aside[2])


def write_notice(root: Path, report: Report) -> None:
    """``UPDATED-TUTORIALS.md``: what this start has to say, and what the last notice said that
    is still true (carry_over); removed when nothing is. Written under another name and renamed,
    so never half written."""
    carry_over(root, report)
    notice = root / NOTICE
    if not report:
        if notice.is_file() and not notice.is_symlink():
            notice.unlink()  # ours, and all it said is past
        return
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    lines = [f"# Updated tutorials\n\nWhat your server's start on {when} has to tell you.\n"]
    if report.beside:
        lines.append(
            "\n## New versions beside your copies\n\nThese tutorial files were updated while "
            "you had changed your copy. Your version is\nuntouched; the new version is next to "
            "it. (`tutorials-reset PATH` replaces your copy\nwith the new version, keeping yours "
            "as PATH.mine-<time>.)\n\n"
        )
        for path, new, folder in report.beside:
            why = " (your home has a folder or link there)" if folder else ""
            lines.append(f"- `{path}`: new version in `{new}`{why}\n")
    if report.moved:
        lines.append(
            "\n## Moved aside\n\nThe tutorial has a folder where you had a file; yours is "
            "kept under a new name.\n\n"
        )
        lines += [f"- `{theirs}` is now `{aside}`\n" for theirs, aside in report.moved]
    if report.unpublished:
        lines.append(
            "\n## Not published\n\nThe tutorial sync service could not publish these (tell "
            "your organizer or the\ntutorial's author; the reason says how to fix it):\n\n"
        )
        lines += [f"- `{path}`: it {why}\n" for path, why in sorted(report.unpublished.items())]
    if report.full or report.failed:
        lines.append("\n## Not copied into your home\n\nTried again at your next start.\n\n")
        lines += [f"- `{path}`: your home is full ({report.full_reason})\n" for path in report.full]
        lines += [f"- `{path}`: {why}\n" for path, why in report.failed]
    tmp = notice.with_name(f".{NOTICE}.tmp")
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.write_text("".join(lines))
        tmp.replace(notice)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        if e.errno == errno.ENAMETOOLONG:
            return f"{e.strerror} (this filesystem allows 255 bytes per name)"
        return e.strerror
    return str(e)


def sync(share: Path, home: Home) -> dict[str, int]:
    """Bring the share into the home; the count of each action (and of files that failed)."""
    counts, report = {}, Report()
    _sync(published(share), home, counts, report)
    return counts


def _sync(found: Share, home: Home, counts: dict[str, int], report: Report) -> None:
    upstream, sources = found.upstream, found.sources
    for line in found.skipped:
        print(f"tutorials: skipped {line}", file=sys.stderr)
    report.unpublished.update(found.unpublished)
    if found.unpublished:
        names = list(found.unpublished)
        more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
        print(
            f"tutorials: {len(names)} file(s) not published by the sync service: "
            f"{', '.join(names[:SHOWN])}{more} (why: {home.root / NOTICE})",
            file=sys.stderr,
        )
    recorded = home.recorded()
    paths = set(upstream) | set(home.files)
    here = home.current(paths)
    actions, record = merge.plan(upstream, recorded, here)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def failed(action: merge.Action) -> None:
        counts[FAILED] = counts.get(FAILED, 0) + 1
        # as if this start had not touched it: the next start tries again
        record.pop(action.path, None)
        if action.path in recorded:
            record[action.path] = recorded[action.path]

    # removals first: they free room, and a folder they empty may be where a file now belongs
    removals = [a for a in actions if a.kind == merge.REMOVE]
    kept = {}
    for action in removals:
        try:
            home.remove(action.path)
        except OSError as e:
            print(f"tutorials: could not remove {action.path}: {_reason(e)}", file=sys.stderr)
            counts[FAILED] = counts.get(FAILED, 0) + 1
            kept[action.path] = recorded[action.path]  # still tracked: tried again next start
            continue
        counts[merge.REMOVE] = counts.get(merge.REMOVE, 0) + 1
    if removals:
        here = home.current(paths)
        actions, record = merge.plan(upstream, recorded, here)
        record.update(kept)
    for action in actions:
        if action.kind == merge.KEEP:
            counts[merge.KEEP] = counts.get(merge.KEEP, 0) + 1
            if here.get(action.path) == upstream[action.path]:
                home.follow_mode(action.path, sources[action.path])
            continue
        if action.kind == merge.REMOVE:
            continue  # done above
        if report.full:  # the home is full: every further copy would fail the same way
            report.full.append(action.path)
            failed(action)
            continue
        target = action.path
        if action.kind == merge.BESIDE:
            target = merge.beside_name(action.path, action.blob)
        try:
            try:
                home.write(target, sources[action.path])
            except (FileExistsError, NotADirectoryError):
                moved = home.move_aside(target, stamp)  # a file of theirs where a folder goes
                if moved is None:
                    raise
                report.moved.append(moved)
                home.write(target, sources[action.path])
        except (OSError, ValueError) as e:
            if isinstance(e, OSError) and e.errno in FULL:
                report.full_reason = e.strerror or "no space left"
                report.full.append(action.path)
            else:
                print(
                    f"tutorials: could not {action.kind} {action.path}: {_reason(e)}",
                    file=sys.stderr,
                )
                report.failed.append((action.path, _reason(e)))
            failed(action)
            continue
        if action.kind == merge.BESIDE:
            report.beside.append((action.path, target, here.get(action.path) == NOT_A_FILE))
        counts[action.kind] = counts.get(action.kind, 0) + 1
    if report.full:
        print(report.full_line(), file=sys.stderr)
    for what, save in (
        ("record", lambda: home.remember(record)),
        ("notice", lambda: write_notice(home.root, report)),
    ):
        try:
            save()
        except OSError as e:
            print(
                f"tutorials: could not save the {what} ({_reason(e)}); nothing lost, the "
                "next start compares again",
                file=sys.stderr,
            )


def reset(share: Path, home: Home, paths: list[str]) -> list[str]:
    """Pristine copies of ``paths`` (all when empty); changed ones are kept as .mine-<time>."""
    found = published(share)
    upstream, sources = found.upstream, found.sources
    wanted = [str(PurePosixPath(p)) for p in paths]
    actions = merge.reset_plan(upstream, home.current(upstream), wanted)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for action in actions:
        target = home.root / action.path
        with open_published(sources[action.path]) as src:  # before moving the participant's
            if target.exists() or target.is_symlink():
                target.rename(home.root / merge.marked_name(action.path, f"mine-{stamp}"))
            home.write_from(action.path, src)
    home.remember({**home.recorded(), **{a.path: a.blob for a in actions}})
    return [a.path for a in actions]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--share", default=os.environ.get("TUTORIALS_SHARE", "/srv/tutorials"))
    parser.add_argument("--home", default=os.environ.get("TUTORIALS_HOME", "~/tutorials"))
    parser.add_argument(
        "--state", default="~/.local/share/gpu-jupyterhub/tutorials.json", metavar="FILE"
    )
    parser.add_argument("--reset", nargs="*", metavar="PATH", help="restore pristine copies")
    args = parser.parse_args(argv)
    share = Path(args.share)
    home = Home(Path(args.home).expanduser(), Path(args.state).expanduser())
    if args.reset is not None:
        try:
            restored = reset(share, home, args.reset)
        except (OSError, ValueError) as e:
            print(f"tutorials-reset: {e}", file=sys.stderr)
            return 1
        print(f"tutorials-reset: restored {len(restored)} file(s): {', '.join(restored) or '-'}")
        return 0
    try:
        counts = sync(share, home)
    except Exception as e:  # never a traceback at a server's start: one line, and it starts
        print(f"tutorials: not brought in ({type(e).__name__}: {_reason(e)})", file=sys.stderr)
        return 1
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none published"
    print(f"tutorials: {summary} ({home.root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
