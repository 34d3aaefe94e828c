"""The fleet's schedule: how many GPU machines the organizer wants at each time of the day, read
from one setting (GPUHUB_FLEET_SCHEDULE, in GPUHUB_FLEET_TIMEZONE: docs/autoscaling.md). Pure,
standard library only.

The setting is a list of entries, each a number of machines and the time of day it starts:

    10 from 08:45, 4 from 17:00
    10 machines from 08:45; 4 machines after 17:00
    2 from 7:30, 12 from 9:00, 6 from 12:15, 12 from 13:15, 0 from 18:00

``from`` and ``after`` mean the same (the number holds from that minute on), ``machines`` and
``machine`` may be left out, and entries are separated by commas or semicolons. The day wraps
around: the last entry holds until the first one of the next day (``4 from 17:00`` holds
through the night until 08:45). An empty setting is no schedule.

The number is a **floor**: the hub keeps at least that many machines (never more than the
fleet's maximum), asks for them early enough that they are ready at the time written (one
boot-and-join before it), and above the floor it follows the line as usual.

**Time zone.** Times of day are wall-clock times in one named time zone (an IANA name such as
``Europe/Berlin``; default ``UTC``), never the hub's own local time: the hub runs in a container
whose clock is UTC whatever the organizer's is, so "08:45" would silently mean 08:45 UTC. With a
named zone, "08:45" is 08:45 where the workshop is, on summer and winter time alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

EXAMPLE = "10 from 08:45, 4 from 17:00"
_ENTRY = re.compile(
    r"^(?P<count>\d+)\s*(?:machines?\s+)?(?:from|after)\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})$",
    re.IGNORECASE,
)


class ScheduleError(ValueError):
    """A schedule that cannot be read; the message says what was given and what to write."""


@dataclass(frozen=True)
class Schedule:
    """``entries``: (minute of the day, machines), by minute; ``zone``: the IANA time zone the
    minutes are in. No entries: no schedule (``at`` is 0 all day)."""

    entries: tuple[tuple[int, int], ...] = ()
    zone: str = "UTC"

    def at(self, when: float) -> int:
        """The machines the schedule asks for at epoch time ``when``."""
        if not self.entries:
            return 0
        local = datetime.fromtimestamp(when, tz=timezone.utc).astimezone(ZoneInfo(self.zone))
        minute = local.hour * 60 + local.minute
        count = self.entries[-1][1]  # the last entry holds through the night
        for start, machines in self.entries:
            if start <= minute:
                count = machines
        return count

    def most(self, start: float, end: float) -> int:
        """The most machines the schedule asks for at any moment from ``start`` to ``end``
        (epoch seconds): what to have ready when the next change is a rise."""
        count = self.at(start)
        if not self.entries or end <= start:
            return count
        for minute, machines in self.entries:
            if self._next(start, minute) <= end:
                count = max(count, machines)
        return count

    def _next(self, after: float, minute: int) -> float:
        """The first epoch time after ``after`` at which the local clock shows ``minute``."""
        zone = ZoneInfo(self.zone)
        local = datetime.fromtimestamp(after, tz=timezone.utc).astimezone(zone)
        for days in range(3):
            day = (local + timedelta(days=days)).date()
            wall = datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=zone)
            if wall.timestamp() > after:
                return wall.timestamp()
        return float("inf")  # not reached: a minute of the day comes back within a day

    def describe(self) -> str:
        """The schedule as the organizer would write it, with its zone."""
        if not self.entries:
            return "no schedule"
        written = ", ".join(f"{n} from {m // 60:02d}:{m % 60:02d}" for m, n in self.entries)
        return f"{written} ({self.zone})"


def read_schedule(text: str, zone: str = "UTC", name: str = "the schedule") -> Schedule:
    """``text`` (the setting ``name``) read into a ``Schedule`` in the time zone ``zone``; a
    ``ScheduleError`` saying what to write instead when it cannot be read."""
    zone = zone.strip() or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"{name}: unknown time zone {zone!r}; write an IANA name such as Europe/Berlin, "
            "America/New_York or UTC"
        ) from None
    entries: dict[int, int] = {}
    for part in re.split(r"[,;]", text):
        part = " ".join(part.split())
        if not part:
            continue
        found = _ENTRY.match(part)
        if not found:
            raise ScheduleError(
                f"{name}: {part!r} is not an entry of the schedule; write machines and the time "
                f"of day they start, 24-hour, e.g. {EXAMPLE!r}"
            )
        hour, minute = int(found["hour"]), int(found["minute"])
        if hour > 23 or minute > 59:
            raise ScheduleError(
                f"{name}: {part!r} has no such time of day; write HH:MM from 00:00 to 23:59"
            )
        start = hour * 60 + minute
        if start in entries:
            raise ScheduleError(
                f"{name}: two entries start at {hour:02d}:{minute:02d}; keep one of them"
            )
        entries[start] = int(found["count"])
    return Schedule(tuple(sorted(entries.items())), zone)
