"""What tests/gpu/prove.sh concludes: pure functions over what it read, no I/O.

The sections (tests/gpu/sections.py) read NVML, ``nvidia-smi`` and the CUDA frameworks; this
module parses ``nvidia-smi``'s answers, compares them with NVML's and the guard's figures, and
builds the report (``report.json``) and its text. Everything here is unit-tested with recorded
outputs of real machines (tests/unit/test_gpu_prove.py).

A section's result is a list of ``Check`` (each ``pass``, ``fail`` or ``skip`` with one line
saying what was seen) and ``findings``, the figures measured. A section passes when none of its
checks failed and at least one passed; it is skipped when all were, or when it could not run
(no framework, no GPU), with the reason.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass, field

PASS, FAIL, SKIP = "pass", "fail", "skip"
#: The version of report.json's layout; a reader checks it.
SCHEMA = 1
#: The query the sections ask ``nvidia-smi`` for (``--format=csv,noheader,nounits``).
QUERY_GPU = "index,uuid,name,memory.total,mig.mode.current"
QUERY_APPS = "pid,gpu_uuid,used_memory"
#: How nvidia-smi says a MIG mode (None: N/A, a GPU without MIG).
_SMI_MIG = {True: "Enabled", False: "Disabled", None: "N/A"}


@dataclass
class Check:
    """One thing checked: ``status`` (pass, fail, skip) and one line saying what was seen."""

    what: str
    status: str
    detail: str = ""


@dataclass
class Section:
    """A section's result, as report.json keeps it."""

    name: str
    title: str
    status: str = SKIP
    reason: str = ""
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    findings: dict = field(default_factory=dict)

    def conclude(self) -> Section:
        """``status`` and ``reason`` from the checks (a reason already given is kept)."""
        self.status = section_status(self.checks)
        if not self.reason:
            failed = [c for c in self.checks if c.status == FAIL]
            skipped = [c for c in self.checks if c.status == SKIP]
            if failed:
                self.reason = f"{failed[0].what}: {failed[0].detail}"
            elif self.status == SKIP and skipped:
                self.reason = skipped[0].detail
        return self

    @classmethod
    def from_dict(cls, data: dict) -> Section:
        checks = [Check(**c) for c in data.get("checks", [])]
        known = {k: data[k] for k in ("name", "title", "status", "reason", "seconds") if k in data}
        return cls(**known, checks=checks, findings=data.get("findings", {}))


def section_status(checks: list[Check]) -> str:
    """fail when a check failed; skip when none ran (or all were skipped); else pass."""
    if any(c.status == FAIL for c in checks):
        return FAIL
    if any(c.status == PASS for c in checks):
        return PASS
    return SKIP


def check(what: str, ok: bool, detail: str) -> Check:
    return Check(what, PASS if ok else FAIL, detail)


# ---- nvidia-smi's answers -----------------------------------------------------------------


def na(text: str) -> str | None:
    """A field of nvidia-smi's CSV, None for what it cannot say: ``[N/A]``, ``N/A``,
    ``[Not Supported]``, ``[Unknown Error]``, ``[Insufficient Permissions]``, ..."""
    text = text.strip()
    if not text or text == "N/A" or (text.startswith("[") and text.endswith("]")):
        return None
    return text


def _rows(output: str) -> list[list[str]]:
    lines = [line for line in output.splitlines() if line.strip()]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(float(text))
    except ValueError:
        return None


