"""The waiting line for GPU slices: who gets freed slices, in what order. Pure; the broker
(``broker.py``) keeps the line and applies each pass.

The rule, in order of arrival:

1. Each pass walks the line from its head and gives every participant who fits a GPU now
   (the placement policy chooses which), so slices go to the earliest who can use them.
2. The earliest participant who does **not** fit *holds* one GPU: the one closest to having
   room for them (for a full GPU: the one with the fewest slices in use), and keeps holding
   it from pass to pass. Nobody behind them gets slices of that GPU, so it empties as its
   servers stop and they get it; everyone else goes on using the other GPUs.

So a request for a full GPU never blocks 1-slice requests behind it (they use every GPU but
the held one), and is never starved by them (they cannot refill the GPU it waits for). Only one
GPU is held at a time. Newcomers are served after the line (``Entry`` last), never before it.

``estimate`` turns the pace at which the line has moved into "about N minutes", and says
nothing while there is no pace to go by.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

from . import placement
from .inventory import GPU
from .placement import Request


@dataclass(frozen=True)
class Entry:
    """One participant in the line."""

    owner: Hashable  # their spawner
    request: Request
    joined: float = 0.0  # when, on the broker's clock


@dataclass(frozen=True)
class Assignment:
    owner: Hashable
    gpu: GPU  # as the pass saw it before taking slices of it
    slices: int


@dataclass(frozen=True)
class Pass:
    """What one pass decided: who starts now, and which GPU is held for whom."""

    assigned: tuple[Assignment, ...] = ()
    held_gpu: str = ""  # the UUID of the GPU held for ``held_for``; "" when none is
    held_for: Hashable | None = None

    def of(self, owner: Hashable) -> Assignment | None:
        return next((a for a in self.assigned if a.owner == owner), None)


def closest(gpus: Sequence[GPU], slices: int | None) -> GPU | None:
    """The GPU that will have room for ``slices`` (None: a whole GPU) soonest, as far as can
    be told: the fewest slices to free; None when no GPU is big enough."""
    big_enough = [g for g in gpus if slices is None or g.slices >= slices]
    if not big_enough:
        return None

    def missing(g: GPU) -> int:
        return g.used if slices is None else max(slices - g.free, 0)

    return min(big_enough, key=lambda g: (missing(g), g.node_name, g.uuid))


def assign(line: Sequence[Entry], gpus: Sequence[GPU], held: Pass | None = None) -> Pass:
    """One pass over ``line`` (earliest first) with the inventory ``gpus`` (claims included);
    ``held``: the previous pass, whose held GPU stays held for the same participant."""
    free = {g.uuid: g for g in gpus}
    assigned: list[Assignment] = []
    held_gpu, held_for = "", None
    for entry in line:
        request = entry.request
        usable = [g for uuid, g in free.items() if uuid != held_gpu]
        gpu = placement.choose(
            usable, request.slices, request.policy, request.seed, request.prefer_node
        )
        if gpu is not None:
            taken = placement.slices_taken(gpu, request.slices)
            assigned.append(Assignment(entry.owner, gpu, taken))
            free[gpu.uuid] = replace(gpu, used=gpu.used + taken)
        elif held_for is None:
            if held is not None and held.held_for == entry.owner and held.held_gpu in free:
                held_gpu, held_for = held.held_gpu, entry.owner  # sticky: it is emptying
                continue
            target = closest(list(free.values()), request.slices)
            if target is not None:
                held_gpu, held_for = target.uuid, entry.owner
    return Pass(tuple(assigned), held_gpu, held_for)


def can_ever_fit(gpus: Sequence[GPU], slices: int | None) -> bool:
    """Some GPU is big enough for the request once it is free (a line worth joining)."""
    return closest(gpus, slices) is not None


def position(line: Sequence[Entry], owner: Hashable) -> int:
    """1 for the head of the line; 0 when ``owner`` is not in it."""
    for number, entry in enumerate(line, start=1):
        if entry.owner == owner:
            return number
    return 0


def estimate(
    position: int, served: Sequence[float], now: float, since: float, window: float = 1800.0
) -> float | None:
    """Seconds until the participant at ``position`` is likely served, from the pace of the
    line: ``served`` are the times participants left it with a GPU, ``since`` when the line
    last began (only its time counts), both on ``now``'s clock. None without a pace yet."""
    start = max(since, now - window)
    recent = [t for t in served if start <= t <= now]
    if not recent or now <= start:
        return None
    rate = len(recent) / (now - start)
    return position / rate


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def about(seconds: float) -> str:
    """A wait, rounded as people say it: "less than a minute", "about 4 minutes"."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "less than a minute"
    if minutes < 90:
        return f"about {minutes} minute{'s' if minutes != 1 else ''}"
    return f"about {seconds / 3600:.1f} hours"


def waiting_message(
    position: int, waiting: int, eta: float | None, held: bool, fleet: str = ""
) -> str:
    """What a participant in the line reads on the spawn page; ``held``: a GPU is emptying for
    them (said to those asking for more than one slice, for whom it matters); ``fleet``: what
    the fleet keeper says of the GPU machines (one on its way, or the cloud's refusal)."""
    where = f"You are {ordinal(position)} in line ({waiting} waiting)"
    if held:
        where += "; a GPU is being kept free for you"
    when = f"{about(eta)}." if eta is not None else "no estimate yet (nobody has left the line)."
    if fleet:
        when += f" {fleet}"
    return (
        f"No GPU has room for your server right now. {where}: {when} Your server starts by "
        "itself when a slice frees up; you keep your place if you close this page, and "
        "Stop Server below leaves the line."
    )
