"""What the hub records for the organizer's dashboard: spawn events and the waiting line.

The hub (its spawners and GPU broker) writes; the dashboard service, another process, reads.
Two files in one folder (``GPUSwarmSpawner.dashboard_dir``):

- ``events.jsonl``: one JSON object per line, appended: a server started (with how long the
  start took and how long its participant waited in line), refused (no GPU had room), failed,
  stopped, or a participant joined or left the line, or the hub healed a divergence between its
  view, Swarm's and the proxy's (``healing.py``), or stopped a server for its machine's disk
  (``disk.py``), or the fleet keeper asked the cloud for a machine, paused, resumed, gave up or
  removed one, stopped a machine's idle servers, or the cloud said no (``fleet.py``:
  ``FLEET_KINDS``, with no user; ``node`` the machine, ``reason`` why, ``action`` the
  provider's kind of failure). ``read_events`` is the one reader: it skips lines it cannot
  use (a line cut short by a crash, an unknown kind from a newer version) instead of failing
  the page. The file is rotated to ``events.jsonl.1`` past ``MAX_BYTES``.
- ``line.json``: the line now, rewritten whole (atomically) whenever it changes.

``Event``, ``encode``, ``read_events``, ``line_snapshot`` and ``read_line`` are pure; ``Journal``
does the file I/O.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

#: A server the hub stopped because the disk of its machine passed the safety line (disk.py):
#: ``node`` is the machine, ``reason`` what its participant was told.
DISK_STOP = "disk stop"
#: What the fleet keeper did (fleet.py): a grow asked, a machine paused, resumed, given up or
#: removed, the cloud's refusal, a machine's idle servers stopped (GPUHUB_FLEET_STOP_IDLE_AFTER).
#: No user: ``node`` is the machine, ``reason`` why (the servers stopped, for an idle stop).
FLEET_GROW, FLEET_DRAIN, FLEET_RESUME, FLEET_GIVE_UP, FLEET_REMOVE, FLEET_FAILED = (
    "fleet grow",
    "fleet drain",
    "fleet resume",
    "fleet give up",
    "fleet remove",
    "fleet failed",
)
FLEET_STOP_IDLE = "fleet stop idle"
FLEET_KINDS = frozenset(
    {
        FLEET_GROW,
        FLEET_DRAIN,
        FLEET_RESUME,
        FLEET_GIVE_UP,
        FLEET_REMOVE,
        FLEET_FAILED,
        FLEET_STOP_IDLE,
    }
)
#: The kinds of event, in the words the dashboard shows.
KINDS = (
    frozenset(
        {"started", "refused", "failed", "stopped", "joined line", "left line", "healed", DISK_STOP}
    )
    | FLEET_KINDS
)
EVENTS_FILE = "events.jsonl"
LINE_FILE = "line.json"
#: events.jsonl is rotated past this size (about 200 000 events; the dashboard reads the tail)
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Event:
    time: float  # epoch seconds
    kind: str  # one of KINDS
    user: str  # "" for the fleet's events
    server: str = ""  # a named server's name; "" for the default server
    seconds: float | None = None  # started: the start's duration (from its slices on)
    waited: float | None = None  # started: seconds in the waiting line before it
    gpu: str = ""
    node: str = ""
    reason: str = ""  # refused, failed, disk stop: what the participant was told; healed: what
    # was done
    action: str = ""  # healed: which action (healing.ACTIONS)
    #: started: seconds from the spawner's start to each of its PHASES it saw (where the
    #: start's time went; the bench adds the hub's part before and after)
    phases: dict | None = None


#: The marks of a start, in order: its GPU slices reserved, its service created, Swarm's task
#: placed on a machine, the task running (its container started, as the spawner saw it), the
#: server answering on its port.
PHASES = ("slices", "created", "placed", "running", "answered")


_FIELDS = {f.name for f in fields(Event)}


def encode(event: Event) -> str:
    """One line of ``events.jsonl`` (no newline); fields left at their default are omitted."""
    record = {k: v for k, v in asdict(event).items() if v not in (None, "")}
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _event(record) -> Event | None:
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        return None
    when = _number(record.get("time"))
    user = record.get("user", "")
    if when is None or not isinstance(user, str):
        return None
    if not user and record["kind"] not in FLEET_KINDS:
        return None
    text = {k: record.get(k, "") for k in ("server", "gpu", "node", "reason", "action")}
    if not all(isinstance(v, str) for v in text.values()):
        return None
    return Event(
        time=when,
        kind=record["kind"],
        user=user,
        seconds=_number(record.get("seconds")),
        waited=_number(record.get("waited")),
        phases=_phases(record.get("phases")),
        **text,
    )


def _phases(value) -> dict | None:
    """The known PHASES of a record's ``phases`` with a number of seconds; None if none."""
    if not isinstance(value, dict):
        return None
    found = {k: _number(value.get(k)) for k in PHASES}
    return {k: v for k, v in found.items() if v is not None} or None


