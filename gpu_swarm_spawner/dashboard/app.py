"""The organizer's dashboard: a JupyterHub-managed service at ``/services/dashboard/``.

Admins only: JupyterHub's OAuth lets in whoever holds ``access:services!service=dashboard``,
which admins hold and participants do not (they get 403). The page (``templates/``) asks
``api/state`` every few seconds and redraws without reloading. A state is read at most once per
``MAX_AGE_S`` however many admins watch: the swarm from the manager's Docker API, every GPU
machine's guard metrics, and the hub's journal (``events.py``: spawn events and the line).

Settings (environment, set by ``jupyterhub_config.py``): ``GPUHUB_DASHBOARD_DIR`` (the journal),
``GPUHUB_GUARD_METRICS_PORT`` (0: guards not read), ``GPUHUB_SERVICE_PREFIX`` (``jy``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.log import app_log, enable_pretty_logging

from .. import events, guards
from ..contract import SERVICE_PREFIX
from . import model

MAX_AGE_S = 1.0
TEMPLATES = Path(__file__).with_name("templates")


class Reader:
    """Reads the dashboard's state, shared by all requests within ``MAX_AGE_S``."""

    def __init__(self, journal: str, guard_port: int, prefix: str, docker_client=None):
        self.journal = Path(journal) if journal else None
        self.guard_port = guard_port
        self.prefix = prefix
        self._docker = docker_client
        self._state: dict | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def docker(self):
        if self._docker is None:
            import docker

            self._docker = docker.from_env()
        return self._docker

    async def state(self) -> dict:
        async with self._lock:
            if self._state is None or time.monotonic() - self._read_at >= MAX_AGE_S:
                self._state = await asyncio.get_running_loop().run_in_executor(None, self._read)
                self._read_at = time.monotonic()
            return self._state

    def _read(self) -> dict:
        api = self.docker.api
        nodes, tasks, services = api.nodes(), api.tasks(), api.services()
        texts, silent = guards.scrape(nodes, self.guard_port) if self.guard_port else ([], ())
        recent, line = [], []
        if self.journal is not None:
            recent = events.read_events(events.tail(self.journal / events.EVENTS_FILE))
            try:
                line_text = (self.journal / events.LINE_FILE).read_text(encoding="utf-8")
            except FileNotFoundError:
                line_text = ""
            _, line = events.read_line(line_text)
        return model.build(
            nodes=nodes,
            tasks=tasks,
            services=services,
            figures=guards.read_metrics(texts),
            silent=silent,
            guard_expected=(guards.guarded if self.guard_port else lambda node: False),
            events=recent,
            line=line,
            now=time.time(),
            prefix=self.prefix,
        )


class PageHandler(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self):
        self.render("dashboard.html", user=self.current_user["name"])


class StateHandler(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    async def get(self):
        try:
            state = await self.settings["reader"].state()
        except Exception as e:  # the manager did not answer: the page says so and retries
            app_log.warning("Dashboard state not read: %s", e)
            self.set_status(503)
            state = {"error": f"The swarm could not be read: {type(e).__name__}: {e}"}
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(state))


def make_app(reader: Reader, prefix: str) -> web.Application:
    return web.Application(
        [
            (prefix, PageHandler),
            (url_path_join(prefix, "api/state"), StateHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        ],
        reader=reader,
        template_path=str(TEMPLATES),
        cookie_secret=os.urandom(32),
        xsrf_cookies=False,
    )


async def serve() -> None:
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/dashboard/")
    url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    reader = Reader(
        os.environ.get("GPUHUB_DASHBOARD_DIR", ""),
        int(os.environ.get("GPUHUB_GUARD_METRICS_PORT") or 0),
        os.environ.get("GPUHUB_SERVICE_PREFIX", SERVICE_PREFIX),
    )
    server = HTTPServer(make_app(reader, prefix))
    # the proxy, in its own container, reaches the service at the hub container's address
    server.listen(url.port or 80, "")
    app_log.info("Dashboard at %s, serving %s", url.geturl(), prefix)
    await asyncio.Event().wait()


def main() -> None:
    enable_pretty_logging()
    asyncio.run(serve())
