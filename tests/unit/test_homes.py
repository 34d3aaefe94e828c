"""Participants' homes: a folder each on shared storage (``homes_dir``, GPUHUB_HOMES_DIR), or a
volume on one machine, whose participant is told where their files are when they start
elsewhere (gpu_swarm_spawner/homes.py and the spawner's use of it)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest
from traitlets import TraitError

from deploy import settings, stack
from gpu_swarm_spawner import SpawnFailed, homes
from gpu_swarm_spawner import spawner_server as spawner_module
from gpu_swarm_spawner.holding import Holding

from .clusters import node, task
from .fake_docker import FakeDockerSpawner, make_fake


@pytest.fixture
def chowned(monkeypatch):
    """os.chown recorded instead of done: the unit tests may run without root."""
    calls = []
    monkeypatch.setattr(homes.os, "chown", lambda path, uid, gid: calls.append((path, uid, gid)))
    return calls


# ---- the folder -------------------------------------------------------------------------------


def test_a_home_folder_is_made_empty_for_jovyan_and_kept_as_it_is_later(tmp_path, chowned):
    path = homes.folder_of(str(tmp_path), "alice-2dsmith")
    assert path == str(tmp_path / "alice-2dsmith")
    assert homes.ensure_folder(path) is True
    assert chowned == [(path, 1000, 100)]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700 and os.listdir(path) == []
    (tmp_path / "alice-2dsmith" / "notes.txt").write_text("mine")
    assert homes.ensure_folder(path) is False  # there: left as its participant left it
    assert len(chowned) == 1 and os.listdir(path) == ["notes.txt"]


def test_no_local_folder_is_made_where_the_shared_one_is_missing(tmp_path, chowned):
    missing = str(tmp_path / "not-mounted")
    with pytest.raises(FileNotFoundError):
        homes.ensure_folder(homes.folder_of(missing, "bob"))
    assert not os.path.exists(missing)


def test_a_folder_the_hub_cannot_hand_over_is_not_left_behind(tmp_path, monkeypatch):
    def refused(path, uid, gid):  # NFS squashing the hub's root: EPERM
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(homes.os, "chown", refused)
    with pytest.raises(PermissionError):
        homes.ensure_folder(str(tmp_path / "bob"))
    assert not (tmp_path / "bob").exists()  # the next start tries again


def test_a_file_in_the_way_is_not_a_home(tmp_path):
    (tmp_path / "bob").write_text("")
    with pytest.raises(NotADirectoryError):
        homes.ensure_folder(str(tmp_path / "bob"))


def test_long_logins_fit_into_a_folder_name(tmp_path):
    escaped = "a" + "-2db" * 60  # longer than a file name may be
    name = os.path.basename(homes.folder_of("/srv/homes", escaped))
    assert len(name) <= 255 and name.startswith("a-2db")


# ---- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["homes", "./homes", "/"])
def test_the_spawner_refuses_a_homes_dir_that_is_no_absolute_folder(value):
    with pytest.raises(TraitError, match="absolute path of a folder on shared storage"):
        make_fake(homes_dir=value)


def test_the_settings_take_an_absolute_homes_dir_and_deploy_the_hub_with_it(tmp_path):
    environ = {"GPUHUB_CONFIG": "none", "GPUHUB_STATE_DIR": str(tmp_path / "state")}
    config = settings.read("demo", {**environ, "GPUHUB_HOMES_DIR": "/srv/homes"})
    assert config.homes_dir == "/srv/homes"
    # the hub sees the folder at the same path (an overlay mounts it)
    assert [p.name for p in stack.stack_files(config)][-1] == "stack.homes.yml"
    overlay = (stack.DEPLOY_DIR / "stack.homes.yml").read_text()
    assert "- ${GPUHUB_HOMES_DIR}:${GPUHUB_HOMES_DIR}\n" in overlay
    without = settings.read("demo", environ)
    assert without.homes_dir == "" and "stack.homes.yml" not in {
        p.name for p in stack.stack_files(without)
    }


# ---- the server's home ------------------------------------------------------------------------


def test_with_homes_dir_the_home_is_the_participants_folder_there():
    spawner = make_fake(
        homes_dir="/srv/homes/",
        volumes={
            "jy-home-{username}": "/home/jovyan",  # what homes_dir takes the place of
            "/srv/data": {"bind": "/srv/datasets", "mode": "ro"},
        },
    )
    mounts = {m["Target"]: m for m in spawner.mounts}
    assert set(mounts) == {"/home/jovyan", "/srv/datasets"}
    home = mounts["/home/jovyan"]
    assert (home["Type"], home["Source"], home["ReadOnly"]) == (
        "bind", "/srv/homes/alice-2dsmith", False)  # fmt: skip
    assert spawner.home_folder == "/srv/homes/alice-2dsmith"


async def test_the_folder_is_made_before_the_service_is_created(tmp_path, chowned):
    spawner = make_fake(homes_dir=str(tmp_path))
    spawner.holding = Holding(gpu="GPU-a", slices=1)
    await spawner.create_object()
    assert chowned == [(str(tmp_path / "alice-2dsmith"), 1000, 100)]
    (created,) = spawner.created
    (mount,) = created["task_template"]["ContainerSpec"]["Mounts"]
    assert mount["Source"] == str(tmp_path / "alice-2dsmith")
    await spawner.create_object()  # the next start finds it
    assert len(chowned) == 1


async def test_a_hub_that_does_not_see_the_shared_folder_says_so_and_creates_nothing(tmp_path):
    spawner = make_fake(homes_dir=str(tmp_path / "not-mounted"))
    with pytest.raises(SpawnFailed) as failed:
        await spawner.create_object()
    assert "could not make your home folder" in failed.value.jupyterhub_message
    assert "GPUHUB_HOMES_DIR mounted at the same path" in failed.value.log_message
    assert spawner.created == []


async def test_the_folder_is_made_off_the_event_loop(tmp_path, monkeypatch):
    threads = []

    def made_where(path):
        import threading

        threads.append(threading.current_thread() is threading.main_thread())
        return False

    monkeypatch.setattr(spawner_module, "ensure_folder", made_where)
    spawner = make_fake(homes_dir=str(tmp_path))
    spawner.holding = Holding(gpu="GPU-a", slices=1)
    await spawner.create_object()
    assert threads == [False]


# ---- where a returning participant starts -------------------------------------------------


def bob(**traits) -> FakeDockerSpawner:
    """Bob, whose last server ran on beta (its volume holds his files)."""
    spawner = FakeDockerSpawner(
        user=SimpleNamespace(name="bob", id=2, url="/user/bob/"), inventory_max_age=0, **traits
    )
    spawner.home_node = "beta"
    spawner.attempt.progress.clear()
    return spawner


def told(spawner) -> str:
    return " ".join(e["message"] for e in spawner.attempt.progress)


async def test_with_shared_homes_the_home_machine_is_not_preferred_nor_mentioned():
    spawner = bob(homes_dir="/srv/homes")
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}), node("n2", "beta", {"GPU-b0": 3})]
    spawner.tasks = [task("n2", {"GPU-b0": 2})]  # spread picks alpha; beta is bob's last
    assert (await spawner.reserve_gpu()).gpu.node_name == "alpha"
    assert told(spawner) == ""
    spawner.homes_dir = ""
    assert (await spawner.reserve_gpu()).gpu.node_name == "beta"  # his volume is there


@pytest.mark.parametrize(
    "beta, says",
    [
        (None, "which is no longer part of this hub"),
        (node("n2", "beta", {"GPU-b0": 3}, state="down"), "which is not answering"),
        (node("n2", "beta", {"GPU-b0": 3}, availability="pause"), "an organizer paused it"),
        (node("n2", "beta", {"GPU-b0": 3}, availability="drain"), "an organizer drained it"),
    ],
)
async def test_a_participant_whose_home_machine_is_unavailable_reads_where_the_files_are(
    beta, says, caplog
):
    spawner = bob()
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})] + ([beta] if beta else [])
    assert (await spawner.reserve_gpu()).gpu.node_name == "alpha"
    message = told(spawner)
    assert "Your files from last time are on the machine beta, " in message and says in message
    assert "This server starts on alpha with an empty home" in message
    assert "an organizer can copy them from beta's Docker volume jy-home-bob" in message
    assert "GPUHUB_HOMES_DIR" in message
    assert "their home machine beta is" in caplog.text


async def test_a_machine_that_joined_again_counts_as_there():
    spawner = bob()
    old = node("n2", "beta", {"GPU-b0": 3}, state="down")
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3}), old, node("n3", "beta", {"GPU-b0": 3})]
    spawner.tasks = [task("n3", {"GPU-b0": 3})]  # full
    assert (await spawner.reserve_gpu()).gpu.node_name == "alpha"
    assert "No GPU on beta, where your files from last time are, has room" in told(spawner)


async def test_the_message_names_the_home_volume_as_configured():
    spawner = bob(volumes={"course-{username}": "/home/jovyan"})
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    await spawner.reserve_gpu()
    assert "Docker volume course-bob" in told(spawner)


async def test_a_server_without_a_gpu_whose_home_machine_is_gone_is_told_too():
    spawner = bob()
    spawner.nodes = [node("n1", "alpha", {"GPU-a0": 3})]
    assert (await spawner._place_without_gpu()).cpu_node == "alpha"
    assert "on the machine beta, which is no longer part of this hub" in told(spawner)


def test_machine_states():
    ready = node("n1", "beta", {})
    assert homes.machine_state([ready], "beta") == homes.AVAILABLE
    assert homes.machine_state([ready], "gamma") == homes.GONE
    assert homes.machine_state([node("n1", "beta", {}, state="unknown")], "beta") == homes.DOWN
    assert homes.machine_state([node("n1", "beta", {}, state="disconnected")], "beta") == "down"
    paused = node("n1", "beta", {}, availability="pause")
    assert homes.machine_state([paused], "beta") == homes.PAUSED
