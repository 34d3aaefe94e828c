"""The organizer's settings: the one reader of the config file, and every check before `make up`.

``read(mode)`` returns the settings as one typed, frozen ``Config`` (or raises
``SettingsError`` with every problem), which the deploy steps and the GPU machines' setup share;
``from_environment()`` is the same object for jupyterhub_config.py, from the hub's environment.

It merges the environment, the config file and deploy/settings.env (in that order of
precedence), refuses any config line it cannot take for certain (with its line number),
resolves ``auto`` limits from this machine and checks every setting the mode needs. Nothing
else reads the file, so what is checked is what is deployed. ``python -m deploy settings``
prints them, ``python3 -m deploy check VERB`` checks them before anything is installed.

Its parts: ``envfile.py`` (the files' format, and the three sources merged), ``limits.py``
(``auto`` limits for this machine), ``files.py`` (paths the settings name, secrets others may
read), ``values.py`` (how each value with more than one spelling is read and written); here,
every check of a mode (``problems``), the command (``load``) and the typed ``Config``.

Standard library only: it runs with the system python3 before anything is installed, and in the
hub's image. ``parse_env``, ``merge``, ``auto_limits``, ``unknown_keys``, ``placeholders`` and
``problems`` are pure.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import math
import os
import re
import stat
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from deploy import values as typed
from gpu_swarm_spawner import provider_settings, roster
from gpu_swarm_spawner.contract import (
    DISK_BUDGET_MAX_GB,
    DISK_SAFETY_RANGE,
    GUARD_KEYS,
    HOME_VOLUME,
    GuardSettings,
    guard_number,
)
from gpu_swarm_spawner.egress import EgressError, read_egress
from gpu_swarm_spawner.schedule import ScheduleError, read_schedule
from gpu_swarm_spawner.settings_table import FLEET_STOP_IDLE_LEAST_S, SETTINGS, Setting
from tutorial_sync import credentials
from tutorial_sync.repos import ReposError, parse_repos, redact

from .envfile import (
    RENAMED,
    ConfigFileError,
    Settings,
    SettingsError,
    environment_problems,
    filled_by_deploy,
    merge,
    parse_env,
    production_defaults,
    read_defaults,
    renamed,
    summarized,
    unknown_keys,
)
from .files import _noted, resolve_paths, secret_file_problems
from .limits import AUTO, LIMIT_KEYS, Machine, resolve_auto, this_machine

#: deploy/settings.env: every setting and its default; beside this module in the checkout and
#: in the installed package (package data).
DEFAULTS = Path(__file__).resolve().with_name("settings.env")
#: The checkout holding this module: its config.env is the organizer's default config file.
REPO = DEFAULTS.parent.parent

_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*$")
_STACK = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

#: What GitHub's client ids are made of ("Iv1.8a61f9b3a7aba766", "Ov23liA1b2C3d4E5f6G7").
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._-]+$")
#: One e-mail address, what Caddy hands Let's Encrypt as the account's contact.
_ONE_ADDRESS = re.compile(r"^[^\s@,;<>]+@[^\s@,;<>.][^\s@,;<>]*\.[^\s@,;<>]+$")

# ---- checks -------------------------------------------------------------------------------


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


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


def _typed(settings, key) -> tuple[object, list[str]]:
    """``key``'s value as Config types it (CONVERTERS), and the problems if it cannot be: the
    check and the value the hub and the spawner use come from the same function."""
    value = settings.get(key, "")
    try:
        return CONVERTERS[key](value), []
    except typed.Entries as e:
        return None, [f"{key}: {line}" for line in e.lines]
    except ValueError as e:
        return None, [f"{key} is {value!r}; {e}"]


#: The settings the checks and Config are made from (gpu_swarm_spawner/settings_table.py),
#: read when they run.
DECLARED: tuple[Setting, ...] = SETTINGS


def _declared(settings, declared: tuple[Setting, ...]) -> list[str]:
    """What the table declares of each setting: a number's range, a word's choices."""
    errors = []
    for setting in declared:
        if setting.read == "number":
            errors += _int(settings, setting.name, setting.low, setting.high)
        if setting.choices:
            errors += _choice(settings, setting.name, setting.choices)
    return errors


def _numbers(settings, declared: tuple[Setting, ...]) -> list[str]:
    """The numbers that depend on each other (once each is a whole number in its range)."""
    errors = []
    if any(_int(settings, s.name, s.low, s.high) for s in declared if s.read == "number"):
        return errors  # told by _declared
    if int(settings["GPUHUB_SLICES_PER_SERVER"]) > int(settings["GPUHUB_SLICES_PER_GPU"]):
        errors.append(
            f"GPUHUB_SLICES_PER_SERVER is {settings['GPUHUB_SLICES_PER_SERVER']} but a GPU has "
            f"only GPUHUB_SLICES_PER_GPU={settings['GPUHUB_SLICES_PER_GPU']} slices; lower it"
        )
    ports = [settings[k] for k in ("GPUHUB_HTTP_PORT", "GPUHUB_HTTPS_PORT", "GPUHUB_REGISTRY_PORT")]
    if settings.get("GPUHUB_TLS") != "off" and len(set(ports)) < 3:
        errors.append(
            "GPUHUB_HTTP_PORT, GPUHUB_HTTPS_PORT and GPUHUB_REGISTRY_PORT must differ "
            f"(they are {', '.join(ports)})"
        )
    return errors


def _limits(settings, mode) -> list[str]:
    errors = []
    if mode == "up":
        for key in LIMIT_KEYS:
            if settings.get(key) == AUTO:
                errors.append(
                    f"{key} is auto, which sizes servers by the machine running `make demo`; "
                    "with `make up` they run on the GPU machines: write the limit per server "
                    f"(deploy/config.example.env suggests one), or an empty value for none"
                )
    for key in LIMIT_KEYS:
        if settings.get(key) != AUTO:
            errors += _typed(settings, key)[1]
    return errors


def _login(settings, exists) -> list[str]:
    errors = _typed(settings, "GPUHUB_ADMIN_USERS")[1]
    if settings.get("GPUHUB_AUTH") != "github":
        return errors
    client_id = settings.get("GPUHUB_GITHUB_CLIENT_ID", "")
    if not client_id:
        errors.append(
            "GPUHUB_GITHUB_CLIENT_ID is empty; register an OAuth app on GitHub and copy its id"
        )
    elif not _CLIENT_ID.match(client_id):
        errors.append(
            f"GPUHUB_GITHUB_CLIENT_ID is {client_id!r}; copy the Client ID from the OAuth app's "
            "page on GitHub again (letters, digits and dots only, e.g. Ov23liA1b2C3d4E5f6G7)"
        )
    secret, secret_file = (
        settings.get("GPUHUB_GITHUB_CLIENT_SECRET", ""),
        settings.get("GPUHUB_GITHUB_CLIENT_SECRET_FILE", ""),
    )
    if secret and not (secret.isascii() and secret.isprintable() and not re.search(r"\s", secret)):
        errors.append(  # never the secret itself
            "GPUHUB_GITHUB_CLIENT_SECRET holds blanks or characters no client secret has (every "
            "login would fail); copy it again from the OAuth app's page: 40 letters and digits"
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
    orgs, wrong = _typed(settings, "GPUHUB_ALLOWED_ORGS")
    errors += wrong
    if not wrong and not orgs and not settings.get("GPUHUB_ROSTER"):
        errors.append(
            "GPUHUB_ALLOWED_ORGS and GPUHUB_ROSTER are both empty, so nobody could log in; "
            "set an organization (or org:team), a roster file, or both"
        )
    return errors


def _tls(settings, exists) -> list[str]:
    errors = []
    host = settings.get("GPUHUB_HOSTNAME", "")
    mode = settings.get("GPUHUB_TLS")
    private = _is_address(host) or host == "localhost" or "." not in host
    if mode == "acme" and host and not _typed(settings, "GPUHUB_HOSTNAME")[1] and private:
        errors.append(
            f"GPUHUB_TLS=acme needs a public DNS name in GPUHUB_HOSTNAME, not {host!r}; "
            "use GPUHUB_TLS=self-signed (or files) for an address or a private name"
        )
    email = settings.get("GPUHUB_ACME_EMAIL", "")
    if mode == "acme" and email and not _ONE_ADDRESS.match(email):
        errors.append(
            f"GPUHUB_ACME_EMAIL is {email!r}; write one e-mail address, the contact Let's "
            "Encrypt writes to about this hub's certificate (e.g. ops@uni.example)"
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
    ``mode`` "up" (production) also needs a hostname and explicit limits."""
    errors = _declared(settings, DECLARED) + _numbers(settings, DECLARED)
    errors += _limits(settings, mode)
    errors += _login(settings, exists) + _tls(settings, exists)
    host, wrong = _typed(settings, "GPUHUB_HOSTNAME")
    if mode == "up" and not settings.get("GPUHUB_HOSTNAME"):
        errors.append("GPUHUB_HOSTNAME is empty; write the hub's public DNS name or IP address")
    errors += wrong
    if host and typed.is_ipv6(host):
        users = []
        if settings.get("GPUHUB_AUTH") == "github":
            users.append("GitHub does not match it in an OAuth app's callback URL")
        if settings.get("GPUHUB_TLS") != "off":
            users.append("the HTTPS gateway takes no bare IPv6 address as its site")
        if users:
            errors.append(
                f"GPUHUB_HOSTNAME is {settings['GPUHUB_HOSTNAME']!r}, an IPv6 address: "
                f"{' and '.join(users)}; give the hub a DNS name (an AAAA record) and write that"
                + ("" if settings.get("GPUHUB_AUTH") == "github" else ", or set GPUHUB_TLS=off")
            )
    if not _STACK.match(settings.get("GPUHUB_STACK", "")):
        errors.append("GPUHUB_STACK: use lower-case letters, digits, - and _")
    errors += _subnet(settings.get("GPUHUB_NETWORK_SUBNET", ""))
    if settings.get("GPUHUB_SPAWNER") == "stock-swarm" and not settings.get("GPUHUB_NAMED_SLOTS"):
        errors.append(
            "GPUHUB_SPAWNER is stock-swarm but GPUHUB_NAMED_SLOTS is empty; name the slot kind "
            "it reserves, e.g. GPUHUB_NAMED_SLOTS=NVIDIA-GPU"
        )
    try:  # the servers' own reader (the spawner's egress trait)
        read_egress(settings.get("GPUHUB_EGRESS", ""))
    except EgressError as e:
        errors.append(f"GPUHUB_EGRESS: {e}")
    errors += _environments(settings.get("GPUHUB_ENVIRONMENTS", ""))
    errors += _shared_folders(settings)
    errors += _guard(settings)
    for key in ("GPUHUB_DISK_BUDGET_GB", "GPUHUB_DISK_SAFETY_PERCENT"):
        errors += _typed(settings, key)[1]
    for key in ("GPUHUB_METRICS_INTERVAL", "GPUHUB_METRICS_RETENTION"):
        if not _DURATION.match(settings.get(key, "")):
            errors.append(
                f"{key} is {settings.get(key, '')!r}; write a duration such as 15s, 30m, 12h or 4d"
            )
    try:  # the sync service's own reader
        parse_repos(settings.get("GPUHUB_TUTORIAL_REPOS", ""))
    except ReposError as e:
        errors += [f"GPUHUB_TUTORIAL_REPOS: {problem}" for problem in e.problems]
    errors += _fleet(settings)
    return errors


