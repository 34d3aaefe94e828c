"""Add this GPU machine to the hub's swarm, or take it out again.

Joining is a checklist of idempotent steps; a second run changes nothing and says so:

  checks       python3 and Linux, daemon.json is valid JSON, the token's form, the manager answers
  shared       each --shared-folder is there and the manager's (its marker holds the stack's
               share id), not an empty local folder of the same name
  engine       the Docker engine is installed (Debian's docker.io) and running
  gpus         GPUs found with NVML (or --simulate-gpus N), slices per GPU worked out
  swarm        joined to the manager's swarm (a wrong token stops here, before any change)
  image        the single-user image is present (already, from --image-tar, or pulled; with
               --registry: every image of the manager's registry, pulled)
  daemon.json  slices, gpu-jupyterhub.* engine labels, NVIDIA runtime merged in (backup kept);
               with --registry, the manager's registry as a plain-HTTP one; with
               --fleet-group, the mark of a machine of the cloud's group (gpu-jupyterhub.fleet)
  restart      the engine restarts only when daemon.json changed
  guard        the GPU guard runs with the --guard-* settings (worker_setup/guard.py), as a
               systemd unit or a process of its own; restarted only when they changed
  firewall     the machine's own rules for its containers kept by a container of the engine
               (host_firewall.py): no metadata address, no manager, nothing of this machine
  disk         the disk watch runs as a container of the engine (disk_watch.py): the servers'
               homes and writable layers measured, the hub's report on port 9446

With --registry (`make up` runs one on the manager) the images are pulled after the restart that
makes the engine trust it. --leave waits for (--wait) or stops (--force) the participants'
servers here, leaves the swarm, stops and removes the GPU guard, the firewall's keeper (and
its rules) and the disk watch, and takes the GPU settings out of daemon.json again.

For engines set up differently (the test bed's machines): DOCKER_HOST, GPUHUB_DAEMON_JSON,
GPUHUB_DOCKERD_CMD (how to start dockerd), GPUHUB_DOCKERD_PIDFILE, GPUHUB_DOCKERD_LOG.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import socket
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpu_swarm_spawner import contract

from . import advertise, disk_watch, engine, guard_service, host_firewall, keepers, shared_folders
from .docker_cli import DockerCLI
from .engine import EngineError

SWARM_PORT = 2377
TOKEN = re.compile(r"^SWMTKN-1-[0-9a-z]+-[0-9a-z]+$")
FULL_LINE = "run 'make join-command' on the manager for the full line"


class Stop(Exception):
    """The setup stops here; the message says why and how to go on."""


class Checklist:
    """What the steps did: a timed log line each, and the summary table's rows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.rows: list[tuple[str, str]] = []
        self.changes = 0
        self._clock = clock
        self._start = clock()

    def log(self, message: str) -> None:
        print(f"[{int(self._clock() - self._start):3d}s] {message}", flush=True)

    def detail(self, lines: list[str]) -> None:
        for line in lines:
            print(f"      {line}", flush=True)

    def row(self, step: str, result: str) -> None:
        self.rows.append((step, result))
        self.log(f"{step}: {result}")

    def changed(self, step: str, result: str) -> None:
        self.changes += 1
        self.row(step, result)

    def table(self) -> list[str]:
        return ["", f"  {'step':<12} result", *(f"  {s:<12} {r}" for s, r in self.rows), ""]


@dataclass
class Machine:
    """What the steps work on: the options, this machine's engine and its daemon.json."""

    args: argparse.Namespace
    docker: DockerCLI
    daemon_json: Path
    checklist: Checklist = field(default_factory=Checklist)
    guard: guard_service.Service = field(default_factory=guard_service.Service)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    #: The manager's swarm address (ADDR:PORT) and the single-user image by the name this
    #: machine gets it under; both set by ``join``.
    manager: str = ""
    image: str = ""
    #: The environment the setup runs in (DOCKER_HOST: the engine's socket, for the disk watch).
    environ: Mapping[str, str] = field(default_factory=dict)


