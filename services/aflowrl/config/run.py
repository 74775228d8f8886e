"""``RunSpec``: one whole training run, the ``spec`` of a ``TrainingRun`` resource.

The same document drives ``aflowrl train -f run.yaml`` and ``kubectl apply -f run.yaml``, and is
read the same way by both (:meth:`SpecModel.validate_document`). A bare spec is checked as a
run; a whole ``TrainingRun`` document is checked as the cluster admits it: its name, and the
rules that only hold on Kubernetes (:func:`cluster_problems`), which the CRD carries as CEL.
Fields in :data:`IMMUTABLE_FIELDS` cannot change once a run exists (CEL transition rules in the
CRD; the operator checks them again against the spec its children were built from).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from aflowrl import documents
from aflowrl.config import _cel
from aflowrl.config._base import CelRule, DnsSubdomain, FieldRuleError, SpecModel
from aflowrl.config.environment import (
    MIXED,
    NEEDS_DATA_DIR,
    EnvironmentSpec,
    OpenAIExecutorSpec,
    ServedExecutorSpec,
)
from aflowrl.config.errors import ConfigError
from aflowrl.config.learner import GiGPOSpec, GRPOSpec, LearnerSpec, PPOSpec
from aflowrl.config.monitoring import GrpcSpec, MonitoringSpec
from aflowrl.config.network import NetworkPolicySpec
from aflowrl.config.policy import PolicySpec
from aflowrl.config.resources import ImageSpec
from aflowrl.config.rollout import VLLM_LORA_RANKS, RolloutSpec
from aflowrl.config.scheduling import NcclSpec, SchedulingSpec
from aflowrl.config.trainer import TrainerSpec
from aflowrl.config.transport import GrpcTransportSpec, WeightTransportSpec

API_GROUP = "aflowrl.io"
API_VERSION = "v1alpha1"
KIND = "TrainingRun"
PLURAL = "trainingruns"

MAX_RUN_NAME = 40
"""Longest TrainingRun name: children append suffixes such as ``-executor`` and StatefulSet pods
get ``-learner-<ordinal>`` plus a revision hash in a 63-character label."""
RUN_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A TrainingRun's name: a DNS-1035 label, because its Services are named after it."""
MAX_GROUP_NAME = 50
"""Longest name of a multi-node replica's LeaderWorkerSet, ``<run>-rollout-<i>`` or
``<run>-executor-<i>``: the LWS controller names the group's worker StatefulSet ``<name>-0``,
and a StatefulSet's pods carry ``<statefulset>-<10-character hash>`` in a 63-character label
(kubernetes/kubernetes#64023), so a longer name would leave the group without pods."""

IMMUTABLE_FIELDS: tuple[tuple[str, str], ...] = (
    ("policy", "the checkpoints hold this model's weights"),
    ("learner.nodes", "the learner's sharded checkpoint has this topology"),
    ("learner.procsPerNode", "the learner's sharded checkpoint has this topology"),
    ("learner.resources.gpus", "the learner's ranks are one per GPU"),
    ("learner.algorithm.type", "a critic cannot appear or vanish mid-run"),
    ("environment.benchmarks", "rewards and scores would stop being comparable"),
    ("environment.benchmarkWeights", "the task distribution of a resumed run would change"),
    ("environment.heldOutBenchmarks", "a held-out benchmark must stay unseen by training"),
    ("environment.executor.type", "the evaluation cache and rewards depend on the executor"),
    ("environment.executor.model", "the evaluation cache and rewards depend on the executor"),
    ("environment.executor.seed", "the surrogate executor's answers depend on it"),
    ("environment.executor.calibration", "the surrogate executor's answers depend on it"),
    ("trainer.seed", "the run's episodes are derived from it"),
    ("trainer.groupSize", "advantage groups of a resumed run must keep their size"),
    ("trainer.checkpointDir", "the run resumes from this directory"),
    ("weightTransport.type", "the rollout and learner pods are wired for one transport"),
    ("storage", "a claim's size, class and access mode are fixed once it exists"),
)
"""(camelCase path, why) of every spec field that cannot change once a run exists; a path to an
object covers each of its fields."""


