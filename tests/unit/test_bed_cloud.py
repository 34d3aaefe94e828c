"""The bed's cloud (tests/integration/bed_cloud.py) without the bed: its group's state, its
machines' lives and the faults a test injects, with the bed's machines behind a fake; and its
one-line client run by the hub's own runner (provider.py) against it over HTTP."""

from __future__ import annotations

import threading

import pytest

from deploy.steps import join_command
from gpu_swarm_spawner.provider import HUNG, QUOTA, Commands, Provider
from tests.integration import bed_cloud
from tests.integration.bed_cloud import (
    PENDING,
    REMOVED,
    RUNNING,
    STARTING,
    TAKEN_BACK,
    TERMINATED,
    BedCloud,
    machine_hours,
    recorded,
)

TOKEN = "SWMTKN-1-" + "0" * 50 + "-" + "a" * 25
#: what `make join-command` prints on the bed (deploy/steps.py's own format)
PRINTED = join_command("10.199.8.2", TOKEN, 3, "gpu-jupyterhub/singleuser:latest") + "\n"
LINE = ["./worker_setup/setup.sh", "--manager", "10.199.8.2:2377", "--token", TOKEN]
LINE += ["--slices-per-gpu", "3"]


class FakeBed:
    """The bed's machines, recorded: what bed.sh would have been asked."""

    def __init__(self, join_status: int = 0):
        self.calls: list[tuple] = []
        self.join_status = join_status

    def make(self, name):
        self.calls.append(("fresh", name))

    def join(self, name, words):
        self.calls.append(("join", name, tuple(words)))
        return self.join_status, "joined the swarm\n" if not self.join_status else "error: no\n"

    def destroy(self, name):
        self.calls.append(("remove --keep-node", name))

    def clean(self, name):
        self.calls.append(("remove", name))


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cloud():
    """A cloud whose background jobs (boots, removals) run when the test says (``run``)."""
    bed, clock, jobs = FakeBed(), Clock(), []
    waits: list[float] = []
    c = BedCloud(
        bed, PRINTED, boot_s=20, clock=clock, start=jobs.append, wait=lambda s, e: waits.append(s)
    )
    c.fake, c.clock_, c.jobs, c.waits = bed, clock, jobs, waits
    return c


def run(cloud) -> None:
    while cloud.jobs:
        cloud.jobs.pop(0)()


def states(cloud) -> dict[str, str]:
    return {i.name: i.state for i in cloud.instances.values()}


def test_a_grow_launches_machines_that_boot_then_run_the_printed_join_line(cloud):
    status, said = cloud.request("grow", ["2"])
    assert status == 0 and "0 -> 2 machines; launching fresh11, fresh12" in said
    assert states(cloud) == {"fresh11": PENDING, "fresh12": PENDING}
    assert cloud.size == 2 and cloud.fake.calls == []  # nothing made before the boot delay
    cloud.clock_.now = 1020.0
    run(cloud)
    assert cloud.waits == [20, 20]
    # the printed line word for word, without sudo, marked as the group's as the start-up
    # script marks it (a machine the hub may give back)
    joined = (*LINE, "--fleet-group")
    assert cloud.fake.calls == [
        ("fresh", "fresh11"),
        ("join", "fresh11", joined),
        ("fresh", "fresh12"),
        ("join", "fresh12", joined),
    ]
    assert states(cloud) == {"fresh11": RUNNING, "fresh12": RUNNING}
    one = cloud.instances["fresh11"]
    assert (one.asked, one.made, one.started, one.startup) == (1000.0, 1020.0, 1020.0, "joined")


def test_a_grow_never_shrinks_the_group_and_one_to_its_size_does_nothing(cloud):
    cloud.request("grow", ["2"])
    for count in ("2", "1", "0"):
        status, said = cloud.request("grow", [count])
        assert status == 0 and "2 machine(s) already; nothing to do" in said
    assert cloud.size == 2 and len(cloud.jobs) == 2
    assert cloud.request("grow", ["3"])[1].endswith("2 -> 3 machines; launching fresh13")


def test_a_remove_ends_that_machine_leaves_its_node_and_shrinks_the_group(cloud):
    cloud.request("grow", ["2"])
    run(cloud)
    cloud.clock_.now = 1600.0
    status, said = cloud.request("remove", ["fresh11"])
    assert status == 0 and said == "terminating fresh11; group gpu-bed: 1 machine(s)"
    run(cloud)
    assert cloud.fake.calls[-1] == ("remove --keep-node", "fresh11")
    one = cloud.instances["fresh11"]
    assert (one.state, one.ended, one.ended_by) == (TERMINATED, 1600.0, REMOVED)
    assert cloud.size == 1
    # again: done already; a machine it never had: the error a cloud gives, exit status 1
    assert cloud.request("remove", ["fresh11"])[0] == 0 and not cloud.jobs
    status, said = cloud.request("remove", ["w1"])
    assert status == 1 and said == "error: no machine w1 in group gpu-bed"