def with_port(address: str) -> str:
    """``ADDR`` as ``ADDR:2377``; an address with a port stays as it is."""
    host, colon, port = address.rpartition(":")
    if colon and port.isdigit() and not host.endswith(":"):
        return address
    return f"{address}:{SWARM_PORT}"


def local_servers(m: Machine) -> list[str]:
    """The participants' servers running here: their service names."""
    prefix = f"{contract.SERVICE_PREFIX}-"
    names = [n for n in m.docker.service_containers() if n.startswith(prefix)]
    return list(dict.fromkeys(names))


# ---- the steps ----------------------------------------------------------------------------


def check_prerequisites(m: Machine, joining: bool = True) -> None:
    """Nothing changes before these hold; setup.sh has checked root and python3."""
    if platform.system() != "Linux":
        raise Stop("worker setup supports Linux only")
    try:
        advertise.read_config(m.daemon_json)
    except advertise.PlanError as e:
        raise Stop(str(e)) from None
    if not joining:
        return
    args = m.args
    if not args.manager:
        raise Stop(f"--manager ADDR is missing; {FULL_LINE}")
    if not args.token:
        raise Stop(f"--token is missing; {FULL_LINE}")
    if not TOKEN.match(args.token):
        raise Stop(
            "--token does not look like a swarm join token (SWMTKN-1-...); "
            "copy it again from 'make join-command'"
        )
    m.manager = with_port(args.manager)
    host, _, port = m.manager.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise Stop(
            f"cannot reach the manager at {m.manager}; check the address and that TCP 2377 and "
            "7946 and UDP 4789 and 7946 are open between the machines"
        ) from None
    m.checklist.row("checks", f"root, python3, {m.daemon_json}, manager {m.manager} answers")


def check_shared_folders(m: Machine) -> None:
    """Each folder the hub mounts into servers is here and the manager's, before anything on
    the machine changes; otherwise the join stops (or, with --shared-folders-warn-only, says so
    and goes on)."""
    folders = m.args.shared_folder or []
    if not folders:
        m.checklist.row("shared", "no shared folders named in the join line")
        return
    found = shared_folders.problems(folders)
    if not found:
        named = " ".join(folder for folder, _ in folders)
        m.checklist.row("shared", f"the manager's: {named}")
        return
    line = shared_folders.refusal(found, m.manager.rpartition(":")[0] or "MANAGER")
    if not m.args.shared_folders_warn_only:
        raise Stop(line)
    print(f"warning: {line}", file=sys.stderr, flush=True)
    m.checklist.row("shared", f"WARNING, joining anyway: {'; '.join(found)}")


def ensure_engine(m: Machine) -> None:
    if m.docker.running():
        m.checklist.row("engine", f"running ({m.docker.server_version()})")
        return
    if m.args.dry_run:
        m.checklist.row("engine", "would install docker.io if missing and start it")
        return
    try:
        m.docker.ensure_running(m.checklist.log)
    except EngineError as e:
        raise Stop(str(e)) from None
    m.checklist.changed("engine", f"started ({m.docker.server_version()})")


def plan_gpus(m: Machine) -> advertise.Plan:
    """Find the GPUs and work out daemon.json before anything changes: a machine whose NVML
    fails stops here, outside the swarm."""
    notes: list[str] = []
    try:
        plan = advertise.plan(m.args, m.daemon_json, say=notes.append)
    except advertise.PlanError as e:
        m.checklist.detail(notes)
        raise Stop(str(e)) from None
    m.checklist.row("gpus", advertise.summary(plan.gpus, plan.slices, len(plan.skipped)))
    m.checklist.detail(notes + plan.runtime_lines() + change_lines(plan))
    return plan


def change_lines(plan: advertise.Plan) -> list[str]:
    if not plan.changes:
        return [f"{plan.path}: already as wanted; nothing to change"]
    return [f"{plan.path} would change:", *plan.diff().splitlines()]


