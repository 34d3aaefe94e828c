"""The organizer's settings: read the config file, and check everything before `make up` acts.

    python -m gpu_swarm_spawner.settings check --defaults deploy/settings.env [--config FILE]
    python -m gpu_swarm_spawner.settings roster FILE

``check`` reads the effective settings from the environment (deploy/lib.sh's ``load_settings``
has merged the environment, the config file and the defaults) and the config file itself (for
line numbers and misspelt keys), and prints one line per problem, naming the key to fix.
``parse_env``, ``unknown_keys`` and ``problems`` are pure.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import os
import re
import stat
import sys
from pathlib import Path

from . import roster

_LINE = re.compile(r"^(GPUHUB_[A-Z0-9_]+)=(.*)$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")
_ORG = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})"
_ORG_OR_TEAM = re.compile(rf"^{_ORG}(?::[A-Za-z0-9._-]+)?$")
_SIZE = re.compile(r"^\d+(?:\.\d+)?[KMGT]?$", re.IGNORECASE)
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*=\S+$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*$")
_STACK = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

TLS_MODES = ("acme", "self-signed", "files", "off")
AUTH_MODES = ("github", "local")


class ConfigFileError(ValueError):
    """A line of the config file that is not KEY=value."""


def parse_env(text: str, source: str) -> dict[str, tuple[str, int]]:
    """KEY=value lines (``#`` comments, blank lines; quotes around a value are removed, nothing
    is expanded) as {key: (value, line number)}. The same rules as deploy/lib.sh's reader."""
    found = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise ConfigFileError(
                f"{source} line {number}: expected GPUHUB_NAME=value, found {line[:40]!r}"
            )
        key, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        found[key] = (value, number)
    return found


def unknown_keys(config: dict[str, tuple[str, int]], known: set[str], source: str) -> list[str]:
    """A line for each key of the config file that is not a setting (a typo would otherwise
    silently leave the default in place)."""
    out = []
    for key, (_, number) in config.items():
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else "; deploy/settings.env lists them all"
        out.append(f"{source} line {number}: unknown setting {key}{hint}")
    return out


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _valid_host(host: str) -> bool:
    return bool(host) and (_is_address(host) or bool(_HOSTNAME.match(host)))


def _int(settings, key, low, high=None) -> list[str]:
    value = settings.get(key, "")
    try:
        number = int(value)
    except ValueError:
        return [f"{key} is {value!r}; write a whole number"]
    if number < low or (high is not None and number > high):
        upper = f" and at most {high}" if high is not None else ""
        return [f"{key} is {number}; write at least {low}{upper}"]
    return []


def _choice(settings, key, choices) -> list[str]:
    value = settings.get(key, "")
    if value not in choices:
        return [f"{key} is {value!r}; write one of: {', '.join(choices)}"]
    return []


def names(value: str) -> list[str]:
    """Names separated by commas or spaces (GPUHUB_ADMIN_USERS, GPUHUB_ALLOWED_ORGS); the hub's
    configuration reads them with this too."""
    return [n for n in re.split(r"[,\s]+", value) if n]


def _numbers(settings) -> list[str]:
    errors = []
    for key, low, high in [
        ("GPUHUB_HTTP_PORT", 1, 65535),
        ("GPUHUB_HTTPS_PORT", 1, 65535),
        ("GPUHUB_REGISTRY_PORT", 1, 65535),
        ("GPUHUB_SLICES_PER_GPU", 1, 64),
        ("GPUHUB_GPU_SLICES", 1, 64),
        ("GPUHUB_SIMULATE_IF_NO_GPU", 0, 16),
        ("GPUHUB_START_TIMEOUT", 10, None),
        ("GPUHUB_POLL_INTERVAL", 1, None),
        ("GPUHUB_DOCKER_API_THREADS", 1, 64),
        ("GPUHUB_IDLE_TIMEOUT", 0, None),
        ("GPUHUB_CULL_EVERY", 1, None),
        ("GPUHUB_MAX_AGE", 0, None),
        ("GPUHUB_TUTORIAL_POLL", 1, None),
    ]:
        errors += _int(settings, key, low, high)
    if errors:
        return errors
    if int(settings["GPUHUB_GPU_SLICES"]) > int(settings["GPUHUB_SLICES_PER_GPU"]):
        errors.append(
            f"GPUHUB_GPU_SLICES is {settings['GPUHUB_GPU_SLICES']} but a GPU has only "
            f"GPUHUB_SLICES_PER_GPU={settings['GPUHUB_SLICES_PER_GPU']} slices; lower it"
        )
    ports = [settings[k] for k in ("GPUHUB_HTTP_PORT", "GPUHUB_HTTPS_PORT", "GPUHUB_REGISTRY_PORT")]
    if settings.get("GPUHUB_TLS") != "off" and len(set(ports)) < 3:
        errors.append(
            "GPUHUB_HTTP_PORT, GPUHUB_HTTPS_PORT and GPUHUB_REGISTRY_PORT must differ "
            f"(they are {', '.join(ports)})"
        )
    return errors


