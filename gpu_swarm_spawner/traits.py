"""GPUSwarmSpawner's settings: every configurable trait, its default and its check.

``GPUSwarmSpawner`` (spawner.py) inherits them, so ``c.GPUSwarmSpawner.<name>`` sets them; they
live here so that spawner.py reads as the spawn path. A trait that mirrors an organizer's number
setting takes its default and least value from the settings table
(``settings_table.number``), where that setting is declared. Renamed settings keep their old names
as deprecated aliases (as dockerspawner's ``_deprecated_aliases`` do).
"""

from __future__ import annotations

import os

from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    default,
    observe,
    validate,
)

from . import contract, naming, placement, profiles, settings_table
from .egress import INTERNET, EgressError, read_egress
from .internals import SpawnerInternals


def _with_advice(number_trait):
    """traitlets' ``Integer``/``Float`` with ``min=``, whose error says what to write instead."""

    class AtLeast(number_trait):
        def __init__(self, default_value, least, expected="", advice="", **kwargs):
            super().__init__(default_value, min=least, **kwargs)
            self.expected = expected or f"{least} or more"
            self.advice = advice

        def validate(self, obj, value):
            try:
                return super().validate(obj, value)
            except TraitError:
                if not isinstance(value, (int, float)) or value >= self.min:
                    raise
                raise TraitError(
                    f"{type(obj).__name__}.{self.name} must be {self.expected}, got {value}"
                    + (f"; {self.advice}" if self.advice else "")
                ) from None

    return AtLeast


_AtLeast = _with_advice(Integer)
_FloatAtLeast = _with_advice(Float)


class _OneOf(Enum):
    """traitlets' ``Enum`` whose error lists the words to write."""

    def error(self, obj, value, error=None, info=None):
        raise TraitError(
            f"{type(obj).__name__}.{self.name} is {value!r}; write one of: {', '.join(self.values)}"
        )


