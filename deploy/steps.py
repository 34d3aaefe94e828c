"""The manager's deploy steps below the stack: the engine, this machine's GPU slices, the swarm,
the images, the generated secrets, the published ports, the roster, and what adds or pauses a
GPU machine.

Each ``ensure_*`` is idempotent and says what it did, also when that was nothing. The settings
come in as one ``deploy.settings.Config`` and Docker as a Docker SDK client; nothing here reads
Docker's human-readable output.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import docker
from docker.errors import APIError, BuildError, DockerException, ImageNotFound, NotFound

from gpu_swarm_spawner import contract, egress, roster
from worker_setup import advertise, disk_watch, engine, host_firewall, keepers
from worker_setup.docker_cli import DockerCLI

from .console import DeployError, Log, run
from .settings import REPO, Config, read_roster

#: The base image built here from Debian (images/base/build.sh) instead of pulled.
LOCAL_BASE = "gpu-jupyterhub/base:bookworm"
#: An image ``gpu-jupyterhub/X:TAG`` is built from images/X/Dockerfile when that exists.
LOCAL_PREFIX = "gpu-jupyterhub/"
#: The generated secrets (GPUHUB_STATE_DIR): the proxy's API token, the operations token for
#: scripts and tests, the participants' shared password and the admins' own (JupyterHub's
#: shared-password login wants one of 32 characters or more), the tutorial webhook's secret, the
#: metrics token, and the key the hub encrypts stored GitHub tokens with (auth_state's crypt key,
#: 32 bytes: 64 hex digits).
GENERATED = (
    "proxy_token",
    "ops_token",
    "demo_password",
    "admin_password",
    "webhook_secret",
    "metrics_token",
    "crypt_key",
)
#: Random bytes of a generated secret (16 unless named here).
GENERATED_BYTES = {"crypt_key": 32}
#: The shared folders' id (contract.SHARE_MARKER in each holds it), made once per stack.
SHARE_ID = "share_id"
#: Where the hub's container reads the roster (the state directory's roster/, mounted read-only).
ROSTER_IN_HUB = "/srv/jupyterhub/roster/roster.txt"
#: The single-user image as a file for GPU machines that cannot pull it (GPUHUB_IMAGE_TAR).
IMAGE_TAR = "/var/lib/gpu-jupyterhub/singleuser-image.tar"


def connect() -> docker.DockerClient:
    """The engine at DOCKER_HOST (or the system's), as Docker's CLI would reach it."""
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as e:
        raise DeployError(
            f"cannot reach the Docker engine ({e}); start it (make demo or make up does)"
        ) from None
    return client


# ---- engine and GPU slices ------------------------------------------------------------------


def ensure_engine(log: Log) -> None:
    """The Docker engine runs (Debian's docker.io, installed and started when it is not)."""
    if not engine.ensure_running(log):
        log("Docker engine: running")


def advertise_arguments(config: Config, optional: bool, environ: Mapping[str, str]) -> list[str]:
    """worker_setup.advertise's options for this machine: GPUHUB_SLICES_PER_GPU slices per GPU,
    GPUHUB_SIMULATE_IF_NO_GPU simulated GPUs when it has none (``optional``: else no slices,
    for `make up`'s manager, which may run only the hub), GPUHUB_NAMED_SLOTS, and the engine's
    daemon.json (GPUHUB_DAEMON_JSON, for an engine that is not the system's)."""
    argv = ["--slices-per-gpu", str(config.slices_per_gpu)]
    argv += ["--simulate-if-no-gpu", str(config.simulate_if_no_gpu)]
    if optional:
        argv.append("--none-if-no-gpu")
    if config.named_slots:
        argv += ["--named-kind", config.named_slots]
    if environ.get("GPUHUB_DAEMON_JSON"):
        argv += ["--daemon-json", environ["GPUHUB_DAEMON_JSON"]]
    return argv


def ensure_host_firewall(config: Config, log: Log, environ: Mapping[str, str] = os.environ):
    """This machine's own rules for the containers it runs (worker_setup/host_firewall.py, as
    the join keeps them on a GPU machine): the manager runs servers too in a demo, and the
    stack's containers need neither the metadata address nor the machine's ports but the GPU
    guard's and the disk watch's (the hub reads this machine's disk report there). With
    GPUHUB_EGRESS=off (an image without gpuhub-firewall), none."""
    docker_cli = DockerCLI(environ)

    def ensure():
        image, guard_port = config.singleuser_image, config.guard_metrics_port
        return host_firewall.ensure(
            docker_cli, image, [], guard_port, disk_port=contract.DISK_WATCH_PORT
        )

    _keeper(config, log, "firewall", ensure, lambda: host_firewall.remove(docker_cli))


def remove_host_firewall(log: Log, environ: Mapping[str, str] = os.environ) -> None:
    """`make down`: no servers run here any more; the keeper and its rules go."""
    _removed(log, "firewall", lambda: host_firewall.remove(DockerCLI(environ)))


def ensure_disk_watch(config: Config, log: Log, environ: Mapping[str, str] = os.environ):
    """This machine's disk watch (worker_setup/disk_watch.py, as the join runs it on a GPU
    machine): the manager runs servers too in a demo, and the hub reads its report. With
    GPUHUB_EGRESS=off (an image without our programs, gpuhub-disk among them), none."""
    docker_cli = DockerCLI(environ)
    socket = engine.docker_socket(environ)
    _keeper(
        config,
        log,
        "disk watch",
        lambda: disk_watch.ensure(docker_cli, config.singleuser_image, socket),
        lambda: disk_watch.remove(docker_cli),
    )


def remove_disk_watch(log: Log, environ: Mapping[str, str] = os.environ) -> None:
    """`make down`: no servers run here any more; the disk watch goes."""
    _removed(log, "disk watch", lambda: disk_watch.remove(DockerCLI(environ)))


def _keeper(config: Config, log: Log, step: str, ensure: Callable, remove: Callable) -> None:
    """A container of this machine's engine (worker_setup/keepers.py): ``ensure()``, or with
    GPUHUB_EGRESS=off (an image without our programs) ``remove()``; what it says logged."""
    try:
        if config.egress.mode == egress.OFF:
            said = remove()[1] + " (GPUHUB_EGRESS=off)"
        else:
            said = ensure()[1]
    except keepers.KeeperError as e:
        raise DeployError(str(e)) from None
    log(f"{step}: {said}")


def _removed(log: Log, step: str, remove: Callable) -> None:
    try:
        changed, said = remove()
    except keepers.KeeperError as e:
        raise DeployError(str(e)) from None
    if changed:
        log(f"{step}: {said}")


def ensure_gpu_slices(
    config: Config,
    log: Log,
    optional: bool = False,
    environ: Mapping[str, str] = os.environ,
    advertise_main: Callable[[list[str]], int] | None = None,
    restart: Callable[[], None] | None = None,
) -> bool:
    """This machine's GPUs (or simulated ones) are advertised to Swarm as slices in the
    engine's daemon.json (worker_setup.advertise, as on the GPU machines); the engine is
    restarted when that changed. True when it changed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = (advertise_main or advertise.main)(
                advertise_arguments(config, optional, environ)
            )
        except SystemExit as e:  # its options refused (argparse)
            status = e.code if isinstance(e.code, int) else 1
    if status not in (0, advertise.CHANGED):
        raise DeployError(
            err.getvalue().strip() or "advertising the GPU slices failed", output=out.getvalue()
        )
    log("GPU slices")
    log.detail(out.getvalue())
    if status == advertise.CHANGED:
        log("GPU slices changed; restarting the Docker engine")
        (restart or engine.restart)()
        return True
    return False


# ---- swarm ----------------------------------------------------------------------------------


def default_advertise_addr() -> str:
    """This machine's address on its default route (no packet is sent), else 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


#: The size of the networks a swarm initialised here gives (its servers' network among them)
SUBNET_SIZE = 20


def ensure_swarm(client, log: Log, environ: Mapping[str, str] = os.environ) -> str:
    """This engine is a swarm manager (a single-node swarm is initialised when it is in none,
    advertised on GPUHUB_ADVERTISE_ADDR or the default route's address). Returns the address
    the other machines reach it at."""
    swarm = client.info()["Swarm"]
    state = swarm.get("LocalNodeState", "")
    if state == "inactive":
        addr = environ.get("GPUHUB_ADVERTISE_ADDR") or default_advertise_addr()
        log(f"initialising a swarm on {addr}")
        try:
            # networks of /20 (about 4000 addresses, one per server) from Docker's own pool,
            # where Docker's default /24 holds about 250 servers
            client.swarm.init(
                advertise_addr=addr, default_addr_pool=["10.0.0.0/8"], subnet_size=SUBNET_SIZE
            )
        except APIError as e:
            raise DeployError(
                f"docker swarm init failed ({e.explanation}); set GPUHUB_ADVERTISE_ADDR to this "
                "machine's address"
            ) from None
        swarm = client.info()["Swarm"]
    elif state != "active":
        raise DeployError(
            f"this engine's swarm state is {state!r}; wait for it, or run: "
            "docker swarm leave --force"
        )
    elif not swarm.get("ControlAvailable"):
        raise DeployError(
            "this machine is a swarm worker; run this on a manager (or: docker swarm leave)"
        )
    else:
        log(f"swarm: this machine manages it ({swarm.get('NodeAddr')})")
    return swarm.get("NodeAddr", "")


def manager_addr(client) -> str:
    """The swarm's address of this machine, which must be a manager."""
    swarm = client.info().get("Swarm", {})
    if not swarm.get("ControlAvailable"):
        raise DeployError(
            "this machine is not a swarm manager; run 'make demo' (or make up) here first"
        )
    return swarm["NodeAddr"]


# ---- images ---------------------------------------------------------------------------------


def dockerfile_dir(image: str) -> str:
    """images/X of ``gpu-jupyterhub/X:TAG`` when images/X/Dockerfile exists, else ""."""
    if not image.startswith(LOCAL_PREFIX):
        return ""
    name = image[len(LOCAL_PREFIX) :].split(":", 1)[0]
    if "/" in name or not (REPO / "images" / name / "Dockerfile").is_file():
        return ""
    return name


def image_id(client, image: str) -> str:
    try:
        return client.images.get(image).id
    except ImageNotFound:
        return ""


def build_image(client, directory: str, image: str, buildargs: dict[str, str], log: Log) -> str:
    """``image`` built from images/DIRECTORY/Dockerfile with the checkout as context (Docker's
    cache makes an unchanged one quick); returns its id."""
    log(f"image {image}")
    before = image_id(client, image)
    try:
        built, _ = client.images.build(
            path=str(REPO),
            dockerfile=f"images/{directory}/Dockerfile",
            tag=image,
            buildargs=buildargs,
            rm=True,
        )
    except BuildError as e:
        text = "".join(str(c.get("stream") or c.get("error") or "") for c in e.build_log)
        raise DeployError(
            f"building {image} failed (output above)", output="\n".join(text.splitlines()[-30:])
        ) from None
    except APIError as e:
        raise DeployError(f"building {image} failed: {e.explanation}") from None
    log.detail(f"{'unchanged' if built.id == before else 'built'} ({built.short_id})")
    return built.id


def ensure_images(client, config: Config, log: Log) -> None:
    """The base (built from Debian when it is the local one), single-user and hub images."""
    if config.base_image == LOCAL_BASE:
        engine.ensure_packages({"debootstrap": "debootstrap"}, log)
        log("base image (debootstrap; cached after the first build)")
        run(
            ["bash", str(REPO / "images/base/build.sh"), config.base_image],
            f"building {config.base_image} failed",
            "fix the cause and run this again",
            show=log.detail,
        )
    base = {"BASE_IMAGE": config.base_image}
    build_image(client, "singleuser", config.singleuser_image, base, log)
    build_image(client, "hub", config.hub_image, base, log)


def ensure_environment_images(client, config: Config, log: Log) -> None:
    """The images of GPUHUB_ENVIRONMENTS: built from images/X/ for gpu-jupyterhub/X:TAG (from
    the single-user image), any other one here already or pulled."""
    for image in config.environments.values():
        directory = dockerfile_dir(image)
        if directory:
            build_image(
                client, directory, image, {"SINGLEUSER_IMAGE": config.singleuser_image}, log
            )
            continue
        if image_id(client, image):
            log(f"image {image}: here")
            continue
        log(f"pulling {image}")
        try:
            client.images.pull(image)
        except DockerException:
            raise DeployError(
                f"GPUHUB_ENVIRONMENTS: image {image} is neither here nor pullable; build it "
                f"(docker build -t {image} ...) and run this again"
            ) from None


# ---- files on this machine ------------------------------------------------------------------


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def ensure_state_dir(config: Config) -> Path:
    state = Path(config.state_dir)
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    return state


def ensure_secrets(config: Config, log: Log) -> list[str]:
    """The generated secrets exist in GPUHUB_STATE_DIR (mode 0700); existing ones are kept.
    Returns the names of those made now."""
    state = ensure_state_dir(config)
    made = []
    for name in GENERATED:
        path = state / name
        if path.is_file() and path.stat().st_size:
            continue
        private_file(path, secrets.token_hex(GENERATED_BYTES.get(name, 16)) + "\n")
        made.append(name)
    if made:
        log(f"secrets generated in {state}: {', '.join(made)}")
    else:
        log(f"secrets: kept those in {state}")
    return made


def shared_folders(config: Config) -> list[str]:
    """The folders on shared storage that servers mount, which every GPU machine must have at
    the same path: the tutorials (with tutorial repositories), the datasets, the homes."""
    folders = [config.tutorials_dir] if config.tutorial_repos else []
    folders += [folder for folder in (config.datasets_dir, config.homes_dir) if folder]
    return [os.path.normpath(folder) for folder in folders]


def ensure_share_marks(config: Config, log: Log) -> dict[str, str]:
    """Each shared folder exists and holds contract.SHARE_MARKER with this stack's share id
    (made once, kept in GPUHUB_STATE_DIR), so that a GPU machine's join can tell the manager's
    folder from an empty local one of the same name. Returns {folder: share id}."""
    state = ensure_state_dir(config)
    id_file = state / SHARE_ID
    share_id = id_file.read_text().strip() if id_file.is_file() else ""
    if not share_id:
        share_id = secrets.token_hex(8)
        private_file(id_file, share_id + "\n")
    text = (
        f"{share_id}\n# gpu-jupyterhub: shared storage of the hub {config.stack}; a GPU machine "
        "joining checks that it sees this file (docs/homes.md)\n"
    )
    marked = {}
    for folder in shared_folders(config):
        marker = Path(folder, contract.SHARE_MARKER)
        try:
            Path(folder).mkdir(mode=0o755, parents=True, exist_ok=True)
            if not marker.is_file() or marker.read_text() != text:
                tmp = marker.with_name(f"{contract.SHARE_MARKER}.tmp")
                tmp.write_text(text)
                os.chmod(tmp, 0o644)
                tmp.replace(marker)
                log(f"shared folder {folder}: marked as this hub's ({contract.SHARE_MARKER})")
        except OSError as e:
            raise DeployError(
                f"cannot write {marker} ({e.strerror}); root on this machine must be able to "
                "write the shared folder (NFS: export it to the manager with no_root_squash), "
                "then run this again"
            ) from None
        marked[folder] = share_id
    return marked


def ensure_roster(config: Config, log: Log) -> str:
    """GPUHUB_ROSTER checked and copied where the hub reads it (it re-reads it when it
    changes); returns that path inside the hub, "" when there is no roster."""
    roster_dir = Path(config.state_dir) / "roster"
    roster_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = config.roster
    if not path:
        return ""
    found, problems = read_roster(path)
    if problems:
        raise DeployError("\n".join(problems))
    # the usernames alone: what was checked is what the hub reads, and a registration export's
    # names and email addresses stay out of the hub
    tmp = roster_dir / ".roster.txt.tmp"
    tmp.write_text(roster.text(found))
    os.chmod(tmp, 0o644)
    tmp.replace(roster_dir / "roster.txt")
    log(f"roster: {found.describe()}")
    return ROSTER_IN_HUB


# ---- ports ----------------------------------------------------------------------------------


def port_in_use(port: int) -> bool:
    """A program on this machine listens on TCP ``port`` (on any of its addresses)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((address, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def stack_services(client, stack: str) -> list[dict]:
    return client.api.services(filters={"label": f"{contract.DOCKER_STACK_LABEL}={stack}"})


def ensure_ports_free(client, config: Config, keys: list[str], log: Log) -> None:
    """The ports the stack publishes are free, or already the stack's (a re-run)."""
    ours = None
    seen = []
    for key in keys:
        port = int(config.values[key])
        if not port_in_use(port):
            seen.append(f"{port} free")
            continue
        if ours is None:
            ours = bool(stack_services(client, config.stack))
        if not ours:
            raise DeployError(
                f"port {port} ({key}) is already in use by another program; free it or set "
                f"another port: {key}=..."
            )
        seen.append(f"{port} stack {config.stack}'s")
    log(f"ports: {', '.join(seen)}")


# ---- GPU machines ---------------------------------------------------------------------------


def guard_options(config: Config) -> str:
    """The join line's --guard-* options: the GPUHUB_GUARD_* settings that differ from the
    guard's own defaults (" --guard-mode enforce ..."; "" when none do)."""
    defaults = contract.GuardSettings()
    wanted = [
        ("mode", config.guard_mode, defaults.mode),
        ("warn-percent", config.guard_warn_percent, defaults.warn_percent),
        ("stop-percent", config.guard_stop_percent, defaults.stop_percent),
        ("grace-seconds", config.guard_grace_seconds, defaults.grace_seconds),
        ("metrics-port", config.guard_metrics_port, contract.GUARD_METRICS_PORT),
    ]
    return "".join(
        f" --guard-{name} {value:g}" if isinstance(value, float) else f" --guard-{name} {value}"
        for name, value, default in wanted
        if value != default
    )


def shared_folder_options(marked: dict[str, str]) -> str:
    """The join line's --shared-folder options: each shared folder with its share id
    (" --shared-folder /srv/homes=ID ..."; "" when there is none)."""
    return "".join(f" --shared-folder {folder}={share_id}" for folder, share_id in marked.items())


def join_command(
    addr: str,
    token: str,
    slices_per_gpu: int,
    image: str,
    registry: str = "",
    guard: str = "",
    shared: str = "",
    firewall: bool = True,
) -> str:
    """The lines an organizer runs on each GPU machine: the swarm's address and worker token,
    with ``registry`` (`make up`) where the machine pulls the servers' images, ``guard``
    the GPU guard's options and ``shared`` the shared folders it must have. ``firewall`` False
    (GPUHUB_EGRESS=off: an image without our programs): neither the machine's firewall nor
    its disk watch, which run from the image."""
    if registry:
        comment = (
            "# On each GPU machine, as root, in a checkout of this repository (it pulls the\n"
            "# single-user image from this machine's registry):"
        )
        extra = f" --registry {registry}"
    else:
        comment = (
            "# On each GPU machine, as root, in a checkout of this repository (add "
            "--image-tar FILE,\n"
            f"# made by 'make image-tar' here, when the machine cannot pull {image}):"
        )
        extra = ""
    if image != contract.SINGLEUSER_IMAGE:
        extra += f" --image {image}"
    if not firewall:  # GPUHUB_EGRESS=off: an image without gpuhub-firewall
        extra += " --no-firewall --no-disk-watch"
    line = (
        f"sudo ./worker_setup/setup.sh --manager {addr}:2377 --token {token} "
        f"--slices-per-gpu {slices_per_gpu}{extra}{shared}{guard}"
    )
    return f"{comment}\n{line}"


def registry_running(client, config: Config) -> bool:
    """The stack runs its image registry (`make up`)."""
    try:
        client.api.inspect_service(f"{config.stack}_registry")
    except NotFound:
        return False
    return True


def print_join_command(client, config: Config, log: Log | None = None) -> None:
    addr = manager_addr(client)
    client.swarm.reload()
    token = client.swarm.attrs["JoinTokens"]["Worker"]
    registry = f"{addr}:{config.registry_port}" if registry_running(client, config) else ""
    # the folders as the line names them (a deploy marked them; settings changed since may not
    # have been deployed yet), what it says besides the line on stderr
    marked = ensure_share_marks(config, log or Log(out=sys.stderr))
    print(
        join_command(
            addr,
            token,
            config.slices_per_gpu,
            config.singleuser_image,
            registry,
            guard_options(config),
            shared_folder_options(marked),
            firewall=config.egress.mode != egress.OFF,
        )
    )


def _tag_of(image, name: str) -> str:
    """``name`` as it is among the image's tags (``:latest`` added when it names no tag)."""
    return name if name in image.tags else f"{name}:latest"


def save_image_tar(client, config: Config, log: Log, environ: Mapping[str, str] = os.environ):
    """The single-user image as a file to copy to GPU machines that cannot pull it."""
    tar = Path(environ.get("GPUHUB_IMAGE_TAR") or IMAGE_TAR)
    tar.parent.mkdir(parents=True, exist_ok=True)
    try:
        image = client.images.get(config.singleuser_image)
    except ImageNotFound:
        raise DeployError(
            f"the single-user image {config.singleuser_image} is not here; build it with: "
            "make images"
        ) from None
    log(f"saving {config.singleuser_image} to {tar}")
    tmp = tar.with_name(tar.name + ".tmp")
    with open(tmp, "wb") as f:
        # by the configured name: the image may have others (make up tags it for the registry),
        # and the GPU machines look for this one
        for chunk in image.save(named=_tag_of(image, config.singleuser_image)):
            f.write(chunk)
    tmp.replace(tar)
    log(f"copy {tar} to each GPU machine and add --image-tar {tar.name} to the join command")


def set_node_availability(client, node: str, availability: str, log: Log) -> None:
    """Swarm's ``pause`` (no new servers there; running ones stay: a GPU server cannot move to
    another GPU, which ``drain`` would ask of it) or ``active`` for machine ``node``."""
    if not node:
        verb = "pause-node" if availability == "pause" else "resume-node"
        raise DeployError(f"name the machine: make {verb} NODE=<hostname>")
    try:
        found = client.nodes.get(node)
    except NotFound:
        raise DeployError(
            f"no machine {node!r} in this swarm; 'docker node ls' lists them"
        ) from None
    spec = dict(found.attrs["Spec"], Availability=availability)
    if found.attrs["Spec"].get("Availability") != availability:
        found.update(spec)
        if availability == "pause":
            log(
                f"{node} takes no new servers; its running servers stay. "
                f"On {node}: sudo ./worker_setup/setup.sh --leave --wait 600"
            )
        else:
            log(f"{node} takes new servers again")
    else:
        state = "paused already" if availability == "pause" else "takes new servers already"
        log(f"{node}: {state}; nothing to change")
