"""A Docker SDK client for the deploy steps (deploy/) and the hub's one-shot containers (the
fleet's provider commands, gpu_swarm_spawner/provider.py), answered by a small in-memory swarm
manager (no daemon here), and a stand-in for `docker stack deploy`.

It answers the calls the steps make, with the shapes the Docker API gives (``client.info()``,
``client.api.services/tasks/secrets/networks/volumes``, ``client.images``, ``client.swarm``,
``client.nodes``), keeps what they change, and records every call that changes something in
``changes``, so a test asserts what a step did and that a second run did nothing. Everything
lives on the instance.
"""

from __future__ import annotations

import copy
import hashlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

from docker.errors import APIError, BuildError, ImageNotFound, NotFound
from requests.exceptions import ReadTimeout

from gpu_swarm_spawner.contract import DOCKER_STACK_LABEL


def _not_found(what: str) -> NotFound:
    return NotFound(f"{what} not found", response=SimpleNamespace(status_code=404))


def _refused(what: str) -> APIError:
    return APIError(what, response=SimpleNamespace(status_code=400), explanation=what)


def _labelled(objects: list[dict], filters: dict | None) -> list[dict]:
    label = (filters or {}).get("label")
    if not label:
        return list(objects)
    key, _, value = label.partition("=")
    return [o for o in objects if (o.get("Spec", o).get("Labels") or {}).get(key) == value]


class FakeImage:
    def __init__(self, engine: FakeDocker, image_id: str):
        self.engine = engine
        self.id = image_id
        self.attrs = {"Id": image_id, "RepoDigests": []}

    @property
    def short_id(self) -> str:
        return self.id[:19]

    def tag(self, repository: str, tag: str | None = None) -> bool:
        self.engine.changes.append(("tag", self.id, f"{repository}:{tag}"))
        self.engine.tags[f"{repository}:{tag}"] = self
        return True

    @property
    def tags(self) -> list[str]:
        return [name for name, image in self.engine.tags.items() if image is self]

    def save(self, named: bool | str = False):
        # docker-py: named=True saves the image under its *first* tag; a name must be a tag
        if isinstance(named, str) and named not in self.tags:
            raise ValueError(f"{named} is not a tag of {self.id} ({self.tags})")
        name = self.tags[0] if named is True else named
        self.engine.changes.append(("save", self.id, name))
        yield f"tar of {self.id} as {name}".encode()


class FakeImages:
    def __init__(self, engine: FakeDocker):
        self.engine = engine

    def get(self, name: str) -> FakeImage:
        name = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
        if name not in self.engine.tags:
            raise ImageNotFound(f"No such image: {name}")
        return self.engine.tags[name]

    def build(self, path, dockerfile, tag, buildargs=None, rm=False, **kwargs):
        """The image's id follows the Dockerfile and the build arguments: the same build twice
        gives the same image (Docker's cache). ``build_fails`` holds tags whose build fails."""
        self.engine.builds.append({"dockerfile": dockerfile, "tag": tag, "buildargs": buildargs})
        if tag in self.engine.build_fails:
            log = [{"stream": f"Step {n}/40 : RUN something\n"} for n in range(1, 41)]
            log.append({"error": "The command '/bin/sh -c pip install' returned 1"})
            raise BuildError("The command '/bin/sh -c pip install' returned 1", log)
        recipe = f"{dockerfile} {sorted((buildargs or {}).items())} {self.engine.context_version}"
        image_id = "sha256:" + hashlib.sha256(recipe.encode()).hexdigest()
        image = next((i for i in self.engine.tags.values() if i.id == image_id), None)
        if image is None or self.engine.tags.get(tag) is not image:
            self.engine.changes.append(("build", tag))
        image = image or FakeImage(self.engine, image_id)
        self.engine.tags[tag] = image
        return image, iter([])

    def pull(self, name: str, tag: str | None = None, **kwargs):
        if name not in self.engine.pullable:
            raise _not_found(f"manifest for {name}")
        self.engine.changes.append(("pull", name))
        image = FakeImage(self.engine, "sha256:" + hashlib.sha256(name.encode()).hexdigest())
        self.engine.tags[name] = image
        return image

    def push(self, repository: str, tag: str | None = None, stream=False, decode=False):
        name = f"{repository}:{tag}"
        self.engine.changes.append(("push", name))
        if name in self.engine.push_fails:
            yield {"status": "Preparing"}
            yield {"error": "denied", "errorDetail": {"message": "denied: not allowed"}}
            return
        host = repository.split("/", 1)[0]
        if host not in self.engine.registry_writers:
            yield {"error": "denied", "errorDetail": {"message": f"{host}: read-only registry"}}
            return
        image = self.engine.tags[name]
        digest = "sha256:" + hashlib.sha256(image.id.encode()).hexdigest()
        self.engine.registry[name.split("/", 1)[1]] = digest  # its storage: NAME:TAG
        image.attrs["RepoDigests"].append(f"{repository}@{digest}")
        yield {"status": "Pushed"}
        yield {"aux": {"Tag": tag, "Digest": digest}}


