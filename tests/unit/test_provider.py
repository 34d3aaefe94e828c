"""The provider's commands (gpu_swarm_spawner/provider.py) run for real as small scripts in the
test's folder that print what the clouds' tools printed (tests/unit/providers/, SOURCES.md
says where each text comes from), hang, prompt, or exit non-zero: what each failure is read
as, which are retried, the hard time limit, and what the organizer is told."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_swarm_spawner import provider
from gpu_swarm_spawner.provider import (
    AUTH,
    HUNG,
    NO_CAPACITY,
    QUOTA,
    UNKNOWN,
    Commands,
    Provider,
    backoff,
    classify,
    command_line,
    last_line,
    run,
)

RECORDED = Path(__file__).parent / "providers"
#: Each recorded text, the kind it must be read as, and the exit status its tool gives (the
#: AWS CLI 254 for an error the service returned, gcloud and az 1).
CASES = [
    ("aws/insufficient-capacity.txt", NO_CAPACITY, 0),  # from the activity log: printed fine
    ("aws/spot-no-capacity.txt", NO_CAPACITY, 0),
    ("aws/instance-limit.txt", QUOTA, 0),
    ("aws/expired-token.txt", AUTH, 254),
    ("gcp/zone-exhausted.txt", NO_CAPACITY, 1),
    ("gcp/zone-exhausted-operation.txt", NO_CAPACITY, 0),
    ("gcp/quota.txt", QUOTA, 1),
    ("gcp/reauth.txt", AUTH, 1),
    ("azure/sku-not-available.txt", NO_CAPACITY, 1),
    ("azure/allocation-failed.txt", NO_CAPACITY, 1),
    ("azure/quota.txt", QUOTA, 1),
    ("azure/expired-login.txt", AUTH, 1),
]
#: What the remove command printed for a machine the group no longer has, and that machine.
NOT_THERE = [
    ("aws/instance-not-found.txt", "i-0abc123", 254),
    ("gcp/instance-not-found.txt", "gpu-workshop-x7k2", 1),
]


def test_every_recorded_text_is_a_case_and_has_its_source():
    files = sorted(str(p.relative_to(RECORDED)) for p in RECORDED.rglob("*.txt"))
    assert files == sorted([name for name, _, _ in CASES] + [name for name, _, _ in NOT_THERE])
    sources = (RECORDED / "SOURCES.md").read_text()
    assert all(f"`{name}`" in sources for name in files)


@pytest.mark.parametrize(("name", "kind", "status"), CASES)
def test_each_clouds_refusal_is_read_as_its_kind(name, kind, status):
    assert classify((RECORDED / name).read_text()) == kind


@pytest.mark.parametrize(("name", "machine", "status"), NOT_THERE)
async def test_a_removal_the_cloud_answers_with_no_such_machine_is_not_in_the_group(
    cli, name, machine, status
):
    tool, _ = cli
    sleeps = Sleeps()
    commands = Commands(grow="x {count}", remove=f"{tool} {RECORDED / name} {status} {{machine}}")
    outcome = await Provider(commands, env={}, sleep=sleeps).remove(machine)
    assert (outcome.ok, outcome.kind, outcome.attempts) == (False, provider.NOT_IN_GROUP, 1)
    assert sleeps.delays == []  # asking again changes nothing
    assert outcome.told().endswith(provider.ADVICE[provider.NOT_IN_GROUP])
    # the words are about that machine only; a grow's failure is never read so
    other = await Provider(commands, env={}, sleep=Sleeps()).remove("gpu-other")
    assert other.kind == UNKNOWN
    assert classify((RECORDED / name).read_text()) == UNKNOWN


def test_text_no_pattern_knows_is_unknown():
    assert classify("Error: something else went wrong\n") == UNKNOWN
    assert classify("") == UNKNOWN


class Sleeps:
    """The delays a provider waited between tries, without waiting them."""

    def __init__(self):
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def cli(tmp_path):
    """A stand-in for a cloud's tool: prints a file, records its arguments, exits with the
    status given."""
    log = tmp_path / "calls"
    body = f'echo "$*" >> {log}\ncat "$1"\nexit "$2"\n'
    return script(tmp_path, "cloud-cli", body), log


@pytest.mark.parametrize(("name", "kind", "status"), [c for c in CASES if c[2] != 0])
async def test_a_refused_grow_is_reported_with_its_kind_and_not_retried(cli, name, kind, status):
    tool, log = cli
    sleeps = Sleeps()
    commands = Commands(grow=f"{tool} {RECORDED / name} {status} {{count}}", remove="x {machine}")
    outcome = await Provider(commands, env={}, sleep=sleeps).grow(3)
    assert (outcome.ok, outcome.kind, outcome.status, outcome.attempts) == (
        False,
        kind,
        status,
        1,
    )
    assert sleeps.delays == []  # a quota, a stock-out or a sign-in is not fixed by asking again
    assert log.read_text().split()[-1] == "3"
    told = outcome.told()
    assert told.startswith(f"grow the group to 3 failed ({kind}, exit status {status}: ")
    assert told.endswith(provider.ADVICE[kind])


async def test_an_unknown_failure_is_tried_again_with_growing_delays(cli, tmp_path):
    tool, log = cli
    (tmp_path / "odd.txt").write_text("Error: something else went wrong\n")
    sleeps = Sleeps()
    commands = Commands(grow=f"{tool} {tmp_path}/odd.txt 2 {{count}}", remove="x {machine}")
    outcome = await Provider(commands, env={}, sleep=sleeps).grow(2)
    assert (outcome.ok, outcome.kind, outcome.attempts) == (False, UNKNOWN, 3)
    assert sleeps.delays == [2.0, 4.0]
    assert len(log.read_text().splitlines()) == 3
    assert outcome.told() == (
        "grow the group to 2 failed after 3 tries (failed, exit status 2: Error: something "
        "else went wrong): the command failed; run it by hand to see why"
    )


async def test_a_failure_then_success_ends_the_call(tmp_path):
    counter = tmp_path / "tries"
    flaky = script(
        tmp_path,
        "flaky",
        f'echo x >> {counter}\n[ "$(wc -l < {counter})" -ge 2 ] && exit 0\necho timeout; exit 1\n',
    )
    sleeps = Sleeps()
    outcome = await Provider(Commands(f"{flaky} {{count}}", "x {machine}"), sleep=sleeps).grow(1)
    assert (outcome.ok, outcome.kind, outcome.attempts, sleeps.delays) == (True, "", 2, [2.0])
    assert outcome.told() == "grow the group to 1: done"


async def test_a_remove_gets_the_machine_in_its_line(cli, tmp_path):
    tool, log = cli
    (tmp_path / "empty.txt").write_text("")
    commands = Commands(grow="x {count}", remove=f"{tool} {tmp_path}/empty.txt 0 {{machine}}")
    outcome = await Provider(commands, env={}).remove("gpu-2")
    assert (outcome.ok, outcome.what) == (True, "remove gpu-2")
    assert log.read_text().split()[-1] == "gpu-2"


@pytest.mark.parametrize("name", ["gpu-1; rm -rf /", "$(reboot)", "a b", "-rf", ""])
async def test_a_machine_name_that_is_not_a_plain_name_never_reaches_the_shell(name):
    commands = Commands(grow="true {count}", remove="echo {machine}")
    with pytest.raises(ValueError, match="is not a hostname or instance id"):
        await Provider(commands).remove(name or "~")
    with pytest.raises(ValueError, match="cannot have -1 machines"):
        await Provider(commands).grow(-1)


def test_only_the_providers_placeholders_are_replaced():
    line = command_line('az vmss scale -g "${GROUP}" -n {x} --new-capacity {count}', count=4)
    assert line == 'az vmss scale -g "${GROUP}" -n {x} --new-capacity 4'
    assert command_line("delete {machine} {machine}", machine="i-0abc") == "delete i-0abc i-0abc"


async def test_a_command_that_hangs_is_killed_with_its_children_and_reported(tmp_path):
    pids = tmp_path / "pids"
    hangs = script(tmp_path, "hangs", f"echo starting\nsleep 60 &\necho $! > {pids}\nsleep 60\n")
    sleeps = Sleeps()
    commands = Commands(f"{hangs} {{count}}", "x {machine}", timeout=0.5, attempts=2)
    started = time.monotonic()
    outcome = await Provider(commands, sleep=sleeps).grow(5)
    assert time.monotonic() - started < 10
    assert (outcome.ok, outcome.kind, outcome.status, outcome.attempts) == (False, HUNG, None, 2)
    assert outcome.output.strip() == "starting"
    assert outcome.told().startswith("grow the group to 5 failed after 2 tries (hung, no answer")
    child = int(pids.read_text())
    for _ in range(50):  # the background sleep was in the killed group
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"  # a zombie is dead


async def test_a_command_that_prompts_gets_no_input_instead_of_hanging(tmp_path):
    asks = script(tmp_path, "asks", 'printf "Do you want to continue (Y/n)? "\nread yes\nexit 3\n')
    keyboard, typing = os.pipe()  # the hub's own input: open, and nobody ever types
    saved = os.dup(0)
    os.dup2(keyboard, 0)
    try:
        ran = await run(asks, timeout=3)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, keyboard, typing):
            os.close(fd)
    assert ran.status == 3 and ran.seconds < 2
    assert ran.output == "Do you want to continue (Y/n)? "


async def test_what_a_command_leaves_running_is_ended_with_it(tmp_path):
    pids = tmp_path / "pids"
    leaves = script(tmp_path, "leaves", f"sleep 60 &\necho $! > {pids}\necho done\n")
    ran = await run(leaves, timeout=10)
    assert (ran.status, ran.output) == (0, "done\n")
    assert ran.seconds < 2  # not held until the background sleep ends
    child = int(pids.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child)


async def test_why_reads_the_groups_last_failure_from_what_it_prints(cli, tmp_path):
    tool, _ = cli
    recorded = RECORDED / "aws" / "insufficient-capacity.txt"
    commands = Commands("x {count}", "x {machine}", why=f"{tool} {recorded} 0")
    outcome = await Provider(commands, env={}).why()
    assert (outcome.ok, outcome.kind, outcome.status) == (False, NO_CAPACITY, 0)
    assert "no machine of this type free" in outcome.told()
    (tmp_path / "fine.txt").write_text("Successful\n")
    calm = Commands("x {count}", "x {machine}", why=f"{tool} {tmp_path}/fine.txt 0")
    assert (await Provider(calm, env={}).why()).ok
    assert (await Provider(Commands("x {count}", "x {machine}")).why()).ok


@pytest.mark.parametrize(
    ("grow", "remove", "said"),
    [
        ("aws autoscaling set-desired-capacity", "x {machine}", "must say where the group's"),
        ("x {count}", "gcloud ... delete-instances", "must say where the machine's name"),
    ],
)
def test_commands_without_their_placeholder_are_refused_with_an_example(grow, remove, said):
    with pytest.raises(ValueError, match=said):
        Commands(grow, remove)
    with pytest.raises(ValueError, match="at least 1 try"):
        Commands("x {count}", "x {machine}", attempts=0)


def test_the_hub_waits_longer_after_each_stock_out_and_steadily_after_a_quota():
    assert [backoff(NO_CAPACITY, n) for n in (1, 2, 3, 5, 9)] == [60, 120, 240, 900, 900]
    assert backoff(QUOTA, 1) == backoff(QUOTA, 7) == 600
    assert backoff(AUTH, 3) == 300
    assert [backoff(HUNG, n) for n in (0, 1, 2, 6)] == [30, 30, 60, 600]


def test_the_line_is_told_the_truth_when_no_machine_can_come():
    assert "no GPU machine free right now" in provider.FOR_THE_LINE[NO_CAPACITY]
    assert "organizers have been told" in provider.FOR_THE_LINE[QUOTA]
    assert set(provider.FOR_THE_LINE) == set(provider.ADVICE) == set(provider.KINDS)


def test_the_last_line_that_says_something():
    assert last_line("first\n\nsecond  \n \n") == "second"
    assert last_line("x" * 500) == "x" * 300
    assert last_line("") == ""


async def test_only_the_end_of_a_long_output_is_kept(tmp_path):
    chatty = script(tmp_path, "chatty", "head -c 20000 /dev/zero | tr '\\0' x\necho\necho LAST\n")
    ran = await run(chatty, timeout=10)
    assert len(ran.output) == 8192 and ran.output.endswith("x\nLAST\n")


# ---- the container runner: each command in a one-shot container of the fleet's image --------

IMAGE = "amazon/aws-cli"


@pytest.fixture
def engine():
    """The manager's engine (tests/unit/fake_engine.py) with the fleet's image pulled."""
    from .fake_engine import FakeDocker, FakeImage

    docker = FakeDocker()
    docker.tags[f"{IMAGE}:latest"] = FakeImage(docker, "sha256:" + "a" * 64)
    return docker


def runner(engine, **kwargs) -> provider.ContainerRunner:
    return provider.ContainerRunner(engine, IMAGE, **kwargs)


async def test_a_command_runs_in_a_one_shot_container_and_its_output_is_read(engine):
    ran = await runner(engine, labels={"gpu-jupyterhub.stack": "gpuhub"})(
        "echo grown; echo a warning >&2", 10, {}
    )
    assert (ran.status, ran.output) == (0, "grown\na warning\n")
    ((image, made),) = engine.creates
    assert image == IMAGE
    assert made["entrypoint"] == ["/bin/sh", "-c"]
    assert made["command"] == ["echo grown; echo a warning >&2"]
    assert made["network_mode"] == "host"  # the manager VM's credentials, from its metadata
    assert made["labels"] == {"gpu-jupyterhub.stack": "gpuhub", provider.COMMAND_LABEL: "1"}
    assert made["mounts"] == [] and "volumes" not in made  # nothing but the mounts given
    assert not made["stdin_open"] and not made["tty"]  # a prompt gets end-of-file
    assert engine.made == {}  # removed


async def test_a_non_zero_status_is_the_commands_and_the_container_is_removed(engine):
    ran = await runner(engine)("echo 'An error occurred (ExpiredToken)'; exit 254", 10, {})
    assert (ran.status, ran.output) == (254, "An error occurred (ExpiredToken)\n")
    assert classify(ran.output) == AUTH
    assert engine.made == {}


async def test_a_command_that_hangs_is_killed_reported_hung_and_removed(engine):
    commands = Commands("echo asking; sleep 30 # {count}", "x {machine}", timeout=0.5, attempts=1)
    started = time.monotonic()
    outcome = await Provider(commands, env={}, runner=runner(engine)).grow(3)
    assert time.monotonic() - started < 10
    assert (outcome.ok, outcome.kind, outcome.status) == (False, HUNG, None)
    assert outcome.output == "asking\n"  # what it said before it hung
    assert [c[0] for c in engine.changes] == [
        "create container",
        "start container",
        "kill container",
        "remove container",
    ]
    assert engine.made == {}


async def test_the_fleets_image_missing_is_said_with_the_command_that_gets_it(engine):
    engine.tags.clear()
    sleeps = Sleeps()
    commands = Commands("grow {count}", "x {machine}")
    outcome = await Provider(commands, env={}, sleep=sleeps, runner=runner(engine)).grow(3)
    assert (outcome.ok, outcome.kind, outcome.attempts) == (False, provider.SETUP, 1)
    assert sleeps.delays == []  # asking again at once would not pull it
    assert f"the fleet's image {IMAGE} is not on the manager: docker pull {IMAGE}" in (
        outcome.told()
    )
    assert not any(c[0] == "start container" for c in engine.changes)
    assert provider.backoff(provider.SETUP, 1) == 300.0
    assert provider.FOR_THE_LINE[provider.SETUP].startswith("No more GPU machines")


async def test_a_mount_the_engine_refuses_is_told_and_nothing_is_left(engine, tmp_path):
    missing = provider.Mount(str(tmp_path / "gone"), "/root/.aws", read_only=True)
    outcome = await Provider(
        Commands("grow {count}", "x {machine}"), env={}, runner=runner(engine, mounts=(missing,))
    ).grow(3)
    assert (outcome.ok, outcome.kind) == (False, provider.SETUP)
    assert "bind source path does not exist" in outcome.told() and engine.made == {}


async def test_a_container_the_engine_would_not_start_is_removed(engine):
    engine.start_fails[IMAGE] = "failed to create task: network host not found"
    ran = await runner(engine)("echo never", 10, {})
    assert ran.status == 125 and "network host not found" in ran.output
    assert classify(ran.output) == provider.SETUP
    assert engine.made == {}


async def test_the_container_gets_exactly_the_env_and_mounts_given(engine, tmp_path):
    (tmp_path / "aws").mkdir()
    mounts = (
        provider.Mount(str(tmp_path / "aws"), "/root/.aws", read_only=True),
        provider.Mount(str(tmp_path), "/work"),
    )
    env = {"GROUP": "gpu-workshop", "ZONE": "europe-west4-a"}
    ran = await runner(engine, mounts=mounts)(
        'echo "$GROUP in $ZONE"; echo "${JUPYTERHUB_API_TOKEN-none}"', 10, env
    )
    assert ran.output == "gpu-workshop in europe-west4-a\nnone\n"  # nothing of the hub's
    ((_, made),) = engine.creates
    assert made["environment"] == env
    assert made["mounts"] == [
        {"Type": "bind", "Source": str(tmp_path / "aws"), "Target": "/root/.aws", "ReadOnly": True},
        {"Type": "bind", "Source": str(tmp_path), "Target": "/work", "ReadOnly": False},
    ]


async def test_the_engines_blocking_calls_leave_the_hubs_loop_free(engine):
    ticks = 0

    async def ticking():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.02)

    ticker = asyncio.create_task(ticking())
    try:
        ran = await runner(engine)("sleep 0.5; echo done", 10, {})
    finally:
        ticker.cancel()
    assert ran.output == "done\n" and ticks >= 10


def test_the_runner_is_chosen_once_from_the_settings(engine, monkeypatch):
    monkeypatch.setenv("HUB_ONLY", "1")
    commands = Commands("grow {count}", "x {machine}")
    here = provider.fleet_provider(commands, env={"GROUP": "g"})
    assert here.runner is run and here.env["GROUP"] == "g" and here.env["HUB_ONLY"] == "1"
    assert Provider(commands).runner is run
    there = provider.fleet_provider(
        commands, image=IMAGE, env={"GROUP": "g"}, client=engine, stack="gpuhub"
    )
    assert isinstance(there.runner, provider.ContainerRunner)
    assert there.env == {"GROUP": "g"}  # the hub's environment stays in the hub
    assert there.runner.labels == {"gpu-jupyterhub.stack": "gpuhub"}
    with pytest.raises(ValueError, match="needs the Docker client"):
        provider.fleet_provider(commands, image=IMAGE)


def test_the_hubs_provider_is_made_from_the_typed_settings_and_asks_docker_only_for_an_image(
    engine, monkeypatch
):
    """provider.fleet_provider_of: what jupyterhub_config.py calls at the hub's start."""
    import types

    cfg = types.SimpleNamespace(
        fleet_grow_command="grow {count}",
        fleet_remove_command="remove {machine}",
        fleet_why_command="why",
        fleet_command_timeout=60.0,
        fleet_image="",
        fleet_env={"GROUP": "g"},
        fleet_mounts=(provider.Mount("/root/.aws", "/root/.aws", read_only=True),),
        stack="gpuhub",
    )
    monkeypatch.setenv("HUB_ONLY", "1")

    def no_docker():
        raise AssertionError("the hub's own container needs no Docker client")

    here = provider.fleet_provider_of(cfg, docker_client=no_docker)
    assert here.runner is run and here.env["GROUP"] == "g" and here.env["HUB_ONLY"] == "1"
    assert (here.commands.grow, here.commands.why, here.commands.timeout) == (
        "grow {count}", "why", 60.0)  # fmt: skip
    cfg.fleet_image = IMAGE
    clients = []
    there = provider.fleet_provider_of(cfg, docker_client=lambda: clients.append(1) or engine)
    assert clients == [1] and isinstance(there.runner, provider.ContainerRunner)
    assert (there.runner.client, there.runner.image) == (engine, IMAGE)
    assert there.runner.mounts == cfg.fleet_mounts and there.env == {"GROUP": "g"}
    assert there.runner.labels == {"gpu-jupyterhub.stack": "gpuhub"}
    # by default the Docker SDK's client of the environment (the hub's engine socket)
    monkeypatch.setitem(sys.modules, "docker", types.SimpleNamespace(from_env=lambda: engine))
    assert provider.fleet_provider_of(cfg).runner.client is engine


