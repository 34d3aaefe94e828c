"""A JupyterHub spawner that gives each user's Swarm service a slice of one GPU."""

from .spawner import GPUSwarmSpawner, NoGPUSliceAvailable

__version__ = "0.1.0"

__all__ = ["GPUSwarmSpawner", "NoGPUSliceAvailable", "__version__"]
