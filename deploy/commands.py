"""The Makefile's verbs as checklists of deploy steps (`make demo`, `make up`, `make down`, ...),
and what they print at the end.

Every verb gets the checked settings (``deploy.settings.Config``) and the log from the CLI
(deploy/__main__.py) and passes them on explicitly; the banners are pure functions of them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from docker.errors import APIError, DockerException

from worker_setup import engine

from . import registry, settings, stack, steps
from .console import DeployError, Log
from .settings import Config

PURGE = "make down PURGE=1"
STOPPED_DEMO = "make demo stopped before the hub answered; remove what it deployed with: make down"
STOPPED_UP = (
    "make up stopped before the hub answered; fix the cause and run it again, or remove what "
    "it deployed with: make down"
)


def as_deploy_error(error: DockerException) -> DeployError:
    """An unexpected refusal of the Docker engine, as one line."""
    detail = error.explanation if isinstance(error, APIError) else str(error)
    return DeployError(f"the Docker engine refused: {detail}")


@contextlib.contextmanager
def deploy_started(hint: str) -> Iterator[None]:
    """Failures from here on say how to remove what was deployed (``hint``)."""
    try:
        yield
    except DockerException as e:
        error = as_deploy_error(e)
        error.hint = hint
        raise error from None
    except (DeployError, engine.EngineError) as e:
        e.hint = hint
        raise


def read_secret(config: Config, name: str) -> str:
    return Path(config.state_dir, name).read_text().strip()


# ---- what the verbs print at the end -----------------------------------------------------------


def limit(config: Config, kind: str) -> str:
    """A limit per server as the organizer writes it (16G, not bytes); for none, what holds."""
    written = config.values[f"GPUHUB_{kind}_LIMIT"]
    if written:
        return written
    return "shared equally (no quota)" if kind == "CPU" else "none"


def demo_banner(deployed: Config, demo_password: str, admin_password: str) -> str:
    slices = "SIMULATED (no NVIDIA GPU on this machine)" if deployed.simulated_gpus else "real GPUs"
    return f"""
  GPU JupyterHub is running: {deployed.public_url}/
    log in with any username and the demo password: {demo_password}
    admin user: {", ".join(deployed.admin_users)}, with the admin password: {admin_password}
    limits per server: cores {limit(deployed, "CPU")}, memory {limit(deployed, "MEM")}, tasks {limit(deployed, "PIDS")}
    GPU slices: {slices}, {deployed.slices_per_gpu} per GPU
  Stop and remove it with: make down
"""  # noqa: E501 (the banner's lines as printed)


def login_line(config: Config) -> str:
    if config.auth != "github":
        state = config.state_dir
        return (
            f"local login: any username with the password in {state}/demo_password, admins "
            f"with {state}/admin_password"
        )
    who = []
    if config.allowed_orgs:
        who.append(f"members of {' '.join(config.allowed_orgs)}")
    if config.roster:
        who.append(f"the roster {config.roster}")
    return f"GitHub login: {', and '.join(who)}"


def up_banner(config: Config, deployed: Config, published: registry.Publication) -> str:
    https = config.tls
    if config.tls == "self-signed":
        https += f" (certificate: {config.state_dir}/tls/cert.pem)"
    environments = " ".join(f"{n}={i}" for n, i in config.environments.items())
    return f"""
  GPU JupyterHub is up: {deployed.public_url}/
    {login_line(config)}
    admins: {", ".join(config.admin_users)}
    HTTPS: {https}
    GPU machines pull the servers' images from {published.registry}/
    environments: {environments or "the single-user image only"}; full GPU: {config.full_gpu}
  See the GPU machines and servers with: sudo make status