#: The setting behind each of provider_settings.command_problems' answers.
_COMMAND_KEYS = {
    "grow": "GPUHUB_FLEET_GROW_COMMAND",
    "remove": "GPUHUB_FLEET_REMOVE_COMMAND",
}


def _fleet(settings) -> list[str]:
    """The fleet's settings (docs/autoscaling.md): their types always (Config reads them), the
    rest only with GPUHUB_FLEET=on (with off an organizer may leave them as they are), and
    with on, homes on shared storage (machines given back take their disks with them). The
    checks are the hub's own readers (provider_settings: the commands, mounts, variables, image;
    schedule.read_schedule in its time zone)."""
    errors = []
    for key in ("GPUHUB_FLEET_PRICE_PER_HOUR", "GPUHUB_FLEET_MOUNTS", "GPUHUB_FLEET_ENV"):
        errors += _typed(settings, key)[1]
    if settings.get("GPUHUB_FLEET") != "on":
        return errors
    if not settings.get("GPUHUB_HOMES_DIR"):  # the default homes are on the GPU machines
        errors.append(
            "GPUHUB_FLEET is on but GPUHUB_HOMES_DIR is empty: each participant's home would "
            f"be the volume {HOME_VOLUME.format(username='<user>')} on the GPU machine that ran "
            "their server, and a machine the hub gives back is destroyed by the cloud with "
            "every file on it; set GPUHUB_HOMES_DIR to a folder on shared storage that the "
            "manager and every GPU machine mount at the same path, e.g. /srv/gpuhub/homes "
            "(docs/homes.md: NFS, served by the manager), or set GPUHUB_FLEET=off"
        )
    for which, said in provider_settings.command_problems(  # the time limit: told by _declared
        settings.get("GPUHUB_FLEET_GROW_COMMAND", ""),
        settings.get("GPUHUB_FLEET_REMOVE_COMMAND", ""),
    ):
        errors.append(f"{_COMMAND_KEYS[which]}: {said}")
    low, high = (
        settings.get("GPUHUB_FLEET_MIN_MACHINES", ""),
        settings.get("GPUHUB_FLEET_MAX_MACHINES", ""),
    )
    if high.isdigit() and int(high) < 1:
        errors.append(
            "GPUHUB_FLEET_MAX_MACHINES is 0 but GPUHUB_FLEET=on; write the most GPU machines the "
            "hub may have at once (your budget, or the cloud's quota), at least 1"
        )
    elif low.isdigit() and high.isdigit() and int(low) > int(high):
        errors.append(
            f"GPUHUB_FLEET_MIN_MACHINES is {low} but GPUHUB_FLEET_MAX_MACHINES is {high}; write "
            "a minimum no higher than the maximum"
        )
    idle = settings.get("GPUHUB_FLEET_STOP_IDLE_AFTER", "")
    if idle.isdigit() and 0 < int(idle) < FLEET_STOP_IDLE_LEAST_S:
        errors.append(
            f"GPUHUB_FLEET_STOP_IDLE_AFTER is {idle}, in seconds; write 0 (off), or at least "
            f"{FLEET_STOP_IDLE_LEAST_S}: longer than every break of the programme, e.g. 1200 "
            "for 20 minutes (docs/autoscaling.md)"
        )
    zone = settings.get("GPUHUB_FLEET_TIMEZONE", "")
    if not _zones():
        errors.append(
            "GPUHUB_FLEET_TIMEZONE cannot be checked: this machine has no time zone database; "
            "install it (apt-get install tzdata) and run this again"
        )
    elif zone not in _zones():
        errors.append(
            f"GPUHUB_FLEET_TIMEZONE is {zone!r}; write the IANA name of the workshop's time zone, "
            "such as Europe/Berlin, America/New_York or UTC"
        )
    else:
        try:
            read_schedule(settings.get("GPUHUB_FLEET_SCHEDULE", ""), zone, "GPUHUB_FLEET_SCHEDULE")
        except ScheduleError as e:
            errors.append(str(e))
    image = settings.get("GPUHUB_FLEET_IMAGE", "")
    if image and not provider_settings.IMAGE_REFERENCE.match(image):
        errors.append(
            f"GPUHUB_FLEET_IMAGE is {image!r}; write a Docker image reference, the cloud's own "
            "CLI image: amazon/aws-cli, gcr.io/google.com/cloudsdktool/google-cloud-cli:slim or "
            "mcr.microsoft.com/azure-cli (or empty: the commands run in the hub's container)"
        )
    return errors


