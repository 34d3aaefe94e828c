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


class NoticesHandler(APIHandler):
    """``{"notices": [...], "now": <seconds since the epoch>}``; ``{"notices": []}`` where the
    file is missing or invalid. ``now`` is this machine's clock, which the guard's ``time``
    shares: the page measures a notice's age with it, not with the browser's clock."""

    auth_resource = "gpuhub_notices"
    # every open page asks every 5 s: that is nobody at work, and must not keep the server
    # from the idle culler
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self):
        notices = await asyncio.to_thread(read_notices, self.settings["gpuhub_notices_file"])
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"notices": notices, "now": time.time()}))


class UsageHandler(APIHandler):
    """``{"usage": {...} or null, "now": <seconds>, "stale_s": 60}``: the figures the guard
    last wrote (``usage.py``); null where there are none. Polled like the notices."""

    auth_resource = "gpuhub_notices"
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self):
        usage = await asyncio.to_thread(read_usage, self.settings["gpuhub_usage_file"])
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"usage": usage, "now": time.time(), "stale_s": STALE_S}))


def setup_handlers(serverapp) -> None:
    """Route ``<base_url>gpuhub/notices`` to the notices of the configured file."""
    web_app = serverapp.web_app
    notices_file = GPUHubNotices(parent=serverapp).notices_file
    web_app.settings["gpuhub_notices_file"] = notices_file
    web_app.settings["gpuhub_usage_file"] = usage_path()
    route = url_path_join(web_app.settings["base_url"], "gpuhub", "notices")
    usage = url_path_join(web_app.settings["base_url"], "gpuhub", "usage")
    web_app.add_handlers(".*$", [(route, NoticesHandler), (usage, UsageHandler)])
    serverapp.log.info("gpuhub_notices: %s serves the notices in %s", route, notices_file)
