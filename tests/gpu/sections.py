"""The sections of tests/gpu/prove.sh: each reads the GPU one way and records what it saw.

tests/gpu/run.py runs each in a process of its own, with a time limit, so that a hang, a crash
or a stray CUDA process of one is stopped with it and the next section starts clean:

    python3 -m tests.gpu.sections NAME --work DIR --result FILE [--nvidia-smi PATH]
        [--nvml-fixture FILE]

(``--nvml-fixture``: run.py put the tests' fake NVML over FILE on this process's PYTHONPATH;
the CUDA processes it starts then say what GPU memory they stand for.)

A section fills a ``prove.Section`` (checks and findings) and writes it as JSON to ``--result``.
It raises ``Skip`` when it cannot run here (no framework, no MPS), which is recorded with the
reason; anything else it raises is recorded as a failure, and the next section runs all the
same. The CUDA processes it starts are ``holder.py`` children (``Holder``): each is closed or
killed before the section ends.

Nothing here changes the GPU's settings (MIG mode, compute mode, clocks), and the only process
ever signalled is one a section started: the guard's enforcement runs with a narrowed target
(``guard_enforce``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from gpu_swarm_spawner import contract
from worker_setup import gpus, guard, guard_attribution, slicing, telemetry, usable
from worker_setup import guard_policy as policy

from . import prove
from .prove import FAIL, PASS, SKIP, Check

REPO = Path(__file__).resolve().parents[2]
HOLDER = Path(__file__).resolve().parent / "holder.py"
SINGLEUSER = REPO / "images" / "singleuser"
MIB = 1 << 20
#: A UUID on no GPU: CUDA_VISIBLE_DEVICES set to it must leave a framework no device.
NO_SUCH_GPU = "GPU-00000000-0000-0000-0000-000000000000"
#: The container the guard's enforcement is told its target runs in (it runs in none).
TARGET_CONTAINER = "0f" * 32
#: What the memory caps are tried with: the budget of one slice of --slice-memory 4GiB.
SLICE_MEMORY_MB = 4096


class Skip(Exception):
    """The section cannot run here; the message says why."""


class HolderFailed(RuntimeError):
    """A holder did not start, did not answer in time, or ended; the message says which."""


class Context:
    """What every section is given: where to write, which tools, how long it has."""

    def __init__(self, work: Path, nvidia_smi: str, fixture: str, seconds: float):
        self.work = work
        self.nvidia_smi = nvidia_smi
        self.fixture = fixture
        self.python = sys.executable
        self.deadline = time.monotonic() + seconds

    def left(self, most: float) -> float:
        """Seconds a wait may take: ``most``, less when the section's time runs out first."""
        return max(1.0, min(most, self.deadline - time.monotonic() - 2))

    def nvml(self):
        """NVML started, where the join gets it (worker_setup.gpus.load_nvml): the tests' fake
        NVML only where run.py's ``--nvml-fixture`` put it there."""
        nvml = gpus.load_nvml()
        nvml.nvmlInit()
        return nvml

    def smi(self, *args: str, timeout: float = 20, **kwargs) -> subprocess.CompletedProcess:
        """``nvidia-smi ARGS``; raises Skip when it is not installed."""
        try:
            return subprocess.run(
                [self.nvidia_smi, *args],
                capture_output=True,
                text=True,
                timeout=self.left(timeout),
                check=False,
                **kwargs,
            )
        except FileNotFoundError:
            raise Skip(f"{self.nvidia_smi} is not installed") from None

    def compute_apps(self) -> list[dict]:
        done = self.smi(f"--query-compute-apps={prove.QUERY_APPS}", "--format=csv,noheader,nounits")
        return prove.parse_compute_apps(done.stdout) if done.returncode == 0 else []

    def fake_env(self, mb: int) -> dict:
        """With the fake NVML, what makes a holder count as using ``mb`` MiB (its CUDA context
        stands in for nothing); nothing on a real GPU."""
        return {"FAKE_NVML_GPU_MB": str(mb + 300)} if self.fixture else {}


def have(framework: str) -> bool:
    """Whether this python can import ``framework`` (found, not imported: that takes seconds)."""
    try:
        return importlib.util.find_spec(framework) is not None
    except (ImportError, ValueError):
        return False


def missing(framework: str) -> str:
    return f"{framework} cannot be imported by {sys.executable}"


def tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


