"""Every organizer setting, declared once: its name, its default, how it is read (its reader,
range and choices), its documentation, which of the stack's services get it in their
environment, and the trait it sets when it is one trait's value as it is.

This table drives everything a setting used to be written into by hand:

- ``deploy/settings.env`` (the defaults file the settings reader reads, shipped in the hub's
  image) and ``docs/configuration.md``, written from it by ``make docs`` (``python -m
  deploy.reference``; ``--check``, which the unit tests run, fails on a stale file);
- the checks of ``make up`` and ``make demo`` (``deploy.settings.problems``: each number's range
  and each word's choices; the checks across settings stay code there);
- ``deploy.settings.Config``: one typed attribute per setting (``cfg.line_max_wait``), read with
  the reader named here;
- the ``environment:`` of the hub, the tutorial sync, Prometheus and the HTTPS gateway in
  ``deploy/stack*.yml``, also written by ``make docs`` (what ``docker stack deploy``
  interpolates is unchanged);
- ``jupyterhub_config.py``, which sets each ``trait`` from its setting in one loop;
- the defaults and least values of the spawner's traits that mirror a setting (traits.py).

Adding a setting is one ``Setting(...)`` here, then ``make docs``. Standard library only (of the
project it imports the contract, which is too): the deploy tool reads it with the system
python3 before anything is installed, and the spawner's traits read it in the hub. The docs are
settings.env's comments line for line, so their lines may be as long as that file's.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass

from .contract import MAX_SLICES_PER_GPU

#: Where a setting may go: the services of the stack files whose ``environment:`` lists it,
#: as (stack file, service).
ENVIRONMENTS = {
    "hub": ("stack.yml", "hub"),
    "hub-github": ("stack.github.yml", "hub"),
    "tutorial-sync": ("stack.yml", "tutorial-sync"),
    "prometheus": ("stack.yml", "prometheus"),
    "gateway": ("stack.tls.yml", "gateway"),
}

#: Config's type for each reader (``Setting.read``); deploy/settings.py's READERS holds the
#: functions (they need the deploy tool's parsers).
TYPES = {
    "text": "str",
    "number": "int",
    "flag": "bool",
    "on": "bool",
    "usernames": "list[str]",
    "organizations": "list[str]",
    "hostname": "str",
    "environments": "dict[str, str]",
    "cores": "float | None",  # cores; None: no limit
    "memory": "int | None",  # bytes; None: no limit
    "tasks": "int | None",  # tasks; 0 or None: no limit
    "egress": "Egress",  # what the servers may reach (gpu_swarm_spawner.egress)
    "repos": "list[Repo]",  # the sync service's reader (tutorial_sync.repos)
    "guard_number": "float",  # the guard's reader (contract.guard_number)
    "disk_budget": "float",  # GiB; 0: no budget
    "disk_safety": "int",  # percent; 0: no safety line
    "price": "float | None",  # a machine-hour's price; None: none given
    "mounts": "tuple[Mount, ...]",  # the commands' container's folders (provider_settings)
    "command_env": "dict[str, str]",  # the commands' variables (provider_settings)
}


@dataclass(frozen=True)
class Setting:
    """One setting. ``default`` is its line's value in settings.env (``${GPUHUB_X}`` refers to
    an earlier one); ``doc`` the comment above it there ("": documented with the one before);
    ``read`` how Config reads it (``TYPES``); ``low``/``high`` the range of a ``number``
    (``high`` None: no upper bound); ``choices`` the words it may be; ``to`` the services whose
    environment passes it (``ENVIRONMENTS``); ``trait`` "Class.trait" that
    jupyterhub_config.py sets to its value; ``by_deploy``: the deploy steps fill it in (a config
    file may not set it); ``group``: the title of the group it stands in (``GROUPS``; "": the
    first one)."""

    name: str
    default: str
    read: str = "text"
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()
    to: tuple[str, ...] = ()
    trait: str = ""
    by_deploy: bool = False
    group: str = ""
    doc: str = ""

    @property
    def attribute(self) -> str:
        """Config's attribute: GPUHUB_LINE_MAX_WAIT -> line_max_wait."""
        return self.name.removeprefix("GPUHUB_").lower()

    @property
    def type(self) -> str:
        return TYPES[self.read]

    @property
    def comment(self) -> list[str]:
        """``doc``'s lines, as settings.env writes them above the setting."""
        text = textwrap.dedent(self.doc).strip("\n")
        return [f"# {line}" if line else "#" for line in text.split("\n")] if text else []