class FakeContainer:
    """A container ``containers.run`` started (the registry's writer): it runs, answers and is
    removed with ``api.remove_container``."""

    def __init__(self, engine: FakeDocker, name: str, kwargs: dict):
        self.engine, self.name, self.kwargs = engine, name, kwargs
        self.status = "running"

    def reload(self) -> None:
        pass

    def logs(self, **kwargs) -> bytes:
        return b""

    def exec_run(self, command, **kwargs):
        return SimpleNamespace(exit_code=0, output=b"")


class FakeCommandContainer:
    """A container ``containers.create`` made: ``start`` runs its entrypoint and command with
    this machine's /bin/sh, with no input and only the container's environment (and the image's
    PATH); ``wait`` gives up past its timeout as the SDK does (``ReadTimeout``); ``remove``
    takes it out of ``engine.made``."""

    def __init__(self, engine: FakeDocker, ident: str, image: str, kwargs: dict):
        self.engine, self.id, self.image, self.kwargs = engine, ident, image, kwargs
        self.proc: subprocess.Popen | None = None
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by remove)
        self.killed = False

    def start(self) -> None:
        self.engine.changes.append(("start container", self.id))
        if self.image in self.engine.start_fails:
            raise _refused(self.engine.start_fails[self.image])
        self.proc = subprocess.Popen(
            [*self.kwargs["entrypoint"], *self.kwargs["command"]],
            env={"PATH": os.environ["PATH"], **self.kwargs["environment"]},
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout=None) -> dict:
        try:
            return {"StatusCode": self.proc.wait(timeout), "Error": None}
        except subprocess.TimeoutExpired:
            raise ReadTimeout(f"Read timed out. (read timeout={timeout})") from None

    def kill(self) -> None:
        self.engine.changes.append(("kill container", self.id))
        self.killed = True
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def logs(self, stdout=True, stderr=True, **kwargs) -> bytes:
        self.out.seek(0)
        return self.out.read()

    def remove(self, force=False) -> None:
        self.engine.changes.append(("remove container", self.id))
        if self.proc and self.proc.poll() is None:
            if not force:
                raise _refused("cannot remove a running container: stop it or use force")
            self.kill()
        self.out.close()
        del self.engine.made[self.id]


class FakeContainers:
    def __init__(self, engine: FakeDocker):
        self.engine = engine

    def create(self, image, command=None, **kwargs) -> FakeCommandContainer:
        """As the engine: no pull (an image not in ``tags`` is ``ImageNotFound``), a bind
        mount of a folder that does not exist refused."""
        self.engine.creates.append((image, {"command": command, **kwargs}))
        name = image if ":" in image.rsplit("/", 1)[-1] else f"{image}:latest"
        if name not in self.engine.tags:
            raise ImageNotFound(f"No such image: {name}")
        for mount in kwargs.get("mounts") or []:
            if not Path(mount["Source"]).exists():
                raise _refused(
                    'invalid mount config for type "bind": bind source path does not exist: '
                    + mount["Source"]
                )
        ident = f"c{len(self.engine.creates)}"
        self.engine.changes.append(("create container", ident))
        container = FakeCommandContainer(self.engine, ident, image, {"command": command, **kwargs})
        self.engine.made[ident] = container
        return container

    def run(self, image, command=None, name=None, detach=False, **kwargs):
        assert detach and name, "only detached, named containers here"
        self.engine.changes.append(("run", name))
        self.engine.runs.append((name, kwargs))
        self.engine.containers_running[name] = FakeContainer(self.engine, name, kwargs)
        address = (kwargs.get("environment") or {}).get("REGISTRY_HTTP_ADDR")
        if address:
            self.engine.registry_writers.add(address)
        return self.engine.containers_running[name]


class FakeNode:
    def __init__(self, engine: FakeDocker, attrs: dict):
        self.engine = engine
        self.attrs = attrs

    def update(self, spec: dict) -> bool:
        self.engine.changes.append(("node update", self.attrs["Description"]["Hostname"], spec))
        self.attrs["Spec"] = spec
        return True