def _limits(settings) -> list[str]:
    errors = []
    cpu = settings.get("GPUHUB_CPU_LIMIT", "")
    if cpu:
        try:
            if float(cpu) <= 0:
                raise ValueError
        except ValueError:
            errors.append(f"GPUHUB_CPU_LIMIT is {cpu!r}; write a number of cores, e.g. 4 or 0.5")
    mem = settings.get("GPUHUB_MEM_LIMIT", "")
    if mem and not _SIZE.match(mem):
        errors.append(f"GPUHUB_MEM_LIMIT is {mem!r}; write a size such as 16G or 512M")
    return errors


def _login(settings, exists) -> list[str]:
    errors = _choice(settings, "GPUHUB_AUTH", AUTH_MODES)
    for name in names(settings.get("GPUHUB_ADMIN_USERS", "")):
        try:
            roster.parse(name)
        except roster.RosterError:
            errors.append(f"GPUHUB_ADMIN_USERS: {name!r} is not a username")
    if settings.get("GPUHUB_AUTH") != "github":
        return errors
    if not settings.get("GPUHUB_GITHUB_CLIENT_ID"):
        errors.append(
            "GPUHUB_GITHUB_CLIENT_ID is empty; register an OAuth app on GitHub and copy its id"
        )
    secret, secret_file = (
        settings.get("GPUHUB_GITHUB_CLIENT_SECRET", ""),
        settings.get("GPUHUB_GITHUB_CLIENT_SECRET_FILE", ""),
    )
    if bool(secret) == bool(secret_file):
        errors.append(
            "GPUHUB_GITHUB_CLIENT_SECRET / GPUHUB_GITHUB_CLIENT_SECRET_FILE: set exactly one "
            "(the OAuth app's client secret, or a file holding it)"
        )
    elif secret_file and not exists(secret_file):
        errors.append(f"GPUHUB_GITHUB_CLIENT_SECRET_FILE: {secret_file} does not exist")
    url = settings.get("GPUHUB_GITHUB_URL", "")
    if not re.match(r"^https?://[^/\s]+/?$", url):
        errors.append(f"GPUHUB_GITHUB_URL is {url!r}; write https://github.com (or your server)")
    orgs = names(settings.get("GPUHUB_ALLOWED_ORGS", ""))
    for org in orgs:
        if not _ORG_OR_TEAM.match(org):
            errors.append(f"GPUHUB_ALLOWED_ORGS: {org!r} is not ORG or ORG:TEAM")
    if not orgs and not settings.get("GPUHUB_ROSTER"):
        errors.append(
            "GPUHUB_ALLOWED_ORGS and GPUHUB_ROSTER are both empty, so nobody could log in; "
            "set an organization (or org:team), a roster file, or both"
        )
    return errors


def _tls(settings, exists) -> list[str]:
    errors = _choice(settings, "GPUHUB_TLS", TLS_MODES)
    host = settings.get("GPUHUB_HOSTNAME", "")
    mode = settings.get("GPUHUB_TLS")
    private = _is_address(host) or host == "localhost" or "." not in host
    if mode == "acme" and _valid_host(host) and private:
        errors.append(
            f"GPUHUB_TLS=acme needs a public DNS name in GPUHUB_HOSTNAME, not {host!r}; "
            "use GPUHUB_TLS=self-signed (or files) for an address or a private name"
        )
    if mode == "files":
        for key in ("GPUHUB_TLS_CERT", "GPUHUB_TLS_KEY"):
            path = settings.get(key, "")
            if not path:
                errors.append(f"{key} is empty; GPUHUB_TLS=files needs a PEM certificate and key")
            elif not exists(path):
                errors.append(f"{key}: {path} does not exist")
    elif settings.get("GPUHUB_TLS_CERT") or settings.get("GPUHUB_TLS_KEY"):
        errors.append(
            "GPUHUB_TLS_CERT / GPUHUB_TLS_KEY are set but GPUHUB_TLS is not files; "
            "set GPUHUB_TLS=files to use them, or remove them"
        )
    return errors