#: The comment that opens settings.env (and docs/configuration.md).
INTRODUCTION = """\
Every setting, with the demo's defaults. Precedence: the environment (e.g.
`GPUHUB_HTTP_PORT=8080 make demo`), then the organizer's config file (`make up CONFIG=FILE`,
default ./config.env; commented example: deploy/config.example.env), then this file.
One reader takes all three (deploy/settings.py's read(), which the deploy, the worker setup
and jupyterhub_config.py share; `python -m deploy settings` prints the result) in the config
file's format (its rules are at the top of deploy/config.example.env); only these defaults may
refer to earlier settings, as ${GPUHUB_X}. Each GPUHUB_X is also the attribute x of the typed
settings (deploy.settings.Config), e.g. GPUHUB_SLICES_PER_SERVER is cfg.slices_per_server.
The environment passes the file's checks: a GPUHUB_* variable that is no setting is refused
(with the one it may mean), as is a value in typographic quotes; `make up` and `make demo` say
which settings the environment gave (secrets as ***).
Written by `make docs` from gpu_swarm_spawner/settings_table.py: edit that, not this file.
"""

#: The group of the settings the deploy steps fill in, and what settings.env says of it.
BY_DEPLOY_TITLE = "filled in while deploying"
BY_DEPLOY_NOTE = """\
Not the organizer's: the deploy steps set these to what they find (a config file that sets one
is refused), for the stack files and the hub's environment. The values here stand in until then.
"""

#: The least GPUHUB_FLEET_STOP_IDLE_AFTER but 0 (off): a smaller number was meant as minutes.
FLEET_STOP_IDLE_LEAST_S = 60

