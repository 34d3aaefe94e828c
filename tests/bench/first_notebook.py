"""`make demo`'s first notebook, in Chromium: from a participant's click on "Sign in" until
JupyterLab's launcher shows (issue 31's goals: p50 at most 6 s on an otherwise idle machine;
participants signing in together: the last launcher within 2x the first).

    .venv/bin/python -m tests.bench.first_notebook [--repeats 5] [--together 6]

Runs against the demo on this machine (`make demo`, its settings as ``python -m deploy
settings`` reads them), never the test bed. Each participant is new (their first login makes
their home), and their server is stopped through the REST API afterwards (also when a
sign-in fails, which then prints what the page said). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

from tests.integration.hub import REPO, Hub, launch_chromium, state_file

#: JupyterLab's launcher, drawn: the participant can open a notebook
LAUNCHER = ".jp-LauncherCard"
#: the hub has sent the browser to the participant's running server
LAB_URL = re.compile(r"/user/[^/]+/lab")
TIMEOUT_MS = 180_000


def demo_hub() -> Hub:
    """The demo's hub (its URL, operations token and passwords from its settings)."""
    out = subprocess.run(
        [sys.executable, "-m", "deploy", "settings", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    settings = json.loads(out.stdout)
    url = f"http://127.0.0.1:{settings['GPUHUB_HTTP_PORT']}"
    return Hub(
        url,
        state_file(settings, "ops_token"),
        state_file(settings, "demo_password"),
        settings["GPUHUB_STACK"],
    )


def sign_in_together(browser, hub: Hub, users: list[str]) -> list[tuple[float, float]]:
    """Seconds from the first click on "Sign in" until each participant's browser is sent to
    their server, and until their launcher shows."""
    pages = []
    for user in users:
        page = browser.new_context().new_page()
        page.goto(f"{hub.url}/hub/login")
        page.fill("#username_input", user)
        page.fill("#password_input", hub.password)
        pages.append(page)
    t0 = time.monotonic()
    for page in pages:  # as close together as one browser can click
        page.click("#login_submit", no_wait_after=True)
    seconds = []
    try:
        for page in pages:
            page.wait_for_url(LAB_URL, timeout=TIMEOUT_MS, wait_until="commit")
            sent = time.monotonic() - t0
            page.wait_for_selector(LAUNCHER, timeout=TIMEOUT_MS)
            seconds.append((sent, time.monotonic() - t0))
    except Exception:
        for page in pages:
            print(f"  {page.url}: {page.inner_text('body')[:300]!r}", file=sys.stderr)
        raise
    finally:
        for page in pages:
            page.context.close()
        stop_all(hub, users)
    return seconds


def stop_all(hub: Hub, users: list[str]) -> None:
    for user in users:
        hub.stop(user)
    time.sleep(5)  # their tasks end and free their slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="participants one at a time")
    parser.add_argument("--together", type=int, default=6, help="participants at once")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    hub = demo_hub()
    run = time.strftime("%H%M%S")
    with sync_playwright() as p:
        browser = launch_chromium(p, hub.url)
        alone, sent = [], []
        for i in range(args.repeats):
            users = [f"first-{run}-{i}"]
            ((at_lab, at_launcher),) = sign_in_together(browser, hub, users)
            alone.append(at_launcher)
            sent.append(at_lab)
            print(
                f"  alone {i + 1}: {at_launcher:.2f} s (sent to the server at {at_lab:.2f} s)",
                flush=True,
            )
        users = [f"first-{run}-together-{i}" for i in range(args.together)]
        together = sorted(t for _, t in sign_in_together(browser, hub, users))
        browser.close()
    print(f"\nsign-in click -> JupyterLab's launcher ({hub.url}, Chromium)")
    print(
        f"  alone: p50 {statistics.median(alone):.2f} s, max {max(alone):.2f} s "
        f"(n={len(alone)})   goal: p50 <= 6 s"
    )
    lab = [t - s for s, t in zip(sent, alone)]
    print(
        f"    of which: sign-in until sent to the server p50 {statistics.median(sent):.2f} s, "
        f"JupyterLab's page until its launcher p50 {statistics.median(lab):.2f} s"
    )
    print(
        f"  {len(together)} together: first {together[0]:.2f} s, last {together[-1]:.2f} s "
        f"= {together[-1] / together[0]:.2f}x the first   goal: <= 2x"
    )


if __name__ == "__main__":
    main()
