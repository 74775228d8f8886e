"""The learner service and the RL algorithm's hyper-parameters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from aflowrl.config._base import CelRule, FieldRuleError, Port, SpecModel
from aflowrl.config.resources import ResourceSpec
from aflowrl.config.scheduling import PodOverrides

Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class FsdpSpec(SpecModel):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) settings."""

    reshard_after_forward: bool = True
    """Free gathered parameters after the forward pass (ZeRO-3 style); False keeps them (ZeRO-2)."""
    mixed_precision: Literal["none", "bf16", "fp16"] = "bf16"
    """Parameter and compute dtype on GPU (gradients reduced in float32); ignored on CPU."""
    gradient_checkpointing: bool | None = None
    """Recompute each decoder layer's activations in the backward pass: activations shrink from
    every layer's to about one layer's plus the layer inputs, for ~30% more compute. Unset: on
    for models of 1B parameters or more (a 7B micro-batch of 8 x 3.3k tokens needs ~160 GB of
    activations without it)."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimiser state in host memory (the learner then
    runs gloo for CPU tensors beside NCCL: backend "cpu:gloo,cuda:nccl")."""
    accumulate_unsharded_gradients: bool = False
    """Skip the gradient reduce-scatter between the micro-batches of a mini-batch (one
    reduce-scatter per optimiser step instead of one per micro-batch). Less communication, but
    every GPU then holds the model's full float32 gradients (+4 bytes per parameter: 30 GB for
    7B), so it is off by default."""
    logprob_chunk_tokens: int = Field(default=1024, ge=16, le=1048576)
    """Response tokens whose full-vocabulary logits exist at once: log-probabilities and
    entropies are computed over the vocabulary in chunks of this many tokens and recomputed in
    the backward pass, so logits never take tokens x vocabulary x 4 bytes for a whole
    micro-batch (26k tokens x 152k = 16 GB)."""


