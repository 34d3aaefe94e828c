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
