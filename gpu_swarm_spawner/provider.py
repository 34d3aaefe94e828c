"""The provider: the organizer's commands that resize the cloud's group of GPU machines, run with
a hard time limit, retried where that helps, and their failures read into what the organizer
and the line are told (docs/autoscaling.md). Standard library only, but for the Docker SDK's
client that a fleet image needs, imported only then (``fleet_provider_of``).

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

Where a command runs is the ``Runner``'s (``async runner(command, timeout, env) -> Ran``), chosen
once from the settings (``fleet_provider``; ``fleet_provider_of`` from the typed settings):

- ``run``, without GPUHUB_FLEET_IMAGE: ``/bin/sh -c`` inside the hub's own container, in a
  process group of its own, with no input (a tool that prompts gets end-of-file instead of
  hanging); past ``timeout`` seconds the whole group is killed and the call reported as
  ``HUNG``, and what a command leaves running in the background when it ends is killed with it.
  The test bed's way, and commands of the organizer's own that need no cloud tool.
- ``ContainerRunner``, with GPUHUB_FLEET_IMAGE (the cloud's own CLI image): a one-shot
  container of that image on the manager, made through the engine's API the hub already has:
  ``/bin/sh -c COMMAND`` on the host's network, so that the manager VM's own credentials (an
  instance profile, a service account, a managed identity, read from the cloud's metadata
  address) work with no key stored anywhere; only GPUHUB_FLEET_ENV's variables and
  GPUHUB_FLEET_MOUNTS' folders, never another volume nor the engine's socket; killed past
  ``timeout``, removed after, its output read from its logs.

What the command printed is read by ``classify`` into one of ``KINDS`` (a removal's also by
``not_in_group``: the cloud has no such machine, as when it took a spot machine back); each kind
says whether an immediate retry helps (``RETRIED``: a hang, an unknown failure) and how long the
hub waits before asking again (``backoff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .contract import STACK_LABEL
from .provider_settings import (  # the settings' readers, which deploy/settings.py checks with
    Mount,
    command_problems,
)

QUOTA = "quota exceeded"
NO_CAPACITY = "no capacity"
AUTH = "sign-in expired"
HUNG = "hung"
SETUP = "not set up"
UNKNOWN = "failed"
#: The remove command's only: the cloud has no such machine in the group (``not_in_group``).
NOT_IN_GROUP = "not in the group"
KINDS = (QUOTA, NO_CAPACITY, AUTH, SETUP, HUNG, UNKNOWN, NOT_IN_GROUP)
#: Failures worth trying again at once (a network blip, a command that stalled once); the
#: others need the cloud or the organizer to change something first.
RETRIED = frozenset({HUNG, UNKNOWN})

#: What the clouds' command-line tools print for each kind, as recorded in
#: tests/unit/providers/ (SOURCES.md says where each text comes from). Checked in this order.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE | re.MULTILINE))
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
        # the container runner's own: the image not on the manager, a mount the engine refused
        (SETUP, r"^the fleet's (image .* is not on the manager|command container was refused)"),
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
    SETUP: "the hub cannot run the provider's commands as GPUHUB_FLEET_IMAGE and "
    "GPUHUB_FLEET_MOUNTS say; do what the message says on the manager",
    HUNG: "the command did not finish in time and was stopped; check that it runs by hand",
    UNKNOWN: "the command failed; run it by hand to see why",
    NOT_IN_GROUP: "the cloud's group has no machine of that name: removed already, or the remove "
    "command names machines otherwise than the swarm's hostnames (docs/autoscaling.md, Machine "
    "names); if it still runs, remove it in the cloud's console",
}

#: What people in line read while the cloud says no, by kind ("" : nothing beyond their place).
FOR_THE_LINE = {
    QUOTA: "No more GPU machines can be added right now (the organizers have been told). ",
    NO_CAPACITY: "The cloud has no GPU machine free right now; the hub keeps asking. ",
    AUTH: "No more GPU machines can be added right now (the organizers have been told). ",
    SETUP: "No more GPU machines can be added right now (the organizers have been told). ",
    HUNG: "",
    UNKNOWN: "",
    NOT_IN_GROUP: "",
}

#: What the remove command prints when the group has no machine of that name (any more): the
#: cloud took it back (a spot machine) or it was removed already. ``{machine}`` is the name
#: asked for, so that only a line about that machine counts. As recorded in
#: tests/unit/providers/ (SOURCES.md).
NOT_IN_GROUP_PATTERNS = (
    # AWS: terminate-instance-in-auto-scaling-group's ValidationError
    r"No managed instance found for instance ID:? {machine}\b",
    # Google: the instance's resource, by its path, "was not found"
    r"The resource '[^'\n]*/instances/{machine}' was not found",
    # Azure: the recipe's own line (docs/providers/azure.env) when the scale set has no such VM
    r"no instance of the scale set has the computer name {machine}\b",
)


def not_in_group(output: str, machine: str) -> bool:
    """Whether the remove command's ``output`` says the cloud's group has no machine
    ``machine`` (``NOT_IN_GROUP_PATTERNS``)."""
    name = re.escape(machine)
    return any(
        re.search(pattern.replace("{machine}", name), output, re.IGNORECASE)
        for pattern in NOT_IN_GROUP_PATTERNS
    )


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
    sign-in or the runner's set-up needs a person, so every 10 or 5 minutes (the organizer may
    have fixed it); a hang
    or an unknown failure 30 s, doubling up to 10 minutes."""
    n = max(failures, 1) - 1
    if kind == NO_CAPACITY:
        return min(60.0 * 2**n, 900.0)
    if kind == QUOTA:
        return 600.0
    if kind in (AUTH, SETUP):
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


