"""jupyterhub_config.py as the hub loads it: the demo's login (JupyterHub's shared-password
authenticator, with the generated passwords from Docker secrets), the servers' limits, and every
setting mapped from the typed settings (deploy.settings.from_environment) onto `c.`."""

import ast
import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyterhub.app import JupyterHub
from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from jupyterhub.objects import Hub
from traitlets import TraitError
from traitlets.config.loader import PyFileConfigLoader
from traitlets.utils.importstring import import_item

from deploy import stack
from deploy.limits import Machine
from deploy.settings import SettingsError, from_environment, key_of, read
from deploy.steps import GENERATED
from deploy.values import GIB
from gpu_swarm_spawner import (
    GPUSwarmSpawner,
    access,
    contract,
    disk,
    fleet,
    internals,
    settings_table,
)
from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator
from gpu_swarm_spawner.settings_table import Setting

REPO = Path(__file__).resolve().parents[2]
DEMO_PASSWORD = "2e4dfa3d9c0b4f6e8a1d7c5b3e9f0a12"  # 32 hex characters, as ensure_secrets makes
ADMIN_PASSWORD = "7b1c0e9d8f6a4b2c3d5e7f9a1b3c5d7e"


@pytest.fixture
def hub_config(tmp_path, monkeypatch):
    """Load jupyterhub_config.py with these settings in the environment (as the hub service has
    them) and the generated secrets where Docker puts them."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name, value in {
        "proxy_token": "p" * 32,
        "ops_token": "o" * 32,
        "metrics_token": "m" * 32,
        "demo_password": DEMO_PASSWORD,
        "admin_password": ADMIN_PASSWORD,
        "crypt_key": "c" * 64,  # 32 bytes, hex
    }.items():
        (secrets / name).write_text(value + "\n")  # openssl rand -hex 16 ends with a newline
    monkeypatch.setenv("GPUHUB_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("GPUHUB_DATA_DIR", str(tmp_path / "data"))
    for key in list(os.environ):  # only what each test passes, as the stack does
        if key.startswith("GPUHUB_") and key not in ("GPUHUB_SECRETS_DIR", "GPUHUB_DATA_DIR"):
            monkeypatch.delenv(key)
    # what `make demo` resolves auto to is a number; "" (no limit) stands in for it here
    for key in ("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT"):
        monkeypatch.setenv(key, "")

    def load(**settings):
        for key, value in settings.items():
            monkeypatch.setenv(f"GPUHUB_{key}", value)
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()

    return load


def log_in(authenticator, username, password):
    data = {"username": username, "password": password}
    return asyncio.run(authenticator.get_authenticated_user(None, data))


def test_the_demo_logs_in_with_jupyterhubs_shared_password_authenticator(hub_config):
    config = hub_config(AUTH="local", ADMIN_USERS="admin")
    assert config.JupyterHub.authenticator_class == "shared-password"
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="jupyterhub.authenticators", name="shared-password")
    assert entry.load() is SharedPasswordAuthenticator
    # its validators accept the generated passwords (32 characters, the two differ)
    authenticator = SharedPasswordAuthenticator(config=config)
    authenticator.check_allow_config()

    participant = log_in(authenticator, "ci-alice", DEMO_PASSWORD)
    assert participant["name"] == "ci-alice" and not participant["admin"]
    admin = log_in(authenticator, "admin", ADMIN_PASSWORD)
    assert admin["name"] == "admin" and admin["admin"]
    # participants know the demo password: it does not make anyone an admin
    assert log_in(authenticator, "admin", DEMO_PASSWORD) is None
    assert log_in(authenticator, "ci-alice", ADMIN_PASSWORD) is None
    assert log_in(authenticator, "ci-alice", "wrong") is None


def test_github_login_does_not_use_the_shared_passwords(hub_config, tmp_path):
    (tmp_path / "secrets" / "github_client_secret").write_text("s3cret\n")
    config = hub_config(AUTH="github", GITHUB_CLIENT_ID="Iv1.abc")
    assert config.JupyterHub.authenticator_class.endswith("WorkshopGitHubOAuthenticator")
    assert "SharedPasswordAuthenticator" not in config
    # the participants' GitHub tokens are kept, encrypted with the generated key, for the
    # access check (access.py), which starts with the hub
    assert config.WorkshopGitHubOAuthenticator.enable_auth_state is True
    assert config.CryptKeeper["keys"] == ["c" * 64]
    assert config.WorkshopGitHubOAuthenticator.access_check_interval == 30
    assert access.start in JupyterHub.start.gpuhub_then
    import_item(config.JupyterHub.authenticator_class)  # importable as written


def test_the_limits_reach_the_spawners(hub_config):
    config = hub_config(CPU_LIMIT="2.5", MEM_LIMIT="3072M", PIDS_LIMIT="1024")
    assert config.SwarmSpawner.cpu_limit == 2.5
    assert config.SwarmSpawner.mem_limit == 3 * 1024**3  # bytes, as the check read them
    assert config.GPUSwarmSpawner.pids_limit == 1024


@pytest.mark.parametrize("spawner", ["gpu", "stock-swarm"])
def test_the_hub_raises_its_containers_cpu_weight_with_either_spawner(
    hub_config, monkeypatch, spawner
):
    async def start(hub):
        pass

    monkeypatch.setattr(JupyterHub, "start", start)  # JupyterHub's, before the config's wrap
    config = hub_config(SPAWNER=spawner, STACK="course", HUB_CPU_SHARES="8192")
    assert config.CPUPriority.cpu_shares == 8192
    assert config.CPUPriority.stack == "course"
    assert getattr(JupyterHub.start, internals.MARK) == "after start"  # started with the hub
    assert hub_config(HUB_CPU_SHARES="0").CPUPriority.cpu_shares == 0  # 0: off


def test_empty_limits_set_none(hub_config):
    config = hub_config(CPU_LIMIT="", MEM_LIMIT="", PIDS_LIMIT="")
    assert "cpu_limit" not in config.SwarmSpawner
    assert "mem_limit" not in config.SwarmSpawner
    assert "pids_limit" not in config.GPUSwarmSpawner
    assert hub_config(PIDS_LIMIT="0").GPUSwarmSpawner.pids_limit == 0


def test_the_stack_passes_the_limits_and_the_admin_password_to_the_hub():
    stack = (REPO / "deploy" / "stack.yml").read_text()
    for key in ("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT"):
        assert f"      {key}: ${{{key}}}\n" in stack
    assert "demo_password, admin_password, metrics_token]" in stack
    assert "file: ${GPUHUB_STATE_DIR}/admin_password" in stack


def test_every_setting_reaches_the_spawner_and_the_hub(hub_config):
    config = hub_config(
        STACK="ws",
        NETWORK="ws-net",
        SINGLEUSER_IMAGE="reg:5000/singleuser:1",
        SLICES_PER_SERVER="2",
        PLACEMENT="pack",
        DOCKER_API_THREADS="8",
        START_TIMEOUT="90",
        POLL_INTERVAL="15",
        LOG_LEVEL="DEBUG",
        ADMIN_USERS="ada, bob",
        ENVIRONMENTS="PyTorch=reg:5000/pytorch:1 TF=reg:5000/tf:1",
        FULL_GPU="all",
        WAITING_LINE="auto",
        LINE_MAX_LENGTH="40",
        LINE_MAX_WAIT="900",
        CPU_ONLY="off",
        CPU_ONLY_MAX="12",
        TUTORIAL_REPOS="intro=https://x/intro.git",
        TUTORIALS_DIR="/nfs/tutorials",
        DATASETS_DIR="/nfs/data",
        DATASETS_MODE="rw",
        IDLE_TIMEOUT="600",
        CULL_EVERY="30",
        MAX_AGE="7200",
        SIMULATED_GPUS="1",
    )
    spawner = config.GPUSwarmSpawner
    assert config.JupyterHub.spawner_class == "gpu_swarm_spawner.GPUSwarmSpawner"
    assert spawner.slices_per_server == 2
    assert spawner.placement_policy == "pack"
    assert spawner.docker_api_threads == 8
    assert spawner.full_gpu_for == "all"
    assert "full_gpu_slices" not in spawner and "gpu_slices" not in spawner
    assert (spawner.waiting_line, spawner.line_max_length, spawner.line_max_wait) == (
        "auto", 40, 900)  # fmt: skip
    assert config.JupyterHub.concurrent_spawn_limit == 140  # the line plus JupyterHub's 100
    assert (spawner.cpu_only_servers, spawner.cpu_only_max_servers) == (False, 12)
    assert spawner.allowed_images == {"PyTorch": "reg:5000/pytorch:1", "TF": "reg:5000/tf:1"}
    assert spawner.image == "reg:5000/pytorch:1"  # the first environment is the default
    assert spawner.service_labels == {contract.STACK_LABEL: "ws"}
    assert spawner.volumes == {
        contract.HOME_VOLUME: "/home/jovyan",
        "/nfs/tutorials": {"bind": "/srv/tutorials", "mode": "ro"},
        "/nfs/data": {"bind": "/srv/datasets", "mode": "rw"},
    }
    swarm = config.SwarmSpawner
    assert swarm.image == "reg:5000/singleuser:1"
    assert swarm.network_name == "ws-net"
    assert (swarm.start_timeout, swarm.poll_interval) == (90, 15)
    assert config.JupyterHub.log_level == "DEBUG"
    assert config.Authenticator.admin_users == {"ada", "bob"}
    services = {s["name"]: s for s in config.JupyterHub.services}
    assert set(services) == {"ops", "dashboard", "prometheus", "tutorial-sync", "idle-culler"}
    assert services["idle-culler"]["command"] == [
        sys.executable,
        "-m",
        "jupyterhub_idle_culler",
        "--timeout=600",
        "--cull-every=30",
        "--max-age=7200",
    ]
    roles = [r["name"] for r in config.JupyterHub.load_roles]
    assert roles == ["ops", "dashboard", "prometheus", "idle-culler"]
    assert "simulated" in config.JupyterHub.template_vars["announcement"]


def test_settings_left_out_take_deploy_settings_env_defaults(hub_config):
    config = hub_config()
    spawner = config.GPUSwarmSpawner
    assert spawner.slices_per_server == 1 and spawner.placement_policy == "spread"
    assert spawner.docker_api_threads == 4 and spawner.full_gpu_for == "admins"
    assert (spawner.waiting_line, spawner.line_max_wait) == ("offer", 3600)
    assert (spawner.cpu_only_servers, spawner.cpu_only_max_servers) == (True, 0)
    assert config.JupyterHub.concurrent_spawn_limit == 0  # a line of any length
    assert spawner.volumes == {contract.HOME_VOLUME: "/home/jovyan"}
    assert "allowed_images" not in spawner
    assert config.SwarmSpawner.image == "gpu-jupyterhub/singleuser:latest"
    assert config.SwarmSpawner.network_name == "jhub"
    assert config.Authenticator.admin_users == {"admin"}
    services = [s["name"] for s in config.JupyterHub.services]
    assert services == ["ops", "dashboard", "prometheus", "idle-culler"]
    assert "--timeout=5400" in config.JupyterHub.services[3]["command"]
    assert "template_vars" not in config.JupyterHub  # real GPUs: no banner


def test_the_disk_settings_reach_the_spawner_and_the_check_starts_with_a_safety_line(
    hub_config, monkeypatch
):
    config = hub_config()  # the defaults: 20 GB, 90 %
    assert (config.GPUSwarmSpawner.disk_budget_gb, config.GPUSwarmSpawner.disk_safety_percent) == (
        20.0, 90)  # fmt: skip
    assert disk.start in JupyterHub.start.gpuhub_then
    installed = []
    monkeypatch.setattr(disk, "install", lambda: installed.append(1))
    config = hub_config(DISK_BUDGET_GB="2.5", DISK_SAFETY_PERCENT="0")
    assert (config.GPUSwarmSpawner.disk_budget_gb, config.GPUSwarmSpawner.disk_safety_percent) == (
        2.5, 0)  # fmt: skip
    assert installed == []  # no safety line: nothing to stop, no check
    hub_config(DISK_SAFETY_PERCENT="95")
    assert installed == [1]


def test_the_fleet_keeper_starts_only_with_gpuhub_fleet_on(hub_config, monkeypatch, tmp_path):
    installed = []
    monkeypatch.setattr(fleet, "install", lambda *args, **kwargs: installed.append((args, kwargs)))
    left = tmp_path / "data" / "dashboard" / "fleet.json"  # a hub with the fleet on wrote it
    left.parent.mkdir(parents=True)
    left.write_text("{}")
    hub_config()
    assert installed == []  # off by default: nothing of it runs
    assert not left.exists()  # ... and no fleet shows on the dashboard, stale for ever
    hub_config(
        FLEET="on",
        FLEET_GROW_COMMAND="grow-group {count}",
        FLEET_REMOVE_COMMAND="remove-machine {machine}",
        FLEET_MIN_MACHINES="1",
        FLEET_PRICE_PER_HOUR="2.5",
        FLEET_ENV="GROUP=gpu-workshop",
    )
    ((settings, make_provider, data, dashboard), kwargs) = installed[0]
    assert (settings.min_machines, settings.max_machines, settings.slices_per_machine) == (1, 4, 3)
    assert kwargs == {"learn_slices": True, "price_per_hour": 2.5}
    assert (data, dashboard) == (tmp_path / "data", tmp_path / "data" / "dashboard")
    made = make_provider()  # at the hub's start: the hub's own container runs the commands
    assert (made.commands.grow, made.commands.timeout) == ("grow-group {count}", 120)
    assert made.env["GROUP"] == "gpu-workshop"


def test_homes_on_shared_storage_take_the_place_of_the_home_volume(hub_config):
    config = hub_config(HOMES_DIR="/nfs/homes", DATASETS_DIR="/nfs/data")
    spawner = config.GPUSwarmSpawner
    assert spawner.homes_dir == "/nfs/homes"
    assert spawner.volumes == {"/nfs/data": {"bind": "/srv/datasets", "mode": "ro"}}
    assert hub_config(HOMES_DIR="").GPUSwarmSpawner.homes_dir == ""


def test_culling_off_and_no_full_gpu(hub_config):
    config = hub_config(IDLE_TIMEOUT="0", FULL_GPU="off", WAITING_LINE="off")
    assert "concurrent_spawn_limit" not in config.JupyterHub  # JupyterHub's own
    assert [s["name"] for s in config.JupyterHub.services] == ["ops", "dashboard", "prometheus"]
    assert [r["name"] for r in config.JupyterHub.load_roles] == ["ops", "dashboard", "prometheus"]
    assert config.GPUSwarmSpawner.full_gpu_for == "off"


def test_the_dashboard_runs_in_the_hub_with_the_least_scopes_and_the_guards_port(hub_config):
    config = hub_config(GUARD_METRICS_PORT="9555")
    services = {s["name"]: s for s in config.JupyterHub.services}
    dashboard = services["dashboard"]
    assert dashboard["command"][1:] == ["-m", "gpu_swarm_spawner.dashboard"]
    assert dashboard["url"] == "http://hub:10101"  # the proxy's container reaches it there
    assert dashboard["environment"]["GPUHUB_GUARD_METRICS_PORT"] == "9555"
    journal = dashboard["environment"]["GPUHUB_DASHBOARD_DIR"]
    assert journal == config.GPUSwarmSpawner.dashboard_dir  # what the spawners write
    roles = {r["name"]: r for r in config.JupyterHub.load_roles}
    assert roles["dashboard"]["scopes"] == ["list:users", "read:users:activity", "read:servers"]
    assert roles["prometheus"]["scopes"] == ["read:metrics"]  # /hub/metrics, nothing else
    assert services["prometheus"]["api_token"] == "m" * 32


def test_the_old_name_of_slices_per_server_still_reaches_the_spawner(hub_config):
    assert hub_config(GPU_SLICES="3").GPUSwarmSpawner.slices_per_server == 3


def test_github_settings_reach_the_authenticator(hub_config, tmp_path):
    (tmp_path / "secrets" / "github_client_secret").write_text("s3cret\n")
    config = hub_config(
        AUTH="github",
        GITHUB_CLIENT_ID="Iv1.abc",
        GITHUB_URL="http://10.199.8.1:9000",
        PUBLIC_URL="https://hub.uni.edu",
        ALLOWED_ORGS="org-a,org-b:tutors",
        ROSTER_FILE="/srv/jupyterhub/roster/roster.txt",
    )
    auth = config.WorkshopGitHubOAuthenticator
    assert auth.client_id == "Iv1.abc" and auth.client_secret == "s3cret"
    assert auth.github_url == "http://10.199.8.1:9000"
    assert auth.oauth_callback_url == "https://hub.uni.edu/hub/oauth_callback"
    assert auth.allowed_organizations == {"org-a", "org-b:tutors"}
    assert auth.roster_file == "/srv/jupyterhub/roster/roster.txt"


def test_the_stock_swarm_baseline(hub_config):
    config = hub_config(SPAWNER="stock-swarm", NAMED_SLOTS="NVIDIA-GPU", STACK="bench")
    assert config.JupyterHub.spawner_class == "dockerspawner.SwarmSpawner"
    assert config.SwarmSpawner.extra_resources_spec == {"generic_resources": {"NVIDIA-GPU": 1}}
    assert config.SwarmSpawner.extra_create_kwargs == {"labels": {contract.STACK_LABEL: "bench"}}
    assert "GPUSwarmSpawner" not in config


def test_the_hub_config_reads_only_settings_the_stack_passes_to_the_hub():
    """jupyterhub_config.py takes every setting from the typed Config, and the stack passes each
    one it reads (a setting not passed would silently keep settings.env's default)."""
    source = (REPO / "jupyterhub_config.py").read_text()
    tree = ast.parse(source)
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "cfg"
    }
    assert len(read) > 25, read
    read |= {setting.attribute for setting in settings_table.SETTINGS if setting.trait}
    missing = sorted(key_of(name) for name in read if key_of(name) not in stack_passes())
    assert not missing, f"the hub's environment in deploy/stack*.yml lacks {missing}"
    # no setting read around the Config: only where the container keeps secrets and data
    environ = set(re.findall(r"os\.environ(?:\.get)?\(\s*\"(\w+)\"", source))
    assert environ == {"GPUHUB_SECRETS_DIR", "GPUHUB_DATA_DIR"}


