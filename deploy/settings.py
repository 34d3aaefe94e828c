"""The organizer's settings: the one reader of the config file, and every check before `make up`.

``read(mode)`` returns the settings as one typed, frozen ``Config`` (or raises
``SettingsError`` with every problem), which the deploy steps and the GPU machines' setup share;
``from_environment()`` is the same object for jupyterhub_config.py, from the hub's environment.

It merges the environment, the config file and deploy/settings.env (in that order of
precedence), refuses any config line it cannot take for certain (with its line number),
resolves ``auto`` limits from this machine and checks every setting the mode needs. Nothing
else reads the file, so what is checked is what is deployed. ``python -m deploy settings``
prints them, ``python3 -m deploy check VERB`` checks them before anything is installed.

Standard library only: it runs with the system python3 before anything is installed, and on GPU
machines that have nothing else. ``parse_env``, ``merge``, ``auto_limits``, ``unknown_keys``,
``placeholders`` and ``problems`` are pure.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import stat
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from deploy import values as typed
from gpu_swarm_spawner import roster
from gpu_swarm_spawner.contract import GUARD_KEYS, MAX_SLICES_PER_GPU, GuardSettings
from tutorial_sync import credentials
from tutorial_sync.repos import Repo, ReposError, parse_repos, redact

#: deploy/settings.env: every setting and its default; beside this module in the checkout and
#: in the installed package (package data).
DEFAULTS = Path(__file__).resolve().with_name("settings.env")
#: The checkout holding this module: its config.env is the organizer's default config file.
REPO = DEFAULTS.parent.parent

V = TypeVar("V")

_KEY = re.compile(r"^GPUHUB_[A-Z0-9_]+$")
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*$")
_STACK = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

TLS_MODES = ("acme", "self-signed", "files", "off")
AUTH_MODES = ("github", "local")
AUTO = "auto"
GIB = 1024**3
MIB = 1024**2

# ---- the file format ------------------------------------------------------------------------
# One GPUHUB_NAME=value per line, taken literally. deploy/config.example.env's header states
# these rules for the organizer; tests/unit/test_settings.py holds a corpus of odd lines.

_BLANKS = " \t"
_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # PowerShell's `>` and Notepad's "Unicode" write one
#: A config file is a few kilobytes; a larger one is some other file given by mistake.
MAX_FILE_BYTES = 256 * 1024
#: Problems shown at most; the rest are counted on one more line.
MAX_PROBLEMS = 20
# Where a shell would start a comment or expand a home directory: at the start of a word.
_WORD_START = re.compile(r"(?:^|[ \t])([#~])")
# Where a shell would expand or escape something, which this reader never does.
_SHELL_CHARS = ("$", "`", "\\")
_ASSIGNMENT = re.compile(r"(?:^|[ \t])(?:export[ \t]+)?GPUHUB_[A-Za-z0-9_]*=")
_REFERENCE = re.compile(r"\$\{(GPUHUB_[A-Z0-9_]+)\}")


class SettingsError(ValueError):
    """Settings that cannot be deployed; ``problems`` holds one line each, naming the key (and
    where it was set) and what to write instead. ``str()`` is all of them, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class ConfigFileError(SettingsError):
    """Lines of a settings file that cannot be taken for certain; ``problems`` holds one line
    each, ``FILE line N: what is wrong; what to write instead``."""


class _Refused(ValueError):
    """One line refused; the message says why and what to write instead."""


def _fail(message: str) -> NoReturn:
    raise _Refused(message)


def _character(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" ({name.lower()})" if name else "")


def _unquoted(key: str, text: str, references: bool) -> str:
    for ch in ("'", '"'):
        if ch in text:
            _fail(
                f"{key}: a {ch} inside a value without quotes around it; put the whole value "
                "in quotes (single quotes keep everything as written), or remove the stray quote"
            )
    found = _WORD_START.search(text)
    if found and found.group(1) == "#":
        _fail(
            f"{key}: a '#' starting a word of the value is neither a comment nor cut off here; "
            "put a comment on a line of its own, or, if '#' belongs to the value, quote it: "
            f"{key}='...'"
        )
    if found:
        _fail(f"{key}: '~' is not expanded here; write the full path, e.g. /root/...")
    plain = _REFERENCE.sub("", text) if references else text
    for ch in _SHELL_CHARS:
        if ch in plain:
            _fail(
                f"{key}: {ch!r} is taken literally here (nothing is expanded or escaped); write "
                f"the value itself, or put it in single quotes if {ch!r} belongs to it: {key}='...'"
            )
    if _ASSIGNMENT.search(text):
        _fail(f"{key}: two settings on one line; put each GPUHUB_NAME=value on a line of its own")
    return text


