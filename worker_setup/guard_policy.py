"""The GPU guard's decision: from one reading of the GPUs, whom to warn and what to stop.

Pure: no NVML, no Docker, no clock. The guard's loop reads NVML, attributes each GPU process to
a participant's server (or to nobody), calls ``decide`` and carries out the actions; this module
only decides, so every rule below is unit-tested (tests/unit/test_guard_policy.py).

The rules, each round:

- A participant's use is the sum of the GPU memory of all their processes on the GPU of their
  budget (``GPU_MEMORY_LIMIT_MB``: slices held x the GPU's memory / its slices).
- Above the **warn line** (budget x ``warn_percent`` / 100) they are *over*: a ``Warn`` every
  round while they are (``first`` on the round it began), with the numbers and their processes.
  The grace starts then; at or below the warn line again ("back within budget") it is forgotten,
  and a later excess starts a new grace.
- In ``enforce`` mode, once ``grace_seconds`` have passed since they went over, and while their
  use is above the **stop line** (budget x ``stop_percent`` / 100), their processes are stopped,
  the one holding the most memory first, and only as many as bring them to the stop line or
  below. A process stopped stays out of the count for ``grace_seconds`` (its memory is on its
  way out); still there after that, it may be stopped again.
- Processes of a participant within their budget are never touched, nor those of other
  participants. ``warn`` mode never stops anything; ``off`` does nothing and keeps no state.
- A GPU process that belongs to no participant (the host's own), that of a participant with no
  known budget, or one on another GPU than their budget's, is *reported* (``Report``, once,
  when first seen) and never stopped.
- A participant whose GPU is missing from the reading (NVML could not read it) is left as they
  were: no action, their grace neither reset nor advanced to a stop until it is read again.

The settings (``GuardSettings``: the warn and stop lines, the grace, the mode) live in
gpu_swarm_spawner/contract.py: the organizer's settings (deploy.settings) check them with the
same rules before the join line passes them on.

Standard library (and the contract) only: it runs on the GPU machines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

from gpu_swarm_spawner.contract import GuardSettings


@dataclass(frozen=True)
class GPUProcess:
    """A process using a GPU, as read: ``owner`` is the participant's server it belongs to (as
    the attribution names it, e.g. ``jy-alice``), None when it belongs to nobody."""

    pid: int
    gpu_uuid: str
    used_mb: int
    owner: str | None = None


@dataclass(frozen=True)
class Reading:
    """One round's reading: the GPUs read (their UUIDs) and their processes."""

    gpus: frozenset[str]
    processes: tuple[GPUProcess, ...] = ()


@dataclass(frozen=True)
class Budget:
    """A participant's server's budget: ``limit_mb`` of GPU ``gpu_uuid``."""

    gpu_uuid: str
    limit_mb: int


@dataclass(frozen=True)
class Warn:
    """``owner`` uses ``used_mb`` of ``budget_mb`` on ``gpu_uuid``: over since ``over_since``
    (``first``: this round); ``pids`` theirs, most memory first; ``stop_at``: when stopping may
    begin (enforce mode; None otherwise)."""

    owner: str
    gpu_uuid: str
    used_mb: int
    budget_mb: int
    pids: tuple[int, ...]
    over_since: float
    first: bool
    stop_at: float | None


@dataclass(frozen=True)
class Stop:
    """Stop process ``pid`` of ``owner``, which holds ``process_mb``; the participant used
    ``used_mb`` of ``budget_mb`` (stop line ``stop_line_mb``) on ``gpu_uuid``."""

    owner: str
    pid: int
    gpu_uuid: str
    process_mb: int
    used_mb: int
    budget_mb: int
    stop_line_mb: float


@dataclass(frozen=True)
class Report:
    """A GPU process the guard will not touch, seen for the first time: ``owner`` None (the
    host's own), or a participant without a budget on that GPU; ``reason`` says which."""

    pid: int
    gpu_uuid: str
    used_mb: int
    owner: str | None
    reason: str


Action = Union[Warn, Stop, Report]


@dataclass(frozen=True)
class GuardState:
    """What one round hands to the next: since when each participant has been over, the pids
    stopped (and when), the pids already reported. Never changed; ``decide`` makes a new one."""

    over_since: Mapping[str, float] = field(default_factory=dict)
    stopped: Mapping[int, float] = field(default_factory=dict)
    reported: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: GuardState


def decide(
    reading: Reading,
    budgets: Mapping[str, Budget],
    settings: GuardSettings,
    now: float,
    state: GuardState | None = None,
) -> Decision:
    """The actions for this ``reading`` at time ``now`` (seconds, any monotonic clock), and
    the state for the next round (``state``: the last round's; None: the first round). Warns
    and Stops come grouped by participant (sorted), then Reports (by pid)."""
    if state is None:
        state = GuardState()
    if settings.mode == "off":
        return Decision((), GuardState())
    enforce = settings.mode == "enforce"

    counted: dict[str, list[GPUProcess]] = {}
    reports: list[Report] = []
    reported: set[int] = set()
    for process in reading.processes:
        budget = budgets.get(process.owner) if process.owner is not None else None
        if budget is not None and budget.gpu_uuid == process.gpu_uuid:
            counted.setdefault(process.owner, []).append(process)
            continue
        if process.owner is None:
            reason = "belongs to no participant"
        elif budget is None:
            reason = f"{process.owner} has no known budget"
        else:
            reason = f"not on {process.owner}'s GPU {budget.gpu_uuid}"
        reported.add(process.pid)
        if process.pid not in state.reported:
            reports.append(Report(process.pid, process.gpu_uuid, process.used_mb,
                                  process.owner, reason))  # fmt: skip

    # a stopped pid is out of the count for one grace; forgotten once it is gone
    listed = {p.pid for p in reading.processes}
    stopped = {
        pid: when
        for pid, when in state.stopped.items()
        if pid in listed and now - when < settings.grace_seconds
    }

    actions: list[Action] = []
    over_since: dict[str, float] = {}
    for owner in sorted(set(budgets) | set(state.over_since)):
        budget = budgets.get(owner)
        if budget is None:
            continue  # gone: nothing to carry
        if budget.gpu_uuid not in reading.gpus:
            if owner in state.over_since:  # not read this round: left as it was
                over_since[owner] = state.over_since[owner]
            continue
        processes = sorted(counted.get(owner, ()), key=lambda p: (-p.used_mb, p.pid))
        used = sum(p.used_mb for p in processes)
        warn_line = budget.limit_mb * settings.warn_percent / 100
        if used <= warn_line:
            continue  # within budget: the grace is forgotten
        since = state.over_since.get(owner, now)
        over_since[owner] = since
        stop_at = since + settings.grace_seconds if enforce else None
        actions.append(Warn(owner, budget.gpu_uuid, used, budget.limit_mb,
                            tuple(p.pid for p in processes), since,
                            first=owner not in state.over_since, stop_at=stop_at))  # fmt: skip
        if stop_at is None or now < stop_at:
            continue
        stop_line = budget.limit_mb * settings.stop_percent / 100
        remaining = sum(p.used_mb for p in processes if p.pid not in stopped)
        for process in processes:
            if remaining <= stop_line:
                break
            if process.pid in stopped:
                continue
            actions.append(Stop(owner, process.pid, budget.gpu_uuid, process.used_mb, used,
                                budget.limit_mb, stop_line))  # fmt: skip
            stopped[process.pid] = now
            remaining -= process.used_mb

    actions.extend(sorted(reports, key=lambda r: r.pid))
    return Decision(tuple(actions), GuardState(over_since, stopped, frozenset(reported)))
