"""What a fault left behind, as a participant and an organizer would find it: the fault suite's
instruments (tests/bench/faults.py prints their figures, tests/integration/test_faults.py asserts
the goals with them).

- a participant's server *answers* when ``GET /user/NAME/api/status`` through the proxy, with a
  token of that participant, is answered by the server itself (not a redirect to the hub);
- a *marker file* is written into each home through the server's contents API and read back
  the same way after the fault;
- an *orphan* is a participant's service that holds GPU slices in Swarm while the hub lists no
  server (running or pending) for its participant;
- a *refusal for their own slices*: a participant the hub lists as stopped presses Start and is
  refused while a service of their own still holds slices;
- *copies*: running containers of one participant's server, counted on every bed machine's own
  engine (a machine cut off from the manager still answers on its socket here), and the slices
  they hold per GPU against the GPU's slices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import docker
import requests

from gpu_swarm_spawner.contract import GPU_LABEL, SLICES_LABEL, STACK_LABEL, USER_LABEL
from gpu_swarm_spawner.tasks import is_live

from .hub import BED_RUN, Hub

MARKER = "fault-marker.txt"
#: one probe's limit: a server that does not answer within it counts as not answering
PROBE_S = 5


@dataclass
class Participant:
    """One participant of a fault scenario, with a token of their own."""

    name: str
    token: str = ""
    marker: str = ""  # the text written into their home; "" until written
    node: str = ""  # the machine their server ran on before the fault
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def __post_init__(self):
        if self.token:
            self.session.headers["Authorization"] = f"token {self.token}"


def log_in(hub: Hub, name: str, password: str) -> tuple[requests.Session, str]:
    """A browser's session after the login form (GPUHUB_AUTH=local), and its XSRF token. The
    redirect after the login (which would start the server) is not followed."""
    session = requests.Session()
    session.get(f"{hub.url}/hub/login", timeout=30, verify=hub.verify)
    xsrf = next((c.value for c in session.cookies if c.name == "_xsrf"), "")
    r = session.post(
        f"{hub.url}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=30,
        verify=hub.verify,
    )
    if r.status_code != 302:
        raise RuntimeError(f"login of {name} failed: {r.status_code} {r.text[:300]}")
    # the XSRF token is bound to the session: the one from before the login no longer holds
    for cookie in [c for c in session.cookies if c.name == "_xsrf"]:
        session.cookies.clear(cookie.domain, cookie.path, cookie.name)
    session.get(f"{hub.url}/hub/token", timeout=30, verify=hub.verify)
    xsrf = next((c.value for c in session.cookies if c.name == "_xsrf"), "")
    return session, xsrf


def token_of(hub: Hub, name: str, password: str | None = None) -> str:
    """An API token of participant ``name`` (created as they would on the hub's token page),
    valid for a day."""
    session, xsrf = log_in(hub, name, password or hub.password)
    r = session.post(
        f"{hub.url}/hub/api/users/{name}/tokens",
        json={"note": "fault suite", "expires_in": 86400},
        headers={"X-XSRFToken": xsrf, "Referer": f"{hub.url}/hub/token"},
        timeout=30,
        verify=hub.verify,
    )
    if r.status_code != 201:
        raise RuntimeError(f"no token for {name}: {r.status_code} {r.text[:300]}")
    return r.json()["token"]


def hub_answers(hub: Hub) -> bool:
    """The hub's API answers through the proxy."""
    try:
        r = requests.get(f"{hub.url}/hub/api/", timeout=PROBE_S, verify=hub.verify)
    except requests.RequestException:
        return False
    return r.status_code == 200 and "version" in r.text


def server_answers(hub: Hub, p: Participant) -> bool:
    """Participant ``p``'s server answers through the proxy: its own status, not the hub's
    redirect (a route missing from the proxy sends /user/NAME/ to the hub)."""
    try:
        r = p.session.get(
            f"{hub.url}/user/{p.name}/api/status",
            timeout=PROBE_S,
            allow_redirects=False,
            verify=hub.verify,
        )
        return r.status_code == 200 and "started" in r.json()
    except (requests.RequestException, ValueError):
        return False


def _contents(hub: Hub, p: Participant) -> str:
    return f"{hub.url}/user/{p.name}/api/contents/{MARKER}"


def write_marker(hub: Hub, p: Participant) -> None:
    """The marker file, written into ``p``'s home through their server."""
    text = f"{p.name} was here at {time.time():.3f}\n"
    r = p.session.put(
        _contents(hub, p),
        json={"type": "file", "format": "text", "content": text},
        timeout=30,
        allow_redirects=False,
        verify=hub.verify,
    )
    if r.status_code not in (200, 201):
        raise RuntimeError(f"marker not written for {p.name}: {r.status_code} {r.text[:300]}")
    p.marker = text


def marker_kept(hub: Hub, p: Participant) -> bool | None:
    """True: the marker is there with its text; False: the server answers and it is not (lost);
    None: the server did not answer (not read)."""
    try:
        r = p.session.get(_contents(hub, p), timeout=30, allow_redirects=False, verify=hub.verify)
    except requests.RequestException:
        return None
    if r.status_code == 404:
        return False
    if r.status_code != 200:
        return None
    return r.json().get("content") == p.marker


def listed(hub: Hub) -> dict[str, dict]:
    """The hub's view: {participant: their default server (ready or pending)}."""
    r = hub.api("GET", "/users", params={"state": "active", "limit": 200})
    r.raise_for_status()
    users = r.json()
    users = users["items"] if isinstance(users, dict) else users  # a paginated answer
    return {u["name"]: u["servers"][""] for u in users if "" in (u.get("servers") or {})}


def slice_holders(stack: str, client: docker.DockerClient | None = None) -> dict[str, list[str]]:
    """{participant: names of their services with a live task holding GPU slices} in Swarm."""
    client = client or docker.from_env()
    services = {
        s["ID"]: s for s in client.api.services(filters={"label": f"{STACK_LABEL}={stack}"})
    }
    holders: dict[str, list[str]] = {}
    for task in client.api.tasks():
        service = services.get(task.get("ServiceID"))
        if service is None or not is_live(task):
            continue
        reservations = (task["Spec"].get("Resources") or {}).get("Reservations") or {}
        if not reservations.get("GenericResources"):
            continue
        user = service["Spec"].get("Labels", {}).get(USER_LABEL, "?")
        names = holders.setdefault(user, [])
        if service["Spec"]["Name"] not in names:
            names.append(service["Spec"]["Name"])
    return holders


def orphans(hub: Hub, stack: str) -> list[str]:
    """Services holding GPU slices whose participant the hub lists no server for."""
    holders = slice_holders(stack)
    servers = listed(hub)
    return sorted(name for user, names in holders.items() if user not in servers for name in names)


def bed_engines() -> dict[str, docker.DockerClient]:
    """Every bed machine's own engine (tests/bed/bed.sh: /run/gpu-jupyterhub-bed/NAME.sock)."""
    return {
        sock.stem: docker.DockerClient(base_url=f"unix://{sock}", timeout=10)
        for sock in sorted(BED_RUN.glob("*.sock"))
    }


@dataclass(frozen=True)
class Copy:
    """A participant's server container running on a machine, and the slices it holds."""

    machine: str
    user: str
    gpu: str
    slices: int
    #: waiting for an earlier copy of the same server to end (images/singleuser/one_copy.py):
    #: running no server and touching no GPU yet
    waiting: bool = False


#: a process of a container whose server waits for an earlier copy to end
WAITING_PROCESS = "one_copy"


def running_copies(engines: dict[str, docker.DockerClient]) -> list[Copy]:
    """The participants' server containers running now, on every machine that answers (one
    hub stack on the bed at a time: its containers are the only ones with these labels)."""
    copies = []
    for machine, engine in engines.items():
        try:
            containers = engine.api.containers(filters={"label": USER_LABEL})
        except (docker.errors.DockerException, requests.RequestException):
            continue  # that engine is down: nothing of it runs
        for c in containers:
            labels = c.get("Labels") or {}
            copies.append(
                Copy(machine, labels[USER_LABEL], labels.get(GPU_LABEL, ""),
                     int(labels.get(SLICES_LABEL) or 0), waits(engine, c["Id"]))
            )  # fmt: skip
    return copies


def waits(engine: docker.DockerClient, container: str) -> bool:
    """Does ``container`` wait for an earlier copy of its server to end?"""
    try:
        processes = engine.api.top(container).get("Processes") or []
    except (docker.errors.DockerException, requests.RequestException):
        return False  # ended meanwhile, or its engine went
    return any(WAITING_PROCESS in " ".join(p) for p in processes)


def twice(copies: list[Copy]) -> dict[str, int]:
    """{participant: copies running their server} for those running it more than once (a copy
    that waits for the earlier one to end runs nothing yet)."""
    counts: dict[str, int] = {}
    for c in copies:
        if not c.waiting:
            counts[c.user] = counts.get(c.user, 0) + 1
    return {user: n for user, n in counts.items() if n > 1}


def over_capacity(copies: list[Copy], capacity: dict[str, int]) -> dict[str, int]:
    """{GPU: slices held by running containers beyond the GPU's slices}: a slice handed out
    twice."""
    held: dict[str, int] = {}
    for c in copies:
        if not c.waiting:
            held[c.gpu] = held.get(c.gpu, 0) + c.slices
    return {
        gpu: n - capacity[gpu] for gpu, n in held.items() if gpu in capacity and n > capacity[gpu]
    }
