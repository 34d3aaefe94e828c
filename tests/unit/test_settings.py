"""The organizer's settings: the config file's format, misspelt keys, and every check that
stops `make up` with one line naming the key."""

import subprocess
import sys
from pathlib import Path

import pytest

from gpu_swarm_spawner.settings import ConfigFileError, parse_env, problems, unknown_keys

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = REPO / "deploy" / "settings.env"
EXAMPLE = REPO / "deploy" / "config.example.env"


def defaults() -> dict[str, str]:
    """deploy/settings.env as deploy/lib.sh expands it (bash), for a complete set of settings."""
    out = subprocess.run(
        ["bash", "-c", f". {REPO}/deploy/lib.sh && GPUHUB_CONFIG=none load_settings && env"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith("GPUHUB_"))


@pytest.fixture(scope="module")
def base():
    return defaults()


def github(base, **changes):
    settings = dict(base)
    settings.update(
        GPUHUB_AUTH="github",
        GPUHUB_HOSTNAME="hub.example.org",
        GPUHUB_TLS="acme",
        GPUHUB_GITHUB_CLIENT_ID="Iv1.abc",
        GPUHUB_GITHUB_CLIENT_SECRET="s3cret",
        GPUHUB_ALLOWED_ORGS="org-a org-b:tutors",
    )
    settings.update(changes)
    return settings


def test_the_demo_defaults_pass_and_a_complete_github_setup_passes(base):
    assert problems(base, mode="demo") == []
    assert problems(github(base)) == []


def test_the_example_config_is_complete_and_names_only_known_settings(base):
    config = parse_env(EXAMPLE.read_text(), "config.example.env")
    known = set(parse_env(DEFAULTS.read_text(), "settings.env"))
    assert unknown_keys(config, known, "x") == []
    settings = dict(base, **{k: v for k, (v, _) in config.items()})
    # the example's roster path exists only on an organizer's machine
    assert problems(settings, exists=lambda p: True) == []


def test_the_config_file_format():
    text = "# c\n\nGPUHUB_A=1\nGPUHUB_B=\"two words\"\nGPUHUB_C='$HOME'\nGPUHUB_D=x=y\n"
    assert parse_env(text, "c.env") == {
        "GPUHUB_A": ("1", 3),
        "GPUHUB_B": ("two words", 4),
        "GPUHUB_C": ("$HOME", 5),
        "GPUHUB_D": ("x=y", 6),
    }
    with pytest.raises(ConfigFileError, match=r"c.env line 2: expected GPUHUB_NAME=value"):
        parse_env("GPUHUB_A=1\nHOSTNAME=x\n", "c.env")


def test_a_misspelt_key_is_named_with_its_line_and_the_likely_fix():
    known = {"GPUHUB_ALLOWED_ORGS", "GPUHUB_ROSTER"}
    config = {"GPUHUB_ALLOWED_ORG": ("x", 7), "GPUHUB_ROSTER": ("r", 8), "GPUHUB_ZZZ": ("", 9)}
    assert unknown_keys(config, known, "config.env") == [
        "config.env line 7: unknown setting GPUHUB_ALLOWED_ORG; did you mean GPUHUB_ALLOWED_ORGS?",
        "config.env line 9: unknown setting GPUHUB_ZZZ; deploy/settings.env lists them all",
    ]


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"GPUHUB_HOSTNAME": ""}, "GPUHUB_HOSTNAME is empty"),
        ({"GPUHUB_HOSTNAME": "hub example"}, "GPUHUB_HOSTNAME is 'hub example'"),
        ({"GPUHUB_GITHUB_CLIENT_ID": ""}, "GPUHUB_GITHUB_CLIENT_ID is empty"),
        ({"GPUHUB_GITHUB_CLIENT_SECRET": ""}, "set exactly one"),
        ({"GPUHUB_GITHUB_CLIENT_SECRET_FILE": "/x"}, "set exactly one"),
        ({"GPUHUB_ALLOWED_ORGS": "", "GPUHUB_ROSTER": ""}, "nobody could log in"),
        ({"GPUHUB_ALLOWED_ORGS": "org:team:x"}, "'org:team:x' is not ORG or ORG:TEAM"),
        ({"GPUHUB_GITHUB_URL": "github.com"}, "GPUHUB_GITHUB_URL is 'github.com'"),
        ({"GPUHUB_AUTH": "gitlab"}, "GPUHUB_AUTH is 'gitlab'; write one of: github, local"),
        ({"GPUHUB_TLS": "acme", "GPUHUB_HOSTNAME": "10.0.0.5"}, "needs a public DNS name"),
        ({"GPUHUB_TLS": "files", "GPUHUB_TLS_KEY": "/k"}, "GPUHUB_TLS_CERT is empty"),
        ({"GPUHUB_TLS": "files", "GPUHUB_TLS_CERT": "/c", "GPUHUB_TLS_KEY": "/k"}, "/c does not"),
        ({"GPUHUB_TLS_CERT": "/c"}, "GPUHUB_TLS is not files"),
        ({"GPUHUB_TLS": "https"}, "GPUHUB_TLS is 'https'"),
        ({"GPUHUB_GPU_SLICES": "4"}, "GPUHUB_GPU_SLICES is 4 but a GPU has only"),
        ({"GPUHUB_IDLE_TIMEOUT": "90m"}, "GPUHUB_IDLE_TIMEOUT is '90m'; write a whole number"),
        ({"GPUHUB_HTTPS_PORT": "80", "GPUHUB_HTTP_PORT": "80"}, "must differ"),
        ({"GPUHUB_HTTPS_PORT": "70000"}, "GPUHUB_HTTPS_PORT is 70000; write at least 1"),
        ({"GPUHUB_MEM_LIMIT": "16 GB"}, "GPUHUB_MEM_LIMIT is '16 GB'"),
        ({"GPUHUB_CPU_LIMIT": "-1"}, "GPUHUB_CPU_LIMIT is '-1'"),
        ({"GPUHUB_ADMIN_USERS": "ada, not_ok"}, "'not_ok' is not a username"),
        ({"GPUHUB_TUTORIAL_REPOS": "https://x/y.git"}, "is not NAME=URL"),
        ({"GPUHUB_DATASETS_MODE": "rwx"}, "GPUHUB_DATASETS_MODE is 'rwx'"),
        ({"GPUHUB_FULL_GPU": "yes"}, "GPUHUB_FULL_GPU is 'yes'; write one of: admins, all, off"),
        ({"GPUHUB_ENVIRONMENTS": "PyTorch"}, "'PyTorch' is not NAME=IMAGE"),
        ({"GPUHUB_ENVIRONMENTS": "A=x:1 A=y:2"}, "'A' is listed twice"),
    ],
)
def test_each_problem_is_one_line_naming_the_key(base, changes, key):
    found = problems(github(base, **changes), exists=lambda path: path == "/k")
    assert len(found) == 1, found
    assert key in found[0]


