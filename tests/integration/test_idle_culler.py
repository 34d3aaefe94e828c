"""jupyterhub-idle-culler stops an idle server, and Swarm frees its GPU slice."""

import time

import pytest

from .hub import deploy
from .spawners import inventory

pytestmark = pytest.mark.integration

USER = "ci-idle"


def test_an_idle_server_is_culled_and_its_slice_freed(hub, monkeypatch):
    # the stack with a 20 s idle timeout for this test; the normal settings again afterwards
    monkeypatch.setenv("GPUHUB_IDLE_TIMEOUT", "20")
    monkeypatch.setenv("GPUHUB_CULL_EVERY", "5")
    deploy("stack")
    try:
        hub.api("POST", f"/users/{USER}")
        r = hub.api("POST", f"/users/{USER}/server")
        assert r.status_code in (201, 202), r.text
        hub.wait_ready(USER)
        held = {u: g.used for u, g in inventory().items()}
        assert sum(held.values()) >= 1

        deadline = time.monotonic() + 90
        while hub.server(USER) is not None:
            assert time.monotonic() < deadline, "the idle server was not culled within 90 s"
            time.sleep(1)
        while sum(g.used for g in inventory().values()) >= sum(held.values()):
            assert time.monotonic() < deadline, "the culled server's slice was not freed"
            time.sleep(0.5)
        assert hub.api("GET", f"/users/{USER}").json()["servers"] == {}
    finally:
        monkeypatch.undo()
        deploy("stack")
