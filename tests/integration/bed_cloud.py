"""The bed's cloud: a local stand-in for a cloud's group of GPU machines (an AWS Auto Scaling
group, a Google Cloud managed instance group, an Azure VM scale set) whose machines are the test
bed's fresh machines (tests/bed/bed.sh fresh), for the hub's fleet (GPUHUB_FLEET=on,
docs/autoscaling.md) on the bed. It listens on the bed's bridge, where the hub's container
reaches this machine (as it reaches the fake GitHub, fake_github.py).

The group, as the clouds keep theirs:

- **grow to N** makes the group N machines and never smaller (a group already that large is
  left alone, as the recipes in docs/providers/ do). Each new machine is ``pending`` for the
  boot delay, then made (``bed.sh fresh NAME``: its own root filesystem and engine, the bed's
  shared storage mounted) and ``starting`` while it runs its start-up script, then
  ``running``. The start-up script is what the cloud-init user data of ``python3 -m
  deploy.cloud_init`` runs at first boot: the join line ``make join-command`` printed, word
  for word, with the cloud group's mark ``--fleet-group`` added (both by
  ``cloud_init.join_words``), plus what a bed machine needs besides, which a
  cloud's machine would not: the single-user image as a file (the bed has no registry) and
  simulated GPUs (it has none), with a machine id of its own for their UUIDs.
- **remove NAME** ends that machine (``bed.sh remove NAME --keep-node``: destroyed; its swarm
  node is left behind, down, as a cloud leaves it; removing it is the hub's part); the group
  is one smaller. A machine already ended is answered as done; a name never in the group is
  an error.
- **why** prints the group's latest activity (a launch, a refusal), as ``aws autoscaling
  describe-scaling-activities`` or ``gcloud ... list-errors`` do.
- **list** and **describe**: the group's size and its machines with their states.

What the test makes go wrong (``refuse_next_grow``, ``never_join_next``, ``hang_next``,
``take_back``): the next grow answered with a cloud's recorded refusal (tests/unit/providers/)
and exit status 1; a machine made whose start-up script never runs; a command that never
answers; a machine destroyed without being asked (spot). The cloud keeps its own record of
every request and every machine (``requests``, ``instances``): when each was asked for and
ended, from which the machine-hours are counted (``machine_hours``).

The hub's commands are one-line clients (``commands``): ``python3 -c CLIENT URL grow {count}``
runs by ``/bin/sh`` in the hub's container (GPUHUB_FLEET_IMAGE empty), prints the cloud's
answer and exits with its status, as a cloud's command-line tool does. By hand:

    python -m tests.integration.bed_cloud --host 10.199.8.1 --port 18950 --boot 20
    python3 -c "$(python -m tests.integration.bed_cloud --print-client)" \\
        http://10.199.8.1:18950 grow 1
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from deploy import cloud_init

from .hub import BED_RUN, REPO

BED_SH = REPO / "tests/bed/bed.sh"
#: The clouds' recorded refusals (tests/unit/providers/SOURCES.md says where each is from).
RECORDED = REPO / "tests/unit/providers"
QUOTA_TEXT = "gcp/quota.txt"
NO_CAPACITY_TEXT = "gcp/zone-exhausted.txt"

#: A machine's states, as the cloud reports them.
PENDING, STARTING, RUNNING, TERMINATED = "pending", "starting", "running", "terminated"
#: How a machine ended: asked by the remove command, or taken back by the cloud (spot).
REMOVED, TAKEN_BACK = "removed", "taken back"
#: The requests the hub's commands make; the others are the test's own.
OPS = ("grow", "remove", "why", "list", "describe")

#: The one-line client the provider's commands run (python3's standard library only: the hub's
#: image has no curl): POST /OP with the arguments, print the answer, exit with its status. It
#: has no time limit of its own: a cloud that never answers keeps it waiting, as a hung tool
#: does, until the hub's command timeout kills it.
CLIENT = (
    "import json,sys,urllib.request as u;"
    "r=u.Request(sys.argv[1]+'/'+sys.argv[2],data=json.dumps(sys.argv[3:]).encode(),"
    "headers={'Content-Type':'application/json'});"
    "a=json.load(u.urlopen(r));print(a['output']);sys.exit(a['status'])"
).replace("'", '"')


def recorded(name: str) -> str:
    """A cloud's recorded refusal (``gcp/quota.txt``), as its tool printed it."""
    return (RECORDED / name).read_text()