#: The groups of settings after the first, and what settings.env says of each (the deploy's own
#: group, last, is ``BY_DEPLOY_TITLE``).
FLEET = "GPU machines that follow the day (GPUHUB_FLEET)"
GROUPS = {
    FLEET: """\
The hub asks the cloud for GPU machines when people wait in line (or the schedule says so) and
gives back machines that stood empty, through two commands of yours that resize the cloud's
group of machines (docs/autoscaling.md; ready recipes for AWS, Google Cloud and Azure in
docs/providers/). Checked only with GPUHUB_FLEET=on; with off nothing of it runs, and these
settings may stay as they are.
""",
}

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "GPUHUB_STACK",
        "gpuhub",
        to=("hub",),
        trait="CPUPriority.stack",
        doc="""
        Name of the Swarm stack; also labels every user service and home volume it creates.
        """,
    ),
    Setting(
        "GPUHUB_HTTP_PORT",
        "8000",
        read="number",
        low=1,
        high=65535,
        to=("gateway",),
        doc="""
        Port the proxy publishes on the manager (host mode).
        """,
    ),
    Setting(
        "GPUHUB_NETWORK",
        "jhub",
        to=("hub",),
        trait="SwarmSpawner.network_name",
        doc="""
        Attachable overlay network shared by the hub, the proxy and the user servers.
        """,
    ),
    Setting(
        "GPUHUB_NETWORK_SUBNET",
        "",
        doc="""
        Its address range: one address per server, so its size bounds how many run at once. Empty:
        from the swarm's pool (a swarm `make demo`/`make up` makes gives /20 ranges, about 4000
        servers; Docker's own default is /24, about 250). For more, or a fixed range, write one
        that nothing else on the machines uses, e.g. 10.120.0.0/20.
        """,
    ),
    Setting(
        "GPUHUB_BASE_IMAGE",
        "gpu-jupyterhub/base:bookworm",
        doc="""
        Images. GPUHUB_BASE_IMAGE is built locally from Debian (no registry) unless you point it at a
        public image, e.g. quay.io/jupyter/pytorch-notebook:cuda12-latest.
        """,
    ),
    Setting(
        "GPUHUB_HUB_IMAGE",
        "gpu-jupyterhub/hub:latest",
    ),
    Setting(
        "GPUHUB_SINGLEUSER_IMAGE",
        "gpu-jupyterhub/singleuser:latest",
        to=("hub",),
        trait="SwarmSpawner.image",
    ),
    Setting(
        "GPUHUB_SLICES_PER_GPU",
        "3",
        read="number",
        low=1,
        high=MAX_SLICES_PER_GPU,
        to=("hub",),
        doc="""
        Each GPU of this machine is advertised to Swarm as this many slices.
        """,
    ),
    Setting(
        "GPUHUB_SIMULATE_IF_NO_GPU",
        "2",
        read="number",
        low=0,
        high=16,
        doc="""
        How many simulated GPUs to advertise when this machine has no NVIDIA GPU. 0: `make demo`
        refuses; `make up` then advertises no slices here (the manager only runs the hub). `make up`
        takes 0 unless its config file (or the environment) sets this: participants would otherwise
        be given simulated GPUs as if they were real.
        """,
    ),
    Setting(
        "GPUHUB_NAMED_SLOTS",
        "",
        to=("hub",),
        doc="""
        Also advertise every slice as a named slot of this kind (e.g. NVIDIA-GPU), for a stock
        dockerspawner.SwarmSpawner asking for {"generic_resources": {"NVIDIA-GPU": 1}} as in the
        original workshop. Only `make bench` sets it, to measure that baseline. Empty: off.
        """,
    ),
    Setting(
        "GPUHUB_SPAWNER",
        "gpu",
        choices=("gpu", "stock-swarm"),
        to=("hub",),
        doc="""
        Which spawner the hub uses: gpu (GPUSwarmSpawner) or stock-swarm (dockerspawner's
        SwarmSpawner reserving one named slot, the benchmark's baseline; needs GPUHUB_NAMED_SLOTS).
        """,
    ),
    Setting(
        "GPUHUB_START_TIMEOUT",
        "120",
        read="number",
        low=10,
        to=("hub",),
        trait="SwarmSpawner.start_timeout",
        doc="""
        Seconds a server may take to start before the hub gives up on it.
        """,
    ),
    Setting(
        "GPUHUB_DOCKER_API_THREADS",
        "4",
        read="number",
        low=1,
        high=64,
        to=("hub",),
        trait="GPUSwarmSpawner.docker_api_threads",
        doc="""
        Threads for the hub's Docker API calls (dockerspawner uses 1).
        """,
    ),
    Setting(
        "GPUHUB_HUB_CPU_SHARES",
        "16384",
        read="number",
        low=0,
        high=262144,
        to=("hub",),
        trait="CPUPriority.cpu_shares",
        doc="""
        CPU weight (docker --cpu-shares) the hub gives its own container and the proxy's, on its machine;
        servers have Docker's default 1024. On a manager that also runs servers, the hub then answers
        quickly while many start. 0: Docker's default (the hub weighs as one server).
        """,
    ),
    Setting(
        "GPUHUB_SLICES_PER_SERVER",
        "1",
        read="number",
        low=1,
        high=MAX_SLICES_PER_GPU,
        to=("hub",),
        trait="GPUSwarmSpawner.slices_per_server",
        doc="""
        Slices each server reserves (at most GPUHUB_SLICES_PER_GPU; formerly GPUHUB_GPU_SLICES, which
        is still read, with a warning), and how a GPU is chosen (spread | pack).
        """,
    ),
    Setting(
        "GPUHUB_PLACEMENT",
        "spread",
        choices=("spread", "pack"),
        to=("hub",),
        trait="GPUSwarmSpawner.placement_policy",
    ),
    Setting(
        "GPUHUB_POLL_INTERVAL",
        "30",
        read="number",
        low=1,
        to=("hub",),
        trait="SwarmSpawner.poll_interval",
        doc="""
        Seconds between the hub's checks that each server still runs (a server on a machine that
        disappeared is reported stopped at the next check).
        """,
    ),
    Setting(
        "GPUHUB_ADMIN_USERS",
        "admin",
        read="usernames",
        to=("hub",),
        doc="""
        Admin usernames (GitHub logins with GPUHUB_AUTH=github), separated by commas or blanks. Taken
        as the hub matches logins: in lower case, and @ada or https://github.com/ada is the login ada.
        """,
    ),
    Setting(
        "GPUHUB_AUTH",
        "local",
        choices=("github", "local"),
        to=("hub",),
        doc="""
        Who may log in: local (one shared password, generated: the demo) or github.
        """,
    ),
    Setting(
        "GPUHUB_GITHUB_CLIENT_ID",
        "",
        to=("hub-github",),
        trait="WorkshopGitHubOAuthenticator.client_id",
        doc="""
        GitHub login (GPUHUB_AUTH=github). Register an OAuth app at
        https://github.com/settings/developers with the callback URL https://<hostname>/hub/oauth_callback.
        """,
    ),
    Setting(
        "GPUHUB_GITHUB_CLIENT_SECRET",
        "",
        doc="""
        The OAuth app's client secret, or a file holding only it (kept as a Docker secret either way).
        The file must be private (chmod 600: refused if its group or others may read it) and plain
        text (a final line end is fine; UTF-16 is refused). A relative path is taken from the config
        file's folder (set in the environment: from the current folder), as are GPUHUB_ROSTER,
        GPUHUB_TLS_CERT and GPUHUB_TLS_KEY.
        """,
    ),
    Setting(
        "GPUHUB_GITHUB_CLIENT_SECRET_FILE",
        "",
    ),
    Setting(
        "GPUHUB_GITHUB_URL",
        "https://github.com",
        to=("hub-github",),
        trait="WorkshopGitHubOAuthenticator.github_url",
        doc="""
        GitHub itself, or a GitHub Enterprise server (its API is then at <url>/api/v3).
        """,
    ),
    Setting(
        "GPUHUB_ALLOWED_ORGS",
        "",
        read="organizations",
        to=("hub-github",),
        doc="""
        Organizations and teams whose members may log in: ORG, or ORG:TEAM with the team's slug (the
        end of its page's address, https://github.com/orgs/ORG/teams/SLUG: lower case, hyphens for
        blanks), e.g. "my-org, my-org:teaching-assistants". Separated by commas, or by blanks where no
        team is followed by a bare organization; a team's display name ("my-org:Teaching Assistants")
        is refused with its slug. @ORG/TEAM and the team's page address are taken too.
        """,
    ),
    Setting(
        "GPUHUB_ROSTER",
        "",
        doc="""
        A file of GitHub usernames who may log in (one per line, or a registration export with a
        GitHub column: docs/input-roster.md); reload it after editing with `make roster`.
        """,
    ),
    Setting(
        "GPUHUB_ACCESS_CHECK_INTERVAL",
        "30",
        read="number",
        low=0,
        high=3600,
        to=("hub-github",),
        trait="WorkshopGitHubOAuthenticator.access_check_interval",
        doc="""
        Seconds between the hub's checks that everyone with a server or a recent login may still be
        here (on the roster, or a member of GPUHUB_ALLOWED_ORGS, asked of GitHub with their own token):
        someone taken off the roster, the team or the organization has their logins ended and their
        server stopped (files kept) within this plus a few seconds. 0: only at their next login.
        """,
    ),
    Setting(
        "GPUHUB_HOSTNAME",
        "",
        read="hostname",
        to=("gateway",),
        doc="""
        The hub's public name (DNS name or IP address); `make up` needs it. Taken in lower case; an
        internationalized name must be written in its xn-- form (the message gives it); no final dot,
        scheme, path or port. An IPv6 address (with or without brackets) only with GPUHUB_AUTH=local
        and GPUHUB_TLS=off (GitHub's callback check and the HTTPS gateway want a DNS name).
        """,
    ),
    Setting(
        "GPUHUB_TLS",
        "off",
        choices=("acme", "self-signed", "files", "off"),
        to=("gateway",),
        doc="""
        HTTPS at the gateway: acme (automatic certificates; the hostname must be public and ports 80 and
        443 reachable), self-signed (generated), files (GPUHUB_TLS_CERT, GPUHUB_TLS_KEY: PEM files), or
        off (plain HTTP on GPUHUB_HTTP_PORT: the demo, or behind your own TLS proxy).
        """,
    ),
    Setting(
        "GPUHUB_TLS_CERT",
        "",
    ),
    Setting(
        "GPUHUB_TLS_KEY",
        "",
    ),
    Setting(
        "GPUHUB_ACME_EMAIL",
        "",
        to=("gateway",),
        doc="""
        Contact address for the certificate authority (GPUHUB_TLS=acme; optional).
        """,
    ),
    Setting(
        "GPUHUB_HTTPS_PORT",
        "443",
        read="number",
        low=1,
        high=65535,
        to=("gateway",),
        doc="""
        Port of the HTTPS gateway (with GPUHUB_TLS other than off; GPUHUB_HTTP_PORT then redirects to it).
        """,
    ),
    Setting(
        "GPUHUB_REGISTRY_PORT",
        "5000",
        read="number",
        low=1,
        high=65535,
        doc="""
        `make up` runs an image registry on the manager at this port, from which the GPU machines pull
        the single-user images.
        """,
    ),
    Setting(
        "GPUHUB_ENVIRONMENTS",
        "",
        read="environments",
        to=("hub",),
        doc="""
        Environments offered on the spawn page, space-separated NAME=IMAGE (the first is the default),
        e.g. "PyTorch=gpu-jupyterhub/pytorch:latest TensorFlow=gpu-jupyterhub/tensorflow:latest".
        An image gpu-jupyterhub/X:TAG is built from images/X/Dockerfile when that exists. Empty: the
        single-user image only.
        """,
    ),
    Setting(
        "GPUHUB_FULL_GPU",
        "admins",
        choices=("admins", "all", "off"),
        to=("hub",),
        trait="GPUSwarmSpawner.full_gpu_for",
        doc="""
        Who may choose a "full GPU" (all slices of one GPU) on the spawn page: admins, all or off.
        """,
    ),
    Setting(
        "GPUHUB_WAITING_LINE",
        "offer",
        choices=("offer", "auto", "off"),
        to=("hub",),
        trait="GPUSwarmSpawner.waiting_line",
        doc="""
        When every GPU slice is taken: offer (refuse at once, with a button to wait in line), auto
        (wait in line at once) or off (refuse only). In line the spawn page shows the participant's
        place; their server starts by itself when a slice frees up, in order of arrival. At most
        GPUHUB_LINE_MAX_LENGTH wait at once (0: no limit), each at most GPUHUB_LINE_MAX_WAIT seconds
        (0: no limit); then they are told so.
        """,
    ),
    Setting(
        "GPUHUB_LINE_MAX_LENGTH",
        "0",
        read="number",
        low=0,
        to=("hub",),
        trait="GPUSwarmSpawner.line_max_length",
    ),
    Setting(
        "GPUHUB_LINE_MAX_WAIT",
        "3600",
        read="number",
        low=0,
        to=("hub",),
        trait="GPUSwarmSpawner.line_max_wait",
    ),
    Setting(
        "GPUHUB_CPU_ONLY",
        "on",
        read="on",
        choices=("on", "off"),
        to=("hub",),
        trait="GPUSwarmSpawner.cpu_only_servers",
        doc="""
        Servers without a GPU (CPU only), offered when the GPUs are full (on the refusal and in the
        line) and on the spawn page when it has a form: on or off; at most GPUHUB_CPU_ONLY_MAX at once
        (0: no limit). The CPU and memory limits below apply to them too.
        """,
    ),
    Setting(
        "GPUHUB_CPU_ONLY_MAX",
        "0",
        read="number",
        low=0,
        to=("hub",),
        trait="GPUSwarmSpawner.cpu_only_max_servers",
    ),
    Setting(
        "GPUHUB_CPU_LIMIT",
        "auto",
        read="cores",
        to=("hub",),
        doc="""
        Per server: CPU cores (digits and a decimal point, e.g. 4 or 0.5; at least 0.01), memory
        (Docker's forms: 16G, 16g, 16GB, 16GiB, 512M; K, M, G, T are powers of 1024; a plain number is
        bytes; at least 256M) and tasks, i.e. processes and threads (GPUHUB_PIDS_LIMIT: where a fork
        bomb stops; at least 256, or 0: no limit); empty: no limit. auto (the demo's default): sized by
        the machine running `make demo`, whose servers run there: no CPU quota (servers share the cores
        by Docker's equal CPU weight per container, and one alone may use them all), its memory less
        2 GiB shared by the servers it holds when all its slices are taken (GPUs, or
        GPUHUB_SIMULATE_IF_NO_GPU simulated ones, times GPUHUB_SLICES_PER_GPU, over
        GPUHUB_SLICES_PER_SERVER), never below 1 GiB, and 64 tasks per core, never below 1024.
        `make demo` prints the result.
        `make up` refuses auto (its servers run on the GPU machines, which it cannot measure): write
        numbers, as deploy/config.example.env does.
        """,
    ),
    Setting(
        "GPUHUB_MEM_LIMIT",
        "auto",
        read="memory",
        to=("hub",),
    ),
    Setting(
        "GPUHUB_PIDS_LIMIT",
        "auto",
        read="tasks",
        to=("hub",),
    ),
    Setting(
        "GPUHUB_LOG_LEVEL",
        "INFO",
        to=("hub",),
        trait="JupyterHub.log_level",
    ),
    Setting(
        "GPUHUB_EGRESS",
        "internet",
        read="egress",
        to=("hub",),
        doc="""
        What a participant's server may reach beyond the hub (docs/participants.md): internet (every
        public address, no private or link-local one: no cloud metadata service, no machine of the
        swarm), none (nothing), or a list of host names, IPv4 addresses or ranges, each with an optional
        TCP port, e.g. pypi.org files.pythonhosted.org:443 10.2.0.0/16 (names are looked up when each
        server starts). Whatever it says, a server reaches only the proxy's public port on the servers'
        network, and never another participant's server, the swarm's machines or 169.254.0.0/16.
        off: no firewall in the servers (for images without gpuhub-firewall; never for strangers).
        """,
    ),
    Setting(
        "GPUHUB_STATE_DIR",
        "/var/lib/gpu-jupyterhub/${GPUHUB_STACK}",
        doc="""
        Secrets (proxy token, operations token, demo and admin passwords) are generated here, mode 0700.
        """,
    ),
    Setting(
        "GPUHUB_TUTORIAL_REPOS",
        "",
        read="repos",
        to=("hub", "tutorial-sync"),
        doc="""
        Tutorial repositories published read-only into every server, NAME=URL[#BRANCH] separated by
        blanks (e.g. "gpu101=https://github.com/org/gpu101.git#main"); NAME=URL#BRANCH:webhook is never
        polled, only synced at start and on its push webhooks. Empty: no tutorial sync service.
        https:// URLs without credentials (docs/input-tutorial-repos.md).
        """,
    ),
    Setting(
        "GPUHUB_TUTORIAL_TOKEN_FILE",
        "",
        doc="""
        A file (mode 0600) holding the token for private https repositories: TOKEN, USER:TOKEN, or one
        https://USER:TOKEN@HOST line per host. Given to the sync service only, as a Docker secret, and
        to git only when a server asks. Empty: public repositories only.
        """,
    ),
    Setting(
        "GPUHUB_TUTORIAL_POLL",
        "30",
        read="number",
        low=1,
        to=("tutorial-sync",),
        doc="""
        Seconds between polls of those repositories; a signed GitHub push webhook to
        <hub URL>/services/tutorial-sync/webhook (secret: $GPUHUB_STATE_DIR/webhook_secret) syncs at once.
        """,
    ),
    Setting(
        "GPUHUB_TUTORIALS_DIR",
        "${GPUHUB_STATE_DIR}/tutorials",
        to=("hub",),
        doc="""
        Where the tutorials are published: shared storage (e.g. NFS) at this same path on every machine.
        Servers see it read-only at /srv/tutorials, and copy it into ~/tutorials when they start.
        """,
    ),
    Setting(
        "GPUHUB_DATASETS_DIR",
        "",
        to=("hub",),
        doc="""
        A shared dataset cache (shared storage at the same path on every machine), mounted in servers at
        /srv/datasets; mode rw lets participants add to it, ro keeps it as the organizers filled it.
        Empty: none.
        """,
    ),
    Setting(
        "GPUHUB_DATASETS_MODE",
        "ro",
        choices=("ro", "rw"),
        to=("hub",),
    ),
    Setting(
        "GPUHUB_HOMES_DIR",
        "",
        to=("hub",),
        trait="GPUSwarmSpawner.homes_dir",
        doc="""
        Participants' homes on shared storage (NFS, AWS EFS) mounted at this same path on every
        machine, e.g. /srv/homes: each participant's home is its folder there (made by the hub, which
        mounts it too), so a participant whose machine is gone starts on another with every file.
        Empty: each home is the volume jy-home-<user> on the machine that ran the server (a returning
        participant goes back there when it has room); GPUHUB_FLEET=on refuses that.
        docs/homes.md: how to set up the storage.
        """,
    ),
    Setting(
        "GPUHUB_IDLE_TIMEOUT",
        "5400",
        read="number",
        low=0,
        to=("hub",),
        doc="""
        Idle servers are stopped after this many seconds without activity, freeing their GPU slice
        (jupyterhub-idle-culler); 0 turns culling off. 5400 (90 min) outlasts a workshop's lunch break.
        """,
    ),
    Setting(
        "GPUHUB_CULL_EVERY",
        "60",
        read="number",
        low=1,
        to=("hub",),
        doc="""
        Seconds between the culler's checks, and the most seconds any server may run (0: no limit).
        """,
    ),
    Setting(
        "GPUHUB_MAX_AGE",
        "0",
        read="number",
        low=0,
        to=("hub",),
    ),
    Setting(
        "GPUHUB_GUARD_MODE",
        "warn",
        doc="""
        The GPU guard on every GPU machine (worker_setup/guard.py; `make join-command` passes these on,
        so re-run the join line after changing them). Every 5 s it compares each participant's GPU
        memory with their budget (their slices' share of the GPU's memory). Mode: off, warn (those over
        budget are told so in JupyterLab; nothing is stopped) or enforce (warned, then, after the grace
        seconds and while above the stop line, their process holding the most GPU memory is stopped:
        the kernel dies, the server and files stay). The warn and stop lines are percentages of the
        budget; a GPU process of no participant is logged, never stopped. Metrics: Prometheus text at
        http://<GPU machine>:PORT/metrics (0: none); `make status` reads them.
        """,
    ),
    Setting(
        "GPUHUB_GUARD_WARN_PERCENT",
        "100",
        read="guard_number",
    ),
    Setting(
        "GPUHUB_GUARD_STOP_PERCENT",
        "110",
        read="guard_number",
    ),
    Setting(
        "GPUHUB_GUARD_GRACE_SECONDS",
        "60",
        read="guard_number",
    ),
    Setting(
        "GPUHUB_GUARD_METRICS_PORT",
        "9445",
        read="number",
        low=0,
        high=65535,
        to=("hub", "prometheus"),
    ),
    Setting(
        "GPUHUB_DISK_BUDGET_GB",
        "20",
        read="disk_budget",
        to=("hub",),
        trait="GPUSwarmSpawner.disk_budget_gb",
        doc="""
        Disk. Each participant's home and scratch space (what their server writes outside the home)
        together may hold this many GB (GiB: powers of 1024, as for GPUHUB_MEM_LIMIT; decimals
        allowed, e.g. 2.5; at most 100000; 0: no budget). The disk watch on every machine that runs
        servers measures them every 10 s: past the budget, the participant is warned in JupyterLab
        (nothing is stopped for that). GPUHUB_DISK_SAFETY_PERCENT keeps a machine's disk from filling:
        when a file system holding homes or servers' scratch space is fuller than this percentage
        (50 to 99), the server that wrote the most there is stopped, its files kept, and its
        participant told why on their page (the dashboard lists it). 0: no safety line. The same for
        shared homes (GPUHUB_HOMES_DIR).
        """,
    ),
    Setting(
        "GPUHUB_DISK_SAFETY_PERCENT",
        "90",
        read="disk_safety",
        to=("hub",),
        trait="GPUSwarmSpawner.disk_safety_percent",
    ),
    Setting(
        "GPUHUB_METRICS_INTERVAL",
        "15s",
        to=("hub", "prometheus"),
        doc="""
        The dashboard's plots: Prometheus (a stack service) scrapes the hub, the dashboard and every
        guard this often, and keeps this much history (Prometheus durations: 30s, 15m, 12h, 4d, 2w).
        """,
    ),
    Setting(
        "GPUHUB_METRICS_RETENTION",
        "4d",
        to=("prometheus",),
    ),
    Setting(
        "GPUHUB_FLEET",
        "off",
        read="on",
        choices=("on", "off"),
        to=("hub",),
        trait="GPUSwarmSpawner.fleet",
        group=FLEET,
        doc="""
        on: the hub drives the cloud's group of GPU machines as below (the machines its start-up
        script joined); machines joined by hand are fixed: their free slices serve the line, the
        hub never gives them back. It needs GPUHUB_HOMES_DIR (homes on shared storage): a machine
        given back is destroyed by the cloud, with the home volumes on its disk. off: the GPU
        machines are the ones you join by hand.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_MIN_MACHINES",
        "0",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
        doc="""
        The fewest and the most GPU machines of the cloud's group at once (the most: your budget, or
        the cloud's quota; at least 1). The group's machines are those its start-up script joined
        (python3 -m deploy.cloud_init); a machine you joined by hand is fixed and not counted here.
        GPUHUB_FLEET_SCHEDULE raises the fewest by time of day: machines and the time of day they
        hold from, 24-hour, in GPUHUB_FLEET_TIMEZONE (an IANA name such as Europe/Berlin), e.g.
        "10 from 08:45, 4 from 17:00"; they are asked for one boot-and-join ahead, so that they are
        ready at the time written. Empty: no schedule.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_MAX_MACHINES",
        "4",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_SCHEDULE",
        "",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_TIMEZONE",
        "UTC",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_EMPTY_FOR",
        "900",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
        doc="""
        Seconds a machine may hold no server before it is given back (paused first, so that no server
        starts there, then removed while still empty), and the free GPU slices always kept for the
        next arrivals (GPUHUB_FLEET_MARGIN: more machines are asked for below it, and one is given
        back only when the others still have it free; 0: the lowest cost, a newcomer beyond the free
        slices waits a boot). In a rush the hub keeps more: as many as people came over the last
        boot-and-join, up to one machine's slices.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_MARGIN",
        "0",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_STOP_IDLE_AFTER",
        "0",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
        doc=f"""
        Seconds after which the servers of a group machine are stopped when EVERY server on it has
        been idle that long, nobody waits, and the machines that keep servers hold the floor and cover
        GPUHUB_FLEET_MARGIN: the machine empties and is given back after GPUHUB_FLEET_EMPTY_FOR. Their
        files are kept (shared homes); their kernels, and whatever they held in memory, are lost: the
        participant's next visit shows the spawn page. Make it longer than every break of your
        programme, and than 10 minutes (JupyterHub learns of a server's activity every 5 minutes);
        900 to 1200 (15 to 20 min) saved 0.05 to 0.04 of a fixed fleet's machine-hours on the day
        docs/autoscaling.md replays. 0: off (the default; idle servers end by GPUHUB_IDLE_TIMEOUT
        alone); otherwise at least {FLEET_STOP_IDLE_LEAST_S}.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_SLICES_PER_MACHINE",
        "0",
        read="number",
        low=0,
        to=("hub",),
        group=FLEET,
        doc="""
        GPU slices one new machine brings, counted for the people in line while it is on its way.
        0: those of the group's machines seen so far (before any: GPUHUB_SLICES_PER_GPU).
        """,
    ),
    Setting(
        "GPUHUB_FLEET_BOOT_AND_JOIN",
        "300",
        read="number",
        low=1,
        to=("hub",),
        group=FLEET,
        doc="""
        Seconds from asking the cloud to a machine ready in the swarm before any join was seen (then
        the median of those seen; people in line are told "about N minutes"; a machine not ready
        half as long again after it was asked is late, and while people wait one more is asked in
        its place; a group machine whose node is down that long, at least 60 s, is given back
        through the remove command), and after which a machine that has not joined is given up
        (no longer counted as on its way; the organizer is told to look at its
        /var/log/gpuhub-join.log; one the swarm never saw is still counted in the group's size
        for as long again, for the organizer to remove it in the cloud's console).
        """,
    ),
    Setting(
        "GPUHUB_FLEET_JOIN_WITHIN",
        "900",
        read="number",
        low=60,
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_PRICE_PER_HOUR",
        "",
        read="price",
        to=("hub",),
        group=FLEET,
        doc="""
        Your price of one machine-hour (digits and a decimal point, e.g. 2.48), for the estimated
        cost beside the machine-hours on the dashboard and in `make status`. Empty: machine-hours
        only.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_GROW_COMMAND",
        "",
        to=("hub",),
        group=FLEET,
        doc="""
        The provider: shell commands (in single quotes) that resize the cloud's group. The grow
        command makes the group {count} machines, and never smaller; the remove command takes machine
        {machine} (its swarm hostname) out of the group, the group one smaller; the why command
        (optional) prints the group's latest failure (AWS and Google Cloud tell a machine they could
        not launch only there). Each is stopped after GPUHUB_FLEET_COMMAND_TIMEOUT seconds. Copy them
        from docs/providers/.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_REMOVE_COMMAND",
        "",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_WHY_COMMAND",
        "",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_COMMAND_TIMEOUT",
        "120",
        read="number",
        low=1,
        high=3600,
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_IMAGE",
        "",
        to=("hub",),
        group=FLEET,
        doc="""
        Where the commands run. GPUHUB_FLEET_IMAGE: each in a one-shot container of this image on the
        manager, made by the hub and removed after: the cloud's own CLI image (amazon/aws-cli,
        gcr.io/google.com/cloudsdktool/google-cloud-cli:slim or mcr.microsoft.com/azure-cli; pull it
        on the manager first). It runs on the host's network, so that the manager machine's own
        credentials (an instance profile, a service account, a managed identity) work with no key
        stored anywhere. Empty: inside the hub's container, which has no cloud tool (the test bed's
        way). GPUHUB_FLEET_MOUNTS: folders of the manager the container sees, space-separated
        HOSTDIR:CONTAINERDIR[:ro] with absolute paths (e.g. /root/.aws:/root/.aws:ro); nothing else,
        never the Docker socket. GPUHUB_FLEET_ENV: variables the commands get, space-separated
        NAME=VALUE, e.g. "GROUP=gpu-workshop ZONE=europe-west4-a" for their $GROUP and $ZONE.
        """,
    ),
    Setting(
        "GPUHUB_FLEET_MOUNTS",
        "",
        read="mounts",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_FLEET_ENV",
        "",
        read="command_env",
        to=("hub",),
        group=FLEET,
    ),
    Setting(
        "GPUHUB_PUBLIC_URL",
        "",
        to=("hub",),
        by_deploy=True,
        doc="""
        The hub's public URL (GitHub's OAuth callback is this plus /hub/oauth_callback).
        """,
    ),
    Setting(
        "GPUHUB_SIMULATED_GPUS",
        "0",
        read="flag",
        to=("hub",),
        by_deploy=True,
        doc="""
        1 when the swarm's GPUs are simulated (the login page then says so), else 0.
        """,
    ),
    Setting(
        "GPUHUB_ROSTER_FILE",
        "",
        to=("hub-github",),
        trait="WorkshopGitHubOAuthenticator.roster_file",
        by_deploy=True,
        doc="""
        Where the hub reads the roster (GPUHUB_ROSTER, copied into the state directory); empty: none.
        """,
    ),
    Setting(
        "GPUHUB_HUB_IMAGE_ID",
        "",
        by_deploy=True,
        doc="""
        Ids of the hub and single-user images: a rebuilt image under the same tag rolls the services.
        """,
    ),
    Setting(
        "GPUHUB_SINGLEUSER_IMAGE_ID",
        "",
        by_deploy=True,
    ),
    Setting(
        "GPUHUB_TUTORIAL_SYNC_REPLICAS",
        "0",
        read="number",
        low=0,
        high=1,
        by_deploy=True,
        doc="""
        1 when GPUHUB_TUTORIAL_REPOS lists a repository (the tutorial sync service runs), else 0.
        """,
    ),
    Setting(
        "GPUHUB_DOCKER_SOCKET",
        "/var/run/docker.sock",
        by_deploy=True,
        doc="""
        The manager's Docker socket, mounted into the hub.
        """,
    ),
    Setting(
        "GPUHUB_TLS_CERT_VERSION",
        "",
        by_deploy=True,
        doc="""
        Versions (content hashes) of the Docker secrets that change: a new file makes a new secret.
        """,
    ),
    Setting(
        "GPUHUB_TLS_KEY_VERSION",
        "",
        by_deploy=True,
    ),
    Setting(
        "GPUHUB_GITHUB_SECRET_VERSION",
        "",
        by_deploy=True,
    ),
    Setting(
        "GPUHUB_TUTORIAL_TOKEN_VERSION",
        "",
        by_deploy=True,
    ),
)

