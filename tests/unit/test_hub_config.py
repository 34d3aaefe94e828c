"""jupyterhub_config.py as the hub loads it: the demo's login (JupyterHub's shared-password
authenticator, with the generated passwords from Docker secrets) and the servers' limits."""

import asyncio
from pathlib import Path

import pytest
from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets.config.loader import PyFileConfigLoader
from traitlets.utils.importstring import import_item

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
        "demo_password": DEMO_PASSWORD,
        "admin_password": ADMIN_PASSWORD,
    }.items():
        (secrets / name).write_text(value + "\n")  # openssl rand -hex 16 ends with a newline
    monkeypatch.setenv("GPUHUB_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("GPUHUB_DATA_DIR", str(tmp_path / "data"))
    for key in ("GPUHUB_AUTH", "GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT"):
        monkeypatch.delenv(key, raising=False)

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
    import_item(config.JupyterHub.authenticator_class)  # importable as written


def test_the_limits_reach_the_spawners(hub_config):
    config = hub_config(CPU_LIMIT="2.5", MEM_LIMIT="3072M", PIDS_LIMIT="1024")
    assert config.SwarmSpawner.cpu_limit == 2.5
    assert config.SwarmSpawner.mem_limit == "3072M"
    assert config.GPUSwarmSpawner.pids_limit == 1024


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
    assert "demo_password, admin_password]" in stack
    assert "file: ${GPUHUB_STATE_DIR}/admin_password" in stack