def test_only_the_deploys_random_tokens_are_trusted_without_stretching(hub_config):
    """JupyterHub hashes config tokens once, not 16384 times, when it trusts them: every token
    in the config must then be one the deploy generates."""
    config = hub_config()
    assert config.JupyterHub.trust_user_provided_tokens is True
    generated = {"ops_token": "o" * 32, "metrics_token": "m" * 32}  # the fixture's secrets
    assert set(generated) <= set(GENERATED)
    tokens = [s["api_token"] for s in config.JupyterHub.services if "api_token" in s]
    assert tokens and set(tokens) <= set(generated.values())
    assert "api_tokens" not in config.JupyterHub


def test_the_hub_keeps_its_proxy_and_services_and_its_client_asks_dns_afresh(hub_config):
    """The keeper (routes, services nobody owns: keeper.py), the full-disk check, and the
    hub's HTTP client asking Docker's DNS afresh (a restarted proxy's new address)."""
    from gpu_swarm_spawner.keeper import FreshResolver

    config = hub_config(STACK="workshop")
    data = os.environ["GPUHUB_DATA_DIR"]
    assert config.JupyterHub.proxy_class == "gpu_swarm_spawner.keeper.KeepingProxy"
    assert config.KeepingProxy.server_labels == {contract.STACK_LABEL: "workshop"}
    assert config.KeepingProxy.dashboard_dir == str(Path(data) / "dashboard")
    assert config.GPUSwarmSpawner.hub_data_dir == data
    options = config.JupyterHubHTTPClient.connector_options
    assert isinstance(options["resolver"], FreshResolver) and options["ttl_dns_cache"] <= 2