@functools.cache
def _zones() -> frozenset[str]:
    """The IANA time zones this machine knows (the hub's image has the same database)."""
    return frozenset(zoneinfo.available_timezones())


def tutorial_token_problems(settings: Mapping[str, str]) -> list[str]:
    """GPUHUB_TUTORIAL_TOKEN_FILE: empty, or an absolute path to a file only its owner may
    read, holding tokens the sync service's reader takes for the https repositories listed
    (tutorial_sync.credentials). No line shows the file's text."""
    path = settings.get("GPUHUB_TUTORIAL_TOKEN_FILE", "")
    if not path:
        return []
    key = "GPUHUB_TUTORIAL_TOKEN_FILE"
    if not path.startswith("/"):
        return [f"{key} is {path!r}; write the file's absolute path, e.g. /root/tutorial-token"]
    try:
        found = credentials.read_token_file(path)
        repos = parse_repos(settings.get("GPUHUB_TUTORIAL_REPOS", ""))
    except credentials.TokenFileError as e:
        return [f"{key}: {path} {problem}" for problem in e.problems]
    except ReposError:
        return []  # told by problems()
    hosts = credentials.https_hosts(r.url for r in repos)
    return [f"{key}: {path} holds {problem}" for problem in credentials.check_tokens(found, hosts)]


