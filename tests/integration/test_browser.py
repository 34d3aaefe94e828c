"""A participant's path in a real browser: login page -> JupyterLab in a GPU-slice service."""

import json

import pytest

from .hub import ARTIFACTS

pytestmark = [pytest.mark.integration, pytest.mark.browser]


def test_login_reaches_jupyterlab(hub, page):
    user = "ci-browser"
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{hub.url}/hub/login")
    assert "simulated" in page.locator(".announcement").inner_text().lower()
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    try:
        page.wait_for_selector(".jp-LabShell", timeout=120_000)
        page.wait_for_selector(".jp-Launcher", state="visible", timeout=60_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "browser-login.png"))
    assert f"/user/{user}/lab" in page.url
    server = hub.server(user)
    assert server and server["ready"]
    hub.stop(user)


# Copies each line the spawn page adds to its progress log into sessionStorage, which survives
# the redirect to JupyterLab (same origin), so the test can read what the participant saw.
RECORD_PROGRESS = """
new MutationObserver(() => {
  const log = document.querySelector("#progress-log");
  if (!log) return;
  const seen = [...log.querySelectorAll(".progress-log-event")].map(e => e.textContent);
  if (seen.length) sessionStorage.setItem("spawn-progress", JSON.stringify(seen));
}).observe(document, {childList: true, subtree: true});
"""


def test_spawn_page_shows_the_progress_stages(hub, page):
    user = "ci-progress"
    page.add_init_script(RECORD_PROGRESS)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    stages = json.loads(page.evaluate("sessionStorage.getItem('spawn-progress') || '[]'"))
    hub.stop(user)
    text = "\n".join(stages)
    assert "Reserving 1 slice(s) of SIMULATED GPU GPU-simulated-" in text, stages
    assert "Container running on" in text, stages
    assert "Server ready" in text, stages


def test_wrong_password_is_refused(hub, page):
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "ci-intruder")
    page.fill("#password_input", "not-the-password")
    page.click("#login_submit")
    page.wait_for_selector("#login_submit")
    assert "/hub/login" in page.url
    assert "invalid" in page.content().lower()