#: Where a command runs: ``await runner(command, timeout, env)``, a ``Ran`` back (``run``, or a
#: ``ContainerRunner``).
Runner = Callable[[str, float, "Mapping[str, str] | None"], Awaitable[Ran]]


@dataclass(frozen=True)
class Commands:
    """The provider's commands (GPUHUB_FLEET_GROW_COMMAND, ..._REMOVE_COMMAND, ..._WHY_COMMAND,
    ..._COMMAND_TIMEOUT) and how they are run: ``Commands(cfg.fleet_grow_command,
    cfg.fleet_remove_command, cfg.fleet_why_command, timeout=cfg.fleet_command_timeout)``."""

    grow: str
    remove: str
    why: str = ""
    timeout: float = 120.0  # seconds one attempt may take
    attempts: int = 3  # tries of a call whose failure is RETRIED
    retry_delay: float = 2.0  # seconds before the second try; doubled before each next one

    def __post_init__(self):
        found = command_problems(self.grow, self.remove, self.timeout, self.attempts)
        if found:
            raise ValueError("; ".join(said for _, said in found))


# ---- where the commands run ------------------------------------------------------------------

#: The label of every container the container runner makes (``docker ps --filter label=...``).
COMMAND_LABEL = "gpu-jupyterhub.fleet-command"


async def _in_thread(executor, call: Callable, *args):
    return await asyncio.get_running_loop().run_in_executor(executor, call, *args)


@dataclass
class ContainerRunner:
    """Each command in a one-shot container of ``image`` on this engine (``client``: the Docker
    SDK's ``docker.DockerClient``, whose calls block, so they run in ``executor``'s threads;
    None: asyncio's default executor). A ``Runner``."""

    client: object
    image: str
    mounts: tuple[Mount, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)  # the stack's, besides COMMAND_LABEL
    executor: object = None

    async def __call__(self, command: str, timeout: float, env: Mapping[str, str] | None = None):
        return await _in_thread(self.executor, self.run, command, timeout, dict(env or {}))

    def run(self, command: str, timeout: float, env: dict[str, str]) -> Ran:
        """The container made, started, waited for at most ``timeout`` seconds (killed past
        it: ``status`` None), its logs read, and removed whatever happened. The image is
        never pulled here: one missing is said with the command that gets it."""
        from docker import errors
        from requests import exceptions

        started = time.monotonic()

        def ran(status: int | None, output: str) -> Ran:
            return Ran(status, output, time.monotonic() - started)

        try:
            container = self.client.containers.create(
                self.image,
                command=[command],
                entrypoint=["/bin/sh", "-c"],
                environment=env,
                network_mode="host",
                mounts=[
                    {
                        "Type": "bind",
                        "Source": m.host,
                        "Target": m.container,
                        "ReadOnly": m.read_only,
                    }
                    for m in self.mounts
                ],  # fmt: skip
                labels={**self.labels, COMMAND_LABEL: "1"},
                stdin_open=False,
                tty=False,
            )
        except errors.ImageNotFound:
            return ran(
                125,
                f"the fleet's image {self.image} is not on the manager: docker pull {self.image}\n",
            )
        except errors.APIError as e:
            return ran(125, f"the fleet's command container was refused: {_said(e)}\n")
        except (errors.DockerException, exceptions.RequestException) as e:
            return ran(125, f"the Docker engine did not make the fleet's command container: {e}\n")
        try:
            try:
                container.start()
            except errors.APIError as e:
                return ran(125, f"the fleet's command container was refused: {_said(e)}\n")
            status: int | None
            try:
                status = int(container.wait(timeout=timeout)["StatusCode"])
            except exceptions.RequestException:  # no answer within the time limit
                status = None
                with contextlib.suppress(errors.APIError):
                    container.kill()
            logs = container.logs(stdout=True, stderr=True)
            return ran(status, logs[-8192:].decode("utf-8", "replace"))
        finally:
            with contextlib.suppress(errors.DockerException, exceptions.RequestException):
                container.remove(force=True)