def read_events(lines: Iterable[str | bytes]) -> list[Event]:
    """The events in ``lines`` (of ``events.jsonl``), in order; unusable lines are skipped."""
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # cut short, not JSON, not UTF-8
            continue
        event = _event(record)
        if event is not None:
            found.append(event)
    return found


@dataclass(frozen=True)
class Waiting:
    """One participant in the line, as the dashboard shows them."""

    user: str
    server: str
    joined: float  # epoch seconds
    slices: int | None  # None: a full GPU
    holds: str = ""  # the GPU held for them (the line's rule), if any


def line_snapshot(waiting: Iterable[Waiting], now: float) -> str:
    """The text of ``line.json``."""
    return json.dumps({"time": now, "line": [asdict(w) for w in waiting]}, ensure_ascii=False)


def read_line(text: str) -> tuple[float, list[Waiting]]:
    """``line.json`` read: (when it was written, the line head first). Entries it cannot use
    are skipped; a file that is not a snapshot at all reads as an empty line at time 0."""
    try:
        record = json.loads(text)
    except ValueError:
        return 0.0, []
    if not isinstance(record, dict):
        return 0.0, []
    entries = record.get("line")
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        joined = _number(entry.get("joined"))
        slices = entry.get("slices")
        user, server, holds = (entry.get(k, "") for k in ("user", "server", "holds"))
        ok = all(isinstance(v, str) for v in (user, server, holds)) and user and joined is not None
        if ok and (slices is None or (isinstance(slices, int) and slices > 0)):
            found.append(Waiting(user, server, joined, slices, holds))
    return _number(record.get("time")) or 0.0, found


class Journal:
    """Appends events and rewrites the line snapshot in ``folder`` (made if missing). Writes
    happen on the caller's thread and take well under a millisecond; a failed write is logged
    by the caller and never fails a spawn."""

    def __init__(self, folder: str | os.PathLike, max_bytes: int = MAX_BYTES):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def record(self, event: Event) -> None:
        path = self.folder / EVENTS_FILE
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                if path.stat().st_size > self.max_bytes:
                    path.replace(path.with_name(EVENTS_FILE + ".1"))
            except FileNotFoundError:
                pass
            with open(path, "a", encoding="utf-8") as f:
                f.write(encode(event) + "\n")

    def line(self, waiting: Iterable[Waiting], now: float) -> None:
        path = self.folder / LINE_FILE
        text = line_snapshot(waiting, now)
        with self._lock:
            write_whole(path, text)


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` atomically: a reader (the dashboard) sees the old file or the
    new one. The line's snapshot and the fleet's (fleet.py) are written so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".new")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


_JOURNALS: dict[str, Journal] = {}


def journal_for(folder: str) -> Journal:
    """The one journal of ``folder`` in this process (the hub's spawners and its keeper share
    it, and with it the lock that keeps their lines whole)."""
    journal = _JOURNALS.get(folder)
    if journal is None:
        journal = _JOURNALS[folder] = Journal(folder)
    return journal


def tail(path: str | os.PathLike, max_bytes: int = 1024 * 1024) -> list[bytes]:
    """The last lines of a file, reading at most ``max_bytes`` from its end (the first line
    read may be cut, and ``read_events`` skips it); [] when the file does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().splitlines()
    except FileNotFoundError:
        return []