# ---- config files as organizers edit them: the one reader, then the hub and the spawner -----
# tests/unit/configs holds them byte for byte (Notepad's BOM and CRLF, PowerShell's UTF-16,
# shell exports); tests/unit/test_settings.py holds the ones that are refused.

CONFIGS = REPO / "tests" / "unit" / "configs"
MACHINE = Machine(cpus=16, memory=64 * GIB, gpus=0)


def stack_passes() -> set[str]:
    """The settings deploy/stack.yml and stack.github.yml give the hub's container."""
    stacks = "".join((REPO / "deploy" / f).read_text() for f in ("stack.yml", "stack.github.yml"))
    return set(re.findall(r"^      (GPUHUB_[A-Z0-9_]+): \$\{\1\}$", stacks, re.M))


def organizers_file(tmp_path, name):
    """The corpus file where `make up CONFIG=...` reads it, private as the docs ask."""
    copy = tmp_path / name
    copy.write_bytes((CONFIGS / name).read_bytes())
    copy.chmod(0o600)
    return str(copy)


def spawner_of(config) -> GPUSwarmSpawner:
    """A participant's spawner as the hub makes it from its configuration."""
    user = SimpleNamespace(name="ada", id=1, url="/user/ada/")
    return GPUSwarmSpawner(config=config, user=user, hub=Hub())


