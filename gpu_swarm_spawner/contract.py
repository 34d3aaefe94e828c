"""What the GPU machines and the hub agree on: names, labels, the simulated-GPU marker and the
GPU guard's settings; and what the organizer's settings and the hub agree on: how an entry of
who may log in names a GitHub organization or team (``organization``).

The worker setup (``worker_setup/``, run on GPU machines with nothing but the standard library
and nvidia-ml-py) writes these into daemon.json; the spawner and ``make status`` read them back
from the Docker API. The organizer's settings (``deploy.settings``, which the hub reads too)
check the guard's settings with the rules the guard runs with. The one module both sides
import: the hub's image ships no worker code, the GPU machines none of the hub's packages.
Standard library only: keep it importable on a bare GPU machine (tests/unit/test_worker_venv.py
and tests/unit/test_import_arrows.py check that).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Generic-resource kinds that start with this are GPUs. NVIDIA GPU UUIDs look like
#: ``GPU-<hex groups>``.
KIND_PREFIX = "GPU-"
#: MIG instances (a hardware partition of a GPU in MIG mode) have UUIDs ``MIG-<hex groups>``
#: and are advertised as kinds of their own, in place of their GPU.
MIG_PREFIX = "MIG-"
#: Every kind prefix that names a GPU (or a MIG instance): what the spawner places on.
#: ``str.startswith`` takes the tuple as it is.
KIND_PREFIXES = (KIND_PREFIX, MIG_PREFIX)

#: The most slices one GPU (or MIG instance) is split into: the hub's limit on
#: GPUHUB_SLICES_PER_GPU (deploy/settings.py) and the join's on the slices it advertises
#: (worker_setup/slicing.py), so a GPU machine never advertises what the hub would refuse.
MAX_SLICES_PER_GPU = 64

#: Simulated GPUs (machines without an NVIDIA GPU: demo, tests) carry this after the prefix.
SIMULATED_MARKER = "simulated-"

#: Engine labels (``labels`` in daemon.json) the worker setup puts on a GPU machine. Engine
#: labels travel with the node's description, so they are set at join time without
#: ``docker node update`` (which Docker 20.10 refuses while GPU tasks run).
LABEL_PREFIX = "gpu-jupyterhub."
#: Total memory of one GPU, in MiB: ``gpu-jupyterhub.memory-mb.<uuid>=16384``.
MEMORY_LABEL = LABEL_PREFIX + "memory-mb."
#: The MIG profile of one MIG instance: ``gpu-jupyterhub.mig-profile.<MIG-uuid>=1g.10gb``.
MIG_PROFILE_LABEL = LABEL_PREFIX + "mig-profile."
#: A machine of the cloud's group, joined by its start-up script (``deploy/cloud_init.py``,
#: the join's ``--fleet-group``): ``gpu-jupyterhub.fleet=group``. The hub's fleet keeper
#: counts, grows and gives back only these; every other GPU machine is *fixed*, the organizer's.
FLEET_LABEL = LABEL_PREFIX + "fleet"
FLEET_GROUP = "group"

#: Spare units of each GPU (or MIG instance) kind a machine advertises beyond its slices, which
#: no server reserves. Swarm's constraint enforcer, each time a node is updated (the manager's
#: engine restarted, a machine reconnected, its availability or labels changed), walks the
#: node's tasks and rejects the one that holds the last free unit of a discrete generic
#: resource (it compares "at least as much as is left", where "more than" was meant:
#: swarmkit's constraintenforcer, Docker 20.10 to today), so a participant's server on a full
#: GPU was killed and started anew each time. With a spare unit no task holds the last one.
#: Swarm then admits one slice beyond a GPU's count, which the hub never asks for (its broker
#: holds each GPU to its slices); a machine so advertised carries SPARE_LABEL=<units>.
SWARM_SPARE = 1
SPARE_LABEL = LABEL_PREFIX + "swarm-spare"

#: Labels of a participant's service (and home volume): whose it is, which GPU, how many
#: slices, which stack created it. The service's container carries the first three too, with
#: the GPU memory budget: the GPU guard on the machine reads them there (a worker cannot read
#: services).
USER_LABEL = LABEL_PREFIX + "user"
GPU_LABEL = LABEL_PREFIX + "gpu"
SLICES_LABEL = LABEL_PREFIX + "slices"
STACK_LABEL = LABEL_PREFIX + "stack"
#: Labels Docker itself puts: ``docker stack deploy`` on everything of a stack (its name), and
#: Swarm on a task's container (its service's name).
DOCKER_STACK_LABEL = "com.docker.stack.namespace"
DOCKER_SERVICE_LABEL = "com.docker.swarm.service.name"
#: "1" on the service of a server started without a GPU (CPU only).
CPU_ONLY_LABEL = LABEL_PREFIX + "cpu-only"
#: The GPU memory budget of the container's slices, in MiB (GPU_MEMORY_LIMIT_MB in its
#: environment); absent when unknown.
BUDGET_LABEL = LABEL_PREFIX + "gpu-memory-limit-mb"

#: The disk budget of the participant's home and scratch space together, in MiB (the hub's
#: GPUHUB_DISK_BUDGET_GB), and the safety line of the file systems they write to, in percent
#: (GPUHUB_DISK_SAFETY_PERCENT), on every server's container: the disk watch of the machine
#: (images/singleuser/gpuhub_disk.py, which keeps its own copies of these names: it runs from
#: the single-user image, without this package) reads them there. Absent: no budget, no line.
DISK_BUDGET_LABEL = LABEL_PREFIX + "disk-budget-mb"
DISK_SAFETY_LABEL = LABEL_PREFIX + "disk-safety-percent"
#: Where each machine's disk watch answers ``GET /disk`` with its report (the hub's disk check,
#: gpu_swarm_spawner/disk.py, reads it): on the machine's own address, host network.
DISK_WATCH_PORT = 9446
#: The disk watch's container on every machine that runs servers (worker_setup/disk_watch.py).
DISK_WATCH = "gpuhub-disk"
#: GPUHUB_DISK_BUDGET_GB's largest value (a typo's extra zeros are refused, not taken as no
#: budget), and GPUHUB_DISK_SAFETY_PERCENT's range besides 0 (off): below 50 a machine's own
#: files alone could cross the line and stop servers for nothing; 100 would come too late.
DISK_BUDGET_MAX_GB = 100_000
DISK_SAFETY_RANGE = (50, 99)


def disk_budget_mib(gb: float) -> int:
    """DISK_BUDGET_LABEL's value for a budget of ``gb`` GiB (GPUHUB_DISK_BUDGET_GB counts in
    powers of 1024, as GPUHUB_MEM_LIMIT does): ``disk_budget_mib(2.5)`` is 2560."""
    return round(gb * 1024)


#: The file the manager writes into each folder on shared storage that servers mount (the
#: tutorials, the datasets, the homes): its first line is the stack's share id, which the join
#: line (``--shared-folder PATH=ID``) names, so that a GPU machine's join can tell the manager's
#: folder from an empty local one of the same name.
SHARE_MARKER = ".gpuhub-share"

#: Where participants' containers may not go: the private and shared ranges (a cloud's own
#: network, the machines' private addresses, a VPN), closed unless an organizer lists them
#: (gpu_swarm_spawner/egress.py) and closed to their engines' and Swarm's ports on every machine
#: (worker_setup/host_firewall.py); and link-local, where every cloud serves its instance
#: metadata (and the machine's credentials) at 169.254.169.254, closed always.
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
LINK_LOCAL = "169.254.0.0/16"

#: Participants' services are ``jy-<escaped user>[--<server>]``; homes ``jy-home-<user>``.
SERVICE_PREFIX = "jy"

#: The single-user image's default name (GPUHUB_SINGLEUSER_IMAGE's in deploy/settings.env): what
#: a GPU machine joins for when the join line names no other (``--image``)
SINGLEUSER_IMAGE = "gpu-jupyterhub/singleuser:latest"
HOME_VOLUME = SERVICE_PREFIX + "-home-{username}"


def is_mig(uuid: str) -> bool:
    """True when a kind (UUID) names a MIG instance: memory and compute isolated in hardware."""
    return uuid.startswith(MIG_PREFIX)


def is_simulated(uuid: str, kind_prefix: str = KIND_PREFIX) -> bool:
    """True when a GPU UUID names a simulated GPU rather than a real one."""
    return uuid.startswith(kind_prefix + SIMULATED_MARKER)


def kinds_in(
    generic_resources: list | None, kind_prefix: str | tuple[str, ...] = KIND_PREFIXES
) -> dict[str, int]:
    """The GPU (and MIG instance) kinds in an Engine API list of generic resources (a node's,
    a task's reservations, the engine's ``/info``), as ``{uuid: slices}``."""
    kinds: dict[str, int] = {}
    for res in generic_resources or []:
        spec = res.get("DiscreteResourceSpec")
        if spec and spec.get("Kind", "").startswith(kind_prefix):
            kinds[spec["Kind"]] = kinds.get(spec["Kind"], 0) + int(spec.get("Value", 0))
    return kinds


def advertised_slices(
    generic_resources: list | None,
    engine_labels: dict | list | None,
    kind_prefix: str | tuple[str, ...] = KIND_PREFIXES,
) -> dict[str, int]:
    """The slices of each GPU (and MIG instance) kind a node or engine advertises: its units
    (``kinds_in``) less the spare units its engine labels say it adds (SPARE_LABEL; none on a
    machine joined before the spare). ``engine_labels``: a node's (a dict) or the engine's
    ``/info`` (a list of ``key=value``)."""
    if isinstance(engine_labels, dict):
        spare_text = engine_labels.get(SPARE_LABEL, "")
    else:
        found = [x.split("=", 1)[1] for x in engine_labels or [] if x.startswith(SPARE_LABEL + "=")]
        spare_text = found[-1] if found else ""
    spare = int(spare_text) if spare_text.isdigit() else 0
    return {
        kind: units - spare
        for kind, units in kinds_in(generic_resources, kind_prefix).items()
        if units > spare
    }


def simulated_uuid(machine_id: str, index: int, kind_prefix: str = KIND_PREFIX) -> str:
    """The UUID given to simulated GPU number ``index`` of a machine.

    ``machine_id`` is any stable per-machine string; machines with different ids get different
    UUIDs, so simulated GPUs of several machines never share a generic-resource kind.
    """
    short = hashlib.sha256(machine_id.encode()).hexdigest()[:8]
    return f"{kind_prefix}{SIMULATED_MARKER}{short}-{index}"


def image_in_registry(registry: str, image: str) -> str:
    """An image's name in the registry at ``registry`` (HOST:PORT): the manager's registry
    (`make up`) serves the servers' images under its own address, and the GPU machines pull them
    by that name. A registry host already in ``image`` (``host.domain/...``) is replaced:
    ``image_in_registry("10.0.0.5:5000", "gpu-jupyterhub/singleuser:latest")`` is
    ``"10.0.0.5:5000/gpu-jupyterhub/singleuser:latest"``."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        image = rest
    return f"{registry}/{image}"


