"""WorkshopGitHubOAuthenticator's roster: who it lets in, reloading, and a broken edit."""

import os

from gpu_swarm_spawner.auth import WorkshopGitHubOAuthenticator


def model(name):
    return {"name": name, "admin": False, "auth_state": {"token_response": {}}}


def touch_later(path, seconds):
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + seconds))


async def test_the_roster_lets_in_its_users_and_is_reread_when_it_changes(tmp_path):
    roster = tmp_path / "roster.txt"
    roster.write_text("rosa\n")
    auth = WorkshopGitHubOAuthenticator(roster_file=str(roster))
    assert await auth.check_allowed("rosa", model("rosa"))
    assert not await auth.check_allowed("rick", model("rick"))

    roster.write_text("rosa\n@Rick\n")
    touch_later(roster, 1)
    assert await auth.check_allowed("rick", model("rick"))

    # a broken edit keeps the last good list (and is logged)
    roster.write_text("rosa\nnot a name\n")
    touch_later(roster, 2)
    assert await auth.check_allowed("rick", model("rick"))


async def test_admins_are_let_in_without_the_roster(tmp_path):
    auth = WorkshopGitHubOAuthenticator(roster_file=str(tmp_path / "missing.txt"))
    assert await auth.check_allowed("ada", dict(model("ada"), admin=True))
    assert not await auth.check_allowed("nina", model("nina"))


def test_a_refused_user_is_told_how_to_get_in():
    message = WorkshopGitHubOAuthenticator().custom_403_message
    assert "participant list" in message and "roster" in message