def parse_query_gpu(output: str) -> list[dict]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current
    --format=csv,noheader,nounits``: one dict a GPU (index, uuid, name, memory_mb, mig_mode:
    True, False or None when nvidia-smi says N/A, as on GPUs without MIG). A line that does not
    have the five fields raises ValueError naming it."""
    gpus = []
    for row in _rows(output):
        if len(row) != 5:
            raise ValueError(f"nvidia-smi --query-gpu answered a line of {len(row)} fields: {row}")
        index, uuid, name, memory, mig = row
        mode = na(mig)
        gpus.append(
            {
                "index": _int(na(index)),
                "uuid": na(uuid),
                "name": na(name),
                "memory_mb": _int(na(memory)),
                "mig_mode": None if mode is None else mode.lower() == "enabled",
            }
        )
    return gpus


_GPU_LINE = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")


def parse_list(output: str) -> list[dict]:
    """``nvidia-smi -L``: one dict a GPU (index, name, uuid, mig: its MIG devices, each
    profile, slot and uuid). Other lines (warnings) are ignored."""
    gpus: list[dict] = []
    for line in output.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            index, name, uuid = gpu.groups()
            gpus.append({"index": int(index), "name": name, "uuid": uuid, "mig": []})
            continue
        mig = _MIG_LINE.match(line)
        if mig and gpus:
            profile, slot, uuid = mig.groups()
            gpus[-1]["mig"].append({"profile": profile, "slot": int(slot), "uuid": uuid})
    return gpus


def parse_compute_apps(output: str) -> list[dict]:
    """``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,
    nounits``: one dict a process (pid, gpu_uuid, used_mb: None when nvidia-smi cannot say).
    No process: nothing, or a line such as "No running processes found"."""
    apps = []
    for row in _rows(output):
        if len(row) != 3 or _int(na(row[0])) is None:
            continue
        pid, uuid, used = row
        apps.append({"pid": _int(pid), "gpu_uuid": na(uuid), "used_mb": _int(na(used))})
    return apps


# ---- comparisons --------------------------------------------------------------------------


def compare_discovery(nvml: list[dict], smi: list[dict], listed: list[dict]) -> list[Check]:
    """The join's GPUs (``nvml``: dicts of index, uuid, name, memory_mb, mig_mode and mig, the
    UUIDs of its MIG instances) against ``nvidia-smi --query-gpu`` (``smi``) and ``nvidia-smi
    -L`` (``listed``): count, then each GPU's UUID, name, memory, MIG mode and MIG instances."""
    checks = [
        check(
            "count",
            len(nvml) == len(smi),
            f"NVML {len(nvml)} GPU(s), nvidia-smi {len(smi)}",
        )
    ]
    by_index = {g["index"]: g for g in smi}
    listed_by_index = {g["index"]: g for g in listed}
    for gpu in nvml:
        i = gpu["index"]
        seen = by_index.get(i)
        if seen is None:
            checks.append(Check(f"GPU {i}", FAIL, "NVML has it, nvidia-smi does not"))
            continue
        checks.append(
            check(f"GPU {i} UUID", gpu["uuid"] == seen["uuid"], f"{gpu['uuid']} / {seen['uuid']}")
        )
        checks.append(
            check(f"GPU {i} name", gpu["name"] == seen["name"], f"{gpu['name']} / {seen['name']}")
        )
        checks.append(
            check(
                f"GPU {i} memory",
                gpu["memory_mb"] == seen["memory_mb"],
                f"NVML {gpu['memory_mb']} MiB / nvidia-smi {seen['memory_mb']} MiB",
            )
        )
        smi_mig = bool(seen["mig_mode"])  # N/A: a GPU without MIG, used whole
        checks.append(
            check(
                f"GPU {i} MIG mode",
                bool(gpu["mig_mode"]) == smi_mig,
                f"NVML {'on' if gpu['mig_mode'] else 'off'} / nvidia-smi "
                f"{_SMI_MIG[seen['mig_mode']]}",
            )
        )
        if gpu["mig_mode"] or smi_mig:
            ours = sorted(gpu.get("mig", []))
            theirs = sorted(m["uuid"] for m in listed_by_index.get(i, {}).get("mig", []))
            checks.append(
                check(
                    f"GPU {i} MIG instances",
                    ours == theirs,
                    f"NVML {len(ours)} ({', '.join(ours) or 'none'}) / nvidia-smi -L "
                    f"{len(theirs)} ({', '.join(theirs) or 'none'})",
                )
            )
    extra = sorted(set(by_index) - {g["index"] for g in nvml})
    if extra:
        checks.append(Check("GPUs", FAIL, f"nvidia-smi has GPU(s) {extra} that NVML does not"))
    return checks