class Holder:
    """A ``holder.py`` child: a CUDA process of ``framework`` that allocates on request.

    Used as a context manager: leaving it closes the child's stdin and waits, then kills it.
    """

    def __init__(self, ctx: Context, framework: str, label: str, env: dict | None = None):
        self.ctx, self.framework, self.label = ctx, framework, label
        self.env = {**os.environ, **(env or {})}
        self.stderr = ctx.work / f"{label}.stderr"
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}
        self._lines: queue.Queue = queue.Queue()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, timeout: float = 90) -> dict:
        with open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [self.ctx.python, str(HOLDER), self.framework],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=self.env,
            )
        threading.Thread(target=self._read, daemon=True).start()
        self.ready = self._next(timeout)
        if not self.ready.get("ready"):
            raise HolderFailed(f"{self.label}: {self.ready.get('error')}")
        return self.ready

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=self.ctx.left(timeout))
        except queue.Empty:
            raise HolderFailed(
                f"{self.label} ({self.framework}) gave no answer within {timeout:.0f} s; "
                f"its stderr: {tail(self.stderr) or '(nothing)'}"
            ) from None
        if line is None:
            code = self.proc.wait(timeout=10)
            raise HolderFailed(
                f"{self.label} ({self.framework}) ended (exit {code}); its stderr: "
                f"{tail(self.stderr) or '(nothing)'}"
            )
        try:
            return json.loads(line)
        except ValueError:
            raise HolderFailed(f"{self.label} answered {line.strip()[:120]!r}") from None

    def ask(self, timeout: float = 60, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=self.ctx.left(timeout))
        except subprocess.TimeoutExpired:
            return None

    def close(self, timeout: float = 15) -> int | None:
        if self.proc is None:
            return None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        code = self.wait(timeout)
        if code is None:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        return code

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def processes_by_pid(snapshot: telemetry.Snapshot) -> dict[int, telemetry.ProcessUse]:
    return {p.pid: p for p in snapshot.processes}


def raw_nvml_mb(nvml) -> dict[int, int | None]:
    """Each compute process's memory as NVML itself lists it on each GPU's handle, MiB (None:
    NVML cannot say): the figure the guard's reading is held against."""
    found: dict[int, int | None] = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = p.usedGpuMemory
            found[int(p.pid)] = None if used is None or used >= 2**64 - 1 else used // MIB
    return found


def target_unit(ctx: Context) -> gpus.GPUInfo:
    """The GPU (or MIG instance) a participant would get first: the first the join advertises."""
    nvml = ctx.nvml()
    try:
        screened = usable.screen(gpus.read_gpus(nvml))
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if not screened.units:
        raise Skip(f"the join would advertise no GPU here: {screened.refusal or screened.notes}")
    return screened.units[0]


# ---- the sections -------------------------------------------------------------------------


def described(found) -> list[dict]:
    """The GPUs the join found (``gpus.discover``), as the report shows them."""
    return [
        {
            "index": g.index,
            "uuid": g.uuid,
            "name": g.name,
            "memory_mb": g.memory_mb,
            "mig_mode": g.mig_mode,
            "mig": [m.uuid for m in g.mig_instances],
        }
        for g in found
    ]


