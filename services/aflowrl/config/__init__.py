"""Configuration of aflow-rl: pydantic models only (no I/O beyond parsing, no heavy imports).

``RunSpec`` is a whole training run and the ``spec`` of the ``TrainingRun`` custom resource;
``TrainingRunStatus`` is its status; :func:`crd.training_run_crd` generates the CRD from both.
Services, the trainer and the operator all import their settings from here.
"""

from aflowrl.config.environment import (
    BENCHMARKS,
    EnvironmentSpec,
    OpenAIExecutorSpec,
    SearchSpec,
    SurrogateExecutorSpec,
)
from aflowrl.config.errors import ConfigError
from aflowrl.config.learner import GiGPOSpec, GRPOSpec, LearnerSpec, PolicyLossSpec, PPOSpec
from aflowrl.config.monitoring import GrpcSpec, MonitoringSpec
from aflowrl.config.policy import BUILT_IN_MODELS, TINY_MODEL, PolicySpec
from aflowrl.config.resources import ImageDefaults, ImageSpec, ResourceSpec, SecretKeyRef
from aflowrl.config.rollout import RolloutSpec, SamplingSpec
from aflowrl.config.run import (
    API_GROUP,
    API_VERSION,
    KIND,
    PLURAL,
    RunSpec,
    StorageSpec,
    multi_node_replicas,
    served_executor,
)
from aflowrl.config.status import CONDITION_TYPES, Condition, TrainingRunStatus
from aflowrl.config.trainer import TrainerSpec
from aflowrl.config.transport import (
    FilesystemTransportSpec,
    GrpcTransportSpec,
    NcclTransportSpec,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "BENCHMARKS",
    "BUILT_IN_MODELS",
    "CONDITION_TYPES",
    "KIND",
    "PLURAL",
    "TINY_MODEL",
    "Condition",
    "ConfigError",
    "EnvironmentSpec",
    "FilesystemTransportSpec",
    "GRPOSpec",
    "GiGPOSpec",
    "GrpcSpec",
    "GrpcTransportSpec",
    "ImageDefaults",
    "ImageSpec",
    "LearnerSpec",
    "MonitoringSpec",
    "NcclTransportSpec",
    "OpenAIExecutorSpec",
    "PPOSpec",
    "PolicyLossSpec",
    "PolicySpec",
    "ResourceSpec",
    "RolloutSpec",
    "RunSpec",
    "SamplingSpec",
    "SearchSpec",
    "SecretKeyRef",
    "StorageSpec",
    "SurrogateExecutorSpec",
    "TrainerSpec",
    "TrainingRunStatus",
    "multi_node_replicas",
    "served_executor",
]
