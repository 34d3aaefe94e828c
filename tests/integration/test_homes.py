"""Homes on shared storage, on the bed: the stack deployed with GPUHUB_HOMES_DIR on the bed's
shared storage (what the manager's NFS export is on an installed hub; the workers share this
machine's files, fresh machines mount it). A participant's file outlives the machine that ran
their server; a fresh machine joined with the line `make join-command` prints is refused while
it lacks the shared folders (an empty local folder of the same name included) and joins once
the storage is mounted.

The rest of the suite runs with homes in per-machine volumes: the stack is deployed again
without the setting afterwards.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import docker
import pytest

from .conftest import DATASETS, HOMES, SHARED
from .hub import BED_MANAGER, container_of, deploy
from .test_worker_setup import bed, join_line, one_line_error, swarm_state

pytestmark = pytest.mark.integration

MACHINE = "fresh4"


@pytest.fixture(scope="module")
def shared_homes(hub):
    """The stack under test with GPUHUB_HOMES_DIR; the suite's own stack again afterwards."""
    os.environ["GPUHUB_HOMES_DIR"] = HOMES
    try:
        deploy("stack")
        yield HOMES
    finally:
        del os.environ["GPUHUB_HOMES_DIR"]
        deploy("stack")


def on_machine(command: str) -> subprocess.CompletedProcess:
    return bed("on", MACHINE, command, check=False)


def test_a_machine_without_the_shared_storage_is_refused_and_joins_once_it_is_mounted(
    shared_homes,
):
    line = join_line()
    for folder in (HOMES, DATASETS, str(SHARED / "tutorials")):
        assert f" --shared-folder {folder}=" in line, line
    bed("fresh", MACHINE, "--unshared")
    try:
        # the mistake the check is for: a folder of the same name, local and empty
        assert on_machine(f"mkdir -p {HOMES}").returncode == 0
        simulated = "--simulate-gpus 2"
        error = one_line_error(on_machine(f"{line} {simulated}"))
        assert error.startswith("error: shared folders: "), error
        assert f"{HOMES} is not the manager's (no .gpuhub-share in it" in error
        assert f"{DATASETS} is missing" in error
        assert f"mount -t nfs4 {BED_MANAGER}:" in error and "docs/homes.md" in error
        assert swarm_state(MACHINE) == "no engine", "the join changed the machine"

        # the organizer's fix: the manager's export mounted there (NFS on an installed hub)
        assert on_machine(f"mount --bind /mnt/manager-share {SHARED}").returncode == 0
        tar = bed("image-tar", MACHINE).stdout.strip().splitlines()[-1]
        result = on_machine(f"{line} --image-tar {shlex.quote(tar)} {simulated}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"\n  shared       the manager's: {SHARED / 'tutorials'} " in result.stdout
        assert swarm_state(MACHINE) == "active"
    finally:
        bed("remove", MACHINE, check=False)


def node_of(client, service: str) -> str:
    (task,) = [t for t in client.services.get(service).tasks() if t["Status"]["State"] == "running"]
    return client.nodes.get(task["NodeID"]).attrs["Description"]["Hostname"]


def set_availability(client, node: dict, availability: str) -> None:
    found = client.nodes.get(node["ID"])
    found.update(dict(found.attrs["Spec"], Availability=availability))


def test_a_participants_files_outlive_the_machine_that_ran_their_server(hub, shared_homes):
    user, service = "ci-homes-ada", "jy-ci-2dhomes-2dada"
    client = docker.from_env()
    (manager,) = [n for n in client.api.nodes() if n["Spec"]["Role"] == "manager"]
    hub.api("POST", f"/users/{user}")
    # her server goes to a worker, a machine this test can take away: the manager takes no new
    # servers for this one start
    set_availability(client, manager, "pause")
    try:
        assert hub.api("POST", f"/users/{user}/server").status_code in (201, 202)
        hub.wait_ready(user)
    finally:
        set_availability(client, manager, "active")
    machine = node_of(client, service)
    assert machine in ("w1", "w2"), machine
    wrote = container_of(service).exec_run(
        ["sh", "-c", "echo kept > ~/notes.txt && id -u"], user="jovyan"
    )
    assert wrote.exit_code == 0 and wrote.output == b"1000\n", wrote.output
    folder = SHARED / "homes" / "ci-2dhomes-2dada"  # on the shared storage, hers
    assert (folder / "notes.txt").read_text() == "kept\n"
    assert (folder.stat().st_uid, oct(folder.stat().st_mode & 0o777)) == (1000, "0o700")

    bed("stop", machine)  # the machine is gone (its engine killed)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (node,) = [n for n in client.api.nodes() if n["Description"]["Hostname"] == machine]
            if node["Status"]["State"] != "ready":
                break
            time.sleep(1)
        else:
            pytest.fail(f"{machine} still ready 60 s after its engine was killed")
        # she starts again (stopping first if the hub did not yet take her server for stopped)
        hub.stop(user)
        t0 = time.monotonic()
        assert hub.api("POST", f"/users/{user}/server").status_code in (201, 202)
        hub.wait_ready(user)
        print(f"start on another machine after {machine} was lost: {time.monotonic() - t0:.1f} s")
        assert node_of(client, service) != machine
        read = container_of(service).exec_run(["cat", "/home/jovyan/notes.txt"], user="jovyan")
        assert read.output == b"kept\n", read.output
        hub.stop(user)
    finally:
        bed("up", "2")  # the machine back for the other tests