class FakeNodes:
    def __init__(self, engine: FakeDocker):
        self.engine = engine

    def get(self, name: str) -> FakeNode:
        for node in self.engine.node_list:
            if name in (node["ID"], node["Description"]["Hostname"]):
                return FakeNode(self.engine, node)
        raise _not_found(f"node {name}")


class FakeSwarm:
    def __init__(self, engine: FakeDocker):
        self.engine = engine
        self.attrs: dict = {}

    def init(self, advertise_addr=None, **kwargs):
        self.engine.changes.append(("swarm init", advertise_addr))
        self.engine.swarm_init_options = kwargs
        if self.engine.swarm_init_fails:
            raise _refused(self.engine.swarm_init_fails)
        self.engine.swarm_state = {
            "LocalNodeState": "active",
            "ControlAvailable": True,
            "NodeAddr": advertise_addr,
        }
        return "node-id"

    def reload(self):
        self.attrs = {"JoinTokens": {"Worker": "SWMTKN-1-worker", "Manager": "SWMTKN-1-mgr"}}


class FakeAPI:
    """``client.api``: the low-level calls, returning the API's dicts."""

    def __init__(self, engine: FakeDocker):
        self.engine = engine

    def nodes(self, filters=None):
        return copy.deepcopy(self.engine.node_list)

    def services(self, filters=None):
        services = list(self.engine.services.values()) + self.engine.user_services
        return copy.deepcopy(_labelled(services, filters))

    def inspect_service(self, name: str):
        for service in list(self.engine.services.values()) + self.engine.user_services:
            if name in (service["ID"], service["Spec"]["Name"]):
                return copy.deepcopy(service)
        raise _not_found(f"service {name}")

    def tasks(self, filters=None):
        """The service's tasks: the next of its ``task_script`` (the last one repeats), else
        one running task of its current spec. Without a service: ``swarm_tasks``, those of
        one node with a ``node`` filter (the fleet's reads)."""
        if "service" not in (filters or {}):
            node_id = (filters or {}).get("node")
            self.engine.node_task_reads.append(node_id)
            found = [t for t in self.engine.swarm_tasks if node_id in (None, t.get("NodeID"))]
            return copy.deepcopy(found)
        name = (filters or {}).get("service")
        self.engine.task_reads[name] = self.engine.task_reads.get(name, 0) + 1
        script = self.engine.task_script.get(name)
        if script:
            return copy.deepcopy(script.pop(0) if len(script) > 1 else script[0])
        service = self.engine.services.get(name)
        if service is None:
            return []
        return [running_task(service)]

    def inspect_node(self, ident: str):
        return copy.deepcopy(self.engine.api_node(ident))

    def update_node(self, ident: str, version: int, node_spec=None):
        """Docker refuses an update made from an older version of the node."""
        found = self.engine.api_node(ident)
        if version != found["Version"]["Index"]:
            raise _refused(f"update out of sequence: node {ident} is at a newer version")
        found["Spec"] = copy.deepcopy(node_spec)
        found["Version"]["Index"] += 1
        self.engine.changes.append(("node update", ident, node_spec.get("Availability")))

    def remove_node(self, ident: str, force=False):
        found = self.engine.api_node(ident)
        if (found.get("Status") or {}).get("State") != "down" and not force:
            raise _refused(f"node {ident} is not down and can't be removed")
        self.engine.node_list.remove(found)
        self.engine.changes.append(("node rm", ident))

    def service_logs(self, name, **kwargs):
        return iter([f"log of {name}\n".encode()])

    def remove_service(self, ident: str):
        for name, service in list(self.engine.services.items()):
            if service["ID"] == ident:
                del self.engine.services[name]
                self.engine.changes.append(("service rm", name))
                return
        for service in list(self.engine.user_services):
            if service["ID"] == ident:
                self.engine.user_services.remove(service)
                self.engine.changes.append(("service rm", service["Spec"]["Name"]))
                return
        raise _not_found(f"service {ident}")

    def secrets(self, filters=None):
        found = _labelled(self.engine.secrets, filters)
        prefix = (filters or {}).get("name")
        if prefix:
            found = [s for s in found if s["Spec"]["Name"].startswith(prefix)]
        return copy.deepcopy(found)

    def remove_secret(self, ident: str):
        secret = next((s for s in self.engine.secrets if s["ID"] == ident), None)
        if secret is None:
            raise _not_found(f"secret {ident}")
        name = secret["Spec"]["Name"]
        if name in self.engine.secrets_in_use:
            raise _refused(f"secret '{name}' is in use by the following service: hub")
        self.engine.secrets.remove(secret)
        self.engine.changes.append(("secret rm", name))

    def networks(self, names=None, filters=None):
        return copy.deepcopy(self.engine.networks)

    def remove_network(self, ident: str):
        network = next((n for n in self.engine.networks if n["Id"] == ident), None)
        if network is None:
            raise _not_found(f"network {ident}")
        self.engine.changes.append(("network rm", network["Name"]))
        # a network goes once the stack's tasks have left it: some removals are accepted
        # while it is still listed
        if self.engine.network_lingers:
            self.engine.network_lingers -= 1
            return
        self.engine.networks.remove(network)

    def volumes(self, filters=None):
        return {"Volumes": copy.deepcopy(_labelled(self.engine.volumes, filters)), "Warnings": []}

    def remove_container(self, name: str, force=False):
        container = self.engine.containers_running.pop(name, None)
        if container is None:
            raise _not_found(f"container {name}")
        self.engine.changes.append(("remove container", name))
        address = (container.kwargs.get("environment") or {}).get("REGISTRY_HTTP_ADDR")
        self.engine.registry_writers.discard(address)

    def remove_volume(self, name: str, force=False):
        volume = next((v for v in self.engine.volumes if v["Name"] == name), None)
        if volume is None:
            raise _not_found(f"volume {name}")
        if self.engine.volume_busy:
            self.engine.volume_busy -= 1
            raise _refused(f"remove {name}: volume is in use")
        self.engine.volumes.remove(volume)
        self.engine.changes.append(("volume rm", name))


