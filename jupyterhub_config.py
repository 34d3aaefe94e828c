# JupyterHub configuration of the GPU hub. It runs inside the hub service of deploy/stack.yml.
#
# This file only maps settings onto `c.`; it holds no logic. The settings come from the
# environment of the hub service (deploy/stack.yml, filled from deploy/settings.env or the
# caller's environment) and from Docker secrets under /run/secrets. See README, "Configuration".
import os
import sys
from pathlib import Path

from gpu_swarm_spawner import HUB_TEMPLATES
from gpu_swarm_spawner.settings import names

c = get_config()  # noqa: F821  (provided by JupyterHub)

SECRETS = Path(os.environ.get("GPUHUB_SECRETS_DIR", "/run/secrets"))
DATA = Path(os.environ.get("GPUHUB_DATA_DIR", "/srv/jupyterhub/data"))


def setting(name, default):
    return os.environ.get(f"GPUHUB_{name}", default)


def secret(name):
    return (SECRETS / name).read_text().strip()


STACK = setting("STACK", "gpuhub")
TUTORIAL_REPOS = setting("TUTORIAL_REPOS", "").split()
SIMULATED = setting("SIMULATED_GPUS", "0") == "1"

# ---- hub, proxy, database ------------------------------------------------------------------
c.JupyterHub.hub_bind_url = "http://0.0.0.0:8081"
c.JupyterHub.hub_connect_url = "http://hub:8081"  # the hub's name on the overlay network
c.JupyterHub.db_url = f"sqlite:///{DATA}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(DATA / "jupyterhub.pid")
c.ConfigurableHTTPProxy.should_start = False  # the proxy is its own service
c.ConfigurableHTTPProxy.api_url = "http://proxy:8001"
c.ConfigurableHTTPProxy.auth_token = secret("proxy_token")
c.JupyterHub.cleanup_servers = False  # servers outlive a hub restart
c.JupyterHub.log_level = setting("LOG_LEVEL", "INFO")
# the home page says why the last start failed (templates/hub/home.html)
c.JupyterHub.template_paths = [HUB_TEMPLATES]

# ---- login ----------------------------------------------------------------------------------
c.Authenticator.admin_users = set(names(setting("ADMIN_USERS", "admin")))
if setting("AUTH", "local") == "github":
    # organizations, org:team pairs, and the roster file (deploy/stack.github.yml mounts it)
    c.JupyterHub.authenticator_class = "gpu_swarm_spawner.auth.WorkshopGitHubOAuthenticator"
    c.WorkshopGitHubOAuthenticator.client_id = setting("GITHUB_CLIENT_ID", "")
    c.WorkshopGitHubOAuthenticator.client_secret = secret("github_client_secret")
    c.WorkshopGitHubOAuthenticator.github_url = setting("GITHUB_URL", "https://github.com")
    c.WorkshopGitHubOAuthenticator.oauth_callback_url = (
        setting("PUBLIC_URL", "") + "/hub/oauth_callback"
    )
    c.WorkshopGitHubOAuthenticator.allowed_organizations = set(names(setting("ALLOWED_ORGS", "")))
    # read:org lets the hub see private organization and team memberships
    c.WorkshopGitHubOAuthenticator.scope = ["read:org"]
    c.WorkshopGitHubOAuthenticator.roster_file = setting("ROSTER_FILE", "")
else:
    # the demo: any username, one shared generated password
    c.JupyterHub.authenticator_class = "dummy"
    c.Authenticator.allow_all = True
    c.DummyAuthenticator.password = secret("demo_password")

# The operations token: scripts and the tests use it for the REST API.
c.JupyterHub.services = [{"name": "ops", "api_token": secret("ops_token")}]
if TUTORIAL_REPOS:
    # the proxy routes /services/tutorial-sync/ (GitHub's webhook, the status page) to it
    c.JupyterHub.services.append({"name": "tutorial-sync", "url": "http://tutorial-sync:8090"})
c.JupyterHub.load_roles = [
    {
        "name": "ops",
        "services": ["ops"],
        "scopes": ["admin:users", "admin:servers", "list:users", "read:users", "access:servers"],
    }
]

# Idle servers are stopped (and their GPU slices freed) by jupyterhub-idle-culler, a hub-managed
# service holding only the scopes it needs to find and stop them.
IDLE_TIMEOUT = int(setting("IDLE_TIMEOUT", "5400"))
if IDLE_TIMEOUT > 0:
    c.JupyterHub.services.append(
        {
            "name": "idle-culler",
            "command": [
                sys.executable,
                "-m",
                "jupyterhub_idle_culler",
                f"--timeout={IDLE_TIMEOUT}",
                f"--cull-every={setting('CULL_EVERY', '60')}",
                f"--max-age={setting('MAX_AGE', '0')}",
            ],
        }
    )
    c.JupyterHub.load_roles.append(
        {
            "name": "idle-culler",
            "services": ["idle-culler"],
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        }
    )