def _quoted(key: str, text: str) -> str:
    quote = text[0]
    end = text.find(quote, 1)
    if end < 0:
        _fail(f"{key}: the value opens a {quote} quote but does not close it; end it with {quote}")
    if text[end + 1 :].strip(_BLANKS):
        _fail(
            f"{key}: text after the closing {quote}; put all of the value inside the quotes "
            "and a comment on a line of its own"
        )
    inner = text[1:end]
    if quote == '"':
        for ch in _SHELL_CHARS:
            if ch in inner:
                _fail(
                    f"{key}: {ch!r} inside double quotes would be expanded by a shell but is "
                    f"taken literally here; use single quotes to keep it: {key}='...'"
                )
    return inner


def _parse_line(line: str, references: bool = False) -> tuple[str, str] | None:
    """(key, value) of one decoded line, None for a blank or comment line; _Refused otherwise."""
    line = line.strip(_BLANKS)
    if not line or line.startswith("#"):
        return None
    odd = next((ch for ch in line if ch != "\t" and not ch.isprintable()), None)
    if odd is not None:
        _fail(
            f"an invisible or control character {_character(odd)}; delete the line and type it "
            "again (copies from web pages and word processors bring these)"
        )
    if re.match(r"export[ \t]", line):
        line = line[len("export") :].lstrip(_BLANKS)
    key, equals, value = line.partition("=")
    key = key.rstrip(_BLANKS)
    if not equals:
        # the line itself is not shown: it may be a secret pasted on a line of its own
        _fail("no '=' in it; write GPUHUB_NAME=value, or start a comment with #")
    if not _KEY.match(key):
        if re.match(r"^GPUHUB_[A-Z0-9_]+$", key, re.IGNORECASE):
            _fail(f"{key}: setting names are upper case; write {key.upper()}=...")
        _fail(
            f"{key[:40]!r} is not a setting name; write GPUHUB_NAME=value "
            "(deploy/settings.env lists the names)"
        )
    value = value.strip(_BLANKS)
    if value[:1] in ("'", '"'):
        return key, _quoted(key, value)
    return key, _unquoted(key, value, references)


def summarized(problems: list[str], limit: int = MAX_PROBLEMS) -> list[str]:
    """The first ``limit`` problems and a line counting the rest: the first ones are fixed
    first, and a file given by mistake does not fill the screen."""
    if len(problems) <= limit:
        return problems
    rest = len(problems) - limit
    return [*problems[:limit], f"... and {rest} more problems like these"]


def _grouped(source: str, found: list[tuple[int, str]]) -> list[str]:
    """One line per problem, naming every line it was found on (the first few, and a count):
    a file saved in another encoding or given by mistake says so once, not per line."""
    lines: dict[str, list[int]] = {}
    for number, message in found:
        lines.setdefault(message, []).append(number)
    out = []
    for message, numbers in lines.items():
        if len(numbers) == 1:
            where = f"line {numbers[0]}"
        else:
            shown = ", ".join(str(n) for n in numbers[:3])
            more = len(numbers) - 3
            where = f"lines {shown}" + (f" and {more} more" if more > 0 else "")
        out.append(f"{source} {where}: {message}")
    return out


def _not_text(data: bytes, source: str) -> str | None:
    """Why ``data`` is no config file to read line by line, or None."""
    if len(data) > MAX_FILE_BYTES:
        return (
            f"{source} is {len(data) / 1024**2:.1f} MB; a config file is a few kilobytes of "
            "GPUHUB_NAME=value lines: is it the right file? (make up CONFIG=FILE names it)"
        )
    if b"\0" in data:
        return (
            f"{source} holds NUL bytes: saved as UTF-16 without a byte order mark, or not a text "
            "file; save it as UTF-8 (Notepad: Save as, Encoding UTF-8; PowerShell: "
            "Set-Content -Encoding utf8)"
        )
    return None


