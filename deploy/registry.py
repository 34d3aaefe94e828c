"""`make up`'s image registry: the servers' images under the names the GPU machines pull them by,
and pushing them there.

``publication`` is pure: the settings and the registry's address in, the images to publish and
their names in the registry out. The deploy passes it on; nothing is rewritten in between.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from docker.errors import APIError, ImageNotFound, NotFound
from docker.utils import parse_repository_tag

from gpu_swarm_spawner import contract
from gpu_swarm_spawner.contract import image_in_registry
from worker_setup import engine

from .console import DeployError, Log, waits
from .settings import Config


@dataclass(frozen=True)
class Publication:
    """The servers' images and their names in the registry at ``registry`` (HOST:PORT, the
    manager's address the GPU machines reach)."""

    registry: str
    #: local name -> name in the registry: the single-user image, then the environments'
    images: dict[str, str]
    #: GPUHUB_ENVIRONMENTS with the registry's names (NAME -> IMAGE)
    environments: dict[str, str]

    @property
    def singleuser_image(self) -> str:
        return next(iter(self.images.values()))

    def stack_values(self) -> dict[str, str]:
        """The settings the hub gets instead of the local names: it creates the servers'
        services with these, and the GPU machines pull them from the registry."""
        return {
            "GPUHUB_SINGLEUSER_IMAGE": self.singleuser_image,
            "GPUHUB_ENVIRONMENTS": " ".join(f"{n}={i}" for n, i in self.environments.items()),
        }


def publication(config: Config, registry: str) -> Publication:
    """The single-user image and those of GPUHUB_ENVIRONMENTS, named in ``registry``."""
    images = {config.singleuser_image: image_in_registry(registry, config.singleuser_image)}
    environments = {}
    for name, image in config.environments.items():
        images[image] = environments[name] = image_in_registry(registry, image)
    return Publication(registry, images, environments)


def tag(client, image: str, name: str) -> None:
    """``image`` also known here as ``name``."""
    repository, version = parse_repository_tag(name)
    try:
        client.images.get(image).tag(repository, version or "latest")
    except ImageNotFound:
        raise DeployError(f"image {image} is not here; build it with: make images") from None


def ensure_registry_names(client, published: Publication, log: Log) -> None:
    """Each image to publish is tagged here with its name in the registry too, so that this
    machine (when it runs servers) has it under the name the hub uses, without a pull."""
    for image, name in published.images.items():
        tag(client, image, name)
    log(f"images named for the registry {published.registry}: {len(published.images)}")


def registry_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def publish_images(
    client,
    config: Config,
    published: Publication,
    log: Log,
    environ: Mapping[str, str] = os.environ,
    timeout: float = 60,
) -> None:
    """Push each image of ``published`` into the stack's registry, whose service is read-only
    (images/hub/registry.yml): through a writer on the manager's loopback (``writer``), which
    Docker trusts without TLS and nothing off the manager reaches; the GPU machines pull them
    from the read-only one by the manager's address."""
    base = f"http://{engine.published_addr(environ)}:{config.registry_port}"
    for _ in waits(timeout):
        if registry_answers(f"{base}/v2/"):
            break
    else:
        raise DeployError(
            f"the registry did not answer on port {config.registry_port} within {timeout:g} s; "
            f"see: docker service logs {config.stack}_registry"
        )
    missing = [image for image in published.images if not held_already(client, base, config, image)]
    if not missing:
        for image in published.images:
            log(f"{image}: in the registry already")
        return
    with writer(client, config, log, timeout) as address:
        for image in missing:
            push_image(client, image, image_in_registry(address, image), log)


def held_already(client, base: str, config: Config, image: str) -> bool:
    """The registry holds this engine's ``image`` (a push of it from here has its digest)."""
    repository, version = parse_repository_tag(
        image_in_registry(f"127.0.0.1:{config.registry_port}", image)
    )
    held = registry_digest(base, repository.split("/", 1)[1], version or "latest")
    return bool(held) and any(d.endswith(f"@{held}") for d in local_digests(client, image))


#: the writer's name on the manager's engine, and its port on the manager's loopback (the
#: registry's port plus this)
WRITER = "{stack}-registry-push"
WRITER_PORT_OFFSET = 1


@contextlib.contextmanager
def writer(client, config: Config, log: Log, timeout: float = 60):
    """A writable registry over the read-only one's storage, on the manager's loopback only
    (the engine's own network; images/hub/registry-push.yml), for the pushes of one deploy:
    yields its address (127.0.0.1:PORT) and is removed afterwards, whatever happened."""
    port = config.registry_port + WRITER_PORT_OFFSET
    name = WRITER.format(stack=config.stack)
    _remove_container(client, name)
    try:
        container = client.containers.run(
            config.hub_image,
            ["docker-registry", "serve", "/etc/gpu-jupyterhub/registry-push.yml"],
            name=name,
            detach=True,
            network_mode="host",
            environment={"REGISTRY_HTTP_ADDR": f"127.0.0.1:{port}"},
            volumes={f"{config.stack}_registry-data": {"bind": "/var/lib/registry"}},
            labels={contract.STACK_LABEL: config.stack},
        )
    except APIError as e:
        raise DeployError(f"the registry's writer did not start: {e.explanation}") from None
    try:
        for _ in waits(timeout):
            container.reload()
            if container.status != "running":
                raise DeployError(
                    f"the registry's writer stopped on 127.0.0.1:{port} (is that port taken on "
                    f"the manager?): {container.logs(tail=5).decode(errors='replace').strip()}"
                )
            if _writer_answers(container, port):
                break
        else:
            raise DeployError(f"the registry's writer did not answer within {timeout:g} s")
        log(f"pushing through the registry's writer on 127.0.0.1:{port} (the manager only)")
        yield f"127.0.0.1:{port}"
    finally:
        _remove_container(client, name)


def _writer_answers(container, port: int) -> bool:
    """The writer answers on the manager's loopback (asked from inside it: the deploy may run
    elsewhere than the engine's network, as on the test bed)."""
    probe = f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/v2/', timeout=2)"
    return container.exec_run(["python3", "-c", probe]).exit_code == 0


def _remove_container(client, name: str) -> None:
    with contextlib.suppress(NotFound):
        client.api.remove_container(name, force=True)


def push_image(client, image: str, push: str, log: Log) -> None:
    """``docker push`` of ``image`` as ``push`` (REGISTRY/NAME:TAG)."""
    repository, version = parse_repository_tag(push)
    version = version or "latest"
    log(f"pushing {image} to the registry (a new image takes a minute or two)")
    tag(client, image, push)
    try:
        for event in client.images.push(repository, version, stream=True, decode=True):
            if "error" in event:
                detail = event.get("errorDetail", {}).get("message") or event["error"]
                raise DeployError(f"docker push {push} failed: {detail}")
    except APIError as e:
        raise DeployError(f"docker push {push} failed: {e.explanation}") from None


def local_digests(client, image: str) -> list[str]:
    """``REPOSITORY@sha256:...`` of each push of ``image`` from this engine."""
    return client.images.get(image).attrs.get("RepoDigests") or []


MANIFESTS = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    ]
)


def registry_digest(base: str, repository: str, version: str) -> str:
    """The digest of the manifest the registry at ``base`` holds for REPOSITORY:VERSION, "" for
    none."""
    request = urllib.request.Request(
        f"{base}/v2/{repository}/manifests/{version}", method="HEAD", headers={"Accept": MANIFESTS}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.headers.get("Docker-Content-Digest", "")
    except (urllib.error.URLError, OSError):
        return ""
