"""Kubernetes-facing pieces shared by several components: resources, images, secrets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from aflowrl.config._base import DnsLabel, Quantity, SpecModel

ResourceName = Annotated[
    str,
    Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        max_length=253,
    ),
]
"""An extended resource name such as ``nvidia.com/gpu`` or ``rdma/ib``."""


class ResourceSpec(SpecModel):
    """Compute resources of one pod of a component (requests; limits equal requests for GPUs)."""

    cpu: Quantity = "1"
    """CPU cores requested (Kubernetes quantity, e.g. "500m", "4")."""
    memory: Quantity = "2Gi"
    """Memory requested (Kubernetes quantity, e.g. "16Gi"); also the pod's memory limit."""
    gpus: int = Field(default=0, ge=0, le=16)
    """GPUs per pod (``nvidia.com/gpu``); 0 runs on CPU."""
    gpu_resource_name: ResourceName = "nvidia.com/gpu"
    """Extended resource name of the GPU device plugin."""
    shm_size: Quantity | None = None
    """Size limit of the pod's memory-backed ``/dev/shm`` (rollout, learner, served executor),
    where torch, NCCL and vLLM exchange tensors. Pages written there count against the pod's
    memory limit, so keep ``memory`` large enough for both; empty: limited by ``memory``."""
    rdma: int = Field(default=0, ge=0, le=16)
    """RDMA devices per pod (InfiniBand/RoCE for NCCL across nodes); above 0 the pod also gets
    the IPC_LOCK capability, which RDMA needs to pin memory."""
    rdma_resource_name: ResourceName = "rdma/ib"
    """Extended resource name of the RDMA device plugin (e.g. ``rdma/ib``,
    ``rdma/rdma_shared_device_a``, ``nvidia.com/hostdev``)."""


class SecretKeyRef(SpecModel):
    """A key of a Kubernetes Secret in the run's namespace."""

    name: DnsLabel
    """Name of the Secret."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key within the Secret's data."""


ImageRef = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^\s]+$")]
"""A container image reference (``registry/name:tag`` or ``@sha256:...``)."""


class ImageSpec(SpecModel):
    """Container images of the run's pods."""

    env: ImageRef = "ghcr.io/aflow-rl/aflow-rl-env:0.1.0"
    """Slim image (no torch) for the environment service and the trainer."""
    gpu: ImageRef = "ghcr.io/aflow-rl/aflow-rl-gpu:0.1.0"
    """Image with torch (and vLLM) for the rollout and learner services."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes imagePullPolicy of every container."""
    pull_secrets: list[DnsLabel] = Field(default_factory=list, max_length=8)
    """Names of image pull Secrets."""
