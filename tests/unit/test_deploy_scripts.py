"""The bad-input paths of deploy/lib.sh, with stand-in commands on PATH (no Docker needed)."""

import os
import socket
import subprocess
from pathlib import Path

import pytest

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
