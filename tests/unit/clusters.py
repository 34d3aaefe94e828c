"""Builders for the plain dicts the Docker API returns for nodes and tasks."""


def node(node_id, hostname, gpus, state="ready", availability="active", role="worker"):
    """A node advertising ``gpus`` ({uuid: slices}) plus a non-GPU resource."""
    generic = [{"DiscreteResourceSpec": {"Kind": k, "Value": v}} for k, v in gpus.items()]
    generic.append({"DiscreteResourceSpec": {"Kind": "fpga", "Value": 1}})
    return {
        "ID": node_id,
        "Spec": {"Availability": availability, "Role": role},
        "Status": {"State": state},
        "Description": {"Hostname": hostname, "Resources": {"GenericResources": generic}},
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