class StorageSpec(SpecModel):
    """Persistent storage for checkpoints, weights (filesystem transport) and artifacts."""

    size: str | None = Field(default=None, pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$", max_length=32)
    """Create a PersistentVolumeClaim of this size for trainer.checkpointDir (e.g. "50Gi");
    empty: an emptyDir (checkpoints do not survive the pod)."""
    storage_class_name: DnsSubdomain | None = None
    """StorageClass of the claim; empty uses the cluster default."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany"] = "ReadWriteOnce"
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
    """Environment replicas: benchmarks, executor, search."""
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
    """GPU pod placement and gang scheduling (Kubernetes)."""
    nccl: NcclSpec = Field(default_factory=NcclSpec)
    """NCCL environment of the learner and rollout pods (Kubernetes)."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Who may reach the run's pods (Kubernetes NetworkPolicies; off by default)."""
    suspend: bool = False
    """Scale every component to zero, keeping the run's checkpoints and status; false resumes.
    Under Kueue (a kueue.x-k8s.io/queue-name label) the operator sets it true while the run's
    Workload is not admitted, marked by the annotation aflowrl.io/suspended-by: kueue, and false
    on admission; a suspend without that annotation is the user's: it deactivates the Workload
    and the operator never turns it off."""

    cel_rules = (
        CelRule(
            "!({environment.search.selection} == 'fused' "
            "&& {environment.search.valueSource} == 'none')",
            "selection 'fused' needs a valueSource ('policy', 'critic' or 'anchor-mc')",
            "environment.search.valueSource",
        ),
        CelRule(
            "{environment.search.valueSource} != 'policy' || {policy.value.enabled}",
            "valueSource 'policy' needs the policy's value (policy.value.enabled)",
            "environment.search.valueSource",
        ),
        CelRule(
            "{environment.search.valueSource} != 'critic' || {learner.algorithm.type} == 'ppo'",
            "valueSource 'critic' needs learner.algorithm.type 'ppo'",
            "environment.search.valueSource",
        ),
        CelRule(
            "{learner.algorithm.type} == 'ppo' || {trainer.groupSize} >= 2",
            "group advantages (gigpo, grpo) need trainer.groupSize of at least 2",
            "trainer.groupSize",
        ),
        CelRule(
            "{rollout.sampling.maxTokens} <= {policy.maxResponseTokens}",
            "rollout.sampling.maxTokens exceeds policy.maxResponseTokens",
            "rollout.sampling.maxTokens",
        ),
        CelRule(
            "{rollout.engine} != 'vllm' "
            "|| {rollout.vllm.maxModelLen} >= "
            "{policy.maxPromptTokens} + {policy.maxResponseTokens}",
            "rollout.vllm.maxModelLen is below policy.maxPromptTokens + policy.maxResponseTokens",
            "rollout.vllm.maxModelLen",
        ),
        CelRule(
            "{rollout.engine} != 'vllm' || !{?policy.lora.rank} "
            f"|| {{!policy.lora.rank}} <= {VLLM_LORA_RANKS[-1]}",
            f"rollout.engine 'vllm' serves LoRA adapters of rank {VLLM_LORA_RANKS[-1]} at most",
            "policy.lora.rank",
        ),
        CelRule(
            "{weightTransport.type} != 'nccl' "
            "|| (({learner.resources.gpus} > 0) == ({rollout.resources.gpus} > 0))",
            "weightTransport.type 'nccl' needs the learner and the rollout on the same kind of "
            "device (NCCL between GPUs, gloo between CPUs)",
            "weightTransport.type",
        ),
        CelRule(
            "{learner.loss.miniBatchSize} <= "
            "{trainer.tasksPerIteration} * {trainer.groupSize} * {environment.search.maxSteps}",
            "learner.loss.miniBatchSize exceeds the rows of one iteration",
            "learner.loss.miniBatchSize",
        ),
        # Ports of one pod must differ (a second listener dies with "address in use").
        *(
            CelRule(
                f"!({{{field}}} in [{', '.join('{' + o + '}' for o in others)}])",
                f"{field} is another port of the same pod",
                field,
            )
            for field, others in (
                ("rollout.port", ["monitoring.metricsPort"]),
                ("environment.port", ["monitoring.metricsPort"]),
                ("learner.port", ["monitoring.metricsPort"]),
                ("learner.rendezvousPort", ["learner.port", "monitoring.metricsPort"]),
            )
        ),
        CelRule(
            "{weightTransport.type} != 'nccl' || !({weightTransport.port} in "
            "[{learner.port}, {learner.rendezvousPort}, {monitoring.metricsPort}])",
            "weightTransport.port is another port of the learner's pods",
            "weightTransport.port",
        ),
        CelRule(
            "!{?grpc.tlsSecret} || !({grpc.healthPort} in [{rollout.port}, {environment.port}, "
            "{learner.port}, {learner.rendezvousPort}, {monitoring.metricsPort}] "
            "|| ({weightTransport.type} == 'nccl' && {grpc.healthPort} == {weightTransport.port}))",
            "grpc.healthPort is another port of a pod it is served in",
            "grpc.healthPort",
        ),
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunSpec:
        env, learner, search = self.environment, self.learner, self.environment.search
        algo = learner.algorithm
        broken: list[tuple[str, str]] = []
        if search.selection == "fused" and search.value_source == "none":
            broken.append(
                (
                    "environment.search.valueSource",
                    "environment.search.selection='fused' needs environment.search.valueSource "
                    "('policy', 'critic' or 'anchor-mc'); 'none' would fuse UCB with a silent "
                    "zero",
                )
            )
        if search.value_source == "policy" and not self.policy.value.enabled:
            broken.append(
                (
                    "environment.search.valueSource",
                    "environment.search.valueSource='policy' needs the policy's value "
                    "(policy.value.enabled is false)",
                )
            )
        if search.value_source == "critic" and not isinstance(algo, PPOSpec):
            broken.append(
                (
                    "environment.search.valueSource",
                    "environment.search.valueSource='critic' needs a critic: set "
                    f"learner.algorithm.type='ppo' (it is {algo.type!r})",
                )
            )
        if isinstance(algo, GiGPOSpec | GRPOSpec) and self.trainer.group_size < 2:
            broken.append(
                (
                    "trainer.groupSize",
                    f"trainer.groupSize={self.trainer.group_size} is too small for "
                    f"learner.algorithm.type={algo.type!r}: group advantages need at least 2 "
                    "episodes",
                )
            )
        if self.rollout.sampling.max_tokens > self.policy.max_response_tokens:
            broken.append(
                (
                    "rollout.sampling.maxTokens",
                    f"rollout.sampling.maxTokens={self.rollout.sampling.max_tokens} exceeds "
                    f"policy.maxResponseTokens={self.policy.max_response_tokens}",
                )
            )
        needed = self.policy.max_prompt_tokens + self.policy.max_response_tokens
        if self.rollout.engine == "vllm" and self.rollout.vllm.max_model_len < needed:
            broken.append(
                (
                    "rollout.vllm.maxModelLen",
                    f"rollout.vllm.maxModelLen={self.rollout.vllm.max_model_len} is below "
                    f"policy.maxPromptTokens + policy.maxResponseTokens = {needed}",
                )
            )
        lora = self.policy.lora
        if self.rollout.engine == "vllm" and lora is not None and lora.rank > VLLM_LORA_RANKS[-1]:
            broken.append(
                (
                    "policy.lora.rank",
                    f"policy.lora.rank={lora.rank} is above {VLLM_LORA_RANKS[-1]}, the largest "
                    "adapter rank rollout.engine='vllm' serves",
                )
            )
        learner_gpus, rollout_gpus = learner.resources.gpus, self.rollout.resources.gpus
        if self.weight_transport.type == "nccl" and (learner_gpus > 0) != (rollout_gpus > 0):
            broken.append(
                (
                    "weightTransport.type",
                    "weightTransport.type='nccl' needs the learner and the rollout on the same "
                    f"kind of device (learner.resources.gpus={learner_gpus}, "
                    f"rollout.resources.gpus={rollout_gpus}): a broadcast runs NCCL between GPUs "
                    "or gloo between CPUs",
                )
            )
        rows = self.trainer.tasks_per_iteration * self.trainer.group_size
        if learner.loss.mini_batch_size > rows * env.search.max_steps:
            broken.append(
                (
                    "learner.loss.miniBatchSize",
                    f"learner.loss.miniBatchSize={learner.loss.mini_batch_size} exceeds the rows "
                    "of "
                    f"one iteration (trainer.tasksPerIteration x trainer.groupSize x "
                    f"environment.search.maxSteps = {rows * env.search.max_steps})",
                )
            )
        broken += self._port_collisions()
        FieldRuleError.raise_any(broken)
        return self

    def _port_collisions(self) -> list[tuple[str, str]]:
        """Ports of one pod that are equal (the CEL twins above, field for field)."""
        metrics = self.monitoring.metrics_port
        ln = self.learner
        checks: list[tuple[str, int, dict[str, int]]] = [
            ("rollout.port", self.rollout.port, {"monitoring.metricsPort": metrics}),
            ("environment.port", self.environment.port, {"monitoring.metricsPort": metrics}),
            ("learner.port", ln.port, {"monitoring.metricsPort": metrics}),
            (
                "learner.rendezvousPort",
                ln.rendezvous_port,
                {"learner.port": ln.port, "monitoring.metricsPort": metrics},
            ),
        ]
        learner_ports = {
            "learner.port": ln.port,
            "learner.rendezvousPort": ln.rendezvous_port,
            "monitoring.metricsPort": metrics,
        }
        transport = self.weight_transport
        if transport.type == "nccl":
            checks.append(("weightTransport.port", transport.port, learner_ports))
        if self.grpc.tls_secret is not None:
            served = {
                "rollout.port": self.rollout.port,
                "environment.port": self.environment.port,
                **learner_ports,
            }
            if transport.type == "nccl":
                served["weightTransport.port"] = transport.port
            checks.append(("grpc.healthPort", self.grpc.health_port, served))
        broken = []
        for field, port, others in checks:
            same = [name for name, other in others.items() if other == port]
            if same:
                broken.append(
                    (
                        field,
                        f"{field}={port} is also {', '.join(same)}: two listeners of one pod "
                        "on one port (the second dies with 'address already in use')",
                    )
                )
        return broken

    def needs_data_dir(self) -> bool:
        """Whether a served benchmark needs ``environment.data.dir`` (no packaged copy)."""
        return bool(self.environment.needing_data_dir)

    # ---- documents -----------------------------------------------------------------------

    def to_document(self, *, exclude_defaults: bool = False) -> dict[str, Any]:
        """The spec as a JSON-compatible dict with camelCase keys (unset fields left out, as
        the API server stores them)."""
        return self.model_dump(
            mode="json", by_alias=True, exclude_defaults=exclude_defaults, exclude_none=True
        )

    @classmethod
    def from_document(cls, doc: Any, *, source: str = "") -> RunSpec:
        """Validate a bare spec mapping or a whole ``TrainingRun`` document.

        An empty document (``null``, an empty file) is refused: write ``{}`` for the defaults.
        A TrainingRun is checked as the cluster admits it (its name and :func:`cluster_problems`
        too). Raises :class:`ConfigError` whose message names each bad field as ``spec.a.b``.
        """
        where = source or "spec"
        if doc is None:
            raise ConfigError(
                [f"{where}: the document is empty (write {{}} for the default run)"], [where]
            )
        if not isinstance(doc, dict):
            raise ConfigError([f"{where}: expected a mapping, got {type(doc).__name__}"], [where])
        if "kind" not in doc and "apiVersion" not in doc:
            return cls._validate_spec(doc, source)
        kind, api_version = doc.get("kind"), doc.get("apiVersion")
        if kind != KIND or api_version != f"{API_GROUP}/{API_VERSION}":
            raise ConfigError(
                [
                    f"{where}: expected kind {KIND} of apiVersion {API_GROUP}/{API_VERSION}, "
                    f"got kind {kind!r} of apiVersion {api_version!r}"
                ],
                ["kind"],
            )
        found: list[tuple[str, str]] = []
        name = (
            (doc.get("metadata") or {}).get("name")
            if isinstance(doc.get("metadata"), dict)
            else None
        )
        if isinstance(name, str) and (
            len(name) > MAX_RUN_NAME or not re.match(RUN_NAME_PATTERN, name)
        ):
            found.append(
                (
                    "metadata.name",
                    f"{name!r} must be a DNS-1035 label of at most {MAX_RUN_NAME} characters "
                    "(its children append suffixes such as -learner-0)",
                )
            )
        spec_doc = doc.get("spec")
        if not isinstance(spec_doc, dict):
            shown = "missing" if "spec" not in doc else f"got {spec_doc!r}"[:80]
            found.append(
                ("spec", f"a TrainingRun needs a spec mapping ({shown}; {{}} is the default run)")
            )
            raise ConfigError.from_problems(found, source=source)
        try:
            spec = cls._validate_spec(spec_doc, source)
        except ConfigError as exc:
            raise ConfigError(
                [*ConfigError.from_problems(found, source=source).problems, *exc.problems],
                [*(path for path, _ in found), *exc.fields],
            ) from None
        found += cluster_problems(spec)
        if isinstance(name, str):
            found += group_name_problems(name, spec)
        if found:
            raise ConfigError.from_problems(found, source=source)
        return spec

    @classmethod
    def _validate_spec(cls, doc: dict[str, Any], source: str) -> RunSpec:
        try:
            return cls.validate_document(doc)
        except ValidationError as exc:
            raise ConfigError.from_validation_error(
                exc, prefix="spec", source=source, model=cls
            ) from None

    @classmethod
    def from_yaml(cls, text: str, *, source: str = "") -> RunSpec:
        """Parse YAML (a bare spec or a TrainingRun) and validate it.

        The document is read with :func:`aflowrl.documents.load_yaml`: bounded in size and depth,
        no aliases, no repeated keys (kubectl refuses those too, so the CLI and the cluster read
        a run file alike)."""
        try:
            doc = documents.load_yaml(text, source=source or "spec")
        except documents.DocumentError as exc:
            raise ConfigError([str(exc)]) from None
        return cls.from_document(doc, source=source)


CLUSTER_RULES: tuple[CelRule, ...] = (
    CelRule(
        "!({environment.benchmarks}.exists(b, b in "
        + repr([*sorted(NEEDS_DATA_DIR), MIXED])
        + ") || {environment.heldOutBenchmarks}.exists(b, b in "
        + repr(sorted(NEEDS_DATA_DIR))
        + ")) || {?environment.data.dir}",
        "a served benchmark has no packaged copy: set environment.data.dir (and "
        "data.persistentVolumeClaim holding the split files)",
        "environment.data.dir",
    ),
    CelRule(
        "{weightTransport.type} != 'filesystem' || {?storage.size}",
        "weightTransport.type 'filesystem' needs a claim shared by the learner and rollout pods",
        "storage.size",
    ),
    CelRule(
        "{weightTransport.type} != 'filesystem' || {weightTransport.path}.startsWith("
        "{trainer.checkpointDir}.endsWith('/') ? {trainer.checkpointDir} "
        ": {trainer.checkpointDir} + '/')",
        "weightTransport.path must be under trainer.checkpointDir (the shared volume)",
        "weightTransport.path",
    ),
    CelRule(
        "{weightTransport.type} != 'nccl' || {?storage.size}",
        "weightTransport.type 'nccl' reloads a replica whose broadcast broke off from "
        "weightTransport.fallbackPath: it needs a claim shared by the learner and rollout pods",
        "storage.size",
    ),
    CelRule(
        "{weightTransport.type} != 'nccl' || {weightTransport.fallbackPath}.startsWith("
        "{trainer.checkpointDir}.endsWith('/') ? {trainer.checkpointDir} "
        ": {trainer.checkpointDir} + '/')",
        "weightTransport.fallbackPath must be under trainer.checkpointDir (the shared volume)",
        "weightTransport.fallbackPath",
    ),
    CelRule(
        "{learner.nodes} == 1 || {?storage.size}",
        "several learner nodes write one sharded checkpoint and must resume from the same one: "
        "set storage.size (a ReadWriteMany claim), not per-pod emptyDirs",
        "storage.size",
    ),
    CelRule(
        "!({learner.nodes} > 1 && {?storage.size}) || {storage.accessMode} == 'ReadWriteMany'",
        "several learner nodes write one sharded checkpoint: use accessMode ReadWriteMany",
        "storage.accessMode",
    ),
    CelRule(
        "!{grpc.mtls} || {?grpc.tlsSecret}",
        "grpc.mtls needs TLS: name the certificate's Secret in grpc.tlsSecret",
        "grpc.mtls",
    ),
)
"""The CEL twins of :func:`cluster_problems`, on the CRD's ``spec``."""


def served_executor(spec: RunSpec) -> ServedExecutorSpec | None:
    """The executor the run serves itself (``environment.executor.serve``), None for an
    external endpoint or the surrogate."""
    exe = spec.environment.executor
    return exe.serve if isinstance(exe, OpenAIExecutorSpec) else None


def multi_node_replicas(spec: RunSpec) -> dict[str, int]:
    """Replica counts of the components whose replicas span nodes (``rollout``, ``executor``:
    one LeaderWorkerSet each on Kubernetes)."""
    out = {}
    if spec.rollout.nodes_per_replica > 1:
        out["rollout"] = spec.rollout.replicas
    serve = served_executor(spec)
    if serve is not None and serve.nodes_per_replica > 1:
        out["executor"] = serve.replicas
    return out


def group_name_problems(name: str, spec: RunSpec) -> list[tuple[str, str]]:
    """A run name too long for its replicas' LeaderWorkerSets (:data:`MAX_GROUP_NAME`)."""
    problems = []
    for component, replicas in multi_node_replicas(spec).items():
        longest = f"{name}-{component}-{replicas - 1}"
        if len(longest) > MAX_GROUP_NAME:
            problems.append(
                (
                    "metadata.name",
                    f"{name!r} is too long for {replicas} {component} replicas spanning nodes: "
                    f"their LeaderWorkerSets are named up to {longest!r}, and the LeaderWorkerSet "
                    f"controller needs at most {MAX_GROUP_NAME} characters; use a name of at most "
                    f"{MAX_GROUP_NAME - len(longest) + len(name)} characters",
                )
            )
    return problems


JsonRule = dict[str, str]


def _group_name_rule(component: str, node: str) -> JsonRule:
    """The CEL twin of :func:`group_name_problems` for one component, on the whole TrainingRun
    (the only place a rule can read ``metadata.name``); ``node``: the component's object."""
    guards = ["has(self.metadata.name)"]
    path = "self.spec"
    for key in node.split("."):
        path += f".{key}"
        guards.append(f"has({path})")

    def field(key: str) -> str:
        return f"(has({path}.{key}) ? {path}.{key} : 1)"

    budget = MAX_GROUP_NAME - len(f"-{component}-")
    return {
        "rule": f"!({' && '.join(guards)}) || {field('nodesPerReplica')} == 1 || "
        f"size(self.metadata.name) + size(string({field('replicas')} - 1)) <= {budget}",
        "message": f"the name is too long for the {component}'s replicas spanning nodes: "
        f"<name>-{component}-<last replica index> (each replica's LeaderWorkerSet) must have "
        f"at most {MAX_GROUP_NAME} characters",
        "fieldPath": ".metadata.name",
    }


GROUP_NAME_RULES: tuple[JsonRule, ...] = (
    _group_name_rule("rollout", "rollout"),
    _group_name_rule("executor", "environment.executor.serve"),
)
"""The root rules of the CRD (``metadata.name`` against the spec's replica counts)."""


def cluster_problems(spec: RunSpec) -> list[tuple[str, str]]:
    """Rules that hold only on Kubernetes: (field path, message) per broken rule."""
    problems = []
    if spec.needs_data_dir() and spec.environment.data.dir is None:
        problems.append(
            (
                "spec.environment.data.dir",
                f"{', '.join(spec.environment.needing_data_dir)} has no packaged copy; set "
                "data.dir (and data.persistentVolumeClaim holding the split files)",
            )
        )
    problems += _shared_storage_problems(spec)
    if spec.grpc.mtls and spec.grpc.tls_secret is None:
        problems.append(
            (
                "spec.grpc.mtls",
                "grpc.mtls needs TLS, and a pod has no certificate without grpc.tlsSecret: every "
                "server would exit at start (locally, AFLOWRL_TLS_DIR supplies it instead)",
            )
        )
    return problems


def _shared_storage_problems(spec: RunSpec) -> list[tuple[str, str]]:
    """Paths the pods must share but could not: the weight transport's shared directory
    (``filesystem``: ``path``; ``nccl``: the fallback's ``fallbackPath``) and the checkpoint of
    a learner spanning nodes. Shared means on the run's claim (``storage.size``), mounted at
    ``trainer.checkpointDir`` in every pod that needs it; without a claim each pod gets its own
    emptyDir and reads what no other pod wrote."""
    problems = []
    transport = spec.weight_transport
    shared = transport.shared_path
    if shared is not None:
        field = "path" if transport.type == "filesystem" else "fallbackPath"
        if spec.storage.size is None:
            why = (
                "needs a claim shared by the learner and rollout pods"
                if transport.type == "filesystem"
                else "reloads a replica whose broadcast broke off from weightTransport."
                "fallbackPath: it needs a claim shared by the learner and rollout pods (without "
                "one the rollout pods have no such directory)"
            )
            problems.append(("spec.storage.size", f"weightTransport.type={transport.type!r} {why}"))
        root = spec.trainer.checkpoint_dir
        root = root if root.endswith("/") else root + "/"
        if not shared.startswith(root):
            problems.append(
                (
                    f"spec.weightTransport.{field}",
                    f"{shared!r} must be under trainer.checkpointDir "
                    f"{spec.trainer.checkpoint_dir!r} (the shared volume)",
                )
            )
    nodes = spec.learner.nodes
    if nodes > 1 and spec.storage.size is None:
        problems.append(
            (
                "spec.storage.size",
                f"learner.nodes={nodes}: the ranks write one sharded checkpoint and must resume "
                "from the same one, so they need a ReadWriteMany claim (storage.size); without "
                "one each learner pod checkpoints to its own emptyDir",
            )
        )
    shared_claim = spec.storage.size is not None and spec.storage.access_mode == "ReadWriteMany"
    if nodes > 1 and spec.storage.size is not None and not shared_claim:
        problems.append(
            (
                "spec.storage.accessMode",
                f"{spec.learner.nodes} learner nodes write one sharded checkpoint; use "
                "ReadWriteMany (ReadWriteOnce binds every pod to one node)",
            )
        )
    return problems


def _short(value: Any) -> str:
    text = "unset" if value is _cel.MISSING else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def immutable_changes(accepted: RunSpec, new: RunSpec) -> list[tuple[str, str]]:
    """The immutable fields ``new`` changes with respect to ``accepted``: (path, message).

    Field by field, each read with its default when absent, exactly as the CRD's transition
    rules compare ``self`` with ``oldSelf`` (an optional object's fields count only when it is
    set on both sides; that it appears or vanishes is one change).
    """
    old_doc, new_doc = accepted.to_document(), new.to_document()
    problems = []
    for field, why in IMMUTABLE_FIELDS:
        for leaf in _cel.leaves(RunSpec, field):
            if any(
                _cel.read(RunSpec, doc, guard) is _cel.MISSING
                for guard in leaf.guards
                for doc in (old_doc, new_doc)
            ):
                continue
            before = _cel.read(RunSpec, old_doc, leaf.path)
            after = _cel.read(RunSpec, new_doc, leaf.path)
            if leaf.presence_only:
                changed = (before is _cel.MISSING) != (after is _cel.MISSING)
            else:
                changed = (before is _cel.MISSING) != (after is _cel.MISSING) or not (
                    before is _cel.MISSING or _cel.same_json(before, after)
                )
            if changed:
                problems.append(
                    (
                        f"spec.{leaf.path}",
                        f"cannot change once the run exists ({why}): it is {_short(before)}, "
                        f"the new spec says {_short(after)}; revert it or create a new TrainingRun",
                    )
                )
    return problems
