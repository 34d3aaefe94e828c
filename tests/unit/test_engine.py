"""worker_setup.engine's stop, on a stand-in for dockerd (a real child process)."""

import subprocess
import sys
import time

from worker_setup import engine


def test_stopping_an_engine_this_process_started_does_not_wait_for_its_zombie(tmp_path):
    # worker setup starts the engine, writes daemon.json, then restarts it: the dockerd it
    # stops is its own child, which stays a zombie until reaped
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pidfile = tmp_path / "docker.pid"
    pidfile.write_text(f"{child.pid}\n")
    env = {"GPUHUB_DOCKERD_CMD": "unused", "GPUHUB_DOCKERD_PIDFILE": str(pidfile)}
    env["GPUHUB_ENGINE_WAIT"] = "5"
    t0 = time.monotonic()
    engine.stop(env)
    assert time.monotonic() - t0 < 3
    assert child.poll() is not None  # gone, and reaped


def test_stopping_without_a_pid_file_is_a_no_op(tmp_path):
    engine.stop({"GPUHUB_DOCKERD_CMD": "x", "GPUHUB_DOCKERD_PIDFILE": str(tmp_path / "none")})


def test_the_recent_log_of_an_engine_run_by_the_setup_is_the_end_of_its_log_file(
    tmp_path, monkeypatch
):
    log = tmp_path / "dockerd.log"
    log.write_bytes(b"old line\n" * 10 + b"node w7 was removed from swarm\n")
    env = {"GPUHUB_DOCKERD_CMD": "exec dockerd", "GPUHUB_DOCKERD_LOG": str(log)}
    assert engine.recent_log(env).endswith("node w7 was removed from swarm\n")
    monkeypatch.setattr(engine, "LOG_TAIL_BYTES", 31)  # only the end is read
    assert engine.recent_log(env) == "node w7 was removed from swarm\n"
    env["GPUHUB_DOCKERD_LOG"] = str(tmp_path / "none.log")
    assert engine.recent_log(env) == ""  # never written: nothing said


def test_the_recent_log_of_the_system_engine_is_its_journal(monkeypatch):
    asked = []

    def journalctl(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, "node w7 was removed from swarm\n", "")

    monkeypatch.setattr(engine, "uses_systemd", lambda env: True)
    monkeypatch.setattr(engine.subprocess, "run", journalctl)
    assert engine.recent_log({}) == "node w7 was removed from swarm\n"
    assert asked[0][:3] == ["journalctl", "-u", "docker"] and "-15min" in asked[0]