def _subnet(value: str) -> list[str]:
    """GPUHUB_NETWORK_SUBNET: empty, or a private IPv4 range with room for servers."""
    if not value:
        return []
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        return [
            f"GPUHUB_NETWORK_SUBNET is {value!r} ({e}); write an address range such as "
            "10.120.0.0/20, or leave it empty"
        ]
    if network.version != 4 or not network.is_private or network.prefixlen > 28:
        return [
            f"GPUHUB_NETWORK_SUBNET is {value!r}; write a private IPv4 range of /28 or larger "
            "(one address per server), such as 10.120.0.0/20"
        ]
    return []


#: Folders the servers mount from the machine they run on: {key: where servers see it}.
SHARED_FOLDERS = {
    "GPUHUB_TUTORIALS_DIR": "/srv/tutorials",
    "GPUHUB_DATASETS_DIR": "/srv/datasets",
    "GPUHUB_HOMES_DIR": "/home/jovyan",
}


def _inside(a: str, b: str) -> bool:
    """Folder ``a`` is ``b`` or inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/")


def _shared_folders(settings) -> list[str]:
    """The shared folders (and the state directory, which holds the secrets): absolute paths
    that Docker's volume syntax and the join line take as they are; the homes folder apart
    from the others (a participant would see every home through one of them, or have the
    secrets for a home, and `make down PURGE=1` empties the state directory)."""
    errors, paths = [], {}
    for key in (*SHARED_FOLDERS, "GPUHUB_STATE_DIR"):
        value = settings.get(key, "")
        if not value and key in ("GPUHUB_DATASETS_DIR", "GPUHUB_HOMES_DIR"):
            continue  # none
        if not value.startswith("/") or os.path.normpath(value) == "/":
            errors.append(
                f"{key} is {value!r}; write the absolute path of a folder, such as "
                f"/srv/{key.removeprefix('GPUHUB_').removesuffix('_DIR').lower()}"
            )
        elif ":" in value or any(ch.isspace() for ch in value):
            errors.append(
                f"{key} is {value!r}; Docker's volume syntax takes no ':' or blanks in a path: "
                "choose a folder without them"
            )
        else:
            paths[key] = os.path.normpath(value)
    homes = paths.get("GPUHUB_HOMES_DIR")
    for key, other in paths.items():
        if homes and key != "GPUHUB_HOMES_DIR" and (_inside(homes, other) or _inside(other, homes)):
            errors.append(
                f"GPUHUB_HOMES_DIR ({homes}) and {key} ({other}) overlap: a participant's folder "
                "must hold only their own home; give the homes a folder of their own on the "
                "shared storage, such as /srv/homes"
            )
    return errors


#: A Prometheus duration (its --storage.tsdb.retention.time and scrape_interval), e.g. 4d, 1h30m
_DURATION = re.compile(r"^(?:[0-9]+(?:ms|s|m|h|d|w|y))+$")


def _guard(settings) -> list[str]:
    """The GPU guard's settings, checked by the guard's own reader (the contract's; the GPU
    machines get them from the join line)."""
    try:
        GuardSettings.parse({k: v for k, v in settings.items() if k in GUARD_KEYS})
    except ValueError as e:
        return re.split(r"; (?=GPUHUB_)", str(e))
    return []


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


# Values of deploy/config.example.env that stand for the organizer's own: (key, pattern, what
# to write instead, when it matters). example.org/.com/.net are reserved names (RFC 2606),
# never a real hub or mailbox.
PLACEHOLDERS = [
    (
        "GPUHUB_HOSTNAME",
        r"(^|\.)example\.(org|com|net)$",
        "write this machine's public DNS name (or its IP address)",
        lambda s: True,
    ),
    (
        "GPUHUB_ACME_EMAIL",
        r"[@.]example\.(org|com|net)$",
        "write the address the certificate authority may write to, or leave it empty",
        lambda s: s.get("GPUHUB_TLS") == "acme",
    ),
    (
        "GPUHUB_GITHUB_CLIENT_ID",
        r"^Iv1\.0+$",
        "write the client id of your OAuth app (https://github.com/settings/developers)",
        lambda s: s.get("GPUHUB_AUTH") == "github",
    ),
    (
        "GPUHUB_GITHUB_CLIENT_SECRET",
        r"^replace-with-",
        "write your OAuth app's client secret (or name a file holding it in "
        "GPUHUB_GITHUB_CLIENT_SECRET_FILE and leave this empty)",
        lambda s: s.get("GPUHUB_AUTH") == "github",
    ),
    (
        "GPUHUB_ALLOWED_ORGS",
        r"(^|[\s,])my-workshop-org\b",
        "write your GitHub organizations and org:team pairs, or leave it empty to let in only "
        "the roster's usernames",
        lambda s: s.get("GPUHUB_AUTH") == "github",
    ),
    (
        "GPUHUB_ADMIN_USERS",
        r"(^|[\s,])(lead|co)-organizer\b",
        "write the organizers' usernames (GitHub usernames with GPUHUB_AUTH=github)",
        lambda s: True,
    ),
    (
        "GPUHUB_TUTORIAL_REPOS",
        r"/my-workshop-org/",
        "write your tutorial repositories as NAME=URL[#BRANCH], or leave it empty",
        lambda s: True,
    ),
]


def placeholders(settings: Settings) -> list[str]:
    """A line for each value still as deploy/config.example.env has it, naming where it is set
    and what to write instead."""
    out = []
    for key, pattern, advice, applies in PLACEHOLDERS:
        value = settings.values.get(key, "")
        if applies(settings.values) and re.search(pattern, value):
            shown = "the example's value" if "SECRET" in key else f"the example's {value!r}"
            where = settings.origin.get(key, "the settings")
            out.append(f"{where}: {key} is still {shown}; {advice}")
    return out


def read_roster(path: str) -> tuple[roster.Roster, list[str]]:
    """The roster as the hub will read it (``roster.read``, the one reader), and its problems
    (none when it may be handed to the hub)."""
    try:
        found = roster.read(path)
    except OSError as e:
        return roster.Roster(frozenset()), [
            f"GPUHUB_ROSTER: cannot read {path} ({e.strerror}); check the path"
        ]
    except roster.RosterError as e:
        return roster.Roster(frozenset()), [f"GPUHUB_ROSTER: {p}" for p in e.problems]
    if not found.names:
        return found, [f"GPUHUB_ROSTER: {path} lists no GitHub username; add them"]
    return found, []


# ---- the command --------------------------------------------------------------------------


def _gather(
    defaults_path: str,
    config_path: str,
    mode: str | None,
    environ: Mapping[str, str],
    machine: Machine | None,
) -> tuple[Settings, list[str]]:
    """The effective settings and every problem found (none: they may be deployed)."""
    try:
        defaults = read_defaults(defaults_path)
    except ConfigFileError as e:  # a broken deploy/settings.env is the developers' bug
        return Settings({}, {}), e.problems
    config, source = {}, config_path
    if source:
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as e:
            return Settings({}, {}), [
                f"cannot read the config file {source} ({e.strerror}); copy "
                "deploy/config.example.env there and edit it (or run this with sudo)"
            ]
        try:
            parsed = parse_env(data, source)
        except ConfigFileError as e:
            return Settings({}, {}), e.problems
        config = renamed(parsed, lambda key: f"{source} line {parsed[key][1]}")
    unknown = unknown_keys(config, set(defaults), source) + filled_by_deploy(config, source)
    unknown += environment_problems(environ, set(defaults))
    environ = renamed(
        {k: v for k, v in environ.items() if k in defaults or k in RENAMED},
        lambda key: "the environment",
    )
    try:
        settings = merge(defaults, config, environ, source, defaults_path)
    except ConfigFileError as e:
        return Settings({}, {}), e.problems
    if mode == "up":
        settings = production_defaults(settings)
    else:
        machine = machine or this_machine()
        settings = resolve_auto(settings, machine)
    settings, notes = resolve_paths(settings, source, os.getcwd())
    if not mode:
        return settings, summarized(unknown)
    errors = unknown + placeholders(settings)
    secret = config.get("GPUHUB_GITHUB_CLIENT_SECRET", ("", 0))[0]
    if secret and Path(source).stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        errors.append(
            f"{source} holds GPUHUB_GITHUB_CLIENT_SECRET but others may read it; "
            f"run: chmod 600 {source}"
        )
    prefix = source or "settings"
    found = problems(settings.values, mode=mode) + secret_file_problems(settings.values)
    found += tutorial_token_problems(settings.values)
    if mode == "demo" and machine:
        found += _cores_here(settings.values, machine)
    errors += [f"{_where(line, settings, prefix)}: {line}" for line in found]
    roster_file = settings.values.get("GPUHUB_ROSTER", "")
    if settings.values.get("GPUHUB_AUTH") == "github" and roster_file:
        errors += [
            f"{_where(line, settings, prefix)}: {line}" for line in read_roster(roster_file)[1]
        ]
    errors = sorted(_noted(errors, settings, notes), key=_line_number)
    return settings, summarized(errors)


def _where(problem: str, settings: Settings, otherwise: str) -> str:
    """Where the setting a problem starts with was set: "FILE line N" or "the environment"
    (a default: ``otherwise``, the config file)."""
    key = re.match(r"GPUHUB_[A-Z0-9_]+", problem)
    origin = settings.origin.get(key.group(0), "") if key else ""
    return origin if " line " in origin or origin == "the environment" else otherwise


def _line_number(problem: str) -> float:
    """The config file's line a problem is about, for the file's order (others after it)."""
    found = re.match(r"^[^:]* lines? ([0-9]+)\b", problem)
    return int(found.group(1)) if found else math.inf


def _cores_here(settings: dict[str, str], machine: Machine) -> list[str]:
    """`make demo` runs the servers on this machine: Docker refuses to start a container with
    a CPU limit above its cores."""
    try:
        cores = typed.cores(settings.get("GPUHUB_CPU_LIMIT", ""))
    except ValueError:
        return []  # said by problems()
    if cores is not None and cores > machine.cpus:
        return [
            f"GPUHUB_CPU_LIMIT is {cores:g} but this machine, which runs the demo's servers, has "
            f"{machine.cpus} cores; Docker would refuse to start them: write at most {machine.cpus}"
        ]
    return []


def load(args, environ=os.environ, machine: Machine | None = None) -> tuple[Settings, list[str]]:
    """``load``'s arguments (defaults, config, mode): the effective settings and every problem
    found (none: they may be deployed)."""
    return _gather(args.defaults, args.config, args.mode or None, environ, machine)


# ---- one typed object ---------------------------------------------------------------------


def _whole_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError("write a whole number") from None


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError("write 1 or 0")
    return value == "1"


def _on(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError("write on or off")
    return value == "on"


def disk_budget(value: str) -> float:
    """GPUHUB_DISK_BUDGET_GB in GiB (0: no budget)."""
    try:
        gb = float(value)
    except ValueError:
        gb = math.nan
    if not 0 <= gb <= DISK_BUDGET_MAX_GB:  # nan and inf too
        raise ValueError(
            f"write the GB each participant may use, from 0 (no budget) to {DISK_BUDGET_MAX_GB}, "
            "e.g. 20 or 2.5"
        )
    return gb


def disk_safety(value: str) -> int:
    """GPUHUB_DISK_SAFETY_PERCENT as a whole percentage (0: no safety line); it may end in %,
    as the guard's percentages may."""
    low, high = DISK_SAFETY_RANGE
    try:
        percent = int(value.strip().removesuffix("%"))
    except ValueError:
        percent = -1
    if percent != 0 and not low <= percent <= high:
        raise ValueError(
            f"write a whole percentage from {low} to {high}, e.g. 90 (a file system fuller "
            "than that has its biggest writer stopped), or 0 for no safety line"
        )
    return percent


