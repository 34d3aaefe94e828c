"""A GPUSwarmSpawner whose Docker calls a small in-memory swarm answers (no daemon here).

The swarm keeps what the spawner's calls change: services live from ``create_service`` until
``remove_service``, each with one task, and every call is recorded, so tests assert on what
the spawner asked Docker to do and on what is left afterwards. Everything lives on the
instance: nothing carries over from one test to the next.
"""

from __future__ import annotations

from types import SimpleNamespace

from docker.errors import APIError, NotFound
from jupyterhub.objects import Hub

from gpu_swarm_spawner import GPUSwarmSpawner

#: The status Swarm gives the task of a service it cannot place.
UNPLACEABLE = {"State": "pending", "Err": "no suitable node (insufficient resources on 1 node)"}
RUNNING = {"State": "running"}


def _not_found(what: str) -> NotFound:
    return NotFound(f"{what} not found", response=SimpleNamespace(status_code=404))


class FakeDockerSpawner(GPUSwarmSpawner):
    """Answers ``self.docker(...)`` like a swarm manager would.

    - ``nodes``, ``tasks``: what the inventory reads (``clusters.node``/``task`` dicts);
    - ``task_states``: the task status of the 1st, 2nd, ... service created (then running);
    - ``task_address``: every task's address on the network (nothing answers there);
    - ``published_port``: the port Swarm publishes for a service with ports;
    - ``subnets``: the ranges of the servers' network;
    - ``calls``: every call as (method, args, kwargs); ``created``: create_service's kwargs;
      ``services``: the services that exist now, by id.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.nodes: list[dict] = []
        self.tasks: list[dict] = []
        self.task_states: list[dict] = []
        self.task_address = "127.0.0.3"  # loopback: a probe sent there by mistake stays here
        self.published_port = 30001
        self.subnets = ["10.0.1.0/24"]  # the servers' network's ranges (inspect_network)
        self.calls: list[tuple] = []
        self.reads = 0  # calls made through docker_read (the broker's reading thread)
        self.created: list[dict] = []
        self.services: dict[str, dict] = {}

    def called(self, method: str) -> list[tuple]:
        """The positional arguments of every call of ``method``, in order."""
        return [args for name, args, _ in self.calls if name == method]

    def docker_read(self, method, *args, **kwargs):
        """Reads are answered (and recorded) as every other call: ``reads`` counts them."""
        self.reads += 1
        return self.docker(method, *args, **kwargs)

    async def docker(self, method, *args, **kwargs):
        self.calls.append((method, args, kwargs))
        if method == "nodes":
            return self.nodes
        if method == "tasks":
            wanted = (kwargs.get("filters") or {}).get("service")
            if wanted is None:  # the fixture's tasks, and those of the services made
                return self.tasks + [s["task"] for s in self.services.values()]
            return [s["task"] for s in self.services.values() if wanted in (s["ID"], s["name"])]
        if method == "create_service":
            return self._create_service(kwargs)
        if method == "inspect_service":
            (wanted,) = args
            for service in self.services.values():
                if wanted in (service["ID"], service["name"]):
                    return service
            raise _not_found(f"service {wanted}")
        if method == "remove_service":
            (service_id,) = args
            if self.services.pop(service_id, None) is None:
                raise _not_found(f"service {service_id}")
            return None
        if method == "inspect_network":
            return {"IPAM": {"Config": [{"Subnet": subnet} for subnet in self.subnets]}}
        if method == "inspect_node":
            (node_id,) = args
            return next(n for n in self.nodes if n["ID"] == node_id)
        raise AssertionError(f"unexpected Docker call {method}")

    def _create_service(self, kwargs: dict) -> dict:
        endpoint = kwargs["endpoint_spec"]
        ports = endpoint.get("Ports") or []
        if endpoint.get("Mode") == "dnsrr" and any(
            p.get("PublishMode", "ingress") == "ingress" for p in ports
        ):
            # swarmkit's validateEndpointSpec
            raise APIError(
                "rpc error: code = InvalidArgument desc = EndpointSpec: port published with "
                "ingress mode can't be used with dnsrr mode",
                response=SimpleNamespace(status_code=400),
            )
        self.created.append(kwargs)
        service_id = f"svc{len(self.created)}"
        states = self.task_states
        status = states[len(self.created) - 1] if len(self.created) <= len(states) else RUNNING
        task = {
            "ID": f"task-{service_id}",
            "ServiceID": service_id,
            "CreatedAt": "2025-01-01T00:00:00Z",
            "DesiredState": "running",
            "Status": dict(status),
            "NetworksAttachments": [
                {
                    "Network": {"Spec": {"Name": self.network_name}},
                    "Addresses": [f"{self.task_address}/24"],
                }
            ],
        }
        if status["State"] == "new":  # not given its addresses yet (nor a node)
            task["NetworksAttachments"][0]["Addresses"] = []
        elif status["State"] != "pending":
            task["NodeID"] = "n1"
        self.services[service_id] = {
            "ID": service_id,
            "name": kwargs["name"],
            "Spec": {"Name": kwargs["name"], "Labels": kwargs.get("labels", {})},
            "Endpoint": {"Ports": [{**p, "PublishedPort": self.published_port} for p in ports]},
            "task": task,
        }
        return {"ID": service_id}


def make_fake(name: str = "alice-smith", **kwargs) -> FakeDockerSpawner:
    user = SimpleNamespace(name=name, id=1, url=f"/user/{name}/")
    kwargs.setdefault("cmd", ["jupyterhub-singleuser"])
    kwargs.setdefault("probe_server", False)  # nothing listens here (tests that probe say so)
    return FakeDockerSpawner(user=user, hub=Hub(), **kwargs)
