"""GitHub push webhooks: size cap, signature check, what a push names. Pure functions, no I/O.

GitHub signs each delivery's body with the hook's secret: ``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256 of the raw body>``. A delivery without a valid signature is refused;
every delivery carries a unique ``X-GitHub-Delivery`` id, so a redelivery is recognised.
GitHub never sends a payload above 25 MB, so a larger body is refused before its signature is
checked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import OrderedDict
from dataclasses import dataclass

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
EVENT_HEADER = "X-GitHub-Event"

#: GitHub's cap on a webhook payload (25 MB); a larger body is not GitHub's.
MAX_PAYLOAD = 25 * 1024 * 1024


class Malformed(ValueError):
    """A signed push delivery whose body is not what GitHub sends; the message says what."""


@dataclass(frozen=True)
class Push:
    branch: str  # the branch the push updated; "" for tags and other refs
    names: frozenset  # every way the payload names its repository (see repository_names)


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def too_large(content_length: str | None) -> bool:
    """True when a request's ``Content-Length`` is above GitHub's cap. An absent one (a chunked
    body, counted while it is read) or an unreadable one (the HTTP server refuses it) is not."""
    try:
        return int(content_length or 0) > MAX_PAYLOAD
    except ValueError:
        return False


def parse_push(body: bytes) -> Push:
    """The push event in ``body`` (already known to be signed); raises Malformed."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Malformed("the body is not UTF-8 text") from None
    except RecursionError:
        raise Malformed("the body's JSON is nested too deeply") from None
    except ValueError:
        raise Malformed(
            "the body is not JSON; set the webhook's content type to application/json"
        ) from None
    if not isinstance(payload, dict):
        raise Malformed(f"the body is a JSON {_JSON_KINDS.get(type(payload))}, not an object")
    if not isinstance(payload.get("ref"), str):
        raise Malformed("the push names no branch: `ref` is missing or not a string")
    if not isinstance(payload.get("repository"), dict):
        raise Malformed("the push names no repository: `repository` is missing or not an object")
    names = repository_names(payload)
    if not names:
        raise Malformed("the push names no repository: no `full_name` or URL in `repository`")
    return Push(pushed_branch(payload), frozenset(names))


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
    ref = payload.get("ref")
    if not isinstance(ref, str):
        return ""
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else ""


def repository_names(payload: dict) -> set[str]:
    """Every way the payload names its repository: full name and clone URLs, normalised."""
    repo = payload.get("repository")
    if not isinstance(repo, dict):
        return set()
    given = {key: repo.get(key) for key in ("full_name", *_URLS)}
    given = {key: value for key, value in given.items() if isinstance(value, str)}
    names = {normalise_url(v) if k in _URLS else v for k, v in given.items()}
    return {n.lower() for n in names if n}


_URLS = ("clone_url", "git_url", "ssh_url", "html_url", "url")


def normalise_url(url: str) -> str:
    """``https://github.com/org/repo.git`` -> ``github.com/org/repo`` (also ssh and git forms)."""
    url = url.strip().removesuffix("/").removesuffix(".git")
    for prefix in ("https://", "http://", "git://", "ssh://", "file://"):
        url = url.removeprefix(prefix)
    if url.startswith("git@"):
        url = url.removeprefix("git@").replace(":", "/", 1)
    return url.split("@", 1)[-1]


class DeliveryLog:
    """The ids of recently handled deliveries, to answer a redelivery without syncing twice.

    A delivery counts only once it was handled: one refused (a bad body) or failed is handled
    when GitHub delivers it again.
    """

    def __init__(self, size: int = 1000):
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def seen(self, delivery_id: str) -> bool:
        """True when ``delivery_id`` was handled before (an empty id never was)."""
        if delivery_id not in self._seen:
            return False
        self._seen.move_to_end(delivery_id)
        return True

    def handled(self, delivery_id: str) -> None:
        """Remember ``delivery_id`` as handled (an empty id is not remembered)."""
        if not delivery_id:
            return
        self._seen[delivery_id] = None
        self._seen.move_to_end(delivery_id)
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
