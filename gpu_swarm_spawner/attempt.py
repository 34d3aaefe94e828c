"""One run of a server's ``start``: what it reserved, how it went, what its participant was told.

``GPUSwarmSpawner.start`` makes a new ``Attempt`` each time it runs, so nothing of an earlier
start (its marks, its wait in line, its refusal, its progress messages) carries into the next:
there is nothing to reset by hand. The spawner keeps the latest one after the start ends (poll
reads whether it was refused, JupyterHub's ``ready`` whether it was cancelled in line).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .broker import Reservation


@dataclass(eq=False)
class Attempt:
    """A start: begun at ``started_at`` (time.monotonic; None: no start yet)."""

    started_at: float | None = None
    #: the slices it holds claimed (the gate's, handed to the start, or its own)
    reservation: Reservation | None = None
    #: its marks (events.PHASES): seconds from its beginning, less the wait in line
    phases: dict[str, float] = field(default_factory=dict)
    #: its stages for the spawn page, newest last: {"progress": percent, "message": text}
    progress: list[dict] = field(default_factory=list)
    line_joined: float = 0.0  # when (epoch s) it joined the waiting line; 0: not in it
    waited: float | None = None  # seconds it waited in line before its slices (None: it did not)
    refused: bool = False  # refused before any service was made (or left)
    cancelled_in_line: bool = False  # it ended in the line, cancelled (left, or hub stopping)

    @classmethod
    def begin(cls, reservation: Reservation | None = None) -> Attempt:
        """A start beginning now, with the reservation it was handed (the gate's) if any."""
        return cls(started_at=time.monotonic(), reservation=reservation)

    def seconds(self) -> float:
        """How long it has run, less its wait in line."""
        if self.started_at is None:
            return 0.0
        return time.monotonic() - self.started_at - (self.waited or 0)

    def mark(self, name: str) -> None:
        """It reached ``name`` (events.PHASES), now; the first time is kept."""
        if name not in self.phases and self.started_at is not None:
            self.phases[name] = round(self.seconds(), 3)

    def report(self, progress: int, message: str) -> bool:
        """A stage for the spawn page's progress bar; False when it repeats the last one."""
        if self.progress and self.progress[-1]["message"] == message:
            return False
        self.progress.append({"progress": progress, "message": message})
        return True
