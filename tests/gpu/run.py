"""tests/gpu/prove.sh's runner: each section in a process of its own, within the time left.

    python3 -m tests.gpu.run OUTDIR --work DIR [--only NAME ...] [--time-limit S]
        [--nvidia-smi PATH] [--nvml-fixture FILE]

Without a GPU (``nvidia-smi`` missing, failing, or listing none) every section is skipped and
the report says ``skipped: no GPU``. Otherwise each section runs as ``python3 -m
tests.gpu.sections NAME`` in a session of its own, for at most its own seconds and what is
left of ``--time-limit``; past that, it is killed with everything it started and recorded as
failed. A section that would start with too little time left is skipped and says so.

Writes OUTDIR/report.json, OUTDIR/report.txt (printed too) and OUTDIR/logs.txt (the end of
each section's log and of each CUDA process's stderr). Exit status 0 when nothing
failed (also: no GPU), 1 when a section failed.

``--nvml-fixture FILE`` (this script's own tests, without a GPU): the sections run with the
tests' fake NVML over FILE where the join gets NVML (tests.fakes.nvml.shim_env), and the report
says FAKE NVML.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import prove
from .prove import FAIL, SKIP
from .sections import REPO, SECTIONS

#: The whole run's default limit, seconds: well inside the 8 minutes it must finish in.
TIME_LIMIT_S = 400
#: A section is not started with less time than this left.
LEAST_S = 15
#: How a section is run (its name and options follow).
SECTION_COMMAND = [sys.executable, "-m", "tests.gpu.sections"]


def gpu_absent(nvidia_smi: str) -> str:
    """Why this machine has no GPU to prove ("" when it has one): nvidia-smi missing, failing,
    or listing no GPU."""
    try:
        done = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        return f"{nvidia_smi} is not installed"
    except subprocess.TimeoutExpired:
        return f"{nvidia_smi} -L gave no answer within 30 s"
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines()[:1]
        return f"{nvidia_smi} -L failed (exit {done.returncode}): {' '.join(said)}"
    if not prove.parse_list(done.stdout):
        return f"{nvidia_smi} -L lists no GPU"
    return ""


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def machine(nvidia_smi: str, gpu: bool) -> dict:
    """What the report says of the machine and the tools used."""
    found = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": f"{platform.python_version()} ({sys.executable})",
        "pynvml": _version("nvidia-ml-py"),
        "prometheus_client": _version("prometheus-client"),
        "commit": _commit(),
        "gpus": "",
        "driver": "",
    }
    try:
        import pynvml

        found["pynvml"] += f" ({Path(pynvml.__file__).parent})"
    except ImportError:
        pass
    if gpu:
        query = "--query-gpu=name,memory.total,driver_version"
        done = subprocess.run(
            [nvidia_smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        rows = [r.split(", ") for r in done.stdout.strip().splitlines() if r.count(", ") == 2]
        found["gpus"] = "; ".join(
            f"GPU {i}: {name} ({mb} MiB)" for i, (name, mb, _) in enumerate(rows)
        )
        found["driver"] = rows[0][2] if rows else ""
    return found


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def run_section(name: str, seconds: float, args, env: dict) -> prove.Section:
    """Section ``name`` in a process (and session) of its own, killed with all it started
    after ``seconds``."""
    title = SECTIONS[name][0]
    result = args.work / f"{name}.json"
    log = args.work / f"{name}.log"
    command = [
        *SECTION_COMMAND, name, "--work", str(args.work),
        "--result", str(result), "--seconds", str(seconds), "--nvidia-smi", args.nvidia_smi,
    ]  # fmt: skip
    if args.nvml_fixture:
        command += ["--nvml-fixture", args.nvml_fixture]
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        proc.wait(timeout=seconds + 5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return prove.Section(
            name,
            title,
            FAIL,
            f"did not finish within {seconds:.0f} s; stopped with its processes "
            f"(its log: {_tail(log)})",
            round(time.monotonic() - t0, 1),
        )
    finally:
        _kill_group(proc.pid)  # what it left running
    if not result.exists():
        return prove.Section(
            name,
            title,
            FAIL,
            f"ended (exit {proc.returncode}) without a result: {_tail(log)}",
            round(time.monotonic() - t0, 1),
        )
    return prove.Section.from_dict(json.loads(result.read_text()))


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(none)"
    return " | ".join(text[-lines:]) or "(empty)"


def collect_logs(work: Path, lines: int = 40) -> str:
    """The end of each section's log and of each CUDA process's stderr, in one text (the
    scratch folder goes when the run ends; a machine lent for minutes gives back few files)."""
    parts = []
    for path in sorted([*work.glob("*.log"), *work.glob("*.stderr"), *work.glob("mps/log/*.log")]):
        text = path.read_text(errors="replace").splitlines()
        parts.append(f"==> {path.relative_to(work)} ({f'last {lines} lines' if text else 'empty'})")
        parts += text[-lines:]
    return "\n".join(parts) + "\n" if parts else "(no logs)\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tests/gpu/prove.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", type=Path, help="where report.json and report.txt go")
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder")
    parser.add_argument(
        "--only", action="append", choices=list(SECTIONS), metavar="NAME",
        help=f"only this section (repeatable): {', '.join(SECTIONS)}",
    )  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="S")
    parser.add_argument("--nvidia-smi", default=os.environ.get("PROVE_NVIDIA_SMI", "nvidia-smi"))
    parser.add_argument(
        "--nvml-fixture", default="", metavar="FILE", help="FAKE NVML: this fixture (tests only)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    no_gpu = gpu_absent(args.nvidia_smi)
    if args.nvml_fixture and no_gpu:
        print(f"FAKE NVML: {args.nvml_fixture}; nvidia-smi: {no_gpu}", flush=True)
    skip_all = no_gpu if not args.nvml_fixture else ""
    print(f"GPU proof: {'skipped: no GPU (' + no_gpu + ')' if skip_all else 'running'}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.nvml_fixture:  # the sections' `import pynvml` gives the tests' fake NVML
        from tests.fakes.nvml import shim_env

        env = shim_env(args.nvml_fixture, env)
    sections = []
    for name in [n for n in SECTIONS if not args.only or n in args.only]:
        title, budget, _ = SECTIONS[name]
        left = args.time_limit - (time.monotonic() - t0)
        if skip_all:
            section = prove.Section(name, title, SKIP, f"no GPU ({skip_all})")
        elif left < LEAST_S:
            section = prove.Section(
                name, title, SKIP, f"no time left ({left:.0f} s of --time-limit)"
            )
        else:
            section = run_section(name, min(budget, left - 5), args, env)
        sections.append(section)
        print(f"  {section.status:4} {name} ({section.seconds:.1f} s)", flush=True)
    report = prove.build_report(
        machine(args.nvidia_smi, not no_gpu),
        sections,
        started,
        time.monotonic() - t0,
        no_gpu=skip_all,
        fake_nvml=args.nvml_fixture,
    )
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    text = prove.render(report)
    (args.out / "report.txt").write_text(text + "\n")
    (args.out / "logs.txt").write_text(collect_logs(args.work))
    print("\n" + text)
    return 1 if report["status"] == FAIL else 0


if __name__ == "__main__":
    sys.exit(main())
