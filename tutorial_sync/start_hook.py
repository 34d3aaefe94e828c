"""Bring the published tutorials into the participant's home at server start.

    python -m tutorial_sync.start_hook [--share /srv/tutorials] [--home ~/tutorials]
    tutorials-reset [PATH ...]      (python -m tutorial_sync.start_hook --reset [PATH ...])

Runs inside the single-user container, as the participant, before the server starts (the
image's ``start-singleuser``). The share is read-only; each repository on it is resolved once,
so a publish during the copy cannot mix two versions. The rules are in tutorial_sync.merge;
what was copied is recorded (git blob ids, with size and mtime to skip re-hashing unchanged
files) in ``~/.local/share/gpu-jupyterhub/tutorials.json``, so "modified" is known without git.
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path, PurePosixPath

from . import MANIFEST, merge

NOTICE = "UPDATED-TUTORIALS.md"


def blob_id(path: Path) -> str:
    """git's blob id of a file, hashed in chunks (data files can be large)."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def published(share: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """``{path: blob}`` over every repository on the share, and where each file is read from.

    Paths are ``<repository>/<file>``; each repository's directory is resolved once.
    """
    upstream, sources = {}, {}
    if not share.is_dir():
        return upstream, sources
    for entry in sorted(share.iterdir()):
        if entry.name.startswith("."):
            continue
        real = entry.resolve()
        try:
            manifest = json.loads((real / MANIFEST).read_text())
        except (OSError, ValueError):
            continue  # not a published repository
        for path, blob in manifest["files"].items():
            key = f"{entry.name}/{path}"
            upstream[key], sources[key] = blob, real / path
    return upstream, sources


class Home:
    """The participant's tutorials folder and the record of what was copied into it."""

    def __init__(self, root: Path, state: Path):
        self.root, self.state = root, state
        try:
            self.files = json.loads(state.read_text())["files"]
        except (OSError, ValueError, KeyError):
            self.files = {}

    def recorded(self) -> dict[str, str]:
        return {path: entry["blob"] for path, entry in self.files.items()}

    def current(self, paths) -> dict[str, str]:
        """Blob ids of the files now in the home among ``paths`` (absent ones are left out)."""
        found = {}
        for path in paths:
            target = self.root / path
            if not target.is_file():
                continue
            st, entry = target.stat(), self.files.get(path)
            if entry and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns:
                found[path] = entry["blob"]  # untouched since written: no need to hash
            else:
                found[path] = blob_id(target)
        return found

    def write(self, path: str, source: Path) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tutorial-tmp")
        shutil.copyfile(source, tmp)
        tmp.replace(target)

    def remember(self, record: dict[str, str]) -> None:
        """Save ``record``, with size and mtime of the files that hold exactly that content."""
        files = {}
        for path, blob in record.items():
            target, old = self.root / path, self.files.get(path, {})
            entry = {"blob": blob, "size": -1, "mtime_ns": -1}
            if target.is_file():
                st = target.stat()
                same = old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
                if (same and old.get("blob") == blob) or blob_id(target) == blob:
                    entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns)
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
    upstream, sources = published(share)
    actions, record = merge.plan(
        upstream, home.recorded(), home.current(set(upstream) | set(home.files))
    )
    counts, beside = {}, []
    for action in actions:
        counts[action.kind] = counts.get(action.kind, 0) + 1
        if action.kind in (merge.COPY, merge.UPDATE):
            home.write(action.path, sources[action.path])
        elif action.kind == merge.BESIDE:
            new = merge.beside_name(action.path, action.blob)
            home.write(new, sources[action.path])
            beside.append((action.path, new))
        elif action.kind == merge.REMOVE:
            (home.root / action.path).unlink(missing_ok=True)
    home.remember(record)
    write_notice(home.root, beside)
    return counts


def reset(share: Path, home: Home, paths: list[str]) -> list[str]:
    """Pristine copies of ``paths`` (all when empty); changed ones are kept as .mine-<time>."""
    upstream, sources = published(share)
    wanted = [str(PurePosixPath(p)) for p in paths]
    actions = merge.reset_plan(upstream, home.current(upstream), wanted)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for action in actions:
        target = home.root / action.path
        if target.exists():
            p = PurePosixPath(action.path)
            target.rename(home.root / p.with_name(f"{p.stem}.mine-{stamp}{p.suffix}"))
        home.write(action.path, sources[action.path])
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
        except ValueError as e:
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
