"""``GET <base_url>gpuhub/notices``: the GPU guard's notices, and ``GET <base_url>gpuhub/usage``:
the participant's own GPU figures, for the lab extension to poll."""

from __future__ import annotations

import asyncio
import json
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from traitlets import Unicode, default
from traitlets.config import Configurable

from .notices import notices_path, read_notices
from .usage import STALE_S, read_usage, usage_path


class GPUHubNotices(Configurable):
    """Where the GPU guard's notices are read."""

    notices_file = Unicode(
        help="""The GPU guard's notices file, which it writes inside the container, e.g.
        /tmp/gpuhub-guard/notices.json (the default). The environment variable
        GPUHUB_NOTICES_FILE, where set, is the default instead (tests point it at a file of
        their own).""",
    ).tag(config=True)

    @default("notices_file")
    def _default_notices_file(self):
        return notices_path()


class GuardFileHandler(APIHandler):
    """A file the GPU guard writes into this container, read for the page (``answer``)."""

    auth_resource = "gpuhub_notices"
    # every open page asks every 5 s: that is nobody at work, and must not keep the server
    # from the idle culler
    _track_activity = False
    setting = ""  # the web app's setting that holds the file's path

    def answer(self, path: str) -> dict:
        raise NotImplementedError

    @web.authenticated
    @authorized
    async def get(self):
        body = await asyncio.to_thread(self.answer, self.settings[self.setting])
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class NoticesHandler(GuardFileHandler):
    """``{"notices": [...], "now": <seconds since the epoch>}``; ``{"notices": []}`` where the
    file is missing or invalid. ``now`` is this machine's clock, which the guard's ``time``
    shares: the page measures a notice's age with it, not with the browser's clock."""

    setting = "gpuhub_notices_file"

    def answer(self, path: str) -> dict:
        return {"notices": read_notices(path), "now": time.time()}


class UsageHandler(GuardFileHandler):
    """``{"usage": {...} or null, "now": <seconds>, "stale_s": 60}``: the figures the guard
    last wrote (``usage.py``); null where there are none."""

    setting = "gpuhub_usage_file"

    def answer(self, path: str) -> dict:
        return {"usage": read_usage(path), "now": time.time(), "stale_s": STALE_S}


def setup_handlers(serverapp) -> None:
    """Route ``<base_url>gpuhub/notices`` to the notices of the configured file, and
    ``<base_url>gpuhub/usage`` to the participant's figures."""
    web_app = serverapp.web_app
    notices_file = GPUHubNotices(parent=serverapp).notices_file
    web_app.settings["gpuhub_notices_file"] = notices_file
    web_app.settings["gpuhub_usage_file"] = usage_path()
    route = url_path_join(web_app.settings["base_url"], "gpuhub", "notices")
    usage = url_path_join(web_app.settings["base_url"], "gpuhub", "usage")
    web_app.add_handlers(".*$", [(route, NoticesHandler), (usage, UsageHandler)])
    serverapp.log.info("gpuhub_notices: %s serves the notices in %s", route, notices_file)