def _said(error) -> str:
    """What the engine said of an ``APIError``: its explanation, else its text."""
    return str(getattr(error, "explanation", "") or error)


class Provider:
    """The organizer's commands, run: ``await provider.grow(3)``, ``await
    provider.remove("gpu-2")``, ``await provider.why()``; each returns an ``Outcome`` and never
    raises for the command's failure."""

    def __init__(
        self,
        commands: Commands,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        runner: Runner = run,
    ):
        self.commands = commands
        self.env = dict(os.environ if env is None else env)
        self.sleep = sleep
        self.runner = runner

    async def grow(self, count: int) -> Outcome:
        if count < 0:
            raise ValueError(f"a group cannot have {count} machines")
        line = command_line(self.commands.grow, count=count)
        return await self._call(line, f"grow the group to {count}")

    async def remove(self, machine: str) -> Outcome:
        """``NOT_IN_GROUP`` when the cloud says it has no such machine (not tried again)."""
        line = command_line(self.commands.remove, machine=machine)
        return await self._call(line, f"remove {machine}", machine)

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

    async def _call(self, line: str, what: str, machine: str = "") -> Outcome:
        spent, attempt, delay = 0.0, 0, self.commands.retry_delay
        while True:
            attempt += 1
            ran = await self.runner(line, self.commands.timeout, self.env)
            spent += ran.seconds
            if ran.status == 0:
                return Outcome(True, "", 0, ran.output, spent, attempt, what)
            kind = HUNG if ran.status is None else classify(ran.output)
            if machine and kind == UNKNOWN and not_in_group(ran.output, machine):
                kind = NOT_IN_GROUP
            if kind not in RETRIED or attempt >= self.commands.attempts:
                return Outcome(False, kind, ran.status, ran.output, spent, attempt, what)
            await self.sleep(delay)
            spent += delay
            delay *= 2


def fleet_provider(
    commands: Commands,
    image: str = "",
    env: Mapping[str, str] | None = None,
    mounts: Iterable[Mount] = (),
    client: object = None,
    stack: str = "",
    executor: object = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> Provider:
    """The provider as the settings say, its runner chosen once: with ``image``
    (GPUHUB_FLEET_IMAGE) each command runs in a one-shot container of it through ``client``
    (``ContainerRunner``), seeing only ``env`` (GPUHUB_FLEET_ENV) and ``mounts``; without, by
    ``/bin/sh`` in the hub's own container (``run``), with the hub's environment and ``env``
    over it. ``stack``: GPUHUB_STACK, the stack label each container carries (``docker ps
    --filter label=gpu-jupyterhub.fleet-command`` lists them)."""
    env = dict(env or {})
    if not image:
        return Provider(commands, env={**os.environ, **env}, sleep=sleep)
    if client is None:
        raise ValueError("a fleet image needs the Docker client to run its containers with")
    labels = {STACK_LABEL: stack} if stack else {}
    runner = ContainerRunner(client, image, tuple(mounts), labels, executor)
    return Provider(commands, env=env, sleep=sleep, runner=runner)


def fleet_provider_of(cfg, docker_client: Callable[[], object] | None = None) -> Provider:
    """``fleet_provider`` as the typed settings say (``deploy.settings.Config``'s ``fleet_*``
    attributes and ``stack``; any object that has them), as ``capacity.fleet_settings_of`` makes
    the decision's settings: the one place the hub's config (at the hub's start) and the tests
    build the provider. Only a fleet image needs the Docker client: ``docker_client()`` makes it
    then (default: the Docker SDK's ``docker.from_env``, imported only then)."""
    commands = Commands(
        cfg.fleet_grow_command,
        cfg.fleet_remove_command,
        cfg.fleet_why_command,
        timeout=cfg.fleet_command_timeout,
    )
    client = None
    if cfg.fleet_image:
        if docker_client is None:
            import docker  # the hub's image has it; the commands' own runner needs none

            docker_client = docker.from_env
        client = docker_client()
    return fleet_provider(
        commands,
        image=cfg.fleet_image,
        env=cfg.fleet_env,
        mounts=cfg.fleet_mounts,
        client=client,
        stack=cfg.stack,
    )
