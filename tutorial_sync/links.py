"""What a repository's symbolic links publish. Pure functions, no I/O.

The share is bind-mounted read-only into every server and then copied into homes, so it holds
regular files and folders only, never a link: a link to something inside the repository is
published as a copy of it, and any other link is skipped with the reason. Targets are resolved
in the commit's own tree (paths and link texts from git), never on a filesystem, so no link can
be followed outside the repository, whatever it points at.

- a link to a file: a copy of the file (links to links are followed, 40 at most);
- a link to a folder: copies of every file under it, links inside it resolved the same way;
- skipped: an absolute target, one that climbs out of the repository, one that names nothing
  (dangling), a loop, a link to a folder that contains the link (its copy would never end), and
  links that would add more than ``MAX_COPIES`` entries in all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_HOPS = 40  # links followed while resolving one target (Linux's own limit)
MAX_COPIES = 10_000  # entries (copies and skips) a repository's links may add

_FILE, _FOLDER, _LINK = "file", "folder", "link"

Parts = tuple  # a path in the tree as its names: ("data", "table.csv"); () is the root


@dataclass
class Published:
    """``copies``: ``{path on the share: path of the file it copies}``; ``skipped``:
    ``{path: why nothing is published there}``."""

    copies: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


class _Skip(Exception):
    """This link publishes nothing; the message says why."""


class _TooMany(Exception):
    pass


class _Tree:
    def __init__(self, files: Iterable[str], links: dict[str, str]):
        self.targets = {_parts(p): t for p, t in links.items()}
        leaves = [(_parts(p), _FILE) for p in files] + [(p, _LINK) for p in self.targets]
        self.children: dict[Parts, dict[str, str]] = {(): {}}
        for path, _ in leaves:
            for i in range(len(path) - 1):
                self.children.setdefault(path[:i], {})[path[i]] = _FOLDER
                self.children.setdefault(path[: i + 1], {})
        for path, kind in leaves:  # a name that is also a folder stays a folder
            self.children[path[:-1]].setdefault(path[-1], kind)

    def kind(self, path: Parts) -> str | None:
        return self.children.get(path[:-1], {}).get(path[-1]) if path else _FOLDER

    def follow(self, folder: Parts, target: str, hops: list[int]) -> tuple[str, Parts]:
        """What ``target`` (a link's text) names, seen from ``folder``: (kind, path)."""
        if target.startswith("/"):
            raise _Skip(f"points outside the repository ({target})")
        if not target:
            raise _Skip("is an empty link (dangling)")
        parts = [p for p in target.split("/") if p not in ("", ".")]
        where, kind = folder, _FOLDER
        for part in parts:
            if kind == _FILE:
                raise _Skip(f"points to {target}, but {'/'.join(where)} is a file, not a folder")
            if part == "..":
                if not where:
                    raise _Skip(f"points outside the repository ({target})")
                where = where[:-1]
                continue
            here = (*where, part)
            kind = self.kind(here)
            if kind == _LINK:
                hops[0] -= 1
                if hops[0] < 0:
                    raise _Skip(f"is a loop of links (or a chain of more than {MAX_HOPS})")
                kind, here = self.follow(where, self.targets[here], hops)
            elif kind is None:
                raise _Skip(f"points to {target}, which is not in the repository (dangling)")
            where = here
        return kind, where


class _Collector:
    def __init__(self, room: int):
        self.room = room
        self.result = Published()

    def _count(self) -> None:
        self.room -= 1
        if self.room < 0:
            raise _TooMany

    def copy(self, at: Parts, source: Parts) -> None:
        self._count()
        self.result.copies["/".join(at)] = "/".join(source)

    def skip(self, at: Parts, why: str) -> None:
        self._count()
        self.result.skipped["/".join(at)] = why


def _publish(tree: _Tree, at: Parts, link: Parts, around: tuple, out: _Collector) -> None:
    """Publish the link ``link`` at ``at``; ``around`` holds the folders (as in the tree)
    whose copies are being made, which the link must not contain."""
    try:
        kind, target = tree.follow(link[:-1], tree.targets[link], [MAX_HOPS])
    except _Skip as e:
        return out.skip(at, str(e))
    if kind == _FILE:
        return out.copy(at, target)
    around = (*around, link[:-1])
    if len(around) > MAX_HOPS:
        return out.skip(at, f"is inside more than {MAX_HOPS} linked folders")
    if any(folder[: len(target)] == target for folder in around):
        shown = "/".join(target) or "the repository's root"
        return out.skip(at, f"points to {shown}, a folder holding the link itself (a loop)")
    _copy_folder(tree, target, at, around, out)


def _copy_folder(tree: _Tree, folder: Parts, at: Parts, around: tuple, out: _Collector) -> None:
    for name, kind in sorted(tree.children[folder].items()):
        source, copy = (*folder, name), (*at, name)
        if kind == _FILE:
            out.copy(copy, source)
        elif kind == _FOLDER:
            _copy_folder(tree, source, copy, around, out)
        else:
            _publish(tree, copy, source, around, out)


def resolve(files: Iterable[str], links: dict[str, str], max_copies=MAX_COPIES) -> Published:
    """What to publish for ``links`` (``{path: link text}``) in a tree of regular ``files``."""
    tree = _Tree(files, links)
    published = Published()
    for link in sorted(tree.targets):
        name = "/".join(link)
        if tree.kind(link) != _LINK:
            published.skipped[name] = "is a link and a folder at once (a malformed tree)"
            continue
        out = _Collector(max_copies - len(published.copies) - len(published.skipped))
        try:
            _publish(tree, link, link, (), out)
        except _TooMany:
            published.skipped[name] = (
                f"would publish more than {max_copies} files through links; commit the "
                "files themselves or link to a smaller folder"
            )
            continue
        published.copies.update(out.result.copies)
        published.skipped.update(out.result.skipped)
    return published


def _parts(path: str) -> Parts:
    return tuple(path.split("/"))