# ---- the recipes (docs/providers/) run against stand-ins of the clouds' tools -------------

RECIPES = Path(__file__).parents[2] / "docs" / "providers"
#: Stand-ins for aws, gcloud and az: each call is logged; the group's size is $FAKE_SIZE; a
#: resize prints $FAKE_REFUSAL and exits $FAKE_STATUS when set; the activity log or error list
#: prints $FAKE_WHY; Azure's instances are gpuvm000001 (id 1) and gpuvm000002 (id 2).
FAKES = {
    "aws": """case "$2" in
  describe-auto-scaling-groups) echo "$FAKE_SIZE" ;;
  set-desired-capacity) [ -z "$FAKE_REFUSAL" ] || { cat "$FAKE_REFUSAL"; exit "$FAKE_STATUS"; } ;;
  describe-scaling-activities) cat "$FAKE_WHY" ;;
esac
""",
    "gcloud": """case "$4" in
  describe) echo "$FAKE_SIZE" ;;
  resize) [ -z "$FAKE_REFUSAL" ] || { cat "$FAKE_REFUSAL" >&2; exit "$FAKE_STATUS"; } ;;
  list-errors) cat "$FAKE_WHY" ;;
esac
""",
    "az": """case "$2" in
  show) echo "$FAKE_SIZE" ;;
  scale) [ -z "$FAKE_REFUSAL" ] || { cat "$FAKE_REFUSAL" >&2; exit "$FAKE_STATUS"; } ;;
  list-instances) printf 'gpuvm000001\\t1\\ngpuvm000002\\t2\\n' ;;
esac
""",
}