#: Docker's LocalNodeState of a machine that is a member of no working swarm but still holds
#: one's state: "pending" (its node was removed on the manager, e.g. `docker node rm` of a sick
#: machine that then came back; or a join that never completed), "error" (its certificate or
#: state refused). `docker swarm join` refuses such a machine ("already part of a swarm").
STUCK_STATES = ("pending", "error")
#: seconds before each try to leave a stuck swarm state (the first at once)
LEAVE_RETRY_S = (0, 2, 5, 10)
#: the state of a machine the manager removed while its engine ran (``removed_from_swarm``)
REMOVED = "removed on the manager"


def removed_from_swarm(log: str, node_id: str) -> bool:
    """Does the engine's ``log`` say the manager removed node ``node_id`` from its swarm
    (``docker node rm``)? Its engine then still calls itself "active", with no error, while
    the manager refuses it every time it connects (swarmkit's words, since 2016: "node ID was
    removed from swarm"). A node that joined since has another ID."""
    return bool(node_id) and f"node {node_id} was removed from swarm" in log


def ensure_joined(m: Machine) -> None:
    swarm = m.docker.info().get("Swarm") or {}
    state = swarm.get("LocalNodeState") or "inactive"
    managers = [r.get("Addr", "") for r in swarm.get("RemoteManagers") or []]
    if state == "active":
        if m.manager not in managers:
            raise Stop(
                f"this machine is already in another swarm (managers: {' '.join(managers)}); "
                "run 'worker_setup/setup.sh --leave' first"
            )
        if not removed_from_swarm(m.docker.recent_log(), swarm.get("NodeID") or ""):
            m.checklist.row("swarm", f"already joined ({m.manager})")
            return
        state = REMOVED  # stuck: a member of no swarm, though it says it is
    stuck = state in (*STUCK_STATES, REMOVED)
    if stuck and managers and m.manager not in managers:
        raise Stop(
            f"this machine is stuck joining another swarm (state {state}, managers: "
            f"{' '.join(managers)}); run 'worker_setup/setup.sh --leave --force' first"
        )
    if m.args.dry_run:
        forget = f"forget its stuck swarm state ({state}) and " if stuck else ""
        m.checklist.row("swarm", f"would {forget}join the swarm of {m.manager}")
        return
    if stuck:
        # A member of no working swarm runs no task of one: leaving loses nothing. Right after
        # the manager removed it, the engine's leave may time out ("context deadline exceeded"):
        # it is tried again a few times.
        for wait in LEAVE_RETRY_S:
            m.sleep(wait)
            error = " ".join(m.docker.swarm_leave().split())
            if not error:
                break
        else:
            raise Stop(f"forgetting the stuck swarm state ({state}) failed: {error}")
        m.checklist.changed(
            "swarm", f"forgot the stuck state of a swarm it is no member of ({state})"
        )
    error = " ".join(m.docker.swarm_join(m.args.token, m.manager, m.args.advertise_addr).split())
    if error:
        # Docker's "Error response from daemon: rpc error: code = ... desc = <the reason>"
        reason = error.split(" desc = ", 1)[1] if " desc = " in error else error.rpartition(": ")[2]
        raise Stop(
            f"joining the swarm at {m.manager} failed: {reason}; run "
            "'make join-command' on the manager for a fresh token. Nothing else was changed."
        )
    m.checklist.changed("swarm", f"joined the swarm of {m.manager}")


def tar_image_id(path: str) -> str:
    """The id (``sha256:...``) of the image in a ``docker save`` file; "" when unreadable."""
    try:
        with tarfile.open(path) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
        config = manifest[0]["Config"]  # "<id>.json", or "blobs/sha256/<id>" (OCI layout)
    except (OSError, tarfile.TarError, KeyError, IndexError, TypeError, ValueError):
        return ""
    return "sha256:" + config.rsplit("/", 1)[-1].split(".")[0]


