"""What runs inside vLLM's workers: weight reloads in pieces, and the weight group's receiving end.

:class:`~aflowrl.rollout.vllm_engine.VllmEngine` calls these through vLLM's ``collective_rpc``
(every worker of the engine runs them: one per tensor-parallel rank), by name: vLLM mixes
:class:`AflowrlWorkerExtension` into its worker class (``worker_extension_cls``), whose methods
call the module-level functions here with the worker first. Arguments and answers are plain
data, which vLLM's msgpack channel carries without pickle.

**Reloads in pieces.** vLLM 0.32's layer-wise reload (the lifecycle of its own weight-transfer
engine, ``vllm.model_executor.model_loader.reload``) takes a checkpoint's tensors in any number
of calls: :func:`start_update` puts every layer in loading mode, each :func:`load_piece` feeds
``model.load_weights`` one piece (a layer is processed and copied into its kernel tensors once
all of its weights arrived), :func:`finish_update` processes what remains and puts the old
tensors back into any layer that received nothing. A piece's tensors cross the RPC as byte
strings of at most one bucket (vLLM's msgpack channel refuses byte strings over 4 GiB, and a
whole 7B model in one message is 15 GB of host memory on each side), so a reload never builds a
message that grows with the model.

**Receiving a broadcast.** :func:`join_group` makes the worker a member of the learner's weight
group (:mod:`aflowrl.models.broadcast`) on its own device; :func:`receive` takes one broadcast
through the same start / load / finish lifecycle. Errors come back as plain dicts (``kind``
"refused" or "broken"), which the engine turns into the domain error they were.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from aflowrl.errors import InvalidInputError
from aflowrl.models import broadcast, loading, weights
from aflowrl.models.errors import BroadcastBrokenError, StaleWeightsError

logger = logging.getLogger(__name__)

_GROUP = "_aflowrl_weight_group"
_HEAD = "lm_head.weight"
_EMBEDDING = "model.embed_tokens.weight"


@contextlib.contextmanager
def _config(worker: Any) -> Iterator[None]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        yield


def _model(worker: Any) -> Any:
    return worker.model_runner.get_model()


def start_update(worker: Any) -> None:
    """Put every layer of the worker's model in loading mode (vLLM's layer-wise reload)."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with _config(worker):
        initialize_layerwise_reload(_model(worker))


def _with_head(model: Any, bucket: list[tuple[str, torch.Tensor]], tied: bool) -> list[Any]:
    """Checkpoints of tied-embedding models have no ``lm_head.weight``.

    vLLM's layer-wise reload then puts the head's old tensor back (and unties it), so a tied
    model gets its embedding again as the head, in the piece that carries the embedding.
    """
    if not tied:
        return bucket
    names = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    if _HEAD not in names:
        return bucket
    return bucket + [(_HEAD, t) for n, t in bucket if n == _EMBEDDING]


def _tensor(spec: weights.TensorSpec, parts: Sequence[bytes]) -> torch.Tensor:
    dtype = loading.torch_dtype(spec.dtype)
    if spec.nbytes == 0:
        return torch.empty(spec.shape, dtype=dtype)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    with warnings.catch_warnings():
        # The bytes are read-only; load_weights only ever copies from them.
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(data, dtype=torch.uint8)
    return raw.view(dtype).view(spec.shape)


def load_piece(
    worker: Any, specs: Sequence[Sequence[Any]], parts: Sequence[Sequence[bytes]], tied: bool
) -> int:
    """Load one piece: (name, dtype, shape) triples and each tensor's bytes; returns bytes."""
    # Triples, not dataclasses: vLLM's msgpack channel turns dataclasses into dicts.
    bucket = []
    for (name, dtype, shape), data in zip(specs, parts, strict=True):
        spec = weights.TensorSpec(str(name), str(dtype), tuple(int(x) for x in shape))
        bucket.append((spec.name, _tensor(spec, data)))
    model = _model(worker)
    with _config(worker):
        model.load_weights(_with_head(model, bucket, tied))
    return sum(len(b) for data in parts for b in data)


def finish_update(worker: Any) -> None:
    """Process the layers still pending and restore any that received nothing."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with _config(worker):
        finalize_layerwise_reload(_model(worker), worker.model_config)
    runner = worker.model_runner
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        if hasattr(runner, reset):
            getattr(runner, reset)()


_KEPT = "_aflowrl_kept_weights"


def keep_weights(worker: Any) -> int:
    """Copy the model's weights as served (after vLLM's processing) to host memory, to put
    back if the reload that follows fails midway; returns the bytes kept."""
    kept = {
        name: tensor.detach().to("cpu", copy=True)
        for name, tensor in _model(worker).state_dict(keep_vars=False).items()
    }
    setattr(worker, _KEPT, kept)
    return sum(t.numel() * t.element_size() for t in kept.values())


def restore_weights(worker: Any) -> bool:
    """Put the kept weights back into the model's tensors; False when none were kept or the
    model's tensors no longer match them (then the replica must not serve)."""
    kept = getattr(worker, _KEPT, None)
    setattr(worker, _KEPT, None)
    if kept is None:
        return False
    current = _model(worker).state_dict(keep_vars=False)
    if set(current) != set(kept) or any(
        current[n].shape != t.shape or current[n].dtype != t.dtype for n, t in kept.items()
    ):
        return False
    with torch.no_grad():
        for name, tensor in kept.items():
            current[name].copy_(tensor)
    return True


