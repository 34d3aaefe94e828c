"""The settings files' format, and the three sources merged: deploy/settings.env (the
defaults), the organizer's config file and the environment. Part of the one reader of the
settings (deploy/settings.py, whose ``read`` and ``load`` use it).

``parse_env`` reads a file's bytes into ``{KEY: (value, line)}`` or refuses it with a line per
problem; ``merge`` lays the three sources over each other, keeping where each value came from.
Pure and standard library only.
"""

from __future__ import annotations

import difflib
import re
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from gpu_swarm_spawner.settings_table import SETTINGS

V = TypeVar("V")

_KEY = re.compile(r"^GPUHUB_[A-Z0-9_]+$")

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
    if typographic := typographic_quotes(value):
        _fail(f"{key}: {typographic}")
    if value[:1] in ("'", '"'):
        return key, _quoted(key, value)
    return key, _unquoted(key, value, references)


#: Quotes a word processor, a chat app or a web page puts where straight ones were typed.
_TYPOGRAPHIC = "\u201c\u201d\u201e\u201f\u2018\u2019\u201a\u201b\u00ab\u00bb\u2039\u203a"


def typographic_quotes(value: str) -> str:
    """What is wrong with a value that starts or ends with a typographic quote (taken as part
    of the value, a client secret pasted from a chat would then be refused by GitHub at every
    login); "" for any other value."""
    ends = [ch for ch in (value[:1], value[-1:]) if ch and ch in _TYPOGRAPHIC]
    if not ends:
        return ""
    return (
        f"the value is in typographic quotes ({ends[0]}...), which a word processor, chat app "
        'or web page put there; write it without quotes, or in straight ones ("...")'
    )


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


def meant(key: str, known: set[str]) -> str:
    """The setting an unknown name was most likely meant to be ("" when none is close): the one
    guess the config file's and the environment's checks both offer."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
    return close[0] if close else ""


def unknown_keys(config: dict[str, tuple[str, int]], known: set[str], source: str) -> list[str]:
    """A line for each key of the config file that is not a setting (a typo would otherwise
    silently leave the default in place)."""
    out = []
    for key, (_, number) in config.items():
        if key in known:
            continue
        close = meant(key, known)
        hint = f"; did you mean {close}?" if close else "; deploy/settings.env lists them all"
        out.append(f"{source} line {number}: unknown setting {key}{hint}")
    return out


#: Settings that were renamed, {old name: new name} (as dockerspawner's ``_deprecated_aliases``).
#: An old name in the environment or a config file is read as the new one, with a warning,
#: unless the new one is set there too.
RENAMED = {"GPUHUB_GPU_SLICES": "GPUHUB_SLICES_PER_SERVER"}

#: Keys of deploy/settings.env that the deploy steps fill in with what they find while deploying
#: (the public URL, image ids, secret versions, ...), for the stack files and the hub
#: (``by_deploy`` in the table). Their defaults are placeholders; a config file that sets one is
#: refused.
FILLED_BY_DEPLOY = tuple(s.name for s in SETTINGS if s.by_deploy)


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


#: GPUHUB_* variables that are not settings: what the project's own programs read from the
#: environment (the config file's path, the test bed's and the tests' own, the GPU machine's
#: join and guard, the hub's container, the single-user image). The environment's other
#: GPUHUB_* names are refused as unknown settings (``environment_problems``).
#: tests/unit/test_settings.py holds this list to the names the code reads.
NOT_SETTINGS = frozenset(
    {
        "GPUHUB_CONFIG",  # which config file (`make up CONFIG=FILE`)
        "GPUHUB_VENV",  # deploy/bootstrap.sh's virtual environment
        "GPUHUB_CRASH_LOG",  # tests/run.sh
        "GPUHUB_HERMETIC_RUN",  # tests/hermetic.sh
        "GPUHUB_IMAGE_TAR",  # make image-tar
        "GPUHUB_SCALE_MACHINES",  # make bench-scale
        "GPUHUB_DAEMON_JSON",  # the join: the engine's daemon.json
        "GPUHUB_ENGINE_WAIT",  # the join: how long the engine may take to start
        "GPUHUB_ENGINE_ADDR",
        "GPUHUB_ADVERTISE_ADDR",
        "GPUHUB_WORKER_PYTHON",
        "GPUHUB_GUARD_PIDFILE",  # the guard without systemd
        "GPUHUB_GUARD_LOG",
        "GPUHUB_DATA_DIR",  # inside the hub's container (deploy/stack.yml)
        "GPUHUB_SECRETS_DIR",
        "GPUHUB_DASHBOARD_DIR",
        "GPUHUB_PROMETHEUS_URL",
        "GPUHUB_METRICS_TOKEN_FILE",
        "GPUHUB_SERVICE_PREFIX",
        "GPUHUB_BEHIND_GATEWAY",
        "GPUHUB_FIREWALL",  # inside a server's or a machine's container
        "GPUHUB_FIREWALL_EVERY",
        "GPUHUB_HOST_RULES",
        "GPUHUB_HOST_HOOKS",
        "GPUHUB_NOTICES_FILE",  # the single-user image
        "GPUHUB_USAGE_FILE",
        "GPUHUB_ENVIRONMENT",  # an environment's image: its name
        "GPUHUB_CADDY_TLS",  # inside the HTTPS gateway's container (images/hub/Caddyfile)
        "GPUHUB_CADDY_EMAIL",
        "GPUHUB_HTTPS_SUFFIX",
    }
)
#: ...and whole families of them: the tests', the test bed's, its engines'.
NOT_SETTINGS_PREFIXES = ("GPUHUB_TEST_", "GPUHUB_BED_", "GPUHUB_DOCKERD_")


def environment_problems(environ: Mapping[str, str], known: set[str]) -> list[str]:
    """A line for each GPUHUB_* variable of the environment that is no setting (a misspelt
    export would otherwise be dropped in silence, its setting left at the file's value) and
    each setting the environment gives in typographic quotes."""
    out = []
    for key in sorted(environ):
        if not key.startswith("GPUHUB_"):
            continue
        if key in known:
            if typographic := typographic_quotes(environ[key]):
                out.append(f"the environment: {key}: {typographic}")
            continue
        if key in RENAMED or key in NOT_SETTINGS or key.startswith(NOT_SETTINGS_PREFIXES):
            continue
        close = meant(key, known)
        hint = f"did you mean {close}? " if close else ""
        out.append(
            f"the environment: unknown setting {key}; {hint}unset it (unset {key}), or put the "
            "setting in the config file (deploy/settings.env lists them all)"
        )
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
