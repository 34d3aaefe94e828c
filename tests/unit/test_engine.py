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
