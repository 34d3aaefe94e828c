"""A pytest plugin for the unit and sync suites: nothing they run may reach a Docker engine.

``tests/hermetic.sh`` runs those suites in a mount namespace of their own with an empty tmpfs
over ``/run`` (``/var/run`` on Debian), and loads this plugin. It puts a decoy at the path every
Docker client falls back to, ``/run/docker.sock``, and points ``DOCKER_HOST`` at it too, so a
test, or a process a test starts (the GPU guard, the join), that reaches for an engine reaches
the decoy instead of this machine's engine, whether a demo runs here or not. The decoy answers
every request with HTTP 500, remembers who asked (the process and the test running), and the
session fails at its end with that list.

Without ``GPUHUB_HERMETIC_RUN=1`` (pytest run by hand, outside the namespace) the plugin does
nothing: it never puts anything into this machine's own ``/run``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path

import pytest

DECOY = Path("/run/docker.sock")
ANSWER = (
    b"unit tests must not reach a Docker engine: give the code under test a fake one, "
    b"or DOCKER_HOST pointing into the test's temporary folder"
)


class Decoy:
    """A unix socket that records every connection and answers HTTP 500."""

    def __init__(self, path: Path):
        self.path = path
        self.reached: list[str] = []
        self.test = "(between tests)"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(16)
        threading.Thread(target=self._serve, name="docker-decoy", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                self.reached.append(f"{self.test}: {_peer(conn)}")
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    body = json.dumps({"message": ANSWER.decode()}).encode()
                    conn.sendall(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json"
                        b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                    )
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        self.path.unlink(missing_ok=True)


def _peer(conn: socket.socket) -> str:
    """The connecting process: its pid and command line (SO_PEERCRED)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        return f"pid {pid} ({cmdline.strip()[:200]})"
    except OSError:
        return "a process that has already exited"


_decoy: Decoy | None = None


def pytest_configure(config):
    global _decoy
    if os.environ.get("GPUHUB_HERMETIC_RUN") != "1":
        return
    if DECOY.exists():
        raise pytest.UsageError(
            f"{DECOY} exists: tests/hermetic.sh runs the unit tests with an empty /run of their "
            "own; run them through it (make unit), not in this machine's own mount namespace"
        )
    _decoy = Decoy(DECOY)
    os.environ["DOCKER_HOST"] = f"unix://{DECOY}"


def pytest_runtest_setup(item):
    if _decoy is not None:
        _decoy.test = item.nodeid


def pytest_sessionfinish(session, exitstatus):
    if _decoy is None:
        return
    reached = list(_decoy.reached)
    _decoy.close()
    if reached:
        lines = "\n".join(f"  {r}" for r in reached)
        print(f"\nerror: the unit tests reached for a Docker engine {len(reached)} time(s):")
        print(lines)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