def through_the_hub(hub_config, tmp_path, name):
    """``make up``'s reading of the corpus file, then the hub's configuration loaded from what
    the stack passes it (as deployed: the public URL filled in)."""
    cfg = read("up", environ={}, config=organizers_file(tmp_path, name), machine=MACHINE)
    deployed = cfg.with_values({"GPUHUB_PUBLIC_URL": stack.public_url(cfg)}, "make up")
    (tmp_path / "secrets" / "github_client_secret").write_text(cfg.github_client_secret)
    passed = {k: v for k, v in deployed.values.items() if k in stack_passes()}
    return cfg, hub_config(**{k.removeprefix("GPUHUB_"): v for k, v in passed.items()})


@pytest.mark.parametrize("name", ["notepad-utf8-bom-crlf.env", "powershell-utf16le.env"])
def test_a_windows_edited_config_reaches_the_hub_and_the_spawner_as_meant(
    hub_config, tmp_path, name
):
    cfg, config = through_the_hub(hub_config, tmp_path, name)
    assert cfg.hostname == "hub.uni.example"  # "Hub.Uni.Example  ": as browsers send it
    # the admins as the hub matches logins: "@Ada, https://github.com/grace-h/"
    assert config.Authenticator.admin_users == {"ada", "grace-h"}
    authenticator = WorkshopGitHubOAuthenticator(config=config)
    assert authenticator.allowed_organizations == {"gpu-school", "gpu-school:teaching-assistants"}
    assert authenticator.admin_users == {"ada", "grace-h"}
    assert authenticator.oauth_callback_url == "https://hub.uni.example/hub/oauth_callback"
    assert authenticator.client_secret == "3c9f1e0d8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d"
    # 16g (docker run's lower case), 4 cores, 4096 tasks: what Swarm is asked for
    spawner = spawner_of(config)
    assert spawner.service_resources()["Limits"] == {
        "NanoCPUs": 4_000_000_000,
        "MemoryBytes": 16 * GIB,
        "Pids": 4096,
    }


