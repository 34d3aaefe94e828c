"""Reading JSON that another process wrote (a machine's disk report, the fleet's snapshot):
a value of the wrong type is "unknown", never an error. Pure, standard library only."""

from __future__ import annotations

import math


def number(value) -> float | None:
    """``value`` as a finite number; None for anything else (a bool, text, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
