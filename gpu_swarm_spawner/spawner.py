"""GPUSwarmSpawner: each user's server is a Swarm service holding slices of one GPU."""

from __future__ import annotations

import os

from docker.types import Mount
from dockerspawner import SwarmSpawner
from traitlets import Dict, Integer, TraitError, Unicode, default, validate

from . import inventory, placement


class NoGPUSliceAvailable(RuntimeError):
    """No GPU has room for the request. ``jupyterhub_message`` is what the participant sees."""

    def __init__(self, message: str, log_message: str):
        super().__init__(log_message)
        self.jupyterhub_message = message


class GPUSwarmSpawner(SwarmSpawner):
    """A ``dockerspawner.SwarmSpawner`` that gives every server slices of exactly one GPU.

    GPUs are advertised to Swarm by the worker setup as discrete generic resources, one kind per
    GPU (the kind is the GPU UUID, the value its number of slices). At start the spawner reads
    the swarm's inventory, picks a GPU with the placement policy, reserves ``gpu_slices`` of that
    kind (Swarm enforces the count) and tells the container which device it holds.
    """

    gpu_slices = Integer(
        1,
        config=True,
        help="""
        How many slices of one GPU each server reserves. A GPU advertised as 3 slices holds
        three 1-slice servers, or one 3-slice ("full GPU") server. All slices of a server
        always come from the same GPU. Example: ``c.GPUSwarmSpawner.gpu_slices = 1``.
        """,
    )

    @validate("gpu_slices")
    def _validate_gpu_slices(self, proposal):
        if proposal.value < 1:
            raise TraitError(
                f"GPUSwarmSpawner.gpu_slices must be 1 or more, got {proposal.value}; "
                "every server needs at least one slice (use 1 for a shared GPU)"
            )
        return proposal.value

    gpu_kind_prefix = Unicode(
        inventory.DEFAULT_KIND_PREFIX,
        config=True,
        help="""
        Generic-resource kinds that start with this are GPUs; the rest of the kind is ignored
        for matching and the whole kind is the GPU UUID handed to the container.
        The worker setup advertises kinds like ``GPU-8d2c6f1e-...=3``. Default: ``GPU-``.
        """,
    )

    @validate("gpu_kind_prefix")
    def _validate_gpu_kind_prefix(self, proposal):
        if not proposal.value.strip():
            raise TraitError(
                "GPUSwarmSpawner.gpu_kind_prefix must not be empty: it selects which "
                "generic resources are GPUs; leave it at the default 'GPU-'"
            )
        return proposal.value

    placement_policy = Unicode(
        "spread",
        config=True,
        help="""
        How a GPU is chosen for a new server: ``spread`` (the GPU with most free slices, so each
        participant shares a GPU with as few others as possible) or ``pack`` (the busiest GPU
        that still fits, so whole machines can be emptied and switched off).
        """,
    )

    @validate("placement_policy")
    def _validate_placement_policy(self, proposal):
        if proposal.value not in placement.POLICIES:
            raise TraitError(
                f"GPUSwarmSpawner.placement_policy is {proposal.value!r}; "
                f"write one of: {', '.join(placement.POLICIES)}"
            )
        return proposal.value

    service_labels = Dict(
        config=True,
        help="""
        Labels put on every user service and home volume, e.g.
        ``{"gpu-jupyterhub.stack": "gpuhub"}``; ``make down`` finds what to remove by them.
        """,
    )

    @default("prefix")
    def _default_prefix(self):
        # services are named jy-<escaped username>[--<server name>]
        return "jy"

    @default("use_internal_ip")
    def _default_use_internal_ip(self):
        # the hub sits on the same attachable overlay and reaches servers by service name
        return True

    @default("extra_endpoint_spec")
    def _default_extra_endpoint_spec(self):
        # DNS round robin: works without IPVS and is all a single-task service needs
        return {"mode": "dnsrr"}

    # What the running server holds; persisted in the hub database (get_state/load_state).
    gpu_uuid = Unicode("")
    gpu_node = Unicode("")
    gpu_slices_held = Integer(0)

    # ---- choosing a GPU --------------------------------------------------------------------

    async def gpu_inventory(self) -> list[inventory.GPU]:
        """The swarm's GPUs and their used slices, read from the Docker API."""
        nodes = await self.docker("nodes")
        tasks = await self.docker("tasks", filters={"desired-state": "running"})
        return inventory.build_inventory(nodes, tasks, self.gpu_kind_prefix)

    async def reserve_gpu(self) -> inventory.GPU:
        """Pick the GPU for this server, or refuse at once with a message people understand."""
        gpus = await self.gpu_inventory()
        gpu = placement.choose(gpus, self.gpu_slices, self.placement_policy)
        if gpu is None:
            used, total = inventory.totals(gpus)
            detail = ", ".join(f"{g.node_name}:{g.uuid}={g.used}/{g.slices}" for g in gpus)
            raise NoGPUSliceAvailable(
                placement.refusal_message(gpus, self.gpu_slices),
                f"No GPU with {self.gpu_slices} free slice(s) for {self._log_name}: "
                f"{used}/{total} slices in use on {len(gpus)} GPU(s) ({detail or 'none'})",
            )
        return gpu

    async def start(self):
        gpu = await self.reserve_gpu()
        self.gpu_uuid, self.gpu_node, self.gpu_slices_held = (
            gpu.uuid,
            gpu.node_name,
            self.gpu_slices,
        )
        self.log.info(
            "Reserving %d slice(s) of %sGPU %s on %s for %s (%d/%d slices were free)",
            self.gpu_slices,
            "SIMULATED " if gpu.simulated else "",
            gpu.uuid,
            gpu.node_name,
            self._log_name,
            gpu.free,
            gpu.slices,
        )
        return await super().start()

    # ---- what goes into the service ----------------------------------------------------------

    def _resources_with_gpu(self) -> dict:
        generic = dict(self.extra_resources_spec.get("generic_resources") or {})
        generic[self.gpu_uuid] = self.gpu_slices_held
        return {**self.extra_resources_spec, "generic_resources": generic}

    async def create_object(self):
        # extra_resources_spec / extra_create_kwargs are read by the base class; this instance
        # serves one user, so setting them here affects only this server.
        self.extra_resources_spec = self._resources_with_gpu()
        labels = {
            **self.service_labels,
            **(self.extra_create_kwargs.get("labels") or {}),
            "gpu-jupyterhub.user": self.user.name,
            "gpu-jupyterhub.gpu": self.gpu_uuid,
            "gpu-jupyterhub.slices": str(self.gpu_slices_held),
        }
        self.extra_create_kwargs = {**self.extra_create_kwargs, "labels": labels}
        return await super().create_object()

    def get_env(self):
        env = super().get_env()
        if self.gpu_uuid:
            env.update(
                {
                    # the NVIDIA container runtime exposes only this device to the container
                    "NVIDIA_VISIBLE_DEVICES": self.gpu_uuid,
                    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                    # CUDA accepts UUIDs too, so this stays right with or without the runtime
                    "CUDA_VISIBLE_DEVICES": self.gpu_uuid,
                    "GPU_UUID": self.gpu_uuid,
                    "GPU_SLICES": str(self.gpu_slices_held),
                    "GPU_NODE": self.gpu_node,
                    "GPU_SIMULATED": "1" if inventory.is_simulated(self.gpu_uuid) else "0",
                    # TensorFlow otherwise grabs all memory of the GPU it shares with others
                    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
                }
            )
        return env

    @property
    def mounts(self):
        """Absolute sources are bind mounts; plain names are (labelled) named volumes.

        The base class makes every entry of ``volumes`` a bind mount, which cannot express the
        per-user named volume a home directory needs.
        """
        mounts = []
        for source, vol in self.volume_binds.items():
            read_only = vol["mode"] == "ro"
            if os.path.isabs(source):
                mounts.append(Mount(vol["bind"], source, type="bind", read_only=read_only))
            else:
                mounts.append(
                    Mount(
                        vol["bind"],
                        source,
                        type="volume",
                        read_only=read_only,
                        labels=dict(self.service_labels),
                        driver_config=self.mount_driver_config,
                    )
                )
        return mounts

    # ---- state ----------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.gpu_uuid:
            state.update(
                gpu_uuid=self.gpu_uuid, gpu_node=self.gpu_node, gpu_slices=self.gpu_slices_held
            )
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpu_uuid = state.get("gpu_uuid", "")
        self.gpu_node = state.get("gpu_node", "")
        self.gpu_slices_held = state.get("gpu_slices", 0)

    def clear_state(self):
        super().clear_state()
        self.gpu_uuid = ""
        self.gpu_node = ""
        self.gpu_slices_held = 0