def environments(value: str) -> dict[str, str]:
    """GPUHUB_ENVIRONMENTS as {name: image}, in the order written (the first is the default)."""
    out: dict[str, str] = {}
    for entry in value.split():
        name, _, image = entry.partition("=")
        if not name or not image or name in out:
            raise ValueError(
                f"write NAME=IMAGE entries separated by spaces, each name once ({entry!r})"
            )
        out[name] = image
    return out


def _text(value: str) -> str:
    return value


def price(value: str) -> float | None:
    """GPUHUB_FLEET_PRICE_PER_HOUR: None when empty, else a decimal of at least 0."""
    if not value:
        return None
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?|\.[0-9]+", value):
        raise ValueError(
            "write the price of one machine-hour in digits and a decimal point, e.g. 2.48 "
            "(no currency sign), or leave it empty"
        )
    return float(value)


#: How Config reads each kind of setting (``Setting.read`` in the table): a value that does not
#: convert is a SettingsError naming the key, where it was set and what to write; ``problems``
#: checks the settings with the same functions.
READERS: dict[str, Callable[[str], object]] = {
    "text": _text,
    "number": _whole_number,
    "flag": _flag,
    "on": _on,
    "usernames": typed.usernames,
    "organizations": typed.organizations,
    "hostname": typed.hostname,
    "cores": typed.cores,
    "memory": typed.memory,
    "tasks": typed.tasks,
    "repos": parse_repos,  # [Repo]: the sync service's reader, once
    "environments": environments,
    "egress": read_egress,
    "disk_budget": disk_budget,
    "disk_safety": disk_safety,
    "price": price,
    "mounts": provider_settings.read_mounts,  # the container runner's reader, once
    "command_env": provider_settings.read_env,
}