def commands(url: str) -> dict[str, str]:
    """The provider's commands (GPUHUB_FLEET_GROW_COMMAND, ..._REMOVE_COMMAND, ..._WHY_COMMAND)
    that drive the cloud at ``url`` from the hub's container."""
    client = f"python3 -c {shlex.quote(CLIENT)} {shlex.quote(url)}"
    return {
        "GPUHUB_FLEET_GROW_COMMAND": f"{client} grow {{count}}",
        "GPUHUB_FLEET_REMOVE_COMMAND": f"{client} remove {{machine}}",
        "GPUHUB_FLEET_WHY_COMMAND": f"{client} why",
    }


@dataclass
class Instance:
    """One machine of the group, as the cloud records it (epoch seconds)."""

    name: str
    state: str
    asked: float  # the group was grown for it: the cloud counts it from here
    made: float | None = None  # its machine exists (bed.sh fresh done)
    started: float | None = None  # its start-up script ended (joined or not)
    ended: float | None = None  # removed or taken back: the cloud counts it until here
    ended_by: str = ""  # REMOVED or TAKEN_BACK
    startup: str = ""  # how its start-up script went: "joined", "failed (...)", "never ran"
    silent: bool = False  # its start-up script never runs (a fault)
    destroyed: bool = False  # bed.sh remove ran (or runs) for it


@dataclass
class Request:
    """One request a command made, and its answer (``status`` None: never answered)."""

    at: float
    op: str
    args: list[str]
    status: int | None = None
    output: str = ""


class Bed:
    """The bed's machines, driven through tests/bed/bed.sh (run by root, the bed up)."""

    def __init__(self, simulate_gpus: int = 2, run: Callable[..., str] | None = None):
        self.simulate_gpus = simulate_gpus
        self.run = run or self._bed_sh
        self.tar = ""  # where the image file lies on a machine, once made
        self._image = threading.Lock()

    @staticmethod
    def _bed_sh(*args: str, check: bool = True) -> str:
        result = subprocess.run(
            ["bash", str(BED_SH), *args], capture_output=True, text=True, timeout=900
        )
        if check and result.returncode:
            said = result.stdout + result.stderr
            raise RuntimeError(f"bed.sh {' '.join(args[:2])} failed:\n{said}")
        return result.stdout + result.stderr

    def prepare(self) -> None:
        """The image file made now (``make image-tar``), so that no machine's boot waits for
        it; each machine then gets a copy."""
        host = os.environ.get("GPUHUB_IMAGE_TAR", "")
        if host:
            subprocess.run(["make", "-s", "image-tar"], cwd=REPO, check=True, capture_output=True)
            self.tar = f"/root/{Path(host).name}"  # where bed.sh image-tar puts it

    def make(self, name: str) -> None:
        self.run("fresh", name)

    def copy_image(self, name: str) -> str:
        """The single-user image as a file on machine ``name`` (as an organizer copies it):
        made once (``bed.sh image-tar``: ``make image-tar``, then copied), then copied from
        here into the machine's root filesystem; its path there."""
        with self._image:
            host = os.environ.get("GPUHUB_IMAGE_TAR", "")
            if not self.tar or not host:
                self.tar = self.run("image-tar", name).split()[-1]
                return self.tar
            shutil.copyfile(host, Path(BED_RUN, f"{name}.root", self.tar.lstrip("/")))
            return self.tar

    def join(self, name: str, words: list[str]) -> tuple[int, str]:
        """The start-up script's join on machine ``name``: its exit status and output."""
        extra = ["--image-tar", self.copy_image(name)]
        extra += ["--simulate-gpus", str(self.simulate_gpus), "--machine-id", f"bed-{name}"]
        result = subprocess.run(
            ["bash", str(BED_SH), "on", name, shlex.join([*words, *extra])],
            capture_output=True,
            text=True,
            timeout=900,
        )
        return result.returncode, result.stdout + result.stderr

    def destroy(self, name: str) -> None:
        """The machine gone, its swarm node left (down), as a cloud leaves it."""
        self.run("remove", name, "--keep-node", check=False)

    def clean(self, name: str) -> None:
        """The machine and its swarm node gone (after a test)."""
        self.run("remove", name, check=False)