def discovery(ctx: Context, s: prove.Section) -> None:
    """NVML as the join reads it, beside nvidia-smi; the slices the join would advertise."""
    from worker_setup import advertise, gpu_check

    nvml = ctx.nvml()
    try:
        s.findings["versions"] = gpu_check.versions(nvml)
    finally:
        nvml.nvmlShutdown()
    try:
        found = gpus.discover(gpus.load_nvml())  # as the join does: init, read, shut down
    except gpus.NVMLUnavailable as e:
        s.checks.append(Check("NVML discovery", FAIL, str(e)))
        return
    s.checks.append(Check("NVML discovery", PASS, f"{len(found)} GPU(s)"))
    ours = described(found)
    query = ctx.smi(f"--query-gpu={prove.QUERY_GPU}", "--format=csv,noheader,nounits")
    listed = ctx.smi("-L")
    s.findings.update(
        nvml=ours, nvidia_smi_query=query.stdout.strip(), nvidia_smi_list=listed.stdout.strip()
    )
    if query.returncode:
        s.checks.append(Check("nvidia-smi --query-gpu", FAIL, query.stderr.strip()[:300]))
        return
    try:
        theirs = prove.parse_query_gpu(query.stdout)
    except ValueError as e:
        s.checks.append(Check("nvidia-smi --query-gpu", FAIL, str(e)))
        return
    s.checks += prove.compare_discovery(ours, theirs, prove.parse_list(listed.stdout))

    screened = usable.screen(found)
    advertised = []
    for how, fixed, memory in (
        ("--slices-per-gpu 3", 3, None),
        ("--slice-memory 4GiB", None, 4096),
    ):
        if not screened.units:
            break
        slices = slicing.slices_per_gpu(screened.units, fixed, memory, 1)
        try:
            slicing.check_slices(screened.units, slices, how)
        except ValueError as e:
            s.checks.append(Check(f"slices ({how})", FAIL, str(e)))
            continue
        line = advertise.summary(screened.units, slices, len(screened.skipped))
        advertised.append({"option": how, "slices": slices, "summary": line})
        s.checks.append(Check(f"slices ({how})", PASS, line))
    s.findings["advertised"] = advertised
    s.findings["skipped"] = screened.skipped
    s.findings["notes"] = screened.notes
    if screened.refusal or not screened.units:
        why = screened.refusal or "; ".join(screened.notes) or "no GPU"
        s.checks.append(Check("slices", FAIL, f"the join would advertise nothing: {why}"))


class NoServers:
    """The engine's answers on a machine without Docker: no participant's server runs here."""

    def containers(self, label: str) -> list:
        return []

    def container_pid(self, container: str) -> int:
        return 0  # nothing is ever written into a container

    def info(self) -> dict:
        return {}


def _guard_log() -> list[str]:
    """The guard's log lines from now on (its logger, caught here)."""
    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    logger = logging.getLogger("gpu-guard")
    logger.setLevel(logging.INFO)
    logger.addHandler(Catch())
    return lines


def guard_reading(ctx: Context, s: prove.Section) -> None:
    """The guard's reading with real CUDA processes: its figures against NVML's and
    nvidia-smi's; processes in no container are nobody's and never stopped; a round's cost."""
    wanted = [(fw, mb) for fw, mb in (("torch", 1024), ("cupy", 512)) if have(fw)]
    for fw in [fw for fw in ("torch", "cupy") if not have(fw)]:
        s.checks.append(Check(f"{fw} process", SKIP, missing(fw)))
    if not wanted:
        raise Skip("neither torch nor cupy can be imported: no CUDA process to read")
    nvml = ctx.nvml()
    log_lines = _guard_log()
    with contextlib.ExitStack() as stack:
        held = []
        for fw, mb in wanted:
            h = stack.enter_context(Holder(ctx, fw, f"reading-{fw}", ctx.fake_env(mb)))
            ready = h.start()
            answer = h.ask(op="alloc", mb=mb)
            if not answer.get("ok"):
                s.checks.append(Check(f"{fw} allocates {mb} MiB", FAIL, str(answer.get("error"))))
                continue
            s.findings[f"{fw}_version"] = ready.get("version")
            held.append((h, fw, mb))
        signals: list = []

        def never(pid: int, sig: int) -> bool:  # what the guard asks for, not done
            signals.append((pid, int(sig)))
            return False

        settings = policy.GuardSettings("enforce", 100, 110, grace_seconds=0)
        g = guard.Guard(
            settings, nvml, NoServers(), guard.Options(interval=1, kill_after=1), kill=never
        )
        cpu_ms = []
        first = None
        for _ in range(6):
            t = time.process_time()
            done = g.round()
            cpu_ms.append((time.process_time() - t) * 1000)
            first = first or done
        last = g.last
        raw = raw_nvml_mb(nvml)
        apps = {a["pid"]: a for a in ctx.compute_apps()}
        reading = {p.pid: p for p in (last.reading.processes if last.reading else ())}
        reports = {a.pid: a for a in first.actions if isinstance(a, policy.Report)}
        for h, fw, mb in held:
            mine = reading.get(h.pid)
            s.checks += prove.compare_process(
                h.pid,
                f"{fw} {mb} MiB",
                mb,
                mine.used_mb if mine else None,
                raw.get(h.pid),
                (apps.get(h.pid) or {}).get("used_mb"),
            )
            cgroup = guard_attribution.Proc().cgroup(h.pid) or ""
            s.findings[f"{fw}_cgroup"] = cgroup.strip().splitlines()[-1:] or [""]
            s.findings[f"{fw}_container"] = guard_attribution.container_of(cgroup)
            report = reports.get(h.pid)
            s.checks.append(
                prove.check(
                    f"{fw} (pid {h.pid}) is nobody's",
                    mine is not None and mine.owner is None and report is not None,
                    f"owner {mine.owner if mine else '(not read)'}; reported: "
                    f"{report.reason if report else 'no'}",
                )
            )
            s.checks.append(
                prove.check(f"{fw} (pid {h.pid}) alive", h.alive(), "still running after 6 rounds")
            )
        s.checks.append(
            prove.check(
                "never stopped",
                not signals,
                "no signal in 6 rounds of enforce mode with a grace of 0 s"
                if not signals
                else f"the guard asked for signals {signals}",
            )
        )
        median = statistics.median(cpu_ms[1:])
        s.findings.update(
            round_cpu_ms_first=round(cpu_ms[0], 2),
            round_cpu_ms_median=round(median, 2),
            nvml_processes=raw,
            compute_apps=list(apps.values()),
            guard_log=log_lines[-10:],
            gpus=[asdict(gpu) for gpu in last.snapshot.gpus],
            errors=list(last.snapshot.errors),
        )
        s.checks.append(
            prove.check(
                "one round's CPU time",
                median < 250,
                f"median {median:.1f} ms over 5 rounds (first, NVML opening: {cpu_ms[0]:.1f} ms);"
                " a round every 5 s",
            )
        )
    nvml.nvmlShutdown()