def recipe(name: str):
    """A recipe read as the organizer's config file is, by the one reader of the settings, with
    every check of `make demo` (those of GPUHUB_FLEET=on among them): a recipe that drifts
    from the checks (a name that is no setting, a command without its {count}) is refused."""
    from deploy.limits import Machine
    from deploy.settings import read

    config = str(RECIPES / f"{name}.env")
    return read("demo", environ={}, config=config, machine=Machine(8, 2**35, 0))


def recipe_provider(name: str, tmp_path: Path, **fake: str) -> tuple[Provider, Path]:
    """The recipe's commands as the hub makes them from its settings, run here (no image: the
    clouds' tools are the stand-ins on PATH), with GPUHUB_FLEET_ENV's variables."""
    cfg = recipe(name)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir(exist_ok=True)
    for tool, body in FAKES.items():
        script(bin_dir, tool, f'echo "{tool} $*" >> {log}\n{body}')
    env = {
        **cfg.fleet_env,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SIZE": "2",
        "FAKE_REFUSAL": "",
        "FAKE_STATUS": "1",
        "FAKE_WHY": "/dev/null",
        **fake,
    }
    commands = Commands(
        cfg.fleet_grow_command,
        cfg.fleet_remove_command,
        cfg.fleet_why_command,
        timeout=cfg.fleet_command_timeout,
    )
    return Provider(commands, env=env, sleep=Sleeps()), log


