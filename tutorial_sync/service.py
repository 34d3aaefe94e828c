"""The tutorial sync service: polls its repositories, takes GitHub push webhooks, reports status.

    python -m tutorial_sync --repo NAME=URL[#BRANCH] [--repo ...] --root /srv/tutorials \\
        [--cache DIR] [--interval 30] [--port 8090] [--webhook-secret-file FILE] \\
        [--token-file FILE]

Endpoints: ``POST /webhook`` (GitHub push events; ``X-Hub-Signature-256`` required),
``GET /status`` (JSON: per repository the published commit, last sync, last error, links not
published), ``GET /healthz``. Each repository syncs at start, then every ``--interval`` seconds
(unless it is ``:webhook`` only), and at once when a push for it arrives. One failing repository
never stops the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tornado import web

from . import credentials, webhook
from .publish import Publisher, Repo, SyncError
from .repos import ReposError, parse_repos, redact

log = logging.getLogger("tutorial_sync")


@dataclass
class RepoStatus:
    name: str
    url: str
    branch: str
    commit: str = ""
    published_at: float = 0.0
    last_sync: float = 0.0  # the last time the remote was checked successfully
    last_error: str = ""
    last_error_at: float = 0.0
    syncs: int = 0  # versions published since the service started
    polled: bool = True  # False: synced at start and on its webhooks only
    skipped: dict = field(default_factory=dict)  # {path: why} of links not published


@dataclass
class SyncService:
    publisher: Publisher
    repos: list[Repo]
    interval: float = 30.0
    webhook_secret: str = ""
    status: dict[str, RepoStatus] = field(default_factory=dict)
    deliveries: webhook.DeliveryLog = field(default_factory=webhook.DeliveryLog)

    def __post_init__(self):
        self._locks = {r.name: asyncio.Lock() for r in self.repos}
        self._tasks: set[asyncio.Future] = set()  # webhook syncs under way
        for repo in self.repos:
            self.status[repo.name] = RepoStatus(repo.name, repo.url, repo.branch, polled=repo.poll)
            published = self.publisher.published(repo.name)
            if published:
                self._show(self.status[repo.name], published)

    @staticmethod
    def _show(status: RepoStatus, published: dict) -> None:
        status.commit, status.published_at = published["commit"], published["published_at"]
        status.skipped = published.get("skipped", {})

    async def sync(self, repo: Repo, reason: str) -> None:
        """Sync one repository (never two syncs of one at once); errors go into its status."""
        status = self.status[repo.name]
        async with self._locks[repo.name]:
            try:
                changed = await asyncio.to_thread(self.publisher.sync, repo)
            except SyncError as e:
                status.last_error, status.last_error_at = str(e), time.time()
                log.error("%s: %s (the last good version stays published)", repo.name, e)
                return
            except Exception as e:  # a bug or a full disk must not stop the other repositories
                status.last_error = redact(f"{type(e).__name__}: {e}")
                status.last_error_at = time.time()
                log.exception("%s: sync failed", repo.name)
                return
            status.last_sync, status.last_error = time.time(), ""
            if changed:
                self._show(status, self.publisher.published(repo.name))
                status.syncs += 1
                log.info("%s: published %s (%s)", repo.name, status.commit[:12], reason)
                for path, why in sorted(status.skipped.items()):
                    log.warning(
                        "%s: link %s not published: it %s (a link is published, as a copy, "
                        "only when it points to a file or folder inside the repository)",
                        repo.name,
                        path,
                        why,
                    )

    def sync_soon(self, repo: Repo, reason: str) -> None:
        """Start syncing ``repo`` without waiting for it."""
        task = asyncio.ensure_future(self.sync(repo, reason))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sync_all(self, reason: str, repos: list[Repo] | None = None) -> None:
        await asyncio.gather(
            *(self.sync(r, reason) for r in (self.repos if repos is None else repos))
        )

    async def poll_forever(self) -> None:
        """Sync every repository at start, then the polled ones every ``interval`` seconds."""
        reason, repos = "start", self.repos
        while True:
            started = time.monotonic()
            await self.sync_all(reason, repos)
            reason, repos = "poll", [r for r in self.repos if r.poll]
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def repos_for_push(self, push: webhook.Push) -> list[Repo]:
        """The configured repositories a push event is about (its repository and branch)."""
        return [
            r
            for r in self.repos
            if r.branch == push.branch and webhook.normalise_url(r.url).lower() in push.names
        ]


class StatusHandler(web.RequestHandler):
    def get(self):
        service: SyncService = self.settings["service"]
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"repos": [asdict(s) for s in service.status.values()]}, indent=1))


class HealthHandler(web.RequestHandler):
    def get(self):
        self.write("ok\n")


@web.stream_request_body
class WebhookHandler(web.RequestHandler):
    """GitHub's push webhook. The body is taken in pieces and refused (413) once it passes
    GitHub's cap, before any signature work; a delivery counts as seen once it was handled."""

    def prepare(self):
        self._pieces: list[bytes] = []
        self._size, self._refused = 0, False
        if webhook.too_large(self.request.headers.get("Content-Length")):
            self._refuse_too_large()

    def data_received(self, chunk: bytes) -> None:
        if self._refused:
            return
        self._size += len(chunk)
        if self._size > webhook.MAX_PAYLOAD:
            self._refuse_too_large()
            return
        self._pieces.append(chunk)

    def _refuse_too_large(self) -> None:
        """Answer 413 now; the connection closes without reading the rest of the body."""
        self._refused, self._pieces = True, []
        self._refuse(413, "the body is larger than GitHub's 25 MB payload cap")

    def _refuse(self, code: int, reason: str) -> None:
        delivery = self.request.headers.get(webhook.DELIVERY_HEADER) or "(no id)"
        log.warning(
            "webhook delivery %s from %s refused (%d): %s",
            delivery,
            self.request.remote_ip,
            code,
            reason,
        )
        self.set_status(code, reason=reason)
        self.finish({"ok": False, "error": reason})

    def post(self):
        if self._refused:
            return
        service: SyncService = self.settings["service"]
        headers, body = self.request.headers, b"".join(self._pieces)
        delivery = headers.get(webhook.DELIVERY_HEADER, "")
        if not webhook.signature_is_valid(
            service.webhook_secret, body, headers.get(webhook.SIGNATURE_HEADER)
        ):
            given = "a bad" if headers.get(webhook.SIGNATURE_HEADER) else "no"
            return self._refuse(401, f"{given} X-Hub-Signature-256; check the webhook's secret")
        event = headers.get(webhook.EVENT_HEADER, "push")
        if event == "ping":
            return self.finish({"ok": True, "event": "ping"})
        if event != "push":
            return self.finish({"ok": True, "ignored": event})
        if service.deliveries.seen(delivery):
            return self.finish({"ok": True, "duplicate": delivery})
        try:
            push = webhook.parse_push(body)
        except webhook.Malformed as e:
            return self._refuse(400, str(e))
        repos = service.repos_for_push(push)
        for repo in repos:
            service.sync_soon(repo, f"webhook {delivery}")
        service.deliveries.handled(delivery)
        self.set_status(202)
        self.finish({"ok": True, "syncing": [r.name for r in repos]})