def ensure_image(m: Machine) -> None:
    """The single-user image is here: already, loaded from --image-tar, or pulled."""
    tar, image = m.args.image_tar, m.image
    if m.args.registry and not tar:
        ensure_registry_images(m)
        return
    if tar and not Path(tar).is_file():
        raise Stop(f"--image-tar {tar}: no such file")
    have = m.docker.image_id(image)
    if have and not tar:
        m.checklist.row("image", f"{image} present")
        return
    if have and have == tar_image_id(tar):  # else the tar may hold a newer build
        m.checklist.row("image", f"{image} present (same as {tar})")
        return
    if m.args.dry_run:
        m.checklist.row("image", f"would load {tar}" if tar else f"would pull {image}")
        return
    if tar:
        error = m.docker.load(tar)
        if error:
            raise Stop(f"docker load {tar} failed: {error}")
        if not m.docker.image_id(image):
            raise Stop(f"{tar} does not hold {image}; make it on the manager with 'make image-tar'")
        m.checklist.changed("image", f"loaded {image} from {tar}")
    elif not m.docker.pull(image):
        m.checklist.changed("image", f"pulled {image}")
    else:
        raise Stop(
            f"the single-user image {image} is not here and cannot be pulled; on the manager run "
            "'make image-tar', copy the file here and pass --image-tar FILE"
        )


