"""`make up`'s image registry: the servers' images under the names the GPU machines pull them by,
and pushing them there.

``publication`` is pure: the settings and the registry's address in, the images to publish and
their names in the registry out. The deploy passes it on; nothing is rewritten in between.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from docker.errors import APIError, ImageNotFound
from docker.utils import parse_repository_tag

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
    """Push each image of ``published`` to the stack's registry, by its local address
    (GPUHUB_ENGINE_ADDR, default 127.0.0.1), which Docker trusts without TLS; the GPU machines
    pull them by the manager's."""
    base = f"http://{engine.published_addr(environ)}:{config.registry_port}"
    for _ in waits(timeout):
        if registry_answers(f"{base}/v2/"):
            break
    else:
        raise DeployError(
            f"the registry did not answer on port {config.registry_port} within {timeout:g} s; "
            f"see: docker service logs {config.stack}_registry"
        )
    for image in published.images:
        push = image_in_registry(f"127.0.0.1:{config.registry_port}", image)
        repository, version = parse_repository_tag(push)
        version = version or "latest"
        path = repository.split("/", 1)[1]
        held = registry_digest(base, path, version)
        if held and f"{repository}@{held}" in local_digests(client, image):
            log(f"{image}: in the registry already")
            continue
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