def drop_kept_weights(worker: Any) -> None:
    setattr(worker, _KEPT, None)


def _device(worker: Any) -> torch.device:
    device = getattr(worker, "device", None)
    return device if isinstance(device, torch.device) else torch.device("cpu")


def join_group(worker: Any, rendezvous: dict[str, Any]) -> int:
    """Join the learner's weight group as rank ``rendezvous['rank'] + worker.rank``."""
    leave_group(worker)
    base = broadcast.Rendezvous(**rendezvous)
    own = broadcast.Rendezvous(
        base.host,
        base.port,
        base.group,
        base.rank + int(getattr(worker, "rank", 0)),
        base.world_size,
        base.timeout_s,
    )
    setattr(worker, _GROUP, broadcast.WeightGroup.join(own, _device(worker)))
    return own.rank


def leave_group(worker: Any) -> None:
    group = getattr(worker, _GROUP, None)
    if group is not None:
        setattr(worker, _GROUP, None)
        group.close()


def receive(worker: Any, expectation: dict[str, Any], adapter_dir: str | None) -> dict[str, Any]:
    """Take part in one broadcast; the answer is a dict (module docstring).

    With ``adapter_dir`` (LoRA) the adapters are not loaded into the model: the first worker
    writes them as ``adapter_model.safetensors`` there, for the engine to register.
    """
    group = getattr(worker, _GROUP, None)
    if group is None:
        return {"kind": "broken", "message": "this worker is in no weight group"}
    expected = broadcast.Expectation(
        int(expectation["version"]),
        int(expectation["serving_version"]),
        {str(n): tuple(int(x) for x in s) for n, s in expectation["shapes"].items()},
    )
    model = _model(worker)
    tied = _HEAD not in expected.shapes
    adapters: dict[str, torch.Tensor] = {}

    def load(bucket: list[tuple[str, torch.Tensor]]) -> None:
        if adapter_dir is not None:
            adapters.update((n, t.to("cpu", copy=True)) for n, t in bucket)
            return
        with _config(worker):
            model.load_weights(_with_head(model, bucket, tied))

    def finish() -> None:
        if adapter_dir is None:
            finish_update(worker)
        elif int(getattr(worker, "rank", 0)) == 0:
            from safetensors.torch import save_file

            Path(adapter_dir).mkdir(parents=True, exist_ok=True)
            save_file(adapters, str(Path(adapter_dir) / "adapter_model.safetensors"))

    try:
        result = broadcast.receive_weights(
            group,
            accept=expected.check,
            start=(lambda: None) if adapter_dir is not None else (lambda: start_update(worker)),
            load=load,
            finish=finish,
        )
    except BroadcastBrokenError as exc:
        leave_group(worker)
        return {"kind": "broken", "message": str(exc)}
    except InvalidInputError as exc:
        return {"kind": "refused", "message": exc.reason, "field": exc.field}
    except StaleWeightsError as exc:
        return {"kind": "stale", "message": str(exc)}
    return {
        "kind": "ok",
        "version": result.manifest.version,
        "buckets": result.buckets,
        "bytes": result.bytes,
    }


class AflowrlWorkerExtension:
    """vLLM's ``worker_extension_cls``: vLLM mixes it into its worker class, so the functions of
    this module are worker methods that ``collective_rpc`` calls by name, with plain arguments
    (strings, numbers, lists, dicts, bytes) that vLLM's msgpack channel carries as they are.
    Nothing is pickled, in either process mode: vLLM's insecure-serialization switch stays off."""

    def aflowrl_start_update(self) -> None:
        start_update(self)

    def aflowrl_load_piece(
        self, specs: Sequence[Sequence[Any]], parts: Sequence[Sequence[bytes]], tied: bool
    ) -> int:
        return load_piece(self, specs, parts, tied)

    def aflowrl_finish_update(self) -> None:
        finish_update(self)

    def aflowrl_keep_weights(self) -> int:
        return keep_weights(self)

    def aflowrl_restore_weights(self) -> bool:
        return restore_weights(self)

    def aflowrl_drop_kept_weights(self) -> None:
        drop_kept_weights(self)

    def aflowrl_join_group(self, rendezvous: dict[str, Any]) -> int:
        return join_group(self, rendezvous)

    def aflowrl_leave_group(self) -> None:
        leave_group(self)

    def aflowrl_receive(
        self, expectation: dict[str, Any], adapter_dir: str | None
    ) -> dict[str, Any]:
        return receive(self, expectation, adapter_dir)


EXTENSION = f"{__name__}.{AflowrlWorkerExtension.__qualname__}"
"""The qualified name vLLM's ``EngineArgs(worker_extension_cls=...)`` takes."""