# ---- the GPU guard's settings ---------------------------------------------------------------
# The organizer's config file holds them (GPUHUB_GUARD_*): deploy.settings checks them with
# these rules, the join line passes them on, and each GPU machine's guard runs with them.

#: GPUHUB_GUARD_MODE's values.
GUARD_MODES = ("off", "warn", "enforce")
#: The settings GuardSettings reads (``parse``), in its fields' order.
GUARD_KEYS = (
    "GPUHUB_GUARD_MODE",
    "GPUHUB_GUARD_WARN_PERCENT",
    "GPUHUB_GUARD_STOP_PERCENT",
    "GPUHUB_GUARD_GRACE_SECONDS",
)
#: Where each GPU machine's guard serves its Prometheus metrics unless the join says otherwise
#: (``--guard-metrics-port``, from GPUHUB_GUARD_METRICS_PORT, whose default this is).
GUARD_METRICS_PORT = 9445


@dataclass(frozen=True)
class GuardSettings:
    """The GPU guard's settings (``worker_setup/guard_policy.py`` applies them), as the
    organizer writes them in the config file (``parse``); invalid values raise ``ValueError``
    naming the setting and what to write.

    ``GPUHUB_GUARD_MODE`` (``mode``), default ``warn``
        ``off`` (nothing is read or done), ``warn`` (participants over budget are warned,
        nothing is stopped) or ``enforce`` (warned, then stopped after the grace).
    ``GPUHUB_GUARD_WARN_PERCENT`` (``warn_percent``), default 100
        The warn line, in percent of the participant's budget, e.g. 100: warned as soon as
        they use more than their budget. Above 0.
    ``GPUHUB_GUARD_STOP_PERCENT`` (``stop_percent``), default 110
        The stop line, in percent of the budget; at least the warn percentage, e.g. 110: a
        participant at 105% is warned but never stopped.
    ``GPUHUB_GUARD_GRACE_SECONDS`` (``grace_seconds``), default 60
        Seconds between the first warning and the first stop, for the participant to free
        memory (``torch.cuda.empty_cache()``, restarting a kernel). 0 stops at once in
        ``enforce`` mode.
    """

    mode: str = "warn"
    warn_percent: float = 100.0
    stop_percent: float = 110.0
    grace_seconds: float = 60.0

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))

    def problems(self) -> list[str]:
        found = []
        if self.mode not in GUARD_MODES:
            found.append(
                f"GPUHUB_GUARD_MODE is {self.mode!r}; write one of: {', '.join(GUARD_MODES)}"
            )
        numbers = (("WARN_PERCENT", self.warn_percent), ("STOP_PERCENT", self.stop_percent),
                   ("GRACE_SECONDS", self.grace_seconds))  # fmt: skip
        bad = [name for name, value in numbers if not _is_number(value)]
        for name, value in numbers:
            if name in bad:
                found.append(f"GPUHUB_GUARD_{name} is {value!r}; write a number, e.g. 100")
        if "WARN_PERCENT" not in bad and self.warn_percent <= 0:
            found.append(
                f"GPUHUB_GUARD_WARN_PERCENT is {self.warn_percent:g}; write a percentage of the "
                "budget above 0, e.g. 100"
            )
        if not {"WARN_PERCENT", "STOP_PERCENT"} & set(bad) and (
            self.stop_percent < self.warn_percent
        ):
            found.append(
                f"GPUHUB_GUARD_STOP_PERCENT is {self.stop_percent:g}, below "
                f"GPUHUB_GUARD_WARN_PERCENT ({self.warn_percent:g}); write at least "
                f"{self.warn_percent:g}, e.g. {self.warn_percent * 1.1:g}"
            )
        if "GRACE_SECONDS" not in bad and self.grace_seconds < 0:
            found.append(
                f"GPUHUB_GUARD_GRACE_SECONDS is {self.grace_seconds:g}; write 0 or more "
                "seconds, e.g. 60"
            )
        return found

    @classmethod
    def parse(cls, values: Mapping[str, str]) -> GuardSettings:
        """From ``{"GPUHUB_GUARD_MODE": "enforce", ...}`` (missing ones: the defaults); every
        problem in one ``ValueError``."""
        kwargs: dict[str, str | float] = {}
        problems = []
        mode = values.get("GPUHUB_GUARD_MODE")
        if mode is not None:
            kwargs["mode"] = mode.strip().lower()
        for key in GUARD_KEYS[1:]:
            text = values.get(key)
            if text is None:
                continue
            try:
                kwargs[key.removeprefix("GPUHUB_GUARD_").lower()] = guard_number(key, text)
            except ValueError as error:
                problems.append(f"{key} is {text!r}; {error}")
        try:
            settings = cls(**kwargs)  # type: ignore[arg-type]
        except ValueError as error:
            problems.append(str(error))
            settings = None
        if problems:
            raise ValueError("; ".join(problems))
        return settings