def registry_images(registry: str, timeout: float = 30) -> list[str]:
    """Every image of the registry at HOST:PORT (plain HTTP), by the name to pull it with;
    [] when it does not answer. Straight to it, never through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(path: str) -> dict:
        with opener.open(f"http://{registry}/v2{path}", timeout=timeout) as response:
            return json.load(response)

    try:
        return [
            f"{registry}/{repository}:{tag}"
            for repository in get("/_catalog?n=1000").get("repositories") or []
            for tag in get(f"/{repository}/tags/list").get("tags") or []
        ]
    except (OSError, ValueError, AttributeError):
        return []


def ensure_registry_images(m: Machine) -> None:
    """Every image of the manager's registry (the single-user image and the spawn page's
    environments), pulled now so that no participant's first start waits for gigabytes; pulled
    every time (a no-op when up to date), so rebuilt images arrive with a re-run."""
    registry = m.args.registry
    if m.args.dry_run:
        m.checklist.row("image", f"would pull the images of {registry}")
        return
    images = registry_images(registry)
    if m.image not in images:
        raise Stop(
            f"cannot find {m.image} in the manager's registry {registry}; check that 'make up' "
            f"ran on the manager and that TCP {registry.rpartition(':')[2]} to it is open"
        )
    pulled, current = [], []
    for image in images:
        before = m.docker.image_id(image)
        error = m.docker.pull(image)
        if error:
            raise Stop(f"docker pull {image} from the manager's registry failed: {error}")
        (current if m.docker.image_id(image) == before else pulled).append(image)
    if pulled:
        m.checklist.changed("image", f"pulled from the manager's registry: {' '.join(pulled)}")
    else:
        m.checklist.row("image", f"up to date: {' '.join(current)}")


def ensure_gpu_settings(m: Machine, plan: advertise.Plan) -> None:
    """daemon.json holds the planned slices and labels; the engine restarted to apply them."""
    if not plan.changes:
        m.checklist.row("daemon.json", "already as wanted")
        return
    if m.args.dry_run:
        m.checklist.row("daemon.json", "would change (diff above)")
        return
    users = local_servers(m)
    if users and not m.args.force:
        raise Stop(
            "applying the new GPU settings restarts the Docker engine, which would stop the "
            f"servers running here: {' '.join(users)}; run this again once they have stopped, "
            "or add --force"
        )
    backup = advertise.write(m.daemon_json, plan.wanted)
    apply_daemon_json(m, "slices and labels written" + (" (backup kept)" if backup else ""))


def apply_daemon_json(m: Machine, what: str) -> None:
    """Record the change to daemon.json, then restart the engine to apply it."""
    m.checklist.changed("daemon.json", what)
    m.checklist.log(f"restarting the Docker engine to apply {m.daemon_json}")
    try:
        m.docker.restart()
    except EngineError as e:
        raise Stop(str(e)) from None
    m.checklist.changed("restart", "engine restarted")


def join(m: Machine) -> None:
    singleuser = m.args.image  # the hub's GPUHUB_SINGLEUSER_IMAGE (the join line's --image)
    # the manager's registry serves the image under its own address; an --image-tar holds it
    # under the name it was saved with
    use_registry = m.args.registry and not m.args.image_tar
    m.image = (
        contract.image_in_registry(m.args.registry, singleuser) if use_registry else singleuser
    )
    check_prerequisites(m)
    check_shared_folders(m)
    ensure_engine(m)
    plan = plan_gpus(m)
    ensure_joined(m)
    if m.args.registry:  # the engine trusts the registry only after the restart
        ensure_gpu_settings(m, plan)
        ensure_image(m)
    else:
        ensure_image(m)
        ensure_gpu_settings(m, plan)
    ensure_guard(m, plan)
    ensure_host_firewall(m)
    ensure_disk_watch(m)
    for line in m.checklist.table():
        print(line)
    if m.args.dry_run:
        print("dry run: nothing was changed")
    elif not m.checklist.changes:
        print("nothing to change: this machine is already set up")
    else:
        print("done: this machine's GPU slices are available to the hub in a few seconds")


def guard_options(m: Machine) -> list[str]:
    """The guard's command-line options from the join's --guard-* ones."""
    a = m.args
    options = [
        "--mode",
        a.guard_mode,
        "--warn-percent",
        f"{a.guard_warn_percent:g}",
        "--stop-percent",
        f"{a.guard_stop_percent:g}",
        "--grace-seconds",
        f"{a.guard_grace_seconds:g}",
        "--metrics-port",
        str(a.guard_metrics_port),
    ]
    node = (m.docker.info() or {}).get("Name")
    if node:
        options += ["--machine", node]
    return options


def ensure_guard(m: Machine, plan: advertise.Plan) -> None:
    """The GPU guard runs here with the join's settings: started, restarted when they
    changed, left alone when not; stopped when there is nothing to guard."""
    reason = ""
    if m.args.guard_mode == "off":
        reason = "--guard-mode off"
    elif not plan.gpus or m.args.simulate_gpus:
        reason = "simulated GPUs: no NVML to read" if m.args.simulate_gpus else "no GPUs"
    if reason:
        ensure_guard_stopped(m, reason)
        return
    wanted = guard_service.wanted(guard_options(m), m.guard.environ)
    what = f"{m.args.guard_mode} mode" + (
        f", metrics on :{m.args.guard_metrics_port}" if m.args.guard_metrics_port else ""
    )
    now = m.guard.state(wanted)
    if now.same:
        m.checklist.row("guard", f"running ({what})")
        return
    verb = "restart" if now.pid is not None else "start"
    if m.args.dry_run:
        m.checklist.row("guard", f"would {verb} the GPU guard ({what}; {m.guard.where()})")
        return
    try:
        m.guard.start(wanted)
    except (OSError, RuntimeError) as e:
        raise Stop(f"the GPU guard did not start: {e}") from None
    m.checklist.changed("guard", f"{verb}ed ({what}; {m.guard.where()})")


def ensure_guard_stopped(m: Machine, reason: str) -> None:
    if m.guard.state(None).pid is None and not m.guard.installed():
        m.checklist.row("guard", f"not running ({reason})")
    elif m.args.dry_run:
        m.checklist.row("guard", f"would stop and remove the GPU guard ({reason})")
    else:
        m.guard.stop()
        m.checklist.changed("guard", f"stopped and removed ({reason})")


def ensure_host_firewall(m: Machine) -> None:
    """The machine's own rules for its containers are kept here (host_firewall.py): no
    metadata address, no manager, nothing of this machine. With --no-firewall, none."""
    if m.args.no_firewall:
        ensure_host_firewall_removed(m, " (--no-firewall)")
        return
    managers = [m.manager] if m.manager else []
    keeper_step(
        m,
        "firewall",
        lambda: host_firewall.ensure(
            m.docker, m.image, managers, m.args.guard_metrics_port, m.args.dry_run
        ),
    )


def ensure_host_firewall_removed(m: Machine, why: str = "") -> None:
    keeper_step(m, "firewall", lambda: host_firewall.remove(m.docker, m.args.dry_run), why)


def ensure_disk_watch(m: Machine) -> None:
    """The disk watch runs here (disk_watch.py) from the single-user image. With
    --no-disk-watch, none."""
    if m.args.no_disk_watch:
        ensure_disk_watch_removed(m, " (--no-disk-watch)")
        return
    socket = engine.docker_socket(m.environ)
    keeper_step(m, "disk", lambda: disk_watch.ensure(m.docker, m.image, socket, m.args.dry_run))


def ensure_disk_watch_removed(m: Machine, why: str = "") -> None:
    keeper_step(m, "disk", lambda: disk_watch.remove(m.docker, m.args.dry_run), why)


def keeper_step(m: Machine, step: str, call: Callable[[], tuple], why: str = "") -> None:
    """A container the machine keeps (keepers.py): ``call``'s (changed, what it says) as the
    row of ``step``, with ``why`` after it; its failure stops the setup."""
    try:
        changed, said = call()
    except keepers.KeeperError as e:
        raise Stop(str(e)) from None
    (m.checklist.changed if changed else m.checklist.row)(step, said + why)


# ---- leaving ------------------------------------------------------------------------------


def wait_for_servers(m: Machine) -> list[str]:
    """The participants' servers still here after waiting up to --wait seconds."""
    deadline = m.clock() + m.args.wait
    users = local_servers(m)
    while users and m.clock() < deadline:
        m.checklist.log(f"waiting for {len(users)} server(s) to stop: {' '.join(users)}")
        m.sleep(5)
        users = local_servers(m)
    return users


