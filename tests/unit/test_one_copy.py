"""One copy of a participant's server at a time in their home (images/singleuser/one_copy.py,
run by start-singleuser). A second copy Swarm starts while the first is still stopping waits
until the first has ended; the server's command holds the lock for as long as it runs.

start-singleuser runs here as in the image, with a stand-in ``jupyterhub-singleuser`` that says
whether the lock is held while it runs, and when it started.
"""

from __future__ import annotations

import fcntl
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import pytest

from .start_command import SINGLEUSER, start_command

spec = importlib.util.spec_from_file_location("one_copy", SINGLEUSER / "one_copy.py")
one_copy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(one_copy)

#: the stand-in server: whether the home's lock is held (by its own command) while it runs
SERVER = f"""#!/bin/sh
exec "{sys.executable}" -c '
import fcntl, os, sys, time
lock = os.path.join(os.environ["HOME"], "{one_copy.LOCK_NAME}")
try:
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("lock free while serving")
except OSError:
    print("lock held while serving")
print("started", time.time())
'
"""


def start_singleuser(home: Path, tmp_path: Path) -> subprocess.Popen:
    command, env = start_command(tmp_path, sys.executable, SERVER, HOME=str(home))
    return subprocess.Popen(command, env=env, text=True, stdout=PIPE, stderr=PIPE)


def outcome(process: subprocess.Popen) -> tuple[str, str]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return out, err


def test_a_server_alone_starts_at_once_holding_the_lock(tmp_path):
    out, err = outcome(start_singleuser(tmp_path, tmp_path))
    assert "lock held while serving" in out and err == ""
    assert (tmp_path / one_copy.LOCK_NAME).read_text().startswith("container ")


def test_a_second_copy_waits_until_the_first_has_ended(tmp_path):
    lock = tmp_path / one_copy.LOCK_NAME
    with open(lock, "a") as first:  # the first copy, still stopping
        fcntl.flock(first, fcntl.LOCK_EX)
        first.write("container c0ffee, since 10:00:00\n")
        first.flush()
        second = start_singleuser(tmp_path, tmp_path)
        time.sleep(1.0)
        assert second.poll() is None  # waiting, not serving
        ended = time.time()
    out, err = outcome(second)
    started = float(out.split("started")[1])
    assert started >= ended
    assert "lock held while serving" in out
    assert "An earlier copy of this server is still stopping (container c0ffee" in err
    assert "The earlier copy ended (waited" in err


def test_a_home_that_cannot_hold_the_lock_starts_the_server_all_the_same(tmp_path):
    out, err = outcome(start_singleuser(tmp_path / "no-such-home", tmp_path))
    assert "lock free while serving" in out or "started" in out
    assert err == ""


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_an_earlier_copy_that_never_ends_delays_the_start_at_most_the_wait(tmp_path):
    lock = tmp_path / "lock"
    said = []
    clock = Clock()
    with open(lock, "a") as first, open(lock, "a") as second:
        fcntl.flock(first, fcntl.LOCK_EX)
        got = one_copy.hold(second.fileno(), 20, said.append, clock, clock.sleep)
    assert got == "timed out" and 20 <= clock.now < 20.5
    assert said[-1] == "The earlier copy did not end within 20 s: starting anyway"


def test_a_file_system_without_locks_lets_the_server_start(monkeypatch):
    def no_locks(fd, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    said = []
    assert one_copy.hold(0, 20, said.append) == "no lock (No locks available)" and not said


@pytest.mark.parametrize("argv", [[], ["x"], ["9", "10"]])
def test_a_wrong_call_says_how_to_call_it(argv, capsys):
    assert one_copy.main(argv) == 2
    assert "usage: python3 -m one_copy FD" in capsys.readouterr().err
