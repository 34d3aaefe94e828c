"""FAKE NVML: the tests' stand-in for nvidia-ml-py's ``pynvml``, never a driver.

A process imports it only when this folder (tests/fakes/pynvml_shim) is first on its
PYTHONPATH, and then it serves the GPUs of the fixture FAKE_NVML_FIXTURE names
(tests/fixtures/nvml/*.json; the double is tests/fakes/nvml.py). It says so on stderr when
loaded, and the driver's version it answers says FAKE. Without a fixture named it refuses to
load and ends the process with one line saying so: nothing gets fake GPUs, or runs without
NVML, by a stray PYTHONPATH. See docs/development.md.
"""

import os
import sys
from pathlib import Path

_FIXTURE = os.environ.get("FAKE_NVML_FIXTURE", "")
if not _FIXTURE:  # SystemExit: no `except Exception` on the way can take it for "no NVML"
    raise SystemExit(
        f"error: FAKE NVML refused: {Path(__file__).parent} is on PYTHONPATH, so `import "
        "pynvml` finds the tests' fake NVML, but FAKE_NVML_FIXTURE names no fixture. For the "
        "fake, set FAKE_NVML_FIXTURE=/path/to/tests/fixtures/nvml/<file>.json; for the real "
        "NVML, take that folder off PYTHONPATH"
    )

_REPO = str(Path(__file__).resolve().parents[3])
if _REPO not in sys.path:
    sys.path.append(_REPO)

from tests.fakes.nvml import serve  # noqa: E402

# `import pynvml` gives what sys.modules holds once this module has run: the double
sys.modules[__name__] = serve(_FIXTURE)