#: Each setting by name.
BY_NAME = {setting.name: setting for setting in SETTINGS}


def number(name: str) -> tuple[int, int]:
    """A ``number`` setting's default and least value, for the trait that mirrors it."""
    setting = BY_NAME[name]
    if setting.read != "number" or setting.low is None:
        raise ValueError(f"{name} is no number with a least value in the settings table")
    return int(setting.default), setting.low


def _title(setting: Setting) -> str:
    """The title of the group ``setting`` is written in."""
    return BY_DEPLOY_TITLE if setting.by_deploy else setting.group


def settings_env(settings: Iterable[Setting] = SETTINGS) -> str:
    """deploy/settings.env: the introduction, then each setting's comment and line, in the
    table's order within each group; each group after the first under its heading and note, in
    ``GROUPS``' order, the deploy's own settings last."""
    out = [f"# {line}" if line else "#" for line in INTRODUCTION.splitlines()]
    out.append("")
    settings = list(settings)
    titles = ["", *GROUPS, BY_DEPLOY_TITLE]
    group = ""
    for setting in sorted(settings, key=lambda s: titles.index(_title(s))):  # stable
        title = _title(setting)
        if title != group:
            group = title
            heading = f"# ---- {title} "
            note = BY_DEPLOY_NOTE if setting.by_deploy else GROUPS[title]
            out += ["", heading.ljust(99, "-")]
            out += [f"# {line}" for line in note.splitlines()]
            out.append("")  # the group's note, apart from its first setting's
        out += setting.comment
        out.append(f"{setting.name}={setting.default}")
    return "\n".join(out) + "\n"
