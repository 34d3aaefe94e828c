"""A private tutorial repository for the tests: a bare repository served over HTTPS on
127.0.0.1 (git's "dumb" HTTP protocol: its files, as any static server gives them), which
answers 401 unless the request carries the right Basic credentials, as GitHub does for a
private repository. It records every request: what git sent, and where."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .gitrepos import Author


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl, as deploy/tls.py makes them)."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


class PrivateRemote:
    """``https://127.0.0.1:PORT/private.git``: its author's clone in ``author``; ``requests``
    holds (path, Authorization header or "") of every request."""

    def __init__(self, tmp: Path, user: str, token: str):
        tmp.mkdir(parents=True, exist_ok=True)
        self.author = Author(tmp)
        self.author.git("config", "receive.updateServerInfo", "true", cwd=self.author.remote)
        self.cert, key = self_signed(tmp)
        self.requests: list[tuple[str, str]] = []
        wanted = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
        root, requests = self.author.remote, self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                given = self.headers.get("Authorization", "")
                requests.append((self.path, given))
                if given != wanted:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="private tutorials"')
                    self.end_headers()
                    return
                relative = self.path.split("?", 1)[0].removeprefix("/private.git/")
                target = (root / relative).resolve()
                if root.resolve() not in target.parents or not target.is_file():
                    self.send_response(404)
                    self.end_headers()
                    return
                data = target.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/private.git"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.author.remote, ignore_errors=True)