def guard_number(key: str, text: str) -> float:
    """One of the guard's numbers as the organizer writes it (``GUARD_KEYS[1:]``; a percentage
    may end in %); ValueError saying what to write for anything else (inf and nan too)."""
    try:
        number = float(text.strip().rstrip("%" if key.endswith("_PERCENT") else ""))
    except ValueError:
        number = float("nan")
    if not _is_number(number):
        raise ValueError(f"write a number, e.g. {60 if key.endswith('_SECONDS') else 100}")
    return number


def _is_number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and value not in (float("inf"), float("-inf"))
    )


# ---- who may log in: GitHub's organizations and teams ----------------------------------------
# GPUHUB_ALLOWED_ORGS (deploy.values.organizations splits the setting into entries) and the
# authenticator's allowed_organizations (its @validate) read each entry with ``organization``.

#: GitHub's logins (and organizations' names): letters, digits and hyphens, at most 39, not
#: starting with a hyphen (older accounts may end in one or hold two in a row); lower case.
GITHUB_LOGIN = re.compile(r"^[a-z0-9][a-z0-9-]{0,38}$")
#: A profile's (or an organization's) address on github.com; group 1 the login.
GITHUB_PROFILE = re.compile(r"^(?:https?://)?(?:www\.)?github\.com/([^/?#\s]+)/?$", re.IGNORECASE)
#: Anything written as a web address (a scheme, or github.com/ at the start).
GITHUB_ADDRESS = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|(?:www\.)?github\.com/)", re.IGNORECASE)
# A team's slug: GitHub makes it from the team's name, lower case, other characters as '-'.
_SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# pages of github.com an organizer may copy from the browser: a team's page or one of its tabs
# (members, child teams, repositories), and the organization's own page under /orgs/ or its
# people tab
_TEAM_PAGE = re.compile(
    r"^(?:https?://)?(?:www\.)?github\.com/orgs/([^/\s]+)/teams/([^/?#\s]+)"
    r"(?:/(?:members|teams|repositories))?/?(?:[?#]\S*)?$",
    re.IGNORECASE,
)
_ORG_PAGE = re.compile(
    r"^(?:https?://)?(?:www\.)?github\.com/orgs/([^/?#\s]+)(?:/people)?/?(?:[?#]\S*)?$",
    re.IGNORECASE,
)


