"""Cooperative GPU memory caps: each framework is told the server's GPU memory budget.

A participant's server holds slices of one GPU that others share, and a budget of its memory
(``GPU_MEMORY_LIMIT_MB``, set by the spawner). The frameworks that can cap their own allocator
are told that budget as they load, so a well-behaved notebook stays under it and never meets the
GPU guard:

- **JAX**: ``XLA_PYTHON_CLIENT_MEM_FRACTION``, which JAX reads when it starts; ``start-singleuser``
  sets it (``python3 -m gpu_caps xla-fraction``) unless it is set already.
- **TensorFlow**: a logical device with a memory limit in MB on each GPU
  (``tf.config.set_logical_device_configuration``), right after ``import tensorflow`` and before
  TensorFlow sets up the GPU. Memory growth (``TF_FORCE_GPU_ALLOW_GROWTH``) stays as it is: with
  a limit, TensorFlow grows up to the limit; where no limit could be set, growth is what is left.
- **PyTorch**: ``torch.cuda.set_per_process_memory_fraction`` on each GPU, queued on ``import
  torch`` to run when PyTorch initialises CUDA (importing torch does not touch the GPU).

Each cap leaves a reserve below the budget (``GPU_CAPS_RESERVE_MB``, default 512, at most a
quarter of the budget) for the CUDA context and libraries, which no framework counts but the
guard does.

Installed in the single-user image's site-packages with ``gpu_caps.pth``, whose one line runs
``install()`` at every Python start. ``install()`` does nothing unless ``GPU_MEMORY_LIMIT_MB`` is
set; then it puts an import finder first on ``sys.meta_path`` that notices the first import of
``tensorflow`` and ``torch``, lets the real loader load them, and applies the cap. Nothing here
ever makes an import fail: a framework whose API differs, or that raises, is left as it loaded.

Environment: ``GPU_MEMORY_LIMIT_MB`` (the budget, MB), ``GPU_MEMORY_FRACTION`` (slices held / the
GPU's slices, e.g. ``0.333``; without it PyTorch's fraction is worked out from the GPU's memory
and JAX gets none), ``GPU_CAPS`` (``off``: no caps at all; ``verbose``: one line on stderr for
each cap applied or not), ``GPU_CAPS_RESERVE_MB``.

Standard library only: it runs in every Python process of the image.
"""

from __future__ import annotations

import math
import os
import sys

MIB = 1 << 20
DEFAULT_RESERVE_MB = 512
#: what ``apply`` calls, by top-level module name; a module is capped once per process
FRAMEWORKS = ("tensorflow", "torch")
#: what was done, for a look from a notebook: {"torch": "fraction 0.3211 on 1 GPU(s)", ...}
applied: dict[str, str] = {}


