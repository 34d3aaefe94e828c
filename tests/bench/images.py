"""`make bench-images`: the real environment images, built and proven (tests/bench/images.sh
brings up the bed's manager, whose engine builds them from the single-user image and PyPI).

For each environment (images/pytorch, images/tensorflow): the build time without Docker's cache
(the downloads included), the image's size and what its environment layer adds to the
single-user image, then ``check-environment`` in a container of it with the environment a
spawner gives a server holding 1 of 3 slices of a (simulated) GPU with a 4096 MB budget: the
framework's import time, a tiny model trained on the CPU, the kernel JupyterLab lists, the
framework told the budget, gpu-info, TensorBoard. The check that needs a GPU (one device, the
right UUID) is skipped here and says so. Figures printed; the exit status is 1 when a build or
a check failed.

    python -m tests.bench.images [--only pytorch|tensorflow] [--cached]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import docker

from tests.integration.hub import REPO

ENVIRONMENTS = ("pytorch", "tensorflow")
SINGLEUSER = "gpu-jupyterhub/singleuser:latest"
GPU = "GPU-simulated-bench-0"
#: what GPUSwarmSpawner.get_env gives a server holding 1 of 3 slices with a 4096 MB budget
SERVER_ENV = {
    "NVIDIA_VISIBLE_DEVICES": GPU,
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    "CUDA_VISIBLE_DEVICES": GPU,
    "GPU_UUID": GPU,
    "GPU_SLICES": "1",
    "GPU_NODE": "bench",
    "GPU_SIMULATED": "1",
    "GPU_ISOLATION": "shared",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "GPU_MEMORY_LIMIT_MB": "4096",
    "GPU_MEMORY_FRACTION": "0.333",
}


def build(environment: str, cached: bool) -> tuple[float, str]:
    """Seconds to build ``gpu-jupyterhub/<environment>:latest``, and the build's last lines."""
    image = f"gpu-jupyterhub/{environment}:latest"
    command = ["docker", "build", "-f", f"images/{environment}/Dockerfile", "-t", image, "."]
    if not cached:
        command.insert(2, "--no-cache")
    t0 = time.monotonic()
    result = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, DOCKER_BUILDKIT="0"),
    )
    seconds = time.monotonic() - t0
    if result.returncode:
        raise RuntimeError(f"building {image} failed:\n{result.stdout[-3000:]}{result.stderr}")
    return seconds, result.stdout.strip().splitlines()[-1]


def sizes(image: str) -> tuple[int, int]:
    """(the image's size, the size its last layers add to the single-user image), bytes."""
    client = docker.from_env()
    total = client.images.get(image).attrs["Size"]
    return total, total - client.images.get(SINGLEUSER).attrs["Size"]


def check(image: str) -> dict:
    """check-environment's report from a container of ``image`` with a server's environment
    (whatever its exit status: a failed check is in the report)."""
    client = docker.from_env()
    container = client.containers.run(
        image, ["check-environment", "--json"], environment=SERVER_ENV, detach=True
    )
    try:
        container.wait(timeout=1800)
        output = container.logs(stdout=True, stderr=False).decode().strip()
        if not output:
            raise RuntimeError(container.logs(stderr=True).decode()[-3000:])
        return json.loads(output.splitlines()[-1])
    finally:
        container.remove(force=True)


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=ENVIRONMENTS)
    parser.add_argument("--cached", action="store_true", help="let Docker reuse its cache")
    args = parser.parse_args()
    failures = 0
    base = docker.from_env().images.get(SINGLEUSER).attrs["Size"]
    print(f"single-user image {SINGLEUSER}: {gb(base)}", flush=True)
    for environment in [args.only] if args.only else ENVIRONMENTS:
        image = f"gpu-jupyterhub/{environment}:latest"
        print(f"\n== {image} (images/{environment}/Dockerfile) ==", flush=True)
        try:
            seconds, last = build(environment, args.cached)
        except RuntimeError as e:
            print(f"  {e}", flush=True)
            failures += 1
            continue
        total, added = sizes(image)
        print(f"  built in {seconds:.0f} s ({last}); {gb(total)}, {gb(added)} over the single-user")
        try:
            report = check(image)
        except RuntimeError as e:
            print(f"  check-environment printed no report:\n{e}", flush=True)
            failures += 1
            continue
        for name, result in report["checks"].items():
            print(f"  {name:12s} {result['status']:8s} {result['detail']}", flush=True)
        failures += sum(r["status"] == "FAILED" for r in report["checks"].values())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