"""


# ---- the verbs ------------------------------------------------------------------------------


def deploy_and_wait(
    client, config: Config, log: Log, environ: Mapping[str, str], published=None
) -> Config:
    deployed = stack.deploy_stack(client, config, log, published, environ)
    if published is not None:
        registry.publish_images(client, config, published, log, environ)
    stack.wait_hub(client, deployed, log, environ)
    return deployed


def _say_the_environment(config: Config, log: Log) -> None:
    line = settings.from_the_environment(config)
    if line:
        log(line)


def demo(config: Config, log: Log, environ: Mapping[str, str] = os.environ) -> None:
    """`make demo`: a single-machine hub with local login and (simulated) GPU slices."""
    _say_the_environment(config, log)
    steps.ensure_engine(log)
    steps.ensure_gpu_slices(config, log, environ=environ)
    client = steps.connect()  # after a restart of the engine
    steps.ensure_swarm(client, log, environ)
    steps.ensure_ports_free(client, config, ["GPUHUB_HTTP_PORT"], log)
    steps.ensure_images(client, config, log)
    steps.ensure_host_firewall(config, log, environ)
    steps.ensure_disk_watch(config, log, environ)
    steps.ensure_secrets(config, log)
    with deploy_started(STOPPED_DEMO):
        deployed = deploy_and_wait(client, config, log, environ)
    print(
        demo_banner(
            deployed, read_secret(config, "demo_password"), read_secret(config, "admin_password")
        )
    )


def up(config: Config, log: Log, environ: Mapping[str, str] = os.environ) -> None:
    """`make up`: the production hub from the organizer's config file, with an image registry
    the GPU machines pull from; prints the line that adds one."""
    log(f"settings checked: {config.config_file}")
    _say_the_environment(config, log)
    steps.ensure_engine(log)
    steps.ensure_gpu_slices(config, log, optional=True, environ=environ)
    client = steps.connect()
    addr = steps.ensure_swarm(client, log, environ)
    ports = ["GPUHUB_HTTP_PORT", "GPUHUB_REGISTRY_PORT"]
    if stack.tls_on(config):
        ports.append("GPUHUB_HTTPS_PORT")
    steps.ensure_ports_free(client, config, ports, log)
    steps.ensure_images(client, config, log)
    steps.ensure_environment_images(client, config, log)
    steps.ensure_host_firewall(config, log, environ)
    steps.ensure_disk_watch(config, log, environ)
    steps.ensure_secrets(config, log)
    # GPU machines pull the servers' images from the registry this stack runs on the manager
    published = registry.publication(config, f"{addr}:{config.registry_port}")
    registry.ensure_registry_names(client, published, log)
    with deploy_started(STOPPED_UP):
        deployed = deploy_and_wait(client, config, log, environ, published)
    print(up_banner(config, deployed, published))
    steps.print_join_command(client, config, log)


def deploy(config: Config, log: Log, environ: Mapping[str, str] = os.environ) -> None:
    """`python -m deploy stack`: the secrets, the port free, the stack deployed and the hub
    answering, on an engine and swarm that are there (the tests' and the bench's stacks)."""
    client = steps.connect()
    steps.ensure_host_firewall(config, log, environ)
    steps.ensure_disk_watch(config, log, environ)
    steps.ensure_secrets(config, log)
    steps.ensure_ports_free(client, config, ["GPUHUB_HTTP_PORT"], log)
    deploy_and_wait(client, config, log, environ)


def down(config: Config, log: Log, purge: bool = False) -> None:
    """`make down`: the participants' servers and the stack go; the hub database and homes
    (volumes) stay unless ``purge``, which takes them and the generated secrets too."""
    if not engine.running():
        log("the Docker engine is not running: nothing deployed to remove")
        return
    client = steps.connect()
    if client.info()["Swarm"].get("LocalNodeState") != "active":
        log("no swarm on this machine: nothing deployed to remove")
        return
    stack.remove_stack(client, config, log)
    steps.remove_host_firewall(log)
    steps.remove_disk_watch(log)
    if purge:
        stack.purge_stack_data(client, config, log)
    else:
        log("kept the hub database and user homes (volumes); remove them too with: " + PURGE)
    log(f"stack {config.stack} removed. The swarm, the Docker engine and the images stay.")


def roster(config: Config, log: Log) -> None:
    """`make roster`: the roster checked and handed to the running hub (read at each login)."""
    if not config.roster:
        where = config.config_file or "the settings"
        raise DeployError(f"GPUHUB_ROSTER is empty in {where}; name the roster file there")
    steps.ensure_roster(config, log)
    log(
        "the hub uses it from the next login on; whoever is no longer on it (nor in "
        f"GPUHUB_ALLOWED_ORGS) is logged out and their server stopped within "
        f"{config.access_check_interval} s"
        if config.access_check_interval
        else "the hub uses it from the next login on"
    )


def images(config: Config, log: Log) -> None:
    """`make images`: the base, single-user and hub images."""
    steps.ensure_engine(log)
    steps.ensure_images(steps.connect(), config, log)