def test_a_machine_removed_while_it_boots_is_never_made(cloud):
    cloud.request("grow", ["1"])
    cloud.request("remove", ["fresh11"])
    run(cloud)
    assert cloud.fake.calls == [] and cloud.instances["fresh11"].made is None


def test_a_refused_grow_answers_the_clouds_recorded_text_and_launches_nothing(cloud):
    cloud.refuse_next_grow(recorded(bed_cloud.QUOTA_TEXT))
    status, said = cloud.request("grow", ["1"])
    assert status == 1 and "Quota 'GPUS_ALL_REGIONS' exceeded" in said
    assert cloud.size == 0 and not cloud.jobs
    assert "Quota 'GPUS_ALL_REGIONS' exceeded" in cloud.request("why", [])[1]
    assert cloud.request("grow", ["1"])[0] == 0 and cloud.size == 1  # the next one is heard


def test_a_machine_that_never_joins_is_made_and_counted_but_runs_no_join(cloud):
    cloud.never_join_next()
    cloud.request("grow", ["2"])
    run(cloud)
    assert [c[:2] for c in cloud.fake.calls] == [
        ("fresh", "fresh11"),
        ("fresh", "fresh12"),
        ("join", "fresh12"),
    ]
    assert cloud.instances["fresh11"].startup == "never ran"
    assert states(cloud) == {"fresh11": RUNNING, "fresh12": RUNNING} and cloud.size == 2


def test_a_join_that_fails_is_recorded_with_its_last_line():
    bed = FakeBed(join_status=1)
    cloud = BedCloud(bed, PRINTED, boot_s=0, start=lambda job: job(), wait=lambda s, e: None)
    cloud.request("grow", ["1"])
    assert cloud.instances["fresh11"].startup == "failed (exit status 1: error: no)"


def test_a_machine_that_cannot_be_made_ends_as_a_failed_launch():
    class Broken(FakeBed):
        def make(self, name):
            raise RuntimeError("bed.sh fresh failed:\nno space left on device")

    cloud = BedCloud(Broken(), PRINTED, boot_s=0, start=lambda job: job(), wait=lambda s, e: 0)
    cloud.request("grow", ["1"])
    one = cloud.instances["fresh11"]
    assert (one.state, one.ended_by) == (TERMINATED, "launch failed") and cloud.size == 0
    assert "no space left on device" in one.startup and "failed" in cloud.why()


def test_a_machine_taken_back_is_destroyed_unasked_and_leaves_the_group(cloud):
    cloud.request("grow", ["1"])
    run(cloud)
    cloud.clock_.now = 2000.0
    cloud.take_back("fresh11")
    run(cloud)
    one = cloud.instances["fresh11"]
    assert (one.state, one.ended, one.ended_by) == (TERMINATED, 2000.0, TAKEN_BACK)
    assert cloud.fake.calls[-1] == ("remove --keep-node", "fresh11") and cloud.size == 0
    assert [r.op for r in cloud.requests] == ["grow"]  # nobody asked for it
    assert cloud.request("remove", ["fresh11"])[1].startswith("fresh11 is already gone (taken")


def test_a_machine_ended_while_it_is_being_made_is_destroyed_once_made(cloud):
    def make_and_meanwhile_remove(name):
        cloud.fake.calls.append(("fresh", name))
        cloud.request("remove", [name])  # the hub's remove arrives during bed.sh fresh

    cloud.fake.make = make_and_meanwhile_remove
    cloud.request("grow", ["1"])
    run(cloud)
    assert cloud.fake.calls == [("fresh", "fresh11"), ("remove --keep-node", "fresh11")]
    assert cloud.instances["fresh11"].state == TERMINATED


def test_its_state_while_a_machine_starts(cloud):
    seen = []
    cloud.fake.join = lambda name, words: (seen.append(states(cloud)[name]), (0, ""))[1]
    cloud.request("grow", ["1"])
    run(cloud)
    assert seen == [STARTING]


def test_list_and_describe_show_the_size_and_each_machine(cloud):
    cloud.never_join_next()
    cloud.request("grow", ["2"])
    run(cloud)
    cloud.request("remove", ["fresh12"])
    assert cloud.request("list", [])[1].splitlines() == [
        "group gpu-bed: 1 machine(s)",
        "fresh11 running (never ran)",
        "fresh12 terminated (joined)",
    ]
    described = cloud.describe()
    assert described["size"] == 1
    assert [(m["name"], m["state"]) for m in described["machines"]] == [
        ("fresh11", RUNNING),
        ("fresh12", TERMINATED),
    ]


@pytest.mark.parametrize(("op", "args"), [("grow", []), ("grow", ["many"]), ("remove", [])])
def test_a_request_it_cannot_read_is_refused_with_its_usage(cloud, op, args):
    status, said = cloud.request(op, args)
    assert status == 2 and "usage: grow COUNT | remove MACHINE" in said