def _lines(data: bytes | str):
    """(number, text) of each line; UnicodeDecodeError's position is reported by the caller."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        yield number, raw


def parse_env(
    data: bytes | str, source: str, references: bool = False
) -> dict[str, tuple[str, int]]:
    """The settings of a config file as {key: (value, line number)}.

    The format: one ``GPUHUB_NAME=value`` per line, UTF-8 (a BOM at the start is ignored),
    LF or CRLF line ends. Blank lines and lines starting with ``#`` are ignored; blanks (spaces,
    tabs) around the line, the name and the value are not part of them; ``export`` before the
    name is allowed. The value is the rest of the line, taken literally: quotes around all of it
    ('...' or "...") are removed, nothing is expanded. An empty value means empty (e.g. no
    limit), not the default. UTF-16 with its byte order mark (PowerShell's ``>``, Notepad's
    "Unicode") is read as well. Raises ConfigFileError with every line it cannot take for
    certain, one line per problem (naming each line it was found on, at most MAX_PROBLEMS):
    a file too large to be one or holding NUL bytes, not UTF-8, invisible characters, a
    lower-case or missing name, a name given twice, an unclosed or stray quote, anything a
    shell would treat differently (``$``, a backquote, a backslash, ``~`` or ``#`` starting a
    word, two assignments on one line). ``references`` (deploy/settings.env only) lets
    unquoted values hold ``${GPUHUB_X}``.
    """
    if isinstance(data, bytes) and data.startswith(_UTF16_BOMS):
        try:
            data = data.decode("utf-16")
        except UnicodeDecodeError:
            raise ConfigFileError(
                [f"{source}: not UTF-16 text after its byte order mark; save it as UTF-8"]
            ) from None
    if isinstance(data, bytes) and (why := _not_text(data, source)):
        raise ConfigFileError([why])
    found: dict[str, tuple[str, int]] = {}
    problems: list[tuple[int, str]] = []
    for number, raw in _lines(data):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            problems.append(
                (
                    number,
                    f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "save the file as UTF-8",
                )
            )
            continue
        try:
            parsed = _parse_line(text, references)
        except _Refused as e:
            problems.append((number, str(e)))
            continue
        if parsed is None:
            continue
        key, value = parsed
        if key in found:
            problems.append(
                (number, f"{key} is set again (first on line {found[key][1]}); keep one of the two")
            )
            continue
        found[key] = (value, number)
    if problems:
        raise ConfigFileError(summarized(_grouped(source, problems)))
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


#: Settings that were renamed, {old name: new name} (as dockerspawner's ``_deprecated_aliases``).
#: An old name in the environment or a config file is read as the new one, with a warning,
#: unless the new one is set there too.
RENAMED = {"GPUHUB_GPU_SLICES": "GPUHUB_SLICES_PER_SERVER"}

#: Keys of deploy/settings.env that the deploy steps fill in with what they find while deploying
#: (the public URL, image ids, secret versions, ...), for the stack files and the hub. Their
#: defaults are placeholders; a config file that sets one is refused.
FILLED_BY_DEPLOY = (
    "GPUHUB_PUBLIC_URL",
    "GPUHUB_SIMULATED_GPUS",
    "GPUHUB_ROSTER_FILE",
    "GPUHUB_HUB_IMAGE_ID",
    "GPUHUB_SINGLEUSER_IMAGE_ID",
    "GPUHUB_TUTORIAL_SYNC_REPLICAS",
    "GPUHUB_DOCKER_SOCKET",
    "GPUHUB_TLS_CERT_VERSION",
    "GPUHUB_TLS_KEY_VERSION",
    "GPUHUB_GITHUB_SECRET_VERSION",
    "GPUHUB_TUTORIAL_TOKEN_VERSION",
)


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def renamed(settings: Mapping[str, V], where: Callable[[str], str], warn=_warn) -> dict[str, V]:
    """``settings`` with each old name of RENAMED taken as its new name, unless the new name is
    set too; one warning line per old name, ``where(old)`` saying where it is set."""
    out = dict(settings)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        place = where(old)
        value = out.pop(old)
        if new in out:
            warn(
                f"{place}: {old} is the old name of {new}, which is set too and wins; remove {old}"
            )
        else:
            out[new] = value
            warn(f"{place}: {old} was renamed; write {new} instead")
    return out


def filled_by_deploy(config: dict[str, tuple[str, int]], source: str) -> list[str]:
    """A line for each key of the config file that the deploy steps fill in themselves."""
    return [
        f"{source} line {number}: {key} is filled in while deploying, not by the config file; "
        "remove the line"
        for key, (_, number) in config.items()
        if key in FILLED_BY_DEPLOY
    ]


# ---- merging ------------------------------------------------------------------------------


@dataclass
class Settings:
    """The effective settings, and where each came from (for error messages)."""

    values: dict[str, str]
    origin: dict[str, str]  # "the environment", "FILE line N" or "the default"


def merge(
    defaults: dict[str, tuple[str, int]],
    config: dict[str, tuple[str, int]],
    environ: dict[str, str],
    config_source: str = "",
    defaults_source: str = "deploy/settings.env",
) -> Settings:
    """The environment wins over the config file, which wins over the defaults. Defaults may
    refer to earlier settings as ``${GPUHUB_X}`` (their effective values); config file and
    environment values are taken literally."""
    values, origin = {}, {}
    for key, (template, number) in defaults.items():  # in the file's order
        if key in environ:
            values[key], origin[key] = environ[key], "the environment"
        elif key in config:
            value, line = config[key]
            values[key], origin[key] = value, f"{config_source} line {line}"
        else:
            later = [n for n in _REFERENCE.findall(template) if n not in values]
            if later:
                raise ConfigFileError(
                    [
                        f"{defaults_source} line {number}: {key} refers to {later[0]}, which "
                        "is not set above it; refer only to earlier settings"
                    ]
                )
            values[key] = _REFERENCE.sub(lambda m: values[m.group(1)], template)
            origin[key] = "the default"
    return Settings(values, origin)


#: The demo's defaults that a production hub (`make up`) must not inherit: {key: its value there}.
#: Simulated GPUs on the manager would be offered to participants as if they were real.
PRODUCTION_DEFAULTS = {"GPUHUB_SIMULATE_IF_NO_GPU": "0"}


def production_defaults(settings: Settings) -> Settings:
    """``make up``'s values for the settings left at a default meant for the demo; a value the
    config file or the environment sets is kept."""
    values, origin = dict(settings.values), dict(settings.origin)
    for key, value in PRODUCTION_DEFAULTS.items():
        if origin.get(key) == "the default":
            values[key], origin[key] = value, "the default of make up"
    return Settings(values, origin)


def read_defaults(path: str) -> dict[str, tuple[str, int]]:
    """deploy/settings.env: the config file's format, plus ``${GPUHUB_X}`` references."""
    return parse_env(Path(path).read_bytes(), path, references=True)


