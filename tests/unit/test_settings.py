"""The organizer's settings: the config file's one reader (its format and a corpus of odd lines),
precedence, `auto` limits, placeholders left from the example, every check that stops `make up`
with one line naming the key, the renamed settings, and the typed Config that `read` and
`from_environment` return."""

import argparse
import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import envfile, files
from deploy import settings as settings_module
from deploy.envfile import (
    FILLED_BY_DEPLOY,
    ConfigFileError,
    Settings,
    SettingsError,
    merge,
    parse_env,
    read_defaults,
    unknown_keys,
)
from deploy.limits import Machine, auto_limits, resolve_auto, servers_here
from deploy.settings import (
    PLACEHOLDERS,
    Config,
    config_file,
    from_environment,
    load,
    placeholders,
    problems,
    read,
)
from deploy.values import GIB, MIB
from gpu_swarm_spawner.egress import Egress
from tutorial_sync.repos import Repo

from .config_lines import CORPUS, SECRET, Refused, expected, key_of

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = REPO / "deploy" / "settings.env"
EXAMPLE = REPO / "deploy" / "config.example.env"
MACHINE = Machine(cpus=16, memory=64 * GIB, gpus=0)


def defaults() -> dict[str, str]:
    """deploy/settings.env as the reader merges it, with no environment and no config file."""
    return merge(read_defaults(str(DEFAULTS)), {}, {}).values


@pytest.fixture(scope="module")
def base():
    return resolve_auto(Settings(defaults(), {}), MACHINE).values


def github(base, **changes):
    settings = dict(base)
    settings.update(
        GPUHUB_AUTH="github",
        GPUHUB_HOSTNAME="hub.workshop.org",
        GPUHUB_TLS="acme",
        GPUHUB_GITHUB_CLIENT_ID="Iv1.abc",
        GPUHUB_GITHUB_CLIENT_SECRET="s3cret",
        GPUHUB_ALLOWED_ORGS="org-a org-b:tutors",
        GPUHUB_CPU_LIMIT="4",
        GPUHUB_MEM_LIMIT="16G",
        GPUHUB_PIDS_LIMIT="4096",
    )
    settings.update(changes)
    return settings


# ---- the format ---------------------------------------------------------------------------


def test_the_config_file_format():
    text = "# c\n\nGPUHUB_A=1\nGPUHUB_B=\"two words\"\nGPUHUB_C='$HOME'\nGPUHUB_D=x=y\n"
    assert parse_env(text, "c.env") == {
        "GPUHUB_A": ("1", 3),
        "GPUHUB_B": ("two words", 4),
        "GPUHUB_C": ("$HOME", 5),
        "GPUHUB_D": ("x=y", 6),
    }
    with pytest.raises(ConfigFileError, match=r"c.env line 2: 'HOSTNAME' is not a setting name"):
        parse_env("GPUHUB_A=1\nHOSTNAME=x\n", "c.env")


