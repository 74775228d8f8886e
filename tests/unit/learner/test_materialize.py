"""Gathering a weight for export or push: a one-rank mesh's shard is used as it is."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from aflowrl.learner.export import materialize


def test_a_one_rank_shard_is_the_full_tensor_without_a_copy():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        mesh = init_device_mesh("cpu", (1,))
        full = torch.arange(35, dtype=torch.float32).reshape(7, 5)
        for placement in (Shard(0), Shard(1), Replicate()):
            shard = distribute_tensor(full, mesh, [placement])
            out = materialize(shard)
            assert not isinstance(out, type(shard))  # a plain tensor, as full_tensor() gives
            assert torch.equal(out, full) and torch.equal(out, shard.full_tensor())
            assert out.data_ptr() == shard.to_local().data_ptr()  # no all-gather, no copy
            assert not out.requires_grad
        plain = torch.ones(3, requires_grad=True)
        assert materialize(plain).data_ptr() == plain.data_ptr()
        assert not materialize(plain).requires_grad
    finally:
        if created:
            dist.destroy_process_group()