def test_powershells_utf16_is_the_same_settings_as_notepads_utf8(tmp_path):
    utf8, utf16 = (
        read("up", environ={}, config=organizers_file(tmp_path, name), machine=MACHINE)
        for name in ("notepad-utf8-bom-crlf.env", "powershell-utf16le.env")
    )
    assert utf16.values == utf8.values
    # the file is as PowerShell wrote it: a byte order mark, then "#" in UTF-16 LE
    assert (CONFIGS / "powershell-utf16le.env").read_bytes()[:4] == b"\xff\xfe#\x00"


def test_shell_exports_with_quotes_reach_the_hub_and_the_spawner_as_meant(hub_config, tmp_path):
    cfg, config = through_the_hub(hub_config, tmp_path, "shell-exports.env")
    authenticator = WorkshopGitHubOAuthenticator(config=config)
    # "@gpu-school/tutors https://github.com/orgs/gpu-school/teams/teaching-assistants"
    assert authenticator.allowed_organizations == {
        "gpu-school:tutors",
        "gpu-school:teaching-assistants",
    }
    assert authenticator.admin_users == {"ada", "grace-h"}
    spawner = spawner_of(config)
    # 0.5 with a tab after it, "1536M", and no tasks limit (empty)
    assert spawner.service_resources()["Limits"] == {
        "NanoCPUs": 500_000_000,
        "MemoryBytes": 1536 * 1024**2,
    }
    assert cfg.pids_limit is None and spawner.pids_limit == 0