def organization(entry: str) -> str:
    """One entry of who may log in as GitHub names it: ``ORG`` or ``ORG:TEAM`` (the team's
    slug), in lower case (as GitHub matches them). GitHub's other ways of naming them are taken
    too: ``@ORG/TEAM``, ``ORG/TEAM``, the team's page https://github.com/orgs/ORG/teams/TEAM (or
    its members, teams or repositories tab), https://github.com/ORG and
    https://github.com/orgs/ORG (or its people tab). Anything else (a team's display name with
    blanks, another address) raises ValueError saying what was given and what to write."""
    if GITHUB_ADDRESS.match(entry) and not any(ch.isspace() for ch in entry):
        try:
            org, team = _page_of(entry)
        except ValueError as error:
            raise ValueError(f"{entry!r} is {error}") from None
    else:
        text = entry.removeprefix("@")
        org, sep, team = text.replace("/", ":", 1).partition(":")
        team = team if sep else None
    if entry.count(":") > 1 and not GITHUB_ADDRESS.match(entry):
        raise ValueError(f"{entry!r}: write ORG or ORG:TEAM, with one ':'")
    if any(ch.isspace() for ch in entry) and team is None:
        raise ValueError(
            f"{entry!r} holds a blank; write the organization as in https://github.com/ORG"
        )
    if any(ch.isspace() for ch in entry):
        slug = _slug(team)
        org = org.strip() or "ORG"
        raise ValueError(
            f"{entry!r} holds a blank: a team's display name? Write the team's slug, "
            f"{org}:{slug} (the end of the team's page address, "
            f"https://github.com/orgs/{org}/teams/{slug})"
        )
    if not GITHUB_LOGIN.match(org.lower()):
        raise ValueError(
            f"{entry!r}: {org!r} is not a GitHub organization; write ORG or ORG:TEAM, the "
            "organization as in https://github.com/ORG"
        )
    if team is not None and not _SLUG.match(team.lower()):
        raise ValueError(
            f"{entry!r}: {team!r} is not a team's slug; write {org}:{_slug(team)} (the end "
            f"of the team's page address, https://github.com/orgs/{org}/teams/SLUG)"
        )
    return org.lower() + (f":{team.lower()}" if team is not None else "")


