#!/usr/bin/env python3
"""Check in a real browser that the GPU guard's notices show as JupyterLab notifications.

Runs against a running JupyterLab that has the gpuhub_notices extensions: a server of the
single-user image, or a local venv set up as the Dockerfile sets up the image::

    check_notices.py URL [--exec PREFIX] [--file PATH] [--screenshot PNG]

URL opens JupyterLab logged in: http://127.0.0.1:18888/lab?token=t, or on the test bed
http://HUB/user/alice/lab?token=<an API token of alice>. ``--exec PREFIX`` runs a command where
the server runs, e.g. ``--exec 'docker exec -i -u 1000 CONTAINER'`` (default: none, this
machine): the script writes the notices file as the guard does (``PREFIX sh -c 'cat > FILE.tmp
&& mv FILE.tmp FILE'``, the JSON on stdin) and lists the extensions with ``PREFIX jupyter ...``.
It overwrites the notices file, and empties it at the end.

What it checks, one line each as it passes:

1. ``jupyter server extension list`` shows gpuhub_notices enabled and OK, ``jupyter labextension
   list`` gpuhub-notices;
2. ``gpuhub/notices``, fetched by the page, answers 200 and no notices for an invalid file;
3. a warning written to the file shows as a toast within 15 s, and two polls later still once;
4. a reload does not show it again;
5. an error written later shows; rewritten with new numbers, its toast changes in place; its
   "Read all" opens the whole message;
6. an info notice closes by itself after about 10 s;
7. a notice written while no page was open shows on the next load; one older than an hour not.

Needs Playwright (the repo's .venv has it) and a Chromium (default /usr/bin/chromium; it never
runs ``playwright install``). Exit status 0: all passed; 1: a check failed (a screenshot of the
page then lies beside ``--screenshot``).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
POLL_S = 5  # the lab extension's poll interval
TOAST = ".Toastify__toast"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
WRITE = 'mkdir -p "$(dirname "$1")" && cat > "$1.tmp" && mv "$1.tmp" "$1"'


class CheckFailed(Exception):
    pass


def notice(notice_id: str, level: str, title: str, message: str, age_s: float = 0) -> dict:
    return {
        "id": notice_id,
        "level": level,
        "time": time.time() - age_s,
        "title": title,
        "message": message,
    }


def warning_text(used_gb: float) -> str:
    return (
        f"You use {used_gb} GB of GPU memory; your budget is 4.0 GB (1 slice of NVIDIA A10). "
        "Free some (del tensors, torch.cuda.empty_cache()) or restart the kernel: at 14:03:20 "
        "the process holding the most (pid 1234) will be stopped."
    )


def stop_text(pid: int) -> str:
    return (
        f"Your process {pid} used 9.3 GB of GPU memory, over your budget of 4.0 GB for more "
        "than 60 s, and was stopped. Its kernel has died: restart it, and use less memory."
    )


class Server:
    """Where the JupyterLab server runs: its notices file and its ``jupyter`` command."""

    def __init__(self, prefix: str, notices_file: str):
        self.prefix = shlex.split(prefix)
        self.file = notices_file

    def run(self, *args: str, stdin: str | None = None) -> str:
        command = [*self.prefix, *args]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise CheckFailed(f"{shlex.join(command)} failed: {result.stderr.strip()}")
        return ANSI.sub("", result.stdout + result.stderr)

    def write(self, text: str) -> None:
        """The notices file, replaced at once as the guard replaces it."""
        self.run("sh", "-c", WRITE, "sh", self.file, stdin=text)

    def write_notices(self, *notices: dict) -> None:
        self.write(json.dumps({"notices": list(notices)}))


def check(condition: bool, failure: str) -> None:
    if not condition:
        raise CheckFailed(failure)


def passed(message: str) -> None:
    print(f"ok: {message}", flush=True)


def toasts(page, text: str):
    return page.locator(TOAST, has_text=text)


def open_lab(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(".jp-LabShell", timeout=120_000)
    page.wait_for_selector(".jp-Launcher, .jp-MainAreaWidget", timeout=60_000)


def wait_for_toast(page, text: str, timeout_s: float = 3 * POLL_S) -> str:
    """The toast's text, once one with ``text`` shows."""
    toast = toasts(page, text)
    try:
        toast.first.wait_for(state="visible", timeout=timeout_s * 1000)
    except Exception as error:  # playwright's TimeoutError
        raise CheckFailed(f"no toast with {text!r} within {timeout_s} s") from error
    return toast.first.inner_text()


def check_extensions(server: Server) -> None:
    listed = server.run("jupyter", "server", "extension", "list")
    check(
        re.search(r"gpuhub_notices\s+enabled", listed) and re.search(r"gpuhub_notices.*OK", listed),
        f"jupyter server extension list shows no gpuhub_notices enabled and OK:\n{listed}",
    )
    listed = server.run("jupyter", "labextension", "list")
    check(
        re.search(r"gpuhub-notices v\S+ enabled OK", listed),
        f"jupyter labextension list shows no gpuhub-notices enabled OK:\n{listed}",
    )
    passed("jupyter server extension list: gpuhub_notices enabled, OK")
    passed("jupyter labextension list: gpuhub-notices enabled, OK")