@pytest.mark.parametrize("line, value", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_each_odd_line_means_what_the_organizer_meant_or_is_refused_with_its_line(line, value):
    text = f"# the organizer's file\n{line}\n"
    if isinstance(value, Refused):
        with pytest.raises(ConfigFileError) as refused:
            parse_env(text, "config.env")
        (message,) = refused.value.problems
        assert message.startswith("config.env line 2: "), message
        assert value.says in message, message
        assert SECRET not in message  # a refused line may hold a secret: never shown
    else:
        assert parse_env(text, "config.env") == {key_of(line): (expected(line, value), 2)}


def test_a_bom_at_the_start_is_ignored_and_one_elsewhere_refused():
    assert parse_env(b"\xef\xbb\xbfGPUHUB_AUTH=github\n", "c.env") == {"GPUHUB_AUTH": ("github", 1)}
    with pytest.raises(ConfigFileError, match=r"c.env line 2: .*U\+FEFF"):
        parse_env(b"GPUHUB_TLS=off\n\xef\xbb\xbfGPUHUB_AUTH=github\n", "c.env")


def test_crlf_line_ends_throughout():
    data = b"# settings\r\nGPUHUB_AUTH=github\r\nGPUHUB_TLS='self-signed'\r\n"
    assert parse_env(data, "c.env") == {
        "GPUHUB_AUTH": ("github", 2),
        "GPUHUB_TLS": ("self-signed", 3),
    }


def test_bytes_that_are_not_utf8_are_refused_with_each_line():
    data = b"# caf\xe9 (Latin-1)\nGPUHUB_AUTH=github\nGPUHUB_GITHUB_CLIENT_SECRET=ab\xffcd\n"
    with pytest.raises(ConfigFileError) as refused:
        parse_env(data, "c.env")
    assert refused.value.problems == [
        "c.env line 1: not UTF-8 text (byte 0xe9 at column 6); save the file as UTF-8",
        "c.env line 3: not UTF-8 text (byte 0xff at column 31); save the file as UTF-8",
    ]


def test_a_name_given_twice_is_refused_naming_both_lines():
    with pytest.raises(ConfigFileError) as refused:
        parse_env("GPUHUB_TLS=acme\n# later\nexport GPUHUB_TLS=off\n", "c.env")
    assert refused.value.problems == [
        "c.env line 3: GPUHUB_TLS is set again (first on line 1); keep one of the two"
    ]


def test_every_refused_line_is_reported_at_once():
    text = "GPUHUB_A=1 # one\nGPUHUB_B=ok\ngpuhub_c=3\n"
    with pytest.raises(ConfigFileError) as refused:
        parse_env(text, "c.env")
    assert [p.split(":")[0] for p in refused.value.problems] == ["c.env line 1", "c.env line 3"]


def test_a_misspelt_key_is_named_with_its_line_and_the_likely_fix():
    known = {"GPUHUB_ALLOWED_ORGS", "GPUHUB_ROSTER"}
    config = {"GPUHUB_ALLOWED_ORG": ("x", 7), "GPUHUB_ROSTER": ("r", 8), "GPUHUB_ZZZ": ("", 9)}
    assert unknown_keys(config, known, "config.env") == [
        "config.env line 7: unknown setting GPUHUB_ALLOWED_ORG; did you mean GPUHUB_ALLOWED_ORGS?",
        "config.env line 9: unknown setting GPUHUB_ZZZ; deploy/settings.env lists them all",
    ]


# ---- precedence and the defaults' references ------------------------------------------------


def test_environment_wins_over_config_file_over_defaults_and_defaults_refer_to_earlier():
    defaults = parse_env(
        "GPUHUB_STACK=gpuhub\nGPUHUB_PORT=8000\nGPUHUB_DIR=/var/${GPUHUB_STACK}\n",
        "settings.env",
        references=True,
    )
    config = {"GPUHUB_STACK": ("mine", 4), "GPUHUB_PORT": ("80", 5)}
    merged = merge(defaults, config, {"GPUHUB_PORT": "8080", "HOME": "/x"}, "config.env")
    assert merged.values == {
        "GPUHUB_STACK": "mine",
        "GPUHUB_PORT": "8080",
        "GPUHUB_DIR": "/var/mine",  # the effective value of the earlier setting
    }
    assert merged.origin == {
        "GPUHUB_STACK": "config.env line 4",
        "GPUHUB_PORT": "the environment",
        "GPUHUB_DIR": "the default",
    }


def test_config_file_values_are_never_expanded():
    defaults = parse_env("GPUHUB_A=a\nGPUHUB_B=b\n", "s.env", references=True)
    config = parse_env("GPUHUB_B='${GPUHUB_A}'\n", "c.env")
    assert merge(defaults, config, {}).values["GPUHUB_B"] == "${GPUHUB_A}"


def test_a_default_may_refer_only_to_an_earlier_setting():
    defaults = parse_env("GPUHUB_A=${GPUHUB_B}\nGPUHUB_B=b\n", "s.env", references=True)
    with pytest.raises(ConfigFileError, match="s.env line 1: GPUHUB_A refers to GPUHUB_B"):
        merge(defaults, {}, {}, defaults_source="s.env")


def test_the_shipped_defaults_read_as_before():
    values = defaults()
    assert values["GPUHUB_STATE_DIR"] == "/var/lib/gpu-jupyterhub/gpuhub"
    assert values["GPUHUB_TUTORIALS_DIR"] == "/var/lib/gpu-jupyterhub/gpuhub/tutorials"
    assert values["GPUHUB_GITHUB_CLIENT_ID"] == ""
    assert {values[k] for k in settings_module.LIMIT_KEYS} == {"auto"}


# ---- auto limits --------------------------------------------------------------------------


def test_auto_limits_share_the_machine_among_the_servers_it_holds():
    assert auto_limits(Machine(16, 64 * GIB, 2), servers=6) == {
        "GPUHUB_CPU_LIMIT": "",  # no quota: equal CPU weight per server
        "GPUHUB_MEM_LIMIT": f"{(62 * GIB // 6) // MIB}M",  # 2 GiB kept for hub and system
        "GPUHUB_PIDS_LIMIT": "1024",
    }
    assert auto_limits(Machine(64, 512 * GIB, 8), servers=8)["GPUHUB_PIDS_LIMIT"] == "4096"
    assert auto_limits(Machine(8, 34 * GIB, 1), servers=4)["GPUHUB_MEM_LIMIT"] == "8192M"


def test_auto_never_puts_a_cpu_quota_on_a_server():
    """A quota of cores / servers doubled an idle machine's start and was no fairer under load
    (issue 31): auto shares the cores by Docker's equal weight instead."""
    for cpus, servers in [(1, 1), (2, 6), (16, 4), (256, 1)]:
        assert auto_limits(Machine(cpus, 64 * GIB, 0), servers)["GPUHUB_CPU_LIMIT"] == ""


def test_auto_limits_never_go_below_what_a_jupyterlab_needs():
    assert auto_limits(Machine(2, 4 * GIB, 0), servers=6) == {
        "GPUHUB_CPU_LIMIT": "",
        "GPUHUB_MEM_LIMIT": "1024M",
        "GPUHUB_PIDS_LIMIT": "1024",
    }
    assert auto_limits(Machine(1, GIB, 0), servers=0)["GPUHUB_MEM_LIMIT"] == "1024M"


@pytest.mark.parametrize(
    "gpus, simulate, per_gpu, slices, servers",
    [(0, "2", "3", "1", 6), (4, "0", "3", "3", 4), (0, "0", "3", "1", 1), (1, "x", "3", "1", 3)],
)
def test_servers_here_counts_the_slices_this_machine_advertises(
    gpus, simulate, per_gpu, slices, servers
):
    settings = {
        "GPUHUB_SIMULATE_IF_NO_GPU": simulate,
        "GPUHUB_SLICES_PER_GPU": per_gpu,
        "GPUHUB_SLICES_PER_SERVER": slices,
    }
    assert servers_here(settings, Machine(8, 8 * GIB, gpus)) == servers


def test_only_auto_is_resolved():
    values = dict(defaults(), GPUHUB_MEM_LIMIT="8G", GPUHUB_PIDS_LIMIT="")
    resolved = resolve_auto(Settings(values, {}), Machine(12, 26 * GIB, 0)).values
    # the demo's 2 simulated GPUs of 3 slices: 6 servers
    assert resolved["GPUHUB_CPU_LIMIT"] == ""
    assert resolved["GPUHUB_MEM_LIMIT"] == "8G"
    assert resolved["GPUHUB_PIDS_LIMIT"] == ""


# ---- checks -------------------------------------------------------------------------------


def test_the_demo_defaults_pass_and_a_complete_github_setup_passes(base):
    assert problems(base, mode="demo") == []
    assert problems(github(base)) == []


def example_settings(**environ) -> tuple[Settings, dict]:
    config = parse_env(EXAMPLE.read_bytes(), "config.env")
    known = read_defaults(str(DEFAULTS))
    assert unknown_keys(config, set(known), "config.env") == []
    return merge(known, config, environ, "config.env"), config


def test_every_placeholder_is_a_value_of_the_example():
    _, config = example_settings()
    for key, pattern, _, _ in PLACEHOLDERS:
        assert key in config, f"{key} is no longer in the example"
        assert re.search(pattern, config[key][0]), (key, config[key])


def test_the_unedited_example_is_refused_once_per_placeholder_naming_its_line():
    settings, config = example_settings()
    found = placeholders(settings)
    assert len(found) == len(PLACEHOLDERS), found
    for (key, _, advice, _), line in zip(PLACEHOLDERS, found):
        assert line.startswith(f"config.env line {config[key][1]}: {key} is still the example's")
        assert line.endswith(advice)
    assert "replace-with-the-client-secret" not in "\n".join(found)


def test_the_example_with_its_placeholders_replaced_passes():
    mine = {
        "GPUHUB_HOSTNAME": "hub.uni.edu",
        "GPUHUB_ACME_EMAIL": "ops@uni.edu",
        "GPUHUB_GITHUB_CLIENT_ID": "Iv1.8a61f9b3a7aba766",
        "GPUHUB_GITHUB_CLIENT_SECRET": "0123456789abcdef0123456789abcdef01234567",
        "GPUHUB_ALLOWED_ORGS": "gpu-school gpu-school:tutors",
        "GPUHUB_ADMIN_USERS": "ada",
        "GPUHUB_TUTORIAL_REPOS": "gpu101=https://github.com/gpu-school/gpu101.git#main",
    }
    settings, _ = example_settings(**mine)
    assert placeholders(settings) == []
    # the example's roster path exists only on an organizer's machine
    assert problems(settings.values, exists=lambda p: True) == []


def test_placeholders_that_do_not_matter_for_the_setup_are_let_through():
    settings, _ = example_settings(GPUHUB_TLS="self-signed", GPUHUB_AUTH="local")
    keys = {line.split(": ")[1].split()[0] for line in placeholders(settings)}
    assert keys == {"GPUHUB_HOSTNAME", "GPUHUB_ADMIN_USERS", "GPUHUB_TUTORIAL_REPOS"}


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"GPUHUB_HOSTNAME": ""}, "GPUHUB_HOSTNAME is empty"),
        ({"GPUHUB_HOSTNAME": "hub example"}, "GPUHUB_HOSTNAME is 'hub example'"),
        ({"GPUHUB_GITHUB_CLIENT_ID": ""}, "GPUHUB_GITHUB_CLIENT_ID is empty"),
        ({"GPUHUB_GITHUB_CLIENT_SECRET": ""}, "set exactly one"),
        ({"GPUHUB_GITHUB_CLIENT_SECRET_FILE": "/x"}, "set exactly one"),
        ({"GPUHUB_ALLOWED_ORGS": "", "GPUHUB_ROSTER": ""}, "nobody could log in"),
        ({"GPUHUB_ALLOWED_ORGS": "org:team:x"}, "write ORG or ORG:TEAM, with one ':'"),
        ({"GPUHUB_GITHUB_URL": "github.com"}, "GPUHUB_GITHUB_URL is 'github.com'"),
        ({"GPUHUB_AUTH": "gitlab"}, "GPUHUB_AUTH is 'gitlab'; write one of: github, local"),
        ({"GPUHUB_TLS": "acme", "GPUHUB_HOSTNAME": "10.0.0.5"}, "needs a public DNS name"),
        ({"GPUHUB_TLS": "files", "GPUHUB_TLS_KEY": "/k"}, "GPUHUB_TLS_CERT is empty"),
        ({"GPUHUB_TLS": "files", "GPUHUB_TLS_CERT": "/c", "GPUHUB_TLS_KEY": "/k"}, "/c does not"),
        ({"GPUHUB_TLS_CERT": "/c"}, "GPUHUB_TLS is not files"),
        ({"GPUHUB_TLS": "https"}, "GPUHUB_TLS is 'https'"),
        ({"GPUHUB_SLICES_PER_SERVER": "4"}, "GPUHUB_SLICES_PER_SERVER is 4 but a GPU has only"),
        ({"GPUHUB_IDLE_TIMEOUT": "90m"}, "GPUHUB_IDLE_TIMEOUT is '90m'; write a whole number"),
        ({"GPUHUB_HTTPS_PORT": "80", "GPUHUB_HTTP_PORT": "80"}, "must differ"),
        ({"GPUHUB_HTTPS_PORT": "70000"}, "GPUHUB_HTTPS_PORT is 70000; write at least 1"),
        ({"GPUHUB_LINE_MAX_WAIT": "-1"}, "GPUHUB_LINE_MAX_WAIT is -1; write at least 0"),
        ({"GPUHUB_START_TIMEOUT": "5"}, "GPUHUB_START_TIMEOUT is 5; write at least 10"),
        (
            {"GPUHUB_WAITING_LINE": "yes"},
            "GPUHUB_WAITING_LINE is 'yes'; write one of: offer, auto, off",
        ),
        ({"GPUHUB_CPU_ONLY": "1"}, "GPUHUB_CPU_ONLY is '1'; write one of: on, off"),
        ({"GPUHUB_PLACEMENT": "wide"}, "GPUHUB_PLACEMENT is 'wide'; write one of: spread, pack"),
        ({"GPUHUB_MEM_LIMIT": "16 XB"}, "GPUHUB_MEM_LIMIT is '16 XB'"),
        ({"GPUHUB_MEM_LIMIT": "16"}, "GPUHUB_MEM_LIMIT is '16'; that is 16 bytes"),
        ({"GPUHUB_CPU_LIMIT": "-1"}, "GPUHUB_CPU_LIMIT is '-1'"),
        ({"GPUHUB_PIDS_LIMIT": "100"}, "GPUHUB_PIDS_LIMIT is '100'"),
        ({"GPUHUB_PIDS_LIMIT": "-1"}, "GPUHUB_PIDS_LIMIT is '-1'"),
        ({"GPUHUB_CPU_LIMIT": "auto"}, "GPUHUB_CPU_LIMIT is auto, which sizes servers by"),
        ({"GPUHUB_PIDS_LIMIT": "auto"}, "with `make up` they run on the GPU machines"),
        ({"GPUHUB_ADMIN_USERS": "ada, not_ok"}, "'not_ok' is not a username"),
        ({"GPUHUB_TUTORIAL_REPOS": "https://x/y.git"}, "write NAME=URL"),
        ({"GPUHUB_DATASETS_MODE": "rwx"}, "GPUHUB_DATASETS_MODE is 'rwx'"),
        ({"GPUHUB_FULL_GPU": "yes"}, "GPUHUB_FULL_GPU is 'yes'; write one of: admins, all, off"),
        ({"GPUHUB_ENVIRONMENTS": "PyTorch"}, "'PyTorch' is not NAME=IMAGE"),
        ({"GPUHUB_ENVIRONMENTS": "A=x:1 A=y:2"}, "'A' is listed twice"),
        ({"GPUHUB_SPAWNER": "stock"}, "GPUHUB_SPAWNER is 'stock'; write one of: gpu, stock-swarm"),
        ({"GPUHUB_SPAWNER": "stock-swarm"}, "GPUHUB_NAMED_SLOTS is empty; name the slot kind"),
        ({"GPUHUB_METRICS_RETENTION": "4 days"}, "GPUHUB_METRICS_RETENTION is '4 days'; write a"),
        ({"GPUHUB_METRICS_RETENTION": "96"}, "GPUHUB_METRICS_RETENTION is '96'"),
        ({"GPUHUB_METRICS_INTERVAL": ""}, "GPUHUB_METRICS_INTERVAL is ''"),
        ({"GPUHUB_METRICS_INTERVAL": "-15s"}, "GPUHUB_METRICS_INTERVAL is '-15s'"),
        ({"GPUHUB_NETWORK_SUBNET": "10.120.0.1/20"}, "has host bits set"),
        ({"GPUHUB_NETWORK_SUBNET": "10.120.0.0"}, "of /28 or larger"),
        ({"GPUHUB_NETWORK_SUBNET": "10.120.0.0/29"}, "of /28 or larger"),
        ({"GPUHUB_NETWORK_SUBNET": "8.8.0.0/16"}, "a private IPv4 range"),
        ({"GPUHUB_NETWORK_SUBNET": "fd00::/64"}, "a private IPv4 range"),
        ({"GPUHUB_NETWORK_SUBNET": "10.120.0.0/20 "}, "GPUHUB_NETWORK_SUBNET is '10.120.0.0/20 '"),
        ({"GPUHUB_NETWORK_SUBNET": "big"}, "write an address range such as 10.120.0.0/20"),
        ({"GPUHUB_HOMES_DIR": "homes"}, "GPUHUB_HOMES_DIR is 'homes'; write the absolute path"),
        ({"GPUHUB_HOMES_DIR": "/"}, "such as /srv/homes"),
        ({"GPUHUB_HOMES_DIR": "/nfs/a:b"}, "Docker's volume syntax takes no ':'"),
        ({"GPUHUB_DATASETS_DIR": "data"}, "GPUHUB_DATASETS_DIR is 'data'; write the absolute"),
        ({"GPUHUB_TUTORIALS_DIR": ""}, "GPUHUB_TUTORIALS_DIR is ''; write the absolute path"),
        (
            {"GPUHUB_HOMES_DIR": "/nfs", "GPUHUB_DATASETS_DIR": "/nfs/data"},
            "GPUHUB_HOMES_DIR (/nfs) and GPUHUB_DATASETS_DIR (/nfs/data) overlap",
        ),
        ({"GPUHUB_HOMES_DIR": "/nfs/t/", "GPUHUB_TUTORIALS_DIR": "/nfs/t"}, "overlap"),
        # `make down PURGE=1` empties the state directory
        ({"GPUHUB_HOMES_DIR": "/var/lib/gpu-jupyterhub/gpuhub/homes"}, "and GPUHUB_STATE_DIR"),
    ],
)
def test_each_problem_is_one_line_naming_the_key(base, changes, key):
    found = problems(github(base, **changes), exists=lambda path: path == "/k")
    assert len(found) == 1, found
    assert key in found[0]


@pytest.mark.parametrize("value", ["30s", "12h", "4d", "2w", "1h30m"])
def test_metrics_durations_take_prometheus_forms(base, value):
    assert problems(github(base, GPUHUB_METRICS_RETENTION=value)) == []


@pytest.mark.parametrize("value", ["", "10.120.0.0/20", "192.168.64.0/22", "172.20.0.0/16"])
def test_the_network_subnet_is_empty_or_a_private_range(base, value):
    assert problems(github(base, GPUHUB_NETWORK_SUBNET=value)) == []


@pytest.mark.parametrize("value", ["", "0", "256", "4096"])
def test_pids_limit_accepts_none_or_enough(base, value):
    assert problems(github(base, GPUHUB_PIDS_LIMIT=value)) == []


# ---- the command that prints the checked settings: python -m deploy settings -------------


def run_load(tmp_path, config_text, mode="up", file_mode=0o600, **env):
    config = tmp_path / "config.env"
    config.write_text(config_text)
    config.chmod(file_mode)
    command = [sys.executable, "-m", "deploy", "settings", "--mode", mode]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_")}
    env = {**clean, "GPUHUB_CONFIG": str(config), **env}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)


def test_load_reports_every_problem_and_a_readable_secret(tmp_path):
    text = "GPUHUB_AUTH=github\nGPUHUB_GITHUB_CLIENT_SECRET=s3cret\nGPUHUB_TSL=acme\n"
    result = run_load(tmp_path, text, file_mode=0o644)
    assert result.returncode == 1
    assert result.stdout == ""  # nothing for bash to apply
    lines = result.stderr.splitlines()
    assert any("line 3: unknown setting GPUHUB_TSL; did you mean GPUHUB_TLS?" in x for x in lines)
    assert any("others may read it; run: chmod 600" in x for x in lines)
    assert any("GPUHUB_HOSTNAME is empty" in x for x in lines)
    assert "s3cret" not in result.stderr  # the secret itself is never printed


def test_load_stops_at_a_refused_line_before_any_other_check(tmp_path):
    result = run_load(tmp_path, "GPUHUB_AUTH=github\n GPUHUB_TLS=acme # automatic\n")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {tmp_path}/config.env line 2: GPUHUB_TLS: a '#' starting a word of the value "
        "is neither a comment nor cut off here; put a comment on a line of its own, or, if '#' "
        "belongs to the value, quote it: GPUHUB_TLS='...'",
        f"error: fix the settings above in {tmp_path}/config.env and run this again",
    ]


