"""What the GPU machines cost: machine-hours and an estimated cost beside the slice-hours the
participants used, from the fleet's history. Pure, standard library only; the dashboard and
``make status`` show ``usage`` (fleet.py writes it into the snapshot, docs/autoscaling.md).

A machine is paid for from the moment the hub asked the cloud for it (the cloud bills a
machine that boots) until it is gone, whether it ever held a server or not; a machine the
organizer joined by hand is paid for from when it joined. The price is the organizer's figure
per machine-hour (a proposed setting, docs/autoscaling.md), so the cost is an estimate: the
cloud's bill rounds, discounts and adds disks and traffic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A stretch of time something was held: a machine (``slices``: its slices) or a
    participant's server (``slices``: those it reserved). ``end`` None: still held."""

    start: float
    end: float | None = None
    slices: int = 0

    def hours(self, now: float) -> float:
        end = now if self.end is None else min(self.end, now)
        return max(end - self.start, 0.0) / 3600


@dataclass(frozen=True)
class Usage:
    machine_hours: float
    slice_hours_offered: float  # the machines' slices times their hours
    slice_hours_used: float  # the servers' slices times their hours
    price_per_hour: float  # 0: no price set

    @property
    def cost(self) -> float:
        return self.machine_hours * self.price_per_hour

    @property
    def used_share(self) -> float:
        """Of the slice-hours paid for, the share participants used (0 to 1)."""
        if not self.slice_hours_offered:
            return 0.0
        return min(self.slice_hours_used / self.slice_hours_offered, 1.0)

    def describe(self, currency: str = "$") -> str:
        """One line for ``make status`` and the dashboard."""
        line = (
            f"{self.machine_hours:.1f} machine-hours, {self.slice_hours_used:.1f} of "
            f"{self.slice_hours_offered:.1f} slice-hours used ({self.used_share:.0%})"
        )
        if self.price_per_hour:
            price = f"{currency}{self.price_per_hour:g}"
            line += f", about {currency}{self.cost:,.2f} at {price} an hour"
        return line


def usage(
    machines: Sequence[Span], servers: Sequence[Span], now: float, price_per_hour: float = 0.0
) -> Usage:
    """The usage up to ``now`` of ``machines`` (each machine's time, asked for until gone) and
    ``servers`` (each server's time with its slices)."""
    if price_per_hour < 0:
        raise ValueError(f"a price per machine-hour cannot be negative ({price_per_hour})")
    return Usage(
        machine_hours=sum(m.hours(now) for m in machines),
        slice_hours_offered=sum(m.hours(now) * m.slices for m in machines),
        slice_hours_used=sum(s.hours(now) * s.slices for s in servers),
        price_per_hour=price_per_hour,
    )
