"""The tutorial sync service: polls its repositories, takes GitHub push webhooks, reports status.

    python -m tutorial_sync --repo NAME=URL[#BRANCH] [--repo ...] --root /srv/tutorials \\
        [--cache DIR] [--interval 30] [--port 8090] [--webhook-secret-file FILE] \\
        [--token-file FILE]

Endpoints: ``POST /webhook`` (GitHub push events; ``X-Hub-Signature-256`` required),
``GET /status`` (JSON: per repository the published commit, last sync, last error, and in
``skipped`` each file not published with the reason and the fix: links leading out, Git LFS
pointers, submodules, names too long; the last webhook deliveries and their answers),
``GET /healthz``. Each repository syncs at start, then every ``--interval`` seconds (unless it
is ``:webhook`` only), and at once when a push for it arrives. One failing repository never
stops the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from collections import deque
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
    skipped: dict = field(default_factory=dict)  # {path: why and the fix} of what is not published


@dataclass
class SyncService:
    publisher: Publisher
    repos: list[Repo]
    interval: float = 30.0
    webhook_secret: str = ""
    status: dict[str, RepoStatus] = field(default_factory=dict)
    deliveries: webhook.DeliveryLog = field(default_factory=webhook.DeliveryLog)
    # seconds a push delivery's answer waits for its sync: GitHub gives up after 10 s
    webhook_wait: float = 8.0
    # the last webhook deliveries and their answers, newest last (shown on /status)
    answered: deque = field(default_factory=lambda: deque(maxlen=20))

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
                    log.warning("%s: %s not published: it %s", repo.name, path, why)

    def sync_for_delivery(self, delivery: str, repos: list[Repo]) -> asyncio.Future:
        """Start syncing ``repos`` for one push delivery. The future gives ``{name: error}`` of
        those that failed; the delivery counts as handled only once all synced, so that
        GitHub's Redeliver of a failed one syncs again."""

        async def one(repo: Repo, failed: dict) -> None:
            await self.sync(repo, f"webhook {delivery}")
            error = self.status[repo.name].last_error  # read at once: sync() sets it last
            if error:
                failed[repo.name] = error

        async def all_of_them() -> dict[str, str]:
            failed: dict[str, str] = {}
            await asyncio.gather(*(one(r, failed) for r in repos))
            if not failed:
                self.deliveries.handled(delivery)
            return failed

        task = asyncio.ensure_future(all_of_them())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        repos = [asdict(s) for s in service.status.values()]
        deliveries = list(reversed(service.answered))  # newest first
        self.write(json.dumps({"repos": repos, "webhook_deliveries": deliveries}, indent=1))


class HealthHandler(web.RequestHandler):
    def get(self):
        self.write("ok\n")


@web.stream_request_body
class WebhookHandler(web.RequestHandler):
    """GitHub's webhook. The body is taken in pieces and refused (413) once it passes GitHub's
    cap, before any signature work. A ping is answered ok only when this service can use the
    hook; a push is answered once its sync is done (or still under way after
    ``webhook_wait``), non-2xx when it failed; a delivery counts as seen once it was handled."""

    def prepare(self):
        self._pieces: list[bytes] = []
        self._size, self._refused = 0, False
        self._answer_said = ""
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
        self._answer(code, {"ok": False, "error": reason}, reason)

    def _answer(self, code: int, answer: dict, said: str) -> None:
        """Answer GitHub (which shows ``answer`` under the webhook's Recent Deliveries)."""
        self._answer_said = said
        self.set_status(code)
        self.finish(answer)

    def on_finish(self):
        service: SyncService = self.settings["service"]
        headers = self.request.headers
        service.answered.append(
            {
                "delivery": headers.get(webhook.DELIVERY_HEADER, ""),
                "event": headers.get(webhook.EVENT_HEADER, ""),
                "at": time.time(),
                "code": self.get_status(),
                "answer": self._answer_said,
            }
        )

    async def post(self):
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
            return self._ping(service, body, headers.get("Content-Type"))
        if event != "push":
            return self._answer(200, {"ok": True, "ignored": event}, f"{event} event ignored")
        if service.deliveries.seen(delivery):
            return self._answer(200, {"ok": True, "duplicate": delivery}, "handled before")
        if webhook.is_form(headers.get("Content-Type")):
            return self._refuse(415, webhook.USE_JSON)
        try:
            push = webhook.parse_push(body)
        except webhook.Malformed as e:
            return self._refuse(400, str(e))
        repos = service.repos_for_push(push)
        if not repos:
            service.deliveries.handled(delivery)
            said = f"no tutorial publishes branch {push.branch!r} of this repository"
            return self._answer(200, {"ok": True, "syncing": [], "ignored": said}, said)
        names = [r.name for r in repos]
        syncing = service.sync_for_delivery(delivery, repos)
        try:
            failed = await asyncio.wait_for(asyncio.shield(syncing), service.webhook_wait)
        except asyncio.TimeoutError:
            said = (
                f"still syncing {', '.join(names)} after {service.webhook_wait:g} s; /status "
                "shows how it ends; should it fail, Redeliver this delivery"
            )
            return self._answer(202, {"ok": True, "syncing": names, "note": said}, said)
        if failed:
            reasons = "; ".join(
                f"{name}: {webhook.without_credentials(error)}" for name, error in failed.items()
            )
            return self._refuse(
                502,
                f"sync failed, the last good version stays published ({reasons}); "
                "fix it, then Redeliver this delivery",
            )
        said = f"synced {', '.join(names)}"
        self._answer(200, {"ok": True, "synced": names}, said)

    def _ping(self, service: SyncService, body: bytes, content_type: str | None) -> None:
        """Answer a ping: ok when the hook's pushes will work here, else 4xx with what to do."""
        try:
            ping = webhook.parse_ping(body, content_type)
        except webhook.Malformed as e:
            return self._refuse(400, str(e))
        problems = webhook.ping_problems(ping, content_type, [r.url for r in service.repos])
        if problems:
            code = 415 if webhook.USE_JSON in problems else 422
            return self._refuse(code, "; ".join(problems))
        self._answer(200, {"ok": True, "event": "ping"}, "ping: the webhook is set up right")


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
