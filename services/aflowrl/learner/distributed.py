"""torch.distributed set-up of the learner ranks and the control plane between them.

Ranks are started by torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``... in the environment);
a learner started without torchrun is a group of one (an in-memory store, no port). Compute
collectives use NCCL on CUDA and gloo on CPU; with ``learner.fsdp.cpuOffload`` on CUDA the
default group is ``cpu:gloo,cuda:nccl``, since offloaded gradients are CPU tensors whose
all-reduce (``clip_grad_norm_``) an NCCL-only group refuses. A second group, always gloo, carries
the commands rank 0 broadcasts: waiting ranks block there, not in NCCL, whose watchdog would
kill an idle learner. Its timeout is the learner's collective timeout, and rank 0 sends an idle
command (a heartbeat) whenever its command thread has been idle a quarter of it: an idle learner
lives on, while ranks whose rank 0 is wedged time out and end the learner (torchrun restarts it)
instead of waiting for weeks.

The FSDP mesh is 1-D (every rank holds a shard) while the ranks share a node, and 2-D when they
span nodes (HSDP, :func:`mesh_shape`): parameters are sharded over the ranks of a node and
replicated across nodes, so each layer's all-gather and reduce-scatter stay on the node's
NVLink, and only one all-reduce of the sharded gradients per step crosses the network.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from aflowrl import envs

logger = logging.getLogger(__name__)

HEARTBEAT_FRACTION = 0.25
"""Rank 0 sends an idle command (a heartbeat) once its command thread has been idle this
fraction of the collective timeout, so the other ranks' waits on the control group can time out
for real: a rank 0 that is wedged (not merely idle) ends the learner within the timeout."""


@dataclass(frozen=True)
class DistContext:
    """This rank's place in the learner."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    """"nccl", "gloo" or "cpu:gloo,cuda:nccl" (compute collectives)."""
    mesh: DeviceMesh
    control: Any
    """The gloo process group commands travel on."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def compute_backend(*, cuda: bool, cpu_offload: bool) -> str:
    """The default group's backend (module docstring)."""
    if not cuda:
        return "gloo"
    return "cpu:gloo,cuda:nccl" if cpu_offload else "nccl"


def mesh_shape(world_size: int, local_world_size: int) -> tuple[int, ...]:
    """The FSDP device mesh: ``(world,)`` on one node; ``(nodes, ranks per node)`` (replicate,
    shard) when the ranks span several nodes of equal size (module docstring)."""
    if 1 < local_world_size < world_size and world_size % local_world_size == 0:
        return (world_size // local_world_size, local_world_size)
    return (world_size,)


def init_distributed(*, cpu_offload: bool = False, timeout_s: float = 1800.0) -> DistContext:
    """Join (or create) the learner's process group; idempotent per process.

    ``timeout_s``: of every collective, the control group's included
    (:func:`aflowrl.config.transport.learner_collective_timeout_s`).
    """
    timeout = timedelta(seconds=timeout_s)
    cuda = torch.cuda.is_available()
    backend = compute_backend(cuda=cuda, cpu_offload=cpu_offload)
    if cuda:
        device = torch.device("cuda", envs.LOCAL_RANK % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        if envs.MASTER_ADDR is None and envs.WORLD_SIZE == 1:
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
        else:
            dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    control = dist.new_group(backend="gloo", timeout=timeout)
    shape = mesh_shape(world, envs.LOCAL_WORLD_SIZE)
    if len(shape) == 2:
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, shape)
    logger.info(
        "learner rank %d of %d on %s (%s), FSDP mesh %s",
        rank,
        world,
        device,
        backend,
        "x".join(map(str, shape)) + (" (HSDP: replicate x shard)" if len(shape) == 2 else ""),
    )
    return DistContext(rank, world, device, backend, mesh, control)


def broadcast_object(ctx: DistContext, obj: Any = None) -> Any:
    """Rank 0's ``obj`` on every rank (over the control group)."""
    if ctx.world_size == 1:
        return obj
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, group=ctx.control)
    return box[0]


def gather_objects(ctx: DistContext, obj: Any) -> list[Any] | None:
    """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere)."""
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0, group=ctx.control)
    return out


def gather_all(ctx: DistContext, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (over the control group)."""
    if ctx.world_size == 1:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=ctx.control)
    return out


def all_reduce_sum(ctx: DistContext, values: torch.Tensor) -> torch.Tensor:
    """Element-wise sum over ranks (in float64 on the compute device)."""
    if ctx.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1:
        dist.barrier(group=ctx.control)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
