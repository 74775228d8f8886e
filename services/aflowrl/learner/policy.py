"""The trained policy on every learner rank: HF causal LM (+ LoRA) + optional value head, FSDP2.

:class:`PolicyModule` is FSDP's root module: its forward runs the decoder, then the LM head (and
the value head) only at the positions that predict response tokens, so a 150k vocabulary costs
logits for response tokens only, a chunk of ``learner.fsdp.logprobChunkTokens`` tokens at a time.
:func:`build_policy` loads ``policy.model``, adds LoRA adapters (peft) when ``policy.lora`` is
set, enables gradient checkpointing (when asked; unset, from 1B parameters) and shards every
decoder layer and then the root with ``fully_shard`` (bf16/fp16 parameters with float32 gradient
reduction on GPU when ``learner.fsdp.mixedPrecision`` says so; float32 on CPU). Only rank 0
reads the weights: the other ranks build the model on the meta device and receive their shards
from rank 0. With LoRA the frozen base is held in ``policy.lora.baseDtype`` (bfloat16 on a GPU
by default) and only the adapters (and a value head) in the parameter dtype, float32 by default.
The reference model of the KL term is a frozen copy, or, with LoRA, the same module with its
adapters switched off.

Weights leave the learner under their Hugging Face names (:mod:`aflowrl.learner.export`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aflowrl.config import RunSpec
from aflowrl.learner.distributed import DistContext
from aflowrl.models import loading
from aflowrl.models.logprobs import (
    PackedSequences,
    chunked_token_stats,
    selected_hidden_states,
)
from aflowrl.models.weights import parameter_shapes

logger = logging.getLogger(__name__)


class PolicyModule(nn.Module):
    """A causal LM with an optional scalar value head on its last hidden states."""

    def __init__(self, lm: nn.Module, *, critic: bool, chunk_tokens: int = 1024) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        """Response tokens whose full-vocabulary logits exist at once (``logprobChunkTokens``)."""
        config: Any = lm.config
        hidden = int(config.hidden_size)
        self.value_head = nn.Linear(hidden, 1) if critic else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        packed: PackedSequences,
        temperature: float,
        *,
        entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(log pi_T [N], entropies [N] or None, values [N] or None) of the response tokens.

        The LM head runs at the positions predicting response tokens only, in chunks of
        ``chunk_tokens`` recomputed in the backward pass
        (:func:`aflowrl.models.logprobs.chunked_token_stats`).
        """
        lm: Any = self.lm
        selected = selected_hidden_states(lm, packed)
        logp, ent = chunked_token_stats(
            lm.get_output_embeddings(),
            selected,
            packed.targets,
            temperature,
            chunk_tokens=self.chunk_tokens,
            entropy=entropy,
            entropy_grad=entropy_grad,
        )
        values = None
        if self.value_head is not None:
            # A copy, not a view: FSDP hooks the outputs of its root for the backward pass.
            head = self.value_head
            values = head(selected.to(head.weight.dtype)).squeeze(-1).clone()
        return logp, ent, values


@dataclass
class Policy:
    """What a rank trains with."""

    module: PolicyModule
    """The sharded trained module (FSDP root)."""
    reference: PolicyModule | None
    """Frozen reference module; None with LoRA (adapters off) or without a KL term."""
    has_reference: bool
    hf_shapes: dict[str, tuple[int, ...]]
    """Hugging Face names and shapes of the exported weights."""
    model_dir: Path
    lora_scale: float
    """alpha / r of the LoRA adapters (0 without LoRA)."""
    pad_id: int
    lora_config: dict[str, Any] | None = None
    """PEFT's adapter_config.json of the adapters (None without LoRA)."""
    reference_adapters: list[torch.Tensor] | None = None
    """With LoRA, once the reference is anchored (:meth:`anchor_reference`): a copy of the
    trainable tensors it stands for (this rank's shards), swapped in by :meth:`reference_mode`."""
    reload_reference: Any = None
    """Rebuilds the reference module from ``policy.referenceModel`` / the model directory
    (:meth:`restore_reference`); None without a reference module."""

    def anchor_reference(self) -> None:
        """Make the current weights the reference: the policy RL starts from (a copy into the
        reference module, or, with LoRA, of the adapters). Every rank copies its own shards."""
        with torch.no_grad():
            if self.reference is not None:
                ref = dict(self.reference.named_parameters())
                for name, param in self.module.named_parameters():
                    if name in ref:
                        ref[name].copy_(param)
            elif self.lora_scale:
                self.reference_adapters = [p.detach().clone() for p in self.trainable_parameters()]

    def restore_reference(self) -> None:
        """Back to the reference the spec names (undoes :meth:`anchor_reference`)."""
        self.reference_adapters = None
        if self.reference is not None and self.reload_reference is not None:
            self.reference = self.reload_reference()

    def reference_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameter, its reference value) of every weight with a reference copy; empty when
        the reference is the LoRA base (adapters off)."""
        if self.reference is not None:
            ref = dict(self.reference.named_parameters())
            return [(p, ref[n]) for n, p in self.module.named_parameters() if n in ref]
        if self.reference_adapters is not None:
            return list(zip(self.trainable_parameters(), self.reference_adapters, strict=True))
        return []

    def reference_state(self) -> dict[str, torch.Tensor]:
        """The reference's tensors for a checkpoint (this rank's shards, DCP-ready)."""
        if self.reference is not None:
            return dict(self.reference.state_dict())
        if self.reference_adapters is not None:
            return {f"adapter.{k}": t for k, t in enumerate(self.reference_adapters)}
        return {}

    def load_reference_state(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`reference_state` gave (the tensors are filled in place)."""
        if self.reference is not None:
            self.reference.load_state_dict(tensors)
        elif self.lora_scale:
            self.reference_adapters = [tensors[f"adapter.{k}"] for k in range(len(tensors))]

    @contextlib.contextmanager
    def reference_mode(self) -> Iterator[PolicyModule]:
        """The module that computes reference log-probs: the reference copy; with LoRA, the
        policy with the anchored adapters swapped in, or with its adapters disabled."""
        if self.reference is not None:
            yield self.reference
        elif self.lora_scale and self.reference_adapters is not None:
            params = self.trainable_parameters()
            with torch.no_grad():
                current = [p.detach().clone() for p in params]
                for param, anchored in zip(params, self.reference_adapters, strict=True):
                    param.copy_(anchored)
            try:
                yield self.module
            finally:
                with torch.no_grad():
                    for param, value in zip(params, current, strict=True):
                        param.copy_(value)
        elif self.lora_scale:
            adapters = self.trainable_parameters()
            with self.module.lm.disable_adapter():  # type: ignore[operator]
                # peft switches the adapters' requires_grad off here. FSDP reads requires_grad
                # once, at its first forward, to pick each group's gradient dtypes: a first
                # forward in here (the KL reference) would leave the adapters' bf16 gradients
                # uncast on GPU. The pass runs without grad, so the flags change nothing else.
                for param in adapters:
                    param.requires_grad_(True)
                yield self.module
        else:
            raise RuntimeError("no reference model")

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]


