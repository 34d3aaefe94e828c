"""The provider: the organizer's commands that resize the cloud's group of GPU machines, run with
a hard time limit, retried where that helps, and their failures read into what the organizer
and the line are told. Not wired yet (docs/autoscaling.md); standard library only.

Every cloud keeps a group of identical machines and resizes it on request (AWS Auto Scaling
groups, Google Cloud managed instance groups, Azure VM scale sets); the hub only says how many
and which one may go. The provider is therefore two shell commands of the organizer's, with
an optional third (recipes for the three clouds' own tools in ``docs/providers/``):

- ``grow``: make the group ``{count}`` machines;
- ``remove``: take machine ``{machine}`` (its swarm hostname) out of the group, the group
  one smaller;
- ``why`` (optional): print the group's latest failure. AWS and Google accept a larger group
  at once and fail to *launch* later (out of capacity, out of quota), so their answer to a grow
  is "yes" and the reason a machine never came is only in the group's activity log, which this
  command prints; Azure's scale command waits and fails itself.

``{count}`` and ``{machine}`` are replaced in the command (a machine's name must be a plain
hostname or instance id, so nothing in it reaches the shell as code).

A command runs as ``/bin/sh -c`` in a process group of its own, with no input (a tool that
prompts gets end-of-file instead of hanging); past ``timeout`` seconds the whole group is killed
and the call reported as ``HUNG``, and what a command leaves running in the background when it
ends is killed with it. What the command printed is read by ``classify`` into one of
``KINDS``; each kind says whether an immediate retry helps (``RETRIED``: a hang, an unknown
failure) and how long the hub waits before asking again (``backoff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

QUOTA = "quota exceeded"
NO_CAPACITY = "no capacity"
AUTH = "sign-in expired"
HUNG = "hung"
UNKNOWN = "failed"
KINDS = (QUOTA, NO_CAPACITY, AUTH, HUNG, UNKNOWN)
#: Failures worth trying again at once (a network blip, a command that stalled once); the
#: others need the cloud or the organizer to change something first.
RETRIED = frozenset({HUNG, UNKNOWN})

#: What the clouds' command-line tools print for each kind, as recorded in
#: tests/unit/providers/ (SOURCES.md says where each text comes from). Checked in this order.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        # AWS: the CLI's "An error occurred (ExpiredToken) ..."; Google: gcloud's refresh and
        # reauthentication errors; Azure: Entra ID's AADSTS codes and "az login"
        (AUTH, r"\((ExpiredToken|ExpiredTokenException|RequestExpired)\)"),
        (AUTH, r"security token included in the request is expired|Unable to locate credentials"),
        (AUTH, r"problem (refreshing|reauthenticating)[^\n]*auth tokens|Reauthentication"),
        (AUTH, r"\bAADSTS\d+|Please run:?\s*\n?\s*az login|run 'az login'"),
        # Google: QUOTA_EXCEEDED, "Quota 'NVIDIA_T4_GPUS' exceeded"; Azure: "exceeding approved
        # ... quota", "exceeding quota limits"; AWS: the instance and vCPU limits
        (QUOTA, r"QUOTA_EXCEEDED|Quota '[^']+' exceeded|exceeding (approved )?[^\n]*quota"),
        (QUOTA, r"VcpuLimitExceeded|InstanceLimitExceeded|than your current (instance|vCPU) limit"),
        # Google: ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS), STOCKOUT; AWS:
        # InsufficientInstanceCapacity, no Spot capacity; Azure: SkuNotAvailable,
        # AllocationFailed, ZonalAllocationFailed
        (NO_CAPACITY, r"ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available"),
        (NO_CAPACITY, r"InsufficientInstanceCapacity|do not have sufficient \S+ capacity"),
        (NO_CAPACITY, r"no Spot capacity available"),
        (NO_CAPACITY, r"SkuNotAvailable|\b(Zonal)?AllocationFailed\b|Allocation failed"),
    )
)

#: What the organizer is told to do, by kind.
ADVICE = {
    QUOTA: "the cloud's quota for these machines is used up; ask the cloud for a higher quota "
    "(its console's quotas page) or lower the fleet's maximum of machines",
    NO_CAPACITY: "the cloud has no machine of this type free in the group's zone(s) right now; "
    "the hub asks again later (a group allowed more zones or machine types finds them sooner)",
    AUTH: "the provider command's sign-in has expired; sign in again where the hub runs it "
    "(aws sso login, gcloud auth login, az login) or give it a credential that does not expire",
    HUNG: "the command did not finish in time and was stopped; check that it runs by hand",
    UNKNOWN: "the command failed; run it by hand to see why",
}

#: What people in line read while the cloud says no, by kind ("" : nothing beyond their place).
FOR_THE_LINE = {
    QUOTA: "No more GPU machines can be added right now (the organizers have been told). ",
    NO_CAPACITY: "The cloud has no GPU machine free right now; the hub keeps asking. ",
    AUTH: "No more GPU machines can be added right now (the organizers have been told). ",
    HUNG: "",
    UNKNOWN: "",
}


def classify(output: str) -> str:
    """The kind of failure ``output`` (a command's stdout and stderr) tells of; ``UNKNOWN``
    when it matches none."""
    for kind, pattern in PATTERNS:
        if pattern.search(output):
            return kind
    return UNKNOWN


def backoff(kind: str, failures: int) -> float:
    """Seconds to wait before asking the cloud again after ``failures`` failures in a row of
    ``kind``: a stock-out often lasts minutes, so 1, 2, 4... up to 15 minutes; a quota or a
    sign-in needs a person, so every 10 or 5 minutes (the organizer may have fixed it); a hang
    or an unknown failure 30 s, doubling up to 10 minutes."""
    n = max(failures, 1) - 1
    if kind == NO_CAPACITY:
        return min(60.0 * 2**n, 900.0)
    if kind == QUOTA:
        return 600.0
    if kind == AUTH:
        return 300.0
    return min(30.0 * 2**n, 600.0)


@dataclass(frozen=True)
class Outcome:
    """How a provider call ended."""

    ok: bool
    kind: str  # "" when ok; else one of KINDS
    status: int | None  # the exit status of the last attempt; None when it hung
    output: str  # what the last attempt printed (its end)
    seconds: float  # all attempts together
    attempts: int
    what: str  # "grow the group to 3", "remove gpu-2", "why"

    def told(self) -> str:
        """The organizer's line on the dashboard: what failed, why, what to do."""
        if self.ok:
            return f"{self.what}: done"
        said = last_line(self.output)
        status = "no answer" if self.status is None else f"exit status {self.status}"
        tries = f" after {self.attempts} tries" if self.attempts > 1 else ""
        return (
            f"{self.what} failed{tries} ({self.kind}, {status}"
            f"{f': {said}' if said else ''}): {ADVICE[self.kind]}"
        )


def last_line(output: str, most: int = 300) -> str:
    """The last line of ``output`` that says something, cut to ``most`` characters."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:most] if lines else ""


#: A machine's name as the provider commands get it: a hostname or an instance id.
MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def command_line(template: str, count: int | None = None, machine: str = "") -> str:
    """``template`` with ``{count}`` and ``{machine}`` replaced (other braces, such as the
    shell's ``${GROUP}``, are left alone)."""
    if machine and not MACHINE_NAME.match(machine):
        raise ValueError(
            f"machine name {machine!r} is not a hostname or instance id; the provider's "
            "commands take only letters, digits, '.', '_' and '-'"
        )
    if count is not None:
        template = template.replace("{count}", str(int(count)))
    return template.replace("{machine}", machine)


@dataclass(frozen=True)
class Ran:
    """One run of a command."""

    status: int | None  # None: it hung and was killed
    output: str
    seconds: float


async def run(command: str, timeout: float, env: Mapping[str, str] | None = None) -> Ran:
    """``command`` by ``/bin/sh -c``, in a process group of its own, no input, stdout and
    stderr together into a file (a pipe would keep the call waiting for whatever the command
    left running); the group killed past ``timeout`` seconds, and when the command ends."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        status: int | None
        try:
            status = await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            status = None
        # nothing of the command outlives it: a hung one, and whatever it left in the background
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        size = out.seek(0, os.SEEK_END)
        out.seek(max(size - 8192, 0))
        output = out.read().decode("utf-8", "replace")
    return Ran(status, output, time.monotonic() - started)


@dataclass(frozen=True)
class Commands:
    """The provider's commands (proposed settings, docs/autoscaling.md) and how they are
    run."""

    grow: str
    remove: str
    why: str = ""
    timeout: float = 120.0  # seconds one attempt may take
    attempts: int = 3  # tries of a call whose failure is RETRIED
    retry_delay: float = 2.0  # seconds before the second try; doubled before each next one

    def __post_init__(self):
        if "{count}" not in self.grow:
            raise ValueError(
                "the grow command must say where the group's new size goes: {count}, e.g. "
                "aws autoscaling set-desired-capacity --auto-scaling-group-name NAME "
                "--desired-capacity {count}"
            )
        if "{machine}" not in self.remove:
            raise ValueError(
                "the remove command must say where the machine's name goes: {machine}, e.g. "
                "gcloud compute instance-groups managed delete-instances NAME --zone ZONE "
                "--instances {machine}"
            )
        if self.timeout <= 0 or self.attempts < 1:
            raise ValueError(
                f"a command needs a time limit above 0 s and at least 1 try, not "
                f"{self.timeout} s and {self.attempts}"
            )


class Provider:
    """The organizer's commands, run: ``await provider.grow(3)``, ``await
    provider.remove("gpu-2")``, ``await provider.why()``; each returns an ``Outcome`` and never
    raises for the command's failure."""

    def __init__(
        self,
        commands: Commands,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ):
        self.commands = commands
        self.env = dict(os.environ if env is None else env)
        self.sleep = sleep

    async def grow(self, count: int) -> Outcome:
        if count < 0:
            raise ValueError(f"a group cannot have {count} machines")
        line = command_line(self.commands.grow, count=count)
        return await self._call(line, f"grow the group to {count}")

    async def remove(self, machine: str) -> Outcome:
        line = command_line(self.commands.remove, machine=machine)
        return await self._call(line, f"remove {machine}")

    async def why(self) -> Outcome:
        """The group's latest failure as the cloud tells it: ``ok`` False with its kind when the
        printed text names one (the command itself succeeds in printing it); ``ok`` True when
        it names none, or when there is no ``why`` command."""
        if not self.commands.why:
            return Outcome(True, "", 0, "", 0.0, 0, "why")
        ran = await self._call(self.commands.why, "why")
        kind = classify(ran.output)
        if ran.ok and kind != UNKNOWN:
            return Outcome(False, kind, ran.status, ran.output, ran.seconds, ran.attempts, "why")
        return ran

    async def _call(self, line: str, what: str) -> Outcome:
        spent, attempt, delay = 0.0, 0, self.commands.retry_delay
        while True:
            attempt += 1
            ran = await run(line, self.commands.timeout, self.env)
            spent += ran.seconds
            if ran.status == 0:
                return Outcome(True, "", 0, ran.output, spent, attempt, what)
            kind = HUNG if ran.status is None else classify(ran.output)
            if kind not in RETRIED or attempt >= self.commands.attempts:
                return Outcome(False, kind, ran.status, ran.output, spent, attempt, what)
            await self.sleep(delay)
            spent += delay
            delay *= 2