class Budget:
    """The server's budget as the environment gives it; ``cap_mb`` is what frameworks get."""

    def __init__(self, limit_mb: int, fraction: float | None, reserve_mb: int):
        self.limit_mb = limit_mb
        self.fraction = fraction  # of the whole GPU's memory; None: not given
        self.cap_mb = limit_mb - min(reserve_mb, limit_mb // 4)

    @property
    def whole_gpu(self) -> bool:
        """A server holding every slice shares the GPU with nobody: no cap."""
        return self.fraction is not None and self.fraction >= 1

    def cap_fraction(self, total_mb: float | None = None) -> float | None:
        """The cap as a fraction of the GPU's memory, rounded down to 4 places; from
        GPU_MEMORY_FRACTION, else from the GPU's memory ``total_mb`` when known."""
        if self.fraction is not None:
            share = self.fraction * self.cap_mb / self.limit_mb
        elif total_mb:
            share = self.cap_mb / total_mb
        else:
            return None
        return math.floor(share * 10000) / 10000


def budget_from(environ=os.environ) -> Budget | None:
    """The budget, or None: no GPU_MEMORY_LIMIT_MB, a value that is not a positive number, or
    GPU_CAPS=off."""
    if environ.get("GPU_CAPS", "").strip().lower() == "off":
        return None
    try:
        limit_mb = int(float(environ.get("GPU_MEMORY_LIMIT_MB", "")))
    except ValueError:
        return None
    if limit_mb <= 0:
        return None
    try:
        fraction = float(environ.get("GPU_MEMORY_FRACTION", ""))
    except ValueError:
        fraction = None
    if fraction is not None and not 0 < fraction <= 1:
        fraction = None
    try:
        reserve_mb = max(0, int(environ.get("GPU_CAPS_RESERVE_MB", DEFAULT_RESERVE_MB)))
    except ValueError:
        reserve_mb = DEFAULT_RESERVE_MB
    return Budget(limit_mb, fraction, reserve_mb)


def _note(message: str) -> None:
    if os.environ.get("GPU_CAPS", "").strip().lower() == "verbose":
        print(f"gpu-caps: {message}", file=sys.stderr)


def cap_tensorflow(tf, budget: Budget) -> None:
    """A logical device with ``budget.cap_mb`` MB on each GPU TensorFlow sees."""
    config = tf.config
    gpus = config.list_physical_devices("GPU")
    for gpu in gpus:
        limit = config.LogicalDeviceConfiguration(memory_limit=budget.cap_mb)
        config.set_logical_device_configuration(gpu, [limit])
    applied["tensorflow"] = f"memory limit {budget.cap_mb} MB on {len(gpus)} GPU(s)"
    _note(f"TensorFlow: {applied['tensorflow']}")


def cap_torch(torch, budget: Budget) -> None:
    """The per-process memory fraction on each GPU, set when PyTorch initialises CUDA (through
    the hook torch.cuda keeps for that, which runs at once if CUDA is initialised already)."""
    cuda = torch.cuda
    lazy_call = cuda._lazy_call  # AttributeError: another API; nothing is done

    def set_fraction() -> None:
        # runs inside PyTorch's CUDA initialisation: it must never raise there
        try:
            count = cuda.device_count()
            done = []
            for device in range(count):
                total_mb = cuda.get_device_properties(device).total_memory / MIB
                fraction = budget.cap_fraction(total_mb)
                if fraction is not None and fraction < 1:
                    cuda.set_per_process_memory_fraction(fraction, device)
                    done.append(fraction)
            applied["torch"] = f"fraction {min(done, default=1)} on {len(done)} of {count} GPU(s)"
            _note(f"PyTorch: {applied['torch']}")
        except Exception as error:  # a cap never breaks the framework
            _note(f"PyTorch: no cap ({type(error).__name__}: {error})")

    applied["torch"] = "queued until CUDA starts"
    lazy_call(set_fraction)


def apply(name: str, module, budget: Budget) -> None:
    """Cap the framework ``name`` just loaded as ``module``; never raises."""
    try:
        (cap_tensorflow if name == "tensorflow" else cap_torch)(module, budget)
    except Exception as error:  # a cap never breaks the import
        applied[name] = f"not capped ({type(error).__name__})"
        _note(f"{name}: no cap ({type(error).__name__}: {error})")


class _ThenCap:
    """The real loader of a framework, and the cap once it has run."""

    def __init__(self, loader, name: str, budget: Budget):
        self._loader, self._name, self._budget = loader, name, budget

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        try:
            self._loader.exec_module(module)
        finally:  # the module keeps its own loader, as if this one had never been there
            module.__loader__ = self._loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        apply(self._name, module, self._budget)

    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)


class CapFinder:
    """First on sys.meta_path: hands the first import of each framework to the finders after
    it, and wraps the loader they return so that the cap follows the module's execution."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.pending = set(FRAMEWORKS)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        try:
            finders = sys.meta_path[sys.meta_path.index(self) + 1 :]
        except ValueError:
            return None
        for finder in finders:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if getattr(spec.loader, "exec_module", None) is None:
            return spec
        spec.loader = _ThenCap(spec.loader, fullname, self.budget)
        return spec


def install(environ=os.environ) -> CapFinder | None:
    """Put the finder first on sys.meta_path when there is a budget (once); never raises."""
    try:
        budget = budget_from(environ)
        if budget is None or budget.whole_gpu:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, CapFinder):
                return finder
        finder = CapFinder(budget)
        sys.meta_path.insert(0, finder)
        return finder
    except Exception:  # runs at every Python start
        return None


def xla_fraction(environ=os.environ) -> str:
    """XLA_PYTHON_CLIENT_MEM_FRACTION for JAX, or "" (no budget, no GPU_MEMORY_FRACTION, or
    a whole GPU)."""
    budget = budget_from(environ)
    if budget is None or budget.whole_gpu:
        return ""
    fraction = budget.cap_fraction()
    return f"{fraction:.4f}" if fraction else ""


def main(argv: list[str]) -> int:
    if argv == ["xla-fraction"]:
        print(xla_fraction())
        return 0
    print("usage: python3 -m gpu_caps xla-fraction", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