def _thread(job: Callable[[], None]) -> None:
    threading.Thread(target=job, daemon=True).start()


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


class BedCloud:
    """One group of the bed's machines; see the module's text. ``printed``: what ``make
    join-command`` printed (the launch template's user data is made from it); ``start`` runs a
    machine's boot in the background (a thread; the unit tests run it when they choose);
    ``wait(seconds, event)`` the boot delay, cut short when ``event`` is set."""

    def __init__(
        self,
        bed: Bed,
        printed: str,
        boot_s: float = 20.0,
        group: str = "gpu-bed",
        first: int = 11,
        clock: Callable[[], float] = time.time,
        start: Callable[[Callable[[], None]], None] = _thread,
        wait: Callable[[float, threading.Event], object] | None = None,
    ):
        self.bed = bed
        self.words = cloud_init.join_words(printed)
        self.boot_s = boot_s
        self.group = group
        self.clock = clock
        self.start = start
        self.wait = wait or (lambda seconds, event: event.wait(seconds))
        self.instances: dict[str, Instance] = {}
        self.requests: list[Request] = []
        self.activities: list[tuple[float, str]] = []
        self.closing = threading.Event()
        self._next = first
        self._lock = threading.RLock()
        self._refusals: list[str] = []
        self._silent = 0
        self._hangs: dict[str, int] = {}
        self._cancel: dict[str, threading.Event] = {}
        self._busy: set[str] = set()  # machines being made or running their start-up

    # ---- what the commands ask --------------------------------------------------------------

    @property
    def size(self) -> int:
        """The group's size: its machines not ended."""
        with self._lock:
            return sum(1 for i in self.instances.values() if i.state != TERMINATED)

    def hangs(self, op: str, args: list[str]) -> bool:
        """Whether this request is one to leave unanswered (recorded as such)."""
        with self._lock:
            if self._hangs.get(op, 0) > 0:
                self._hangs[op] -= 1
                self.requests.append(Request(self.clock(), op, list(args)))
                return True
        return False

    def request(self, op: str, args: list[str]) -> tuple[int, str]:
        """A command's request, answered: (exit status, what the tool prints); recorded."""
        with self._lock:
            call = Request(self.clock(), op, list(args))
            self.requests.append(call)
            try:
                status, output = self._answer(op, args)
            except (ValueError, IndexError):
                usage = "usage: grow COUNT | remove MACHINE | why | list | describe"
                status, output = 2, f"error: {op} {' '.join(args)}: {usage}"
            call.status, call.output = status, output
            return status, output

    def _answer(self, op: str, args: list[str]) -> tuple[int, str]:
        if op == "grow":
            (count,) = args
            return self.grow(int(count))
        if op == "remove":
            (name,) = args
            return self.remove(name)
        if op == "why":
            return 0, self.why()
        if op == "list":
            return 0, self.listing()
        if op == "describe":
            return 0, json.dumps(self.describe(), indent=1)
        raise ValueError(op)

    def grow(self, count: int) -> tuple[int, str]:
        if count < 0:
            raise ValueError(count)
        now = self.clock()
        if self._refusals:
            text = self._refusals.pop(0)
            self.activities.append((now, text))
            return 1, text
        size = self.size
        if count <= size:
            return 0, f"group {self.group}: {size} machine(s) already; nothing to do"
        new = []
        for _ in range(count - size):
            name = f"fresh{self._next}"
            self._next += 1
            new.append(Instance(name, PENDING, asked=now, silent=self._silent > 0))
            self._silent = max(self._silent - 1, 0)
            self.instances[name] = new[-1]
            self._cancel[name] = threading.Event()
        names = ", ".join(i.name for i in new)
        self.activities.append((now, f"Launching {names}: the group from {size} to {count}"))
        for instance in new:
            self.start(lambda instance=instance: self._boot(instance))
        return 0, f"group {self.group}: {size} -> {count} machines; launching {names}"

    def remove(self, name: str) -> tuple[int, str]:
        instance = self.instances.get(name)
        if instance is None:
            return 1, f"error: no machine {name} in group {self.group}"
        if instance.state == TERMINATED:
            return (
                0,
                f"{name} is already gone ({instance.ended_by}); group {self.group}: {self.size}",
            )
        self._end(instance, REMOVED)
        self.activities.append((self.clock(), f"Terminating {name}: removed on request"))
        return 0, f"terminating {name}; group {self.group}: {self.size} machine(s)"

    def why(self) -> str:
        if not self.activities:
            return f"group {self.group}: no activity yet"
        return self.activities[-1][1]

    def listing(self) -> str:
        rows = [f"group {self.group}: {self.size} machine(s)"]
        rows += [
            f"{i.name} {i.state}{f' ({i.startup})' if i.startup else ''}"
            for i in self.instances.values()
        ]
        return "\n".join(rows)

    def describe(self) -> dict:
        with self._lock:
            machines = [asdict(i) for i in self.instances.values()]
        return {"group": self.group, "size": self.size, "machines": machines}

    # ---- a machine's life -------------------------------------------------------------------

    def _end(self, instance: Instance, how: str) -> None:
        """Ended (under the lock): counted until now; destroyed in the background when made."""
        instance.state, instance.ended, instance.ended_by = TERMINATED, self.clock(), how
        self._cancel[instance.name].set()
        if instance.made is not None and not instance.destroyed:
            instance.destroyed = True
            self.start(lambda: self.bed.destroy(instance.name))

    def _boot(self, instance: Instance) -> None:
        name = instance.name
        self.wait(self.boot_s, self._cancel[name])
        with self._lock:
            if instance.state == TERMINATED or self.closing.is_set():
                return
            self._busy.add(name)
        try:
            self._make_and_start(instance)
        finally:
            with self._lock:
                self._busy.discard(name)

    def _make_and_start(self, instance: Instance) -> None:
        name = instance.name
        try:
            self.bed.make(name)
        except Exception as e:  # the cloud could not launch it: ended, and said so
            with self._lock:
                instance.startup = f"not made: {last_line(str(e))}"
                instance.destroyed = True  # whatever was made goes at close()
                if instance.state != TERMINATED:
                    self._end(instance, "launch failed")
                self.activities.append((self.clock(), f"Launching {name} failed: {e}"))
            return
        with self._lock:
            instance.made = self.clock()
            # ended while it was being made, or the cloud closes
            ended = instance.state == TERMINATED or self.closing.is_set()
            destroy = ended and not instance.destroyed
            instance.destroyed = instance.destroyed or ended
            if not ended:
                instance.state = STARTING
            silent = instance.silent
        if destroy:
            self.bed.destroy(name)
        if ended:
            return
        status: int | None = None
        output = ""
        if not silent:
            try:
                status, output = self.bed.join(name, self.words)
            except Exception as e:  # subprocess' time limit
                status, output = -1, str(e)
        with self._lock:
            instance.started = self.clock()
            if status is None:
                instance.startup = "never ran"
            elif status == 0:
                instance.startup = "joined"
            else:
                instance.startup = f"failed (exit status {status}: {last_line(output)})"
            if instance.state == STARTING:
                instance.state = RUNNING

    # ---- what the test makes go wrong -------------------------------------------------------

    def refuse_next_grow(self, text: str) -> None:
        """The next grow is answered with ``text`` (a recorded refusal) and exit status 1."""
        with self._lock:
            self._refusals.append(text)

    def never_join_next(self, count: int = 1) -> None:
        """The next ``count`` machines are made, but their start-up script never runs."""
        with self._lock:
            self._silent += count

    def hang_next(self, op: str = "grow", count: int = 1) -> None:
        """The next ``count`` requests of ``op`` are never answered."""
        with self._lock:
            self._hangs[op] = self._hangs.get(op, 0) + count

    def take_back(self, name: str) -> None:
        """Machine ``name`` destroyed without being asked (a spot machine taken back)."""
        with self._lock:
            instance = self.instances[name]
            if instance.state != TERMINATED:
                self._end(instance, TAKEN_BACK)
                self.activities.append((self.clock(), f"{name} was taken back (spot)"))

    # ---- records ----------------------------------------------------------------------------

    def asked(self, op: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.op == op]

    def spans(self) -> list[tuple[float, float | None]]:
        """(asked, ended) of every machine the cloud counted (ended None: still there)."""
        with self._lock:
            return [(i.asked, i.ended) for i in self.instances.values()]

    def close(self, wait_s: float = 900) -> None:
        """Every machine ever made removed, swarm node and all (once those being made or
        joining are done, within ``wait_s``); hung requests let go."""
        self.closing.set()
        for event in list(self._cancel.values()):
            event.set()
        deadline = time.monotonic() + wait_s
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.5)
        with self._lock:
            for instance in self.instances.values():
                if instance.state != TERMINATED:
                    instance.state, instance.ended = TERMINATED, self.clock()
                    instance.ended_by = instance.ended_by or REMOVED
                self._cancel[instance.name].set()
            names = list(self.instances)
        for name in names:
            self.bed.clean(name)