#: The one written form of each kind of value that has more than one: what Config keeps in
#: ``values``, so that the stack hands the hub (whose ``from_environment`` reads it back with
#: the same reader) the value that was checked, not the organizer's spelling of it.
WRITERS: dict[str, Callable[[object], str]] = {
    "usernames": typed.names_written,
    "organizations": typed.names_written,
    "hostname": str,
    "cores": typed.cores_written,
    "memory": typed.memory_written,
    "tasks": lambda n: "" if n is None else str(n),
    "egress": lambda e: e.written(),
}


def _reader(setting: Setting) -> Callable[[str], object]:
    if setting.read == "guard_number":  # the guard's numbers, read as the guard reads them
        return functools.partial(guard_number, setting.name)
    return READERS[setting.read]


#: Each setting's reader, and the writer of those with one written form (from the table).
CONVERTERS: dict[str, Callable[[str], object]] = {s.name: _reader(s) for s in SETTINGS}
WRITTEN: dict[str, Callable[[object], str]] = {
    s.name: WRITERS[s.read] for s in SETTINGS if s.read in WRITERS
}


@dataclass(frozen=True, repr=False)
class _Settings:
    """What Config holds besides its typed attributes, and what it does."""

    values: dict[str, str]
    origin: dict[str, str] = field(default_factory=dict)
    config_file: str = ""  # "" when none

    #: The settings its attributes are made from (``config_class``).
    declared: ClassVar[tuple[Setting, ...]] = ()

    def __post_init__(self):
        object.__setattr__(self, "values", dict(self.values))
        object.__setattr__(self, "origin", dict(self.origin))
        problems = []
        for setting in self.declared:
            key = setting.name
            if key not in self.values:
                problems.append(f"{key} is not set; deploy/settings.env lists every setting")
                continue
            value = self.values[key]
            where = self.origin.get(key, "the settings")
            try:
                converted = _reader(setting)(value)
            except typed.Entries as e:  # redact: a URL's credentials stay out of every line
                problems += [redact(f"{where}: {key}: {line}") for line in e.lines]
                continue
            except ValueError as e:
                problems.append(redact(f"{where}: {key} is {value!r}; {e}"))
                continue
            object.__setattr__(self, setting.attribute, converted)
            if setting.read in WRITERS:
                self.values[key] = WRITERS[setting.read](converted)
        if problems:
            raise SettingsError(problems)

    def with_values(self, changes: Mapping[str, str], origin: str) -> Config:
        """A copy with ``changes`` (GPUHUB_X -> value, keys of settings.env only) taken from
        ``origin`` (e.g. "make up" for what the deploy steps fill in)."""
        unknown = sorted(set(changes) - set(self.values))
        if unknown:
            raise KeyError(f"not settings: {', '.join(unknown)}")
        return dataclasses.replace(
            self,
            values={**self.values, **changes},
            origin={**self.origin, **dict.fromkeys(changes, origin)},
        )

    def __repr__(self) -> str:  # the client secret stays out of logs and tracebacks
        shown = {k: _shown(k, v) for k, v in self.values.items()}
        return f"Config(config_file={self.config_file!r}, values={shown!r})"