class OneServer:
    """The engine's answers with one participant's server, whose container is the target's."""

    def __init__(self, gpu_uuid: str, budget_mb: int):
        self.gpu_uuid, self.budget_mb = gpu_uuid, budget_mb

    def containers(self, label: str) -> list:
        labels = {
            "com.docker.swarm.service.name": "jy-gpu-proof",
            contract.USER_LABEL: "gpu-proof",
            contract.GPU_LABEL: self.gpu_uuid,
            contract.SLICES_LABEL: "1",
            contract.BUDGET_LABEL: str(self.budget_mb),
        }
        return [{"Id": TARGET_CONTAINER, "Names": ["/gpu-proof"], "Labels": labels}]

    def container_pid(self, container: str) -> int:
        return 0  # nothing is written: the target runs in no container

    def info(self) -> dict:
        return {}


class TargetIn(guard_attribution.Proc):
    """/proc as it is, except that process ``pid`` says it runs in ``TARGET_CONTAINER``."""

    def __init__(self, pid: int):
        super().__init__()
        self.target = pid

    def cgroup(self, pid: int) -> str | None:
        if pid == self.target:
            return f"0::/system.slice/docker-{TARGET_CONTAINER}.scope\n"
        return super().cgroup(pid)


def only_to(target: int, sent: list, refused: list):
    """The guard's signal sender, narrowed: it signals ``target`` and nothing else (every
    other pid it is asked for is written into ``refused`` and left alone)."""

    def kill(pid: int, sig: int) -> bool:
        if pid != target:
            refused.append((pid, int(sig)))
            return False
        sent.append((pid, int(sig)))
        return guard.send_signal(pid, sig)

    return kill


#: The enforcement tried: a budget the target is well over, a short grace, SIGKILL after.
ENFORCE_BUDGET_MB, ENFORCE_GRACE_S, ENFORCE_KILL_AFTER_S = 256, 2.0, 3.0


