"""GitHub push webhooks: size cap, signature check, what a push or ping names. Pure functions.

GitHub signs each delivery's body with the hook's secret: ``X-Hub-Signature-256:
sha256=<hex HMAC-SHA256 of the raw body>``. A delivery without a valid signature is refused;
every delivery carries a unique ``X-GitHub-Delivery`` id, so a redelivery is recognised.
GitHub never sends a payload above 25 MB, so a larger body is refused before its signature is
checked.

GitHub's ``ping`` (sent when a webhook is made, and by "Redeliver" of it) carries the hook's
settings: ``hook.config.content_type`` (``json`` or ``form``: then every body is
``payload=<url-encoded JSON>``, sent as ``application/x-www-form-urlencoded``), ``hook.events``,
and the repository (``repository``; an organization's hook names ``organization`` instead).
``ping_problems`` says what in them would make the pushes fail, for the ping's answer, which
GitHub shows under the webhook's "Recent Deliveries".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import parse_qs

SIGNATURE_HEADER = "X-Hub-Signature-256"
DELIVERY_HEADER = "X-GitHub-Delivery"
EVENT_HEADER = "X-GitHub-Event"

#: GitHub's cap on a webhook payload (25 MB); a larger body is not GitHub's.
MAX_PAYLOAD = 25 * 1024 * 1024

#: The Content-Type of a webhook whose "Content type" is application/x-www-form-urlencoded.
FORM = "application/x-www-form-urlencoded"

#: What to do about a form-encoded webhook, in the answers GitHub shows.
USE_JSON = (
    "the webhook sends form-encoded payloads (Content type application/x-www-form-urlencoded); "
    "edit the webhook on GitHub, set Content type to application/json and save"
)


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


@dataclass(frozen=True)
class Ping:
    names: frozenset  # every way the payload names its repository (see repository_names)
    organization: str  # an organization's hook: its login, lower case ("" for a repository's)
    content_type: str  # hook.config.content_type: "json" or "form" ("" when not given)
    events: tuple  # hook.events, e.g. ("push",) or ("*",)


def is_form(content_type: str | None) -> bool:
    """True when a request's Content-Type is a form-encoded webhook's."""
    return (content_type or "").split(";")[0].strip().lower() == FORM


def parse_ping(body: bytes, content_type: str | None) -> Ping:
    """The ping event in ``body`` (already known to be signed), JSON or form-encoded as
    ``content_type`` says; raises Malformed."""
    if is_form(content_type):
        try:
            body = parse_qs(body.decode("utf-8"), strict_parsing=True)["payload"][0].encode()
        except (UnicodeDecodeError, ValueError, KeyError):
            raise Malformed("a form-encoded body without a `payload` field") from None
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError, ValueError):
        raise Malformed("the ping's body is not JSON") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("hook"), dict):
        raise Malformed("the ping names no hook: `hook` is missing or not an object")
    hook = payload["hook"]
    config = hook.get("config") if isinstance(hook.get("config"), dict) else {}
    events = hook.get("events") if isinstance(hook.get("events"), list) else []
    org = payload.get("organization")
    login = org.get("login") if isinstance(org, dict) else None
    return Ping(
        frozenset(repository_names(payload)),
        login.lower() if isinstance(login, str) and hook.get("type") == "Organization" else "",
        config.get("content_type") if isinstance(config.get("content_type"), str) else "",
        tuple(e for e in events if isinstance(e, str)),
    )


def ping_problems(ping: Ping, content_type: str | None, urls: list[str]) -> list[str]:
    """What would make this hook's pushes fail here, one line each ([] when none): a
    form-encoded hook, one that sends no push events, or one on a repository (an organization)
    none of the tutorial repositories ``urls`` is in."""
    problems = []
    if is_form(content_type) or ping.content_type == "form":
        problems.append(USE_JSON)
    if ping.events and not {"push", "*"} & set(ping.events):
        problems.append(
            f"the webhook sends {', '.join(ping.events)} events but no push events; "
            "edit it on GitHub and choose 'Just the push event'"
        )
    used = sorted({normalise_url(url) for url in urls})
    if ping.organization:
        if not any(_owner(u) == ping.organization for u in used):
            problems.append(
                f"no tutorial repository is in the organization {ping.organization}; "
                f"this service publishes {', '.join(used)}"
            )
    elif not ping.names & {u.lower() for u in used}:
        name = min(ping.names, key=len) if ping.names else "(none named)"
        problems.append(
            f"no tutorial uses the repository {name}; this service publishes "
            f"{', '.join(used)}: add the webhook to those repositories "
            "(or add this one to GPUHUB_TUTORIAL_REPOS)"
        )
    return problems


def _owner(name: str) -> str:
    """``github.com/org/repo`` -> ``org``."""
    parts = name.lower().split("/")
    return parts[-2] if len(parts) >= 3 else ""


_CREDENTIALS = re.compile(r"(\w+://)[^/\s@]+@")


def without_credentials(text: str) -> str:
    """``text`` with the ``user:token@`` of any URL in it taken out (git's errors name URLs)."""
    return _CREDENTIALS.sub(r"\1", text)


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