def config_class(declared: tuple[Setting, ...]) -> type:
    """The typed settings for a table: ``_Settings`` with one attribute per setting, named
    after it without GPUHUB_, in lower case, of the type its reader gives."""
    return dataclasses.make_dataclass(
        "Config",
        [(s.attribute, s.type, field(init=False)) for s in declared],
        bases=(_Settings,),
        namespace={"__doc__": _CONFIG_DOC, "__module__": __name__, "declared": tuple(declared)},
        frozen=True,
        repr=False,
    )


_CONFIG_DOC = """Every setting, read once: ``values`` (GPUHUB_X -> the string the stack files
    interpolate, in its one written form: WRITTEN), ``origin`` (where each came from, for
    messages) and one typed attribute per setting of gpu_swarm_spawner/settings_table.py, named
    after it without GPUHUB_, in lower case (``cfg.slices_per_server``, ``cfg.environments``),
    typed as its reader gives it (settings_table.TYPES). Built by ``read`` or
    ``from_environment``; ``with_values`` gives a changed copy (never change ``values``).

    Made from the table (``config_class``) so that a setting is declared once: each
    attribute's name and type are its Setting's ``attribute`` and ``type``; ``python -m deploy
    settings`` prints the values."""

#: The organizer's settings, typed (``config_class`` of the table).
Config = config_class(SETTINGS)


