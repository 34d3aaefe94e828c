"""Which GPU a new server gets: pure placement policies over an inventory.

``spread`` (the default) gives a newcomer the GPU with the most free slices, so participants
share GPUs as little as possible. ``pack`` fills the busiest GPU that still fits first, so whole
machines can be emptied and switched off. A request is always satisfied from a single GPU.
"""

from __future__ import annotations

import hashlib

from .inventory import GPU

POLICIES = ("spread", "pack")


def _tiebreak(gpu: GPU, seed: str) -> tuple:
    if not seed:
        return (gpu.node_name, gpu.uuid)
    return (hashlib.sha256(f"{seed}/{gpu.uuid}".encode()).hexdigest(), gpu.uuid)


def candidates(
    gpus: list[GPU], slices: int, policy: str = "spread", seed: str = "", prefer_node: str = ""
) -> list[GPU]:
    """GPUs that can hold ``slices`` slices, best first under ``policy``.

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
    if slices < 1:
        raise ValueError(f"a server needs at least 1 GPU slice, not {slices}")
    node_used: dict[str, int] = {}
    for g in gpus:
        node_used[g.node_id] = node_used.get(g.node_id, 0) + g.used
    fitting = [g for g in gpus if g.free >= slices]
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
    gpus: list[GPU], slices: int, policy: str = "spread", seed: str = "", prefer_node: str = ""
) -> GPU | None:
    """The best GPU for a request of ``slices`` slices, or None when no GPU has room."""
    ranked = candidates(gpus, slices, policy, seed, prefer_node)
    return ranked[0] if ranked else None


def refusal_message(gpus: list[GPU], slices: int) -> str:
    """What a participant reads when no GPU has ``slices`` free slices."""
    if not gpus:
        return (
            "No GPU is available in this hub right now (no GPU machine is connected). "
            "Please tell an organizer."
        )
    total = sum(g.slices for g in gpus)
    free = sum(g.free for g in gpus)
    biggest = max(g.slices for g in gpus)
    if slices > biggest:
        return (
            f"This server option needs {slices} GPU slices on one GPU, but the largest GPU here "
            f"has {biggest}. Choose a smaller option or ask an organizer."
        )
    if free == 0:
        return (
            f"All GPU slices are in use ({total}/{total}). "
            "Try again in a few minutes or ask an organizer."
        )
    return (
        f"No single GPU has {slices} free slices right now ({free} of {total} slices are free, "
        "spread over several GPUs). Try again in a few minutes, choose a smaller option, "
        "or ask an organizer."
    )
