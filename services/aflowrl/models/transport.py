"""Which weight transports can run here, checked by the rollout and learner before loading.

``grpc`` and ``filesystem`` run anywhere. ``nccl`` (:mod:`aflowrl.models.broadcast`) runs
NCCL between GPUs and gloo between CPUs (``RunSpec`` already refuses a learner and a rollout on
different kinds of device); this checks that the torch build here can run it.
"""

from __future__ import annotations

from aflowrl.config import RunSpec
from aflowrl.models.errors import TransportUnavailableError


def check_weight_transport(spec: RunSpec) -> None:
    """Raise :class:`TransportUnavailableError` for a transport this process cannot serve."""
    if spec.weight_transport.type != "nccl":
        return
    import torch

    if not torch.distributed.is_available():
        raise TransportUnavailableError(
            "weightTransport.type='nccl' needs torch.distributed, which this torch build lacks"
        )
    if torch.cuda.is_available() and not torch.distributed.is_nccl_available():
        raise TransportUnavailableError(
            "weightTransport.type='nccl': this machine has CUDA but torch has no NCCL; use "
            "'grpc' or 'filesystem'"
        )