def compare_process(
    pid: int,
    label: str,
    allocated_mb: int,
    guard_mb: int | None,
    nvml_mb: int | None,
    smi_mb: int | None,
    tolerance_mb: int = 2,
) -> list[Check]:
    """One process that allocated ``allocated_mb``: the guard's figure against NVML's (the
    same reading: equal) and ``nvidia-smi``'s (within ``tolerance_mb``), and each at least what
    was allocated (the CUDA context comes on top)."""
    named = f"{label} (pid {pid})"
    if nvml_mb is None:
        return [
            Check(
                named,
                FAIL,
                "NVML lists no memory for it: its pids may not be this PID namespace's, "
                "and the guard could attribute nothing",
            )
        ]
    overhead = nvml_mb - allocated_mb
    checks = [
        check(
            f"{named} NVML",
            nvml_mb >= allocated_mb,
            f"{nvml_mb} MiB for {allocated_mb} MiB allocated ({overhead:+} MiB: the CUDA context"
            " and the framework's own)",
        ),
        check(
            f"{named} guard",
            guard_mb == nvml_mb,
            f"guard {guard_mb if guard_mb is not None else 'nothing'} MiB / NVML {nvml_mb} MiB",
        ),
    ]
    if smi_mb is None:
        checks.append(Check(f"{named} nvidia-smi", FAIL, "not in --query-compute-apps"))
    else:
        checks.append(
            check(
                f"{named} nvidia-smi",
                abs(smi_mb - nvml_mb) <= tolerance_mb,
                f"nvidia-smi {smi_mb} MiB / NVML {nvml_mb} MiB",
            )
        )
    return checks


def reserve_suggestion(overhead_mb: float, step_mb: int = 64, margin_mb: int = 64) -> int:
    """``GPU_CAPS_RESERVE_MB`` for a measured overhead (NVML's figure for a process minus what
    its framework holds): the overhead and a margin, rounded up to ``step_mb``."""
    return max(step_mb, math.ceil((max(overhead_mb, 0) + margin_mb) / step_mb) * step_mb)


def caps_checks(
    framework: str,
    limit_mb: int,
    cap_mb: int,
    reserve_mb: int,
    under: dict,
    past: dict,
    nvml_mb: int | None,
    held_mb: float | None,
) -> tuple[list[Check], dict]:
    """The memory cap of ``framework`` under a budget of ``limit_mb`` (capped at ``cap_mb``,
    ``reserve_mb`` below): the allocation ``under`` the cap succeeded, the one ``past`` it
    failed with the framework's out-of-memory error, and where NVML's figure for the process
    (``nvml_mb``, with ``held_mb`` held by the framework's allocator) puts a process that fills
    its cap. Also the figures for report.json."""
    checks = [
        check(
            f"{framework}: {under.get('mb')} MiB under the cap",
            bool(under.get("ok")),
            "allocated" if under.get("ok") else f"failed: {under.get('error')}",
        ),
        check(
            f"{framework}: {past.get('mb')} MiB past the cap",
            not past.get("ok") and bool(past.get("oom")),
            "allocated: the cap did not hold"
            if past.get("ok")
            else f"refused with {past.get('error')}"
            if past.get("oom")
            else f"failed, but not with an out-of-memory error: {past.get('error')}",
        ),
    ]
    findings = {
        "budget_mb": limit_mb,
        "cap_mb": cap_mb,
        "reserve_mb": reserve_mb,
        "nvml_mb": nvml_mb,
        "framework_held_mb": held_mb,
    }
    if nvml_mb is None or held_mb is None:
        checks.append(Check(f"{framework}: NVML's figure", FAIL, "NVML lists no such process"))
        return checks, findings
    overhead = nvml_mb - held_mb
    full = cap_mb + overhead  # NVML's figure for the process once it fills its cap
    suggested = reserve_suggestion(overhead)
    findings.update(
        overhead_mb=round(overhead, 1),
        full_cap_nvml_mb=round(full, 1),
        above_budget_mb=round(full - limit_mb, 1),
        suggested_reserve_mb=suggested,
    )
    checks.append(
        check(
            f"{framework}: a full cap within the budget",
            full <= limit_mb,
            f"NVML {nvml_mb} MiB with {held_mb:.0f} MiB held: {overhead:.0f} MiB besides the "
            f"allocator's; a process at its cap ({cap_mb} MiB) would show {full:.0f} MiB, "
            f"{full - limit_mb:+.0f} MiB against the {limit_mb} MiB budget; "
            f"GPU_CAPS_RESERVE_MB {reserve_mb} now, {suggested} measured",
        )
    )
    return checks, findings


