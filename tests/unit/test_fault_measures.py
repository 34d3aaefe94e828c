"""The fault suite's counts (tests/integration/aftermath.py) on made-up readings: a server
running twice and a slice given twice are seen, and nothing is seen where there is none."""

from tests.integration.aftermath import Copy, over_capacity, twice, waits

CAPACITY = {"GPU-a": 3, "GPU-b": 3}


def test_one_copy_each_is_neither_twice_nor_over():
    copies = [Copy("w1", "ann", "GPU-a", 1), Copy("w2", "bob", "GPU-b", 3)]
    assert twice(copies) == {}
    assert over_capacity(copies, CAPACITY) == {}


def test_a_server_on_two_machines_runs_twice():
    copies = [Copy("w1", "ann", "GPU-a", 1), Copy("w2", "ann", "GPU-b", 1)]
    assert twice(copies) == {"ann": 2}


def test_slices_beyond_a_gpus_own_are_given_twice():
    copies = [Copy("w1", "ann", "GPU-a", 3), Copy("w1", "bob", "GPU-a", 1)]
    assert over_capacity(copies, CAPACITY) == {"GPU-a": 1}
    # a GPU this reading does not know (its machine gone) is not counted against anything
    assert over_capacity([Copy("w9", "cy", "GPU-z", 9)], CAPACITY) == {}


def test_a_copy_waiting_for_the_earlier_one_to_end_is_neither_twice_nor_over():
    earlier, waiting = Copy("w1", "ann", "GPU-a", 3), Copy("w1", "ann", "GPU-a", 3, waiting=True)
    assert twice([earlier, waiting]) == {}
    assert over_capacity([earlier, waiting], CAPACITY) == {}
    assert twice([earlier, Copy("w1", "ann", "GPU-a", 3)]) == {"ann": 2}


class Engine:
    """An engine's ``api.top`` as Docker answers it for a container."""

    def __init__(self, *commands):
        self.api = self
        self.commands = commands

    def top(self, container):
        return {
            "Titles": ["UID", "PID", "PPID", "C", "STIME", "TTY", "TIME", "CMD"],
            "Processes": [["1000", "7", "1", "0", "10:00", "?", "0:00", c] for c in self.commands],
        }


def test_a_copy_waits_while_its_one_copy_check_runs():
    start = "/bin/sh /usr/local/bin/start-singleuser --ip=0.0.0.0"
    assert waits(Engine(start, "python3 -m one_copy 9"), "c1")
    assert not waits(Engine("/usr/bin/python3 /usr/local/bin/jupyterhub-singleuser"), "c1")
