"""Builders for the plain dicts the Docker API returns for nodes and tasks."""


def node(node_id, hostname, gpus, state="ready", availability="active", role="worker", cores=None):
    """A node advertising ``gpus`` ({uuid: slices}) plus a non-GPU resource (and ``cores`` CPU
    cores, as its engine reports them, when given)."""
    generic = [{"DiscreteResourceSpec": {"Kind": k, "Value": v}} for k, v in gpus.items()]
    generic.append({"DiscreteResourceSpec": {"Kind": "fpga", "Value": 1}})
    resources = {"GenericResources": generic}
    if cores is not None:
        resources["NanoCPUs"] = int(cores * 1e9)
    return {
        "ID": node_id,
        "Spec": {"Availability": availability, "Role": role},
        "Status": {"State": state},
        "Description": {"Hostname": hostname, "Resources": resources},
    }


def task(node_id, reservations, state="running", desired="running", service_id="svc"):
    generic = [{"DiscreteResourceSpec": {"Kind": k, "Value": v}} for k, v in reservations.items()]
    return {
        "NodeID": node_id,
        "ServiceID": service_id,
        "DesiredState": desired,
        "Status": {"State": state},
        "Spec": {"Resources": {"Reservations": {"GenericResources": generic}}},
    }


def node_from_daemon_json(config, node_id="n1", hostname="gpu-a"):
    """The node a GPU machine with daemon.json ``config`` is, as the Docker API reports it: its
    engine labels (``labels``, ``key=value``) as a dict, its ``node-generic-resources`` as
    generic resources (``kind=<whole number>`` discrete, any other value a named one, as
    Swarm reads them)."""
    generic = []
    for entry in config.get("node-generic-resources", []):
        kind, _, value = entry.partition("=")
        if value.isdigit():
            generic.append({"DiscreteResourceSpec": {"Kind": kind, "Value": int(value)}})
        else:
            generic.append({"NamedResourceSpec": {"Kind": kind, "Value": value}})
    labels = dict(label.split("=", 1) for label in config.get("labels", []))
    return {
        "ID": node_id,
        "Spec": {"Availability": "active", "Role": "worker"},
        "Status": {"State": "ready"},
        "Description": {
            "Hostname": hostname,
            "Resources": {"GenericResources": generic},
            "Engine": {"Labels": labels},
        },
    }