def test_load_prints_what_it_checked_as_shell_exports(tmp_path):
    text = (
        " GPUHUB_AUTH=github\n\tGPUHUB_TLS=self-signed\nGPUHUB_HOSTNAME=10.0.0.5\n"
        "GPUHUB_GITHUB_CLIENT_ID=Iv1.abc\nGPUHUB_GITHUB_CLIENT_SECRET='it''s'\n"
    )
    assert run_load(tmp_path, text).returncode == 1  # '...''...' is text after a closing quote
    text = text.replace("'it''s'", '"it\'s $ecret"')
    assert "use single quotes" in run_load(tmp_path, text).stderr
    text = text.replace('"it\'s $ecret"', '"it\'s-a-secret"')  # (a secret has no blanks)
    text += "GPUHUB_ALLOWED_ORGS=org\nGPUHUB_CPU_LIMIT=2\nGPUHUB_MEM_LIMIT=4G\n"
    text += "GPUHUB_PIDS_LIMIT=0\n"
    result = run_load(tmp_path, text)
    assert result.returncode == 0, result.stderr
    exports = result.stdout.splitlines()
    assert "export GPUHUB_AUTH=github" in exports
    assert "export GPUHUB_TLS=self-signed" in exports
    assert "export GPUHUB_GITHUB_CLIENT_SECRET='it'\"'\"'s-a-secret'" in exports


@pytest.mark.parametrize(
    ("mode", "line", "env", "simulated"),
    [
        ("up", "", {}, "0"),  # a production hub: no simulated GPUs unless asked
        ("up", "GPUHUB_SIMULATE_IF_NO_GPU=2\n", {}, "2"),  # a test install asks
        ("up", "", {"GPUHUB_SIMULATE_IF_NO_GPU": "1"}, "1"),
        ("demo", "", {}, "2"),  # the demo keeps its default
    ],
)
def test_make_up_offers_no_simulated_gpus_unless_asked(tmp_path, mode, line, env, simulated):
    text = (
        "GPUHUB_AUTH=github\nGPUHUB_TLS=self-signed\nGPUHUB_HOSTNAME=10.0.0.5\n"
        "GPUHUB_GITHUB_CLIENT_ID=Iv1.abc\nGPUHUB_GITHUB_CLIENT_SECRET=s\n"
        "GPUHUB_ALLOWED_ORGS=org\nGPUHUB_CPU_LIMIT=2\nGPUHUB_MEM_LIMIT=4G\nGPUHUB_PIDS_LIMIT=0\n"
    ) + line
    result = run_load(tmp_path, text, mode=mode, **env)
    assert result.returncode == 0, result.stderr
    assert f"export GPUHUB_SIMULATE_IF_NO_GPU={simulated}" in result.stdout.splitlines()


def test_load_refuses_the_unedited_example_with_one_line_per_placeholder(tmp_path):
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\n")
    result = run_load(tmp_path, EXAMPLE.read_text(), GPUHUB_ROSTER=str(roster))
    assert result.returncode == 1
    *lines, last = result.stderr.splitlines()
    assert len(lines) == len(PLACEHOLDERS), lines
    assert all(" is still the example's " in line for line in lines)
    assert last.startswith("error: fix the settings above in ")


def test_load_says_how_to_make_a_missing_config_file(tmp_path):
    args = argparse.Namespace(defaults=str(DEFAULTS), config=str(tmp_path / "nope.env"), mode="")
    _, errors = load(args, environ={})
    assert errors == [
        f"cannot read the config file {tmp_path}/nope.env (No such file or directory); copy "
        "deploy/config.example.env there and edit it (or run this with sudo)"
    ]


def test_load_reads_the_roster(tmp_path):
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\nnot valid\n")
    env = dict(
        GPUHUB_AUTH="github",
        GPUHUB_HOSTNAME="127.0.0.1",
        GPUHUB_GITHUB_CLIENT_ID="id",
        GPUHUB_GITHUB_CLIENT_SECRET="s",
        GPUHUB_ROSTER=str(roster),
        GPUHUB_CPU_LIMIT="",
        GPUHUB_MEM_LIMIT="",
        GPUHUB_PIDS_LIMIT="",
    )
    result = run_load(tmp_path, "", **env)
    assert result.returncode == 1
    assert "roster.txt line 2: 'not valid' is not a GitHub username" in result.stderr
    roster.write_text("ada\n")
    assert run_load(tmp_path, "", **env).returncode == 0


def test_load_without_a_mode_resolves_auto_on_this_machine(tmp_path):
    args = argparse.Namespace(defaults=str(DEFAULTS), config="", mode="")
    machine = Machine(cpus=12, memory=26 * GIB, gpus=0)
    settings, errors = load(args, environ={}, machine=machine)
    assert errors == []
    assert settings.values["GPUHUB_CPU_LIMIT"] == ""  # no quota
    assert settings.values["GPUHUB_MEM_LIMIT"] == "4096M"  # 24 GiB, 6 simulated slices
    settings, errors = load(
        argparse.Namespace(defaults=str(DEFAULTS), config="", mode="up"), environ={}
    )
    assert settings.values["GPUHUB_CPU_LIMIT"] == "auto"  # not resolved: refused instead
    assert any("GPUHUB_CPU_LIMIT is auto" in e for e in errors)


# ---- renamed settings --------------------------------------------------------------------------


def test_the_old_name_gpu_slices_is_read_as_slices_per_server_with_a_warning(tmp_path, capsys):
    config = tmp_path / "config.env"
    config.write_text("# mine\nGPUHUB_GPU_SLICES=2\n")
    cfg = read(environ={}, config=str(config), machine=MACHINE)
    assert cfg.slices_per_server == 2
    assert cfg.origin["GPUHUB_SLICES_PER_SERVER"] == f"{config} line 2"
    assert "GPUHUB_GPU_SLICES" not in cfg.values
    assert capsys.readouterr().err == (
        f"warning: {config} line 2: GPUHUB_GPU_SLICES was renamed; "
        "write GPUHUB_SLICES_PER_SERVER instead\n"
    )

    cfg = read(environ={"GPUHUB_GPU_SLICES": "3"}, config="", machine=MACHINE)
    assert cfg.slices_per_server == 3 and cfg.origin["GPUHUB_SLICES_PER_SERVER"] == (
        "the environment"
    )
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith("warning: the environment: GPUHUB_GPU_SLICES was renamed")

    # the hub's environment too
    assert from_environment({"GPUHUB_GPU_SLICES": "3"}).slices_per_server == 3
    assert "GPUHUB_GPU_SLICES was renamed" in capsys.readouterr().err


def test_the_new_name_wins_where_both_are_set(tmp_path, capsys):
    config = tmp_path / "config.env"
    config.write_text("GPUHUB_SLICES_PER_SERVER=2\nGPUHUB_GPU_SLICES=3\n")
    assert read(environ={}, config=str(config), machine=MACHINE).slices_per_server == 2
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (
        f"warning: {config} line 2: GPUHUB_GPU_SLICES is the old name of "
        "GPUHUB_SLICES_PER_SERVER, which is set too and wins; remove GPUHUB_GPU_SLICES"
    )
    # the environment's old name still wins over the config file's new one
    cfg = read(environ={"GPUHUB_GPU_SLICES": "3"}, config=str(config), machine=MACHINE)
    assert cfg.slices_per_server == 3


def test_load_takes_the_old_name_and_checks_it_under_the_new_one(tmp_path):
    text = (
        "GPUHUB_AUTH=github\nGPUHUB_TLS=self-signed\nGPUHUB_HOSTNAME=10.0.0.5\n"
        "GPUHUB_GITHUB_CLIENT_ID=Iv1.abc\nGPUHUB_GITHUB_CLIENT_SECRET=s\n"
        "GPUHUB_ALLOWED_ORGS=org\nGPUHUB_CPU_LIMIT=2\nGPUHUB_MEM_LIMIT=4G\nGPUHUB_PIDS_LIMIT=0\n"
        "GPUHUB_GPU_SLICES=2\n"
    )
    result = run_load(tmp_path, text)
    assert result.returncode == 0, result.stderr  # not an unknown setting
    assert "export GPUHUB_SLICES_PER_SERVER=2" in result.stdout.splitlines()
    assert "GPUHUB_GPU_SLICES" not in result.stdout
    assert result.stderr == (
        f"warning: {tmp_path}/config.env line 10: GPUHUB_GPU_SLICES was renamed; "
        "write GPUHUB_SLICES_PER_SERVER instead\n"
    )
    result = run_load(tmp_path, text.replace("SLICES=2", "SLICES=4"))
    assert result.returncode == 1
    assert "GPUHUB_SLICES_PER_SERVER is 4 but a GPU has only" in result.stderr


# ---- one typed object: read, from_environment, Config ------------------------------------


def test_every_variable_the_stack_files_interpolate_is_a_setting():
    """Config.values is what the stack files are deployed with: one list of names."""
    keys = set(read_defaults(str(DEFAULTS)))
    for stack in sorted((REPO / "deploy").glob("stack*.yml")):
        used = set(re.findall(r"\$\{(GPUHUB_[A-Z0-9_]+)\}", stack.read_text()))
        assert used <= keys, f"{stack.name}: {sorted(used - keys)} are not in settings.env"
    assert set(FILLED_BY_DEPLOY) <= keys


TYPES = {
    "int": int,
    "float": float,
    "float | None": (float, type(None)),  # the limits; None: no limit
    "int | None": (int, type(None)),
    "str": str,
    "bool": bool,
    "list[str]": list,
    "list[Repo]": list,
    "dict[str, str]": dict,
    "Egress": Egress,
    "tuple[Mount, ...]": tuple,
}


def test_read_gives_every_setting_its_declared_type():
    cfg = read(environ={}, config="", machine=MACHINE)
    for f in dataclasses.fields(Config):
        if not f.init:
            value = getattr(cfg, f.name)
            allowed = TYPES[f.type] if isinstance(TYPES[f.type], tuple) else (TYPES[f.type],)
            assert type(value) in allowed, (f.name, f.type, value)
            if f.type == "str":
                assert value == cfg.values[settings_module.key_of(f.name)]
    assert cfg.config_file == ""
    assert cfg.stack == "gpuhub" and cfg.http_port == 8000 and cfg.slices_per_gpu == 3
    assert cfg.simulated_gpus is False and cfg.tutorial_sync_replicas == 0
    assert cfg.state_dir == "/var/lib/gpu-jupyterhub/gpuhub"
    assert cfg.cpu_limit is None  # auto: no quota
    assert cfg.mem_limit == 10581 * MIB  # auto, for MACHINE's 62 GiB and 6 simulated slices
    assert cfg.values["GPUHUB_MEM_LIMIT"] == "10581M"
    assert cfg.origin["GPUHUB_STACK"] == "the default"


def test_lists_and_environments_are_split_as_the_checks_read_them():
    environ = {
        "GPUHUB_ADMIN_USERS": "ada, bob\tcy",
        "GPUHUB_ALLOWED_ORGS": "org-a,org-b:tutors",
        "GPUHUB_TUTORIAL_REPOS": " a=https://x/a.git#main\n b=https://x/b.git ",
        "GPUHUB_ENVIRONMENTS": "TF=gpu-jupyterhub/tensorflow:latest PyTorch=pt:1",
        "GPUHUB_PIDS_LIMIT": "",
        "GPUHUB_HTTP_PORT": "8080",
    }
    cfg = read(environ=environ, config="", machine=MACHINE)
    assert cfg.admin_users == ["ada", "bob", "cy"]
    assert cfg.allowed_orgs == ["org-a", "org-b:tutors"]
    assert cfg.tutorial_repos == [
        Repo("a", "https://x/a.git", "main"),
        Repo("b", "https://x/b.git", "main"),
    ]
    assert list(cfg.environments.items()) == [  # in order: the first is the default
        ("TF", "gpu-jupyterhub/tensorflow:latest"),
        ("PyTorch", "pt:1"),
    ]
    assert cfg.pids_limit is None and cfg.http_port == 8080
    assert cfg.values["GPUHUB_HTTP_PORT"] == "8080"
    assert cfg.origin["GPUHUB_HTTP_PORT"] == "the environment"


