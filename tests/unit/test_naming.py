"""Every valid GitHub login gets a service name and a home volume name Docker accepts.

GitHub logins: up to 39 letters, digits and single hyphens, not at either end; JupyterHub
lowercases them, dockerspawner escapes each ``-`` to ``-2d``.
"""

import itertools
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from jupyterhub.objects import Hub

from gpu_swarm_spawner import GPUSwarmSpawner, naming

# the brief's DNS label, and swarmkit's own check (manager/controlapi/common.go)
DNS_LABEL = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$")
SWARMKIT_NAME = re.compile(r"^[a-zA-Z0-9](?:[-_]*[A-Za-z0-9]+)*$")
# the local volume driver's check (daemon/names); the name is also a directory name
VOLUME_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
GITHUB_LOGIN = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){0,38}$")

HYPHENS = "-".join("abcdefghijklmnopqrst")  # 39 characters, 19 of them hyphens
WORST_LOGINS = [
    HYPHENS,
    HYPHENS[:-1] + "u",  # differs from the one above only in its last character
    "9" * 39,
    "0123456789" * 3 + "012345678",
    "a" * 39,
    "a-" * 19 + "b",
    "ci-" + "x" * 36,
]


def is_service_name(name: str) -> bool:
    return len(name) <= 63 and bool(DNS_LABEL.match(name)) and bool(SWARMKIT_NAME.match(name))


def is_volume_name(name: str) -> bool:
    return len(name.encode()) <= 255 and bool(VOLUME_NAME.match(name))


def spawner_for(login: str, server: str = "") -> GPUSwarmSpawner:
    user = SimpleNamespace(name=login, id=1, url=f"/user/{login}/")
    orm_spawner = SimpleNamespace(name=server, server=None, state=None) if server else None
    return GPUSwarmSpawner(
        user=user,
        hub=Hub(),
        orm_spawner=orm_spawner,
        volumes={"jy-home-{username}": "/home/jovyan"},
    )


def home_volume(spawner: GPUSwarmSpawner) -> str:
    (mount,) = [m for m in spawner.mounts if m["Target"] == "/home/jovyan"]
    assert mount["Type"] == "volume"
    return mount["Source"]


def test_the_worst_cases_are_valid_github_logins():
    assert all(GITHUB_LOGIN.match(login) and len(login) == 39 for login in WORST_LOGINS)
    assert len(GPUSwarmSpawner._escape(HYPHENS)) == 77  # jy-<escaped> would be 80


@pytest.mark.parametrize("login", WORST_LOGINS)
def test_every_worst_case_login_gets_a_service_and_a_home_docker_accepts(login):
    spawner = spawner_for(login)
    assert is_service_name(spawner.object_name), spawner.object_name
    volume = home_volume(spawner)
    assert is_volume_name(volume), volume
    # the home is never shortened for a GitHub login: jy-home-<escaped> is at most 85
    assert volume == f"jy-home-{GPUSwarmSpawner._escape(login)}"


@pytest.mark.parametrize("login", WORST_LOGINS)
@pytest.mark.parametrize("server", ["gpu2", "a-very-long-server-name-" * 3, "-".join("x" * 32)])
def test_named_servers_of_worst_case_logins_get_valid_distinct_services(login, server):
    default, named = spawner_for(login), spawner_for(login, server)
    assert is_service_name(named.object_name), named.object_name
    assert named.object_name != default.object_name


def test_names_that_fit_are_kept_exactly_as_before():
    """Running servers (their name is in the hub's state) and homes of existing users are
    found again: today's names do not change."""
    assert spawner_for("alice-smith").object_name == "jy-alice-2dsmith"
    assert spawner_for("ci-named", "gpu2").object_name == "jy-ci-2dnamed--gpu2"
    assert spawner_for("9" * 39).object_name == "jy-" + "9" * 39
    exactly = "jy-" + "a" * 60
    assert naming.service_name(exactly) == exactly
    assert naming.service_name(exactly + "b") != exactly + "b"


def test_a_long_name_keeps_a_readable_start_and_ends_in_a_hash():
    name = spawner_for(HYPHENS).object_name
    # pinned: a change of the rule would lose every running server and home that used it
    assert name == "jy-a-2db-2dc-2dd-2de-2df-2dg-2dh-2di-2dj-2dk-2dl-h2f45605df897"


@pytest.mark.parametrize("start", ["", "b", "bc", "bcd"])
def test_the_cut_never_leaves_half_an_escape(start):
    """Wherever the cut falls in ``-2d``, the name shows whole escapes only."""
    name = spawner_for((start + "-" + HYPHENS)[:39]).object_name
    assert re.fullmatch(r"jy-[a-z0-9-]+-h[0-9a-f]{12}", name), name
    assert not re.search(r"-[0-9a-f]?-h[0-9a-f]{12}$", name), name


def test_logins_differing_only_at_the_end_do_not_collide():
    first, second = spawner_for(HYPHENS), spawner_for(HYPHENS[:-1] + "u")
    assert first.object_name != second.object_name
    assert home_volume(first) != home_volume(second)
    # two long names sharing their first 50 characters
    a, b = "jy-" + "a" * 47 + "-2db" * 10, "jy-" + "a" * 47 + "-2dc" * 10
    assert a[:50] == b[:50] and naming.service_name(a) != naming.service_name(b)


def test_names_are_unique_over_many_long_and_short_logins():
    letters = "abcdefghij"
    logins = {"-".join(p) + "-" + "-".join(letters[:17]) for p in itertools.permutations("xyz")}
    logins |= {HYPHENS[:-1] + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"}
    logins |= {f"user{i}-" + "-".join("abcdefghijklmnop") for i in range(100)}
    logins |= {login[:30] for login in logins}  # short ones that fit unchanged
    logins = {login.strip("-") for login in logins}
    full = {login: "jy-" + GPUSwarmSpawner._escape(login) for login in logins}
    fitted = {login: naming.service_name(name) for login, name in full.items()}
    assert len(set(fitted.values())) == len(logins)
    assert all(is_service_name(name) for name in fitted.values())
    shortened = {fitted[login] for login in logins if fitted[login] != full[login]}
    assert shortened and not shortened & set(full.values())


def test_a_shortened_name_is_the_same_in_every_hub_process():
    """The hub finds a user's service by its name after a restart: no per-process salt."""
    code = (
        "from gpu_swarm_spawner import naming; "
        f"print(naming.service_name('jy-' + {'-2d'.join('abcdefghijklmnopqrst')!r}))"
    )
    names = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert names == {naming.service_name("jy-" + "-2d".join("abcdefghijklmnopqrst"))}


def test_the_name_is_kept_from_the_state_and_refitted_when_the_image_changes():
    spawner = spawner_for(HYPHENS)
    spawner.load_state({"object_id": "svc1", "object_name": "jy-stored-name"})
    assert spawner.object_name == "jy-stored-name"
    spawner = spawner_for(HYPHENS, "gpu2")
    spawner.image = "gpu-jupyterhub/pytorch:latest"  # dockerspawner renders the name again
    assert is_service_name(spawner.object_name)


def test_volume_names_longer_than_docker_allows_are_shortened():
    spawner = spawner_for("x" * 300)  # any username, as the demo's login allows
    volume = home_volume(spawner)
    assert is_volume_name(volume) and volume.startswith("jy-home-xxx")
    assert is_service_name(spawner.object_name)


def test_a_limit_too_small_for_the_hash_is_refused():
    with pytest.raises(ValueError, match="15 at least"):
        naming.fit("a" * 20, 10)
