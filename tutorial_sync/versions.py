"""Which published versions of a tutorial repository may be deleted. Pure functions, no I/O.

Each publish writes a fresh directory; the repository's name on the share is a symlink that is
switched to it in one rename. A reader that resolved the symlink just before the switch may
still be copying from the previous directory, so a superseded version is kept for a grace
period after the moment it was superseded, and the newest superseded one is always kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Version:
    directory: str
    published_at: float


def to_delete(versions: list[Version], current: str, now: float, keep_seconds: float) -> list[str]:
    """Directories that no reader can still need: superseded more than ``keep_seconds`` ago.

    ``current`` is the directory the symlink points at; it is never deleted, and neither is
    the version published just before it.
    """
    ordered = sorted(versions, key=lambda v: v.published_at)
    doomed = []
    for older, newer in zip(ordered, ordered[1:]):
        if older.directory == current:
            continue
        if now - newer.published_at > keep_seconds:  # superseded when ``newer`` came
            doomed.append(older.directory)
    # the newest version that is not current stays, whatever its age
    previous = [v.directory for v in ordered if v.directory != current][-1:]
    return [d for d in doomed if d not in previous]
