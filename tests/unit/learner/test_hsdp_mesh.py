"""The learner's FSDP mesh: 1-D on one node, HSDP (replicate across nodes, shard within a node)
when its ranks span nodes.

Four gloo ranks on this machine play two nodes of two ranks (``LOCAL_WORLD_SIZE=2``, as torchrun
sets it on each of two nodes): ``init_distributed`` builds the 2 x 2 mesh, and three AdamW steps
of a small model sharded on it end with the weights a single process gets from the mean of the
four ranks' losses, the same on every rank (gradients are averaged over all four ranks, not only
within a node).
"""

from __future__ import annotations

import multiprocessing
import socket
import traceback
from typing import Any

import pytest
import torch

from aflowrl.learner.distributed import mesh_shape

WORLD, PER_NODE, STEPS = 4, 2, 3


@pytest.mark.parametrize(
    ("world", "local", "shape"),
    [
        (1, 1, (1,)),
        (8, 8, (8,)),  # one node: every rank holds a shard
        (16, 8, (2, 8)),  # two nodes of eight: shard on the node, replicate across
        (32, 8, (4, 8)),
        (4, 1, (4,)),  # one rank per node: nothing to shard within a node
        (12, 8, (12,)),  # nodes of unequal size: a flat mesh
    ],
)
def test_the_mesh_is_hsdp_only_when_ranks_span_nodes(world, local, shape):
    assert mesh_shape(world, local) == shape


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(6, 16, generator=generator), torch.randn(6, 4, generator=generator)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _rank(rank: int, port: int, queue: Any) -> None:
    import os

    try:
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % PER_NODE),
                "WORLD_SIZE": str(WORLD),
                "LOCAL_WORLD_SIZE": str(PER_NODE),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Replicate, Shard

        from aflowrl.learner import distributed

        ctx = distributed.init_distributed()
        model = _model()
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=ctx.mesh)
        fully_shard(model, mesh=ctx.mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        x, y = _batch(rank)
        for _ in range(STEPS):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        weight = model[0].weight
        result = {
            "shape": tuple(ctx.mesh.shape),
            "names": ctx.mesh.mesh_dim_names,
            "placements": weight.placements == (Replicate(), Shard(0)),
            "local_rows": weight.to_local().shape[0],
            "params": [p.full_tensor().detach().clone() for p in model.parameters()],
        }
        distributed.shutdown()
        queue.put((rank, True, result))
    except BaseException:  # the parent reports it
        queue.put((rank, False, traceback.format_exc()))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_four_gloo_ranks_on_two_nodes_train_on_an_hsdp_mesh():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_rank, args=(r, port, queue)) for r in range(WORLD)]
    for process in processes:
        process.start()
    results: dict[int, dict[str, Any]] = {}
    try:
        for _ in range(WORLD):
            rank, ok, result = queue.get(timeout=240)
            if not ok:
                pytest.fail(f"rank {rank} failed:\n{result}")
            results[rank] = result
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    for result in results.values():
        assert result["shape"] == (2, 2)
        assert result["names"] == ("replicate", "shard")
        assert result["placements"]  # replicated across nodes, sharded within one
        assert result["local_rows"] == 32 // PER_NODE

    # One process, the mean of the four ranks' losses: what data parallelism over all four
    # ranks computes.
    reference = _model()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01)
    batches = [_batch(rank) for rank in range(WORLD)]
    for _ in range(STEPS):
        loss = sum(torch.nn.functional.mse_loss(reference(x), y) for x, y in batches) / WORLD
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for rank, result in results.items():
        for got, want in zip(result["params"], reference.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5, msg=f"rank {rank}")