def test_read_with_a_mode_raises_every_problem_at_once():
    environ = {"GPUHUB_HOSTNAME": "", "GPUHUB_AUTH": "gitlab", "GPUHUB_IDLE_TIMEOUT": "90m"}
    with pytest.raises(SettingsError) as refused:
        read("up", environ=environ, config="")
    found = refused.value.problems
    assert str(refused.value) == "\n".join(found)
    for says in (
        "GPUHUB_HOSTNAME is empty",
        "GPUHUB_AUTH is 'gitlab'",
        "GPUHUB_IDLE_TIMEOUT is '90m'; write a whole number",
        "GPUHUB_CPU_LIMIT is auto",
    ):
        assert any(says in line for line in found), (says, found)
    assert read("demo", environ={}, config="", machine=MACHINE).auth == "local"
    with pytest.raises(ValueError, match="mode is 'prod'"):
        read("prod", environ={}, config="")


def test_read_without_a_mode_still_refuses_what_it_cannot_read(tmp_path):
    config = tmp_path / "c.env"
    config.write_text("GPUHUB_IDLE_TIMEOUT=90m\nGPUHUB_HOSTNAME=\n")
    with pytest.raises(SettingsError) as refused:  # a value of the wrong type: where, what
        read(environ={"GPUHUB_HTTP_PORT": "80a"}, config=str(config), machine=MACHINE)
    assert refused.value.problems == [
        "the environment: GPUHUB_HTTP_PORT is '80a'; write a whole number",
        f"{config} line 1: GPUHUB_IDLE_TIMEOUT is '90m'; write a whole number",
    ]
    config.write_text("GPUHUB_TSL=acme\nGPUHUB_PUBLIC_URL=https://x\n")
    with pytest.raises(SettingsError) as refused:
        read(environ={}, config=str(config), machine=MACHINE)
    assert refused.value.problems == [
        f"{config} line 1: unknown setting GPUHUB_TSL; did you mean GPUHUB_TLS?",
        f"{config} line 2: GPUHUB_PUBLIC_URL is filled in while deploying, not by the config "
        "file; remove the line",
    ]
    config.write_text("GPUHUB_TLS=acme # automatic\n")
    with pytest.raises(SettingsError, match="c.env line 1: GPUHUB_TLS: a '#'"):
        read(environ={}, config=str(config), machine=MACHINE)


@pytest.mark.parametrize(
    "key, value, read_as",
    [
        ("GPUHUB_GUARD_WARN_PERCENT", "95%", 95.0),
        ("GPUHUB_GUARD_STOP_PERCENT", " 120 ", 120.0),
        ("GPUHUB_GUARD_GRACE_SECONDS", "30", 30.0),
        ("GPUHUB_GUARD_GRACE_SECONDS", "60%", None),  # a percentage only for the percentages
        ("GPUHUB_GUARD_WARN_PERCENT", "inf", None),
    ],
)
def test_the_guards_numbers_are_typed_as_the_guard_reads_them(key, value, read_as):
    """Config's typed value (what the join line passes on) comes from the guard's own reader,
    even where no mode's checks run."""
    if read_as is None:
        with pytest.raises(SettingsError, match=f"{key} is {value!r}; write a number"):
            read(environ={key: value}, config="", machine=MACHINE)
    else:
        config = read(environ={key: value}, config="", machine=MACHINE)
        assert getattr(config, key.removeprefix("GPUHUB_").lower()) == read_as


@pytest.mark.parametrize(
    "key, value, read_as",
    [
        ("GPUHUB_DISK_BUDGET_GB", "20", 20.0),
        ("GPUHUB_DISK_BUDGET_GB", "2.5", 2.5),
        ("GPUHUB_DISK_BUDGET_GB", "0", 0.0),  # no budget
        ("GPUHUB_DISK_BUDGET_GB", "100000", 100000.0),
        ("GPUHUB_DISK_SAFETY_PERCENT", "90", 90),
        ("GPUHUB_DISK_SAFETY_PERCENT", "95%", 95),
        ("GPUHUB_DISK_SAFETY_PERCENT", "50", 50),
        ("GPUHUB_DISK_SAFETY_PERCENT", "99", 99),
        ("GPUHUB_DISK_SAFETY_PERCENT", "0", 0),  # no safety line
    ],
)
def test_the_disk_settings_are_typed(key, value, read_as):
    config = read(environ={key: value}, config="", machine=MACHINE)
    assert getattr(config, key.removeprefix("GPUHUB_").lower()) == read_as
    assert from_environment({key: config.values[key]}, machine=MACHINE).values[key] == value


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("GPUHUB_DISK_BUDGET_GB", "-1", "from 0 (no budget) to 100000, e.g. 20 or 2.5"),
        ("GPUHUB_DISK_BUDGET_GB", "100001", "from 0 (no budget) to 100000"),
        ("GPUHUB_DISK_BUDGET_GB", "20G", "write the GB each participant may use"),
        ("GPUHUB_DISK_BUDGET_GB", "nan", "write the GB"),
        ("GPUHUB_DISK_BUDGET_GB", "", "write the GB"),
        ("GPUHUB_DISK_SAFETY_PERCENT", "49", "from 50 to 99, e.g. 90"),
        ("GPUHUB_DISK_SAFETY_PERCENT", "100", "from 50 to 99"),
        ("GPUHUB_DISK_SAFETY_PERCENT", "90.5", "write a whole percentage"),
        ("GPUHUB_DISK_SAFETY_PERCENT", "-5", "or 0 for no safety line"),
    ],
)
def test_a_disk_setting_out_of_range_is_refused_with_what_to_write(base, key, value, says):
    found = problems(github(base, **{key: value}), exists=lambda path: path == "/k")
    assert found == [f"{key} is {value!r}; {found[0].split('; ', 1)[1]}"]
    assert says in found[0]
    with pytest.raises(SettingsError, match=re.escape(f"{key} is {value!r}; write")):
        read(environ={key: value}, config="", machine=MACHINE)


def test_environments_that_do_not_convert_are_named():
    with pytest.raises(SettingsError, match=r"the environment: GPUHUB_ENVIRONMENTS is 'A=x A=y'"):
        from_environment({"GPUHUB_ENVIRONMENTS": "A=x A=y"})
    with pytest.raises(SettingsError, match=r"GPUHUB_SIMULATED_GPUS is 'yes'; write 1 or 0"):
        from_environment({"GPUHUB_SIMULATED_GPUS": "yes"})


def test_read_finds_the_config_file_as_the_deploy_scripts_do(tmp_path, monkeypatch):
    config = tmp_path / "mine.env"
    config.write_text("GPUHUB_STACK=mine\n")
    cfg = read(environ={"GPUHUB_CONFIG": str(config)}, machine=MACHINE)
    assert cfg.stack == "mine" and cfg.config_file == str(config)
    assert cfg.origin["GPUHUB_STACK"] == f"{config} line 1"
    assert read(environ={"GPUHUB_CONFIG": "none"}, machine=MACHINE).stack == "gpuhub"
    # an explicit config wins over GPUHUB_CONFIG; "" is none
    assert read(environ={"GPUHUB_CONFIG": str(config)}, config="", machine=MACHINE).stack == (
        "gpuhub"
    )


def test_config_file_none_explicit_or_the_checkouts_config_env(tmp_path, monkeypatch):
    assert config_file({"GPUHUB_CONFIG": "none"}) == ""
    assert config_file({"GPUHUB_CONFIG": "/etc/hub.env"}) == "/etc/hub.env"
    monkeypatch.setattr(settings_module, "REPO", tmp_path)
    assert config_file({}) == ""
    assert config_file({"GPUHUB_CONFIG": ""}) == ""
    (tmp_path / "config.env").write_text("")
    assert config_file({}) == str(tmp_path / "config.env")
    assert config_file({"GPUHUB_CONFIG": "none"}) == ""
    assert settings_module.REPO != REPO  # the patch took
    assert Path(settings_module.DEFAULTS) == DEFAULTS


def test_from_environment_is_the_defaults_under_what_the_stack_passes(tmp_path):
    config = tmp_path / "c.env"
    config.write_text("GPUHUB_STACK=from-the-file\n")
    environ = {
        "GPUHUB_CONFIG": str(config),  # never read in the hub
        "GPUHUB_STACK": "prod",
        "GPUHUB_SIMULATED_GPUS": "1",
        "GPUHUB_HOSTNAME": "",  # no mode checks
        "GPUHUB_NOT_A_SETTING": "x",
        "HOME": "/root",
    }
    cfg = from_environment(environ, MACHINE)
    assert cfg.stack == "prod" and cfg.simulated_gpus is True
    assert cfg.config_file == ""
    # a default referring to another setting takes its passed value
    assert cfg.state_dir == "/var/lib/gpu-jupyterhub/prod"
    assert cfg.mem_limit == 10581 * MIB  # not passed: auto, sized for MACHINE as `read` does
    assert cfg.origin["GPUHUB_STACK"] == "the environment"
    assert cfg.origin["GPUHUB_CPU_LIMIT"] == "the default"
    assert "GPUHUB_NOT_A_SETTING" not in cfg.values
    assert set(cfg.values) == set(read_defaults(str(DEFAULTS)))


def test_with_values_gives_a_changed_copy_and_the_config_is_frozen():
    cfg = from_environment({})
    filled = cfg.with_values({"GPUHUB_SIMULATED_GPUS": "1", "GPUHUB_HTTP_PORT": "80"}, "make up")
    assert filled.simulated_gpus is True and filled.http_port == 80
    assert filled.origin["GPUHUB_HTTP_PORT"] == "make up"
    assert cfg.simulated_gpus is False and cfg.values["GPUHUB_HTTP_PORT"] == "8000"
    with pytest.raises(KeyError, match="GPUHUB_NOPE"):
        cfg.with_values({"GPUHUB_NOPE": "1"}, "make up")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.http_port = 1
    with pytest.raises(SettingsError, match="make up: GPUHUB_HTTP_PORT is 'x'"):
        cfg.with_values({"GPUHUB_HTTP_PORT": "x"}, "make up")


def test_a_config_missing_a_setting_names_it_and_repr_hides_the_secret():
    values = from_environment({"GPUHUB_GITHUB_CLIENT_SECRET": "s3cret-value"}).values
    assert "s3cret-value" not in repr(Config(values))
    del values["GPUHUB_MAX_AGE"]
    with pytest.raises(SettingsError, match="GPUHUB_MAX_AGE is not set"):
        Config(values)


def test_settings_env_ships_with_the_deploy_package():
    """deploy.settings finds it beside itself: in the checkout, and in an installed package
    (the hub's image), where pyproject.toml's package data puts it (the image's copy of it:
    test_import_arrows.py)."""
    assert settings_module.DEFAULTS == DEFAULTS
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^include = \[.*"deploy".*\]$', pyproject, re.M)
    assert re.search(r'^deploy = \[.*"settings\.env".*\]$', pyproject, re.M)


