"""The organizer's dashboard: a JupyterHub-managed service at ``/services/dashboard/``.

Admins only: JupyterHub's OAuth lets in whoever holds ``access:services!service=dashboard``,
which admins hold and participants do not (they get 403). The page (``templates/``) asks
``api/state`` every few seconds and redraws without reloading. A state is read at most once per
``MAX_AGE_S`` however many admins watch: the swarm from the manager's Docker API, every GPU
machine's guard metrics, the hub's journal (``events.py``: spawn events and the line) and,
while the hub drives the GPU machines, its fleet's snapshot (``fleet_view.py``).

The plots (``api/series``) are range queries to Prometheus (a stack service), which scrapes the
hub, every guard and this service's ``metrics`` (its figures: slices per machine, servers, the
line; with the metrics token only).

Settings (environment, set by ``jupyterhub_config.py``): ``GPUHUB_DASHBOARD_DIR`` (the journal),
``GPUHUB_GUARD_METRICS_PORT`` (0: guards not read), ``GPUHUB_SERVICE_PREFIX`` (``jy``),
``GPUHUB_PROMETHEUS_URL`` ("": no plots), ``GPUHUB_METRICS_TOKEN_FILE``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from http.client import responses
from pathlib import Path
from urllib.parse import urlencode, urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.log import app_log, enable_pretty_logging

from .. import events, fleet_view, guards
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
        recent, line, fleet = [], [], None
        now = time.time()
        if self.journal is not None:
            recent = events.read_events(events.tail(self.journal / events.EVENTS_FILE))
            _, line = events.read_line(self._text(events.LINE_FILE))
            fleet = fleet_view.read(self._text(fleet_view.FLEET_FILE), now)
        return model.build(
            nodes=nodes,
            tasks=tasks,
            services=services,
            figures=guards.read_metrics(texts),
            silent=silent,
            guard_expected=(guards.guarded if self.guard_port else lambda node: False),
            events=recent,
            line=line,
            now=now,
            prefix=self.prefix,
            fleet=fleet,
        )

    def _text(self, name: str) -> str:
        """A file of the journal's folder ("" when it is missing)."""
        try:
            return (self.journal / name).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


class PageHandler(HubOAuthenticated, web.RequestHandler):
    @web.authenticated
    def get(self):
        # The page's data calls send the token back: a browser on HTTPS or on localhost marks
        # them as fetches (Sec-Fetch-Mode: cors), and JupyterHub accepts its login cookie on
        # those only with the XSRF token.
        self.render("dashboard.html", user=self.current_user["name"], xsrf=self.xsrf_token)


def reason_phrase(status_code: int, exc, kwargs: dict) -> str:
    """The reason phrase tornado's ``send_error`` gives the answer: an HTTPError's own, else
    one given to ``send_error``, else the status code's (``http.client.responses``)."""
    if isinstance(exc, web.HTTPError) and exc.reason:
        return exc.reason
    return kwargs.get("reason") or responses.get(status_code, "Unknown")


class DataHandler(HubOAuthenticated, web.RequestHandler):
    """A data call of the page: JSON, and a signed-out caller gets a JSON 403 saying what to do,
    not the login redirect a page gets (which a fetch would follow in circles)."""

    def prepare(self):
        if self.current_user is None:
            raise web.HTTPError(403, "Not signed in as an admin: reload the page to sign in.")

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        reason = getattr(exc, "log_message", None) or reason_phrase(status_code, exc, kwargs)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": reason}))


class StateHandler(DataHandler):
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


class SeriesHandler(DataHandler):
    """The plots over the last ``hours`` (8 unless asked), from Prometheus."""

    async def get(self):
        try:
            hours = min(max(float(self.get_argument("hours", "8")), 0.1), 24 * 14)
        except ValueError:
            raise web.HTTPError(400, "hours must be a number, e.g. ?hours=8") from None
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        plots = self.settings["plots"]
        if plots is None:
            self.finish(json.dumps({"error": "No Prometheus is configured for the plots."}))
            return
        try:
            self.finish(json.dumps({"plots": await plots.series(hours * 3600)}))
        except Exception as e:  # Prometheus down or starting: the page says so and retries
            app_log.warning("Plots not read: %s", e)
            self.set_status(503)
            self.finish(json.dumps({"error": f"Prometheus did not answer: {e}"}))


class MetricsHandler(web.RequestHandler):
    """The dashboard's figures for Prometheus, with the metrics token: participants' servers
    share the network and must not read who uses which GPU."""

    async def get(self):
        token = self.settings["metrics_token"]
        given = self.request.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise web.HTTPError(403)
        state = await self.settings["reader"].state()
        self.set_header("Content-Type", "text/plain; version=0.0.4")
        self.finish(model.metrics_text(state))


class Plots:
    """Range queries to Prometheus for ``model.PLOTS``, shared by requests within 10 s."""

    def __init__(self, url: str, interval_s: float = 15):
        self.url = url.rstrip("/")
        self.interval_s = interval_s  # Prometheus' scrape interval: no finer step than that
        self._cached: tuple[float, float, list] | None = None  # (read at, span, plots)

    async def _get(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?{urlencode(params)}"
        answer = await AsyncHTTPClient().fetch(url, request_timeout=5)
        return json.loads(answer.body)

    async def series(self, span_s: float) -> list[dict]:
        now = time.time()
        if self._cached and now - self._cached[0] < 10 and self._cached[1] == span_s:
            return self._cached[2]
        oldest = await self._get("query", query="min(prometheus_tsdb_lowest_timestamp_seconds)")
        try:
            lowest = float(oldest["data"]["result"][0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            lowest = None
        span = model.plot_span(now, span_s, lowest)
        step = model.step_for(span, least=self.interval_s)

        async def query(promql: str) -> dict:
            return await self._get(
                "query_range", query=promql, start=now - span, end=now, step=step
            )

        plots = []
        for plot in model.PLOTS:
            answers = await asyncio.gather(*(query(q) for _, q in plot.queries))
            plots.append(model.plot_series(plot, answers))
        self._cached = (now, span_s, plots)
        return plots


def make_app(
    reader: Reader, prefix: str, plots: Plots | None = None, metrics_token: str = ""
) -> web.Application:
    return web.Application(
        [
            (prefix, PageHandler),
            (url_path_join(prefix, "api/state"), StateHandler),
            (url_path_join(prefix, "api/series"), SeriesHandler),
            (url_path_join(prefix, "metrics"), MetricsHandler),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        ],
        reader=reader,
        plots=plots,
        metrics_token=metrics_token,
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
    token_file = os.environ.get("GPUHUB_METRICS_TOKEN_FILE", "")
    token = Path(token_file).read_text().strip() if token_file else ""
    prometheus = os.environ.get("GPUHUB_PROMETHEUS_URL", "")
    interval = model.duration_seconds(os.environ.get("GPUHUB_METRICS_INTERVAL", "15s"))
    plots = Plots(prometheus, interval) if prometheus else None
    server = HTTPServer(make_app(reader, prefix, plots, token))
    # the proxy, in its own container, reaches the service at the hub container's address
    server.listen(url.port or 80, "")
    app_log.info("Dashboard at %s, serving %s", url.geturl(), prefix)
    await asyncio.Event().wait()


def main() -> None:
    enable_pretty_logging()
    asyncio.run(serve())
