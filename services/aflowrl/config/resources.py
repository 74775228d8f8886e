"""Kubernetes-facing pieces shared by several components: resources, images, secrets."""

from __future__ import annotations

from dataclasses import dataclass
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


ImageKind = Literal["env", "gpu", "cpu"]
"""The project's run images: ``env`` (no torch: environment and trainer pods), ``gpu`` (CUDA
torch and vLLM: rollout and learner pods with GPUs), ``cpu`` (CPU torch: rollout and learner
pods that request no GPU)."""


@dataclass(frozen=True)
class ImageDefaults:
    """The images of runs that leave ``spec.images.<kind>`` unset: the operator's settings
    (the chart's ``runDefaults``), ``<registry>/aflow-rl-<kind>:<tag>`` unless one is given in
    full."""

    registry: str = "ghcr.io/aflow-rl"
    """Registry and path the images are pulled from (``localhost/aflow-rl`` for kind)."""
    tag: str = "0.1.0"
    """Tag of every image (the chart's appVersion by default)."""
    env: str | None = None
    """The env image in full, overriding registry and tag."""
    gpu: str | None = None
    """The GPU image in full, overriding registry and tag."""
    cpu: str | None = None
    """The CPU image in full, overriding registry and tag."""

    def image(self, kind: ImageKind) -> str:
        """The reference of one image."""
        given: str | None = getattr(self, kind)
        return given or f"{self.registry.rstrip('/')}/aflow-rl-{kind}:{self.tag}"


class ImageSpec(SpecModel):
    """Container images of the run's pods. An image left unset is the operator's default for
    runs (the chart's ``runDefaults``: ``<registry>/aflow-rl-<kind>:<tag>``), so one setting of
    the chart moves every run to a mirror."""

    env: ImageRef | None = None
    """Slim image (no torch) for the environment service and the trainer; unset: the
    operator's default (``aflow-rl-env``)."""
    gpu: ImageRef | None = None
    """Image with CUDA torch and vLLM for rollout and learner pods that request GPUs; unset:
    the operator's default (``aflow-rl-gpu``)."""
    cpu: ImageRef | None = None
    """Image with the CPU build of torch (no vLLM) for rollout and learner pods that request no
    GPU; unset: the operator's default (``aflow-rl-cpu``)."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes imagePullPolicy of every container."""
    pull_secrets: list[DnsLabel] = Field(default_factory=list, max_length=8)
    """Names of image pull Secrets."""

    def image(self, kind: ImageKind, defaults: ImageDefaults | None = None) -> str:
        """The image of ``kind``: the spec's, else ``defaults``' (the built-in ones when None)."""
        given: str | None = getattr(self, kind)
        return given or (defaults or ImageDefaults()).image(kind)

    def torch_image(self, gpus: int) -> str:
        """The image of a rollout or learner pod asking for ``gpus``: GPU, or CPU with none."""
        return self.image("gpu" if gpus else "cpu")

    def with_defaults(self, defaults: ImageDefaults) -> ImageSpec:
        """This spec with every unset image taken from ``defaults``."""
        kinds: tuple[ImageKind, ...] = ("env", "gpu", "cpu")
        return self.model_copy(update={kind: self.image(kind, defaults) for kind in kinds})
