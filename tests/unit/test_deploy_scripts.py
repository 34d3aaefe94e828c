"""The bad-input paths of deploy/lib.sh, with stand-in commands on PATH (no Docker needed)."""

import os
import socket
import subprocess
from pathlib import Path

import pytest

from .config_lines import CORPUS, SECRET, Refused, expected, key_of

REPO = Path(__file__).resolve().parents[2]


def run_lib(
    script: str, tmp_path: Path, stubs: dict[str, str] = (), **env
) -> subprocess.CompletedProcess:
    """Run ``script`` after sourcing deploy/lib.sh, with executable stubs first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (stubs or {}).items():
        stub = bin_dir / name
        stub.write_text(f"#!/bin/sh\n{body}\n")
        stub.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_")}
    full_env = {**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["bash", "-c", f". {REPO}/deploy/lib.sh && load_settings && {script}"],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


def one_line_error(result) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_without_root_says_to_use_sudo(tmp_path):
    result = run_lib("ensure_root demo", tmp_path, stubs={"id": "echo 1000"})
    assert "run: sudo make demo" in one_line_error(result)


def test_a_taken_port_is_named_with_the_fix(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        # no proxy service of ours holds it: `docker service inspect` fails
        result = run_lib(
            "check_port", tmp_path, stubs={"docker": "exit 1"}, GPUHUB_HTTP_PORT=str(port)
        )
    message = one_line_error(result)
    assert f"port {port} (GPUHUB_HTTP_PORT) is already in use" in message
    assert "GPUHUB_HTTP_PORT=" in message


def test_a_free_port_passes(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_lib("check_port", tmp_path, stubs={"docker": "exit 1"}, GPUHUB_HTTP_PORT=str(port))
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(
    Path("/run/systemd/system").is_dir(), reason="this machine starts Docker through systemd"
)
def test_an_engine_that_does_not_start_points_at_its_log(tmp_path):
    log = tmp_path / "dockerd.log"
    result = run_lib(
        "start_engine",
        tmp_path,
        stubs={"dockerd": "echo 'failed to start daemon: boom' >&2; exit 1", "docker": "exit 1"},
        GPUHUB_ENGINE_WAIT="1",
        GPUHUB_DOCKERD_LOG=str(log),
        GPUHUB_DOCKERD_PIDFILE=str(tmp_path / "docker.pid"),
    )
    message = one_line_error(result)
    assert "did not start within 1 s" in message and str(log) in message
    assert "boom" in log.read_text()


def test_settings_from_the_environment_win(tmp_path):
    result = run_lib(
        'echo "$GPUHUB_STACK $GPUHUB_HTTP_PORT $GPUHUB_STATE_DIR"',
        tmp_path,
        GPUHUB_STACK="mystack",
    )
    assert result.stdout.split() == ["mystack", "8000", "/var/lib/gpu-jupyterhub/mystack"]


def tls(tmp_path, host, mode="self-signed", **env):
    script = "ensure_tls && echo $GPUHUB_TLS_CERT_VERSION"
    result = run_lib(
        script,
        tmp_path,
        GPUHUB_CONFIG="none",
        GPUHUB_STATE_DIR=str(tmp_path / "state"),
        GPUHUB_TLS=mode,
        GPUHUB_HOSTNAME=host,
        **env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-1]


def subject_alt_name(cert: Path) -> str:
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()[-1].strip()


def test_a_self_signed_certificate_is_made_once_per_hostname(tmp_path):
    cert = tmp_path / "state" / "tls" / "cert.pem"
    first = tls(tmp_path, "10.0.0.5")
    assert subject_alt_name(cert) == "IP Address:10.0.0.5"
    assert tls(tmp_path, "10.0.0.5") == first  # kept: the secret's name does not change
    assert tls(tmp_path, "hub.example.org") != first
    assert subject_alt_name(cert) == "DNS:hub.example.org"
    assert (tmp_path / "state" / "tls" / "key.pem").stat().st_mode & 0o077 == 0


def test_provided_certificate_files_are_used(tmp_path):
    (tmp_path / "mine.pem").write_text("CERT\n")
    (tmp_path / "mine.key").write_text("KEY\n")
    tls(
        tmp_path,
        "hub.example.org",
        mode="files",
        GPUHUB_TLS_CERT=str(tmp_path / "mine.pem"),
        GPUHUB_TLS_KEY=str(tmp_path / "mine.key"),
    )
    assert (tmp_path / "state" / "tls" / "cert.pem").read_text() == "CERT\n"
    assert (tmp_path / "state" / "tls" / "key.pem").read_text() == "KEY\n"


# ---- the settings: one reader, checked before anything changes -------------------------------

EXAMPLE = REPO / "deploy" / "config.example.env"
# What changes a machine: each stand-in notes that it was called.
MACHINE_CHANGERS = ["docker", "dockerd", "apt-get", "systemctl", "pip", "pip3", "debootstrap"]


def recorder(log: Path) -> str:
    return f'echo "$(basename "$0") $*" >>{log}'


def test_up_refuses_the_unedited_example_before_anything_changes(tmp_path):
    config = tmp_path / "config.env"
    config.write_bytes(EXAMPLE.read_bytes())  # copied unedited, protected as the README says
    config.chmod(0o600)
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\n")
    calls = tmp_path / "calls.log"
    # a venv whose pip and python record being called: ensure_venv would run pip install
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    for name in ("pip", "python"):
        (venv / name).write_text(f"#!/bin/sh\n{recorder(calls)}\n")
        (venv / name).chmod(0o755)
    stubs = {name: recorder(calls) for name in MACHINE_CHANGERS}
    stubs["id"] = "echo 0"  # as root
    result = run_script(
        "deploy/up.sh",
        tmp_path,
        stubs,
        GPUHUB_CONFIG=str(config),
        GPUHUB_ROSTER=str(roster),  # the example's /root/roster.txt, made by the organizer
        GPUHUB_VENV=str(tmp_path / "venv"),
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    placeholders = [line for line in lines if " is still the example's " in line]
    named = [line.split(": ")[2].split()[0] for line in placeholders]
    assert named == [
        "GPUHUB_HOSTNAME",
        "GPUHUB_ACME_EMAIL",
        "GPUHUB_GITHUB_CLIENT_ID",
        "GPUHUB_GITHUB_CLIENT_SECRET",
        "GPUHUB_ALLOWED_ORGS",
        "GPUHUB_ADMIN_USERS",
        "GPUHUB_TUTORIAL_REPOS",
    ], result.stderr
    assert all(line.startswith(f"error: {config} line ") for line in placeholders)
    assert lines[-1] == f"error: fix the settings above in {config} and run this again"
    assert len(lines) == len(placeholders) + 1, result.stderr
    assert not calls.exists(), calls.read_text()  # nothing installed, started or built
    assert result.stdout == ""


def test_demo_checks_its_settings_before_anything_changes(tmp_path):
    calls = tmp_path / "calls.log"
    stubs = {name: recorder(calls) for name in MACHINE_CHANGERS}
    stubs["id"] = "echo 0"
    result = run_script(
        "deploy/demo.sh",
        tmp_path,
        stubs,
        GPUHUB_CONFIG="none",
        GPUHUB_HTTP_PORT="80a",
        GPUHUB_VENV=str(tmp_path / "venv"),
    )
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "error: settings: GPUHUB_HTTP_PORT is '80a'; write a whole number",
        "error: fix the settings above and run this again",
    ]
    assert not calls.exists(), calls.read_text()
    assert not (tmp_path / "venv").exists()


def run_script(script: str, tmp_path: Path, stubs: dict[str, str], **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUHUB_")}
    return subprocess.run(
        ["bash", str(REPO / script)],
        capture_output=True,
        text=True,
        env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        timeout=60,
    )


def load_config(tmp_path: Path, text: str, script: str, mode: str = "", **env):
    """load_settings [mode] in bash with TEXT as the config file, then SCRIPT."""
    config = tmp_path / "config.env"
    config.write_text(text, newline="")
    config.chmod(0o600)
    return run_lib(
        f"true; load_settings {mode} && {script}", tmp_path, GPUHUB_CONFIG=str(config), **env
    )


# A complete `make up` config (roster, limits and all) the odd lines are added to.
COMPLETE = """\
GPUHUB_HOSTNAME=10.0.0.5
GPUHUB_GITHUB_CLIENT_ID=Iv1.8a61f9b3a7aba766
GPUHUB_GITHUB_CLIENT_SECRET=0123456789abcdef
GPUHUB_ALLOWED_ORGS=gpu-school
GPUHUB_CPU_LIMIT=2
GPUHUB_MEM_LIMIT=4G
GPUHUB_PIDS_LIMIT=2048
"""


@pytest.mark.parametrize(
    "line, key, value",
    [
        (" GPUHUB_AUTH=github", "GPUHUB_AUTH", "github"),
        (" GPUHUB_TLS=self-signed", "GPUHUB_TLS", "self-signed"),
    ],
)
def test_a_line_with_a_leading_blank_is_deployed_as_it_was_checked(tmp_path, line, key, value):
    """The defect: bash skipped these lines that the checker accepted, and deployed the shared
    password login (or plain HTTP) instead."""
    result = load_config(tmp_path, COMPLETE + line + "\n", f'printf %s "${key}"', mode="up")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == value
    # and without a mode (make down, roster, join-command ...) the same value
    result = load_config(tmp_path, COMPLETE + line + "\n", f'printf %s "${key}"')
    assert result.stdout == value


@pytest.mark.parametrize("line, value", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_each_odd_line_reaches_the_shell_as_meant_or_stops_it(tmp_path, line, value):
    key = key_of(line)
    result = load_config(tmp_path, f"# the organizer's file\n{line}\n", f'printf %s "${key}"')
    if isinstance(value, Refused):
        assert result.returncode != 0
        assert "config.env line 2: " in result.stderr and value.says in result.stderr
        assert SECRET not in result.stderr
        assert result.stdout == ""
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout == expected(line, value)


def test_any_value_survives_the_way_to_the_shell(tmp_path):
    secret = "a'b\"c$d`e\\f g\n#h ~i é"
    result = run_lib(
        'printf %s "$GPUHUB_GITHUB_CLIENT_SECRET"',
        tmp_path,
        GPUHUB_CONFIG="none",
        GPUHUB_GITHUB_CLIENT_SECRET=secret,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == secret


def test_auto_limits_reach_the_shell_as_numbers(tmp_path):
    result = run_lib(
        'echo "$GPUHUB_CPU_LIMIT $GPUHUB_MEM_LIMIT $GPUHUB_PIDS_LIMIT"',
        tmp_path,
        GPUHUB_CONFIG="none",
        GPUHUB_PIDS_LIMIT="0",
    )
    cpu, memory, pids = result.stdout.split()
    assert float(cpu) >= 0.5 and memory.endswith("M") and int(memory[:-1]) >= 1024
    assert pids == "0"  # the environment's value, not auto's
