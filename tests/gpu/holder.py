"""A CUDA process that holds GPU memory on request, for tests/gpu/prove.sh.

    python3 tests/gpu/holder.py torch|cupy|jax

It loads the framework, makes its CUDA context on device 0 and says so on stdout, one JSON
line: ``{"ready": true, "pid": ..., "framework": ..., "version": ..., "count": ..., "name":
..., "uuid": ..., "total_mb": ..., "caps": {...}}`` (or ``{"ready": false, "error": ...}`` and
exit 1). Then it answers one JSON line for each line read on stdin:

- ``{"op": "alloc", "mb": N}``: N MiB more, in pieces of at most 1 GiB; ``{"ok": true,
  "held_mb": ...}``, or ``{"ok": false, "oom": true|false, "error": "Type: message",
  "allocated_mb": what of the N it got}`` (what it got is kept until ``free``);
- ``{"op": "free"}``: everything given back to the GPU (the framework's cache too);
- ``{"op": "stats"}``: ``held_mb``, the memory its allocator holds from the GPU.

It ends when stdin closes. What the framework prints goes to stderr: stdout carries only
these lines. With ``PROVE_PTH=FILE`` it first runs the ``import`` lines of that .pth file, as
Python's site does for the single-user image's gpu_caps.pth.

Standard library and the framework only: it runs with the machine's python.
"""

from __future__ import annotations

import gc
import json
import os
import sys

MIB = 1 << 20
PIECE_MB = 1024


class Torch:
    def __init__(self):
        import torch

        self.torch = torch
        self.version = torch.__version__
        torch.cuda.init()  # what gpu_caps queued runs here
        self.count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        self.name, self.total_mb = props.name, props.total_memory // MIB
        self.uuid = str(getattr(props, "uuid", "")) or None
        self.buffers = [torch.zeros(1, device="cuda:0")]  # the context

    def alloc(self, mb: int):
        buffer = self.torch.empty(mb * MIB, dtype=self.torch.uint8, device="cuda:0")
        self.torch.cuda.synchronize()
        return buffer

    def release(self) -> None:
        self.torch.cuda.empty_cache()

    def held_mb(self) -> float:
        return self.torch.cuda.memory_reserved(0) / MIB


class CuPy:
    def __init__(self):
        import cupy

        self.cupy = cupy
        self.version = cupy.__version__
        self.count = cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(0).use()
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", b"")
        self.name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        self.total_mb = int(props.get("totalGlobalMem", 0)) // MIB
        self.uuid = dashed(props.get("uuid"))
        self.buffers = [cupy.zeros(1, dtype=cupy.uint8)]  # the context

    def alloc(self, mb: int):
        buffer = self.cupy.empty(mb * MIB, dtype=self.cupy.uint8)
        self.cupy.cuda.Device(0).synchronize()
        return buffer

    def release(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def held_mb(self) -> float:
        return self.cupy.get_default_memory_pool().total_bytes() / MIB


class Jax:
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.jnp = jnp
        self.version = jax.__version__
        self.devices = jax.devices("gpu")
        self.count = len(self.devices)
        self.name, self.uuid, self.total_mb = self.devices[0].device_kind, None, None
        self.buffers = [jnp.zeros(1).block_until_ready()]  # the context (and the preallocation)

    def alloc(self, mb: int):
        return self.jnp.zeros((mb * MIB,), dtype=self.jnp.uint8).block_until_ready()

    def release(self) -> None:
        gc.collect()

    def stats(self) -> dict:
        return dict(self.devices[0].memory_stats() or {})

    def held_mb(self) -> float | None:
        stats = self.stats()
        for key in ("pool_bytes", "bytes_reserved", "bytes_limit"):
            if stats.get(key):
                return stats[key] / MIB
        return None


def dashed(raw) -> str | None:
    """CuPy's 16 bytes of a device UUID as PyTorch writes one (8-4-4-4-12 hex digits)."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 16:
        return None
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


FRAMEWORKS = {"torch": Torch, "cupy": CuPy, "jax": Jax}


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is the framework's out-of-memory error: PyTorch's and CuPy's
    OutOfMemoryError, XLA's RESOURCE_EXHAUSTED."""
    text = f"{type(error).__name__} {error}".lower()
    return "outofmemory" in text or "out of memory" in text or "resource_exhausted" in text


def said(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}"


def run_pth(path: str) -> None:
    with open(path) as f:
        for line in f:
            if line.startswith(("import ", "import\t")):
                exec(line)


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the framework's own prints go to stderr

    def say(answer: dict) -> None:
        out.write(json.dumps(answer) + "\n")

    if len(argv) != 1 or argv[0] not in FRAMEWORKS:
        say({"ready": False, "error": f"usage: holder.py {'|'.join(FRAMEWORKS)}"})
        return 2
    try:
        if os.environ.get("PROVE_PTH"):
            run_pth(os.environ["PROVE_PTH"])
        held = FRAMEWORKS[argv[0]]()
    except BaseException as e:  # no framework, no CUDA device: said, then out
        say({"ready": False, "error": said(e)})
        return 1
    caps = getattr(sys.modules.get("gpu_caps"), "applied", None)
    say(
        {
            "ready": True,
            "pid": os.getpid(),
            "framework": argv[0],
            "version": held.version,
            "count": held.count,
            "name": held.name,
            "uuid": held.uuid,
            "total_mb": held.total_mb,
            "caps": dict(caps) if caps is not None else None,
            "stats": held.stats() if hasattr(held, "stats") else None,
        }
    )
    kept: list = []
    for line in sys.stdin:
        try:
            ask = json.loads(line)
        except ValueError:
            say({"ok": False, "error": f"not JSON: {line.strip()[:80]}"})
            continue
        op = ask.get("op")
        if op == "alloc":
            wanted, got = int(ask["mb"]), 0
            try:
                while got < wanted:
                    piece = min(PIECE_MB, wanted - got)
                    kept.append(held.alloc(piece))
                    got += piece
            except Exception as e:
                say({"ok": False, "oom": is_oom(e), "error": said(e), "allocated_mb": got})
                continue
            say({"ok": True, "allocated_mb": got, "held_mb": held.held_mb()})
        elif op == "free":
            kept.clear()
            gc.collect()
            held.release()
            say({"ok": True, "held_mb": held.held_mb()})
        elif op == "stats":
            stats = held.stats() if hasattr(held, "stats") else None
            say({"ok": True, "held_mb": held.held_mb(), "stats": stats})
        else:
            say({"ok": False, "error": f"unknown op {op!r}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