def _decoder_layers(lm: Any) -> list[nn.Module]:
    layers = getattr(lm.get_decoder(), "layers", None)
    if layers is None:
        raise TypeError(f"{type(lm).__name__}: no decoder .layers to shard")
    return list(layers)


def _shard(module: PolicyModule, ctx: DistContext, spec: RunSpec) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    fsdp = spec.learner.fsdp
    kwargs: dict[str, Any] = {"mesh": ctx.mesh, "reshard_after_forward": fsdp.reshard_after_forward}
    if ctx.device.type == "cuda" and fsdp.mixed_precision != "none":
        param_dtype = torch.bfloat16 if fsdp.mixed_precision == "bf16" else torch.float16
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32
        )
    if fsdp.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in _decoder_layers(module.lm):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)


def _load_lm(path: Path, dtype: torch.dtype, ctx: DistContext, trust: bool) -> Any:
    """Rank 0 reads the weights into host memory; every other rank builds the same module on
    the meta device and gets its shards from rank 0 (:func:`_shard_from_rank0`)."""
    if ctx.is_main:
        return loading.load_causal_lm(
            path, dtype=dtype, device=torch.device("cpu"), trust_remote_code=trust
        )
    logger.info("rank %d: %s built on the meta device, shards from rank 0", ctx.rank, path.name)
    return loading.empty_causal_lm(path, dtype=dtype, trust_remote_code=trust)


def _shard_from_rank0(module: PolicyModule, ctx: DistContext, spec: RunSpec) -> None:
    """Shard ``module``; with several ranks, fill every rank's shards from rank 0's weights.

    Rank 0 keeps a reference to its full (host) tensors across sharding and broadcasts them one
    at a time (``set_model_state_dict(broadcast_from_rank0=True)``); each rank keeps its shard.
    The other ranks' meta modules are first given real, empty storage where their shards live,
    and every buffer (persistent or not: rotary frequencies are computed, not saved) comes from
    rank 0 over the control group.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = module.state_dict() if ctx.is_main and ctx.world_size > 1 else None
    _shard(module, ctx, spec)
    if ctx.world_size == 1:
        return
    if not ctx.is_main:
        module.to_empty(device="cpu" if spec.learner.fsdp.cpu_offload else ctx.device)
    for _, buffer in module.named_buffers():
        staged = (
            buffer.detach().cpu().contiguous()
            if ctx.is_main
            else torch.empty(buffer.shape, dtype=buffer.dtype)
        )
        torch.distributed.broadcast(staged, src=0, group=ctx.control)
        if not ctx.is_main:
            with torch.no_grad():
                buffer.copy_(staged)
    set_model_state_dict(
        module,
        full if full is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del full


CHECKPOINTING_FROM_PARAMETERS = 1_000_000_000
"""``learner.fsdp.gradientCheckpointing`` unset: on from this many parameters."""


def checkpointing_on(spec: RunSpec, parameters: int) -> bool:
    """Whether decoder layers recompute their activations in the backward pass."""
    asked = spec.learner.fsdp.gradient_checkpointing
    return asked if asked is not None else parameters >= CHECKPOINTING_FROM_PARAMETERS


def _param_dtype(spec: RunSpec) -> torch.dtype:
    # "auto": float32 master weights (bf16 compute comes from mixed precision on GPU).
    return loading.torch_dtype("float32" if spec.policy.dtype == "auto" else spec.policy.dtype)


def frozen_dtype(spec: RunSpec, device: torch.device) -> torch.dtype:
    """Dtype of the weights nothing trains: with LoRA the base (``policy.lora.baseDtype``;
    "auto" is bfloat16 on a GPU that supports it, else the parameter dtype), else the
    parameter dtype (every weight trains)."""
    lora = spec.policy.lora
    if lora is None:
        return _param_dtype(spec)
    if lora.base_dtype != "auto":
        return loading.torch_dtype(lora.base_dtype)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return _param_dtype(spec)


def _cast(module: nn.Module, *, trained: torch.dtype, frozen: torch.dtype) -> None:
    """Trainable parameters (and floating buffers) to ``trained``, frozen ones to ``frozen``.

    Assigning ``.data`` keeps each Parameter object, so tied weights stay tied; the other
    ranks' meta tensors change dtype without storage."""
    with torch.no_grad():
        for param in module.parameters():
            want = trained if param.requires_grad else frozen
            if param.dtype != want:
                param.data = param.data.to(want)
        for buffer in module.buffers():
            if buffer.is_floating_point() and buffer.dtype != trained:
                buffer.data = buffer.data.to(trained)