def running_task(service: dict, state: str = "running", desired: str = "running", spec=None):
    """A task of ``service`` (of its current spec unless ``spec`` says otherwise)."""
    return {
        "ID": f"task-{service['Spec']['Name']}-{state}",
        "ServiceID": service["ID"],
        "DesiredState": desired,
        "Status": {"State": state},
        "Spec": copy.deepcopy(spec if spec is not None else service["Spec"]["TaskTemplate"]),
        "UpdatedAt": "2025-01-01T00:00:00Z",
    }


class FakeDocker:
    """The client. ``swarm_state``: what ``info()["Swarm"]`` says; ``tags``: name -> image;
    ``pullable``: names a pull finds; ``build_fails``/``push_fails``: tags that fail;
    ``task_script``: service name -> successive task lists; ``changes``: what was changed."""

    def __init__(self, stack: str = "gpuhub", network: str = "jhub"):
        self.stack = stack
        self.network = network
        self.swarm_state = {"LocalNodeState": "inactive", "ControlAvailable": False}
        self.swarm_init_fails = ""
        self.tags: dict[str, FakeImage] = {}  # image name -> image
        self.pullable: set[str] = set()
        self.build_fails: set[str] = set()
        self.push_fails: set[str] = set()
        self.context_version = 1  # change it: the next build gives a new image
        self.builds: list[dict] = []
        self.registry: dict[str, str] = {}  # the registry's storage: NAME:TAG -> digest
        #: the addresses that take pushes (a writer the deploy runs)
        self.registry_writers: set[str] = set()
        self.containers_running: dict[str, FakeContainer] = {}
        self.runs: list[tuple[str, dict]] = []  # containers.run: (name, its keyword arguments)
        self.creates: list[tuple[str, dict]] = []  # containers.create: (image, its arguments)
        self.made: dict[str, FakeCommandContainer] = {}  # containers created, not removed
        self.start_fails: dict[str, str] = {}  # image -> what the engine says to its start
        self.node_list: list[dict] = [node("vm", ["GPU-simulated-0035969e-0=3"])]
        self.services: dict[str, dict] = {}  # the stack's, by name
        self.user_services: list[dict] = []
        self.task_script: dict[str, list[list[dict]]] = {}
        self.task_reads: dict[str, int] = {}
        #: every task of the swarm, for reads without a service (api.tasks()), and the node
        #: each such read asked about (None: all)
        self.swarm_tasks: list[dict] = []
        self.node_task_reads: list[str | None] = []
        self.secrets: list[dict] = []
        self.secrets_in_use: set[str] = set()
        self.networks: list[dict] = []
        self.network_lingers = 0
        self.volumes: list[dict] = []
        self.volume_busy = 0
        self.changes: list[tuple] = []
        self.deploys: list[dict] = []  # each `docker stack deploy`: command and environment
        self.api = FakeAPI(self)
        self.swarm = FakeSwarm(self)
        self.images = FakeImages(self)
        self.containers = FakeContainers(self)
        self.nodes = FakeNodes(self)

    def api_node(self, ident: str) -> dict:
        """The node of that ID or hostname, as kept (not a copy)."""
        for found in self.node_list:
            if ident in (found["ID"], found["Description"]["Hostname"]):
                found.setdefault("Version", {"Index": 1})
                return found
        raise _not_found(f"node {ident}")

    # the high-level client
    def ping(self):
        return True

    def info(self):
        return {"Swarm": dict(self.swarm_state), "Name": "vm"}

    # `docker stack deploy`, replacing deploy.stack.run
    def stack_deploy(self, command, failed, fix, lines=None, env=None, show=None):
        """Deploys the services the stack files name, each with a spec made of the values the
        files interpolate (image, image id, ...), so an unchanged environment leaves them as
        they are; --prune removes the others. Every stack gets the network and its secrets."""
        files = [Path(command[i + 1]).name for i, a in enumerate(command) if a == "-c"]
        stack = command[-1]
        self.deploys.append({"command": list(command), "env": dict(env), "files": files})
        wanted = ["proxy", "hub", "tutorial-sync", "net-anchor"]
        wanted += ["gateway"] if "stack.tls.yml" in files else []
        wanted += ["registry"] if "stack.registry.yml" in files else []
        labels = {DOCKER_STACK_LABEL: stack}
        for name in wanted:
            full = f"{stack}_{name}"
            image = env["GPUHUB_SINGLEUSER_IMAGE" if name == "net-anchor" else "GPUHUB_HUB_IMAGE"]
            template = {
                "ContainerSpec": {
                    "Image": image,
                    "Env": sorted(f"{k}={v}" for k, v in env.items() if k.startswith("GPUHUB_")),
                },
                "ForceUpdate": 0,
            }
            spec = {"Name": full, "Labels": labels, "TaskTemplate": template}
            old = self.services.get(full)
            if old is None or old["Spec"] != spec:
                self.changes.append(("service " + ("create" if old is None else "update"), full))
                version = (old["Version"]["Index"] if old else 0) + 10
                self.services[full] = {
                    "ID": f"id-{full}",
                    "Spec": spec,
                    "Version": {"Index": version},
                }
        for full in [n for n in self.services if n not in {f"{stack}_{w}" for w in wanted}]:
            self.changes.append(("service rm", full))
            del self.services[full]
        if not any(n["Name"] == self.network for n in self.networks):
            self.networks.append(
                {"Id": f"net-{self.network}", "Name": self.network, "Labels": labels}
            )
        for name in ("proxy_token", "ops_token", "demo_password", "admin_password"):
            full = f"{stack}_{name}"
            if not any(s["Spec"]["Name"] == full for s in self.secrets):
                self.secrets.append(
                    {"ID": f"secret-{full}", "Spec": {"Name": full, "Labels": labels}}
                )
        return ""


