"""The hub's Swarm stack: its files, the values the deploy fills in for them, `docker stack
deploy`, waiting until its services run their current spec and the hub answers, and removing it.

`docker stack deploy` is the one Docker command run as a program (compose files: the SDK has
no equivalent); only its exit status is used, and its output is shown when it fails. Everything
else goes through the Docker SDK. ``public_url``, ``stack_files``, ``convergence`` and
``stack_environment`` are pure.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path

from docker.errors import APIError, NotFound

from gpu_swarm_spawner import contract
from gpu_swarm_spawner.inventory import gpu_kinds
from tutorial_sync.repos import format_repos
from worker_setup import engine

from . import steps, tls
from .console import DeployError, Log, run, waits
from .registry import Publication
from .settings import REPO, Config
from .values import url_host

DEPLOY_DIR = REPO / "deploy"
#: Docker secrets named with a hash of their contents (deploy/tls.py): old versions go.
VERSIONED_SECRETS = ("tls_cert", "tls_key", "github_client_secret", "tutorial_token")


def tutorial_token_on(config: Config) -> bool:
    """The sync service runs and has a token file for private repositories."""
    return bool(config.tutorial_repos and config.tutorial_token_file)


def tls_on(config: Config) -> bool:
    return config.tls != "off"


def public_host(config: Config) -> str:
    return config.hostname or "127.0.0.1"


def public_port(config: Config) -> int:
    return config.https_port if tls_on(config) else config.http_port


def public_url(config: Config) -> str:
    """The address participants open (the scheme's default port left out)."""
    scheme = "https" if tls_on(config) else "http"
    port = public_port(config)
    default = {"https": 443, "http": 80}[scheme]
    suffix = "" if port == default else f":{port}"
    return f"{scheme}://{url_host(public_host(config))}{suffix}"


def stack_files(config: Config, registry: bool = False) -> list[Path]:
    """stack.yml and its overlays: the HTTPS gateway or the proxy's plain port, GitHub login,
    `make up`'s image registry, the network's range and the homes on shared storage."""
    files = ["stack.yml", "stack.tls.yml" if tls_on(config) else "stack.http.yml"]
    if config.auth == "github":
        files.append("stack.github.yml")
    if registry:
        files.append("stack.registry.yml")
    if config.network_subnet:
        files.append("stack.subnet.yml")
    if config.homes_dir:
        files.append("stack.homes.yml")
    if tutorial_token_on(config):
        files.append("stack.tutorial-token.yml")
    return [DEPLOY_DIR / name for name in files]


def stack_environment(deployed: Config, environ: Mapping[str, str]) -> dict[str, str]:
    """`docker stack deploy`'s environment: this process's, less any GPUHUB_* of it, plus the
    checked settings with what the deploy filled in (what the stack files interpolate)."""
    env = {k: v for k, v in environ.items() if not k.startswith("GPUHUB_")}
    env.update(deployed.values)
    return env


def simulated_gpus(client) -> bool:
    """Any machine of the swarm advertises simulated GPUs (the hub then says so on every page)."""
    nodes = client.api.nodes()
    return any(contract.is_simulated(kind) for node in nodes for kind in gpu_kinds(node))


def image_id(client, image: str) -> str:
    found = steps.image_id(client, image)
    if not found:
        raise DeployError(f"image {image} is not here; build it with: make images")
    return found


def stack_values(
    client,
    config: Config,
    log: Log,
    published: Publication | None = None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """What the deploy fills in for the stack files (deploy/settings.env's last section): image
    ids (a rebuilt image under the same tag rolls the services forward, an unchanged one leaves
    them alone), simulated GPUs, the public URL, the engine's socket, the versions of the
    changing secrets and the roster (making those files), and with ``published`` the images'
    names in the registry."""
    values = {
        "GPUHUB_HUB_IMAGE_ID": image_id(client, config.hub_image),
        "GPUHUB_SINGLEUSER_IMAGE_ID": image_id(client, config.singleuser_image),
        "GPUHUB_SIMULATED_GPUS": "1" if simulated_gpus(client) else "0",
        "GPUHUB_TUTORIAL_SYNC_REPLICAS": "1" if config.tutorial_repos else "0",
        # the repositories as the check read them, in the form the sync service reads back
        "GPUHUB_TUTORIAL_REPOS": format_repos(config.tutorial_repos),
        "GPUHUB_PUBLIC_URL": public_url(config),
        "GPUHUB_DOCKER_SOCKET": engine.docker_socket(environ),
    }
    if tls_on(config):
        values.update(tls.ensure_tls(config, log))
    if config.auth == "github":
        values.update(tls.ensure_github_secret(config, log))
        values["GPUHUB_ROSTER_FILE"] = steps.ensure_roster(config, log)
    if tutorial_token_on(config):
        values.update(tls.ensure_tutorial_token(config, log))
    if published is not None:
        values.update(published.stack_values())
    return values


def ensure_shared_dirs(config: Config, log: Log) -> None:
    """Bind-mount sources exist (on shared storage they then exist on every machine), and
    those the GPU machines must share are marked as this hub's (``steps.ensure_share_marks``)."""
    for directory in (config.tutorials_dir, config.datasets_dir, config.homes_dir):
        if directory:
            Path(directory).mkdir(mode=0o755, parents=True, exist_ok=True)
    steps.ensure_share_marks(config, log)


def service_specs(client, stack: str) -> dict[str, dict]:
    return {s["Spec"]["Name"]: s["Spec"] for s in steps.stack_services(client, stack)}


def changes(before: dict[str, dict], after: dict[str, dict]) -> str:
    """``new: a; updated: b; unchanged: c; removed: d`` of the stack's services."""
    groups = {
        "new": [n for n in after if n not in before],
        "updated": [n for n in after if n in before and after[n] != before[n]],
        "unchanged": [n for n in after if n in before and after[n] == before[n]],
        "removed": [n for n in before if n not in after],
    }
    return "; ".join(f"{k}: {' '.join(sorted(v))}" for k, v in groups.items() if v)


def deploy_stack(
    client,
    config: Config,
    log: Log,
    published: Publication | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Config:
    """The stack deployed with the checked settings (`docker stack deploy --prune`: services
    no file names any more go); returns the settings as deployed, with what was filled in."""
    deployed = config.with_values(stack_values(client, config, log, published, environ), "deploy")
    ensure_shared_dirs(config, log)
    command = ["docker", "stack", "deploy", "--prune", "--resolve-image", "never"]
    for path in stack_files(config, registry=published is not None):
        command += ["-c", str(path)]
    before = service_specs(client, config.stack)
    log(f"deploying stack {config.stack}")
    run(
        command + [config.stack],
        "docker stack deploy failed",
        "remove what exists with: make down",
        lines=None,
        env=stack_environment(deployed, environ),
    )
    log.detail(changes(before, service_specs(client, config.stack)))
    remove_unused_secrets(client, config.stack)
    return deployed


def remove_unused_secrets(client, stack: str) -> None:
    """Versions of the hashed secrets that no service uses any more (best effort: a secret of
    a task still stopping is removed by the next deploy)."""
    prefixes = tuple(f"{stack}_{name}_" for name in VERSIONED_SECRETS)
    for secret in client.api.secrets(filters={"name": f"{stack}_"}):
        if secret["Spec"]["Name"].startswith(prefixes):
            _remove(client.api.remove_secret, secret["ID"])  # refused while in use


# ---- convergence ----------------------------------------------------------------------------


def same_spec(task: dict, template: dict) -> bool:
    """The task was made from the service's current TaskTemplate. (The engine writes a default
    ``Runtime`` into the service's spec only, and may leave out empty parts.)"""

    def comparable(spec: dict) -> dict:
        return {k: v for k, v in spec.items() if v not in (None, {}, []) and k != "Runtime"}

    return comparable(task.get("Spec") or {}) == comparable(template)


def _runs(task: dict) -> bool:
    return task.get("Status", {}).get("State") == "running"


def describe_task(task: dict, template: dict) -> str:
    """``running``, ``starting``, ``running, stopping (old spec)``, ``pending: no suitable node
    ...``."""
    status = task.get("Status", {})
    text = status.get("State", "?")
    if task.get("DesiredState") != "running" and _runs(task):
        text += ", stopping"
    if not same_spec(task, template):
        text += " (old spec)"
    if status.get("Err"):
        text += f": {status['Err']}"
    return text


def convergence(service: dict, tasks: list[dict]) -> tuple[bool, str]:
    """Whether ``service`` runs exactly its current spec, and what its tasks are doing.

    Converged: a task of the current spec (the service's TaskTemplate) that is meant to run
    runs, no task of it meant to run is still on its way, no other task still runs (an old
    one may answer for a few seconds after a deploy changed the service) and no update is in
    progress."""
    template = service["Spec"]["TaskTemplate"]
    current = [t for t in tasks if same_spec(t, template) and t.get("DesiredState") == "running"]
    ready = [t for t in current if _runs(t)]
    waiting = [t for t in current if not _runs(t)]
    stale = [t for t in tasks if _runs(t) and t not in ready]
    update = service.get("UpdateStatus") or {}
    # (a paused update shows in its tasks; one left paused by an earlier deploy is no reason)
    updating = update.get("State") in ("updating", "rollback_started")
    converged = bool(ready) and not waiting and not stale and not updating
    live = [t for t in tasks if t.get("DesiredState") == "running" or _runs(t)]
    if not live and tasks:  # only finished ones: the latest says why
        live = [max(tasks, key=lambda t: t.get("UpdatedAt", ""))]
    seen = [describe_task(t, template) for t in live] or ["no task"]
    if update.get("State", "completed") not in ("completed", "rollback_completed"):
        seen.append(f"update {update['State']}: {update.get('Message', '')}".rstrip(": "))
    return converged, "; ".join(seen)


def wait_converged(client, name: str, timeout: float = 120) -> None:
    """Until service ``name`` runs exactly its current spec (see ``convergence``)."""
    seen = "not found"
    for _ in waits(timeout):
        try:
            service = client.api.inspect_service(name)
        except NotFound:
            continue
        done, seen = convergence(service, client.api.tasks(filters={"service": name}))
        if done:
            return
    raise DeployError(
        f"service {name} did not converge within {timeout:g} s (last seen: {seen}); "
        f"see: docker service ps {name}"
    )


# ---- the hub answering ----------------------------------------------------------------------


def hub_answers(config: Config, environ: Mapping[str, str] = os.environ) -> bool:
    """GET /hub/api/ answers below 400 (``hub_get``)."""
    try:
        return hub_get(config, "/hub/api/", environ=environ)[0] < 400
    except (OSError, http.client.HTTPException):
        return False


class EngineConnection(http.client.HTTPConnection):
    """An HTTP(S) connection to ``host``:``port`` (its Host header and, with ``tls``, its TLS
    server name) made to ``engine_addr`` at that port: what http.client's own ``connect`` does
    (no proxy tunnel), to another address."""

    def __init__(self, host: str, port: int, engine_addr: str, tls: ssl.SSLContext | None):
        super().__init__(host, port, timeout=5)
        self.engine_addr, self.tls = engine_addr, tls
        if tls is not None:  # the Host header leaves out HTTPS's port, as HTTPSConnection does
            self.default_port = http.client.HTTPS_PORT

    def connect(self) -> None:
        sock = socket.create_connection(
            (self.engine_addr, self.port), self.timeout, self.source_address
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = (
            sock if self.tls is None else self.tls.wrap_socket(sock, server_hostname=self.host)
        )


def hub_get(
    config: Config, path: str, token: str = "", environ: Mapping[str, str] = os.environ
) -> tuple[int, bytes]:
    """GET ``path`` of the hub (status, body), asked by the hub's public name (which may not
    resolve here) at GPUHUB_ENGINE_ADDR (where this machine reaches the ports the engine
    publishes: 127.0.0.1, or the test bed's manager), the certificate unchecked (a self-signed
    one, or one ACME is still fetching). Raises OSError or HTTPException when it does not
    answer."""
    context = None
    if tls_on(config):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    # the name goes into the Host header and TLS's SNI; the connection goes to the engine
    connection = EngineConnection(
        public_host(config), public_port(config), engine.published_addr(environ), context
    )
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def service_report(client, names: list[str], lines: int = 30) -> str:
    """Each service's tasks and the last lines of its log: what a deploy that stopped shows."""
    parts = []
    for name in names:
        try:
            service = client.api.inspect_service(name)
            tasks = client.api.tasks(filters={"service": name})
            logs = client.api.service_logs(name, stdout=True, stderr=True, tail=lines)
            text = logs if isinstance(logs, bytes) else b"".join(logs)
        except APIError as e:
            parts.append(f"--- {name}: {e.explanation}")
            continue
        template = service["Spec"]["TaskTemplate"]
        states = "; ".join(describe_task(t, template) for t in tasks) or "no task"
        parts.append(f"--- {name}: {states}")
        parts.append(text.decode(errors="replace").rstrip("\n"))
    return "\n".join(parts)


def wait_hub(
    client,
    config: Config,
    log: Log,
    environ: Mapping[str, str] = os.environ,
    timeout: float = 120,
) -> None:
    """The stack's proxy, hub and gateway run their current spec, and the hub answers."""
    services = ["proxy", "hub"] + (["gateway"] if tls_on(config) else [])
    names = [f"{config.stack}_{s}" for s in services]
    for name in names:
        wait_converged(client, name, timeout)
    url = public_url(config)
    next_note = 10
    for waited in waits(timeout, most=1.0):
        if hub_answers(config, environ):
            log(f"hub answers at {url}")
            return
        if waited >= next_note:
            log(f"waiting for the hub ({int(waited)} s)...")
            next_note += 10
    acme = "; with acme, the gateway log says whether the certificate was issued"
    raise DeployError(
        f"the hub did not answer at {url}/hub/api/ within {timeout:g} s (state and logs "
        f"above{acme if config.tls == 'acme' else ''}); remove the stack with: make down",
        output=service_report(client, names),
    )


# ---- removing it ----------------------------------------------------------------------------


def user_services(client, stack: str) -> list[dict]:
    return client.api.services(filters={"label": f"{contract.STACK_LABEL}={stack}"})


def _remove(remove, ident: str) -> bool:
    """Remove one object; False when Docker refuses (still in use)."""
    try:
        remove(ident)
    except NotFound:
        pass
    except APIError:
        return False
    return True


def remove_stack(client, config: Config, log: Log, timeout: float = 60) -> None:
    """The participants' servers this stack created, then the stack: its services, secrets and
    network (the network last, once its tasks are gone)."""
    servers = user_services(client, config.stack)
    if servers:
        log(f"removing user servers: {' '.join(s['Spec']['Name'] for s in servers)}")
        for service in servers:
            _remove(client.api.remove_service, service["ID"])
    services = steps.stack_services(client, config.stack)
    if services:
        log(f"removing stack {config.stack}")
        for service in services:
            _remove(client.api.remove_service, service["ID"])
    else:
        log(f"stack {config.stack}: not deployed")
    left: list[str] = []
    for attempt, _ in enumerate(waits(timeout, most=1.0)):
        secrets, networks = stack_leftovers(client, config)
        left = [f"secret {s['Spec']['Name']}" for s in secrets]
        left += [f"network {n['Name']}" for n in networks]
        if not left:
            return
        if attempt == 1:
            log(f"waiting for the stack's tasks to stop ({', '.join(left)} still there)")
        # a network is gone once the stack's tasks have left it; Docker may accept its
        # removal before that, so it is removed (again) until it is no longer listed
        for secret in secrets:
            _remove(client.api.remove_secret, secret["ID"])
        for network in networks:
            _remove(client.api.remove_network, network["Id"])
    raise DeployError(
        f"{', '.join(left)} still there after {timeout:g} s; see: docker network inspect "
        f"{config.network}, then run this again"
    )


def stack_leftovers(client, config: Config) -> tuple[list[dict], list[dict]]:
    """The secrets and networks of a stack whose services are gone."""
    secrets = client.api.secrets(filters={"label": f"{contract.DOCKER_STACK_LABEL}={config.stack}"})
    networks = []
    for network in client.api.networks():
        labels = network.get("Labels") or {}
        if (
            network["Name"] == config.network
            or labels.get(contract.DOCKER_STACK_LABEL) == config.stack
        ):
            networks.append(network)
    return secrets, networks


def stack_volumes(client, stack: str) -> list[str]:
    names = set()
    for label in (f"{contract.STACK_LABEL}={stack}", f"{contract.DOCKER_STACK_LABEL}={stack}"):
        for volume in client.api.volumes(filters={"label": label}).get("Volumes") or []:
            names.add(volume["Name"])
    return sorted(names)


def purge_stack_data(client, config: Config, log: Log, timeout: float = 30) -> None:
    """The volumes (hub database, homes on this machine, tutorial cache, ...) and generated
    secrets of a removed stack."""
    volumes = stack_volumes(client, config.stack)
    left = volumes
    # a stack's containers take a few seconds to go; their volumes are busy until then
    for _ in waits(timeout, most=1.0):
        left = [v for v in left if not _remove(client.api.remove_volume, v)]
        if not left:
            break
    else:
        raise DeployError(
            f"volumes still in use after {timeout:g} s: {' '.join(left)}; remove them once "
            f"their containers are gone: docker volume rm {' '.join(left)}"
        )
    if volumes:
        log(f"removed volumes: {' '.join(volumes)}")
    shutil.rmtree(config.state_dir, ignore_errors=True)
    log(f"removed generated secrets in {config.state_dir}")