def parameter_bytes(module: nn.Module) -> dict[str, int]:
    """Bytes of this rank's trainable and frozen parameters (``trainable``, ``frozen``)."""
    out = {"trainable": 0, "frozen": 0}
    for param in module.parameters():
        local = getattr(param, "_local_tensor", param)  # a DTensor's shard on this rank
        kind = "trainable" if param.requires_grad else "frozen"
        out[kind] += local.numel() * local.element_size()
    return out


def build_policy(spec: RunSpec, ctx: DistContext) -> Policy:
    """Load, adapt, checkpoint-wrap and shard the policy (and its reference) on this rank."""
    policy_spec = spec.policy
    model_dir = loading.resolve_model_path(policy_spec.model)
    dtype = _param_dtype(spec)
    base_dtype = frozen_dtype(spec, ctx.device)
    torch.manual_seed(spec.trainer.seed)
    trust = policy_spec.trust_remote_code
    # Read in the frozen dtype: a bf16 LoRA base never exists in float32, even on rank 0.
    lm = _load_lm(model_dir, base_dtype, ctx, trust)
    tokenizer = loading.load_tokenizer(model_dir, trust_remote_code=policy_spec.trust_remote_code)
    hf_shapes = parameter_shapes(lm)
    if checkpointing_on(spec, sum(p.numel() for p in lm.parameters())):
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora_scale = 0.0
    lora_config = None
    if policy_spec.lora is not None:
        from peft import get_peft_model

        lora = policy_spec.lora
        lm = get_peft_model(lm, loading.lora_config(lora))
        lora_scale = lora.alpha / lora.rank
        lora_config = loading.adapter_config(lora, model_dir)
    critic = spec.learner.algorithm.type == "ppo"
    chunk = spec.learner.fsdp.logprob_chunk_tokens
    module = PolicyModule(lm, critic=critic, chunk_tokens=chunk)
    _cast(module, trained=dtype, frozen=base_dtype)
    module.train()
    _shard_from_rank0(module, ctx, spec)
    wants_reference = spec.learner.loss.kl_coef > 0
    reference = None
    reload_reference = None
    if wants_reference and policy_spec.lora is None:
        ref_dir = (
            loading.resolve_model_path(policy_spec.reference_model, field="policy.referenceModel")
            if policy_spec.reference_model
            else model_dir
        )

        def reload_reference() -> PolicyModule:
            ref_lm = _load_lm(ref_dir, dtype, ctx, trust)
            module = PolicyModule(ref_lm, critic=False, chunk_tokens=chunk).to(dtype)
            module.requires_grad_(False)
            module.eval()
            _shard_from_rank0(module, ctx, spec)
            return module

        reference = reload_reference()
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    held = parameter_bytes(module)
    logger.info(
        "policy %s: %d trainable parameters%s%s%s; this rank holds %.1f MiB trained (%s), "
        "%.1f MiB frozen (%s)",
        model_dir,
        trainable,
        " (LoRA)" if lora_scale else "",
        ", value head" if critic else "",
        ", reference model" if wants_reference else "",
        held["trainable"] / 2**20,
        loading.dtype_name(dtype),
        held["frozen"] / 2**20,
        loading.dtype_name(base_dtype),
    )
    return Policy(
        module=module,
        reference=reference,
        has_reference=wants_reference,
        hf_shapes=hf_shapes,
        model_dir=model_dir,
        lora_scale=lora_scale,
        pad_id=int(tokenizer.pad_token_id),
        lora_config=lora_config,
        reload_reference=reload_reference,
    )