def test_the_deploy_package_imports_nothing():
    """Imported by a bare python3 and on GPU machines: its __init__ must stay empty of imports."""
    tree = ast.parse((REPO / "deploy" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


# ---- one typed value per setting: the check is the value the hub and the spawner use ------


@pytest.mark.parametrize(
    "written, cores, memory, tasks",
    [
        (("4", "16G", "4096"), 4.0, 16 * GIB, 4096),
        (("0.5", "16g", "0"), 0.5, 16 * GIB, 0),  # docker run --memory's lower case
        ((".25", "16GiB", ""), 0.25, 16 * GIB, None),
        (("2", "16 GB", ""), 2.0, 16 * GIB, None),  # Docker's binary GB
        (("1.5", "1.5G", "256"), 1.5, 1536 * MIB, 256),
        (("", "512m", ""), None, 512 * MIB, None),
        (("", "", ""), None, None, None),
    ],
)
def test_limits_are_read_once_into_cores_bytes_and_tasks(base, written, cores, memory, tasks):
    limits = dict(zip(("GPUHUB_CPU_LIMIT", "GPUHUB_MEM_LIMIT", "GPUHUB_PIDS_LIMIT"), written))
    assert problems(github(base, **limits)) == []  # the check accepts them ...
    cfg = Config({**base, **limits})  # ... and they are these values
    assert (cfg.cpu_limit, cfg.mem_limit, cfg.pids_limit) == (cores, memory, tasks)
    # handed on in one written form that reads back to the same value (the hub's reading)
    again = Config(cfg.values)
    assert (again.cpu_limit, again.mem_limit, again.pids_limit) == (cores, memory, tasks)
    assert again.values == cfg.values


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("GPUHUB_CPU_LIMIT", "inf", "write a number of cores with digits and a decimal point"),
        ("GPUHUB_CPU_LIMIT", "nan", "write a number of cores"),
        ("GPUHUB_CPU_LIMIT", "1e3", "write a number of cores"),
        ("GPUHUB_CPU_LIMIT", "4 cores", "(no unit)"),
        ("GPUHUB_CPU_LIMIT", "2,5", "write a decimal point: 2.5"),
        ("GPUHUB_CPU_LIMIT", "500m", "not thousandths of one: 0.5"),
        ("GPUHUB_CPU_LIMIT", "0", "at least 0.01"),
        ("GPUHUB_CPU_LIMIT", "4_0", "write a number of cores"),
        ("GPUHUB_CPU_LIMIT", "\u0664", "write a number of cores"),  # an Arabic-Indic 4
        ("GPUHUB_MEM_LIMIT", "16Q", "write a size with its unit"),
        ("GPUHUB_MEM_LIMIT", "16", "did you mean 16G?"),
        ("GPUHUB_MEM_LIMIT", "-1G", "write a size with its unit"),
        ("GPUHUB_PIDS_LIMIT", "\u00b2", "at least 256"),  # a superscript 2
    ],
)
def test_a_limit_the_spawner_could_not_use_is_refused_by_the_check_and_by_config(
    base, key, value, says
):
    (problem,) = problems(github(base, **{key: value}))
    assert problem.startswith(f"{key} is {value!r}; ") and says in problem
    with pytest.raises(SettingsError) as refused:
        Config({**base, key: value}, {key: "config.env line 3"})
    assert refused.value.problems == [f"config.env line 3: {problem}"]


@pytest.mark.parametrize(
    "value, admins",
    [
        ("ada", ["ada"]),
        ("@ada", ["ada"]),  # as GitHub mentions them
        ("https://github.com/Ada/", ["ada"]),  # the profile's address
        ("Ada, @bob  github.com/cy", ["ada", "bob", "cy"]),
        ("ada,ADA,@ada", ["ada"]),
        ("name-, a--b", ["name-", "a--b"]),  # older GitHub logins
    ],
)
def test_admin_users_are_the_logins_the_hub_matches(base, value, admins):
    assert problems(github(base, GPUHUB_ADMIN_USERS=value)) == []
    cfg = Config({**base, "GPUHUB_ADMIN_USERS": value})
    assert cfg.admin_users == admins
    assert cfg.values["GPUHUB_ADMIN_USERS"] == ",".join(admins)


@pytest.mark.parametrize(
    "value, says",
    [
        ("https://gitlab.com/ada", "'https://gitlab.com/ada' is not a username"),
        ("ada_l", "'ada_l' is not a username"),
        ("-ada", "'-ada' is not a username"),
        ("https://github.com/orgs/x", "is not a username"),
    ],
)
def test_an_admin_that_is_no_login_is_refused_with_the_form_to_write(base, value, says):
    (problem,) = problems(github(base, GPUHUB_ADMIN_USERS=value))
    assert problem.startswith("GPUHUB_ADMIN_USERS: ") and says in problem
    assert "write the GitHub login alone" in problem


@pytest.mark.parametrize(
    "value, orgs",
    [
        ("gpu-school", ["gpu-school"]),
        ("gpu-school gpu-school:tutors", ["gpu-school", "gpu-school:tutors"]),
        ("gpu-school:tutors, other-org", ["gpu-school:tutors", "other-org"]),
        ("gpu-school:tutors,other-org:tas", ["gpu-school:tutors", "other-org:tas"]),
        ("gpu-school:teaching-assistants", ["gpu-school:teaching-assistants"]),
        ("GPU-School:Tutors", ["gpu-school:tutors"]),  # GitHub ignores case
        ("@gpu-school/tutors", ["gpu-school:tutors"]),  # as GitHub mentions a team
        ("https://github.com/orgs/gpu-school/teams/tutors", ["gpu-school:tutors"]),
        ("https://github.com/gpu-school", ["gpu-school"]),
        # the address bar on the team's members tab, the organization's people tab
        ("https://github.com/orgs/gpu-school/teams/tutors/members", ["gpu-school:tutors"]),
        ("https://github.com/orgs/GPU-School/people", ["gpu-school"]),
        (
            "https://github.com/orgs/gpu-school/teams/tutors other-org",
            ["gpu-school:tutors", "other-org"],
        ),
    ],
)
def test_allowed_orgs_are_organizations_and_team_slugs(base, value, orgs):
    assert problems(github(base, GPUHUB_ALLOWED_ORGS=value)) == []
    cfg = Config({**base, "GPUHUB_ALLOWED_ORGS": value})
    assert cfg.allowed_orgs == orgs
    assert cfg.values["GPUHUB_ALLOWED_ORGS"] == ",".join(orgs)


@pytest.mark.parametrize(
    "value",
    [
        "gpu-school:Teaching Assistants",  # the display name, without commas
        "gpu-school:teaching assistants",
        "gpu-school:Teaching Assistants, other-org",  # ... and with them
    ],
)
def test_a_teams_display_name_is_refused_with_its_slug_and_where_to_find_it(base, value):
    (problem,) = problems(github(base, GPUHUB_ALLOWED_ORGS=value))
    assert problem.startswith("GPUHUB_ALLOWED_ORGS: 'gpu-school:")
    assert "write the team's slug, gpu-school:teaching-assistants" in problem.lower()
    assert "https://github.com/orgs/gpu-school/teams/teaching-assistants" in problem
    with pytest.raises(SettingsError):
        Config({**base, "GPUHUB_ALLOWED_ORGS": value})


@pytest.mark.parametrize(
    "value, says",
    [
        (
            "https://github.com/gpu-school/gpu101",
            "is not the page of an organization or a team; write the organization, gpu-school, "
            "or one of its teams as gpu-school:TEAM (TEAM: the end of the team's page address, "
            "https://github.com/orgs/gpu-school/teams/TEAM)",
        ),
        ("https://github.com/orgs/gpu-school/teams", "write the organization, gpu-school, or"),
        ("https://gitlab.com/gpu-school", "is not on GitHub; write the GitHub organization"),
    ],
)
def test_an_address_of_no_organization_or_team_is_refused_with_what_to_write(base, value, says):
    (problem,) = problems(github(base, GPUHUB_ALLOWED_ORGS=value))
    assert problem.startswith(f"GPUHUB_ALLOWED_ORGS: {value!r} is ") and says in problem
    with pytest.raises(SettingsError):
        Config({**base, "GPUHUB_ALLOWED_ORGS": value})


def test_a_team_followed_by_a_bare_organization_needs_commas(base):
    (problem,) = problems(github(base, GPUHUB_ALLOWED_ORGS="gpu-school:tutors other-org"))
    assert "separate entries with commas" in problem
    # once commas separate the entries, a blank is inside one
    (problem,) = problems(github(base, GPUHUB_ALLOWED_ORGS="org-a org-b, org-c"))
    assert "'org-a org-b' holds a blank" in problem and "separate entries with commas" in problem
    assert problems(github(base, GPUHUB_ALLOWED_ORGS="gpu-school:tutors, other-org")) == []


@pytest.mark.parametrize(
    "value, host",
    [
        ("hub.uni.example", "hub.uni.example"),
        ("Hub.Uni.Example", "hub.uni.example"),  # as browsers send it
        ("10.0.0.5", "10.0.0.5"),
        ("2001:DB8:0:0::5", "2001:db8::5"),
        ("[2001:db8::5]", "2001:db8::5"),
        ("xn--hrsaal-wxa.uni.example", "xn--hrsaal-wxa.uni.example"),
    ],
)
def test_the_hostname_is_kept_in_the_one_form_browsers_and_github_use(base, value, host):
    local = {**base, "GPUHUB_HOSTNAME": value, "GPUHUB_TLS": "off"}
    assert problems(local) == []
    assert Config(local).hostname == host == Config(local).values["GPUHUB_HOSTNAME"]


@pytest.mark.parametrize(
    "value, says",
    [
        ("hub.uni.example.", "without the final dot, hub.uni.example"),
        ("hörsaal.uni.example", "its ASCII form, xn--hrsaal-wxa.uni.example"),
        ("straße.example", "as your DNS provider shows it"),  # IDNA 2003 and 2008 differ
        ("https://hub.uni.example/", "without scheme or path: hub.uni.example"),
        ("hub.uni.example:8443", "the port is GPUHUB_HTTPS_PORT"),
        ("hub_1.uni.example", "write a DNS name"),
        ("hub example", "write a DNS name"),
        ("10.0.0.256", "not an IP address"),
        ("fe80::1%eth0", "with a zone"),
    ],
)
def test_a_hostname_no_callback_would_match_is_refused_with_the_fix(base, value, says):
    (problem,) = problems({**base, "GPUHUB_HOSTNAME": value, "GPUHUB_TLS": "self-signed"})
    assert problem.startswith(f"GPUHUB_HOSTNAME is {value!r}; ") and says in problem


def test_an_ipv6_hostname_is_refused_for_github_login_and_the_https_gateway(base):
    (problem,) = problems(github(base, GPUHUB_HOSTNAME="2001:db8::5", GPUHUB_TLS="off"))
    assert "an IPv6 address: GitHub does not match it in an OAuth app's callback URL" in problem
    assert problem.endswith("give the hub a DNS name (an AAAA record) and write that")
    # one line for the one fix, whatever needs it
    (problem,) = problems(github(base, GPUHUB_HOSTNAME="2001:db8::5", GPUHUB_TLS="self-signed"))
    assert "callback URL and the HTTPS gateway takes no bare IPv6 address" in problem
    local = {**base, "GPUHUB_HOSTNAME": "2001:db8::5"}
    (problem,) = problems({**local, "GPUHUB_TLS": "self-signed"})
    assert problem.endswith("(an AAAA record) and write that, or set GPUHUB_TLS=off")
    assert problems({**local, "GPUHUB_TLS": "off"}) == []  # plain HTTP at [2001:db8::5]


# ---- config files as organizers hand them over: one line per real problem ----------------

CONFIGS = REPO / "tests" / "unit" / "configs"


def organizers_file(tmp_path, name: str, mode: int = 0o600) -> str:
    copy = tmp_path / name
    copy.write_bytes((CONFIGS / name).read_bytes())
    copy.chmod(mode)
    return str(copy)


def refused_lines(path: str, mode: str = "up", environ=None) -> list[str]:
    with pytest.raises(SettingsError) as refused:
        read(mode, environ=environ or {}, config=path, machine=MACHINE)
    return refused.value.problems


def test_what_the_check_would_pass_and_the_hub_then_fail_on_is_said_in_the_files_order(
    tmp_path,
):
    path = organizers_file(tmp_path, "accepted-then-failing.env")
    assert refused_lines(path) == [
        f"{path} line 1: GPUHUB_HOSTNAME is 'hub.uni.example.'; write it without the final "
        "dot, hub.uni.example: browsers and GitHub's OAuth callback check take the name "
        "without it",
        f"{path} line 5: GPUHUB_GITHUB_CLIENT_SECRET_FILE: {tmp_path}/client-secret.txt does "
        f"not exist ('client-secret.txt' is relative to the config file's folder {tmp_path})",
        f"{path} line 6: GPUHUB_ROSTER: cannot read {tmp_path}/roster.csv (No such file or "
        f"directory); check the path ('roster.csv' is relative to the config file's folder "
        f"{tmp_path})",
        f"{path} line 8: GPUHUB_CPU_LIMIT is 'inf'; write a number of cores with digits and a "
        "decimal point, such as 4 or 0.5 (no unit), or leave it empty for no limit",
        f"{path} line 9: GPUHUB_MEM_LIMIT is '16 GB of RAM'; write a size with its unit, such "
        "as 16G or 512M (K, M, G, T: powers of 1024), or leave it empty for no limit",
    ]


