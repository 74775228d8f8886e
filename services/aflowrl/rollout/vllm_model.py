"""What changes a vLLM worker's model: tied heads, loaded reports, kept copies and their restore,
LoRA adapter files.

Shared by the two ways weights reach vLLM's workers, the reload in pieces
(:mod:`aflowrl.rollout.vllm_worker`) and the weight-transfer backend
(:mod:`aflowrl.rollout.vllm_transfer`), which both import this module and not each other.
Everything here runs inside a worker, on its model; vLLM is imported lazily.

**Kept weights** (``rollout.vllm.keepWeightsOnLoad``): a host copy of the model's tensors as
served, to put back if an update fails midway. The copy is made once per served version: its
buffers are allocated once (pinned on CUDA, so the device-to-host copy runs at full speed) and
reused by every later update, and the copy itself is skipped while the served weights have not
changed since it was made (a refused or restored update leaves them as they were).

**A restore is verified**: after a reload that failed midway some parameters may still sit on
PyTorch's meta device (vLLM's layer-wise reload moves every layer there until its weights
arrive, and only its finalize puts back the layers that got nothing), and ``copy_`` into a meta
tensor silently does nothing. :func:`restore_weights` refuses a model with a meta tensor and
checks that every value was really written, so a broken model is never reported as restored.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HEAD = "lm_head.weight"
_EMBEDDING = "model.embed_tokens.weight"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def loaded_report(names: Iterable[str]) -> dict[str, Any]:
    """What one rank loaded in an update, from the parameter names its model's
    ``load_weights`` reported: how many, and the decoder layers they belong to (a pipeline
    stage loads only its own layers; every tensor-parallel rank of a stage loads all of them)."""
    loaded = set(names)
    layers = sorted({int(m.group(1)) for name in loaded if (m := _LAYER.search(name))})
    return {"parameters": len(loaded), "layers": layers}


def with_head(model: Any, bucket: list[tuple[str, torch.Tensor]], tied: bool) -> list[Any]:
    """Checkpoints of tied-embedding models have no ``lm_head.weight``.

    vLLM's layer-wise reload then puts the head's old tensor back (and unties it), so a tied
    model gets its embedding again as the head, in the piece that carries the embedding.
    """
    if not tied:
        return bucket
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    if HEAD not in names:
        return bucket
    return bucket + [(HEAD, t) for n, t in bucket if n == _EMBEDDING]


@contextlib.contextmanager
def reloading() -> Iterator[None]:
    """The scope of one reload into a model: vLLM's MTP completeness check is off (an update
    carries the policy's weights, not a multi-token-prediction head's; vLLM's own weight-transfer
    engines turn it off the same way). vLLM versions without the check need nothing."""
    try:
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )
    except ImportError:
        yield
        return
    with disable_mtp_completeness_check():
        yield


def meta_tensors(model: Any) -> list[str]:
    """Names of ``model``'s parameters and buffers on PyTorch's meta device (no storage: a
    layer a reload left unfinished)."""
    return [n for n, t in model.state_dict(keep_vars=True).items() if t.device.type == "meta"]


@dataclass
class KeptWeights:
    """What :func:`keep_weights` copied: the model's tensors as served (host copies), and each
    layer's kernel attributes (vLLM's processing may hold weights outside the tensors: on a CPU
    a linear layer's prepacked weight lives in its ``cpu_linear`` closure, and a reload makes a
    new one rather than writing into the old)."""

    tensors: dict[str, torch.Tensor]
    kernels: list[tuple[Any, dict[str, Any]]]
    current: bool = True
    """The copy holds the weights the model serves now (False once an update changed them)."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _kernel_attributes(module: Any) -> dict[str, Any]:
    """A layer's public attributes that are functions or tensors outside its parameters and
    buffers (kernels and the weights they hold), by reference."""
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, torch.nn.Module)
        and (callable(value) or isinstance(value, torch.Tensor))
    }


def _host_buffer(like: torch.Tensor) -> torch.Tensor:
    """A host tensor shaped like ``like`` (pinned when ``like`` is on a CUDA device)."""
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=like.device.type == "cuda")


def keep_weights(model: Any, previous: KeptWeights | None = None) -> KeptWeights | None:
    """A host copy of ``model``'s weights as served (after vLLM's processing), and references to
    its layers' kernels, to put back if the reload that follows fails midway; None when some
    tensors are on the meta device (an earlier reload broke off: there is nothing to keep, and
    the replica serves nothing until a complete version is loaded).

    ``previous`` (the copy kept for an earlier update) is returned as it is while it still
    holds the served weights, and its buffers are reused otherwise (module docstring)."""
    if meta_tensors(model):
        return None
    state = model.state_dict(keep_vars=False)
    kernels = [(module, _kernel_attributes(module)) for module in model.modules()]
    kernels = [(m, a) for m, a in kernels if a]
    if previous is not None and previous.current and set(previous.tensors) == set(state):
        previous.kernels = kernels
        return previous
    old = previous.tensors if previous is not None else {}
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, tensor in state.items():
            buffer = old.get(name)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = _host_buffer(tensor)
            buffer.copy_(tensor.detach(), non_blocking=buffer.is_pinned())
            tensors[name] = buffer
    if any(t.is_pinned() for t in tensors.values()):
        torch.cuda.synchronize()
    if previous is None:
        return KeptWeights(tensors, kernels)
    previous.tensors, previous.kernels, previous.current = tensors, kernels, True
    return previous


def restore_weights(model: Any, kept: KeptWeights) -> bool:
    """Put ``kept`` back into ``model``; False when the model's tensors no longer match them
    (names, shapes, dtypes), when some are on the meta device (a reload left them without
    storage, where a copy writes nothing), or when a value did not arrive: then the replica
    must not serve."""
    current = model.state_dict(keep_vars=False)
    if set(current) != set(kept.tensors) or any(
        current[n].shape != t.shape or current[n].dtype != t.dtype for n, t in kept.tensors.items()
    ):
        return False
    if any(t.device.type == "meta" for t in current.values()):
        return False
    with torch.no_grad():
        for name, tensor in kept.tensors.items():
            current[name].copy_(tensor)
    for module, attributes in kept.kernels:
        for name, value in attributes.items():
            setattr(module, name, value)
    current = model.state_dict(keep_vars=False)  # after the kernels' attributes went back
    if any(
        current[n].device.type == "meta" or not torch.equal(current[n].cpu(), t)
        for n, t in kept.tensors.items()
    ):
        return False
    kept.current = True
    return True


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def write_adapter(adapter_dir: str, config_json: str, tensors: dict[str, torch.Tensor]) -> None:
    """Write one LoRA adapter version as a PEFT directory on this host (its config and weights:
    vLLM's ``add_lora`` reads both on every worker, so each host of a multi-node replica gets
    its own copy, written by its first local worker), then remove the older versions' directories
    beside it except the one serving until the swap."""
    from safetensors.torch import save_file

    from aflowrl.models.weights import ADAPTER_CONFIG

    path = Path(adapter_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / ADAPTER_CONFIG).write_text(config_json)
    save_file(tensors, str(path / ADAPTER_WEIGHTS))
    older = sorted(p for p in path.parent.iterdir() if p.is_dir() and p.name < path.name)
    for old in older[:-1]:  # the newest older one may still serve until the swap
        shutil.rmtree(old, ignore_errors=True)