def guard_enforce(ctx: Context, s: prove.Section) -> None:
    """The guard's enforce decision and signals on a real CUDA process over its budget: warned,
    stopped after the grace, and no other process signalled (a bystander's stays)."""
    frameworks = [fw for fw in ("torch", "cupy") if have(fw)]
    if not frameworks:
        raise Skip("neither torch nor cupy can be imported: no CUDA process to stop")
    nvml = ctx.nvml()
    log_lines = _guard_log()
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(
            Holder(ctx, frameworks[0], "enforce-target", ctx.fake_env(1024))
        )
        bystander = stack.enter_context(
            Holder(ctx, frameworks[-1], "enforce-bystander", ctx.fake_env(256))
        )
        for h, mb in ((target, 1024), (bystander, 256)):
            h.start()
            answer = h.ask(op="alloc", mb=mb)
            if not answer.get("ok"):
                raise HolderFailed(f"{h.label} could not allocate {mb} MiB: {answer.get('error')}")
        seen = processes_by_pid(telemetry.read(nvml)).get(target.pid)
        if seen is None:
            s.checks.append(
                Check("target read", FAIL, f"NVML lists no process with pid {target.pid}")
            )
            return
        sent: list = []
        refused: list = []
        settings = policy.GuardSettings("enforce", 100, 110, ENFORCE_GRACE_S)
        g = guard.Guard(
            settings,
            nvml,
            OneServer(seen.gpu_uuid, ENFORCE_BUDGET_MB),
            guard.Options(interval=0.5, kill_after=ENFORCE_KILL_AFTER_S),
            proc=TargetIn(target.pid),
            kill=only_to(target.pid, sent, refused),
        )
        t0 = time.monotonic()
        events = []
        limit = ENFORCE_GRACE_S + ENFORCE_KILL_AFTER_S + 10
        while time.monotonic() - t0 < limit:
            done = g.round()
            at = round(time.monotonic() - t0, 2)
            for a in done.actions:
                events.append(
                    {"at": at, "action": type(a).__name__, "pid": getattr(a, "pid", None)}
                )
            if not target.alive():
                break
            time.sleep(0.5)
        code = target.wait(ENFORCE_KILL_AFTER_S + 5)
        warns = [e["at"] for e in events if e["action"] == "Warn"]
        stops = [e for e in events if e["action"] == "Stop"]
        s.findings.update(
            target_pid=target.pid,
            bystander_pid=bystander.pid,
            target_mb=seen.used_mb,
            budget_mb=ENFORCE_BUDGET_MB,
            events=events[:40],
            signals_sent=sent,
            signals_refused=refused,
            target_exit=code,
            notices=[n["title"] for n in g._notices.get(TARGET_CONTAINER, [])],
            guard_log=log_lines[-10:],
        )
        s.checks.append(
            prove.check(
                "warned",
                bool(warns),
                f"first warning at {warns[0]} s" if warns else "no warning",
            )
        )
        s.checks.append(
            prove.check(
                "stopped after the grace",
                bool(stops) and bool(warns) and stops[0]["at"] - warns[0] >= ENFORCE_GRACE_S - 0.1,
                f"stop at {stops[0]['at']} s for pid {stops[0]['pid']} (grace {ENFORCE_GRACE_S} s)"
                if stops
                else "no stop decided",
            )
        )
        s.checks.append(
            prove.check(
                "only the target signalled",
                bool(sent) and all(pid == target.pid for pid, _ in sent) and not refused,
                f"sent {sent}; asked for and refused {refused or 'none'}",
            )
        )
        ended = code in (-signal.SIGTERM, -signal.SIGKILL)
        s.checks.append(
            prove.check(
                "the target ended by the signal",
                ended,
                f"exit {code}" + (" (SIGTERM)" if code == -signal.SIGTERM else ""),
            )
        )
        answer = bystander.ask(op="stats", timeout=20) if bystander.alive() else {}
        s.checks.append(
            prove.check(
                "the bystander untouched",
                bystander.alive() and bool(answer.get("ok")),
                f"pid {bystander.pid} {'alive and answering' if answer.get('ok') else 'gone'}",
            )
        )
    nvml.nvmlShutdown()