def make_app(service: SyncService, base_url: str = "/") -> web.Application:
    base = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
    return web.Application(
        [
            (base + "webhook", WebhookHandler),
            (base + "status", StatusHandler),
            (base + "healthz", HealthHandler),
        ],
        service=service,
    )


def parse_args(argv=None, environ=os.environ):
    """The command line, with the settings the stack passes in ``environ`` as defaults."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="NAME=URL[#BRANCH][:webhook]",
        help="a repository to publish; :webhook: never polled, synced at start and on its "
        "push webhooks only (default: $GPUHUB_TUTORIAL_REPOS, space-separated)",
    )
    parser.add_argument("--root", required=True, help="the share: where tutorials are published")
    parser.add_argument("--cache", default="", help="git cache (default: <root>/../tutorial-cache)")
    parser.add_argument(
        "--interval",
        type=float,
        default=float(environ.get("GPUHUB_TUTORIAL_POLL", "30")),
        help="seconds between polls (default: $GPUHUB_TUTORIAL_POLL or 30)",
    )
    parser.add_argument("--base-url", default="/", help="URL prefix of the endpoints")
    parser.add_argument("--keep-seconds", type=float, default=600.0)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--webhook-secret-file", default="", metavar="FILE")
    parser.add_argument(
        "--token-file",
        default=environ.get("GPUHUB_TUTORIAL_TOKEN_FILE", ""),
        metavar="FILE",
        help="tokens for private https repositories, given to git by a credential helper "
        "(tutorial_sync.credentials; default: $GPUHUB_TUTORIAL_TOKEN_FILE)",
    )
    args = parser.parse_args(argv)
    # the settings check's own reader: what it accepted is what is used here
    text = "\n".join(args.repo) if args.repo else environ.get("GPUHUB_TUTORIAL_REPOS", "")
    try:
        args.repos = parse_repos(text)
    except ReposError as e:
        parser.error("; ".join(e.problems))
    if not args.repos:
        parser.error("no --repo given; add --repo NAME=URL[#BRANCH] for each tutorial repository")
    args.hosts = credentials.https_hosts(r.url for r in args.repos)
    if args.token_file:
        try:
            found = credentials.read_token_file(args.token_file, private=False)
        except credentials.TokenFileError as e:
            parser.error(f"--token-file {args.token_file}: {e}")
        for problem in credentials.check_tokens(found, args.hosts):
            parser.error(f"--token-file {args.token_file}: {problem}")
    if args.interval <= 0:
        parser.error(f"--interval must be positive, got {args.interval}")
    return args


async def serve(args) -> None:
    root = Path(args.root)
    cache = Path(args.cache) if args.cache else root.parent / "tutorial-cache"
    secret = Path(args.webhook_secret_file).read_text().strip() if args.webhook_secret_file else ""
    if not secret:
        log.warning("no webhook secret: every webhook delivery is refused; polling only")
    git_env = credentials.git_environment(args.token_file, args.hosts)
    service = SyncService(
        Publisher(root, cache, args.keep_seconds, git_env), args.repos, args.interval, secret
    )
    make_app(service, args.base_url).listen(args.port)
    log.info(
        "tutorial sync on :%d for %s, polling every %ss%s",
        args.port,
        ", ".join(r.name for r in args.repos),
        args.interval,
        f"; tokens for {', '.join(args.hosts)} from {args.token_file}" if args.token_file else "",
    )
    await service.poll_forever()


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s] %(message)s")
    asyncio.run(serve(parse_args(argv)))
