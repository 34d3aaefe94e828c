"""The GPU guard's edge to this machine's Docker engine: its HTTP API on the unix socket.

The guard asks every few seconds which participants' servers run here; the Docker CLI would
start a process for each question, this costs one request. Standard library only; every
failure is an ``EngineUnavailable`` saying what failed (the guard logs it and carries on).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import urllib.parse
from collections.abc import Mapping

from .engine import docker_socket

API = "/v1.41"  # Docker 20.10, the oldest engine the project supports


class EngineUnavailable(RuntimeError):
    """The engine did not answer (restarting, stopped) or refused the request."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class EngineAPI:
    """GET and POST on the engine's API, JSON in and out."""

    def __init__(self, environ: Mapping[str, str], timeout: float = 10):
        host = environ.get("DOCKER_HOST", "")
        if host and not host.startswith("unix://"):
            raise EngineUnavailable(
                f"DOCKER_HOST is {host}; the GPU guard talks to the engine of its own machine, "
                "on its unix socket: unset DOCKER_HOST or give unix:///path/to/docker.sock"
            )
        self.socket = docker_socket(environ)
        self.timeout = timeout

    def request(self, method: str, path: str, body: object = None) -> object:
        connection = _UnixConnection(self.socket, self.timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, API + path, body=payload, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except OSError as e:
            raise EngineUnavailable(
                f"the Docker engine at {self.socket} does not answer: {e}"
            ) from None
        finally:
            connection.close()
        if response.status >= 400:
            message = data.decode(errors="replace").strip()
            with contextlib.suppress(ValueError, AttributeError):
                message = json.loads(message).get("message", message)
            raise EngineUnavailable(f"{method} {path}: {response.status} {message}")
        return json.loads(data) if data.strip() else None

    def containers(self, label: str) -> list[dict]:
        """The running containers that carry ``label`` (the list API's objects)."""
        filters = urllib.parse.quote(json.dumps({"label": [label], "status": ["running"]}))
        found = self.request("GET", f"/containers/json?filters={filters}")
        return found if isinstance(found, list) else []

    def container_pid(self, container: str) -> int:
        """The pid of the container's first process (0 when it does not run)."""
        found = self.request("GET", f"/containers/{container}/json")
        return int(((found or {}).get("State") or {}).get("Pid") or 0)

    def info(self) -> dict:
        """The engine's ``/info`` (its advertised generic resources among it)."""
        found = self.request("GET", "/info")
        return found if isinstance(found, dict) else {}