def node(hostname: str, kinds: list[str], availability: str = "active") -> dict:
    resources = []
    for entry in kinds:
        kind, _, value = entry.partition("=")
        resources.append({"DiscreteResourceSpec": {"Kind": kind, "Value": int(value)}})
    return {
        "ID": f"node-{hostname}",
        "Spec": {"Availability": availability, "Role": "manager", "Labels": {}},
        "Description": {"Hostname": hostname, "Resources": {"GenericResources": resources}},
    }


class FakeDockerCLI:
    """worker_setup's DockerCLI over the fake engine, for what the deploy runs through the
    ``docker`` command (the firewall's keeper, the disk watch): ``docker run --detach --name
    NAME`` is a container of ``engine.containers_running``, its image the word after
    ``--entrypoint=``; ``changes`` has ("docker run", NAME, what the image runs)."""

    def __init__(self, engine: FakeDocker):
        self.engine = engine

    def __call__(self, environ=None):  # steps.DockerCLI(environ)
        return self

    def container(self, name: str) -> dict | None:
        found = self.engine.containers_running.get(name)
        if found is None:
            return None
        kw = found.kwargs
        return {
            "Config": {"Image": kw["image"], "Labels": kw["labels"], "Env": kw["env"]},
            "State": {"Running": True},
        }

    def run_container(self, *args: str) -> str:
        words = list(args)

        def values(flag):
            return [words[i + 1] for i, w in enumerate(words) if w == flag]

        name = (values("--name") or ["(one-off)"])[0]
        image = next(i for i, w in enumerate(words) if w.startswith("--entrypoint=")) + 1
        self.engine.changes.append(("docker run", name, " ".join(words[image + 1 :])))
        if "--detach" in words:
            labels = dict(v.split("=", 1) for v in values("--label"))
            kwargs = {"image": words[image], "labels": labels, "env": values("--env")}
            self.engine.containers_running[name] = FakeContainer(self.engine, name, kwargs)
        return ""

    def remove_container(self, name: str) -> str:
        self.engine.changes.append(("docker rm", name))
        self.engine.containers_running.pop(name, None)
        return ""
