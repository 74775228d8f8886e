"""Whether the RDMA devices a pod asked for are there, before NCCL would quietly do without.

A pod with ``resources.rdma`` above 0 gets ``AFLOWRL_RDMA_DEVICES`` and NCCL settings that
choose InfiniBand / RoCE (``aflowrl_operator.pods.accelerator_env``). Without a device under
``/dev/infiniband`` (no device plugin, a wrong resource name, a host without HCAs) NCCL would
fall back to TCP sockets and run many times slower without a word; ``aflowrl serve`` checks first
and stops with a message naming the field, which becomes the pod's termination message and the
run's ``status.lastError``.
"""

from __future__ import annotations

from pathlib import Path

from aflowrl.errors import FailedPreconditionError

DEVICE_DIR = Path("/dev/infiniband")


def devices(root: Path = DEVICE_DIR) -> list[str]:
    """The RDMA verbs devices present (``uverbs0``...)."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.name.startswith("uverbs"))


def check(requested: int, root: Path = DEVICE_DIR) -> list[str]:
    """The devices present; raises when ``requested`` (``resources.rdma``) is above 0 and there
    are none."""
    found = devices(root)
    if requested > 0 and not found:
        raise FailedPreconditionError(
            f"resources.rdma={requested} but no RDMA device in {root} (RdmaUnavailable): NCCL "
            "would fall back to TCP sockets; check the RDMA device plugin and "
            "resources.rdmaResourceName, or set resources.rdma to 0"
        )
    return found
