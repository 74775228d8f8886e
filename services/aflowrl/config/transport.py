"""How new policy weights travel from the learner to the rollout replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from aflowrl.config._base import FsPath, SpecModel

WireDtype = Literal["auto", "float32", "bfloat16", "float16"]
"""dtype weights travel in; "auto" is the rollout's own parameter dtype."""


class GrpcTransportSpec(SpecModel):
    """Chunked gRPC stream from learner rank 0 straight to each rollout replica (no shared storage).

    The learner gathers one tensor at a time and streams it while hashing, so neither side ever
    holds more than the model plus a few chunks.
    """

    type: Literal["grpc"] = "grpc"
    """Transport discriminator."""
    chunk_mib: int = Field(default=4, ge=1, le=1024)
    """Size of one stream message (MiB); also capped by grpc.maxMessageMib. grpc-python moves
    1-8 MiB messages fastest (bench/weight_push.py)."""
    dtype: WireDtype = "auto"
    """dtype sent over the wire; "auto" sends the rollout's dtype."""

    @property
    def shared_path(self) -> str | None:
        """The directory of weight versions learner and rollout pods share: none."""
        return None


class FilesystemTransportSpec(SpecModel):
    """Safetensors on a shared volume plus a version marker; the rollout loads on notice."""

    type: Literal["filesystem"] = "filesystem"
    """Transport discriminator."""
    path: FsPath = "/checkpoints/weights"
    """Directory on a volume both the learner and the rollout mount."""
    keep_versions: int = Field(default=2, ge=1, le=100)
    """Weight versions kept on the volume."""

    @property
    def shared_path(self) -> str:
        """The directory of weight versions learner and rollout pods share: ``path``."""
        return self.path


class NcclTransportSpec(SpecModel):
    """Broadcast from learner rank 0 to every rollout engine worker in one collective group.

    NCCL between GPUs; the same code runs on gloo where there is no GPU (tests, CPU runs). The
    group is formed once (its store on learner rank 0 at ``port``) and reused for every push;
    every learner rank takes part in gathering the sharded weights. A replica whose broadcast
    breaks off stops serving and is reloaded from a safetensors export under ``fallbackPath``
    (and a restarted replica loads the newest one there), so the learner and rollout pods must
    share that volume: on Kubernetes it must lie under ``trainer.checkpointDir`` on the run's
    claim (``storage.size``), which is then mounted in the rollout pods too.
    """

    type: Literal["nccl"] = "nccl"
    """Transport discriminator."""
    port: int = Field(default=29600, ge=1, le=65535)
    """Port of the weight-sync group's store on learner rank 0 (rollout pods dial it)."""
    bucket_mib: int = Field(default=256, ge=1, le=4095)
    """Tensors are packed and broadcast in buckets of this size (MiB): device memory of one
    bucket on each side, and one engine reload call per bucket."""
    dtype: WireDtype = "auto"
    """dtype broadcast; "auto" sends the rollout's dtype."""
    timeout_s: float = Field(default=600.0, ge=1.0, le=86400.0)
    """Seconds a member waits for the others (forming the group, each collective of a push)."""
    fallback_path: FsPath = "/checkpoints/weights"
    """Directory on a volume the learner and rollout pods share: where a replica whose broadcast
    failed is reloaded from (filesystem transport). On Kubernetes it must be under
    trainer.checkpointDir, and storage.size must be set (the claim both mount)."""
    keep_versions: int = Field(default=2, ge=1, le=100)
    """Weight versions kept under fallbackPath."""

    @property
    def shared_path(self) -> str:
        """The directory of weight versions learner and rollout pods share: ``fallbackPath``."""
        return self.fallback_path


WeightTransportSpec = Annotated[
    GrpcTransportSpec | FilesystemTransportSpec | NcclTransportSpec, Field(discriminator="type")
]
"""Weight transport: ``grpc`` (default), ``filesystem`` or ``nccl``."""


LEARNER_COLLECTIVE_TIMEOUT_S = 1800.0
"""The learner ranks' own collective timeout with the grpc and filesystem transports (s)."""
WEIGHT_GROUP_MARGIN_S = 300.0
"""How much longer than ``weightTransport.timeoutS`` the learner ranks' collectives wait (s)."""


def learner_collective_timeout_s(transport: WeightTransportSpec) -> float:
    """How long a learner rank waits in one of its own collectives (the process group's and
    the control group's timeout), derived from the transport rather than checked against it.

    With the nccl transport, learner rank 0 may wait up to ``weightTransport.timeoutS`` for one
    bucket of a broadcast to a stalled replica while the other ranks wait in the next gather
    (a collective of the learner's own group): the learner's timeout must outlast that wait,
    or torch's watchdog would end the whole learner for one stalled replica. So it is 30
    minutes, or ``timeoutS`` plus 5 minutes when that is longer (``timeoutS`` may be a day).
    """
    wait = transport.timeout_s if isinstance(transport, NcclTransportSpec) else 0.0
    return max(LEARNER_COLLECTIVE_TIMEOUT_S, wait + WEIGHT_GROUP_MARGIN_S)