def test_relative_files_are_found_beside_the_config_file_or_in_the_current_folder(
    tmp_path, monkeypatch
):
    folder = tmp_path / "workshop"
    folder.mkdir()
    (folder / "roster.txt").write_text("ada\nbob\n")
    (folder / "client-secret.txt").write_text("3c9f1e0d8b7a\r\n")  # Notepad's line end
    (folder / "client-secret.txt").chmod(0o600)
    config = folder / "config.env"
    config.write_text(
        "GPUHUB_HOSTNAME=hub.uni.example\nGPUHUB_TLS=self-signed\nGPUHUB_AUTH=github\n"
        "GPUHUB_GITHUB_CLIENT_ID=Iv1.8a61f9b3a7aba766\n"
        "GPUHUB_GITHUB_CLIENT_SECRET_FILE=client-secret.txt\nGPUHUB_ROSTER=roster.txt\n"
        "GPUHUB_CPU_LIMIT=4\nGPUHUB_MEM_LIMIT=16G\nGPUHUB_PIDS_LIMIT=4096\n"
    )
    config.chmod(0o600)
    elsewhere = tmp_path / "checkout"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where `make` runs
    cfg = read("up", environ={}, config=str(config), machine=MACHINE)
    assert cfg.roster == str(folder / "roster.txt")  # handed on absolute
    assert cfg.github_client_secret_file == str(folder / "client-secret.txt")
    assert files.read_secret_file(cfg.github_client_secret_file) == "3c9f1e0d8b7a"
    # from the environment, a relative path is the current folder's, and says so
    found = refused_lines(str(config), environ={"GPUHUB_ROSTER": "roster.txt"})
    assert found == [
        f"the environment: GPUHUB_ROSTER: cannot read {elsewhere}/roster.txt (No such file or "
        f"directory); check the path ('roster.txt' is relative to the current folder "
        f"{elsewhere})"
    ]


@pytest.mark.parametrize(
    "content, mode, says",
    [
        (b"3c9f1e0d8b7a\n", 0o644, "may be read by others (mode 0644); run: chmod 600 "),
        (b"3c9f1e0d8b7a\n", 0o640, "may be read by its group staff (mode 0640); run: chmod 600 "),
        ("3c9f1e0d8b7a\r\n".encode("utf-16"), 0o600, "is saved as UTF-16"),
        (b"\n", 0o600, "is empty; write the OAuth app's client secret into it"),
        (b"3c9f1e0d8b7a\nold-secret\n", 0o600, "more than one line"),
    ],
)
def test_a_secret_file_others_may_read_or_holding_no_single_secret_is_refused(
    tmp_path, content, mode, says
):
    secret = tmp_path / "client-secret.txt"
    secret.write_bytes(content)
    secret.chmod(mode)
    config = tmp_path / "config.env"
    config.write_text(
        "GPUHUB_HOSTNAME=hub.uni.example\nGPUHUB_TLS=self-signed\nGPUHUB_AUTH=github\n"
        "GPUHUB_GITHUB_CLIENT_ID=Iv1.8a61f9b3a7aba766\nGPUHUB_ALLOWED_ORGS=gpu-school\n"
        f"GPUHUB_GITHUB_CLIENT_SECRET_FILE={secret}\n"
        "GPUHUB_CPU_LIMIT=4\nGPUHUB_MEM_LIMIT=16G\nGPUHUB_PIDS_LIMIT=4096\n"
    )
    config.chmod(0o600)
    (problem,) = refused_lines(str(config))
    assert problem.startswith(f"{config} line 6: GPUHUB_GITHUB_CLIENT_SECRET_FILE: {secret} ")
    assert says in problem
    assert "3c9f1e0d8b7a" not in problem


@pytest.fixture(autouse=True)
def files_of_group_staff(monkeypatch):
    """The group a file's mode lets read it is named "staff" (not this machine's groups)."""
    monkeypatch.setattr(files, "_group_name", lambda gid: "staff")


@pytest.fixture(autouse=True)
def folders_above_the_tests_open(monkeypatch, tmp_path_factory):
    """The test's temporary folder and those above it (pytest makes them 0700: only their
    owner may enter) are taken as open to all, as /etc or /srv are: a file's own mode then
    decides whether others may read it, unless a folder the test made bars them
    (``open_to_others``)."""
    base = tmp_path_factory.getbasetemp().resolve()
    real = files._folder_mode

    def folder_mode(folder):
        pytests = folder in (base, *base.parents) or folder.parent == base
        return 0o40755 if pytests else real(folder)

    monkeypatch.setattr(files, "_folder_mode", folder_mode)


def tls_files_config(tmp_path, cert_mode: int, key_mode: int | None) -> Path:
    """A config file with GPUHUB_TLS=files (line 2: the certificate, line 3: the key), its
    certificate and key (a folder when ``key_mode`` is None) at those modes."""
    cert, key = tmp_path / "fullchain.pem", tmp_path / "privkey.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    cert.chmod(cert_mode)
    if key_mode is None:
        key.mkdir()
    else:
        key.write_text("-----BEGIN PRIVATE KEY-----\n")
        key.chmod(key_mode)
    config = tmp_path / "config.env"
    config.write_text(
        f"GPUHUB_TLS=files\nGPUHUB_TLS_CERT={cert}\nGPUHUB_TLS_KEY={key}\n"
        "GPUHUB_HOSTNAME=hub.uni.example\nGPUHUB_AUTH=local\nGPUHUB_ADMIN_USERS=ada\n"
        "GPUHUB_CPU_LIMIT=4\nGPUHUB_MEM_LIMIT=16G\nGPUHUB_PIDS_LIMIT=4096\n"
    )
    config.chmod(0o600)
    return config


@pytest.mark.parametrize(
    "key_mode, says",
    [
        (0o644, "may be read by others (mode 0644); run: chmod 600 {key}"),
        (0o640, "may be read by its group staff (mode 0640); run: chmod 600 {key}"),
        (0o604, "may be read by others (mode 0604); run: chmod 600 {key}"),
        (None, "is not a file; name the file holding the private key"),
    ],
    ids=["0644", "0640", "0604", "a folder"],
)
def test_a_tls_key_others_may_read_is_refused_with_the_fix(tmp_path, key_mode, says):
    config = tls_files_config(tmp_path, 0o644, key_mode)
    key = tmp_path / "privkey.pem"
    assert refused_lines(str(config)) == [
        f"{config} line 3: GPUHUB_TLS_KEY: {key} {says.format(key=key)}"
    ]


def test_a_tls_key_the_ssl_cert_group_may_read_is_accepted_others_still_not(tmp_path, monkeypatch):
    """Debian's and Ubuntu's way (ssl-cert-snakeoil.key: 0640 root:ssl-cert in /etc/ssl/private,
    0710 root:ssl-cert): the group made for reading private keys may; others may not."""
    config = tls_files_config(tmp_path, 0o644, 0o640)
    key = tmp_path / "privkey.pem"
    monkeypatch.setattr(files, "_group_name", lambda gid: "ssl-cert")
    assert read("up", environ={}, config=str(config), machine=MACHINE).tls == "files"
    key.chmod(0o644)
    assert refused_lines(str(config)) == [
        f"{config} line 3: GPUHUB_TLS_KEY: {key} may be read by others (mode 0644); "
        f"run: chmod 600 {key}"
    ]
    # a secret file is no TLS key: its group may not read it, whichever group
    secret = tmp_path / "client-secret.txt"
    secret.write_text("3c9f1e0d8b7a\n")
    secret.chmod(0o640)
    problems = settings_module.secret_file_problems(
        {"GPUHUB_GITHUB_CLIENT_SECRET_FILE": str(secret)}
    )
    assert problems == [
        f"GPUHUB_GITHUB_CLIENT_SECRET_FILE: {secret} may be read by its group ssl-cert "
        f"(mode 0640); run: chmod 600 {secret}"
    ]


def test_a_tls_key_only_its_owner_may_read_and_a_public_certificate_are_accepted(tmp_path):
    config = tls_files_config(tmp_path, 0o644, 0o600)
    cfg = read("up", environ={}, config=str(config), machine=MACHINE)
    assert (cfg.tls, cfg.tls_key) == ("files", str(tmp_path / "privkey.pem"))
    (tmp_path / "privkey.pem").chmod(0o400)
    assert read("up", environ={}, config=str(config), machine=MACHINE).tls == "files"