def visible_check(framework: str, wanted: str, seen: dict, present: bool = True) -> Check:
    """``CUDA_VISIBLE_DEVICES=<wanted>``: the framework saw exactly that device (``seen``: its
    count and the UUID of device 0, as it says them; a framework that names no UUID is held to
    the count). ``present`` False: ``wanted`` is on no GPU here, and it must see none."""
    count, uuid = seen.get("count"), seen.get("uuid")
    if seen.get("error") and count is None:
        return Check(f"{framework} CUDA_VISIBLE_DEVICES={wanted}", FAIL, seen["error"])
    expected = 1 if present else 0
    ok = count == expected and (expected == 0 or uuid is None or same_uuid(uuid, wanted))
    said = f"{count} device(s)" + (f", device 0 {uuid}" if uuid else "")
    return check(f"{framework} CUDA_VISIBLE_DEVICES={wanted}", ok, f"{said}; wanted {expected}")


def same_uuid(a: str | None, b: str | None) -> bool:
    """Whether two device UUIDs are one: NVML's ``GPU-``/``MIG-`` prefix and the case aside
    (PyTorch and CuPy write them bare)."""
    if not a or not b:
        return False

    def bare(u: str) -> str:
        u = u.strip().lower()
        return u[4:] if u.startswith(("gpu-", "mig-")) else u

    return bare(a) == bare(b)


# ---- the report ---------------------------------------------------------------------------


def build_report(
    machine: dict,
    sections: list[Section],
    started: str,
    seconds: float,
    no_gpu: str = "",
    fake_nvml: str = "",
) -> dict:
    """report.json: the machine, each section, and the whole: ``skipped`` (no GPU: ``no_gpu``
    says why), ``fail`` when a section failed, else ``pass``."""
    counts = {s: sum(1 for x in sections if x.status == s) for s in (PASS, FAIL, SKIP)}
    if no_gpu:
        status, summary = SKIP, f"skipped: no GPU ({no_gpu})"
    else:
        status = FAIL if counts[FAIL] else PASS if counts[PASS] else SKIP
        summary = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"
    if fake_nvml:
        summary = f"FAKE NVML ({fake_nvml}): {summary}"
    return {
        "schema": SCHEMA,
        "started": started,
        "seconds": round(seconds, 1),
        "status": status,
        "summary": summary,
        "fake_nvml": fake_nvml or None,
        "machine": machine,
        "sections": [asdict(s) for s in sections],
    }


def render(report: dict) -> str:
    """The report as an organizer reads it: each section, its checks, its figures."""
    m = report["machine"]
    lines = [
        f"GPU proof of {m.get('hostname', '?')}, {report['started']} ({report['seconds']} s)",
        f"  {m.get('gpus') or 'no GPU'}; driver {m.get('driver') or '?'}; "
        f"python {m.get('python', '?')}; pynvml {m.get('pynvml') or 'missing'}",
    ]
    if report.get("fake_nvml"):
        lines.append(f"  FAKE NVML: {report['fake_nvml']} (tests only, not this machine's GPUs)")
    for s in report["sections"]:
        head = f"\n[{s['status'].upper():4}] {s['name']}: {s['title']} ({s['seconds']:.1f} s)"
        lines.append(head)
        if s["reason"] and s["status"] != PASS:
            lines.append(f"       {s['reason']}")
        for c in s["checks"]:
            lines.append(f"   {c['status']:4} {c['what']}: {c['detail']}")
        for key, value in s["findings"].items():
            if isinstance(value, (dict, list)):
                continue  # report.json keeps them
            lines.append(f"        {key} = {value}")
    lines.append(f"\n{report['summary']}")
    return "\n".join(lines)
