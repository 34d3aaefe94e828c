"""A JupyterHub spawner that gives each user's Swarm service a slice of one GPU.

The spawner is imported on first use: the package's pure modules (``contract``, ``inventory``,
``tasks``, ``roster``, ...) then import without JupyterHub, dockerspawner or jinja2, so GPU
machines and the config-file reader (``deploy.settings``) need nothing but the standard library
(and nvidia-ml-py for NVML).
"""

import os

__version__ = "0.1.0"

#: The hub's page templates that extend JupyterHub's (``c.JupyterHub.template_paths``).
HUB_TEMPLATES = os.path.join(os.path.dirname(__file__), "templates", "hub")

__all__ = ["GPUSwarmSpawner", "HUB_TEMPLATES", "NoGPUSliceAvailable", "SpawnFailed", "__version__"]


def __getattr__(name):
    if name in ("GPUSwarmSpawner", "NoGPUSliceAvailable", "SpawnFailed"):
        from . import spawner

        return getattr(spawner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
