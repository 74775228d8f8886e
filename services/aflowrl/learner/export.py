"""The policy's weights as they leave the learner: Hugging Face names, one tensor at a time.

Every transport reads the trained weights through :func:`iter_hf_tensors` (or, with LoRA,
:func:`iter_adapter_tensors`): tensors come in the order of the model's own checkpoints, each
gathered from its FSDP shards when it is needed (``DTensor.full_tensor()``, a collective every
learner rank takes part in, in the same order), so no rank ever holds more than one full tensor
(plus a LoRA pair) beyond its shards: the whole-model state dict a 7B policy would need in host
memory on rank 0 (30 GB in float32) is never built.

Names: the wrapper prefix is stripped, LoRA adapters are merged into their base weights
(W' = W + (alpha / r) B A, Hu et al. 2021, arXiv 2106.09685) unless they travel on their own, and
anything that is not the language model (a value head) is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from aflowrl.models.loading import dtype_name
from aflowrl.models.weights import TensorSpec

_LM_PREFIX = "lm."
_PEFT_PREFIX = "base_model.model."
ADAPTER_PREFIX = "base_model.model."
"""PEFT's adapter files name weights ``base_model.model.<HF module>.lora_A.weight``."""


def materialize(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of an FSDP shard (a collective on every rank), or the tensor itself.

    On a mesh of one rank the local tensor is already the full one: it is returned as it is,
    without the all-gather's copy (a learner on one GPU, or on a CPU).
    """
    mesh = getattr(tensor, "device_mesh", None)
    if mesh is not None and mesh.size() == 1:
        local: torch.Tensor = tensor.to_local()  # type: ignore[attr-defined]
        if local.shape == tensor.shape:
            return local.detach()
    full = getattr(tensor, "full_tensor", None)
    out: torch.Tensor = full() if callable(full) else tensor
    return out.detach()


@dataclass
class _Sources:
    """The policy module's tensors, indexed by their Hugging Face name."""

    base: dict[str, torch.Tensor]
    lora_a: dict[str, torch.Tensor]
    """HF module path (``model.layers.0.self_attn.q_proj``) -> lora_A weight."""
    lora_b: dict[str, torch.Tensor]


def _sources(named: Iterable[tuple[str, torch.Tensor]]) -> _Sources:
    sources = _Sources({}, {}, {})
    for key, tensor in named:
        if not key.startswith(_LM_PREFIX):
            continue  # the value head and anything else beside the language model
        name = key.removeprefix(_LM_PREFIX).removeprefix(_PEFT_PREFIX)
        if ".lora_A." in name:
            sources.lora_a[name.split(".lora_A.", 1)[0]] = tensor
        elif ".lora_B." in name:
            sources.lora_b[name.split(".lora_B.", 1)[0]] = tensor
        else:
            sources.base[name.replace(".base_layer.", ".")] = tensor
    return sources


def iter_hf_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
    hf_shapes: Mapping[str, tuple[int, ...]],
    *,
    lora_scale: float,
    dtype: torch.dtype | None = None,
    full: Callable[[torch.Tensor], torch.Tensor] = materialize,
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full weights of a :class:`~aflowrl.learner.policy.PolicyModule`, LoRA merged.

    ``named`` are the module's parameters and buffers (or a state dict's items); each is
    gathered with ``full`` only when its turn comes, in the order of ``hf_shapes``, and
    converted to ``dtype`` (default: as stored).
    """
    sources = _sources(named)
    missing = [name for name in hf_shapes if name not in sources.base]
    if missing:
        raise KeyError(f"the policy lacks {missing[:5]}")
    for name in hf_shapes:
        tensor = full(sources.base[name])
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in sources.lora_a:
            a = full(sources.lora_a[module]).float()
            b = full(sources.lora_b[module]).float()
            tensor = (tensor.float() + (b @ a) * lora_scale).to(tensor.dtype)
        yield name, tensor.to(dtype) if dtype is not None else tensor


def iter_adapter_tensors(
    named: Iterable[tuple[str, torch.Tensor]],
    *,
    dtype: torch.dtype | None = None,
    full: Callable[[torch.Tensor], torch.Tensor] = materialize,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The LoRA adapters alone, named as PEFT saves them (``...q_proj.lora_A.weight``)."""
    sources = _sources(named)
    for module in sorted(sources.lora_a, key=_layer_order):
        for kind, table in (("lora_A", sources.lora_a), ("lora_B", sources.lora_b)):
            tensor = full(table[module])
            yield (
                f"{ADAPTER_PREFIX}{module}.{kind}.weight",
                tensor.to(dtype) if dtype is not None else tensor,
            )


def _layer_order(module: str) -> tuple[tuple[int, int, str], ...]:
    """Sort module paths by layer number, then name (``layers.10`` after ``layers.9``)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in module.split("."))


def hf_tensors(
    state: Mapping[str, torch.Tensor],
    hf_shapes: Mapping[str, tuple[int, ...]],
    *,
    lora_scale: float,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`iter_hf_tensors` of a full (unsharded) state dict, all at once."""
    return dict(
        iter_hf_tensors(state.items(), hf_shapes, lora_scale=lora_scale, dtype=dtype, full=_plain)
    )


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def hf_specs(
    named: Iterable[tuple[str, torch.Tensor]],
    hf_shapes: Mapping[str, tuple[int, ...]],
    dtype: torch.dtype | None,
) -> list[TensorSpec]:
    """The manifest entries of :func:`iter_hf_tensors`, without gathering anything."""
    base = _sources(named).base
    return [
        TensorSpec(name, dtype_name(dtype or base[name].dtype), tuple(hf_shapes[name]))
        for name in hf_shapes
    ]


def adapter_specs(
    named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
) -> list[TensorSpec]:
    """The manifest entries of :func:`iter_adapter_tensors`, without gathering anything."""
    sources = _sources(named)
    specs = []
    for module in sorted(sources.lora_a, key=_layer_order):
        for kind, table in (("lora_A", sources.lora_a), ("lora_B", sources.lora_b)):
            tensor = table[module]
            specs.append(
                TensorSpec(
                    f"{ADAPTER_PREFIX}{module}.{kind}.weight",
                    dtype_name(dtype or tensor.dtype),
                    tuple(tensor.shape),
                )
            )
    return specs