# ---- limits: "auto" -----------------------------------------------------------------------

LIMIT_KEYS = ("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT")
# What a JupyterLab with a kernel needs to start and work; "auto" never goes below these.
MEM_FLOOR = GIB
PIDS_FLOOR = 1024
# Memory kept for the hub, the proxy, the Docker engine and the system.
MEM_RESERVE = 2 * GIB
# Tasks (processes and threads) per core of the machine: OpenMP, BLAS and PyTorch start a
# thread per core they see, whatever the CPU limit.
PIDS_PER_CPU = 64


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory: int  # bytes
    gpus: int  # NVIDIA GPUs the driver lists (0: none)


def this_machine() -> Machine:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpus_dir = Path("/proc/driver/nvidia/gpus")
    gpus = len(list(gpus_dir.iterdir())) if gpus_dir.is_dir() else 0
    return Machine(cpus, memory, gpus)


def servers_here(settings: dict[str, str], machine: Machine) -> int:
    """How many servers this machine runs at once when every slice it advertises is taken:
    its GPUs (or GPUHUB_SIMULATE_IF_NO_GPU simulated ones) times GPUHUB_SLICES_PER_GPU, over
    GPUHUB_SLICES_PER_SERVER; at least 1."""
    try:
        gpus = machine.gpus or int(settings.get("GPUHUB_SIMULATE_IF_NO_GPU", "0"))
        slices = gpus * int(settings.get("GPUHUB_SLICES_PER_GPU", "1"))
        return max(1, slices // max(1, int(settings.get("GPUHUB_SLICES_PER_SERVER", "1"))))
    except ValueError:  # reported by problems()
        return 1


def auto_limits(machine: Machine, servers: int) -> dict[str, str]:
    """Per-server limits that let ``servers`` servers share ``machine``: its memory (less
    MEM_RESERVE) divided among them, never below what a JupyterLab needs, and PIDS_PER_CPU tasks
    per core. No CPU quota: every server's container has Docker's default CPU weight, so servers
    share the cores equally while they compete and one alone uses them all (a quota of cores /
    servers made a start on an idle machine take twice as long and was no fairer under load:
    docs/benchmarks.md, "CPU limits"); the hub's and the proxy's weight stays above theirs
    (priority.py)."""
    servers = max(1, servers)
    memory = max(MEM_FLOOR, (machine.memory - MEM_RESERVE) // servers)
    pids = max(PIDS_FLOOR, PIDS_PER_CPU * machine.cpus)
    return {
        "GPUHUB_CPU_LIMIT": "",
        "GPUHUB_MEM_LIMIT": f"{memory // MIB}M",
        "GPUHUB_PIDS_LIMIT": str(pids),
    }


def resolve_auto(settings: Settings, machine: Machine) -> Settings:
    """``auto`` limits replaced by auto_limits for this machine (servers of `make demo` run
    here)."""
    if not any(settings.values.get(k) == AUTO for k in LIMIT_KEYS):
        return settings
    limits = auto_limits(machine, servers_here(settings.values, machine))
    values = dict(settings.values)
    for key in LIMIT_KEYS:
        if values.get(key) == AUTO:
            values[key] = limits[key]
    return Settings(values, settings.origin)


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


#: Every whole-number setting and the range the checks hold it to (``None``: no upper bound).
#: Config reads each as an ``int`` (CONVERTERS); a new one is declared here, once.
WHOLE_NUMBERS: dict[str, tuple[int, int | None]] = {
    "GPUHUB_HTTP_PORT": (1, 65535),
    "GPUHUB_HTTPS_PORT": (1, 65535),
    "GPUHUB_REGISTRY_PORT": (1, 65535),
    "GPUHUB_SLICES_PER_GPU": (1, MAX_SLICES_PER_GPU),
    "GPUHUB_SLICES_PER_SERVER": (1, MAX_SLICES_PER_GPU),
    "GPUHUB_SIMULATE_IF_NO_GPU": (0, 16),
    "GPUHUB_START_TIMEOUT": (10, None),
    "GPUHUB_POLL_INTERVAL": (1, None),
    "GPUHUB_DOCKER_API_THREADS": (1, 64),
    "GPUHUB_HUB_CPU_SHARES": (0, 262144),
    "GPUHUB_IDLE_TIMEOUT": (0, None),
    "GPUHUB_CULL_EVERY": (1, None),
    "GPUHUB_MAX_AGE": (0, None),
    "GPUHUB_TUTORIAL_POLL": (1, None),
    "GPUHUB_TUTORIAL_SYNC_REPLICAS": (0, 1),  # filled by the deploy
    "GPUHUB_GUARD_METRICS_PORT": (0, 65535),
    "GPUHUB_LINE_MAX_LENGTH": (0, None),
    "GPUHUB_LINE_MAX_WAIT": (0, None),
    "GPUHUB_CPU_ONLY_MAX": (0, None),
}


def _numbers(settings) -> list[str]:
    errors = []
    for key, (low, high) in WHOLE_NUMBERS.items():
        errors += _int(settings, key, low, high)
    if errors:
        return errors
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
    errors = _choice(settings, "GPUHUB_AUTH", AUTH_MODES)
    errors += _typed(settings, "GPUHUB_ADMIN_USERS")[1]
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
    orgs, wrong = _typed(settings, "GPUHUB_ALLOWED_ORGS")
    errors += wrong
    if not wrong and not orgs and not settings.get("GPUHUB_ROSTER"):
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
    if mode == "acme" and host and not _typed(settings, "GPUHUB_HOSTNAME")[1] and private:
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
    ``mode`` "up" (production) also needs a hostname and explicit limits."""
    errors = _numbers(settings) + _limits(settings, mode)
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
    errors += _choice(settings, "GPUHUB_PLACEMENT", ("spread", "pack"))
    errors += _choice(settings, "GPUHUB_SPAWNER", ("gpu", "stock-swarm"))
    if settings.get("GPUHUB_SPAWNER") == "stock-swarm" and not settings.get("GPUHUB_NAMED_SLOTS"):
        errors.append(
            "GPUHUB_SPAWNER is stock-swarm but GPUHUB_NAMED_SLOTS is empty; name the slot kind "
            "it reserves, e.g. GPUHUB_NAMED_SLOTS=NVIDIA-GPU"
        )
    errors += _choice(settings, "GPUHUB_FULL_GPU", ("admins", "all", "off"))
    errors += _choice(settings, "GPUHUB_WAITING_LINE", ("offer", "auto", "off"))
    errors += _choice(settings, "GPUHUB_CPU_ONLY", ("on", "off"))
    errors += _environments(settings.get("GPUHUB_ENVIRONMENTS", ""))
    errors += _choice(settings, "GPUHUB_DATASETS_MODE", ("ro", "rw"))
    errors += _shared_folders(settings)
    errors += _guard(settings)
    for key in ("GPUHUB_METRICS_INTERVAL", "GPUHUB_METRICS_RETENTION"):
        if not _DURATION.match(settings.get(key, "")):
            errors.append(
                f"{key} is {settings.get(key, '')!r}; write a duration such as 15s, 30m, 12h or 4d"
            )
    try:  # the sync service's own reader
        parse_repos(settings.get("GPUHUB_TUTORIAL_REPOS", ""))
    except ReposError as e:
        errors += [f"GPUHUB_TUTORIAL_REPOS: {problem}" for problem in e.problems]
    return errors


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


def _number(value: str) -> float:
    """A number as GuardSettings.parse reads it (a percentage may end in %)."""
    return float(value.strip().rstrip("%"))


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


# ---- files named by the settings ------------------------------------------------------------

#: Settings naming a file on this machine, which the deploy reads.
FILE_KEYS = (
    "GPUHUB_ROSTER",
    "GPUHUB_GITHUB_CLIENT_SECRET_FILE",
    "GPUHUB_TLS_CERT",
    "GPUHUB_TLS_KEY",
)


def resolve_paths(
    settings: Settings, config_path: str, cwd: str
) -> tuple[Settings, dict[str, str]]:
    """FILE_KEYS as absolute paths: a relative one set in the config file is taken from the
    config file's folder (where the organizer keeps the files it names), one from the
    environment from ``cwd``. Returns the settings and, for each key made absolute, a note
    saying what it was relative to (for the messages about it)."""
    values, notes = dict(settings.values), {}
    folder = str(Path(config_path).resolve().parent) if config_path else ""
    for key in FILE_KEYS:
        value = values.get(key, "")
        if not value or os.path.isabs(value):
            continue
        from_file = settings.origin.get(key, "").startswith(f"{config_path} line")
        base = folder if from_file and folder else cwd
        values[key] = os.path.normpath(os.path.join(base, value))
        notes[key] = (
            f"{value!r} is relative to "
            + ("the config file's folder " if from_file and folder else "the current folder ")
            + base
        )
    return Settings(values, settings.origin), notes


def read_secret_file(path: str) -> str:
    """The secret held by a file (GPUHUB_GITHUB_CLIENT_SECRET_FILE), as the deploy gives it to
    the hub: without a UTF-8 byte order mark and blanks or line ends around it. ValueError
    saying what to do for a file that holds no single secret; OSError if it cannot be read."""
    data = Path(path).read_bytes()
    if data.startswith(_UTF16_BOMS) or b"\0" in data:
        raise ValueError(
            "is saved as UTF-16 (PowerShell's >, Notepad's Unicode); write it again as plain "
            "text: Set-Content -Encoding ascii, or Notepad's Save as with Encoding UTF-8"
        )
    try:
        text = data.removeprefix(_BOM).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text; write the secret into it as plain text") from None
    if not text:
        raise ValueError("is empty; write the OAuth app's client secret into it")
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        raise ValueError(
            "holds blanks, more than one line or invisible characters; keep only the client "
            "secret in it"
        )
    return text


def secret_file_problems(settings: dict[str, str]) -> list[str]:
    """A line for each secret file that its group or others may read: a GPUHUB_*SECRET*_FILE,
    which must also hold no more than the secret, and the TLS private key (GPUHUB_TLS_KEY with
    GPUHUB_TLS=files; its certificate is public)."""
    out = []
    for key, path in settings.items():
        secret = key.endswith("_FILE") and "SECRET" in key
        tls_key = key == "GPUHUB_TLS_KEY" and settings.get("GPUHUB_TLS") == "files"
        if not (path and (secret or tls_key)):
            continue
        try:
            found = os.stat(path)
            mode = found.st_mode
            if not stat.S_ISREG(mode):
                held = "the secret" if secret else "the private key"
                out.append(f"{key}: {path} is not a file; name the file holding {held}")
                continue
            if secret:
                read_secret_file(path)
        except OSError:
            continue  # "does not exist" is said by problems()
        except ValueError as e:
            out.append(f"{key}: {path} {e}")
            continue
        bits = open_to_others(path, mode)
        group = _group_name(found.st_gid)
        if tls_key and group in KEY_GROUPS:
            bits &= ~stat.S_IRWXG  # a group made for reading private keys
        if bits:
            who = "others" if bits & stat.S_IRWXO else f"its group {group}"
            out.append(
                f"{key}: {path} may be read by {who} (mode {stat.S_IMODE(mode):04o}); "
                f"run: chmod 600 {path}"
            )
    return out


#: Groups made for reading private keys: Debian's and Ubuntu's ssl-cert (/etc/ssl/private is
#: 0710 root:ssl-cert, its keys 0640, as ssl-cert-snakeoil.key): a TLS key its members may read
#: is accepted (others still may not)
KEY_GROUPS = ("ssl-cert",)


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _folder_mode(folder: Path) -> int | None:
    try:
        return folder.stat().st_mode
    except OSError:
        return None


def open_to_others(path: str, mode: int) -> int:
    """The group and others bits of a file of ``mode`` at ``path`` that its folders let
    through: a group's bits count only where every folder above the file (links followed) lets
    the group in, others' likewise. 0: only its owner can reach it; so is a key of mode 0644
    in a folder of mode 0700 (an older certbot's ``/etc/letsencrypt/archive/``)."""
    bits = mode & (stat.S_IRWXG | stat.S_IRWXO)
    folder = Path(os.path.realpath(path)).parent
    for above in (folder, *folder.parents):
        folder_mode = _folder_mode(above)
        if folder_mode is None:
            continue
        if not folder_mode & stat.S_IXGRP:
            bits &= ~stat.S_IRWXG
        if not folder_mode & stat.S_IXOTH:
            bits &= ~stat.S_IRWXO
    return bits


def _noted(errors: list[str], settings: Settings, notes: dict[str, str]) -> list[str]:
    """Each line about a file named by a relative path says what the path is relative to."""
    out = []
    for line in errors:
        for key, note in notes.items():
            if key in line and settings.values[key] in line:
                line = f"{line} ({note})"
        out.append(line)
    return out


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


#: How each setting that is not a plain string is read (every other key of settings.env is a
#: ``str``). A value that does not convert is a SettingsError naming the key, where it was set
#: and what to write; ``problems`` checks these keys with the same functions.
CONVERTERS: dict[str, Callable[[str], object]] = {
    **dict.fromkeys(WHOLE_NUMBERS, _whole_number),
    **dict.fromkeys(GUARD_KEYS[1:], _number),  # the guard's numbers
    "GPUHUB_SIMULATED_GPUS": _flag,
    "GPUHUB_CPU_ONLY": _on,
    "GPUHUB_ADMIN_USERS": typed.usernames,
    "GPUHUB_ALLOWED_ORGS": typed.organizations,
    "GPUHUB_HOSTNAME": typed.hostname,
    "GPUHUB_CPU_LIMIT": typed.cores,
    "GPUHUB_MEM_LIMIT": typed.memory,
    "GPUHUB_PIDS_LIMIT": typed.tasks,
    "GPUHUB_TUTORIAL_REPOS": parse_repos,  # [Repo]: the sync service's reader, once
    "GPUHUB_ENVIRONMENTS": environments,
}

#: The one written form of each value that has more than one: what Config keeps in ``values``,
#: so that the stack hands the hub (whose ``from_environment`` reads it back with CONVERTERS)
#: the value that was checked, not the organizer's spelling of it.
WRITTEN: dict[str, Callable[[object], str]] = {
    "GPUHUB_ADMIN_USERS": typed.names_written,
    "GPUHUB_ALLOWED_ORGS": typed.names_written,
    "GPUHUB_HOSTNAME": str,
    "GPUHUB_CPU_LIMIT": typed.cores_written,
    "GPUHUB_MEM_LIMIT": typed.memory_written,
    "GPUHUB_PIDS_LIMIT": lambda n: "" if n is None else str(n),
}


@dataclass(frozen=True, repr=False)
class Config:
    """Every setting, read once: ``values`` (GPUHUB_X -> the string the stack files
    interpolate, in its one written form: WRITTEN), ``origin`` (where each came from, for
    messages) and one typed attribute per key of deploy/settings.env, named after it without
    GPUHUB_, in lower case (``cfg.slices_per_server``, ``cfg.environments``). Built by ``read`` or
    ``from_environment``; ``with_values`` gives a changed copy (never change ``values``)."""

    values: dict[str, str]
    origin: dict[str, str] = field(default_factory=dict)
    config_file: str = ""  # "" when none

    # in deploy/settings.env's order; tests/unit/test_settings.py holds the two lists together
    stack: str = field(init=False)
    http_port: int = field(init=False)
    network: str = field(init=False)
    network_subnet: str = field(init=False)
    base_image: str = field(init=False)
    hub_image: str = field(init=False)
    singleuser_image: str = field(init=False)
    slices_per_gpu: int = field(init=False)
    simulate_if_no_gpu: int = field(init=False)
    named_slots: str = field(init=False)
    spawner: str = field(init=False)
    start_timeout: int = field(init=False)
    docker_api_threads: int = field(init=False)
    hub_cpu_shares: int = field(init=False)
    slices_per_server: int = field(init=False)
    placement: str = field(init=False)
    poll_interval: int = field(init=False)
    admin_users: list[str] = field(init=False)
    auth: str = field(init=False)
    github_client_id: str = field(init=False)
    github_client_secret: str = field(init=False)
    github_client_secret_file: str = field(init=False)
    github_url: str = field(init=False)
    allowed_orgs: list[str] = field(init=False)
    roster: str = field(init=False)
    hostname: str = field(init=False)
    tls: str = field(init=False)
    tls_cert: str = field(init=False)
    tls_key: str = field(init=False)
    acme_email: str = field(init=False)
    https_port: int = field(init=False)
    registry_port: int = field(init=False)
    environments: dict[str, str] = field(init=False)
    full_gpu: str = field(init=False)
    waiting_line: str = field(init=False)
    line_max_length: int = field(init=False)
    line_max_wait: int = field(init=False)
    cpu_only: bool = field(init=False)
    cpu_only_max: int = field(init=False)
    cpu_limit: float | None = field(init=False)  # cores; None: no limit
    mem_limit: int | None = field(init=False)  # bytes; None: no limit
    pids_limit: int | None = field(init=False)  # tasks; 0 or None: no limit
    log_level: str = field(init=False)
    state_dir: str = field(init=False)
    tutorial_repos: list[Repo] = field(init=False)
    tutorial_token_file: str = field(init=False)
    tutorial_poll: int = field(init=False)
    tutorials_dir: str = field(init=False)
    datasets_dir: str = field(init=False)
    datasets_mode: str = field(init=False)
    homes_dir: str = field(init=False)
    idle_timeout: int = field(init=False)
    cull_every: int = field(init=False)
    max_age: int = field(init=False)
    guard_mode: str = field(init=False)
    guard_warn_percent: float = field(init=False)
    guard_stop_percent: float = field(init=False)
    guard_grace_seconds: float = field(init=False)
    guard_metrics_port: int = field(init=False)
    metrics_interval: str = field(init=False)
    metrics_retention: str = field(init=False)
    # filled in while deploying (FILLED_BY_DEPLOY)
    public_url: str = field(init=False)
    simulated_gpus: bool = field(init=False)
    roster_file: str = field(init=False)
    hub_image_id: str = field(init=False)
    singleuser_image_id: str = field(init=False)
    tutorial_sync_replicas: int = field(init=False)
    docker_socket: str = field(init=False)
    tls_cert_version: str = field(init=False)
    tls_key_version: str = field(init=False)
    github_secret_version: str = field(init=False)
    tutorial_token_version: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "values", dict(self.values))
        object.__setattr__(self, "origin", dict(self.origin))
        problems = []
        for attribute in typed_attributes():
            key = key_of(attribute)
            if key not in self.values:
                problems.append(f"{key} is not set; deploy/settings.env lists every setting")
                continue
            value = self.values[key]
            where = self.origin.get(key, "the settings")
            try:
                converted = CONVERTERS.get(key, str)(value)
            except typed.Entries as e:  # redact: a URL's credentials stay out of every line
                problems += [redact(f"{where}: {key}: {line}") for line in e.lines]
                continue
            except ValueError as e:
                problems.append(redact(f"{where}: {key} is {value!r}; {e}"))
                continue
            object.__setattr__(self, attribute, converted)
            if key in WRITTEN:
                self.values[key] = WRITTEN[key](converted)
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
        shown = {k: ("***" if "SECRET" in k and v else v) for k, v in self.values.items()}
        return f"Config(config_file={self.config_file!r}, values={shown!r})"


def typed_attributes() -> list[str]:
    """Config's attribute for each setting, in deploy/settings.env's order."""
    return [f.name for f in dataclasses.fields(Config) if not f.init]


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