def _slug(name: str) -> str:
    """The slug GitHub gives a team of this name: lower case, other characters as hyphens."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "SLUG"


def _page_of(entry: str) -> tuple[str, str | None]:
    """The organization and team (None for none) a github.com address names; ValueError with
    what to write for any other address."""
    team_page, org_page, profile = (
        pattern.match(entry) for pattern in (_TEAM_PAGE, _ORG_PAGE, GITHUB_PROFILE)
    )
    if team_page:
        return team_page.group(1), team_page.group(2)
    if org_page or profile:
        return (org_page or profile).group(1), None
    path = re.sub(r"^[a-z][a-z0-9+.-]*://", "", entry, flags=re.IGNORECASE)
    host, _, path = path.partition("/")
    if host.lower().removeprefix("www.") != "github.com":
        raise ValueError(
            "not on GitHub; write the GitHub organization, ORG as in https://github.com/ORG"
        )
    parts = [part.lower() for part in re.split(r"[/?#]", path) if part]
    (org,) = (parts[1:2] if parts[:1] == ["orgs"] else parts[:1]) or ["ORG"]
    raise ValueError(
        f"not the page of an organization or a team; write the organization, {org}, or one of "
        f"its teams as {org}:TEAM (TEAM: the end of the team's page address, "
        f"https://github.com/orgs/{org}/teams/TEAM)"
    )
