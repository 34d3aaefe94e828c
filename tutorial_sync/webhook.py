"""GitHub push webhooks: signature check and what a push names. Pure functions, no I/O.

GitHub signs each delivery's body with the hook's secret: ``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256 of the raw body>``. A delivery without a valid signature is refused;
every delivery carries a unique ``X-GitHub-Delivery`` id, so a redelivery is recognised.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
EVENT_HEADER = "X-GitHub-Event"


def signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_is_valid(secret: str, body: bytes, header: str | None) -> bool:
    """True when ``header`` is the body's signature under ``secret`` (constant-time compare)."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    return hmac.compare_digest(signature(secret, body).encode(), header.encode())


def pushed_branch(payload: dict) -> str:
    """The branch a push event updated ("" for tags and other refs)."""
    ref = payload.get("ref", "")
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else ""


def repository_names(payload: dict) -> set[str]:
    """Every way the payload names its repository: full name and clone URLs, normalised."""
    repo = payload.get("repository") or {}
    names = {repo.get("full_name", "")}
    for key in ("clone_url", "git_url", "ssh_url", "html_url", "url"):
        names.add(normalise_url(repo.get(key, "")))
    return {n.lower() for n in names if n}


def normalise_url(url: str) -> str:
    """``https://github.com/org/repo.git`` -> ``github.com/org/repo`` (also ssh and git forms)."""
    url = url.strip().removesuffix("/").removesuffix(".git")
    for prefix in ("https://", "http://", "git://", "ssh://", "file://"):
        url = url.removeprefix(prefix)
    if url.startswith("git@"):
        url = url.removeprefix("git@").replace(":", "/", 1)
    return url.split("@", 1)[-1]


class DeliveryLog:
    """The ids of recent deliveries, to answer a redelivery without syncing twice."""

    def __init__(self, size: int = 1000):
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def first_time(self, delivery_id: str) -> bool:
        """Record ``delivery_id``; False when it was seen before (an empty id never is)."""
        if not delivery_id:
            return True
        if delivery_id in self._seen:
            self._seen.move_to_end(delivery_id)
            return False
        self._seen[delivery_id] = None
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return True