if SIMULATED:
    c.JupyterHub.template_vars = {
        "announcement": (
            "Demo mode: the GPU slices of this hub are <b>simulated</b> "
            "(this machine has no NVIDIA GPU). Servers start, but hold no real GPU."
        )
    }

# ---- user servers -----------------------------------------------------------------------------
# Shared by GPUSwarmSpawner and the stock SwarmSpawner baseline (a subclass reads these too).
c.SwarmSpawner.image = setting("SINGLEUSER_IMAGE", "gpu-jupyterhub/singleuser:latest")
# start-singleuser: the tutorial start hook, then jupyterhub-singleuser
c.SwarmSpawner.cmd = ["start-singleuser"]
# Servers reach the hub's API through the proxy: unlike the hub, it keeps its address when the
# hub restarts, and answers at once (503) while the hub is away instead of leaving connections
# to a vanished address hanging.
c.SwarmSpawner.hub_connect_url = "http://proxy:8000"
c.SwarmSpawner.network_name = setting("NETWORK", "jhub")
c.SwarmSpawner.start_timeout = int(setting("START_TIMEOUT", "120"))
c.SwarmSpawner.http_timeout = 60
c.SwarmSpawner.poll_interval = int(setting("POLL_INTERVAL", "30"))
c.SwarmSpawner.default_url = "/lab"
if setting("CPU_LIMIT", ""):
    c.SwarmSpawner.cpu_limit = float(setting("CPU_LIMIT", ""))
if setting("MEM_LIMIT", ""):
    c.SwarmSpawner.mem_limit = setting("MEM_LIMIT", "")

if setting("SPAWNER", "gpu") == "stock-swarm":
    # The benchmark's baseline: dockerspawner as the original workshop ran it, one named slot.
    c.JupyterHub.spawner_class = "dockerspawner.SwarmSpawner"
    c.SwarmSpawner.prefix = "jy"
    c.SwarmSpawner.use_internal_ip = True
    c.SwarmSpawner.extra_endpoint_spec = {"mode": "dnsrr"}
    c.SwarmSpawner.extra_resources_spec = {
        "generic_resources": {setting("NAMED_SLOTS", "NVIDIA-GPU"): 1}
    }
    c.SwarmSpawner.extra_create_kwargs = {"labels": {"gpu-jupyterhub.stack": STACK}}
else:
    c.JupyterHub.spawner_class = "gpu_swarm_spawner.GPUSwarmSpawner"
    c.GPUSwarmSpawner.gpu_slices = int(setting("GPU_SLICES", "1"))
    c.GPUSwarmSpawner.placement_policy = setting("PLACEMENT", "spread")
    c.GPUSwarmSpawner.docker_api_threads = int(setting("DOCKER_API_THREADS", "4"))
    c.GPUSwarmSpawner.service_labels = {"gpu-jupyterhub.stack": STACK}
    c.GPUSwarmSpawner.volumes = {"jy-home-{username}": "/home/jovyan"}
    # the spawn page: environments (NAME=IMAGE, the first is the default) and a full GPU
    ENVIRONMENTS = dict(entry.split("=", 1) for entry in setting("ENVIRONMENTS", "").split())
    if ENVIRONMENTS:
        c.GPUSwarmSpawner.allowed_images = ENVIRONMENTS
        c.GPUSwarmSpawner.image = next(iter(ENVIRONMENTS.values()))
    if setting("FULL_GPU", "admins") != "off":
        c.GPUSwarmSpawner.full_gpu_slices = int(setting("SLICES_PER_GPU", "3"))
        c.GPUSwarmSpawner.full_gpu_for = setting("FULL_GPU", "admins")
    if TUTORIAL_REPOS:
        # the published tutorials (shared storage at the same path on every machine), read-only
        c.GPUSwarmSpawner.volumes[setting("TUTORIALS_DIR", "/srv/tutorials")] = {
            "bind": "/srv/tutorials",
            "mode": "ro",
        }
    if setting("DATASETS_DIR", ""):
        mode = setting("DATASETS_MODE", "ro")
        if mode not in ("ro", "rw"):
            raise ValueError(f"GPUHUB_DATASETS_MODE is {mode!r}; write ro or rw")
        c.GPUSwarmSpawner.volumes[setting("DATASETS_DIR", "")] = {
            "bind": "/srv/datasets",
            "mode": mode,
        }
