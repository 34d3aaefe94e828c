"""``GET <base_url>gpuhub/notices``: the GPU guard's notices, for the lab extension to poll."""

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


def setup_handlers(serverapp) -> None:
    """Route ``<base_url>gpuhub/notices`` to the notices of the configured file."""
    web_app = serverapp.web_app
    notices_file = GPUHubNotices(parent=serverapp).notices_file
    web_app.settings["gpuhub_notices_file"] = notices_file
    route = url_path_join(web_app.settings["base_url"], "gpuhub", "notices")
    web_app.add_handlers(".*$", [(route, NoticesHandler)])
    serverapp.log.info("gpuhub_notices: %s serves the notices in %s", route, notices_file)
