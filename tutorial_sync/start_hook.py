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
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path, PurePosixPath

from . import MANIFEST, merge

NOTICE = "UPDATED-TUTORIALS.md"
FAILED = "failed"  # the count of files that could not be written (reported, retried next start)
# what the home holds at a tutorial file's path when it is not a readable regular file: never a
# blob id, so the merge rules treat it as the participant's own (never overwritten)
NOT_A_FILE, UNREADABLE = "(not a regular file)", "(unreadable)"


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


def published(share: Path) -> tuple[dict[str, str], dict[str, Path], list[str]]:
    """``{path: blob}`` over every repository on the share, where each file is read from, and
    what was left out (one line each).

    Paths are ``<repository>/<file>``; each repository's directory is resolved once.
    """
    upstream, sources, skipped = {}, {}, []
    try:
        entries = sorted(share.iterdir()) if share.is_dir() else []
        root = share.resolve()
    except OSError as e:
        return upstream, sources, [f"{share}: cannot be read ({e.strerror})"]
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
            files = json.loads((real / MANIFEST).read_text())["files"]
            items = [(p, b) for p, b in files.items() if isinstance(p, str) and isinstance(b, str)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a published repository
        for path, blob in items:
            key = f"{entry.name}/{path}"
            if not clean(path):
                skipped.append(f"{key}: not a plain relative path")
                continue
            upstream[key], sources[key] = blob, real / path
    return upstream, sources, skipped


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
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tutorial-tmp")
        with tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(target)

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
        tmp.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
        tmp.replace(self.state)


def write_notice(root: Path, beside: list[tuple[str, str]]) -> None:
    notice = root / NOTICE
    if not beside:
        return
    lines = [
        "# Updated tutorials\n",
        "\nThese tutorial files were updated while you had changed your copy. Your version is",
        "\nuntouched; the new version is next to it. (`tutorials-reset PATH` replaces your copy",
        "\nwith the new version, keeping yours as PATH.mine-<time>.)\n\n",
    ]
    lines += [f"- `{path}`: new version in `{new}`\n" for path, new in beside]
    notice.write_text("".join(lines))


def sync(share: Path, home: Home) -> dict[str, int]:
    """Bring the share into the home; the count of each action (and of files that failed)."""
    upstream, sources, skipped = published(share)
    for line in skipped:
        print(f"tutorials: skipped {line}", file=sys.stderr)
    recorded = home.recorded()
    actions, record = merge.plan(upstream, recorded, home.current(set(upstream) | set(home.files)))
    counts, beside = {}, []
    for action in actions:
        try:
            if action.kind in (merge.COPY, merge.UPDATE):
                home.write(action.path, sources[action.path])
            elif action.kind == merge.BESIDE:
                new = merge.beside_name(action.path, action.blob)
                home.write(new, sources[action.path])
                beside.append((action.path, new))
            elif action.kind == merge.REMOVE:
                (home.root / action.path).unlink(missing_ok=True)
        except (OSError, ValueError) as e:
            print(f"tutorials: could not {action.kind} {action.path}: {e}", file=sys.stderr)
            counts[FAILED] = counts.get(FAILED, 0) + 1
            # as if this start had not touched it: the next start tries again
            record.pop(action.path, None)
            if action.path in recorded:
                record[action.path] = recorded[action.path]
            continue
        counts[action.kind] = counts.get(action.kind, 0) + 1
    home.remember(record)
    write_notice(home.root, beside)
    return counts


def reset(share: Path, home: Home, paths: list[str]) -> list[str]:
    """Pristine copies of ``paths`` (all when empty); changed ones are kept as .mine-<time>."""
    upstream, sources, _ = published(share)
    wanted = [str(PurePosixPath(p)) for p in paths]
    actions = merge.reset_plan(upstream, home.current(upstream), wanted)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for action in actions:
        target = home.root / action.path
        with open_published(sources[action.path]) as src:  # before moving the participant's
            if target.exists() or target.is_symlink():
                p = PurePosixPath(action.path)
                target.rename(home.root / p.with_name(f"{p.stem}.mine-{stamp}{p.suffix}"))
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
    counts = sync(share, home)
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none published"
    print(f"tutorials: {summary} ({home.root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
