"""What a server holds, as one record: its GPU slices (or the machine of a server without a
GPU), from its reservation until its stop.

The spawner keeps one ``Holding`` (``GPUSwarmSpawner.holding``): made from the broker's
reservation when a start takes it, read by the service's spec (``service_spec``), the
dashboard's events and the health checks, written to the hub's database and read back from it
(``state``/``from_state``, under the keys hubs have always written), and replaced by an empty
one when the server stops. Nothing here reads a spawner, the hub or Docker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Holding:
    """The GPU a server holds: ``slices`` of ``gpu`` (a GPU or MIG UUID) on ``node``, of the
    ``total_slices`` it is advertised as, with a memory budget of ``memory_mb`` (0: none); or
    no GPU (``gpu`` ""), on ``cpu_node`` when the participant asked for a server without one
    (``cpu_only``)."""

    gpu: str = ""
    node: str = ""
    slices: int = 0
    total_slices: int = 0
    memory_mb: int = 0
    cpu_only: bool = False
    cpu_node: str = ""
    node_cores: float = 0.0  # CPU cores of the machine it runs on; 0: unknown

    @classmethod
    def of(cls, reservation) -> Holding:
        """What a server holds once it takes ``reservation`` (``broker.Reservation``)."""
        gpu = reservation.gpu
        return cls(
            gpu=gpu.uuid,
            node=gpu.node_name,
            slices=reservation.slices,
            total_slices=gpu.slices,
            memory_mb=gpu.memory_budget_mb(reservation.slices),
            node_cores=gpu.cores,
        )

    @property
    def machine(self) -> str:
        """The machine the server runs on ("" when none was chosen: Swarm chooses)."""
        return self.node or self.cpu_node

    def state(self) -> dict:
        """The keys of the server's state in the hub's database: those of its GPU, the keys
        servers have had since 0.1 ({} without a GPU)."""
        if not self.gpu:
            return {}
        return {
            "gpu_uuid": self.gpu,
            "gpu_node": self.node,
            "gpu_slices": self.slices,
            "gpu_memory_mb": self.memory_mb,
        }

    @classmethod
    def from_state(cls, state: dict) -> Holding:
        """The holding ``state`` (a spawner's state as ``state`` wrote it) was written for;
        what the database never held (the GPU's total slices, the machine's cores) is 0."""
        return cls(
            gpu=state.get("gpu_uuid", ""),
            node=state.get("gpu_node", ""),
            slices=state.get("gpu_slices", 0),
            memory_mb=state.get("gpu_memory_mb", 0) or 0,
        )