def caps(ctx: Context, s: prove.Section, framework: str) -> None:
    """A framework's memory cap under a slice's budget, as gpu_caps sets it in the image: an
    allocation under the cap succeeds, one past it fails with the framework's OOM, and NVML's
    figure for the process gives the reserve GPU_CAPS_RESERVE_MB should hold."""
    if not have(framework):
        raise Skip(missing(framework))
    unit = target_unit(ctx)
    spec = importlib.util.spec_from_file_location("gpu_caps", SINGLEUSER / "gpu_caps.py")
    gpu_caps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_caps)
    # a GPU of 8 GiB or less would be one slice, which gpu_caps leaves uncapped: two, then
    total_slices = max(2, slicing.slices_per_gpu([unit], None, SLICE_MEMORY_MB)[unit.uuid])
    limit_mb = unit.memory_mb // total_slices  # one slice (inventory.memory_budget_mb)
    env = {
        "GPU_MEMORY_LIMIT_MB": str(limit_mb),
        "GPU_MEMORY_FRACTION": f"{1 / total_slices:.3f}",
        "GPU_CAPS": "verbose",
        "CUDA_VISIBLE_DEVICES": unit.uuid,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SINGLEUSER), os.environ.get("PYTHONPATH")])
        ),
    }
    budget = gpu_caps.budget_from(env)
    if framework == "jax":
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = gpu_caps.xla_fraction(env)  # as start-singleuser
    else:
        env["PROVE_PTH"] = str(SINGLEUSER / "gpu_caps.pth")
    s.findings.update(
        gpu=unit.described,
        slices=total_slices,
        env={k: v for k, v in env.items() if "PATH" not in k},
    )
    nvml = ctx.nvml()
    first_mb = max(128, budget.cap_mb - 512)  # under the cap (JAX: under its pool, below)
    with Holder(ctx, framework, f"caps-{framework}", {**env, **ctx.fake_env(first_mb)}) as h:
        ready = h.start(timeout=120)
        s.findings.update(
            version=ready.get("version"), applied=ready.get("caps"), ready_stats=ready.get("stats")
        )
        if framework == "torch":
            applied = (ready.get("caps") or {}).get("torch", "")
            s.checks.append(
                prove.check(
                    "gpu_caps capped torch", applied.startswith("fraction"), applied or "not"
                )
            )
        pool = (h.ask(op="stats").get("held_mb") or 0) if framework == "jax" else 0
        room = min(budget.cap_mb, pool) if pool else budget.cap_mb
        under_mb = max(128, int(room * 0.75)) if framework == "jax" else first_mb
        under = {"mb": under_mb, **h.ask(op="alloc", mb=under_mb)}
        nvml_mb = None
        if under.get("ok"):
            seen = processes_by_pid(telemetry.read(nvml)).get(h.pid)
            nvml_mb = seen.used_mb if seen else None
        held_mb = under.get("held_mb")
        h.ask(op="free")
        past_mb = budget.cap_mb + 256
        past = {"mb": past_mb, **h.ask(op="alloc", mb=past_mb)}
        h.ask(op="free")
    nvml.nvmlShutdown()
    checks, findings = prove.caps_checks(
        framework,
        limit_mb,
        budget.cap_mb,
        limit_mb - budget.cap_mb,
        under,
        past,
        nvml_mb,
        held_mb,
    )
    s.checks += checks
    s.findings.update(findings, under=under, past=past)


def caps_torch(ctx: Context, s: prove.Section) -> None:
    caps(ctx, s, "torch")


def caps_jax(ctx: Context, s: prove.Section) -> None:
    caps(ctx, s, "jax")


#: Each framework's devices with the environment's CUDA_VISIBLE_DEVICES, as one JSON line.
VISIBLE = {
    "torch": (
        "import json, torch\n"
        "n = torch.cuda.device_count()\n"
        "u = str(torch.cuda.get_device_properties(0).uuid) if n else None\n"
        "print(json.dumps({'count': n, 'uuid': u}))\n"
    ),
    "cupy": (
        "import json, cupy\n"
        "from cupy.cuda import runtime\n"
        "try:\n"
        "    n = runtime.getDeviceCount()\n"
        "except runtime.CUDARuntimeError:\n"
        "    n = 0\n"
        "u = runtime.getDeviceProperties(0).get('uuid') if n else None\n"
        "u = u.hex() if isinstance(u, bytes) else u\n"
        "print(json.dumps({'count': n, 'uuid': u}))\n"
    ),
    "jax": (
        "import json, jax\n"
        "try:\n"
        "    n = len(jax.devices('gpu'))\n"
        "except RuntimeError:\n"
        "    n = 0\n"
        "print(json.dumps({'count': n, 'uuid': None}))\n"
    ),
}


