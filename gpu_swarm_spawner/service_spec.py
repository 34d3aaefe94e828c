"""A server's Swarm service as pure functions of explicit arguments.

``create_kwargs`` gives what ``docker.APIClient.create_service`` takes for one server: its
container (image, command, environment, labels for the GPU guard, mounts), its task (resources
with the GPU slices it holds, network, placement, restart policy) and the service's labels and
endpoint. Nothing here reads a spawner, the hub or Docker: the spawner gathers its traits and
what it holds into a ``Server`` once (``GPUSwarmSpawner.server_spec``) and hands it over, so the
spec can be read, and tested, from its inputs alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from docker.types import ContainerSpec, EndpointSpec, Mount, Placement, Resources, TaskTemplate

from . import contract, naming
from .holding import Holding
from .homes import HOME_PATH


@dataclass(frozen=True)
class Limits:
    """Per-server limits and reservations (None or 0: none): memory in bytes, CPU in cores."""

    mem_limit: int | None = None
    mem_guarantee: int | None = None
    cpu_limit: float | None = None
    cpu_guarantee: float | None = None
    pids_limit: int = 0


@dataclass(frozen=True)
class Disk:
    """What the disk watch of the server's machine holds it to: its participant's home and
    scratch space together at most ``budget_mb`` MiB (0: no budget), and its machine's file
    systems stopped short of ``safety_percent`` full (0: no safety line)."""

    budget_mb: int = 0
    safety_percent: int = 0


@dataclass(frozen=True)
class Server:
    """Everything a server's service is made from."""

    name: str  # the service's name
    user: str
    image: str
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    network: str
    holding: Holding
    limits: Limits
    port: int
    use_internal_ip: bool = True
    service_labels: dict = field(default_factory=dict)  # dockerspawner's labels
    extra_container_spec: dict = field(default_factory=dict)
    extra_task_spec: dict = field(default_factory=dict)
    extra_resources_spec: dict = field(default_factory=dict)
    extra_placement_spec: dict = field(default_factory=dict)
    extra_endpoint_spec: dict = field(default_factory=dict)
    extra_create_kwargs: dict = field(default_factory=dict)
    #: the server's own firewall (egress.server_rules), applied by the image's gpuhub-firewall
    #: before it becomes the participant's user; "": none
    firewall: str = ""
    disk: Disk = Disk()


#: the container's first command when it has a firewall to apply: the image's init, then
#: gpuhub-firewall, which runs the server's command (the service's args) as jovyan
FIREWALL_COMMAND = ["/usr/bin/tini", "--", "gpuhub-firewall", "server", "--"]


def fenced(container: dict, rules: str) -> dict:
    """``container`` (ContainerSpec's arguments) started by gpuhub-firewall: as root with
    CAP_NET_ADMIN, which it keeps only until the rules are applied (it then becomes jovyan
    with no capabilities at all), and the rules in GPUHUB_FIREWALL."""
    return {
        **container,
        "command": FIREWALL_COMMAND,
        "user": "0",
        "cap_add": ["CAP_NET_ADMIN"],
        # HOME for `docker exec` too, which now enters as root
        "env": {**container["env"], "HOME": HOME_PATH, "GPUHUB_FIREWALL": rules},
    }


def create_kwargs(server: Server) -> dict:
    """``create_service``'s keyword arguments for ``server``."""
    container = {
        "image": server.image,
        "env": server.env,
        "labels": container_labels(server.user, server.holding, server.disk),
        "args": server.args,
        "mounts": server.mounts,
        **server.extra_container_spec,
    }
    if server.firewall:
        container = fenced(container, server.firewall)
    task_template = TaskTemplate(
        **{
            "container_spec": ContainerSpec(**container),
            "resources": resources(server.limits, server.extra_resources_spec, server.holding),
            "networks": [server.network] if server.network else [],
            "placement": placement(server.extra_placement_spec, server.holding),
            # a server that shut itself down (stop_object, or the participant's File >
            # Shut Down) stays down and frees its slices; one that crashed is restarted
            # (with Swarm's own delay and attempts: docker-py's RestartPolicy sets them 0)
            "restart_policy": {"Condition": "on-failure"},
            **server.extra_task_spec,
        }
    )
    endpoint = dict(server.extra_endpoint_spec)
    if not server.use_internal_ip:
        endpoint.setdefault("ports", {None: (server.port, "tcp")})
    return {
        "name": server.name,
        "task_template": task_template,
        "endpoint_spec": EndpointSpec(**endpoint),
        **server.extra_create_kwargs,
        "labels": service_labels(server),
    }


