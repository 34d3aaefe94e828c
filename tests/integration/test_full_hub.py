"""What a participant meets when every GPU slice is taken: the page they see, and the REST API.

The slices are filled by services holding whole GPUs (started by GPUSwarmSpawners driven
directly, running ``sleep``): the hub reads the same swarm, so to its spawner the hub is full.
"""

import asyncio
import time

import docker
import pytest

from .hub import ARTIFACTS, log_in
from .spawners import inventory, make_spawner, remove_services, service_of, wait_slices_free

pytestmark = pytest.mark.integration

REFUSAL = "All GPU slices are in use"


@pytest.fixture(scope="module")
def full(hub, hub_settings):
    """Every slice of the bed taken, by services outside the hub."""
    remove_services(hub.stack)
    wait_slices_free()
    gpus = inventory()
    per_gpu = {g.slices for g in gpus.values()}
    assert len(per_gpu) == 1, gpus
    (slices,) = per_gpu
    holders = [
        make_spawner(f"ci-holder-{i}", hub_settings, slices_per_server=slices)
        for i in range(len(gpus))
    ]

    async def start_all():
        await asyncio.gather(*(s.start() for s in holders))

    asyncio.run(start_all())
    assert all(g.free == 0 for g in inventory().values()), inventory()
    total = sum(g.slices for g in gpus.values())
    yield f"{REFUSAL} ({total}/{total})"
    remove_services(hub.stack)


def hub_log_since(hub, since: float) -> str:
    """The hub's log from ``since`` (a time.time()) on."""
    service = docker.from_env().services.get(f"{hub.stack}_hub")
    lines = service.logs(stdout=True, stderr=True, since=int(since) - 1)
    return b"".join(lines).decode(errors="replace")


def test_rest_api_answers_a_full_hub_with_503_and_the_message(hub, full):
    user = "ci-full-rest"
    hub.api("POST", f"/users/{user}")
    t0, t0_wall = time.monotonic(), time.time()
    r = hub.api("POST", f"/users/{user}/server")
    elapsed = time.monotonic() - t0
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.json()["message"].startswith(full), r.text
    assert elapsed < 2, f"refusal took {elapsed:.2f} s"
    assert hub.server(user) is None
    # refused by the gate (gate.py): JupyterHub began no spawn (no OAuth client was made)
    log = hub_log_since(hub, t0_wall)
    assert f"Creating oauth client jupyterhub-user-{user}" not in log, log
    assert "before JupyterHub's spawn" in log, log
    # the spawn-pending page's progress stream (what it shows when a refusal comes later)
    r = hub.api("GET", f"/users/{user}/server/progress", stream=True)
    events = [line for line in r.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events and '"failed": true' in events[-1], events
    assert f"Spawn failed: {full}" in events[-1], events

    # asking again: the same answer (the gate keeps the refused spawner, gate.py)
    r = hub.api("POST", f"/users/{user}/server")
    assert r.status_code == 503 and r.json()["message"].startswith(full), r.text
    assert hub.server(user) is None


@pytest.mark.browser
def test_a_participant_reads_the_refusal_on_the_page_and_on_the_home_page(hub, full, page):
    """Refused within the spawn's first second: JupyterHub's error page, with our message."""
    user = "ci-full-page"
    ARTIFACTS.mkdir(exist_ok=True)
    log_in(page, hub, user)  # logging in starts the server (no options to choose)
    page.wait_for_selector(".error, #last-start-failed, .jp-LabShell", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "full-hub-refusal.png"))
    text = page.inner_text("body")
    assert full in text, text
    assert "Unhandled error" not in text, text

    # the home page says what happened instead of offering "Start My Server" as if nothing had
    page.goto(f"{hub.url}/hub/home")
    notice = page.locator("#last-start-failed")
    assert full in notice.inner_text(), page.inner_text("body")
    page.screenshot(path=str(ARTIFACTS / "full-hub-home.png"))

    # and so does the spawn-pending page (where a refusal after the first second is read)
    response = page.goto(f"{hub.url}/hub/spawn-pending/{user}")
    assert response.status == 503
    assert full in page.inner_text("body")

    # pressing Start again: told again
    page.goto(f"{hub.url}/hub/home")
    page.click("#start")
    page.wait_for_url("**/hub/spawn**")  # the spawn page, or the spawn-pending page after 1 s
    page.wait_for_function(
        f"document.body && document.body.innerText.includes({full!r})", timeout=60_000
    )
    assert "Unhandled error" not in page.inner_text("body")


@pytest.mark.browser
def test_an_admin_reads_the_refusal_on_the_spawn_form(hub, full, page):
    """With choices to make (an admin may take a full GPU), the refusal comes back on the
    spawn form."""
    log_in(page, hub, "admin", hub.admin_password)
    page.wait_for_selector("#gpuhub-gpu-full", timeout=60_000)
    page.check("#gpuhub-gpu-full")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("form#spawn_form input[type=submit], form#spawn_form button[type=submit]")
    assert answer.value.status == 503
    page.wait_for_selector("#gpuhub-gpu-full")
    page.screenshot(path=str(ARTIFACTS / "full-hub-refusal-form.png"))
    text = page.inner_text("body")
    assert full in text, text
    assert "Unhandled error" not in text, text


@pytest.mark.browser
def test_several_participants_at_once_each_read_the_refusal(hub, full, browser):
    """A burst: refusals may come within the first second (error page) or after it (the
    spawn-pending page's progress log); either way each participant reads the message."""
    users = [f"ci-full-burst-{i}" for i in range(4)]
    contexts = [browser.new_context() for _ in users]
    pages = [c.new_page() for c in contexts]
    try:
        for page, user in zip(pages, users):
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", user)
            page.fill("#password_input", hub.password)
        for page in pages:  # as close together as one browser can click
            page.click("#login_submit", no_wait_after=True)
        paths = []
        for i, page in enumerate(pages):
            page.wait_for_function(
                f"document.body && document.body.innerText.includes({REFUSAL!r})",
                timeout=60_000,
            )
            page.screenshot(path=str(ARTIFACTS / f"full-hub-burst-{i}.png"))
            assert "Unhandled error" not in page.inner_text("body")
            paths.append("spawn-pending" if "/spawn-pending/" in page.url else "error page")
        print("refusals were read on:", paths)
    finally:
        for context in contexts:
            context.close()
    for user in users:
        assert hub.server(user) is None


def test_a_participant_refused_before_starts_once_a_gpu_is_free(hub, full):
    """The spawner the gate refused (twice, above) is kept; it starts a server as a new one
    would once a holder's GPU is free."""
    user = "ci-full-rest"
    assert hub.server(user) is None
    service_of(hub.stack, "ci-holder-0").remove()
    wait_slices_free(on=any)  # its task has really gone
    try:
        r = hub.api("POST", f"/users/{user}/server")
        assert r.status_code in (201, 202), (r.status_code, r.text)
        hub.wait_ready(user)
        resources = service_of(hub.stack, user).attrs["Spec"]["TaskTemplate"]["Resources"]
        assert resources["Reservations"]["GenericResources"], resources  # its GPU slice
    finally:
        hub.stop(user)