def _shown(key: str, value: str) -> str:
    """A setting's value for a log line or Config's repr: never a secret's."""
    hidden = value and any(word in key for word in ("SECRET", "TOKEN", "PASSWORD"))
    return "***" if hidden else value


def from_the_environment(config: Config) -> str:
    """The line `make up` and `make demo` log about the settings the environment gave, which
    win over the config file (an export left in a shell, GPUHUB_TLS=off say, would otherwise
    turn the file's HTTPS off without a word); "" when it gave none."""
    given = [key for key, where in config.origin.items() if where == "the environment"]
    if not given:
        return ""
    shown = ", ".join(f"{key}={_shown(key, config.values[key])}" for key in given)
    over = config.config_file or "deploy/settings.env"
    unset = " ".join(given)
    return f"from the environment, over {over}: {shown} (to use the file's: unset {unset})"


def typed_attributes(config_type: type | None = None) -> list[str]:
    """Config's attribute for each setting, in the table's (and deploy/settings.env's) order."""
    return [f.name for f in dataclasses.fields(config_type or Config) if not f.init]


def key_of(attribute: str) -> str:
    """The setting behind a Config attribute: ``slices_per_server`` -> GPUHUB_SLICES_PER_SERVER."""
    return "GPUHUB_" + attribute.upper()


def config_file(environ: Mapping[str, str] = os.environ) -> str:
    """The organizer's config file: GPUHUB_CONFIG (`make up CONFIG=FILE`), else the checkout's
    config.env when it exists; "" for none (GPUHUB_CONFIG=none: the demo and the tests)."""
    chosen = environ.get("GPUHUB_CONFIG", "")
    if chosen == "none":
        return ""
    if chosen:
        return chosen
    default = REPO / "config.env"
    return str(default) if default.is_file() else ""


def read(
    mode: str | None = None,
    environ: Mapping[str, str] = os.environ,
    config: str | None = None,
    machine: Machine | None = None,
) -> Config:
    """The settings as ``load`` takes them: the environment over the config file (``config``;
    None: ``config_file(environ)``, "": none) over deploy/settings.env, ``auto`` limits resolved
    for ``machine`` (default: this one) unless ``mode`` is "up". ``mode`` "up" or "demo" runs
    every check of that mode; None only refuses what cannot be read (a config line, an unknown
    key, a value of the wrong type). Raises SettingsError with every problem."""
    if mode not in (None, "up", "demo"):
        raise ValueError(f"mode is {mode!r}; use 'up', 'demo' or None")
    path = config_file(environ) if config is None else config
    settings, errors = _gather(str(DEFAULTS), path, mode, environ, machine)
    if errors:
        raise SettingsError(errors)
    return Config(settings.values, settings.origin, path)


def from_environment(
    environ: Mapping[str, str] = os.environ, machine: Machine | None = None
) -> Config:
    """The settings inside the hub's container (jupyterhub_config.py): deploy/settings.env's
    defaults, overridden by the GPUHUB_* variables the stack passes (each in the one written
    form Config gave it, read back by the same CONVERTERS). No config file and no checks of a
    mode: ``load`` ran them before the stack was deployed. A key the stack does not pass keeps
    its default; a limit left at ``auto`` (the stack passes them resolved) is sized for
    ``machine`` (default: this one), as ``read`` does."""
    defaults = read_defaults(str(DEFAULTS))
    passed = renamed(
        {k: v for k, v in environ.items() if k in defaults or k in RENAMED},
        lambda key: "the environment",
    )
    settings = merge(defaults, {}, passed, defaults_source=str(DEFAULTS))
    settings = resolve_auto(settings, machine or this_machine())
    return Config(settings.values, settings.origin, "")
