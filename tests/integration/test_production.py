"""`make up` from the example config, pointed at a local fake GitHub, over HTTPS.

The stack under test is redeployed by `make up` (GitHub login, self-signed HTTPS gateway, image
registry), a real browser logs in through the fake GitHub's OAuth flow, and afterwards the demo
stack the other tests use is deployed again.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import docker
import pytest
import requests

from .fake_github import GitHubData, serve
from .hub import (
    ARTIFACTS,
    BED,
    BED_HOST,
    BED_MANAGER,
    BED_RUN,
    ENGINE_ADDR,
    REPO,
    Hub,
    container_env,
    container_of,
    deploy,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

GITHUB_PORT = 18900
HTTPS_PORT = 18443
REGISTRY_PORT = 15000  # the bed's workers trust it once they join with --registry
CLIENT_SECRET = "fake-github-client-secret-7f3a"
HOST = ENGINE_ADDR  # where the stack under test publishes its ports

# Who is who on the fake GitHub.
ORGS = {"gpu-workshop": {"alice"}, "gpu-school": {"tom", "olga"}}
TEAMS = {"gpu-school:tutors": {"tom"}}
ROSTER = "# registered by the form\nrosa\n"

STANDINS = {
    "PyTorch": "gpu-jupyterhub/standin-pytorch:latest",
    "TensorFlow": "gpu-jupyterhub/standin-tensorflow:latest",
}

# The example config with what a test install changes (each of these keys is in the example).
CHANGES = {
    "GPUHUB_HOSTNAME": HOST,
    "GPUHUB_TLS": "self-signed",
    "GPUHUB_HTTPS_PORT": str(HTTPS_PORT),
    "GPUHUB_GITHUB_CLIENT_ID": "fake-github-client",
    "GPUHUB_GITHUB_CLIENT_SECRET": CLIENT_SECRET,
    "GPUHUB_ALLOWED_ORGS": "gpu-workshop gpu-school:tutors",
    "GPUHUB_ADMIN_USERS": "ada",
    "GPUHUB_SIMULATE_IF_NO_GPU": "2",  # this machine has no GPU: keep the bed's simulated ones
    "GPUHUB_CPU_LIMIT": "1",
    "GPUHUB_MEM_LIMIT": "1G",
    # slim stand-ins for the PyTorch and TensorFlow images (built by the fixture)
    "GPUHUB_ENVIRONMENTS": " ".join(f"{n}={i}" for n, i in STANDINS.items()),
    # the bed's git daemon, as in conftest.py (never github.com)
    "GPUHUB_TUTORIAL_REPOS": f"gpu101=git://{BED_HOST}:9418/gpu101.git",
}
# ... and what it adds: where "GitHub" is, and the registry port the bed's workers trust
ADDED = {"GPUHUB_GITHUB_URL": f"http://{BED_HOST}:{GITHUB_PORT}"}
ADDED["GPUHUB_REGISTRY_PORT"] = str(REGISTRY_PORT)


def example_config(roster: Path) -> str:
    changes = dict(CHANGES, GPUHUB_ROSTER=str(roster))
    lines = []
    for line in (REPO / "deploy" / "config.example.env").read_text().splitlines():
        key = line.split("=", 1)[0]
        if key in changes:
            line = f"{key}={changes.pop(key)}"
        lines.append(line)
    assert not changes, f"settings no longer in the example config: {changes}"
    lines += [f"{k}={v}" for k, v in ADDED.items()]
    return "\n".join(lines) + "\n"


def make(target: str, config: Path, **env) -> str:
    """`make TARGET CONFIG=...` as the organizer runs it; its output, or the failure's."""
    environment = {k: v for k, v in os.environ.items() if k != "GPUHUB_CONFIG"}
    environment.update(env)
    result = subprocess.run(
        ["make", "-s", target, f"CONFIG={config}"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"make {target} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def build_standin(environment: str, image: str) -> None:
    subprocess.run(
        ["docker", "build", "-q", "--build-arg", f"ENVIRONMENT={environment}"]
        + ["-f", "images/standin/Dockerfile", "-t", image, "."],
        cwd=REPO,
        check=True,
        capture_output=True,
        env=dict(os.environ, DOCKER_BUILDKIT="0"),
    )


def join_with_registry(worker: str) -> str:
    result = subprocess.run(
        ["bash", str(REPO / "tests/bed/bed.sh"), "join", worker]
        + ["--registry", f"{BED_MANAGER}:{REGISTRY_PORT}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{worker}: {result.stdout}\n{result.stderr}"
    return result.stdout


class Production:
    def __init__(self, tmp, settings, github: GitHubData, up_output: str, joins: dict):
        self.config = tmp / "config.env"
        self.roster = tmp / "roster.txt"
        self.settings = settings
        self.github = github
        self.up_output = up_output
        self.joins = joins
        self.url = f"https://{HOST}:{HTTPS_PORT}"
        self.cert = Path(settings["GPUHUB_STATE_DIR"], "tls", "cert.pem")
        token = Path(settings["GPUHUB_STATE_DIR"], "ops_token").read_text().strip()
        # the hub's REST API over HTTPS, checking the generated certificate
        self.hub = Hub(self.url, token, "", settings["GPUHUB_STACK"], verify=str(self.cert))


@pytest.fixture(scope="module")
def production(hub, hub_settings, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("organizer")
    github = GitHubData("fake-github-client", CLIENT_SECRET, orgs=ORGS, teams=TEAMS)
    github.invited, github.hidden = {"gpu-workshop": {"ivy"}}, {"gpu-workshop": {"hugo"}}
    github.rate_limited, github.user_rate_limited = {"remy"}, {"uma"}
    server = serve(BED_HOST, GITHUB_PORT, github)
    (tmp / "roster.txt").write_text(ROSTER)
    config = tmp / "config.env"
    config.write_text(example_config(tmp / "roster.txt"))
    config.chmod(0o600)
    for name, image in STANDINS.items():
        build_standin(name.lower(), image)
    try:
        output = make("up", config)
        # the bed's GPU machines run make up's join line again, now with --registry
        joins = {w: join_with_registry(w) for w in ("w1", "w2")}
        yield Production(tmp, hub_settings, github, output, joins)
    finally:
        server.shutdown()
        # the demo stack again, for the other tests (--prune removes the gateway and registry)
        deploy("stack")


def github_login(page, url: str, login: str) -> None:
    """The participant's path: the hub's login page, GitHub's sign-in, back to the hub."""
    page.goto(f"{url}/hub/login")
    page.click("a.btn-jupyter")  # "Sign in with GitHub"
    page.wait_for_selector("#login_field")
    assert page.url.startswith(f"http://{BED_HOST}:{GITHUB_PORT}/login/oauth/authorize")
    page.fill("#login_field", login)
    page.click("button[name=commit]")


def test_make_up_prints_the_url_and_the_join_command(production):
    out = production.up_output
    assert f"GPU JupyterHub is up: https://{HOST}:{HTTPS_PORT}/" in out
    assert "--registry" in out and f"{BED_MANAGER}:{REGISTRY_PORT}" in out
    assert "sudo ./worker_setup/setup.sh --manager" in out
    assert CLIENT_SECRET not in out


def test_gpu_machines_joined_with_registry_pull_the_image_from_it(production):
    image = f"{BED_MANAGER}:{REGISTRY_PORT}/gpu-jupyterhub/singleuser:latest"
    local = docker.from_env().images
    expected = {image: local.get("gpu-jupyterhub/singleuser:latest").id}
    for standin in STANDINS.values():
        expected[f"{BED_MANAGER}:{REGISTRY_PORT}/{standin}"] = local.get(standin).id
    for worker, output in production.joins.items():
        # pulled now, or by an earlier run ("up to date" is a successful pull too)
        assert "pulled from the manager's registry" in output or "up to date" in output, output
        engine = docker.DockerClient(base_url=f"unix://{BED_RUN / worker}.sock")
        for name, image_id in expected.items():  # the environments' images too
            assert engine.images.get(name).id == image_id, (worker, name)
        daemon_json = json.loads(Path(BED["BED_DATA"], worker, "daemon.json").read_text())
        assert f"{BED_MANAGER}:{REGISTRY_PORT}" in daemon_json["insecure-registries"]


def test_the_registry_takes_no_push_or_delete_from_the_network(production):
    """Issue 39: the registry the GPU machines pull from is read-only to everyone who reaches
    it: a GPU machine's engine (root there) cannot push a replacement for the servers' image,
    and a DELETE of its manifest is refused; the pulls above still work. `make up` pushed
    through its writer on the manager's loopback, which is gone afterwards."""
    registry = f"{BED_MANAGER}:{REGISTRY_PORT}"
    worker = next(iter(production.joins))
    engine = docker.DockerClient(base_url=f"unix://{BED_RUN / worker}.sock")
    image = engine.images.get(f"{registry}/gpu-jupyterhub/singleuser:latest")
    image.tag(f"{registry}/gpu-jupyterhub/singleuser", "replaced")
    said = list(engine.images.push(f"{registry}/gpu-jupyterhub/singleuser", "replaced",
                                   stream=True, decode=True))  # fmt: skip
    assert any("error" in event for event in said), said
    base = f"http://{registry}/v2/gpu-jupyterhub/singleuser"
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
    head = requests.head(f"{base}/manifests/latest", headers=accept, timeout=10)
    assert head.status_code == 200
    digest = head.headers["Docker-Content-Digest"]
    deleted = requests.delete(f"{base}/manifests/{digest}", timeout=10)
    assert deleted.status_code >= 400, deleted.status_code
    assert requests.head(f"{base}/manifests/latest", headers=accept, timeout=10).status_code == 200
    assert (
        requests.head(f"{base}/manifests/replaced", headers=accept, timeout=10).status_code == 404
    )
    writer = f"{production.settings['GPUHUB_STACK']}-registry-push"
    assert not docker.from_env().containers.list(all=True, filters={"name": writer})


def test_https_with_the_generated_certificate_and_http_redirects(production):
    r = production.hub.api("GET", "/")
    assert r.status_code == 200 and "version" in r.json()
    http = requests.get(
        f"http://{HOST}:{production.settings['GPUHUB_HTTP_PORT']}/hub/login",
        allow_redirects=False,
        timeout=30,
    )
    assert http.status_code in (301, 308)
    assert http.headers["Location"].startswith(f"https://{HOST}:{HTTPS_PORT}/")


def test_the_client_secret_is_a_docker_secret_only(production):
    client = docker.from_env()
    (hub,) = client.services.list(filters={"name": f"{production.settings['GPUHUB_STACK']}_hub"})
    assert CLIENT_SECRET not in json.dumps(hub.attrs)
    secrets = [
        s["SecretName"] for s in hub.attrs["Spec"]["TaskTemplate"]["ContainerSpec"]["Secrets"]
    ]
    assert any(name.startswith(f"{hub.name[:-4]}_github_client_secret_") for name in secrets)


def start_from_spawn_page(page, environment: str, full_gpu: bool = False) -> None:
    """The spawn page's choices: an environment and, when offered, a full GPU."""
    page.wait_for_selector("#gpuhub-image", timeout=60_000)
    page.select_option("#gpuhub-image", environment)
    if full_gpu:
        page.check("#gpuhub-gpu-full")
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")


def server_spec(user: str) -> dict:
    (service,) = docker.from_env().services.list(filters={"name": f"jy-{user}"})
    return service.attrs["Spec"]["TaskTemplate"]


def test_an_org_member_logs_in_and_lands_in_jupyterlab(production, page):
    github_login(page, production.url, "alice")
    page.wait_for_selector("#gpuhub-image", timeout=60_000)
    assert page.locator("#gpuhub-gpu-full").count() == 0  # a full GPU is for admins
    start_from_spawn_page(page, "PyTorch")
    try:
        page.wait_for_selector(".jp-LabShell", timeout=180_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "github-login.png"))
    assert "/user/alice/lab" in page.url
    server = production.hub.server("alice")
    assert server["ready"]
    # the chosen environment's image, from the manager's registry, with the organizer's limits
    spec = server_spec("alice")
    registry = f"{BED_MANAGER}:{REGISTRY_PORT}/"
    assert spec["ContainerSpec"]["Image"] == registry + STANDINS["PyTorch"]
    assert container_env(container_of("jy-alice"))["GPUHUB_ENVIRONMENT"] == "pytorch-standin"
    assert spec["Resources"]["Limits"]["NanoCPUs"] == 1_000_000_000
    assert spec["Resources"]["Limits"]["MemoryBytes"] == 1024**3
    assert "POST /login/oauth/access_token" in production.github.requests
    assert "GET /api/v3/orgs/gpu-workshop/members/alice" in production.github.requests


# A run as PyTorch's SummaryWriter writes it (TensorBoard's own event-file writer, which the
# SummaryWriter uses), written by the participant's Python in their server: a scalar "loss".
WRITE_RUN = """
import sys, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(sys.argv[1])
for step in range(20):
    value = Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
    writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
writer.close()
"""


def only_the_bed(page, blocked: list[str]) -> None:
    """The page and its popups reach the stack under test and the fake GitHub only (what a
    page would fetch from elsewhere, fonts say, is refused and listed in ``blocked``)."""
    allowed = (f"https://{HOST}:{HTTPS_PORT}/", f"http://{BED_HOST}:{GITHUB_PORT}/")

    def route(route):
        if route.request.url.startswith(allowed):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.context.route("**/*", route)


def test_tensorboard_opens_from_the_launcher_on_the_participants_own_run(production, page):
    blocked: list[str] = []
    only_the_bed(page, blocked)
    github_login(page, production.url, "alice")  # her PyTorch stand-in server runs (above)
    page.wait_for_selector(".jp-Launcher", state="visible", timeout=180_000)
    # the environment's kernel under its name, and TensorBoard, in JupyterLab's launcher
    kernel = page.locator(".jp-LauncherCard", has_text="Python 3 (pytorch stand-in)")
    kernel.first.wait_for(timeout=60_000)
    run = container_of("jy-alice").exec_run(
        ["python3", "-c", WRITE_RUN, "/home/jovyan/runs/first-run"], user="jovyan"
    )
    assert run.exit_code == 0, run.output.decode()
    card = page.locator(".jp-LauncherCard", has_text="TensorBoard")
    try:
        # with its icon (a launcher shows an image only for its Notebook and Console rows)
        icon = card.locator("img")
        icon.wait_for(timeout=30_000)
        assert icon.evaluate("i => i.complete && i.naturalWidth") > 0
        # nothing in front of it (JupyterLab's news prompt was, before the image turned it off)
        with page.expect_popup(timeout=60_000) as opened:
            card.click(timeout=30_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "launcher.png"))
    board = opened.value
    try:
        # its time series: the run (named from her home), a card of its "loss", whose table
        # shows the last value written, 1/20 at step 19
        board.get_by_text("runs/first-run", exact=True).first.wait_for(timeout=120_000)
        board.get_by_text("loss", exact=True).first.wait_for(timeout=60_000)
        board.get_by_text("0.05", exact=True).first.wait_for(timeout=60_000)
    finally:
        board.screenshot(path=str(ARTIFACTS / "tensorboard.png"))
    assert board.url.startswith(f"{production.url}/user/alice/tensorboard/"), board.url


def test_check_environment_passes_in_her_stand_in(production):
    """The environment check organizers run in a real image (make bench-images), in the
    stand-in: no framework to import, the rest as in a real environment."""
    result = container_of("jy-alice").exec_run(["check-environment", "--json"], user="jovyan")
    report = json.loads(result.output.decode().strip().splitlines()[-1])
    assert result.exit_code == 0, report
    assert report["environment"] == "pytorch-standin"
    checks = report["checks"]
    assert checks["kernel"]["status"] == "ok"
    assert "'Python 3 (pytorch stand-in)'" in checks["kernel"]["detail"]
    assert checks["tensorboard"]["status"] == "ok", checks["tensorboard"]
    # nothing that only slows every start (rfc3987-syntax) among the server's imports
    assert checks["server"]["status"] == "ok", checks["server"]
    assert checks["gpu-info"]["detail"].startswith("GPU:           GPU-simulated-")
    assert {checks[name]["status"] for name in ("import", "train", "caps")} == {"skipped"}


def test_another_participant_cannot_open_her_tensorboard(production, page):
    github_login(page, production.url, "tom")
    page.wait_for_url("**/hub/spawn**", timeout=60_000)
    response = page.goto(f"{production.url}/user/alice/tensorboard/")
    assert response.status == 403, (response.status, page.url)
    assert "first-run" not in page.content()


def test_a_team_member_logs_in(production, page):
    github_login(page, production.url, "tom")
    page.wait_for_url("**/hub/spawn**", timeout=60_000)  # in: the spawn page


def test_a_participant_chooses_no_gpu_on_the_spawn_page_and_every_page_says_so(production, page):
    github_login(page, production.url, "tom")
    page.wait_for_selector("#gpuhub-gpu-none", timeout=60_000)
    page.check("#gpuhub-gpu-none")
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
    banner = page.locator("#gpuhub-without-gpu")  # the spawn-pending page
    banner.wait_for(timeout=30_000)
    assert "This server starts without a GPU (CPU only)" in banner.inner_text()
    page.wait_for_selector(".jp-LabShell", timeout=180_000)
    spec = server_spec("tom")
    assert not spec["Resources"].get("Reservations", {}).get("GenericResources")
    env = container_env(container_of("jy-tom"))
    assert env["GPU_MODE"] == "none" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not [name for name in env if name.startswith("GPU_") and name != "GPU_MODE"]
    info = container_of("jy-tom").exec_run(["gpu-info"]).output.decode()
    assert "without a GPU (CPU only)" in info, info
    page.goto(f"{production.url}/hub/home")
    home_banner = page.locator("#gpuhub-without-gpu")
    home_banner.wait_for(timeout=30_000)
    assert "Your server runs without a GPU (CPU only)" in home_banner.inner_text()
    page.screenshot(path=str(ARTIFACTS / "home-without-gpu.png"))
    production.hub.stop("tom")
    # the next start asks for a GPU again: the choice was this start's
    page.goto(f"{production.url}/hub/spawn")
    page.wait_for_selector("#gpuhub-gpu-slice", timeout=60_000)
    assert page.is_checked("#gpuhub-gpu-slice")


@pytest.mark.parametrize("login", ["nina", "olga"])  # nobody; in the org but not the team
def test_others_are_refused_with_a_clear_page(production, page, login):
    github_login(page, production.url, login)
    page.wait_for_load_state()
    text = page.inner_text("body")
    assert "403" in text
    assert "not on this workshop's participant list" in text
    assert "roster" in text
    r = production.hub.api("GET", f"/users/{login}")
    assert r.status_code == 404  # never became a user


@pytest.mark.parametrize(
    "login, code, log, says",
    [
        (
            "ivy",  # invited to gpu-workshop, not accepted yet
            403,
            "refused",
            "You are invited to gpu-workshop but have not accepted yet: accept at "
            "https://github.com/orgs/gpu-workshop/invitation, then log in again.",
        ),
        (
            "hugo",  # a private member; the organization restricts OAuth apps
            403,
            "refused",
            "GitHub does not tell this hub whether you are a member of gpu-workshop: the "
            "organization gpu-workshop restricts third-party (OAuth) apps and has not approved "
            "this hub's. If you are a member, make your membership of gpu-workshop public at "
            "https://github.com/orgs/gpu-workshop/people",
        ),
        (
            "remy",  # GitHub limits the rate of his token's requests: try again later
            503,
            "not decided, asked to retry in 60 s",
            "GitHub could not be asked whether you are a member of gpu-school:tutors or "
            "gpu-workshop just now. Please log in again in",
        ),
    ],
)
def test_a_participant_github_did_not_vouch_for_is_told_what_happened(
    production, page, login, code, log, says
):
    """Never "not on the participant list" when GitHub did not say so: the page says what
    GitHub answered and what to do (403, or 503 when asking again later may work); the
    organizer's log says it too."""
    text = refused_login(production, page, login)
    assert f"{code} : {'Forbidden' if code == 403 else 'Service Unavailable'}" in text, text
    assert says in text, text
    assert f"Login of {login} {log}" in hub_log(production)


def test_a_login_github_cannot_say_who_it_is_is_asked_to_try_again(production, page):
    """GitHub limits the rate of GET /user at login (the token's hourly requests used up): the
    participant reads when to try again (503), not JupyterHub's "500 : Unhandled error"."""
    text = refused_login(production, page, "uma")
    assert "503 : Service Unavailable" in text and "Unhandled error" not in text, text
    assert (
        "GitHub could not be asked who you are just now. Please log in again in 1 minute." in text
    )
    log = hub_log(production)
    assert "Login not decided, asked to retry in" in log
    assert "GET /user: rate limited: 403 'API rate limit exceeded" in log


def refused_login(production, page, login: str) -> str:
    """The page a participant GitHub did not vouch for reads (its text, blanks as one space),
    with a screenshot; never "not on the participant list", and no user made."""
    github_login(page, production.url, login)
    page.wait_for_load_state()
    text = " ".join(page.inner_text("body").split())
    assert "not on this workshop's participant list" not in text
    assert f"Login of {login}" not in text and "Login not decided" not in text, "the log's words"
    page.screenshot(path=str(ARTIFACTS / f"refused-{login}.png"))
    assert production.hub.api("GET", f"/users/{login}").status_code == 404
    return text


def hub_log(production) -> str:
    """The hub's container's own log: `docker service logs` can hang once the service has had
    several tasks (the hub was restarted by the tests before)."""
    return container_of(f"{production.hub.stack}_hub").logs(tail=300).decode(errors="replace")


def test_a_roster_user_logs_in_and_the_roster_reloads(production, page, browser):
    github_login(page, production.url, "rosa")
    page.wait_for_url("**/hub/spawn**", timeout=60_000)

    # rick is not on the roster yet; the organizer adds him and reloads it
    late = browser.new_context(ignore_https_errors=True).new_page()
    github_login(late, production.url, "rick")
    late.wait_for_load_state()
    assert "not on this workshop's participant list" in late.inner_text("body")
    alice_before = production.hub.server("alice")["started"]
    production.roster.write_text(ROSTER + "@Rick\n")
    out = make("roster", production.config)
    assert "2 GitHub usernames" in out
    github_login(late, production.url, "rick")
    late.wait_for_url("**/hub/spawn**", timeout=60_000)
    # nobody's server was restarted by it
    assert production.hub.server("alice")["started"] == alice_before


def test_an_admin_sees_the_admin_page_and_a_participant_does_not(production, page, browser):
    github_login(page, production.url, "ada")  # only in GPUHUB_ADMIN_USERS
    page.wait_for_selector("#gpuhub-gpu-full", timeout=60_000)
    page.screenshot(path=str(ARTIFACTS / "spawn-page-admin.png"))
    start_from_spawn_page(page, "TensorFlow", full_gpu=True)
    page.wait_for_selector(".jp-LabShell", timeout=180_000)
    # a full GPU: every slice of one GPU, in the TensorFlow environment
    spec = server_spec("ada")
    reserved = spec["Resources"]["Reservations"]["GenericResources"]
    assert [r["DiscreteResourceSpec"]["Value"] for r in reserved] == [3]
    env = container_env(container_of("jy-ada"))
    assert env["GPUHUB_ENVIRONMENT"] == "tensorflow-standin"
    assert env["GPU_SLICES"] == "3"
    page.goto(f"{production.url}/hub/admin")
    page.wait_for_selector("text=alice", timeout=30_000)  # the user list, with alice's server
    page.screenshot(path=str(ARTIFACTS / "github-admin.png"))
    production.hub.stop("ada")

    participant = browser.new_context(ignore_https_errors=True).new_page()
    github_login(participant, production.url, "alice")
    participant.wait_for_url("**/user/alice/**", timeout=60_000)
    response = participant.goto(f"{production.url}/hub/admin")
    assert response.status == 403


def removed_within_a_minute(production, page, login: str, remove, reasons: tuple) -> None:
    """``login`` logs in, starts a server and writes a file in her home; ``remove()`` is the
    organizer taking her off; within 60 s her server is stopped (its home kept), her browser's
    login no longer works, the hub's log says why, and logging in again is refused."""
    github_login(page, production.url, login)
    start_from_spawn_page(page, "PyTorch")
    page.wait_for_selector(".jp-LabShell", timeout=180_000)
    container = container_of(f"jy-{login}")
    wrote = container.exec_run(["sh", "-c", "echo kept > ~/notes.txt"], user="jovyan")
    assert wrote.exit_code == 0, wrote.output
    (home,) = [m["Name"] for m in container.attrs["Mounts"] if m["Destination"] == "/home/jovyan"]
    engine, image = container.client, container.image.id  # the machine that ran it

    remove()
    removed = time.monotonic()
    production.hub.wait_stopped(login, timeout=60)
    took = time.monotonic() - removed
    (ARTIFACTS / f"access-ended-{login}.txt").write_text(f"server stopped {took:.1f} s after\n")
    print(f"{login}: server stopped {took:.1f} s after the removal")

    hub_log = container_of(f"{production.hub.stack}_hub").logs(tail=500).decode(errors="replace")
    # the reason names what let her in, once a check has seen her in (every 30 s)
    said = [f"Access of {login} ended: {reason}; logins ended" in hub_log for reason in reasons]
    assert any(said), hub_log[-3000:]
    # the browser's login is over: the hub asks for a login, her server's address too
    page.goto(f"{production.url}/hub/home")
    assert "/hub/login" in page.url, page.url
    page.goto(f"{production.url}/user/{login}/lab")
    assert "/hub/login" in page.url, page.url
    # the home is kept, with her file, on the machine that ran her server
    read = engine.containers.run(
        image, ["cat", "/home/jovyan/notes.txt"], volumes={home: {"bind": "/home/jovyan"}},
        remove=True, user="root", entrypoint=[],
    )  # fmt: skip
    assert read.decode().strip() == "kept"
    # logging in again: the participant list's refusal
    github_login(page, production.url, login)
    page.wait_for_load_state()
    assert "not on this workshop's participant list" in page.inner_text("body")
    page.screenshot(path=str(ARTIFACTS / f"access-ended-{login}.png"))


def test_a_participant_taken_off_the_roster_is_stopped_within_a_minute(production, page):
    before = production.roster.read_text()

    def remove():
        production.roster.write_text(before.replace("rosa\n", "ruth\n"))  # never empty
        make("roster", production.config)

    try:
        removed_within_a_minute(
            production,
            page,
            "rosa",
            remove,
            (
                "not on the roster any more, nor a member of gpu-school:tutors or gpu-workshop",
                "not a member of gpu-school:tutors or gpu-workshop, nor on the roster",
            ),
        )
    finally:
        production.roster.write_text(before)
        make("roster", production.config)
        production.hub.stop("rosa")


def test_a_participant_taken_off_the_team_is_stopped_within_a_minute(production, page):
    team = production.github.teams["gpu-school:tutors"]
    try:
        removed_within_a_minute(
            production,
            page,
            "tom",
            lambda: team.discard("tom"),
            (
                "no longer a member of gpu-school:tutors, nor of gpu-workshop, nor on the roster",
                "not a member of gpu-school:tutors or gpu-workshop, nor on the roster",
            ),
        )
    finally:
        team.add("tom")
        production.hub.stop("tom")


def test_the_hub_database_and_cookie_secret_survive_down_and_up(production, page):
    github_login(page, production.url, "alice")
    page.wait_for_url("**/user/alice/**", timeout=60_000)
    production.hub.stop("alice")
    make("down", production.config)
    make("up", production.config)
    users = production.hub.api("GET", "/users").json()
    assert {"alice", "tom", "rosa", "rick", "ada"} <= {u["name"] for u in users}
    assert next(u for u in users if u["name"] == "ada")["admin"]
    # the browser's login cookie is still good: same cookie secret
    page.goto(f"{production.url}/hub/home")
    assert page.url.startswith(f"{production.url}/hub/home")
    assert "alice" in page.inner_text("body")


def gateway_config(**env) -> dict:
    """The configuration the gateway would run with this environment (start-gateway --check)."""
    out = docker.from_env().containers.run(
        "gpu-jupyterhub/hub:latest",
        ["start-gateway", "--check"],
        environment={"GPUHUB_HTTP_PORT": "80", "GPUHUB_HTTPS_PORT": "443", **env},
        remove=True,
        stderr=False,
    )
    return json.loads(out)


def test_the_acme_gateway_asks_for_a_certificate_for_the_hostname():
    # issuance needs the internet, which tests never reach: the configuration is checked
    config = gateway_config(
        GPUHUB_TLS="acme", GPUHUB_HOSTNAME="hub.example.org", GPUHUB_ACME_EMAIL="org@example.org"
    )
    (policy,) = config["apps"]["tls"]["automation"]["policies"]
    assert policy["subjects"] == ["hub.example.org"]
    assert {"module": "acme", "email": "org@example.org"} in policy["issuers"]
    servers = config["apps"]["http"]["servers"].values()
    assert {tuple(s["listen"]) for s in servers} == {(":443",), (":80",)}
    assert "proxy:8000" in json.dumps(config)


def test_the_gateway_refuses_to_start_without_a_mode():
    with pytest.raises(docker.errors.ContainerError, match="expected acme, self-signed or files"):
        gateway_config(GPUHUB_TLS="", GPUHUB_HOSTNAME="hub.example.org")