def test_addresses_copied_from_githubs_pages_reach_the_authenticator_as_teams_and_orgs(
    hub_config, tmp_path
):
    cfg, config = through_the_hub(hub_config, tmp_path, "browser-addresses.env")
    authenticator = WorkshopGitHubOAuthenticator(config=config)
    # a team's members tab and an organization's people tab, as the address bar shows them
    assert authenticator.allowed_organizations == {"gpu-school:teaching-assistants", "gpu-lab"}
    assert authenticator.admin_users == {"ada"}  # https://github.com/ada
    assert spawner_of(config).service_resources()["Limits"]["MemoryBytes"] == 16 * GIB  # 16g


def test_a_teams_display_name_never_reaches_the_authenticator(tmp_path):
    path = organizers_file(tmp_path, "team-display-name.env")
    with pytest.raises(SettingsError) as refused:
        read("up", environ={}, config=path, machine=MACHINE)
    (problem,) = refused.value.problems
    assert problem.startswith(f"{path} line 7: GPUHUB_ALLOWED_ORGS: 'gpu-school:Teaching ")
    assert "gpu-school:teaching-assistants" in problem


WIRED = """
import json, sys
from traitlets.config.loader import PyFileConfigLoader
from gpu_swarm_spawner import gate, hubdb, internals
def wired():
    return internals.wired(gate.SWAPS, hubdb.on_connect)
before = wired()
PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
print(json.dumps([before, wired()]))
"""


