"""`make status`'s table, from plain Docker API dicts."""

from deploy import status
from deploy.status import guard_memory, render

from .clusters import node, task


def test_machines_slices_and_servers():
    nodes = [
        node("n1", "gpu-a", {"GPU-aaaa-0": 3, "GPU-aaaa-1": 3}),
        node("n2", "gpu-b", {"GPU-simulated-bb-0": 3}, availability="pause"),
        node("n3", "manager", {}),
    ]
    tasks = [
        task("n1", {"GPU-aaaa-0": 1}, service_id="s1"),
        task("n1", {"GPU-aaaa-1": 3}, service_id="s2"),
        task("n1", {"GPU-aaaa-0": 1}, state="complete", service_id="s3"),
        task("n3", {}, service_id="anchor"),
    ]
    services = [
        {"ID": "s1", "Spec": {"Name": "jy-alice", "Labels": {"gpu-jupyterhub.user": "alice"}}},
        {"ID": "s2", "Spec": {"Name": "jy-bob", "Labels": {"gpu-jupyterhub.user": "bob"}}},
        {"ID": "s3", "Spec": {"Name": "jy-carol", "Labels": {"gpu-jupyterhub.user": "carol"}}},
        {"ID": "anchor", "Spec": {"Name": "gpuhub_net-anchor"}},
    ]
    out = render(nodes, tasks, services)
    lines = out.splitlines()
    assert any(line.split()[:5] == ["gpu-a", "ready", "active", "2", "4/6"] for line in lines)
    assert any("gpu-b" in line and "pause" in line and "simulated GPUs" in line for line in lines)
    assert "2 of 6 slices free on schedulable machines" in out  # the paused machine's not counted
    assert "Servers (2)" in out
    assert any(line.split()[:5] == ["jy-bob", "bob", "gpu-a", "GPU-aaaa-1", "3"] for line in lines)
    assert "carol" not in out and "net-anchor" not in out


def test_a_gpu_two_machines_advertise_is_named_with_the_fix():
    nodes = [
        node("n1", "gpu-a", {"GPU-simulated-aa-0": 3}),
        node("n2", "gpu-a2", {"GPU-simulated-aa-0": 3}),
    ]
    out = render(nodes, [], [])
    assert "GPU-simulated-aa-0 is advertised by gpu-a and gpu-a2: no server starts on it" in out
    assert "its own /etc/machine-id" in out
    assert "0 of 0 slices free on schedulable machines" in out


def test_no_servers():
    assert "Servers (0)\n  none" in render([node("n1", "a", {"GPU-x": 2})], [], [])


def test_a_paused_machine_shows_the_slices_its_servers_still_hold():
    nodes = [node("n2", "gpu-b", {"GPU-b0": 3}, availability="pause")]
    tasks = [task("n2", {"GPU-b0": 2}, service_id="s1")]
    services = [{"ID": "s1", "Spec": {"Name": "jy-dave", "Labels": {}}}]
    out = render(nodes, tasks, services)
    assert any(
        line.split()[:5] == ["gpu-b", "ready", "pause", "1", "2/3"] for line in out.splitlines()
    )
    assert "0 of 0 slices free on schedulable machines" in out


USED = "gpuhub_participant_gpu_memory_used_bytes"
BUDGET = "gpuhub_participant_gpu_memory_budget_bytes"
GUARD_METRICS = f"""\
# TYPE {USED} gauge
{USED}{{gpu="GPU-aaaa-0",machine="gpu-a",user="alice"}} 1.048576e+10
{USED}{{gpu="GPU-aaaa-1",machine="gpu-a",user="bob"}} 2.147483648e+09
# TYPE {BUDGET} gauge
{BUDGET}{{gpu="GPU-aaaa-0",machine="gpu-a",user="alice"}} 8.589934592e+09
{BUDGET}{{gpu="GPU-aaaa-1",machine="gpu-a",user="bob"}} 8.589934592e+09
"""