class OptimizerSpec(SpecModel):
    """AdamW with warm-up and gradient clipping."""

    lr: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate."""
    betas: list[Beta] = Field(default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2)
    """Adam's beta1 and beta2, each in [0, 1)."""
    eps: float = Field(default=1e-8, gt=0.0, le=1e-2)
    """Adam's epsilon."""
    weight_decay: float = Field(default=0.01, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    warmup_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Optimiser steps of linear warm-up from 0 to lr (steps)."""
    scheduler: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule after warm-up (over trainer.iterations)."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1e6)
    """Global gradient-norm clipping threshold."""


class GiGPOSpec(SpecModel):
    """GiGPO (arXiv 2505.10978): episode-level plus anchor-state step-level group advantages."""

    type: Literal["gigpo"] = "gigpo"
    """Algorithm discriminator."""
    gamma: float = Field(default=0.95, ge=0.0, le=1.0)
    """Discount of step rewards within a trajectory (R_t = r_t + gamma R_{t+1})."""
    step_advantage_w: float = Field(default=1.0, ge=0.0, le=10.0)
    """Weight w of the step-level advantage in A = A_episode + w A_step."""
    mode: Literal["mean_norm", "mean_std_norm"] = "mean_norm"
    """Group normalisation of both terms: subtract the group's mean, or also divide by its
    standard deviation (verl-agent's two modes). ``mean_std_norm`` puts both terms in units of
    their group's spread, so a policy update's size does not depend on the reward's scale."""
    sibling_step_groups: bool = False
    """Choice mode: at every state an episode visits, step every other listed action too (the
    environment is stateless and caches evaluations, so this costs only the evaluations no
    episode made; counted in ``env/sibling_executor_calls``). The step group of that state then
    holds each listed action once with its exact one-step reward, and the step term becomes its
    expectation over the candidates under the behaviour policy (Rao-Blackwellised): every
    candidate k gets w A_step,k, weighted by pi_old(k | s) in the loss; the episode term stays on
    the sampled action. Off: GiGPO as published (step groups of the sampled actions at equal
    anchors)."""
    enable_similarity: bool = False
    """Group step rows by anchor similarity instead of exact equality."""
    similarity_thresh: float = Field(default=0.95, gt=0.0, le=1.0)
    """SequenceMatcher ratio at or above which two anchors share a step group."""
    invalid_action_penalty: float = Field(default=0.1, ge=0.0, le=100.0)
    """Subtracted from the step reward and episode score of an invalid action, after discounting."""


class GRPOSpec(SpecModel):
    """GRPO outcome advantages: each trajectory's return normalised within its group."""

    type: Literal["grpo"] = "grpo"
    """Algorithm discriminator."""
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount used to sum a trajectory's step rewards into its return."""
    norm_by_std: bool = True
    """Divide by the group's standard deviation (Dr. GRPO sets False)."""
    leave_one_out: bool = False
    """Use the leave-one-out group mean as baseline (RLOO) instead of the plain mean."""
    invalid_action_penalty: float = Field(default=0.1, ge=0.0, le=100.0)
    """Subtracted from the reward of an invalid action."""


class PPOSpec(SpecModel):
    """PPO with a learned critic and GAE."""

    type: Literal["ppo"] = "ppo"
    """Algorithm discriminator."""
    gamma: float = Field(default=0.95, ge=0.0, le=1.0)
    """Discount factor."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE lambda."""
    value_loss_coef: float = Field(default=0.5, ge=0.0, le=100.0)
    """Weight of the value loss."""
    value_clip: float = Field(default=0.2, gt=0.0, le=100.0)
    """Clip range of the value update around the old value."""
    invalid_action_penalty: float = Field(default=0.1, ge=0.0, le=100.0)
    """Subtracted from the reward of an invalid action."""


AlgorithmSpec = Annotated[GiGPOSpec | GRPOSpec | PPOSpec, Field(discriminator="type")]
"""The advantage estimator: ``gigpo`` (default), ``grpo`` or ``ppo`` (with critic)."""


class PolicyLossSpec(SpecModel):
    """The clipped policy-gradient objective and its regularisers."""

    clip_ratio_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    """eps_low: the ratio is clipped below at 1 - eps_low."""
    clip_ratio_high: float = Field(default=0.28, gt=0.0, le=10.0)
    """eps_high: the ratio is clipped above at 1 + eps_high (clip-higher, DAPO)."""
    dual_clip_c: float = Field(default=3.0, gt=1.0, le=100.0)
    """Dual-clip constant c: for negative advantages the loss is bounded by -A c."""
    loss_agg_mode: Literal[
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How per-token losses are averaged into the batch loss."""
    kl_coef: float = Field(default=0.001, ge=0.0, le=100.0)
    """Weight of the KL penalty to the reference policy (0 disables the reference model)."""
    kl_estimator: Literal["k1", "abs", "k2", "low_var_kl", "exact"] = "low_var_kl"
    """KL estimator (low_var_kl is Schulman's k3, clamped to [-10, 10]); ``exact``: a choice
    row's KL(pi || pi_ref) summed over its candidates (no sampling noise), low_var_kl on text
    rows. The reference is the policy RL starts from (``policy.referenceModel``)."""
    entropy_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the entropy bonus."""
    epochs: int = Field(default=1, ge=1, le=64)
    """Passes over each batch (PPO epochs)."""
    mini_batch_size: int = Field(default=32, ge=1, le=65536)
    """Rows per optimiser step."""
    micro_batch_size: int = Field(default=8, ge=1, le=65536)
    """Rows per forward/backward pass (gradient accumulation inside a mini-batch), per rank."""
    update_diagnostics: bool = True
    """After each RL update, one more forward pass (no gradient) over the batch measures what the
    update did: ``policy/update_kl`` and ``policy/update_tv`` from the batch's behaviour policy,
    ``policy/start_kl``, ``policy/start_tv`` and ``policy/param_distance`` from the reference
    (the policy RL started from; needs klCoef > 0), and the entropy after the update. Off saves
    that pass."""

    cel_rules = (
        CelRule(
            "{microBatchSize} <= {miniBatchSize}",
            "microBatchSize exceeds miniBatchSize",
            "microBatchSize",
        ),
    )

    @model_validator(mode="after")
    def _micro_divides_mini(self) -> PolicyLossSpec:
        if self.micro_batch_size > self.mini_batch_size:
            raise FieldRuleError(
                "microBatchSize",
                f"microBatchSize={self.micro_batch_size} exceeds "
                f"miniBatchSize={self.mini_batch_size}",
            )
        return self


class LearnerSpec(SpecModel):
    """The FSDP2 learner: torchrun ranks on one or more nodes."""

    nodes: int = Field(default=1, ge=1, le=128)
    """Nodes (StatefulSet replicas), each running procsPerNode ranks."""
    procs_per_node: int = Field(default=1, ge=1, le=16)
    """torchrun ranks per node (one per GPU on GPU nodes)."""
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    """Resources of one learner pod."""
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec)
    """Sharding and precision."""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimiser settings."""
    algorithm: AlgorithmSpec = Field(default_factory=GiGPOSpec)
    """Advantage estimator and its hyper-parameters."""
    loss: PolicyLossSpec = Field(default_factory=PolicyLossSpec)
    """Policy loss, KL and entropy terms, epochs and batch sizes."""
    port: Port = 50053
    """gRPC port of the learner service (rank 0)."""
    rendezvous_port: Port = 29500
    """torch.distributed rendezvous port on the first learner pod."""
    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Labels, annotations and placement of the learner pods."""

    cel_rules = (
        CelRule(
            "{resources.gpus} == 0 || {resources.gpus} == {procsPerNode}",
            "procsPerNode must equal resources.gpus (one rank per GPU)",
            "procsPerNode",
        ),
    )

    @property
    def world_size(self) -> int:
        """Total number of ranks."""
        return self.nodes * self.procs_per_node

    @model_validator(mode="after")
    def _gpus_match_ranks(self) -> LearnerSpec:
        gpus = self.resources.gpus
        if gpus > 0 and gpus != self.procs_per_node:
            raise FieldRuleError(
                "procsPerNode",
                f"procsPerNode={self.procs_per_node} must equal "
                f"resources.gpus={gpus} (one rank per GPU)",
            )
        return self