def in_a_fresh_process(script: str, check: bool = True) -> subprocess.CompletedProcess:
    """``script`` run by a Python of its own, given the repository as its argument (this
    process may hold changes other tests made)."""
    return subprocess.run(
        [sys.executable, "-c", script, str(REPO)],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=check,
    )


def test_the_hub_config_wires_the_gate_the_listen_backlog_and_wal(hub_config):
    """jupyterhub_config.py makes the process-wide changes the hub relies on (internals.py:
    the gate's, hubdb's, priority's): none is in place before it is loaded, each is after. In a
    process of its own: this one may have them from other tests."""
    out = in_a_fresh_process(WIRED)
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert not any(before.values()), before
    assert all(after.values()), after
    assert set(after) == {
        "handler tables",
        "get_spawner",
        "activity writers",
        "listen backlog",
        "hub start",
        "sqlite connect",
    }


ANOTHER_JUPYTERHUB = """
import importlib.metadata, sys
from traitlets.config.loader import PyFileConfigLoader
real = importlib.metadata.version
importlib.metadata.version = lambda p: "6.2.0" if p == "jupyterhub" else real(p)
PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
"""


def test_the_hub_config_stops_a_hub_of_another_jupyterhub_naming_the_pin(hub_config):
    """jupyterhub_config.py checks the versions internals.py was written for before anything
    else (the hub's reach-ins would otherwise fail quietly on another JupyterHub)."""
    out = in_a_fresh_process(ANOTHER_JUPYTERHUB, check=False)
    assert out.returncode != 0
    assert "jupyterhub 6.2.0 is installed" in out.stderr
    assert "images/hub/requirements.txt" in out.stderr


HUB_IMPORTS = """
import json, sys
from traitlets.config.loader import PyFileConfigLoader
PyFileConfigLoader("jupyterhub_config.py", path=sys.argv[1]).load_config()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("worker_setup",))))
"""


def test_the_hub_loads_its_config_without_the_gpu_machines_code(hub_config):
    """The arrows run one way: the hub reads its settings (deploy.settings) and needs nothing
    of worker_setup (the GPU machines' code, its NVML test double)."""
    out = in_a_fresh_process(HUB_IMPORTS)
    assert json.loads(out.stdout.splitlines()[-1]) == []


# ---- one setting declared once reaches every place ---------------------------------------------


def with_a_new_setting() -> tuple[Setting, tuple[Setting, ...]]:
    """The table with a new setting, GPUHUB_PLACEMENT_ATTEMPTS, for the hub's one trait
    GPUSwarmSpawner.placement_attempts (before the settings the deploy fills in)."""
    new = Setting(
        "GPUHUB_PLACEMENT_ATTEMPTS",
        "5",
        read="number",
        low=1,
        to=("hub",),
        trait="GPUSwarmSpawner.placement_attempts",
        doc="How many GPUs a spawn tries.",
    )
    table = settings_table.SETTINGS
    at = next(i for i, s in enumerate(table) if s.by_deploy)
    return new, (*table[:at], new, *table[at:])