def with_gpu_slices(generic, kind: str, slices: int) -> list[dict]:
    """Generic resources to reserve: ``generic`` (as docker-py takes them, ``{kind: value}`` or
    the Engine API's list of ``{"DiscreteResourceSpec": {"Kind": ..., "Value": ...}}``) plus
    ``slices`` of the GPU ``kind``, which replace any entry of that kind. The Engine API's list.
    """
    # docker-py's own conversion (and checks) of the dict form
    listed = Resources(generic_resources=generic or [])["Reservations"]["GenericResources"]
    others = [entry for entry in listed if all(s.get("Kind") != kind for s in entry.values())]
    return [*others, {"DiscreteResourceSpec": {"Kind": kind, "Value": slices}}]


def placement(extra: dict, holding: Holding) -> Placement:
    """The configured placement; a server without a GPU is kept on its chosen machine."""
    spec = dict(extra)
    if holding.cpu_only and holding.cpu_node:
        spec["constraints"] = [*spec.get("constraints", []), f"node.hostname=={holding.cpu_node}"]
    return Placement(**spec)


def within_machine(cores: float | None, node_cores: float) -> float | None:
    """A server's CPU limit (or reservation) in cores, at most the cores of the machine it runs
    on (``node_cores``; 0: unknown, nothing changed). Docker refuses to start a container whose
    limit is above its machine's cores ("Range of CPUs is from 0.01 to N"), and a limit of every
    core is no limit on that machine; a reservation above them could never be placed there."""
    if cores and node_cores and cores > node_cores:
        return node_cores
    return cores


def resources(limits: Limits, extra: dict, holding: Holding) -> Resources:
    """CPU/memory/pids limits and reservations (CPU at most the machine's cores), plus the
    slices held of the server's GPU."""
    generic = extra.get("generic_resources")
    cpu_limit = within_machine(limits.cpu_limit, holding.node_cores)
    cpu_reservation = within_machine(limits.cpu_guarantee, holding.node_cores)
    made = Resources(
        **{
            "mem_limit": limits.mem_limit,
            "mem_reservation": limits.mem_guarantee,
            "cpu_limit": int(cpu_limit * 1e9) if cpu_limit else None,
            "cpu_reservation": int(cpu_reservation * 1e9) if cpu_reservation else None,
            **extra,
            "generic_resources": with_gpu_slices(generic, holding.gpu, holding.slices)
            if holding.gpu
            else generic,
        }
    )
    if limits.pids_limit:
        # Engine API 1.41+; docker-py's Resources has no argument for it
        made.setdefault("Limits", {})["Pids"] = limits.pids_limit
    return made


def service_labels(server: Server) -> dict:
    """Labels of the service: configured ones plus who holds which GPU slices."""
    return {
        **server.service_labels,
        **(server.extra_create_kwargs.get("labels") or {}),
        contract.USER_LABEL: server.user,
        contract.GPU_LABEL: server.holding.gpu,
        contract.SLICES_LABEL: str(server.holding.slices),
        **({contract.CPU_ONLY_LABEL: "1"} if server.holding.cpu_only else {}),
    }