def test_a_tls_key_in_a_folder_only_its_owner_may_enter_is_accepted(tmp_path):
    """An older certbot's layout: live/NAME/privkey.pem links to archive/NAME/privkey1.pem, of
    mode 0644, in archive/ of mode 0700."""
    config = tls_files_config(tmp_path, 0o644, 0o600)
    archive, live = tmp_path / "archive" / "hub", tmp_path / "live" / "hub"
    archive.mkdir(parents=True)
    live.mkdir(parents=True)
    (archive / "privkey1.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    (archive / "privkey1.pem").chmod(0o644)
    (live / "privkey.pem").symlink_to("../../archive/hub/privkey1.pem")
    config.write_text(
        config.read_text().replace(str(tmp_path / "privkey.pem"), str(live / "privkey.pem"))
    )
    (tmp_path / "archive").chmod(0o700)
    assert read("up", environ={}, config=str(config), machine=MACHINE).tls == "files"
    (tmp_path / "archive").chmod(0o755)  # the folder lets others in: the key's mode counts
    assert refused_lines(str(config)) == [
        f"{config} line 3: GPUHUB_TLS_KEY: {live / 'privkey.pem'} may be read by others "
        f"(mode 0644); run: chmod 600 {live / 'privkey.pem'}"
    ]


def test_a_tls_key_of_no_use_is_not_checked_for_its_mode(tmp_path):
    config = tls_files_config(tmp_path, 0o644, 0o644)
    config.write_text(config.read_text().replace("GPUHUB_TLS=files", "GPUHUB_TLS=self-signed"))
    (problem,) = refused_lines(str(config))
    assert "GPUHUB_TLS_CERT / GPUHUB_TLS_KEY are set but GPUHUB_TLS is not files" in problem


def test_an_idn_hostname_is_refused_with_its_ascii_form(tmp_path):
    path = organizers_file(tmp_path, "idn-hostname.env")
    assert refused_lines(path) == [
        f"{path} line 1: GPUHUB_HOSTNAME is 'hörsaal.uni.example'; an internationalized name; "
        "write its ASCII form, xn--hrsaal-wxa.uni.example (browsers and certificates use it, "
        "and GitHub's OAuth app must have the same)"
    ]


def test_utf16_without_its_byte_order_mark_is_one_line_not_one_per_line(tmp_path):
    path = organizers_file(tmp_path, "utf16le-no-bom.env")
    (problem,) = refused_lines(path)
    assert problem.startswith(f"{path} holds NUL bytes: saved as UTF-16 without a byte order")
    assert "save it as UTF-8" in problem


def test_a_large_file_given_by_mistake_is_one_line(tmp_path):
    # a registration export of 90,000 participants (5 MB) named as the config file
    export = tmp_path / "registrations.csv"
    rows = [f"p{n},p{n}@uni.example,gh-user-{n},Faculty of Engineering" for n in range(90_000)]
    export.write_text("name,email,github,faculty\n" + "\n".join(rows) + "\n")
    assert export.stat().st_size > 5 * 1000**2
    (problem,) = refused_lines(str(export))
    assert problem.startswith(f"{export} is 5.") and "is it the right file?" in problem


def test_the_same_problem_on_many_lines_is_one_line_and_many_problems_are_capped(tmp_path):
    export = tmp_path / "roster.csv"  # a small file given by mistake: no line has a '='
    export.write_text("name,github\n" + "".join(f"p{n},gh-{n}\n" for n in range(500)))
    assert refused_lines(str(export)) == [
        f"{export} lines 1, 2, 3 and 498 more: no '=' in it; write GPUHUB_NAME=value, or start "
        "a comment with #"
    ]
    names = tmp_path / "names.env"  # 30 different problems: the first 20, and a count
    names.write_text("".join(f"GPUHUB_NOT_{n}=x\n" for n in range(30)))
    found = refused_lines(str(names), mode=None)  # only what cannot be read
    assert len(found) == 21 and found[-1] == "... and 10 more problems like these"
    assert found[0].startswith(f"{names} line 1: unknown setting GPUHUB_NOT_0")


def test_the_demo_refuses_more_cores_per_server_than_its_machine_has():
    with pytest.raises(SettingsError) as refused:
        read("demo", environ={"GPUHUB_CPU_LIMIT": "32"}, config="", machine=MACHINE)
    assert refused.value.problems == [
        "the environment: GPUHUB_CPU_LIMIT is 32 but this machine, which runs the demo's "
        "servers, has 16 cores; Docker would refuse to start them: write at most 16"
    ]
    assert read("demo", environ={"GPUHUB_CPU_LIMIT": "16"}, config="", machine=MACHINE)


# ---- what the environment gives: the file's checks, and said ------------------------------


def test_an_exported_name_that_is_no_setting_is_refused_with_the_one_meant(tmp_path):
    config = tmp_path / "c.env"
    config.write_text("GPUHUB_TLS=off\n")
    with pytest.raises(SettingsError) as refused:
        read(environ={"GPUHUB_TSL": "acme", "GPUHUB_WIBBLE": "1"}, config=str(config))
    assert refused.value.problems == [
        "the environment: unknown setting GPUHUB_TSL; did you mean GPUHUB_TLS? unset it "
        "(unset GPUHUB_TSL), or put the setting in the config file (deploy/settings.env lists "
        "them all)",
        "the environment: unknown setting GPUHUB_WIBBLE; unset it (unset GPUHUB_WIBBLE), or put "
        "the setting in the config file (deploy/settings.env lists them all)",
    ]
    # the project's own variables, an old name and the bed's are no settings and no mistake
    own = {"GPUHUB_CONFIG": "none", "GPUHUB_GPU_SLICES": "1", "GPUHUB_BED_GPUS": "2"}
    assert read(environ=own, config=str(config), machine=MACHINE).tls == "off"


@pytest.mark.parametrize(
    "quoted", ["\u201cs3cret\u201d", "\u2018s3cret\u2019", "\u00abs3cret\u00bb"]
)
def test_a_value_in_typographic_quotes_is_refused_in_the_file_and_the_environment(tmp_path, quoted):
    config = tmp_path / "c.env"
    config.write_text(f"GPUHUB_GITHUB_CLIENT_SECRET={quoted}\n")
    with pytest.raises(SettingsError) as refused:
        read(environ={}, config=str(config))
    (line,) = refused.value.problems
    assert line.startswith(f"{config} line 1: GPUHUB_GITHUB_CLIENT_SECRET: the value is in ")
    assert 'write it without quotes, or in straight ones ("...")' in line
    assert "s3cret" not in line  # a secret is never shown
    config.write_text("")
    with pytest.raises(SettingsError, match="the environment: GPUHUB_STACK: the value is in"):
        read(environ={"GPUHUB_STACK": quoted}, config=str(config))
    # straight quotes, and typographic ones inside a value, are the organizer's
    config.write_text('GPUHUB_STACK="gpuhub"\nGPUHUB_HOSTNAME=hub.example.org\n')
    assert read(environ={}, config=str(config), machine=MACHINE).stack == "gpuhub"


def test_make_up_says_which_settings_the_environment_gave_never_a_secret(tmp_path):
    config = tmp_path / "c.env"
    config.write_text("GPUHUB_TLS=self-signed\n")
    environ = {"GPUHUB_TLS": "off", "GPUHUB_GITHUB_CLIENT_SECRET": "s3cret"}
    said = settings_module.from_the_environment(
        read(environ=environ, config=str(config), machine=MACHINE)
    )
    assert said == (  # in deploy/settings.env's order
        f"from the environment, over {config}: GPUHUB_GITHUB_CLIENT_SECRET=***, GPUHUB_TLS=off "
        "(to use the file's: unset GPUHUB_GITHUB_CLIENT_SECRET GPUHUB_TLS)"
    )
    assert settings_module.from_the_environment(read(environ={}, config=str(config))) == ""


#: where the project's programs read GPUHUB_* variables: everything but the unit tests (whose
#: names are made up on purpose)
_READERS = ("gpu_swarm_spawner", "worker_setup", "deploy", "tutorial_sync", "images", "tests")


def test_every_gpuhub_variable_the_code_names_is_a_setting_or_declared_as_none():
    """A variable the code reads that is neither a setting nor in envfile.NOT_SETTINGS would be
    refused when an organizer (or the tests) exports it."""
    defaults = set(read_defaults(str(DEFAULTS)))
    named: dict[str, str] = {}
    files = [REPO / "Makefile", REPO / "jupyterhub_config.py"]
    for top in _READERS:
        files += [
            p
            for p in (REPO / top).rglob("*")
            if p.is_file()
            and p.suffix in ("", ".py", ".sh", ".yml", ".env", ".json")
            and "unit" not in p.parts
            and "__pycache__" not in p.parts
        ]
    for path in files:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for name in re.findall(r"\bGPUHUB_[A-Z0-9_]*[A-Z0-9]\b", text):
            named.setdefault(name, str(path.relative_to(REPO)))
    strays = {
        name: where
        for name, where in named.items()
        if name not in defaults
        and name not in envfile.RENAMED
        and name not in envfile.NOT_SETTINGS
        and not name.startswith(envfile.NOT_SETTINGS_PREFIXES)
        and name not in ("GPUHUB_NAME", "GPUHUB_X")  # the messages' "GPUHUB_NAME=value"
    }
    assert strays == {}, "add each to envfile.NOT_SETTINGS (with what reads it) or settings.env"


@pytest.mark.parametrize(
    "key, value, says",
    [
        (
            "GPUHUB_GITHUB_CLIENT_ID",
            "Iv1.8a61 f9b3",
            "copy the Client ID from the OAuth app's page",
        ),
        ("GPUHUB_GITHUB_CLIENT_ID", "Iv1.8a61f9b3\u200b", "copy the Client ID"),
        ("GPUHUB_GITHUB_CLIENT_SECRET", "0a1b 2c3d", "holds blanks or characters"),
        ("GPUHUB_GITHUB_CLIENT_SECRET", "0a1b2c3d\u2019", "holds blanks or characters"),
        ("GPUHUB_ACME_EMAIL", "ops@uni.example, me@uni.example", "write one e-mail address"),
        ("GPUHUB_ACME_EMAIL", "ops at uni.example", "write one e-mail address"),
        ("GPUHUB_ACME_EMAIL", "<ops@uni.example>", "write one e-mail address"),
    ],
)
def test_free_text_settings_are_held_to_what_github_and_caddy_take(base, key, value, says):
    settings = github(base, GPUHUB_TLS="acme", GPUHUB_HOSTNAME="hub.example.org", **{key: value})
    found = [p for p in problems(settings) if p.startswith(key)]
    assert len(found) == 1 and says in found[0], found
    if "SECRET" in key:
        assert value not in found[0]


@pytest.mark.parametrize(
    "key, value",
    [
        ("GPUHUB_GITHUB_CLIENT_ID", "Ov23liA1b2C3d4E5f6G7"),
        ("GPUHUB_GITHUB_CLIENT_SECRET", "0123456789abcdef0123456789abcdef01234567"),
        ("GPUHUB_ACME_EMAIL", "o'brien@uni.example"),
        ("GPUHUB_ACME_EMAIL", "zo\u00eb@uni.example"),
    ],
)
def test_what_github_and_caddy_take_passes(base, key, value):
    settings = github(base, GPUHUB_TLS="acme", GPUHUB_HOSTNAME="hub.example.org", **{key: value})
    assert [p for p in problems(settings) if p.startswith(key)] == []


# ---- the fleet: GPU machines that follow the day (docs/autoscaling.md) --------------------


def fleet_on(base, **changes):
    """The demo's settings with the fleet on, commands that pass its checks and the shared
    homes it needs."""
    return {
        **base,
        "GPUHUB_FLEET": "on",
        "GPUHUB_FLEET_GROW_COMMAND": "resize --size {count}",
        "GPUHUB_FLEET_REMOVE_COMMAND": "delete --instance {machine}",
        "GPUHUB_HOMES_DIR": "/srv/gpuhub/homes",
        **changes,
    }


#: An organizer's config.env for `make up` with the fleet on (a cloud's recipe pasted in),
#: homes left at their default: the volumes on the GPU machines.
FLEET_WITHOUT_SHARED_HOMES = """\
GPUHUB_HOSTNAME=hub.uni.example
GPUHUB_TLS=self-signed
GPUHUB_AUTH=github
GPUHUB_GITHUB_CLIENT_ID=Iv1.8a61f9b3a7aba766
GPUHUB_GITHUB_CLIENT_SECRET=3c9f1e0d8b7a
GPUHUB_ALLOWED_ORGS=uni-gpu-workshop
GPUHUB_CPU_LIMIT=4
GPUHUB_MEM_LIMIT=16G
GPUHUB_PIDS_LIMIT=4096
# GPU machines that follow the day (docs/providers/gcp.env)
GPUHUB_FLEET=on
GPUHUB_FLEET_ENV='GROUP=gpu-workshop ZONE=europe-west4-a'
GPUHUB_FLEET_GROW_COMMAND='gcloud compute instance-groups managed resize "$GROUP" --zone "$ZONE" --size {count}'
GPUHUB_FLEET_REMOVE_COMMAND='gcloud compute instance-groups managed delete-instances "$GROUP" --zone "$ZONE" --instances {machine}'
"""  # noqa: E501  (a command is one line of the file)


def test_the_fleet_needs_shared_homes_as_a_machine_given_back_takes_its_volumes(base, tmp_path):
    """`make up`'s check (deploy check up: the settings' one reader) refuses the fleet with
    homes in volumes on the GPU machines, on the line that turned it on, saying why and what
    to write; with GPUHUB_HOMES_DIR, or with the fleet off, the same file passes."""
    from deploy.__main__ import read_settings

    config = tmp_path / "config.env"
    config.write_text(FLEET_WITHOUT_SHARED_HOMES)
    config.chmod(0o600)
    environ = {"GPUHUB_CONFIG": str(config)}
    with pytest.raises(SettingsError) as refused:
        read_settings("up", environ)
    assert refused.value.problems == [
        f"{config} line 11: GPUHUB_FLEET is on but GPUHUB_HOMES_DIR is empty: each "
        "participant's home would be the volume jy-home-<user> on the GPU machine that ran "
        "their server, and a machine the hub gives back is destroyed by the cloud with every "
        "file on it; set GPUHUB_HOMES_DIR to a folder on shared storage that the manager and "
        "every GPU machine mount at the same path, e.g. /srv/gpuhub/homes (docs/homes.md: NFS, "
        "served by the manager), or set GPUHUB_FLEET=off"
    ]
    config.write_text(FLEET_WITHOUT_SHARED_HOMES + "GPUHUB_HOMES_DIR=/srv/gpuhub/homes\n")
    cfg = read_settings("up", environ)
    assert cfg.fleet and cfg.homes_dir == "/srv/gpuhub/homes"
    config.write_text(FLEET_WITHOUT_SHARED_HOMES.replace("GPUHUB_FLEET=on", "GPUHUB_FLEET=off"))
    assert read_settings("up", environ).homes_dir == ""  # no fleet: volumes are the default
    # the demo's check is the same (a fleet there gives its machines back all the same)
    assert problems(fleet_on(base, GPUHUB_HOMES_DIR=""), mode="demo") == [
        refused.value.problems[0].split(": ", 1)[1]
    ]


#: Fleet settings each fleet check refuses; with the fleet off, none of them is a problem.
FLEET_REFUSED = [
    ({"GPUHUB_FLEET_GROW_COMMAND": ""}, "GPUHUB_FLEET_GROW_COMMAND: the grow command is empty"),
    ({"GPUHUB_FLEET_GROW_COMMAND": "resize --size 3"}, "--desired-capacity {count}"),
    ({"GPUHUB_FLEET_REMOVE_COMMAND": " "}, "GPUHUB_FLEET_REMOVE_COMMAND: the remove command is"),
    ({"GPUHUB_FLEET_REMOVE_COMMAND": "delete gpu-1"}, "GPUHUB_FLEET_REMOVE_COMMAND: the remove"),
    (
        {"GPUHUB_FLEET_MIN_MACHINES": "5"},
        "GPUHUB_FLEET_MIN_MACHINES is 5 but GPUHUB_FLEET_MAX_MACHINES is 4; write a minimum",
    ),
    ({"GPUHUB_FLEET_MAX_MACHINES": "0"}, "GPUHUB_FLEET_MAX_MACHINES is 0 but GPUHUB_FLEET=on"),
    (
        {"GPUHUB_FLEET_SCHEDULE": "10 from 8.45"},
        "GPUHUB_FLEET_SCHEDULE: '10 from 8.45' is not an entry of the schedule; write machines",
    ),
    ({"GPUHUB_FLEET_SCHEDULE": "4 from 24:00"}, "GPUHUB_FLEET_SCHEDULE: '4 from 24:00' has no"),
    ({"GPUHUB_FLEET_SCHEDULE": "2 from 9:00, 3 from 09:00"}, "two entries start at 09:00"),
    (
        {"GPUHUB_FLEET_TIMEZONE": "Europe/Berln"},
        "GPUHUB_FLEET_TIMEZONE is 'Europe/Berln'; write the IANA name",
    ),
    ({"GPUHUB_FLEET_TIMEZONE": "CEST"}, "GPUHUB_FLEET_TIMEZONE is 'CEST'"),
    ({"GPUHUB_FLEET_TIMEZONE": ""}, "GPUHUB_FLEET_TIMEZONE is ''"),
    ({"GPUHUB_FLEET_IMAGE": "Amazon/AWS-CLI"}, "GPUHUB_FLEET_IMAGE is 'Amazon/AWS-CLI'; write a"),
    ({"GPUHUB_FLEET_IMAGE": "amazon/aws-cli latest"}, "mcr.microsoft.com/azure-cli"),
    (
        {"GPUHUB_FLEET_STOP_IDLE_AFTER": "20"},
        "GPUHUB_FLEET_STOP_IDLE_AFTER is 20, in seconds; write 0 (off), or at least 60",
    ),
]


@pytest.mark.parametrize("changes, says", FLEET_REFUSED)
def test_each_fleet_check_refuses_with_advice_when_the_fleet_is_on(base, changes, says):
    found = problems(fleet_on(base, **changes), mode="demo")
    assert len(found) == 1 and says in found[0], found
    (key,) = changes
    assert found[0].startswith(key)  # where it was set is found from it


@pytest.mark.parametrize("changes, says", FLEET_REFUSED)
def test_with_the_fleet_off_its_settings_may_stay_as_they_are(base, changes, says):
    assert problems(fleet_on(base, GPUHUB_FLEET="off", **changes), mode="demo") == []


def test_the_fleet_on_with_its_defaults_and_commands_passes(base):
    assert problems(fleet_on(base), mode="demo") == []
    good = fleet_on(
        base,
        GPUHUB_FLEET_SCHEDULE="10 from 08:45; 4 machines after 17:00",
        GPUHUB_FLEET_TIMEZONE="Europe/Berlin",
        GPUHUB_FLEET_MIN_MACHINES="4",
        GPUHUB_FLEET_PRICE_PER_HOUR="2.48",
        GPUHUB_FLEET_IMAGE="gcr.io/google.com/cloudsdktool/google-cloud-cli:slim",
        GPUHUB_FLEET_MOUNTS="/root/.config/gcloud:/root/.config/gcloud:ro /srv/x:/x",
        GPUHUB_FLEET_ENV="GROUP=gpu-workshop ZONE=europe-west4-a",
        GPUHUB_FLEET_STOP_IDLE_AFTER="60",
    )
    assert problems(good, mode="demo") == []
    for image in ("amazon/aws-cli", "mcr.microsoft.com/azure-cli:2.67.0", "localhost:5000/cli"):
        assert problems(fleet_on(base, GPUHUB_FLEET_IMAGE=image), mode="demo") == [], image


#: Values of the fleet's settings that are not of their type, refused whether the fleet is on or
#: off (Config could not read them): (changes, what the line says).
FLEET_MISTYPED = [
    ({"GPUHUB_FLEET": "yes"}, "GPUHUB_FLEET is 'yes'; write one of: on, off"),
    ({"GPUHUB_FLEET_MAX_MACHINES": "four"}, "GPUHUB_FLEET_MAX_MACHINES is 'four'; write a whole"),
    ({"GPUHUB_FLEET_EMPTY_FOR": "15m"}, "GPUHUB_FLEET_EMPTY_FOR is '15m'; write a whole number"),
    ({"GPUHUB_FLEET_JOIN_WITHIN": "30"}, "GPUHUB_FLEET_JOIN_WITHIN is 30; write at least 60"),
    ({"GPUHUB_FLEET_COMMAND_TIMEOUT": "0"}, "GPUHUB_FLEET_COMMAND_TIMEOUT is 0; write at least 1"),
    (
        {"GPUHUB_FLEET_PRICE_PER_HOUR": "$2.50"},
        "GPUHUB_FLEET_PRICE_PER_HOUR is '$2.50'; write the price of one machine-hour in digits",
    ),
    ({"GPUHUB_FLEET_PRICE_PER_HOUR": "-1"}, "GPUHUB_FLEET_PRICE_PER_HOUR is '-1'; write the"),
    ({"GPUHUB_FLEET_PRICE_PER_HOUR": "2,48"}, "GPUHUB_FLEET_PRICE_PER_HOUR is '2,48'"),
    ({"GPUHUB_FLEET_MOUNTS": "/root/.aws"}, "'/root/.aws' is not HOSTDIR:CONTAINERDIR"),
    ({"GPUHUB_FLEET_MOUNTS": "/a:/b:rw"}, "'/a:/b:rw' is not HOSTDIR:CONTAINERDIR"),
    ({"GPUHUB_FLEET_MOUNTS": "root/.aws:/root/.aws"}, "write both folders as absolute paths"),
    ({"GPUHUB_FLEET_MOUNTS": "/srv/../etc:/etc"}, "write both folders as absolute paths"),
    ({"GPUHUB_FLEET_MOUNTS": "/:/host:ro"}, "write both folders as absolute paths"),
    ({"GPUHUB_FLEET_MOUNTS": "/var/run:/var/run"}, "the Docker engine's socket"),
    ({"GPUHUB_FLEET_MOUNTS": "/run/docker.sock:/s"}, "the Docker engine's socket"),
    ({"GPUHUB_FLEET_MOUNTS": "/a:/x /b:/x"}, "/x is mounted twice"),
    ({"GPUHUB_FLEET_ENV": "GROUP gpu"}, "GPUHUB_FLEET_ENV is 'GROUP gpu'; 'GROUP' is not NAME="),
    ({"GPUHUB_FLEET_ENV": "1ZONE=a"}, "'1ZONE=a' is not NAME=VALUE with a name the shell takes"),
    ({"GPUHUB_FLEET_ENV": "my-group=a"}, "'my-group=a' is not NAME=VALUE"),
    ({"GPUHUB_FLEET_ENV": "A=1 A=2"}, "A is given twice"),
]


@pytest.mark.parametrize("fleet", ["on", "off"])
@pytest.mark.parametrize("changes, says", FLEET_MISTYPED)
def test_a_fleet_setting_not_of_its_type_is_refused_on_or_off(base, fleet, changes, says):
    settings = fleet_on(base, **{"GPUHUB_FLEET": fleet, **changes})
    found = problems(settings, mode="demo")
    assert len(found) == 1 and says in found[0], found
    with pytest.raises(SettingsError, match=re.escape(says)):  # the fleet off, as by default
        read("demo", environ=changes, config="", machine=MACHINE)


def test_the_fleets_settings_are_typed_and_make_what_the_hub_runs():
    from gpu_swarm_spawner import capacity, provider

    environ = {
        "GPUHUB_FLEET": "on",
        "GPUHUB_HOMES_DIR": "/srv/gpuhub/homes",
        "GPUHUB_FLEET_MAX_MACHINES": "6",
        "GPUHUB_FLEET_SCHEDULE": "5 from 08:45, 1 from 17:00",
        "GPUHUB_FLEET_TIMEZONE": "Europe/Berlin",
        "GPUHUB_FLEET_PRICE_PER_HOUR": "2.48",
        "GPUHUB_FLEET_GROW_COMMAND": "resize $GROUP --size {count}",
        "GPUHUB_FLEET_REMOVE_COMMAND": "delete $GROUP {machine}",
        "GPUHUB_FLEET_IMAGE": "amazon/aws-cli",
        "GPUHUB_FLEET_MOUNTS": "/root/.aws:/root/.aws:ro",
        "GPUHUB_FLEET_ENV": "GROUP=gpu-workshop ZONE=europe-west4-a",
    }
    cfg = read("demo", environ=environ, config="", machine=MACHINE)
    assert cfg.fleet is True and cfg.fleet_max_machines == 6 and cfg.fleet_empty_for == 900
    assert cfg.fleet_price_per_hour == 2.48
    assert cfg.fleet_mounts == (provider.Mount("/root/.aws", "/root/.aws", read_only=True),)
    assert cfg.fleet_env == {"GROUP": "gpu-workshop", "ZONE": "europe-west4-a"}
    assert read(environ={}, config="", machine=MACHINE).fleet_price_per_hour is None
    # the hub's builders, from cfg's attributes (jupyterhub_config.py, gpu_swarm_spawner.fleet)
    settings = capacity.fleet_settings_of(cfg)
    assert settings.schedule.describe() == "5 from 08:45, 1 from 17:00 (Europe/Berlin)"
    assert settings.slices_per_machine == cfg.slices_per_gpu == 3  # 0: none seen yet
    assert (settings.max_machines, settings.empty_for, settings.join_within) == (6, 900.0, 900.0)
    assert settings.stop_idle_after == 0.0  # off by default
    with_idle_stop = {**environ, "GPUHUB_FLEET_STOP_IDLE_AFTER": "1200"}
    idle = read("demo", environ=with_idle_stop, config="", machine=MACHINE)
    assert capacity.fleet_settings_of(idle).stop_idle_after == 1200.0
    engine = object()  # the Docker client, which the image's runner is given
    made = provider.fleet_provider_of(cfg, docker_client=lambda: engine)
    assert (made.commands.grow, made.commands.timeout) == ("resize $GROUP --size {count}", 120)
    assert made.env == cfg.fleet_env  # in the image's container: nothing of the hub's
    assert made.runner.client is engine and made.runner.image == "amazon/aws-cli"
    assert made.runner.mounts == cfg.fleet_mounts


def test_the_fleets_checks_are_the_hubs_own_readers(base, monkeypatch):
    """One reader: the check of the commands is provider_settings.command_problems, which
    provider.Commands runs, so that what passes is what the hub takes."""
    from gpu_swarm_spawner import provider, provider_settings

    assert provider.command_problems is provider_settings.command_problems
    told = [("grow", "told by the hub")]
    monkeypatch.setattr(provider_settings, "command_problems", lambda *a: told)
    assert problems(fleet_on(base), mode="demo") == ["GPUHUB_FLEET_GROW_COMMAND: told by the hub"]


def test_a_machine_without_a_time_zone_database_says_so_instead_of_refusing_every_zone(
    base, monkeypatch
):
    monkeypatch.setattr(settings_module, "_zones", lambda: frozenset())
    assert problems(fleet_on(base), mode="demo") == [
        "GPUHUB_FLEET_TIMEZONE cannot be checked: this machine has no time zone database; "
        "install it (apt-get install tzdata) and run this again"
    ]