def test_each_server_shows_its_gpu_memory_against_its_budget_from_the_guards():
    nodes = [
        node("n1", "gpu-a", {"GPU-aaaa-0": 3, "GPU-aaaa-1": 3}),
        node("n2", "gpu-c", {"GPU-c": 3}),
    ]
    tasks = [
        task("n1", {"GPU-aaaa-0": 1}, service_id="s1"),
        task("n1", {"GPU-aaaa-1": 1}, service_id="s2"),
        task("n2", {"GPU-c": 1}, service_id="s3"),
    ]
    services = [
        {"ID": f"s{i}", "Spec": {"Name": f"jy-{u}", "Labels": {"gpu-jupyterhub.user": u}}}
        for i, u in ((1, "alice"), (2, "bob"), (3, "carol"))
    ]
    memory = guard_memory([GUARD_METRICS])
    out = render(nodes, tasks, services, memory=memory, silent=("n2",))
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("jy-")}
    assert "9.8 / 8.0 GB OVER" in rows["jy-alice"]
    assert "2.0 / 8.0 GB" in rows["jy-bob"] and "OVER" not in rows["jy-bob"]
    assert " ? " in rows["jy-carol"]  # her machine's guard did not answer
    assert any("gpu-c" in line and "guard: no answer" in line for line in out.splitlines())
    # without the guards' figures (not read): a dash
    plain = render(nodes, tasks, services)
    assert "OVER" not in plain and "guard: no answer" not in plain


def test_the_waiting_line_comes_from_the_hubs_user_models_head_first():
    def user(name, servers):
        return {"name": name, "servers": servers}

    users = [
        user("carol", {"": {"pending": "spawn", "state": {"line_joined": 1000.0}}}),
        user("alice", {"": {"pending": "spawn", "state": {"line_joined": 900.0}}}),
        user("bob", {"": {"pending": "spawn", "state": {}}}),  # starting, not waiting
        user("dan", {"": {"pending": None, "ready": True, "state": {"gpu_uuid": "GPU-a"}}}),
        user("erin", {"gpu2": {"pending": "spawn", "state": {"line_joined": 950.0}}}),
        user("fay", {}),
    ]
    line = status.waiting(users)
    assert line == [(900.0, "alice"), (950.0, "erin/gpu2"), (1000.0, "carol")]
    text = status.render_line(line, now=1300.0).splitlines()
    assert text[0] == "Waiting line (3)"
    assert text[2].split()[:2] == ["1", "alice"] and text[2].endswith("7 min")
    assert text[4].split()[:2] == ["3", "carol"] and text[4].endswith("5 min")
    assert status.render_line([], 0).splitlines() == ["Waiting line (0)", "  nobody"]


# ---- the fleet of GPU machines the hub drives ---------------------------------------------------


def test_the_fleets_machines_failure_and_cost_are_printed():
    import time

    from gpu_swarm_spawner import fleet_view

    from .fleet_snapshots import AT, text

    out = status.render_fleet(fleet_view.read(text(), now=AT + 5))
    lines = out.splitlines()
    assert lines[0] == "GPU machines the hub asks for (GPUHUB_FLEET)"
    # the cloud's refusal first: its kind, what to do, the command's last line
    assert lines[1].startswith("  The cloud's provider failed: quota exceeded (grow, at ")
    assert lines[2] == "    what to do: " + fleet_view.ADVICE["quota exceeded"]
    assert lines[3].startswith("    its last output line: ERROR: (gcloud.compute.")
    clock = time.strftime("%H:%M:%S", time.localtime(AT + 590))
    assert lines[4] == f"  Back-off: nothing is asked of the cloud until {clock}"
    rows = {line.split()[0]: line for line in lines if line.startswith("  gpu-")}
    assert rows["gpu-2"].split()[1:3] == ["taking", "servers"]
    assert "  3  " in rows["gpu-2"] and " 0/3 " in rows["gpu-2"]
    assert rows["gpu-2"].endswith("asked at 09:02 for 4 people in line")
    assert "being given back" in rows["gpu-4"] and "joining the swarm" in rows["gpu-6"]
    assert " unknown/unknown " in rows["gpu-5"]  # a booting machine's slices are not known yet
    assert "  3 machine(s) on their way, ready in about 4 minutes (about " in out
    assert "  At least 2 machine(s) now (minimum 0, maximum 4)" in lines
    group = "  The cloud's group: 6 machine(s), as the hub counts it; 1 fixed machine(s) of yours"
    assert f"{group} beside it" in lines
    [own] = [line for line in lines if line.startswith("  own-1 ")]
    assert "taking servers (fixed: yours, never given back)" in own
    [given_up] = [line for line in lines if line.startswith("  asked-3 ")]
    assert "given up (never joined; still in the cloud's group)" in given_up
    assert given_up.endswith("remove it in the cloud's console, the hub cannot name it")
    assert (
        "  Cost: 12.5 machine-hours, 20.1 of 37.5 slice-hours used (54%), about $31.25 at $2.5 "
        "an hour" in lines
    )
    assert lines[-2].endswith("grow: grow the group to 4 machines: 5 wait for 5 slices")
    assert lines[-1].endswith("drain gpu-4: first")  # newest first
    assert "snapshot is" not in out

    stale = status.render_fleet(fleet_view.read(text(), now=AT + 3600)).splitlines()
    assert stale[1].startswith("  The fleet's snapshot is 60 minutes old: the hub's fleet keeper")
    assert "Back-off" not in "\n".join(stale)  # over by now