class GPUSwarmSpawnerTraits(SpawnerInternals):
    """The configuration of ``GPUSwarmSpawner``."""

    # ---- configuration ----------------------------------------------------------------------

    slices_per_server = _AtLeast(
        *settings_table.number("GPUHUB_SLICES_PER_SERVER"),
        advice="every server needs a slice (use 1 for a shared GPU)",
        config=True,
        help="""
        How many slices of one GPU each server reserves. A GPU advertised as 3 slices holds
        three 1-slice servers. All slices of a server always come from the same GPU; a "full
        GPU" (``full_gpu_for``) takes all slices of the GPU it lands on instead. Example:
        ``c.GPUSwarmSpawner.slices_per_server = 1``.
        """,
    )

    full_gpu_for = _OneOf(
        profiles.FULL_GPU_FOR,
        default_value="off",
        config=True,
        help="""
        Who may choose a full GPU on the spawn page: ``off`` (nobody), ``admins`` or ``all``.
        A full GPU is every slice of one GPU that nobody else uses, however many slices that
        GPU is advertised as (it is counted when the GPU is chosen).
        """,
    )

    placement_policy = _OneOf(
        placement.POLICIES,
        default_value="spread",
        config=True,
        help="""
        How a GPU is chosen for a new server: ``spread`` (the GPU with most free slices, so each
        participant shares a GPU with as few others as possible) or ``pack`` (the busiest GPU
        that still fits, so whole machines can be emptied and switched off).
        """,
    )

    prefer_home_node = Bool(
        True,
        config=True,
        help="""
        Start a returning user's server on the machine that ran their previous one when a GPU
        there has room: home volumes (``jy-home-<user>``) are local to a machine, so elsewhere
        the user would find an empty home. Not used with ``homes_dir`` (every machine has
        every home); turn it off when Docker's volumes themselves are on shared storage.
        """,
    )

    homes_dir = Unicode(
        "",
        config=True,
        help="""
        A folder on storage that every machine mounts at this same path (NFS, AWS EFS), e.g.
        ``/srv/homes``: each participant's home is then its folder ``<homes_dir>/<escaped
        username>``, bind-mounted at ``/home/jovyan`` in place of any ``volumes`` entry there,
        and a participant whose machine is gone starts elsewhere with every file. The hub must
        see the folder at the same path (the stack mounts it: ``GPUHUB_HOMES_DIR``): it makes
        a participant's folder (owner uid 1000, gid 100, mode 0700) before their first server
        starts. ``prefer_home_node`` is not used then. "" (default): homes are the per-machine
        volumes of ``volumes``.
        """,
    )

    @validate("homes_dir")
    def _validate_homes_dir(self, proposal):
        value = proposal["value"]
        if value and (not value.startswith("/") or os.path.normpath(value) == "/"):
            raise TraitError(
                f"homes_dir must be an absolute path of a folder on shared storage, such as "
                f"/srv/homes, got {value!r}"
            )
        return os.path.normpath(value) if value else ""

    egress = Unicode(
        INTERNET,
        config=True,
        help="""
        What a participant's server may reach beyond the hub (gpu_swarm_spawner/egress.py,
        docs/participants.md): ``internet`` (default: every public address, no private or
        link-local one, so no cloud metadata service), ``none`` (nothing), or a list of host
        names, IPv4 addresses or ranges, each with an optional TCP port, separated by spaces,
        e.g. ``pypi.org files.pythonhosted.org:443 10.2.0.0/16``. Whatever it says, a server
        reaches on the servers' network only the proxy's public port, takes connections only
        on its own port, and never reaches the swarm's machines or 169.254.0.0/16. The server's
        container applies these rules to itself before JupyterLab starts (``gpuhub-firewall``
        in the single-user image). ``off``: no firewall in the servers, for an image without
        ``gpuhub-firewall`` only.
        """,
    )

    @validate("egress")
    def _validate_egress(self, proposal):
        try:
            return read_egress(proposal.value).written()
        except EgressError as e:
            raise TraitError(f"GPUSwarmSpawner.egress: {e}") from None

    gpu_kind_prefixes = List(
        Unicode(),
        default_value=list(contract.KIND_PREFIXES),
        minlen=1,
        config=True,
        help="""
        Generic-resource kinds that start with one of these are GPUs (or MIG instances); the
        whole kind is the UUID handed to the container. The worker setup advertises kinds like
        ``GPU-8d2c6f1e-...=3`` for a GPU and ``MIG-4b1e0c9a-...=1`` for each MIG instance of a
        GPU in MIG mode. Default: ``["GPU-", "MIG-"]``; ``["GPU-"]`` leaves MIG instances
        unused. Read once, when the hub's GPU broker is made (its first spawn).
        """,
    )

    @validate("gpu_kind_prefixes")
    def _validate_gpu_kind_prefixes(self, proposal):
        if not proposal.value or not all(p.strip() for p in proposal.value):
            raise TraitError(
                f"GPUSwarmSpawner.gpu_kind_prefixes is {proposal.value!r}: each prefix selects "
                "generic resources that are GPUs and none may be empty; leave it at the "
                "default ['GPU-', 'MIG-']"
            )
        return list(proposal.value)

    gpu_kind_prefix = Unicode(
        config=True,
        help="""
        Deprecated: use ``gpu_kind_prefixes`` (a list). Setting it makes that one prefix the
        only one, e.g. ``"GPU-"`` leaves MIG instances unused.
        """,
    )

    @validate("gpu_kind_prefix")
    def _validate_gpu_kind_prefix(self, proposal):
        if not proposal.value.strip():
            raise TraitError(
                "GPUSwarmSpawner.gpu_kind_prefix must not be empty: it selects which "
                "generic resources are GPUs; leave it out (gpu_kind_prefixes defaults to "
                "['GPU-', 'MIG-'])"
            )
        return proposal.value

    @observe("gpu_kind_prefix")
    def _gpu_kind_prefix_renamed(self, change):
        # a str became a list: the _renamed_traits table copies values as they are
        if self.gpu_kind_prefixes != [change.new]:
            self.log.warning(
                "%s.gpu_kind_prefix is deprecated since gpu-jupyterhub 0.2; use "
                "%s.gpu_kind_prefixes = [%r] instead",
                type(self).__name__,
                type(self).__name__,
                change.new,
            )
            self.gpu_kind_prefixes = [change.new]

    placement_attempts = _AtLeast(
        5,
        least=1,
        config=True,
        help="""
        How many GPUs a spawn tries when it loses the race for a slice (another server took it
        between reading the inventory and Swarm placing the service) before it gives up with
        the "no slice free" message. Each lost race costs about the task poll interval.
        """,
    )

    task_poll_interval = Float(
        0.2,
        config=True,
        help="""
        Seconds between the first checks of a new service's task (the delay then grows by half
        each time, up to 2 s). Small values notice a lost slice race or a started container
        sooner, at the cost of more Docker API calls. Default 0.2.
        """,
    )

    server_shutdown_timeout = Float(
        10.0,
        config=True,
        help="""
        Seconds a stopping server gets to shut itself down (through its own API) before its
        service is removed anyway. A server that shuts itself down frees its GPU slices about
        3 s sooner than one whose service is removed while it runs (Swarm first waits 2 s,
        then signals it), so the next in line starts sooner. A server that refuses or does not
        answer is removed at once. 0: remove the service at once, as SwarmSpawner does.
        """,
    )

    docker_api_threads = _AtLeast(
        *settings_table.number("GPUHUB_DOCKER_API_THREADS"),
        config=True,
        help="""
        Threads for blocking Docker API calls, shared by all servers of the hub
        (dockerspawner gives each spawner class one thread). A few threads keep one slow call
        (a busy manager, a large listing) from holding up every other participant's spawn;
        many threads mostly add load on the manager. On the 3-node test bed 1, 2, 4 and 16
        threads gave the same figures for 50 simultaneous spawns (see ``make bench``).
        Read once, when the hub's GPU broker is made (its first spawn): takes effect at hub
        start.
        """,
    )

    inventory_max_age = _FloatAtLeast(
        1.0,
        least=0,
        expected="0 or more seconds",
        config=True,
        help="""
        Seconds a read of the swarm's nodes and tasks is reused by other spawns (reads in
        flight are always shared). Under a burst this keeps refusals instant and the manager
        unloaded; a slice freed within that time is seen by the next read. 0: a read per spawn
        unless one is in flight. Default 1. Read once, when the hub's GPU broker is made.
        """,
    )

    poll_read_max_age = _FloatAtLeast(
        10.0,
        least=0,
        expected="0 or more seconds",
        config=True,
        help="""
        Seconds a read of the swarm (all nodes and tasks) may serve the servers' polls: a
        server whose task that read shows running on a ready node is running, with no Docker
        call of its own; anything else is checked with the server's own calls, as before.
        With 500 servers polled every ``poll_interval`` this replaces about 1500 Docker calls
        per interval with a few reads. 0: every poll makes its own calls (dockerspawner's way).
        Default 10.
        """,
    )

    hub_data_dir = Unicode(
        "",
        config=True,
        help="""
        The hub's data folder (its database, the dashboard's events). While the file system
        holding it has less than ``hub_data_min_free_mb`` free, every start is refused with a
        message that says so (the participant: "the hub's disk is full", the organizer in the
        log: how much is free and where), before JupyterHub writes anything for the spawn, so
        its database stays as it was. "": not checked.
        """,
    )
    hub_data_min_free_mb = _AtLeast(
        32,
        least=0,
        config=True,
        help="MiB the hub's data folder (``hub_data_dir``) must have free for a start. Default 32.",
    )

    server_lost_after = _FloatAtLeast(
        30.0,
        least=0,
        expected="0 or more seconds",
        config=True,
        help="""
        Seconds a server may be away before the hub takes it for stopped, while Swarm is
        bringing it back: its container is being replaced (its machine's engine restarted),
        its machine does not answer the manager, or its new task waits to be placed. Until
        then ``poll`` answers "running" (the participant's route stays; the hub does not free
        or refuse the slices it holds); a server back sooner goes on at its new address. Once
        this has passed, the server is reported stopped and its service removed, so its
        participant can start again elsewhere (with shared homes, with every file). Also how
        long the hub, after a restart of its own, waits for such a server before checking it
        answers. 0: at once, as dockerspawner does. Default 30.
        """,
    )

    fleet = Bool(
        False,
        config=True,
        help="""
        The hub's fleet keeper asks the cloud for GPU machines while people wait
        (``GPUHUB_FLEET=on``; fleet.py): a participant whom no GPU of the swarm could hold,
        with no GPU machine connected at all say, may then wait in line for a machine that
        comes, instead of being refused.
        """,
    )

    cpu_only_servers = Bool(
        True,
        config=True,
        help="""
        Offer servers without a GPU (CPU only): on the refusal and the waiting line's page when
        the GPUs are full, and as a choice on the spawn page when it has a form anyway (several
        environments, or a full GPU offered). Such a server reserves no slice,
        sees no GPU, and runs on a GPU machine (the one with the participant's home when
        there is one), so a later restart with a GPU finds the same home. The usual CPU and
        memory limits apply.
        """,
    )

    cpu_only_max_servers = _AtLeast(
        *settings_table.number("GPUHUB_CPU_ONLY_MAX"),
        expected="0 (no limit) or more",
        advice="write a number of servers such as 20",
        config=True,
        help="""
        The most servers without a GPU running at once; the next participant asking for one
        is told so. 0: no limit.
        """,
    )

    disk_budget_gb = Float(
        0.0,
        config=True,
        help="""
        GiB each participant's home and scratch space (what their server writes outside the
        home: its container's writable layer) may hold together, e.g. 20 or 2.5. Every server's
        container carries it (``contract.DISK_BUDGET_LABEL``, in MiB) for the disk watch of its
        machine, which warns the participant in JupyterLab past it; nothing is stopped for
        that. 0 (default): no budget.
        """,
    )

    @validate("disk_budget_gb")
    def _validate_disk_budget_gb(self, proposal):
        value = proposal.value
        if not 0 <= value <= contract.DISK_BUDGET_MAX_GB:
            raise TraitError(
                f"GPUSwarmSpawner.disk_budget_gb is {value!r}; write the GiB each participant "
                f"may use, from 0 (no budget) to {contract.DISK_BUDGET_MAX_GB}, e.g. 20"
            )
        return value

    disk_safety_percent = Integer(
        0,
        config=True,
        help="""
        The safety line of the file systems holding homes and servers' scratch space, in
        percent of each one's size, e.g. 90: every server's container carries it
        (``contract.DISK_SAFETY_LABEL``), and the disk watch of a machine whose file system is
        fuller than that stops the server that wrote the most there (its files kept). The hub
        then tells its participant why on their page (``failure_message``) and lists the stop
        on the dashboard (gpu_swarm_spawner/disk.py, which jupyterhub_config.py starts when
        this is not 0). 50 to 99, or 0 (default): no safety line.
        """,
    )

    @validate("disk_safety_percent")
    def _validate_disk_safety_percent(self, proposal):
        value = proposal.value
        low, high = contract.DISK_SAFETY_RANGE
        if value != 0 and not low <= value <= high:
            raise TraitError(
                f"GPUSwarmSpawner.disk_safety_percent is {value!r}; write a percentage from "
                f"{low} to {high}, e.g. 90, or 0 for no safety line"
            )
        return value

    waiting_line = Enum(
        ["off", "offer", "auto"],
        default_value="offer",
        config=True,
        help="""
        When no GPU has room for a participant: ``offer`` (the default) tells them so at once
        and offers to wait in line (a button on the refusal); ``auto`` puts them in the line
        straight away; ``off`` only tells them. In the line the spawn page shows their place
        and an estimate, and their server starts by itself when slices free up, in order of
        arrival (the rule for full-GPU requests is in ``gpu_swarm_spawner/line.py`` and
        docs/line.md). Nobody in the line holds a service or a slice. Each waiting participant is a
        pending spawn for JupyterHub: keep ``c.JupyterHub.concurrent_spawn_limit`` above the
        longest line you expect.
        """,
    )

    line_max_length = _AtLeast(
        *settings_table.number("GPUHUB_LINE_MAX_LENGTH"),
        expected="0 (no limit) or more",
        advice="write a number of participants such as 100",
        config=True,
        help="""
        The most participants waiting in the line at once; whoever comes next is told the
        line is full. 0: no limit.
        """,
    )

    line_max_wait = _AtLeast(
        *settings_table.number("GPUHUB_LINE_MAX_WAIT"),
        expected="0 (no limit) or more seconds",
        advice="write a number of seconds such as 3600",
        config=True,
        help="""
        Seconds a participant may wait in the line; then they leave it with a message saying
        so. 0: no limit. JupyterHub's ``start_timeout`` is lengthened by this much while the
        line is on (the spawn includes the wait); the server's own start keeps its
        ``start_timeout``.
        """,
    )

    line_interval = _FloatAtLeast(
        2.0,
        least=0.1,
        expected="0.1 or more seconds",
        config=True,
        help="""
        Seconds between the line's looks at the swarm while anyone waits (a server stopped by
        this hub is looked at at once). Read once, when the hub's GPU broker is made.
        """,
    )

    dashboard_dir = Unicode(
        "",
        config=True,
        help="""
        Folder where the hub writes what the organizer's dashboard reads (``events.py``):
        ``events.jsonl`` (servers started with their durations, refusals and failures with
        the reason the participant read, stops, joins and departures of the waiting line) and
        ``line.json`` (the waiting line now). Made if missing. "": nothing is written.
        """,
    )

    probe_server = Bool(
        True,
        config=True,
        help="""
        After the container runs, wait until the server accepts connections where the hub will
        connect to it (``get_ip_and_port``: the task's address on the overlay network; the
        service name with ``use_internal_hostname``; ``host_ip`` and the published port with
        ``use_internal_ip = False``) before handing it to the hub (probes every 0.05 s, at most
        ``http_timeout``). Spawns then finish as soon as the server listens, instead of after
        the hub's backed-off checks. Turn off only where the hub cannot reach that address.
        """,
    )

    service_labels = Dict(
        config=True,
        help="""
        Labels put on every user service and home volume, e.g.
        ``{"gpu-jupyterhub.stack": "gpuhub"}``; ``make down`` finds what to remove by them.
        """,
    )

    pids_limit = _AtLeast(
        0,
        least=0,
        expected="0 (no limit) or more",
        advice="write a number of processes such as 2048",
        config=True,
        help="""
        The most processes (and threads) a server may run at once, e.g. ``2048``: a fork bomb
        or a runaway data loader then stops there instead of exhausting the machine that other
        participants share. 0: no limit. Needs Docker 20.10 (API 1.41) on the swarm's
        managers and GPU machines. Leave room for the frameworks: every thread counts, and
        PyTorch's data loaders start a process per worker.
        """,
    )

    # Renamed settings: {old name: (new name, version)}, copied across with a warning when they
    # differ (dockerspawner's ``_deprecated_aliases``, kept apart from its table).
    _renamed_traits = {"gpu_slices": ("slices_per_server", "0.2")}

    gpu_slices = Integer(config=True, help="Deprecated: use ``slices_per_server``.")

    @observe(*_renamed_traits)
    def _renamed_trait(self, change):
        new_name, version = self._renamed_traits[change.name]
        if getattr(self, new_name) != change.new:
            self.log.warning(
                "%s.%s is deprecated since gpu-jupyterhub %s; use %s.%s instead",
                type(self).__name__,
                change.name,
                version,
                type(self).__name__,
                new_name,
            )
            setattr(self, new_name, change.new)

    full_gpu_slices = Integer(
        config=True,
        help="""
        Deprecated and ignored: a full GPU is now all slices of the GPU it lands on, counted
        at placement (a large GPU may have more slices than a small one). Use ``full_gpu_for``.
        """,
    )

    @observe("full_gpu_slices")
    def _full_gpu_slices_ignored(self, change):
        self.log.warning(
            "%s.full_gpu_slices is deprecated and ignored: a full GPU takes all slices of the "
            "GPU chosen for it. Set %s.full_gpu_for (off, admins or all) instead.",
            type(self).__name__,
            type(self).__name__,
        )
        if change.new > 0 and self.full_gpu_for == "off":
            self.full_gpu_for = "admins"  # what full_gpu_slices > 0 offered before

    @default("prefix")
    def _default_prefix(self):
        # services are named jy-<escaped username>[--<server name>]
        return contract.SERVICE_PREFIX

    def fitted_object_name(self) -> str:
        """dockerspawner's name (``jy-<escaped user>[--<server>]``) fitted into a Swarm service
        name: unchanged where it fits (so running servers are found again), else cut and ended
        with a hash of the whole name (``naming.fit``). ``object_name``'s default, which
        dockerspawner asks again when the image changes (``internals.SpawnerInternals``)."""
        return naming.service_name(self.dockerspawner_object_name())

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        # the hub sits on the same attachable overlay and reaches servers at their task's address
        return True

    @default("extra_endpoint_spec")
    def _default_extra_endpoint_spec(self):
        # DNS round robin: works without IPVS and is all a single-task service needs. A port
        # published for a hub that does not use internal IPs needs the routing mesh's virtual
        # IP instead: Swarm refuses ingress ports with dnsrr.
        return {"mode": "dnsrr"} if self.use_internal_ip else {}