def test_a_setting_added_to_the_table_reaches_the_check_config_stack_hub_and_docs(
    hub_config, tmp_path, monkeypatch
):
    from deploy import reference
    from deploy import settings as settings_module

    new, table = with_a_new_setting()
    # the docs and the stack: make docs writes it into settings.env, the reference, the hub's
    # environment
    (tmp_path / "deploy").mkdir()
    for name in ("stack.yml", "stack.github.yml", "stack.tls.yml"):
        (tmp_path / "deploy" / name).write_text((REPO / "deploy" / name).read_text())
    files = reference.generated(tmp_path, table)
    env = files[Path("deploy/settings.env")]
    assert "# How many GPUs a spawn tries.\nGPUHUB_PLACEMENT_ATTEMPTS=5\n" in env
    assert "### GPUHUB_PLACEMENT_ATTEMPTS\n\nDefault: `5`\n" in files[Path("docs/configuration.md")]
    assert (
        "      GPUHUB_PLACEMENT_ATTEMPTS: ${GPUHUB_PLACEMENT_ATTEMPTS}\n"
        in (files[Path("deploy/stack.yml")])
    )
    assert "GPUHUB_PLACEMENT_ATTEMPTS" not in files[Path("deploy/stack.github.yml")]
    # the check: its range
    defaults = tmp_path / "settings.env"
    defaults.write_text(env)
    values = settings_module.merge(settings_module.read_defaults(str(defaults)), {}, {}).values
    values = {**values, **dict.fromkeys(LIMITS, "")}
    monkeypatch.setattr(settings_module, "DECLARED", table)
    found = settings_module.problems({**values, "GPUHUB_PLACEMENT_ATTEMPTS": "0"}, mode="demo")
    assert "GPUHUB_PLACEMENT_ATTEMPTS is 0; write at least 1" in found
    # Config: a typed attribute
    config_type = settings_module.config_class(table)
    assert "placement_attempts" in settings_module.typed_attributes(config_type)
    # the hub: jupyterhub_config.py sets the trait from what the stack passes
    monkeypatch.setattr(settings_table, "SETTINGS", table)
    monkeypatch.setattr(settings_module, "Config", config_type)
    monkeypatch.setattr(settings_module, "DEFAULTS", defaults)
    config = hub_config(PLACEMENT_ATTEMPTS="7")
    assert config.GPUSwarmSpawner.placement_attempts == 7
    assert spawner_of(config).placement_attempts == 7


def test_every_setting_with_a_trait_sets_it_to_its_value(hub_config):
    """The hub config's one loop: each trait the table names is set from its setting (here to a
    value other than the default), for the classes in use."""
    changed = {
        "GPUHUB_STACK": "workshop",
        "GPUHUB_LINE_MAX_WAIT": "60",
        "GPUHUB_PLACEMENT": "pack",
        "GPUHUB_CPU_ONLY": "off",
        "GPUHUB_DISK_BUDGET_GB": "2.5",
        "GPUHUB_LOG_LEVEL": "DEBUG",
    }
    config = hub_config(**{k.removeprefix("GPUHUB_"): v for k, v in changed.items()})
    cfg = from_environment({**dict.fromkeys(LIMITS, ""), **changed}, machine=MACHINE)
    traits = [s for s in settings_table.SETTINGS if s.trait]
    assert len(traits) > 20
    for setting in traits:
        cls, _, trait = setting.trait.partition(".")
        if cls == "WorkshopGitHubOAuthenticator":
            assert cls not in config, "a class not in use is not configured"
            continue
        assert config[cls][trait] == getattr(cfg, setting.attribute), setting.name
    assert config.GPUSwarmSpawner.line_max_wait == 60
    assert config.GPUSwarmSpawner.placement_policy == "pack"
    assert config.GPUSwarmSpawner.cpu_only_servers is False
    assert config.CPUPriority.stack == "workshop"
    assert config.JupyterHub.log_level == "DEBUG"


#: the limits, which the stack passes resolved ("": no limit)
LIMITS = ("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT")


def test_a_trait_that_mirrors_a_setting_has_its_default_and_least_value():
    for name, trait in (
        ("GPUHUB_LINE_MAX_WAIT", "line_max_wait"),
        ("GPUHUB_SLICES_PER_SERVER", "slices_per_server"),
        ("GPUHUB_CPU_ONLY_MAX", "cpu_only_max_servers"),
    ):
        setting = settings_table.BY_NAME[name]
        declared = GPUSwarmSpawner.class_traits()[trait]
        assert (declared.default_value, declared.min) == (int(setting.default), setting.low)
    with pytest.raises(TraitError, match="line_max_wait must be 0 .no limit. or more seconds"):
        GPUSwarmSpawner(line_max_wait=-1)
