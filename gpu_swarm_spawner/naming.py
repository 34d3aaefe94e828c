"""Names of a participant's Docker objects that Docker accepts for every username.

dockerspawner escapes a username to lowercase letters, digits and ``-XX`` escapes (two hex
digits), so each ``-`` of a GitHub login costs three characters: a 39-character login such as
``a-b-c-...-t`` escapes to 77, and its service ``jy-<login>`` (``jy-<login>--<server>`` for a
named server) is longer than Swarm allows. What Docker requires:

- a **service** name is a DNS label: at most 63 characters, matching
  ``^[a-zA-Z0-9](?:[-_]*[A-Za-z0-9]+)*$`` (swarmkit, ``manager/controlapi/common.go``,
  ``validateAnnotations``);
- a **volume** name of the local driver matches ``^[a-zA-Z0-9][a-zA-Z0-9_.-]+$`` and is a
  directory under ``/var/lib/docker/volumes``, so at most 255 bytes (the file-name limit; the
  driver has no check of its own, mkdir fails). ``jy-home-<login>`` is at most 85.

``fit`` keeps every name that is short enough exactly as it is (running servers and homes of
existing users are found again) and shortens only the others. Standard library only.
"""

from __future__ import annotations

import hashlib

#: Swarm service names are DNS labels.
SERVICE_NAME_MAX = 63
#: Local volume names are directory names.
VOLUME_NAME_MAX = 255

#: A shortened name ends in ``-h`` and this many hex digits of the SHA-256 of the whole name.
HASH_DIGITS = 12
_SUFFIX_LENGTH = len("-h") + HASH_DIGITS


def fit(name: str, limit: int) -> str:
    """``name`` if it has at most ``limit`` characters; otherwise its start and a hash of it all.

    A longer name is cut to leave room for ``-h<12 hex digits>`` (48 bits of the SHA-256 of the
    whole name); hyphens and a partial ``-XX`` escape at the cut are dropped, so the start stays
    readable and a valid DNS label stays valid. The result depends on the name alone: the same
    user gets the same name after a hub restart.

    Unique: two long names share a result only if they share the cut start and 48 bits of
    hash. A shortened name never equals an unshortened one made with dockerspawner's default
    escaping and name templates: in those, a ``-`` that follows a letter or digit ends the
    prefix (``jy-``), starts an escape (a hex digit follows) or starts the ``--`` before a
    server name, while the ``-h`` of a shortened name follows a letter or digit far from the
    prefix, and ``h`` is neither a hex digit nor ``-``.
    """
    if len(name) <= limit:
        return name
    if limit < _SUFFIX_LENGTH + 1:
        raise ValueError(f"cannot fit names into {limit} characters; {_SUFFIX_LENGTH + 1} at least")
    digest = hashlib.sha256(name.encode()).hexdigest()[:HASH_DIGITS]
    head = name[: limit - _SUFFIX_LENGTH].rstrip("-")
    if len(head) >= 2 and head[-2] == "-":
        # the cut fell inside an escape ("-2" of "-2d"): drop the half
        head = head[:-2].rstrip("-")
    return f"{head}-h{digest}"


def service_name(name: str) -> str:
    """A Swarm service name for dockerspawner's ``name``, fitted into a DNS label."""
    return fit(name, SERVICE_NAME_MAX)


def volume_name(name: str) -> str:
    """A local volume name for dockerspawner's ``name``, fitted into a directory name."""
    return fit(name, VOLUME_NAME_MAX)