def run_check(tmp_path, config_text, mode=0o600, **env):
    config = tmp_path / "config.env"
    config.write_text(config_text)
    config.chmod(mode)
    command = [sys.executable, "-m", "gpu_swarm_spawner.settings", "check"]
    command += ["--defaults", str(DEFAULTS), "--config", str(config)]
    return subprocess.run(
        command, capture_output=True, text=True, env=dict(defaults(), **env), cwd=REPO
    )


def test_check_reports_every_problem_and_a_readable_secret(tmp_path, base):
    text = "GPUHUB_AUTH=github\nGPUHUB_GITHUB_CLIENT_SECRET=s3cret\nGPUHUB_TSL=acme\n"
    result = run_check(tmp_path, text, mode=0o644, GPUHUB_AUTH="github")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any("line 3: unknown setting GPUHUB_TSL; did you mean GPUHUB_TLS?" in x for x in lines)
    assert any("others may read it; run: chmod 600" in x for x in lines)
    assert any("GPUHUB_HOSTNAME is empty" in x for x in lines)
    assert "s3cret" not in result.stderr  # the secret itself is never printed


def test_check_reads_the_roster(tmp_path):
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\nnot valid\n")
    env = dict(
        GPUHUB_AUTH="github",
        GPUHUB_HOSTNAME="127.0.0.1",
        GPUHUB_GITHUB_CLIENT_ID="id",
        GPUHUB_GITHUB_CLIENT_SECRET="s",
        GPUHUB_ROSTER=str(roster),
    )
    result = run_check(tmp_path, "", **env)
    assert result.returncode == 1
    assert "roster.txt line 2: 'not valid' is not a GitHub username" in result.stderr
    roster.write_text("ada\n")
    assert run_check(tmp_path, "", **env).returncode == 0
