import pytest

from gpu_swarm_spawner.inventory import GPU
from gpu_swarm_spawner.placement import (
    candidates,
    choose,
    cpu_node,
    refusal_message,
    slices_taken,
)


def gpu(uuid, node, slices, used):
    return GPU(uuid, node, node, slices, used)


def test_pack_fills_the_next_gpu_on_the_same_node():
    # alpha's first GPU is full: pack continues on alpha, spread goes to the idle node
    cluster = [
        gpu("GPU-a0", "alpha", 3, 3),
        gpu("GPU-a1", "alpha", 3, 0),
        gpu("GPU-b0", "beta", 3, 0),
        gpu("GPU-b1", "beta", 3, 0),
    ]
    for n in range(10):
        assert choose(cluster, 1, "pack", seed=f"u{n}").uuid == "GPU-a1"
        assert choose(cluster, 1, "spread", seed=f"u{n}").node_name == "beta"


def test_heterogeneous_gpus_spread_by_free_slices():
    cluster = [gpu("GPU-k80", "old", 2, 0), gpu("GPU-h100", "new", 7, 3)]
    assert choose(cluster, 1, "spread").uuid == "GPU-h100"  # 4 free beats 2 free
    assert choose(cluster, 1, "pack").uuid == "GPU-k80"
    assert choose(cluster, 3, "pack").uuid == "GPU-h100"  # the K80 cannot hold 3


CLUSTER = [
    gpu("GPU-a0", "alpha", 3, 1),
    gpu("GPU-a1", "alpha", 3, 2),
    gpu("GPU-b0", "beta", 3, 0),
    gpu("GPU-b1", "beta", 8, 8),
]


def test_spread_picks_the_gpu_with_most_free_slices():
    assert choose(CLUSTER, 1, "spread").uuid == "GPU-b0"


def test_pack_picks_the_busiest_gpu_that_still_fits():
    assert choose(CLUSTER, 1, "pack").uuid == "GPU-a1"
    assert choose(CLUSTER, 2, "pack").uuid == "GPU-a0"


def test_spread_is_the_default_and_ties_break_by_node_then_uuid():
    tied = [gpu("GPU-z", "beta", 3, 0), gpu("GPU-y", "alpha", 3, 0), gpu("GPU-x", "alpha", 3, 0)]
    assert [g.uuid for g in candidates(tied, 1)] == ["GPU-x", "GPU-y", "GPU-z"]


def test_the_home_machine_comes_first_when_it_has_room():
    # spread alone picks beta; alice's home volume is on alpha
    assert choose(CLUSTER, 1, "spread", prefer_node="alpha").uuid == "GPU-a0"
    assert choose(CLUSTER, 2, "spread", prefer_node="alpha").uuid == "GPU-a0"
    # alpha cannot hold 3 on one GPU: elsewhere
    assert choose(CLUSTER, 3, "spread", prefer_node="alpha").uuid == "GPU-b0"
    assert choose(CLUSTER, 1, "spread", prefer_node="gone").uuid == "GPU-b0"


def test_a_request_is_served_from_one_gpu_only():
    # 4 slices are free in all, but no single GPU has 3
    split = [gpu("GPU-a0", "alpha", 3, 1), gpu("GPU-a1", "alpha", 3, 1)]
    assert choose(split, 3, "spread") is None
    assert choose(split, 2, "spread").uuid == "GPU-a0"


def test_full_gpu_request_needs_an_empty_gpu():
    assert choose(CLUSTER, 3, "spread").uuid == "GPU-b0"
    assert choose(CLUSTER, 3, "pack").uuid == "GPU-b0"


def test_a_whole_gpu_is_an_unused_one_with_however_many_slices_it_has():
    # with --slice-memory a large GPU advertises more slices than a small one
    mixed = [
        gpu("GPU-s0", "small", 3, 1),
        gpu("GPU-l0", "large", 20, 0),
        gpu("GPU-s1", "small", 3, 0),
    ]
    ranked = candidates(mixed, None, "spread")
    assert [g.uuid for g in ranked] == ["GPU-l0", "GPU-s1"]  # only unused ones, most slices first
    assert slices_taken(ranked[0], None) == 20 and slices_taken(ranked[1], None) == 3
    assert slices_taken(ranked[1], 1) == 1
    assert choose([gpu("GPU-a0", "alpha", 20, 1)], None) is None  # one slice taken: not whole


def test_nothing_free():
    full = [gpu("GPU-a0", "alpha", 3, 3)]
    assert choose(full, 1) is None
    assert choose([], 1) is None


def test_bad_arguments_say_what_to_write():
    with pytest.raises(ValueError, match="spread, pack"):
        choose(CLUSTER, 1, "random")
    with pytest.raises(ValueError, match="at least 1"):
        choose(CLUSTER, 0)


@pytest.mark.parametrize(
    "gpus, slices, expected",
    [
        ([], 1, "no GPU machine is connected"),
        ([gpu("GPU-a0", "alpha", 3, 3), gpu("GPU-a1", "alpha", 3, 3)], 1, "(6/6)"),
        ([gpu("GPU-a0", "alpha", 3, 0)], 4, "largest GPU here has 3"),
        ([gpu("GPU-a0", "alpha", 3, 1), gpu("GPU-a1", "alpha", 3, 1)], 3, "4 of 6 slices are free"),
        ([gpu("GPU-a0", "alpha", 3, 1)], None, "A full GPU needs a GPU that nobody is using"),
        ([gpu("GPU-a0", "alpha", 3, 3)], None, "(3/3)"),
    ],
)
def test_refusal_messages_explain_the_situation(gpus, slices, expected):
    message = refusal_message(gpus, slices)
    assert expected in message
    assert "organizer" in message


def test_a_seed_spreads_simultaneous_users_over_tied_gpus():
    tied = [gpu(f"GPU-{i}", "alpha", 3, 0) for i in range(6)]
    picks = {choose(tied, 1, "spread", seed=f"user{n}").uuid for n in range(30)}
    assert len(picks) >= 4, picks
    # but the same user always gets the same answer from the same inventory
    assert choose(tied, 1, seed="ann") == choose(list(reversed(tied)), 1, seed="ann")


def test_a_seed_never_overrides_the_policy():
    cluster = [gpu("GPU-a", "alpha", 3, 2), gpu("GPU-b", "beta", 3, 0)]
    for n in range(20):
        assert choose(cluster, 1, "spread", seed=f"u{n}").uuid == "GPU-b"
        assert choose(cluster, 1, "pack", seed=f"u{n}").uuid == "GPU-a"


def test_a_server_without_a_gpu_goes_to_the_machine_with_the_most_free_slices_in_all():
    """Free slices add up over a machine's GPUs (found by mutation testing: a machine's
    count was its last GPU's); the participant's home wins when it is a GPU machine."""
    gpus = [gpu("a0", "alpha", 3, 1), gpu("a1", "alpha", 3, 1), gpu("b0", "beta", 3, 0)]
    assert cpu_node(gpus) == "alpha"  # 4 free against beta's 3
    assert cpu_node(gpus, home="beta") == "beta"
    assert cpu_node(gpus, home="gone") == "alpha" and cpu_node([]) == ""