def calls(log: Path) -> list[str]:
    """The clouds' tools' calls, but Azure's sign-in (``az login --identity``) before each."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if not line.startswith("az login")]


#: Each recipe's image (the cloud's own CLI) and the names its commands read from
#: GPUHUB_FLEET_ENV.
RECIPE_RUNS = {
    "aws": ("amazon/aws-cli", {"GROUP", "AWS_REGION"}),
    "gcp": ("gcr.io/google.com/cloudsdktool/google-cloud-cli:slim", {"GROUP", "ZONE"}),
    "azure": ("mcr.microsoft.com/azure-cli", {"GROUP", "RESOURCE_GROUP"}),
}


@pytest.mark.parametrize("name", sorted(RECIPE_RUNS))
def test_each_recipe_passes_the_checks_of_the_fleet_on_and_runs_in_its_clouds_image(name):
    cfg = recipe(name)
    image, names = RECIPE_RUNS[name]
    assert cfg.fleet is True and cfg.fleet_image == image
    assert set(cfg.fleet_env) == names and cfg.fleet_env["GROUP"] == "gpu-workshop"
    assert cfg.fleet_mounts == ()  # the VM's own credentials: nothing of the manager's disk
    for key in ("GROW", "REMOVE", "WHY"):
        line = command_line(cfg.values[f"GPUHUB_FLEET_{key}_COMMAND"], count=3, machine="gpu-1")
        checked = subprocess.run(["sh", "-n", "-c", line], capture_output=True, text=True)
        assert checked.returncode == 0, (key, checked.stderr)
        # every variable a command reads is GPUHUB_FLEET_ENV's or its own
        read_here = set(re.findall(r"\$\{?([A-Za-z_]+)", line))
        assert read_here <= names | {"now", "id", "name", "instance"}, (key, read_here)
    if name == "azure":  # a fresh container each time: signed in as the VM's identity first
        assert cfg.fleet_grow_command.startswith("az login --identity >/dev/null && ")
        assert cfg.fleet_remove_command.startswith("az login --identity >/dev/null && ")


@pytest.mark.parametrize(
    ("written", "drifted", "says"),
    [
        ("{count}", "3", "GPUHUB_FLEET_GROW_COMMAND: the grow command must say"),
        ("ZONE=europe-west4-a'", "'\nGPUHUB_FLEET_ZONE=a", "unknown setting GPUHUB_FLEET_ZONE"),
        ("GROUP=gpu-workshop", "GROUP gpu-workshop", "GPUHUB_FLEET_ENV is 'GROUP gpu-workshop"),
        ("_IMAGE=gcr.io", "_IMAGE=GCR.io/x y", "GPUHUB_FLEET_IMAGE is"),
    ],
)
def test_a_recipe_that_drifts_from_the_checks_is_refused(
    written, drifted, says, tmp_path, monkeypatch
):
    from deploy.envfile import SettingsError

    text = (RECIPES / "gcp.env").read_text()
    assert written in text
    (tmp_path / "gcp.env").write_text(text.replace(written, drifted))
    monkeypatch.setattr(sys.modules[__name__], "RECIPES", tmp_path)
    with pytest.raises(SettingsError) as refused:
        recipe("gcp")
    assert says in "\n".join(refused.value.problems)


GROWN = {
    "aws": "aws autoscaling set-desired-capacity --auto-scaling-group-name gpu-workshop "
    "--desired-capacity 3",
    "gcp": "gcloud compute instance-groups managed resize gpu-workshop --zone europe-west4-a "
    "--size 3 --quiet",
    "azure": "az vmss scale --resource-group workshop-rg --name gpu-workshop --new-capacity 3 "
    "--output none",
}


@pytest.mark.parametrize("name", sorted(GROWN))
async def test_a_recipes_grow_resizes_the_group_and_never_shrinks_it(name, tmp_path):
    grows, log = recipe_provider(name, tmp_path)
    assert (await grows.grow(3)).ok
    assert calls(log)[-1] == GROWN[name]
    log.unlink()
    for smaller in (2, 1):  # the group has 2: nothing but the look at its size
        assert (await grows.grow(smaller)).ok
    verb = {"aws": "set-desired-capacity", "gcp": " resize ", "azure": " scale "}[name]
    assert len(calls(log)) == 2 and not any(verb in call for call in calls(log))


REMOVED = {
    "aws": ("i-0abc123", "aws autoscaling terminate-instance-in-auto-scaling-group --instance-id "
            "i-0abc123 --should-decrement-desired-capacity"),
    "gcp": ("gpu-workshop-x7k2", "gcloud compute instance-groups managed delete-instances "
            "gpu-workshop --zone europe-west4-a --instances gpu-workshop-x7k2 --quiet"),
    "azure": ("gpuvm000002", "az vmss delete-instances --resource-group workshop-rg --name "
              "gpu-workshop --instance-ids 2 --output none"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REMOVED))
async def test_a_recipes_remove_takes_out_the_named_machine(name, tmp_path):
    machine, expected = REMOVED[name]
    removes, log = recipe_provider(name, tmp_path)
    outcome = await removes.remove(machine)
    assert outcome.ok, outcome.output
    assert calls(log)[-1] == expected


async def test_azures_remove_of_a_machine_it_does_not_have_says_so(tmp_path):
    removes, log = recipe_provider("azure", tmp_path)
    outcome = await removes.remove("gpuvm000009")
    assert (outcome.ok, outcome.kind, outcome.attempts) == (False, provider.NOT_IN_GROUP, 1)
    assert "no instance of the scale set has the computer name gpuvm000009" in outcome.told()
    assert not any("delete-instances" in c for c in calls(log))


REFUSED = [
    ("azure", "azure/quota.txt", "", QUOTA),
    ("azure", "azure/sku-not-available.txt", "", NO_CAPACITY),
    ("azure", "azure/expired-login.txt", "", AUTH),
    ("gcp", "gcp/reauth.txt", "", AUTH),
    ("aws", "aws/expired-token.txt", "", AUTH),
    # AWS and Google say yes to the size; why the machine never came is in the group's log
    ("aws", "", "aws/insufficient-capacity.txt", NO_CAPACITY),
    ("aws", "", "aws/instance-limit.txt", QUOTA),
    ("gcp", "", "gcp/zone-exhausted-operation.txt", NO_CAPACITY),
]


@pytest.mark.parametrize(("name", "refusal", "why", "kind"), REFUSED)
async def test_a_recipe_reports_the_clouds_recorded_refusals_as_their_kind(
    name, refusal, why, kind, tmp_path
):
    fake = {"FAKE_STATUS": "254" if name == "aws" else "1"}
    if refusal:
        fake["FAKE_REFUSAL"] = str(RECORDED / refusal)
    if why:
        fake["FAKE_WHY"] = str(RECORDED / why)
    grows, _ = recipe_provider(name, tmp_path, **fake)
    grown = await grows.grow(3)
    looked = await grows.why()
    if refusal:
        assert (grown.ok, grown.kind) == (False, kind)
        assert looked.ok  # nothing in the log
    else:
        assert grown.ok
        assert (looked.ok, looked.kind) == (False, kind)
