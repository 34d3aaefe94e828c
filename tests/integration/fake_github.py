"""A local stand-in for github.com: the OAuth web flow and the REST endpoints oauthenticator's
GitHubOAuthenticator calls, served on a test host address (never the internet).

It answers as a GitHub Enterprise server does (API under ``/api/v3``), so the hub only needs
``github_url`` pointed at it. The "sign in" page is a form asking which GitHub user you are;
everything after it is GitHub's protocol: the authorization code, the token exchange with the
client secret, ``/user``, and the organization and team membership checks the hub makes
(``/orgs/ORG/members/USER`` 204 or 404; ``/user/memberships/orgs/ORG`` and
``/orgs/ORG/teams/TEAM/memberships/USER`` 200 with ``"state": "active"`` or 404). And the
answers that are not "yes" or "no", as GitHub gives them: an invitation not accepted yet
(``"state": "pending"``), an organization that restricts OAuth apps hiding a private member
(403 "... has enabled OAuth App access restrictions ..."), a token over its rate limit (403
with ``x-ratelimit-remaining: 0``), for the membership checks or already for ``/user``.

    python -m tests.integration.fake_github --host 10.199.8.1 --port 18900 \\
        --client-id ID --client-secret SECRET --org gpu-workshop=alice,ada
"""

from __future__ import annotations

import argparse
import html
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse


@dataclass
class GitHubData:
    client_id: str
    client_secret: str
    orgs: dict[str, set[str]] = field(default_factory=dict)  # org -> member logins
    teams: dict[str, set[str]] = field(default_factory=dict)  # "org:team" -> member logins
    codes: dict[str, str] = field(default_factory=dict)  # authorization code -> login
    tokens: dict[str, str] = field(default_factory=dict)  # access token -> login
    requests: list[str] = field(default_factory=list)  # "METHOD path" of every request
    #: org -> logins invited and not accepted yet (their membership's state is "pending")
    invited: dict[str, set[str]] = field(default_factory=dict)
    #: org -> private members of an organization that restricts OAuth apps (GitHub's default)
    #: and has not approved this one: GitHub hides their membership from the hub
    hidden: dict[str, set[str]] = field(default_factory=dict)
    #: logins whose membership checks GitHub answers "API rate limit exceeded"
    rate_limited: set[str] = field(default_factory=set)
    #: logins whose ``GET /user`` at login GitHub answers "API rate limit exceeded"
    user_rate_limited: set[str] = field(default_factory=set)


DOCS_RATE = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
DOCS_RESTRICTED = "https://docs.github.com/articles/restricting-access-to-your-organization-s-data/"

_MEMBER = re.compile(r"^/orgs/([^/]+)/members/([^/]+)$")
_TEAM_MEMBER = re.compile(r"^/orgs/([^/]+)/teams/([^/]+)/members/([^/]+)$")
_OWN_MEMBERSHIP = re.compile(r"^/user/memberships/orgs/([^/]+)$")
_TEAM_MEMBERSHIP = re.compile(r"^/orgs/([^/]+)/teams/([^/]+)/memberships/([^/]+)$")