def problems(settings: dict[str, str], exists=os.path.exists, mode: str = "up") -> list[str]:
    """Every problem of a complete set of settings, one line each, naming the key to fix.
    ``mode`` "up" (production) also needs a hostname."""
    errors = _numbers(settings) + _limits(settings)
    errors += _login(settings, exists) + _tls(settings, exists)
    host = settings.get("GPUHUB_HOSTNAME", "")
    if mode == "up" and not host:
        errors.append("GPUHUB_HOSTNAME is empty; write the hub's public DNS name or IP address")
    elif host and not _valid_host(host):
        errors.append(f"GPUHUB_HOSTNAME is {host!r}; write a DNS name or an IP address")
    if not _STACK.match(settings.get("GPUHUB_STACK", "")):
        errors.append("GPUHUB_STACK: use lower-case letters, digits, - and _")
    errors += _choice(settings, "GPUHUB_PLACEMENT", ("spread", "pack"))
    errors += _choice(settings, "GPUHUB_FULL_GPU", ("admins", "all", "off"))
    errors += _environments(settings.get("GPUHUB_ENVIRONMENTS", ""))
    errors += _choice(settings, "GPUHUB_DATASETS_MODE", ("ro", "rw"))
    for repo in settings.get("GPUHUB_TUTORIAL_REPOS", "").split():
        if not _REPO.match(repo):
            errors.append(f"GPUHUB_TUTORIAL_REPOS: {repo!r} is not NAME=URL[#BRANCH]")
    return errors


def _environments(value: str) -> list[str]:
    errors, seen = [], set()
    for entry in value.split():
        name, _, image = entry.partition("=")
        if not name or not image or not _IMAGE.match(image):
            errors.append(f"GPUHUB_ENVIRONMENTS: {entry!r} is not NAME=IMAGE")
        elif name in seen:
            errors.append(f"GPUHUB_ENVIRONMENTS: {name!r} is listed twice")
        seen.add(name)
    return errors


def _check(args) -> int:
    known = set(parse_env(Path(args.defaults).read_text(), args.defaults))
    errors = []
    if args.config:
        path = Path(args.config)
        try:
            config = parse_env(path.read_text(encoding="utf-8"), str(path))
        except ConfigFileError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        errors += unknown_keys(config, known, str(path))
        secret = config.get("GPUHUB_GITHUB_CLIENT_SECRET", ("", 0))[0]
        if secret and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            errors.append(
                f"{path} holds GPUHUB_GITHUB_CLIENT_SECRET but others may read it; "
                f"run: chmod 600 {path}"
            )
    settings = {k: v for k, v in os.environ.items() if k.startswith("GPUHUB_")}
    errors += [f"{args.config or 'settings'}: {e}" for e in problems(settings, mode=args.mode)]
    roster_file = settings.get("GPUHUB_ROSTER", "")
    if settings.get("GPUHUB_AUTH") == "github" and roster_file:
        errors += _read_roster(roster_file)[1]
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if errors else 0


def _read_roster(path: str) -> tuple[set[str], list[str]]:
    """The roster's usernames, and its problems (none when the names are usable)."""
    try:
        names = roster.parse(Path(path).read_text(encoding="utf-8"), path)
    except OSError as e:
        return set(), [f"GPUHUB_ROSTER: cannot read {path} ({e.strerror})"]
    except (UnicodeDecodeError, roster.RosterError) as e:
        return set(), [f"GPUHUB_ROSTER: {e}"]
    return names, [] if names else [f"GPUHUB_ROSTER: {path} lists no GitHub username"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_swarm_spawner.settings")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="check the effective settings (environment)")
    check.add_argument("--defaults", required=True, help="deploy/settings.env")
    check.add_argument("--config", default="", help="the organizer's config file")
    check.add_argument("--mode", choices=("up", "demo"), default="up")
    check.set_defaults(run=_check)
    rost = commands.add_parser("roster", help="check a roster file; print how many names")
    rost.add_argument("file")
    rost.set_defaults(run=lambda a: _print_roster(a.file))
    args = parser.parse_args(argv)
    return args.run(args)


def _print_roster(path: str) -> int:
    names, errors = _read_roster(path)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    if not errors:
        print(f"{path}: {len(names)} GitHub usernames")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
