"""The GPU guard's notices file, read: file text in, the notices worth showing out.

The GPU guard on each GPU machine tells a participant that their server is over its GPU memory
budget, and that it stopped one of their processes, by writing ``notices.json`` inside their
container (atomically: a temporary file, then a rename)::

    {"notices": [{"id": "warn-jy-alice-1732350000", "level": "warning", "time": 1732350000.5,
                  "title": "GPU memory over your budget", "message": "You use 9.2 GB ..."}]}

``level`` is ``info``, ``warning`` or ``error``; ``time`` is seconds since the epoch on the
machine's clock; the guard keeps the last notices only, and may rewrite a notice (same ``id``)
with new numbers. The JupyterLab extension (``gpuhub/notices``) and ``gpu-info`` both read it
here. Whatever the file holds, reading it never raises: a missing, unreadable, oversized or
invalid file holds no notices, and a malformed entry is left out.

Standard library only: ``gpu-info`` imports it without Jupyter.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time

DEFAULT_PATH = "/tmp/gpuhub-guard/notices.json"
#: The machine's disk watch (images/singleuser/gpuhub_disk.py) writes its notices (over the disk
#: budget, a server stopped to keep a disk from filling) in the same format, beside it.
DISK_NOTICES = "disk-notices.json"
LEVELS = ("info", "warning", "error")
#: the guard keeps the last 20; more in the file are older ones, left out
MAX_NOTICES = 20
#: a file larger than this is not the guard's (20 notices are a few kB): no notices
MAX_BYTES = 256 * 1024


def notices_path(environ=os.environ) -> str:
    """The notices file: ``GPUHUB_NOTICES_FILE`` (tests), else the guard's fixed path."""
    return environ.get("GPUHUB_NOTICES_FILE") or DEFAULT_PATH


def _valid(entry) -> dict | None:
    """The entry with only the fields the format defines, or None where one is wrong."""
    if not isinstance(entry, dict):
        return None
    notice_id, level, message = entry.get("id"), entry.get("level"), entry.get("message")
    title, when = entry.get("title", ""), entry.get("time")
    if not (isinstance(notice_id, str) and notice_id.strip()):
        return None
    if level not in LEVELS:
        return None
    if not (isinstance(message, str) and message.strip()) or not isinstance(title, str):
        return None
    # bool is an int, and json reads NaN and Infinity
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    return {
        "id": notice_id,
        "level": level,
        "time": float(when),
        "title": title,
        "message": message,
    }


def parse_notices(text: str | bytes) -> list[dict]:
    """The valid notices of a notices file's text, oldest first, the last ``MAX_NOTICES``.

    Each is ``{"id", "level", "time", "title", "message"}`` (``title`` may be ""). A notice
    listed twice keeps its last version, at the place of its last. Bytes that are not UTF-8
    become U+FFFD, so one bad byte in a message costs that character, not the notice.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON; nested too deep to read
        return []
    entries = data.get("notices") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return []
    latest: dict[str, dict] = {}
    for entry in entries:
        notice = _valid(entry)
        if notice is not None:
            latest.pop(notice["id"], None)  # a rewritten notice moves to where it was last
            latest[notice["id"]] = notice
    return list(latest.values())[-MAX_NOTICES:]


def read_notices(path: str | None = None) -> list[dict]:
    """The valid notices in the file at ``path`` (default: ``notices_path()``) and in the disk
    watch's file beside it (``DISK_NOTICES``), oldest first, the last ``MAX_NOTICES``; a file
    that is missing, unreadable, or larger than ``MAX_BYTES`` holds none."""
    path = path or notices_path()
    beside = os.path.join(os.path.dirname(path), DISK_NOTICES)
    found = _read_file(path) + (_read_file(beside) if beside != path else [])
    return sorted(found, key=lambda notice: notice["time"])[-MAX_NOTICES:]


def _read_file(path: str) -> list[dict]:
    try:
        with open(path, "rb") as file:
            text = file.read(MAX_BYTES + 1)
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return []
    if len(text) > MAX_BYTES:
        return []
    return parse_notices(text)


def recent(notices: list[dict], now: float, within_s: float = 3600, most: int = 3) -> list[dict]:
    """What ``gpu-info`` shows: the last ``most`` notices of the last ``within_s`` seconds,
    or, where there are none, the last notice whatever its age."""
    fresh = [notice for notice in notices if now - notice["time"] <= within_s]
    return fresh[-most:] if fresh else notices[-1:]


def format_notices(notices: list[dict], now: float) -> str:
    """Lines for a terminal: when, level and title, then the message wrapped and indented."""
    lines = []
    for notice in notices:
        when = time.localtime(notice["time"])
        same_day = time.localtime(now)[:3] == when[:3]
        stamp = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M", when)
        lines.append(f"  {stamp}  {notice['level']}: {notice['title'] or notice['level']}")
        lines += textwrap.wrap(
            notice["message"], width=96, initial_indent="    ", subsequent_indent="    "
        )
    return "\n".join(lines)