def container_labels(user: str, holding: Holding, disk: Disk = Disk()) -> dict:
    """Labels of the server's container, for the watches on its machine (a worker cannot read
    services). The GPU guard's: whose it is, which GPU, how many slices and the GPU memory
    budget in MiB; none without a GPU. The disk watch's, on every server, with a GPU or
    without: whose it is, the disk budget in MiB and the safety line, each left out when 0;
    none when both are."""
    labels = {}
    if holding.gpu:
        labels[contract.USER_LABEL] = user
        labels[contract.GPU_LABEL] = holding.gpu
        labels[contract.SLICES_LABEL] = str(holding.slices)
        if holding.memory_mb:
            labels[contract.BUDGET_LABEL] = str(holding.memory_mb)
    if disk.budget_mb or disk.safety_percent:
        labels[contract.USER_LABEL] = user
    if disk.budget_mb:
        labels[contract.DISK_BUDGET_LABEL] = str(disk.budget_mb)
    if disk.safety_percent:
        labels[contract.DISK_SAFETY_LABEL] = str(disk.safety_percent)
    return labels


def gpu_env(holding: Holding) -> dict[str, str]:
    """What the server's environment says of its GPU (added to JupyterHub's own)."""
    if not holding.gpu:
        if holding.cpu_only:
            # no GPU at all, whatever the image or the machine's default runtime would give;
            # gpu-info: a server started without a GPU
            return {
                "NVIDIA_VISIBLE_DEVICES": "void",
                "CUDA_VISIBLE_DEVICES": "",
                "GPU_MODE": "none",
            }
        return {}
    env = {
        # the NVIDIA container runtime exposes only this device to the container
        "NVIDIA_VISIBLE_DEVICES": holding.gpu,
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        # CUDA accepts UUIDs too, so this stays right with or without the runtime
        "CUDA_VISIBLE_DEVICES": holding.gpu,
        "GPU_UUID": holding.gpu,
        "GPU_SLICES": str(holding.slices),
        "GPU_NODE": holding.node,
        "GPU_SIMULATED": "1" if contract.is_simulated(holding.gpu) else "0",
        # a MIG instance's memory and compute are its own; a GPU's slices share both
        "GPU_ISOLATION": "mig" if contract.is_mig(holding.gpu) else "shared",
        # TensorFlow otherwise grabs all memory of the GPU it shares with others
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    if holding.memory_mb:
        # the budget the GPU guard holds the server to (frameworks are capped below it)
        env["GPU_MEMORY_LIMIT_MB"] = str(holding.memory_mb)
    if holding.total_slices:
        # the share of the GPU's (or MIG instance's) memory the slices held stand for, for
        # frameworks that take a fraction (JAX, PyTorch)
        env["GPU_MEMORY_FRACTION"] = f"{min(holding.slices / holding.total_slices, 1):.3f}"
    return env


def mounts(
    volume_binds: dict[str, dict],
    home_folder: str = "",
    labels: dict | None = None,
    driver_config=None,
) -> list[Mount]:
    """Absolute sources are bind mounts; plain names are (labelled) named volumes; with a
    ``home_folder`` (on the shared storage of ``homes_dir``), it is the home.

    dockerspawner makes every entry of ``volumes`` a bind mount, which cannot express the
    per-user named volume a home directory needs. Volume names longer than Docker allows are
    shortened (``naming.fit``); ``jy-home-<user>`` of every GitHub login fits as it is.
    """
    made = []
    if home_folder:
        made.append(Mount(HOME_PATH, home_folder, type="bind"))
    for source, vol in volume_binds.items():
        if home_folder and vol["bind"] == HOME_PATH:
            continue  # the shared home takes the place of a volume there
        read_only = vol["mode"] == "ro"
        if os.path.isabs(source):
            made.append(Mount(vol["bind"], source, type="bind", read_only=read_only))
        else:
            made.append(
                Mount(
                    vol["bind"],
                    naming.volume_name(source),
                    type="volume",
                    read_only=read_only,
                    labels=dict(labels or {}),
                    driver_config=driver_config,
                )
            )
    return made
