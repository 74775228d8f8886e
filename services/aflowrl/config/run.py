"""``RunSpec``: one whole training run, the ``spec`` of a ``TrainingRun`` resource.

The same document drives ``aflowrl train -f run.yaml`` and ``kubectl apply -f run.yaml``.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from aflowrl.config._base import SpecModel
from aflowrl.config.environment import NEEDS_DATA_DIR, EnvironmentSpec
from aflowrl.config.errors import ConfigError
from aflowrl.config.learner import GiGPOSpec, GRPOSpec, LearnerSpec, PPOSpec
from aflowrl.config.monitoring import GrpcSpec, MonitoringSpec
from aflowrl.config.policy import PolicySpec
from aflowrl.config.resources import ImageSpec, SchedulingSpec
from aflowrl.config.rollout import RolloutSpec
from aflowrl.config.trainer import TrainerSpec
from aflowrl.config.transport import GrpcTransportSpec, WeightTransportSpec

API_GROUP = "aflowrl.io"
API_VERSION = "v1alpha1"
KIND = "TrainingRun"
PLURAL = "trainingruns"


class StorageSpec(SpecModel):
    """Persistent storage for checkpoints, weights (filesystem transport) and artifacts."""

    size: str | None = Field(default=None, pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    """Create a PersistentVolumeClaim of this size for trainer.checkpointDir (e.g. "50Gi");
    empty: an emptyDir (checkpoints do not survive the pod)."""
    storage_class_name: str | None = Field(default=None, max_length=253)
    """StorageClass of the claim; empty uses the cluster default."""
    access_mode: str = Field(default="ReadWriteOnce", pattern=r"^(ReadWriteOnce|ReadWriteMany)$")
    """Access mode of the claim (ReadWriteMany when learner and rollout share it across nodes)."""


class RunSpec(SpecModel):
    """A training run of a workflow-optimizer policy (``TrainingRun.spec``)."""

    policy: PolicySpec = Field(default_factory=PolicySpec)
    """The model trained by RL."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Rollout (generation) replicas."""
    learner: LearnerSpec = Field(default_factory=LearnerSpec)
    """The learner: ranks, FSDP, optimiser, algorithm."""
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    """Environment replicas: benchmark, executor, search."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """The RL loop."""
    weight_transport: WeightTransportSpec = Field(default_factory=GrpcTransportSpec)
    """How weights reach the rollout replicas."""
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    """Metrics and logs."""
    grpc: GrpcSpec = Field(default_factory=GrpcSpec)
    """gRPC limits and security."""
    storage: StorageSpec = Field(default_factory=StorageSpec)
    """Persistent storage for checkpoints (Kubernetes)."""
    images: ImageSpec = Field(default_factory=ImageSpec)
    """Container images (Kubernetes)."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """GPU pod placement (Kubernetes)."""
    suspend: bool = False
    """Scale every component to zero, keeping the run's checkpoints and status; false resumes."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunSpec:
        env, learner, search = self.environment, self.learner, self.environment.search
        algo = learner.algorithm
        if search.selection == "fused" and search.value_source == "none":
            raise ValueError(
                "environment.search.selection='fused' needs environment.search.valueSource "
                "('critic' or 'anchor-mc'); 'none' would fuse UCB with a silent zero"
            )
        if search.value_source == "critic" and not isinstance(algo, PPOSpec):
            raise ValueError(
                "environment.search.valueSource='critic' needs a critic: set "
                f"learner.algorithm.type='ppo' (it is {algo.type!r})"
            )
        if isinstance(algo, GiGPOSpec | GRPOSpec) and self.trainer.group_size < 2:
            raise ValueError(
                f"trainer.groupSize={self.trainer.group_size} is too small for "
                f"learner.algorithm.type={algo.type!r}: group advantages need at least 2 episodes"
            )
        if self.rollout.sampling.max_tokens > self.policy.max_response_tokens:
            raise ValueError(
                f"rollout.sampling.maxTokens={self.rollout.sampling.max_tokens} exceeds "
                f"policy.maxResponseTokens={self.policy.max_response_tokens}"
            )
        needed = self.policy.max_prompt_tokens + self.policy.max_response_tokens
        if self.rollout.engine == "vllm" and self.rollout.vllm.max_model_len < needed:
            raise ValueError(
                f"rollout.vllm.maxModelLen={self.rollout.vllm.max_model_len} is below "
                f"policy.maxPromptTokens + policy.maxResponseTokens = {needed}"
            )
        learner_gpus, rollout_gpus = learner.resources.gpus, self.rollout.resources.gpus
        if self.weight_transport.type == "nccl" and (learner_gpus > 0) != (rollout_gpus > 0):
            raise ValueError(
                "weightTransport.type='nccl' needs the learner and the rollout on the same kind "
                f"of device (learner.resources.gpus={learner_gpus}, "
                f"rollout.resources.gpus={rollout_gpus}): a broadcast runs NCCL between GPUs or "
                "gloo between CPUs"
            )
        rows = self.trainer.tasks_per_iteration * self.trainer.group_size
        if learner.loss.mini_batch_size > rows * env.search.max_steps:
            raise ValueError(
                f"learner.loss.miniBatchSize={learner.loss.mini_batch_size} exceeds the rows of "
                f"one iteration (trainer.tasksPerIteration x trainer.groupSize x "
                f"environment.search.maxSteps = {rows * env.search.max_steps})"
            )
        return self

    def needs_data_dir(self) -> bool:
        """Whether the benchmark needs ``environment.data.dir`` (no packaged copy exists)."""
        return self.environment.benchmark in NEEDS_DATA_DIR

    # ---- documents -----------------------------------------------------------------------

    def to_document(self, *, exclude_defaults: bool = False) -> dict[str, Any]:
        """The spec as a JSON-compatible dict with camelCase keys."""
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=exclude_defaults)

    @classmethod
    def from_document(cls, doc: Any, *, source: str = "") -> RunSpec:
        """Validate a bare spec mapping or a whole ``TrainingRun`` document.

        Raises :class:`ConfigError` whose message names each bad field as ``spec.a.b``.
        """
        where = source or "spec"
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise ConfigError([f"{where}: expected a mapping, got {type(doc).__name__}"])
        if "kind" in doc or "apiVersion" in doc:
            kind, api_version = doc.get("kind"), doc.get("apiVersion")
            if kind != KIND or api_version != f"{API_GROUP}/{API_VERSION}":
                raise ConfigError(
                    [
                        f"{where}: expected kind {KIND} of apiVersion {API_GROUP}/{API_VERSION}, "
                        f"got kind {kind!r} of apiVersion {api_version!r}"
                    ]
                )
            doc = doc.get("spec") or {}
            if not isinstance(doc, dict):
                raise ConfigError([f"{where}: spec must be a mapping"])
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            raise ConfigError.from_validation_error(exc, prefix="spec", source=source) from None

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "") -> RunSpec:
        """Parse YAML (a bare spec or a TrainingRun) and validate it."""
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError([f"{source or 'spec'}: not valid YAML: {exc}"]) from None
        return cls.from_document(doc, source=source)
