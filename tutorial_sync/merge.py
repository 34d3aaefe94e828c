"""What the start hook does with each tutorial file. Pure functions, no I/O.

Three views of every path, each ``{path: git blob id}``:

- ``upstream``: the published version (from the share's manifest);
- ``recorded``: what the hook copied into the home last time (its state file);
- ``home``: what is in the home now (paths missing there are absent).

The rules: new files are copied; files the participant has not changed follow upstream (and go
when upstream deletes them); files the participant changed are never touched: when upstream
changed too, the new version is put beside them and listed in a notice; a file the participant
deleted stays deleted until upstream changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

COPY = "copy"  # new upstream file: copy it
UPDATE = "update"  # unmodified by the participant, changed upstream: replace it
BESIDE = "beside"  # modified by the participant and changed upstream: new version beside it
REMOVE = "remove"  # deleted upstream, unmodified here: remove the copy
KEEP = "keep"  # nothing to write (same content, the participant's version, or their deletion)


@dataclass(frozen=True)
class Action:
    kind: str
    path: str
    blob: str = ""  # the upstream blob to write (copy, update, beside)


NAME_MAX = 255  # bytes in one file name on a Linux filesystem


def marked_name(path: str, mark: str) -> str:
    """``path`` with ``.MARK`` before its suffix (``lesson.new-1a2b3c4.ipynb``), the stem cut
    short where the name would pass NAME_MAX bytes: a tutorial name of 255 bytes has room."""
    p = PurePosixPath(path)
    tail = f".{mark}{p.suffix}"
    if len(tail.encode("utf-8", "surrogateescape")) > NAME_MAX // 2:
        tail = f".{mark}"  # a "suffix" that long is no extension: keep the room for the stem
    room = NAME_MAX - len(tail.encode("utf-8", "surrogateescape"))
    stem = p.name[: len(p.name) - len(p.suffix)] if tail.endswith(p.suffix) else p.name
    encoded = stem.encode("utf-8", "surrogateescape")
    if len(encoded) > room:
        stem = encoded[:room].decode("utf-8", "ignore")  # never half a character
    return str(p.with_name(f"{stem}{tail}"))


def beside_name(path: str, blob: str) -> str:
    """Where the new upstream version of a modified file goes: ``lesson.new-1a2b3c4.ipynb``."""
    return marked_name(path, f"new-{blob[:7]}")


def plan(
    upstream: dict[str, str], recorded: dict[str, str], home: dict[str, str]
) -> tuple[list[Action], dict[str, str]]:
    """The actions for one start, and the new record (what the home now holds from upstream).

    A file's record is the upstream version the participant was last given; a file whose home
    content differs from its record was changed by the participant.
    """
    actions, record = [], {}
    for path, blob in sorted(upstream.items()):
        given = recorded.get(path)
        here = home.get(path)
        if here is None:
            if given is not None and given == blob:
                actions.append(Action(KEEP, path))  # deleted by the participant: respected
                record[path] = given
            else:
                actions.append(Action(COPY, path, blob))
                record[path] = blob
        elif here == blob:
            actions.append(Action(KEEP, path))
            record[path] = blob
        elif given is not None and here == given:
            actions.append(Action(UPDATE, path, blob))
            record[path] = blob
        elif given == blob:
            actions.append(Action(KEEP, path))  # the participant's version; upstream unchanged
            record[path] = blob
        else:
            actions.append(Action(BESIDE, path, blob))
            record[path] = blob  # offered once: not again until upstream changes again
    for path, given in sorted(recorded.items()):
        if path in upstream:
            continue
        if home.get(path) == given:
            actions.append(Action(REMOVE, path))
        # changed by the participant, or already gone: theirs now, no longer tracked
    return actions, record


def reset_plan(upstream: dict[str, str], home: dict[str, str], paths: list[str]) -> list[Action]:
    """Restore pristine copies of ``paths`` (all upstream files when empty)."""
    chosen = paths or sorted(upstream)
    unknown = [p for p in chosen if p not in upstream]
    if unknown:
        raise ValueError(
            f"not a tutorial file: {', '.join(unknown)}; give paths relative to the tutorials "
            "folder, e.g. intro/01-start.ipynb"
        )
    return [Action(UPDATE, p, upstream[p]) for p in chosen if home.get(p) != upstream[p]]