def check_endpoint(page, server: Server) -> None:
    server.write("not JSON {")
    answer = page.evaluate(
        """async () => {
            const config = JSON.parse(document.getElementById('jupyter-config-data').textContent);
            const response = await fetch(config.baseUrl + 'gpuhub/notices',
                                         {credentials: 'same-origin'});
            return {status: response.status, body: await response.text()};
        }"""
    )
    check(answer["status"] == 200, f"gpuhub/notices answered {answer}")
    check(json.loads(answer["body"])["notices"] == [], f"gpuhub/notices answered {answer}")
    passed(f"gpuhub/notices with an invalid file: 200 {answer['body']}")


def run_checks(browser, url: str, server: Server, screenshot: Path) -> None:
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        server.write_notices()
        open_lab(page, url)
        check_endpoint(page, server)
        server.write_notices()

        warning = notice("check-warn", "warning", "GPU memory over your budget", warning_text(9.2))
        server.write_notices(warning)
        shown = wait_for_toast(page, warning["title"])
        passed(f"the warning shows as a toast: {shown!r}")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(1000)  # the toast slides in
        page.screenshot(path=str(screenshot))
        time.sleep(2 * POLL_S + 1)
        count = toasts(page, warning["title"]).count()
        check(count == 1, f"the warning shows {count} times after two more polls")
        passed("two polls later it shows once")

        page.reload()
        open_lab(page, url)
        time.sleep(2 * POLL_S + 1)
        count = toasts(page, warning["title"]).count()
        check(count == 0, f"after a reload the warning shows again ({count})")
        passed("after a reload it does not show again")

        error = notice("check-stop", "error", "GPU process stopped", stop_text(1234))
        server.write_notices(warning, error)
        shown = wait_for_toast(page, error["title"])
        check(toasts(page, warning["title"]).count() == 0, "the warning showed again")
        passed(f"an error written later shows: {shown!r}")

        rewritten = {**error, "message": stop_text(5678), "time": time.time()}
        server.write_notices(warning, rewritten)
        shown = wait_for_toast(page, "process 5678")
        count = toasts(page, error["title"]).count()
        check(count == 1, f"the rewritten error shows {count} times")
        passed(f"rewritten, the error's toast changes in place: {shown!r}")

        toasts(page, error["title"]).first.get_by_role("button", name="Read all").click()
        details = page.locator(".gpuhub-notices-details")
        details.wait_for(state="visible", timeout=5000)
        text = details.inner_text()
        check(rewritten["message"] in text, f"'Read all' shows {text!r}")
        page.screenshot(path=str(screenshot.with_name(screenshot.stem + "-details.png")))
        details.get_by_role("button", name="OK").click()
        details.wait_for(state="detached", timeout=5000)
        passed("'Read all' opens the whole message, OK closes it")

        info = notice("check-ok", "info", "Back within your budget", "You use 3.1 GB of 4.0 GB.")
        server.write_notices(warning, rewritten, info)
        wait_for_toast(page, info["title"])
        try:
            toasts(page, info["title"]).first.wait_for(state="detached", timeout=16_000)
        except Exception as error:
            raise CheckFailed("the info toast was still there after 16 s") from error
        passed("an info notice shows and closes by itself")

        page.close()
        fresh = notice("check-fresh", "warning", "Written while away", warning_text(7.5), 600)
        stale = notice("check-stale", "warning", "Written long ago", warning_text(8.1), 7200)
        server.write_notices(warning, rewritten, info, stale, fresh)
        page = context.new_page()
        open_lab(page, url)
        shown = wait_for_toast(page, fresh["title"])
        time.sleep(2 * POLL_S + 1)
        for old in (stale, warning, rewritten, info):
            count = toasts(page, old["title"]).count()
            check(count == 0, f"after a new load, {old['id']} shows {count} times")
        passed(f"on a new load a notice written meanwhile shows ({shown!r}); older ones do not")
    except Exception:
        if not page.is_closed():
            page.screenshot(path=str(screenshot.with_name(screenshot.stem + "-failed.png")))
        raise
    finally:
        context.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="JupyterLab's URL, logged in (?token=...)")
    parser.add_argument("--exec", default="", dest="prefix", help="runs a command at the server")
    parser.add_argument("--file", default="/tmp/gpuhub-guard/notices.json", help="notices file")
    parser.add_argument("--screenshot", default="test-artifacts/notices-toast.png", type=Path)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    server = Server(args.prefix, args.file)
    try:
        check_extensions(server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS
            )
            try:
                run_checks(browser, args.url, server, args.screenshot)
            finally:
                browser.close()
    except CheckFailed as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        try:
            server.write_notices()
        except CheckFailed as failure:
            print(f"could not empty the notices file: {failure}", file=sys.stderr)
    print(f"all passed; screenshot: {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