def machine_hours(spans: Iterable[tuple[float, float | None]], start: float, end: float) -> float:
    """The hours machines existed between ``start`` and ``end`` (epoch seconds), from their
    (asked, ended) spans; a span not ended counts until ``end``."""
    total = 0.0
    for asked, ended in spans:
        stop = end if ended is None else min(ended, end)
        total += max(0.0, stop - max(asked, start))
    return total / 3600


# ---- over HTTP ------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    cloud: BedCloud  # set on the class made by serve()

    def log_message(self, format, *args):  # quiet: the tests read cloud.requests
        pass

    def _json(self, code: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        op = self.path.strip("/")
        length = int(self.headers.get("Content-Length", "0"))
        try:
            args = [str(a) for a in json.loads(self.rfile.read(length) or b"[]")]
        except (ValueError, TypeError):
            return self._json(400, {"status": 2, "output": "error: the body is a JSON list"})
        if op not in OPS:
            return self._json(404, {"status": 2, "output": f"error: no such command {op!r}"})
        if self.cloud.hangs(op, args):
            self.cloud.closing.wait()  # never answered while the cloud runs
            self.close_connection = True
            return None
        status, output = self.cloud.request(op, args)
        return self._json(200, {"status": status, "output": output})

    def do_GET(self):
        if self.path.strip("/") == "describe":
            return self._json(200, self.cloud.describe())
        return self._json(404, {"status": 2, "output": "error: GET /describe only"})


def serve(cloud: BedCloud, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``cloud`` in a daemon thread; ``shutdown()`` the returned server to stop."""
    handler = type("BedCloudHandler", (Handler,), {"cloud": cloud})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def join_command() -> str:
    """What ``make join-command`` prints for the bed's swarm now (the tests' environment)."""
    return subprocess.run(
        ["make", "-s", "join-command"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18950)
    parser.add_argument("--boot", type=float, default=20.0, help="seconds before a machine is made")
    parser.add_argument("--print-client", action="store_true", help="print CLIENT and exit")
    args = parser.parse_args(argv)
    if args.print_client:
        print(CLIENT)
        return
    cloud = BedCloud(Bed(), join_command(), boot_s=args.boot)
    server = serve(cloud, args.host, args.port)
    url = f"http://{args.host}:{args.port}"
    print(f"the bed's cloud at {url} (Ctrl-C stops it and removes its machines)")
    for name, command in commands(url).items():
        print(f"{name}={shlex.quote(command)}")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
        cloud.close()


if __name__ == "__main__":
    main()