class Handler(BaseHTTPRequestHandler):
    data: GitHubData  # set on the class made by serve()

    def log_message(self, format, *args):  # quiet: the tests assert on data.requests
        pass

    def _send(
        self,
        code: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ):
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, payload, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(payload).encode(), headers=headers)

    def _rate_limited(self) -> None:
        """GitHub's answer once a token has used its hourly requests (its documented form)."""
        reset = int(time.time()) + 60
        headers = {"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0",
                   "x-ratelimit-reset": str(reset), "x-ratelimit-resource": "core"}  # fmt: skip
        message = "API rate limit exceeded for user ID 1. If you reach out to GitHub Support..."
        self._json(403, {"message": message, "documentation_url": DOCS_RATE}, headers)

    def _restricted(self, org: str) -> None:
        """GitHub's answer to an OAuth app an organization restricting them has not approved."""
        message = (
            "Although you appear to have the correct authorization credentials, the "
            f"`{org}` organization has enabled OAuth App access restrictions, meaning that data "
            "access to third-parties is limited. For more information on these restrictions, "
            "including how to enable this app, visit "
            "https://docs.github.com/articles/restricting-access-to-your-organization-s-data/"
        )
        self._json(403, {"message": message, "documentation_url": DOCS_RESTRICTED})

    def _login(self) -> str | None:
        header = self.headers.get("Authorization", "")
        token = header.split(" ", 1)[1] if " " in header else ""
        return self.data.tokens.get(token)

    def do_GET(self):
        url = urlparse(self.path)
        self.data.requests.append(f"GET {url.path}")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/login/oauth/authorize":
            return self._authorize_page(query)
        if url.path == "/login/oauth/grant":
            return self._grant(query)
        path = url.path.removeprefix("/api/v3")
        login = self._login()
        if login is None:
            return self._json(401, {"message": "Bad credentials"})
        if path == "/user" and login in self.data.user_rate_limited:
            return self._rate_limited()
        if path == "/user":
            return self._json(
                200,
                {
                    "login": login,
                    "id": abs(hash(login)) % 10**8,
                    "name": login.title(),
                    "email": f"{login}@users.example.invalid",
                },
            )
        if login in self.data.rate_limited and path != "/user":
            return self._rate_limited()
        match = _MEMBER.match(path)
        if match:
            org, user = match.groups()
            return self._send(204 if user in self.data.orgs.get(org, set()) else 404)
        match = _TEAM_MEMBER.match(path)
        if match:
            org, team, user = match.groups()
            return self._send(204 if user in self.data.teams.get(f"{org}:{team}", set()) else 404)
        match = _OWN_MEMBERSHIP.match(path)
        if match:
            org = match.group(1)
            if login in self.data.hidden.get(org, set()):
                return self._restricted(org)
            if login in self.data.invited.get(org, set()):
                return self._json(200, {"state": "pending", "role": "member"})
            return self._membership(login in self.data.orgs.get(org, set()))
        match = _TEAM_MEMBERSHIP.match(path)
        if match:
            org, team, user = match.groups()
            return self._membership(user in self.data.teams.get(f"{org}:{team}", set()))
        return self._json(404, {"message": "Not Found"})

    def _membership(self, member: bool) -> None:
        if member:
            return self._json(200, {"state": "active", "role": "member"})
        return self._json(404, {"message": "Not Found"})

    def _authorize_page(self, query: dict) -> None:
        if query.get("client_id") != self.data.client_id:
            return self._send(404, b"unknown OAuth application", "text/plain")
        hidden = "".join(
            f'<input type="hidden" name="{k}" value="{html.escape(query.get(k, ""))}">'
            for k in ("redirect_uri", "state")
        )
        page = (
            "<!doctype html><title>Sign in to GitHub (test stand-in)</title>"
            "<h1>Sign in to GitHub</h1><form action='/login/oauth/grant' method='get'>"
            f"{hidden}<label>Username <input name='login' id='login_field'></label>"
            "<button type='submit' name='commit'>Authorize</button></form>"
        )
        self._send(200, page.encode(), "text/html; charset=utf-8")

    def _grant(self, query: dict) -> None:
        code = secrets.token_hex(10)
        self.data.codes[code] = query.get("login", "").strip().lower()
        target = query["redirect_uri"] + "?" + urlencode({"code": code, "state": query["state"]})
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        url = urlparse(self.path)
        self.data.requests.append(f"POST {url.path}")
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length).decode()
        if url.path != "/login/oauth/access_token":
            return self._json(404, {"message": "Not Found"})
        if self.headers.get("Content-Type", "").startswith("application/json"):
            params = json.loads(body or "{}")
        else:
            params = {k: v[0] for k, v in parse_qs(body).items()}
        params.update({k: v[0] for k, v in parse_qs(url.query).items()})
        if (params.get("client_id"), params.get("client_secret")) != (
            self.data.client_id,
            self.data.client_secret,
        ):
            return self._json(200, {"error": "incorrect_client_credentials"})
        login = self.data.codes.pop(params.get("code", ""), None)
        if login is None:
            return self._json(200, {"error": "bad_verification_code"})
        token = secrets.token_hex(20)
        self.data.tokens[token] = login
        self._json(200, {"access_token": token, "token_type": "bearer", "scope": "read:org"})


def serve(host: str, port: int, data: GitHubData) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; ``shutdown()`` the returned server to stop."""
    handler = type("FakeGitHubHandler", (Handler,), {"data": data})
    server = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18900)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--org", action="append", default=[], help="ORG[:TEAM]=user1,user2")
    args = parser.parse_args(argv)
    data = GitHubData(args.client_id, args.client_secret)
    for spec in args.org:
        name, _, users = spec.partition("=")
        (data.teams if ":" in name else data.orgs)[name] = set(users.split(","))
    server = serve(args.host, args.port, data)
    print(f"fake GitHub at http://{args.host}:{args.port}/ (Ctrl-C stops it)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()
