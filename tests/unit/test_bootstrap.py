"""deploy/bootstrap.sh, what `make VERB` runs before Python: its bad-input paths and that it
checks the settings before anything on the machine changes, with stand-in commands on PATH
(no Docker, no root needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "bootstrap.sh"
EXAMPLE = REPO / "deploy" / "config.example.env"
# What changes a machine: each stand-in notes that it was called.
MACHINE_CHANGERS = ["docker", "dockerd", "apt-get", "systemctl", "pip", "pip3", "debootstrap"]


def recorder(log: Path) -> str:
    return f'echo "$(basename "$0") $*" >>{log}'


def stubs_dir(tmp_path: Path, stubs: dict[str, str]) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def bootstrap(
    tmp_path: Path, args: list[str], stubs: dict[str, str], **env
) -> subprocess.CompletedProcess:
    """``bash deploy/bootstrap.sh ARGS`` with the stand-ins first on PATH and no GPUHUB_*
    of this process's environment."""
    bin_dir = stubs_dir(tmp_path, stubs)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "DEPLOY_"))}
    return subprocess.run(
        ["bash", str(BOOTSTRAP), *args],
        capture_output=True,
        text=True,
        env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        timeout=60,
    )


def fake_venv(tmp_path: Path, calls: Path) -> Path:
    """A venv that counts as installed (its stamp newer than pyproject.toml) whose python and
    pip only record being called."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("pip", "python"):
        (venv / "bin" / name).write_text(f"#!/bin/sh\n{recorder(calls)}\n")
        (venv / "bin" / name).chmod(0o755)
    (venv / ".installed").write_text(f"{REPO}\n")  # the checkout installed: this one
    return venv


def test_without_root_says_to_use_sudo(tmp_path):
    result = bootstrap(tmp_path, ["demo"], {"id": "echo 1000"}, GPUHUB_VENV=str(tmp_path / "v"))
    assert result.returncode == 1
    assert result.stderr == (
        "error: this needs root (Docker engine, swarm, daemon.json); run: sudo make demo\n"
    )
    assert not (tmp_path / "v").exists()


def test_status_needs_no_root_and_hands_over_to_the_venv(tmp_path):
    calls = tmp_path / "calls.log"
    venv = fake_venv(tmp_path, calls)
    result = bootstrap(tmp_path, ["status"], {"id": "echo 1000"}, GPUHUB_VENV=str(venv))
    assert result.returncode == 0, result.stderr
    assert calls.read_text() == "python -m deploy status\n"


def test_a_checked_verb_is_handed_to_the_venv_with_its_arguments(tmp_path):
    calls = tmp_path / "calls.log"
    venv = fake_venv(tmp_path, calls)
    stubs = {"id": "echo 0"}
    result = bootstrap(
        tmp_path, ["down", "--purge"], stubs, GPUHUB_VENV=str(venv), GPUHUB_CONFIG="none"
    )
    assert result.returncode == 0, result.stderr
    assert calls.read_text() == "python -m deploy down --purge\n"


def test_an_old_python_is_named_with_the_fix(tmp_path):
    python = 'case "$*" in *version_info*) exit 1 ;; -V) echo "Python 3.8.10" ;; esac'
    result = bootstrap(tmp_path, ["demo"], {"id": "echo 0", "python3": python})
    assert result.returncode == 1
    assert result.stderr == (
        "error: python3 is 3.8.10; this needs 3.9 or newer: install a newer python3\n"
    )


def test_up_refuses_the_unedited_example_before_anything_changes(tmp_path):
    config = tmp_path / "config.env"
    config.write_bytes(EXAMPLE.read_bytes())  # copied unedited, protected as docs/organizer.md says
    config.chmod(0o600)
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\n")
    calls = tmp_path / "calls.log"
    venv = fake_venv(tmp_path, calls)
    (venv / ".installed").unlink()  # ensure_venv would run pip install
    stubs = {name: recorder(calls) for name in MACHINE_CHANGERS}
    stubs["id"] = "echo 0"  # as root
    result = bootstrap(
        tmp_path,
        ["up"],
        stubs,
        GPUHUB_CONFIG=str(config),
        GPUHUB_ROSTER=str(roster),  # the example's /root/roster.txt, made by the organizer
        GPUHUB_VENV=str(venv),
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


def test_up_without_a_config_file_says_how_to_make_one(tmp_path):
    calls = tmp_path / "calls.log"
    stubs = {name: recorder(calls) for name in MACHINE_CHANGERS}
    stubs["id"] = "echo 0"
    result = bootstrap(tmp_path, ["up"], stubs, GPUHUB_CONFIG="none")
    assert result.stderr == (
        "error: no config file: cp deploy/config.example.env config.env, edit it, then run: "
        "sudo make up (or: make up CONFIG=FILE)\n"
    )
    assert not calls.exists()


def test_demo_checks_its_settings_before_anything_changes(tmp_path):
    calls = tmp_path / "calls.log"
    stubs = {name: recorder(calls) for name in MACHINE_CHANGERS}
    stubs["id"] = "echo 0"
    result = bootstrap(
        tmp_path,
        ["demo"],
        stubs,
        GPUHUB_CONFIG="none",
        GPUHUB_HTTP_PORT="80a",
        GPUHUB_VENV=str(tmp_path / "venv"),
    )
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        # named where it was set: GPUHUB_HTTP_PORT=80a make demo
        "error: the environment: GPUHUB_HTTP_PORT is '80a'; write a whole number",
        "error: fix the settings above and run this again",
    ]
    assert not calls.exists(), calls.read_text()
    assert not (tmp_path / "venv").exists()


def sourced(
    tmp_path: Path, script: str, stubs: dict[str, str], **env
) -> subprocess.CompletedProcess:
    bin_dir = stubs_dir(tmp_path, stubs)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHUB_", "DEPLOY_"))}
    return subprocess.run(
        ["bash", "-c", f". {BOOTSTRAP} && {script}"],
        capture_output=True,
        text=True,
        env={**clean, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        timeout=60,
    )


def test_a_venv_with_extras_serves_a_call_without_but_not_the_reverse(tmp_path):
    calls = tmp_path / "calls.log"
    venv = fake_venv(tmp_path, calls)
    (venv / ".installed").rename(venv / ".installed-test")
    result = sourced(tmp_path, "ensure_venv", {}, GPUHUB_VENV=str(venv))
    assert result.returncode == 0 and not calls.exists(), result.stderr
    (venv / ".installed-test").rename(venv / ".installed")
    result = sourced(tmp_path, "ensure_venv test", {}, GPUHUB_VENV=str(venv))
    assert result.returncode == 0, result.stderr
    assert calls.read_text().startswith("pip install -q --disable-pip-version-check -e ")
    assert calls.read_text().rstrip().endswith("[test]")
    assert "installing the project into" in result.stdout and (venv / ".installed-test").exists()


def test_a_venv_installed_from_another_checkout_is_installed_again_from_this_one(tmp_path):
    # a git worktree sharing this checkout's .venv ran `make test` there: the project in the
    # venv is the worktree's files, which may be gone or older
    calls = tmp_path / "calls.log"
    venv = fake_venv(tmp_path, calls)
    (venv / ".installed").rename(venv / ".installed-test")
    (venv / ".installed-test").write_text("/work/wt-other\n")
    result = sourced(tmp_path, "ensure_venv test", {}, GPUHUB_VENV=str(venv))
    assert result.returncode == 0, result.stderr
    assert calls.read_text().startswith(f"pip install -q --disable-pip-version-check -e {REPO}[")
    assert (venv / ".installed-test").read_text() == f"{REPO}\n"
    calls.unlink()  # installed from here: ready, for a call with or without the extras
    for script in ("ensure_venv test", "ensure_venv"):
        result = sourced(tmp_path, script, {}, GPUHUB_VENV=str(venv))
        assert result.returncode == 0 and not calls.exists(), result.stderr


def test_a_failing_pip_shows_the_end_of_its_output(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "pip").write_text(
        "#!/bin/sh\nseq 1 30\necho 'No matching distribution'\nexit 1\n"
    )
    (venv / "bin" / "pip").chmod(0o755)
    result = sourced(tmp_path, "ensure_venv", {}, GPUHUB_VENV=str(venv))
    assert result.returncode == 1
    err = result.stderr.splitlines()
    assert err[-1] == "error: pip install failed (output above)"
    assert err[:-1] == [str(n) for n in range(12, 31)] + ["No matching distribution"]


def test_missing_commands_are_installed_with_apt(tmp_path):
    calls = tmp_path / "calls.log"
    stubs = {"apt-get": recorder(calls)}
    result = sourced(tmp_path, "ensure_packages sh:dash no-such-cmd-x:pkg-x", stubs)
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines() == [
        "apt-get update -qq",
        "apt-get install -y -qq --no-install-recommends pkg-x",
    ]
