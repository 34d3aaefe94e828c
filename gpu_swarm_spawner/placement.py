"""Which GPU a new server gets: pure placement policies over an inventory.

``spread`` (the default) gives a newcomer the GPU with the most free slices, so participants
share GPUs as little as possible. ``pack`` fills the busiest GPU that still fits first, so whole
machines can be emptied and switched off. A request is always satisfied from a single GPU:
some of its slices, or all of them (``slices=None``: a whole GPU, however many slices that GPU
is advertised as; with ``--slice-memory`` a large GPU may have 20 where a small one has 3).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .inventory import GPU

POLICIES = ("spread", "pack")


@dataclass(frozen=True)
class Request:
    """What a spawn asks for."""

    slices: int | None  # slices of one GPU; None: a whole GPU, all of its own slices
    policy: str = "spread"
    seed: str = ""  # the user's name: ties between GPUs break differently per user
    prefer_node: str = ""  # the machine of the user's home volume, when it has room


def _tiebreak(gpu: GPU, seed: str) -> tuple:
    if not seed:
        return (gpu.node_name, gpu.uuid)
    return (hashlib.sha256(f"{seed}/{gpu.uuid}".encode()).hexdigest(), gpu.uuid)


def fits(gpu: GPU, slices: int | None) -> bool:
    """``gpu`` has room for ``slices`` slices (None: nobody uses it, so all of it is free)."""
    return gpu.used == 0 if slices is None else gpu.free >= slices


def slices_taken(gpu: GPU, slices: int | None) -> int:
    """The slices of ``gpu`` a request of ``slices`` reserves (None: all of the GPU's own)."""
    return gpu.slices if slices is None else slices


def candidates(
    gpus: list[GPU],
    slices: int | None,
    policy: str = "spread",
    seed: str = "",
    prefer_node: str = "",
) -> list[GPU]:
    """GPUs that can hold ``slices`` slices (None: a whole GPU), best first under ``policy``.

    GPUs of ``prefer_node`` (the machine holding the user's home volume) come first when one of
    them fits, so a returning participant finds their files; the policy orders within each
    group.

    Between GPUs with equally many free slices, ``spread`` prefers the node with fewer slices
    in use and ``pack`` the node with more (so pack fills a machine before starting the next).
    Remaining ties are ordered by node name and UUID, or, given a ``seed`` (the user's name),
    by a hash of seed and UUID: still deterministic, but users who spawn at the same moment
    from the same inventory spread over the tied GPUs instead of racing for one.
    An empty list means nothing fits.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; use one of {', '.join(POLICIES)}")
    if slices is not None and slices < 1:
        raise ValueError(f"a server needs at least 1 GPU slice, not {slices}")
    node_used: dict[str, int] = {}
    for g in gpus:
        node_used[g.node_id] = node_used.get(g.node_id, 0) + g.used
    fitting = [g for g in gpus if fits(g, slices)]
    sign = -1 if policy == "spread" else 1
    return sorted(
        fitting,
        key=lambda g: (
            g.node_name != prefer_node if prefer_node else False,
            sign * g.free,
            -sign * node_used[g.node_id],
            *_tiebreak(g, seed),
        ),
    )


def choose(
    gpus: list[GPU],
    slices: int | None,
    policy: str = "spread",
    seed: str = "",
    prefer_node: str = "",
) -> GPU | None:
    """The best GPU for a request of ``slices`` slices (None: a whole GPU), or None when no
    GPU has room."""
    ranked = candidates(gpus, slices, policy, seed, prefer_node)
    return ranked[0] if ranked else None


def cpu_node(gpus: list[GPU], home: str = "") -> str:
    """The machine for a server without a GPU: ``home`` (the participant's home volume) when
    it is a schedulable GPU machine, else the GPU machine with most free slices (so a later
    restart with a GPU likely finds room beside the same home); "" when there is none."""
    free: dict[str, int] = {}
    for g in gpus:
        free[g.node_name] = free.get(g.node_name, 0) + g.free
    if home in free:
        return home
    return min(free, key=lambda n: (-free[n], n)) if free else ""


def refusal_message(gpus: list[GPU], slices: int | None) -> str:
    """What a participant reads when no GPU has ``slices`` free slices (None: no GPU is free
    as a whole)."""
    if not gpus:
        return (
            "No GPU is available in this hub right now (no GPU machine is connected). "
            "Please tell an organizer."
        )
    total = sum(g.slices for g in gpus)
    free = sum(g.free for g in gpus)
    biggest = max(g.slices for g in gpus)
    if slices is not None and slices > biggest:
        return (
            f"This server option needs {slices} GPU slices on one GPU, but the largest GPU here "
            f"has {biggest}. Choose a smaller option or ask an organizer."
        )
    if free == 0:
        return (
            f"All GPU slices are in use ({total}/{total}). "
            "Try again in a few minutes or ask an organizer."
        )
    if slices is None:
        return (
            "A full GPU needs a GPU that nobody is using, and every GPU has servers on it right "
            f"now ({free} of {total} slices are free). Try again in a few minutes, choose a "
            "GPU slice, or ask an organizer."
        )
    return (
        f"No single GPU has {slices} free slices right now ({free} of {total} slices are free, "
        "spread over several GPUs). Try again in a few minutes, choose a smaller option, "
        "or ask an organizer."
    )
