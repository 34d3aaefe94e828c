"""How the settings that are more than a word are read: each value as the hub and the spawner
take it, or a ValueError saying what to write instead.

deploy/settings.py checks a setting with the same function that makes the typed value the hub
and the spawner are given (``Config``), and hands that value on in one written form
(``written``): what the check accepts is exactly what is used, and nothing downstream parses
the organizer's text again. Pure and standard library only (the settings reader runs with the
system python3).

A function here raises ``ValueError(advice)`` for a value that is wrong as a whole (the caller
writes ``KEY is 'value'; advice``), and ``Entries(lines)`` for a list with wrong entries (one
line per entry, the caller writes ``KEY: line``).
"""

from __future__ import annotations

import ipaddress
import math
import re

from gpu_swarm_spawner.contract import GITHUB_ADDRESS, GITHUB_LOGIN, GITHUB_PROFILE, organization

GIB = 1024**3
MIB = 1024**2


class Entries(ValueError):
    """Entries of a list that cannot be used: one line each, saying which and what to write."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


# ---- limits per server ----------------------------------------------------------------------

#: Docker refuses to start a container with less than a hundredth of a core.
LEAST_CORES = 0.01
#: Less memory than this and a JupyterLab with a kernel does not start.
LEAST_MEMORY = 256 * MIB
#: Fewer tasks (processes and threads) than this and a JupyterLab with kernels does not start.
LEAST_TASKS = 256

_CORES = re.compile(r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")
# Docker's own forms (docker run --memory): 16G, 16g, 16GB, 16GiB, 16 G, 1.5G; powers of 1024.
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?) ?(?:([KMGTkmgt])[iI]?)?[bB]?$")
_UNITS = {"": 1, "K": 1024, "M": MIB, "G": GIB, "T": 1024**4}


def cores(value: str) -> float | None:
    """GPUHUB_CPU_LIMIT: CPU cores per server (``4``, ``0.5``); "" is no limit (None)."""
    if value == "":
        return None
    if _CORES.match(value):
        number = float(value)
        if number >= LEAST_CORES:
            return number
        raise ValueError(
            f"write at least {LEAST_CORES} (Docker's least), such as 0.5 or 4, or leave it empty "
            "for no limit"
        )
    if re.match(r"^[0-9]+m$", value):  # Kubernetes' millicores
        raise ValueError(f"write cores, not thousandths of one: {int(value[:-1]) / 1000:g}")
    if re.match(r"^[0-9]+,[0-9]+$", value):
        raise ValueError(f"write a decimal point: {value.replace(',', '.')}")
    raise ValueError(
        "write a number of cores with digits and a decimal point, such as 4 or 0.5 (no unit), "
        "or leave it empty for no limit"
    )


def memory(value: str) -> int | None:
    """GPUHUB_MEM_LIMIT: bytes per server from Docker's forms (``16G``, ``16g``, ``16GiB``,
    ``512M``, ``1.5G``; K, M, G, T are powers of 1024, a plain number is bytes); "" is no limit
    (None)."""
    if value == "":
        return None
    match = _SIZE.match(value)
    if not match:
        raise ValueError(
            "write a size with its unit, such as 16G or 512M (K, M, G, T: powers of 1024), or "
            "leave it empty for no limit"
        )
    number, unit = match.groups()
    size = int(float(number) * _UNITS[(unit or "").upper()])
    if size < LEAST_MEMORY:
        unit_hint = "" if unit else f"; a plain number is bytes: did you mean {number}G?"
        raise ValueError(
            f"that is {size} bytes, too little for a JupyterLab; write at least 256M{unit_hint}"
        )
    return size


def memory_written(size: int | None) -> str:
    """The one written form of a memory limit: the largest unit that holds it exactly (16G,
    1536M), else bytes; "" for none. ``memory`` reads it back to the same number."""
    if size is None:
        return ""
    for unit in ("T", "G", "M", "K"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def cores_written(number: float | None) -> str:
    """The one written form of a CPU limit (``4``, ``0.5``); "" for none."""
    if number is None:
        return ""
    assert math.isfinite(number)
    return f"{number:.9g}"  # Docker counts in billionths of a core


def tasks(value: str) -> int | None:
    """GPUHUB_PIDS_LIMIT: the most processes and threads per server; 0 is no limit, "" none."""
    if value == "":
        return None
    if re.match(r"^[0-9]+$", value) and (int(value) == 0 or int(value) >= LEAST_TASKS):
        return int(value)
    raise ValueError(
        "write the most processes and threads a server may run, at least 256 (a JupyterLab "
        "with kernels runs about 100), or 0 for no limit"
    )


# ---- lists of names -------------------------------------------------------------------------


def _split(value: str) -> list[str]:
    return [entry for entry in re.split(r"[,\s]+", value) if entry]


def usernames(value: str) -> list[str]:
    """GPUHUB_ADMIN_USERS: usernames separated by commas or blanks, as the hub matches logins:
    lower case (JupyterHub and GitHub ignore case), a leading ``@`` or a github.com profile
    address taken as the login it names; each once, in the order written."""
    found: list[str] = []
    wrong = []
    for entry in _split(value):
        profile = GITHUB_PROFILE.match(entry)
        name = (profile.group(1) if profile else entry.removeprefix("@")).lower()
        if not GITHUB_LOGIN.match(name):
            wrong.append(
                f"{entry!r} is not a username; write the GitHub login alone (letters, digits "
                "and hyphens, as in https://github.com/LOGIN), e.g. ada"
            )
        elif name not in found:
            found.append(name)
    if wrong:
        raise Entries(wrong)
    return found


def _org_entries(value: str) -> list[str]:
    """The entries of GPUHUB_ALLOWED_ORGS as written: separated by commas, or, in a value
    without commas, by blanks. A team named with blanks in it is kept as one entry (and
    refused): an ORG:TEAM followed by a blank and a word without ':' is a display name."""
    if "," in value:
        return [entry.strip() for entry in value.split(",") if entry.strip()]
    entries: list[str] = []
    for word in value.split():
        if entries and _names_a_team(entries[-1]) and "/" not in word and ":" not in word:
            entries[-1] += " " + word
        else:
            entries.append(word)
    return entries


def _names_a_team(entry: str) -> bool:
    """Whether ``entry`` is written ORG:TEAM (a web address's ``https:`` is no team's colon)."""
    return not GITHUB_ADDRESS.match(entry) and ":" in entry


def organizations(value: str) -> list[str]:
    """GPUHUB_ALLOWED_ORGS: GitHub organizations and teams, each as ``contract.organization``
    reads an entry (the authenticator checks its own with it too), separated by commas, or by
    blanks when no team is followed by a bare organization. In lower case (as GitHub matches
    them), each once, in the order written."""
    found: list[str] = []
    wrong = []
    for entry in _org_entries(value):
        try:
            name = organization(entry)
        except ValueError as error:
            blank = any(ch.isspace() for ch in entry)
            wrong.append(f"{error}; separate entries with commas" if blank else str(error))
            continue
        if name not in found:
            found.append(name)
    if wrong:
        raise Entries(wrong)
    return found


def names_written(names: list[str]) -> str:
    """The one written form of a list of names: separated by commas."""
    return ",".join(names)


# ---- the hub's public name ------------------------------------------------------------------

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# characters whose xn-- form differs between IDNA 2003 (Python's codec) and IDNA 2008 (browsers)
_DEVIATIONS = "\u00df\u03c2\u200c\u200d"


def _ascii_form(name: str) -> str | None:
    """The xn-- (ASCII) form of an internationalized name; None where Python cannot be sure of
    the one browsers use."""
    if any(ch in _DEVIATIONS for ch in name):
        return None
    try:
        return name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        return None


def hostname(value: str) -> str:
    """GPUHUB_HOSTNAME: a DNS name in lower case (as browsers send it) or an IP address in its
    short form (IPv6 without brackets); "" when empty. Refused with the form to write: a URL, a
    port, a final dot, an internationalized name (its xn-- form)."""
    if value == "":
        return ""
    if "://" in value or "/" in value:
        host = re.sub(r"^[a-z]+://", "", value, flags=re.IGNORECASE).split("/", 1)[0]
        raise ValueError(f"write the name alone, without scheme or path: {host}")
    bare = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        if "%" in bare:
            raise ValueError("an address with a zone (%) is local to one machine; write a DNS name")
        return address.compressed
    if re.match(r"^[^:]+:[0-9]*$", value):
        raise ValueError(
            "write the name alone; the port is GPUHUB_HTTPS_PORT (GPUHUB_HTTP_PORT with "
            f"GPUHUB_TLS=off): {value.split(':')[0]}"
        )
    if value.endswith("."):
        raise ValueError(
            f"write it without the final dot, {value.rstrip('.')}: browsers and GitHub's OAuth "
            "callback check take the name without it"
        )
    if not value.isascii():
        ascii_form = _ascii_form(value)
        if ascii_form is None:
            raise ValueError(
                "an internationalized name; write its ASCII (xn--) form as your DNS provider "
                "shows it"
            )
        raise ValueError(
            f"an internationalized name; write its ASCII form, {ascii_form} (browsers and "
            "certificates use it, and GitHub's OAuth app must have the same)"
        )
    name = value.lower()
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(
            "write a DNS name (letters, digits, hyphens and dots, such as hub.uni.example) or "
            "an IP address"
        )
    if all(label.isdigit() for label in labels):
        raise ValueError("not an IP address (each part 0 to 255, no leading zeros); write one")
    return name


def is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def url_host(host: str) -> str:
    """``host`` as it stands in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if is_ipv6(host) else host