def test_close_removes_every_machine_it_made_node_and_all(cloud):
    cloud.request("grow", ["2"])
    run(cloud)
    cloud.request("remove", ["fresh11"])
    cloud.close()
    assert ("remove", "fresh11") in cloud.fake.calls and ("remove", "fresh12") in cloud.fake.calls
    assert cloud.size == 0


def test_machine_hours_count_each_machine_from_asked_to_ended_within_the_window():
    spans = [(0.0, 3600.0), (1800.0, None), (-3600.0, 1800.0), (7200.0, 9000.0)]
    # 1 h + 1 h (until the window's end) + 0.5 h (from the window's start) + 0 h
    assert machine_hours(spans, 0.0, 5400.0) == pytest.approx(2.5)
    assert machine_hours([], 0.0, 5400.0) == 0.0


def test_the_join_line_must_be_one_the_cloud_init_takes():
    with pytest.raises(ValueError, match="not a join line"):
        BedCloud(FakeBed(), "echo hello\n")


# ---- over HTTP, with the hub's runner ---------------------------------------------------------


@pytest.fixture
def served():
    cloud = BedCloud(FakeBed(), PRINTED, boot_s=0, start=lambda job: job(), wait=lambda s, e: 0)
    server = bed_cloud.serve(cloud, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield cloud, url
    cloud.closing.set()
    server.shutdown()


def provider_of(url: str, timeout: float = 20) -> Provider:
    names = bed_cloud.commands(url)
    return Provider(
        Commands(
            grow=names["GPUHUB_FLEET_GROW_COMMAND"],
            remove=names["GPUHUB_FLEET_REMOVE_COMMAND"],
            why=names["GPUHUB_FLEET_WHY_COMMAND"],
            timeout=timeout,
            attempts=1,
        )
    )


async def test_the_one_line_commands_grow_and_remove_like_a_clouds_tool(served):
    cloud, url = served
    grown = await provider_of(url).grow(1)
    assert grown.ok and "launching fresh11" in grown.output, grown
    assert cloud.instances["fresh11"].startup == "joined"
    removed = await provider_of(url).remove("fresh11")
    assert removed.ok and cloud.size == 0
    unknown = await provider_of(url).remove("w1")
    assert (unknown.ok, unknown.status) == (False, 1)
    assert "no machine w1 in group" in unknown.told()


async def test_a_refusal_reaches_the_hub_as_its_kind_with_exit_status_1(served):
    cloud, url = served
    cloud.refuse_next_grow(recorded(bed_cloud.QUOTA_TEXT))
    refused = await provider_of(url).grow(1)
    assert (refused.ok, refused.kind, refused.status) == (False, QUOTA, 1), refused
    assert "Quota 'GPUS_ALL_REGIONS' exceeded" in refused.told()
    why = await provider_of(url).why()
    assert (why.ok, why.kind) == (False, QUOTA)


async def test_a_cloud_that_never_answers_is_a_command_that_hangs(served):
    cloud, url = served
    cloud.hang_next("grow")
    hung = await provider_of(url, timeout=1.5).grow(1)
    assert (hung.ok, hung.kind, hung.status) == (False, HUNG, None), hung
    assert [(r.op, r.args, r.status) for r in cloud.requests] == [("grow", ["1"], None)]
    assert cloud.size == 0  # nothing was done
    assert (await provider_of(url).grow(1)).ok  # the next is answered


def test_the_clients_code_has_no_quote_the_shell_would_end_it_at():
    assert "'" not in bed_cloud.CLIENT
    assert "{count}" not in bed_cloud.CLIENT and "{machine}" not in bed_cloud.CLIENT


def test_hung_requests_are_let_go_when_the_cloud_closes(served):
    cloud, url = served
    cloud.hang_next("why")
    import urllib.request

    errors = []

    def ask():
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/why", data=b"[]"), timeout=10)
        except Exception as e:
            errors.append(e)

    asker = threading.Thread(target=ask)
    asker.start()
    cloud.closing.set()
    asker.join(10)
    assert not asker.is_alive() and errors  # closed without an answer


def test_close_waits_for_a_machine_being_made_before_removing_it():
    made, release = threading.Event(), threading.Event()

    class Slow(FakeBed):
        def make(self, name):
            made.set()
            release.wait(10)
            super().make(name)

    bed = Slow()
    cloud = BedCloud(bed, PRINTED, boot_s=0, wait=lambda s, e: None)  # boots in threads
    cloud.request("grow", ["1"])
    assert made.wait(10)
    closer = threading.Thread(target=cloud.close)
    closer.start()
    closer.join(1.0)
    assert closer.is_alive() and ("remove", "fresh11") not in bed.calls  # still being made
    release.set()
    closer.join(10)
    assert bed.calls[0] == ("fresh", "fresh11") and bed.calls[-1] == ("remove", "fresh11")
    assert not any(c[0] == "join" for c in bed.calls)  # closing: no start-up after all