def test_a_fleet_without_a_price_or_machines_says_so():
    from gpu_swarm_spawner import fleet_view

    from .fleet_snapshots import AT, text

    cost = {"machine_hours": 0.0, "slice_hours_offered": 0.0, "slice_hours_used": 0.0}
    fleet = fleet_view.read(text(machines=[], provider={}, coming=None, cost=cost), now=AT)
    out = status.render_fleet(fleet)
    assert "GPU machines the hub asks for (GPUHUB_FLEET)\n  none\n" in out
    assert "set GPUHUB_FLEET_PRICE_PER_HOUR for an estimate" in out
    assert "provider failed" not in out and "on their way" not in out


class Engine:
    """The manager's engine as ``read_fleet`` asks it: the hub's tasks, and a copy of a file
    out of a container (``get_archive``: a tar stream)."""

    def __init__(self, files: dict[tuple[str, str], bytes], tasks: list[dict]):
        import types

        self.files, self.tasks_ = files, tasks
        self.asked: list = []
        self.api = types.SimpleNamespace(tasks=self.tasks, get_archive=self.get_archive)

    def tasks(self, filters=None):
        self.asked.append(filters)
        return self.tasks_

    def get_archive(self, container, path):
        import io
        import tarfile
        import types

        from docker.errors import NotFound

        if (container, path) not in self.files:
            raise NotFound("no such file", response=types.SimpleNamespace(status_code=404))
        data = self.files[(container, path)]
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        raw = buffer.getvalue()
        return iter([raw[:100], raw[100:]]), {"name": info.name, "size": len(data)}


def hub_task(container):
    return {"Status": {"State": "running", "ContainerStatus": {"ContainerID": container}}}


def test_the_snapshot_is_copied_out_of_the_hubs_container():
    from .fleet_snapshots import AT, text

    path = "/srv/jupyterhub/data/dashboard/fleet.json"
    # a task without a container yet, one whose container is on another manager, the hub's
    tasks = [hub_task(""), hub_task("c-elsewhere"), hub_task("c-hub")]
    engine = Engine({("c-hub", path): text().encode()}, tasks)
    fleet = status.read_fleet(engine, "gpuhub", now=AT)
    assert fleet["machines"][0]["name"] == "gpu-2" and fleet["provider"]["last"]["failed"]
    assert engine.asked == [{"service": "gpuhub_hub", "desired-state": "running"}]
    # the fleet off (no file), the hub elsewhere or down, a file cut short: no fleet printed
    assert status.read_fleet(Engine({}, [hub_task("c-hub")]), "gpuhub", now=AT) is None
    assert status.read_fleet(Engine({}, []), "gpuhub", now=AT) is None
    cut = Engine({("c-hub", path): text().encode()[:40]}, [hub_task("c-hub")])
    assert status.read_fleet(cut, "gpuhub", now=AT) is None
