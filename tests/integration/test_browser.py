"""A participant's path in a real browser: login page -> JupyterLab in a GPU-slice service."""

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
        )
        yield browser.new_page()
        browser.close()


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


def test_wrong_password_is_refused(hub, page):
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", "ci-intruder")
    page.fill("#password_input", "not-the-password")
    page.click("#login_submit")
    page.wait_for_selector("#login_submit")
    assert "/hub/login" in page.url
    assert "invalid" in page.content().lower()