def _devices(ctx: Context, framework: str, visible: str) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        done = subprocess.run(
            [ctx.python, "-c", VISIBLE[framework]],
            capture_output=True,
            text=True,
            env=env,
            timeout=ctx.left(90),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": "no answer within its time"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        err = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"error": f"exit {done.returncode}: {err}"}
    seen = json.loads(lines[-1])
    if framework == "cupy" and seen.get("uuid") and len(seen["uuid"]) == 32:
        h = seen["uuid"]
        seen["uuid"] = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return seen


def visible_devices(ctx: Context, s: prove.Section) -> None:
    """CUDA_VISIBLE_DEVICES=<uuid>, as the spawner sets it: each framework sees exactly that
    device; a UUID on no GPU here, or "" (a server without a GPU), leaves it none."""
    unit = target_unit(ctx)
    frameworks = [fw for fw in VISIBLE if have(fw)]
    for fw in [fw for fw in VISIBLE if fw not in frameworks]:
        s.checks.append(Check(f"{fw}", SKIP, missing(fw)))
    if not frameworks:
        raise Skip("none of torch, cupy and jax can be imported")
    cases = [(fw, unit.uuid, True) for fw in frameworks]
    cases += [(fw, NO_SUCH_GPU, False) for fw in frameworks]
    if "torch" in frameworks:
        cases.append(("torch", "", False))
    with ThreadPoolExecutor(max_workers=4) as pool:
        seen = list(pool.map(lambda c: _devices(ctx, c[0], c[1]), cases))
    for (fw, visible, present), answer in zip(cases, seen):
        s.checks.append(prove.visible_check(fw, visible or '""', answer, present))
    s.findings.update(
        gpu=unit.described,
        seen=[{"framework": c[0], "visible": c[1], **a} for c, a in zip(cases, seen)],
    )


#: check-environment's device check, run with the machine's python; one JSON line.
CHECK_DEVICES = """
import importlib.util, json, sys
from importlib.machinery import SourceFileLoader
loader = SourceFileLoader("check_environment", sys.argv[1])
check = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
loader.exec_module(check)
r = check.check_devices("torch")
print(json.dumps({"status": r.status, "detail": r.detail}))
"""


def _check_environment(ctx: Context, env: dict) -> dict:
    code = [ctx.python, "-c", CHECK_DEVICES, str(SINGLEUSER / "check-environment")]
    done = subprocess.run(
        code,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=ctx.left(120),
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        err = " | ".join(done.stderr.strip().splitlines()[-3:])
        return {"status": "error", "detail": f"exit {done.returncode}: {err}"}
    return json.loads(lines[-1])


def check_environment(ctx: Context, s: prove.Section) -> None:
    """check-environment's device check with this machine's PyTorch: ok for the GPU the server
    holds, FAILED when told it holds another (the check can fail)."""
    if not have("torch"):
        raise Skip(missing("torch"))
    unit = target_unit(ctx)
    held = {"GPU_UUID": unit.uuid, "NVIDIA_VISIBLE_DEVICES": unit.uuid}
    right = _check_environment(ctx, {**held, "CUDA_VISIBLE_DEVICES": unit.uuid})
    wrong = _check_environment(
        ctx, {**held, "GPU_UUID": NO_SUCH_GPU, "CUDA_VISIBLE_DEVICES": unit.uuid}
    )
    s.findings.update(gpu=unit.described, holding_it=right, told_another=wrong)
    if right["status"] == "skipped":
        s.checks.append(Check("devices", SKIP, f"check-environment: {right['detail']}"))
        return
    s.checks.append(prove.check("devices, the GPU held", right["status"] == "ok", right["detail"]))
    s.checks.append(
        prove.check(
            "devices, told another GPU",
            wrong["status"] == "FAILED",
            f"{wrong['status']}: {wrong['detail']}",
        )
    )


#: The MPS client's pinned memory limit tried, MiB.
MPS_LIMIT_MB = 1024


def mps(ctx: Context, s: prove.Section) -> None:
    """CUDA MPS with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: a private control daemon (its own pipe
    and log folders), one client under a limit; stopped after. Skipped on any doubt: it never
    changes the GPU's settings."""
    smi = shutil.which(ctx.nvidia_smi)  # the driver's tools often lie together off the PATH
    beside = str(Path(smi).parent) if smi else None
    control = shutil.which("nvidia-cuda-mps-control") or shutil.which(
        "nvidia-cuda-mps-control", path=beside
    )
    if control is None:
        raise Skip("nvidia-cuda-mps-control is not installed here")
    frameworks = [fw for fw in ("cupy", "torch") if have(fw)]
    if not frameworks:
        raise Skip("neither cupy nor torch can be imported")
    unit = target_unit(ctx)
    if unit.is_mig:
        raise Skip("the GPU is in MIG mode; MPS on MIG instances is not tried")
    mode = ctx.smi("--query-gpu=compute_mode", "--format=csv,noheader").stdout.strip()
    s.findings["compute_mode"] = mode
    if mode.splitlines()[:1] not in (["Default"], ["Exclusive_Process"]):
        raise Skip(f"compute mode {mode or '?'}; MPS is tried only as the GPU is (Default)")
    folder = ctx.work / "mps"
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    daemon_out = folder / "daemon.out"
    with open(daemon_out, "w") as out:
        daemon = subprocess.Popen(
            [control, "-f"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    servers: list[int] = []

    def ask_control(command: str) -> str:
        done = subprocess.run(
            [control],
            input=command + "\n",
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=ctx.left(15),
            check=False,
        )
        return done.stdout.strip()

    try:
        t0 = time.monotonic()
        while not (folder / "pipe" / "control").exists() and time.monotonic() - t0 < 10:
            if daemon.poll() is not None:
                raise Skip(f"the MPS control daemon ended (exit {daemon.returncode}): "
                           f"{tail(daemon_out)}")  # fmt: skip
            time.sleep(0.2)
        if not (folder / "pipe" / "control").exists():
            raise Skip("the MPS control daemon made no control pipe within 10 s")
        client_env = {**env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={MPS_LIMIT_MB}M"}
        with Holder(ctx, frameworks[0], "mps-client", client_env) as h:
            h.start(timeout=60)
            under = h.ask(op="alloc", mb=MPS_LIMIT_MB // 2)
            servers = [int(p) for p in ask_control("get_server_list").split() if p.isdigit()]
            nvml = ctx.nvml()
            s.findings["nvml_processes"] = raw_nvml_mb(nvml)
            nvml.nvmlShutdown()
            s.findings["compute_apps"] = ctx.compute_apps()
            past = h.ask(op="alloc", mb=MPS_LIMIT_MB)
        s.findings.update(server_pids=servers, under=under, past=past, client_pid=h.pid)
        s.checks.append(
            prove.check(
                "the client ran under MPS", bool(servers), f"MPS server pid(s) {servers or 'none'}"
            )
        )
        s.checks.append(
            prove.check(
                f"{MPS_LIMIT_MB // 2} MiB under the pinned limit",
                bool(under.get("ok")),
                "allocated" if under.get("ok") else str(under.get("error")),
            )
        )
        s.checks.append(
            prove.check(
                f"{MPS_LIMIT_MB} MiB more, past the {MPS_LIMIT_MB} MiB limit",
                not past.get("ok") and bool(past.get("oom")),
                "allocated: the limit did not hold" if past.get("ok") else str(past.get("error")),
            )
        )
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            ask_control("quit")
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        for pid in servers:  # started by our daemon for our client
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        s.findings["control_log"] = tail(folder / "log" / "control.log", 8)
        s.findings["server_log"] = tail(folder / "log" / "server.log", 8)


#: name: (title, seconds it may take, the function)
SECTIONS = {
    "discovery": ("NVML discovery as the join does it, beside nvidia-smi", 30, discovery),
    "guard-reading": ("the guard's reading of real CUDA processes", 90, guard_reading),
    "guard-enforce": ("the guard stops a CUDA process over its budget, only it", 60, guard_enforce),
    "caps-torch": ("PyTorch's memory cap under a slice's budget", 75, caps_torch),
    "caps-jax": ("JAX's memory cap under a slice's budget", 75, caps_jax),
    "visible-devices": ("CUDA_VISIBLE_DEVICES=<uuid>: exactly that device", 60, visible_devices),
    "check-environment": ("check-environment's device check with PyTorch", 45, check_environment),
    "mps": ("CUDA MPS with a pinned memory limit (optional)", 60, mps),
}


def run(name: str, ctx: Context) -> prove.Section:
    title, _, function = SECTIONS[name]
    s = prove.Section(name, title)
    t0 = time.monotonic()
    try:
        function(ctx, s)
        s.conclude()
    except Skip as e:
        s.conclude()
        if s.status != FAIL:
            s.status, s.reason = SKIP, str(e)
    except Exception as e:
        s.checks.append(Check("ran", FAIL, f"{type(e).__name__}: {e}"))
        s.findings["traceback"] = traceback.format_exc().splitlines()[-12:]
        s.conclude()
    s.seconds = round(time.monotonic() - t0, 2)
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu.sections")
    parser.add_argument("name", choices=sorted(SECTIONS))
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--nvml-fixture", default="")
    args = parser.parse_args(argv)
    ctx = Context(args.work, args.nvidia_smi, args.nvml_fixture, args.seconds)
    s = run(args.name, ctx)
    args.result.write_text(json.dumps(asdict(s), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