def ensure_left(m: Machine, users: list[str]) -> None:
    """Out of the swarm; with --force, the servers still here stop with it."""
    servers = " ".join(users)
    if (m.docker.info().get("Swarm") or {}).get("LocalNodeState") != "active":
        m.checklist.row("swarm", "not in a swarm")
    elif m.args.dry_run:
        m.checklist.row(
            "swarm",
            f"would leave the swarm and stop {servers}" if users else "would leave the swarm",
        )
    else:
        error = m.docker.swarm_leave()
        if error:
            raise Stop(f"docker swarm leave failed: {error}")
        m.checklist.changed(
            "swarm", f"left the swarm (stopped {servers})" if users else "left the swarm"
        )


def ensure_gpu_settings_removed(m: Machine) -> None:
    try:
        plan = advertise.plan(m.args, m.daemon_json, remove=True)
    except advertise.PlanError as e:
        raise Stop(str(e)) from None
    if not plan.changes:
        m.checklist.row("daemon.json", "no GPU settings left")
        return
    m.checklist.detail(change_lines(plan))
    if m.args.dry_run:
        m.checklist.row("daemon.json", "would take the GPU settings out")
        return
    backup = advertise.write(m.daemon_json, plan.wanted)
    apply_daemon_json(m, "GPU slices and labels taken out" + (" (backup kept)" if backup else ""))


def leave(m: Machine) -> None:
    check_prerequisites(m, joining=False)
    if not m.docker.running():
        raise Stop("the Docker engine is not running here; start it first")
    node = m.docker.info().get("Name") or "<hostname>"
    users = wait_for_servers(m)
    if users and not m.args.force:
        raise Stop(
            f"participants' servers still run here: {' '.join(users)}; on the manager run "
            f"'make pause-node NODE={node}' so no new ones start here, ask them to stop (or "
            "stop them on the hub's admin page), then wait with --wait SECONDS, or stop them "
            "with --force"
        )
    ensure_left(m, users)
    ensure_guard_stopped(m, "leaving")
    ensure_host_firewall_removed(m)
    ensure_disk_watch_removed(m)
    ensure_gpu_settings_removed(m)
    for line in m.checklist.table():
        print(line)
    print(
        "The Docker engine and the single-user image stay. On the manager, "
        f"'docker node rm {node}' removes it from the node list."
    )


def run(m: Machine) -> int:
    """Join or leave as the options say; 1 with one line on stderr when a step stops."""
    try:
        if m.args.leave:
            leave(m)
        else:
            join(m)
    except Stop as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
