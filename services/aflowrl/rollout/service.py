"""``RolloutService`` (protos/aflowrl/v1/rollout.proto): the gRPC adapter over one engine.

Protos in, :class:`~aflowrl.rollout.engine.RolloutEngine` calls, protos out. The servicer owns the
serving weight version (:class:`~aflowrl.rollout.gate.VersionGate`) and weight updates:

- ``UpdateWeights`` (grpc transport): the manifest is checked against the model (names, shapes,
  dtypes, sizes) and the serving version before any byte is accepted; chunks are staged in
  order (in a host buffer kept for the next update) and checksummed as they arrive; only a
  commit whose version, size and CRC-32 agree triggers the swap. A stream that ends or is cancelled
  early changes nothing. A refused stream is read to its end (and dropped) before the refusal
  is answered, so the sender reliably gets its status; the learner asks each replica's version
  first and never sends it a stale update.
- ``LoadWeights`` (filesystem transport, and the nccl transport's fallback): a directory with a
  complete marker of that version, each file's checksum verified, then read tensor by tensor
  into the engine.
- ``JoinWeightGroup`` / ``ReceiveWeights`` / ``LeaveWeightGroup`` (nccl transport): the
  engine's workers join the learner's weight group once; each push is one broadcast, received
  inside the swap gate: requests wait while it lands and are then served by the new version
  (or, refused, by the old one). A broadcast that breaks off after the engine started loading
  leaves some new and some old weights: the replica then answers UNAVAILABLE to every request
  and turns its readiness (the rollout service's health) NOT_SERVING until a complete version
  is loaded (``LoadWeights``, which then also accepts the version it already reports), and the
  trainer reloads it. Its liveness (the overall health) stays SERVING: only a dead engine
  turns that NOT_SERVING, so a long reload is never killed.

Versions are strictly increasing; a stale update is FAILED_PRECONDITION, a partial, corrupt or
non-finite one or another model's weights INVALID_ARGUMENT, and in every refused case, over every
transport, the previous weights keep serving and the replica stays ready. Everything is
recorded in :class:`~aflowrl.rollout.metrics.RolloutMetrics`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from aflowrl import __version__, documents, envs
from aflowrl._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.config.rollout import SamplingSpec
from aflowrl.models import tokens, weights, wire
from aflowrl.models.broadcast import Expectation, Rendezvous
from aflowrl.models.errors import (
    BroadcastBrokenError,
    CorruptWeightsError,
    IncompleteWeightsError,
    NonFiniteWeightsError,
    PartialWeightsError,
    StaleWeightsError,
    WeightLoadFailedError,
    WeightMismatchError,
)
from aflowrl.rollout.engine import PromptResult, RolloutEngine, SamplingOptions
from aflowrl.rollout.errors import (
    BadSamplingRequestError,
    EngineUnavailableError,
    WeightGroupStateError,
)
from aflowrl.rollout.gate import VersionGate
from aflowrl.rollout.metrics import RolloutMetrics

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name

Chunk = common_pb2.WeightChunk | wire.DataChunk | wire.MalformedChunk
"""What ``UpdateWeights`` receives: the server decodes it with :func:`wire.decode_chunk`."""


def _message(item: Chunk) -> common_pb2.WeightChunk | wire.DataChunk:
    if isinstance(item, wire.MalformedChunk):
        raise WeightMismatchError(
            f"the request does not parse as the method's message (a WeightChunk: {item.reason})",
            field=f"/{SERVICE_NAME}/UpdateWeights",
        )
    return item


_MAX_N = 1024
_MAX_STOP = 16


def sampling_options(
    params: rollout_pb2.SamplingParams | None, defaults: SamplingSpec
) -> SamplingOptions:
    """Request parameters with the run's defaults for what is unset; bad values name the field.

    An absent ``sampling`` takes every default of ``rollout.sampling``; inside it, ``top_p`` 0,
    ``n`` 0 and ``max_tokens`` 0 mean "unset" (proto3 has no presence for them).
    """
    if params is None:
        return SamplingOptions(
            temperature=defaults.temperature,
            top_p=defaults.top_p,
            top_k=defaults.top_k,
            max_tokens=defaults.max_tokens,
            stop=tuple(defaults.stop),
        )
    # Written as "not inside" so that NaN, which compares false with everything, is refused.
    checks = (
        (not 0 <= params.temperature <= 100, "temperature", "must be in [0, 100]"),
        (not 0 <= params.top_p <= 1, "top_p", "must be in (0, 1] (0 = 1)"),
        (params.max_tokens < 0, "max_tokens", "must be >= 1 (0 = the run's default)"),
        (params.n < 0 or params.n > _MAX_N, "n", f"must be in [1, {_MAX_N}] (0 = 1)"),
        (len(params.stop) > _MAX_STOP, "stop", f"at most {_MAX_STOP} stop strings"),
        (any(not s for s in params.stop), "stop", "stop strings must not be empty"),
    )
    for bad, name, message in checks:
        if bad:
            raise BadSamplingRequestError(message, field=f"sampling.{name}")
    return SamplingOptions(
        temperature=params.temperature,
        top_p=params.top_p or 1.0,
        top_k=params.top_k if params.top_k > 0 else -1,
        max_tokens=params.max_tokens or defaults.max_tokens,
        stop=tuple(params.stop),
        n=params.n or 1,
        seed=params.seed if params.HasField("seed") else None,
        logprobs=params.logprobs if params.HasField("logprobs") else True,
    )


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    """The RolloutService over ``engine`` (see module docstring)."""

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        sampling_defaults: SamplingSpec,
        score_temperature: float,
        metrics: RolloutMetrics,
        version: int = 0,
        on_health: Callable[[bool, bool], Awaitable[None]] | None = None,
    ) -> None:
        self.engine = engine
        self.sampling_defaults = sampling_defaults
        self.score_temperature = score_temperature
        self.metrics = metrics
        self.gate = VersionGate(version)
        self.needs_reload = False
        """True after a broadcast broke off midway (module docstring)."""
        self.on_health = on_health
        """``on_health(ready, alive)``: readiness (the rollout service's health) and liveness
        (the overall health, :func:`aflowrl.rollout.server.health_reporter`)."""
        self._joined: str | None = None
        """The weight group this replica's engine joined (nccl transport), None before."""
        self._landed = 0
        """Buckets of the current broadcast that reached the engine."""
        self._staging = weights.StagingBuffer()
        self._preparing: asyncio.Future[None] | None = None
        self._update_lock = asyncio.Lock()
        self._queued = 0
        self._generated_total = 0
        self._started = time.monotonic()
        self.engine_dead: str | None = None
        self.incarnation = uuid.uuid4().hex
        """This process's random id (Status): the trainer reuses a weight group only with the
        same incarnation of every member."""
        """Why the engine died (then health stays NOT_SERVING until the pod restarts)."""
        self._health_reports: set[asyncio.Future[None]] = set()
        self._updates: set[asyncio.Future[Any]] = set()
        """Weight operations running to their end (:meth:`_to_the_end`)."""
        engine.on_dead = self._engine_died
        metrics.weight_version.set(version)

    @property
    def version(self) -> int:
        return self.gate.version

    # ---- prompts ---------------------------------------------------------------------------------

    @functools.cached_property
    def _longest_token(self) -> int:
        """Characters of the tokenizer's longest token: no text of n characters takes fewer than
        n / this many tokens."""
        return max((len(token) for token in self.engine.tokenizer.get_vocab()), default=1)

    def check_text_length(self, chars: int, field: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit the model's positions."""
        if chars > self.engine.max_model_len * self._longest_token:
            raise BadSamplingRequestError(
                f"{chars} characters: more tokens than the model's {self.engine.max_model_len} "
                "positions",
                field=field,
            )

    def encode_prompt(self, prompt: common_pb2.Prompt, field: str) -> list[int]:
        """Token ids of a prompt: chat messages through the chat template, text, or ids."""
        tokenizer = self.engine.tokenizer
        kind = prompt.WhichOneof("kind")
        if kind == "token_ids":
            ids = list(prompt.token_ids.ids)
            vocab = len(tokenizer)
            if any(i < 0 or i >= vocab for i in ids):
                raise BadSamplingRequestError(
                    f"token ids must be in [0, {vocab})", field=f"{field}.token_ids"
                )
        elif kind == "text":
            self.check_text_length(len(prompt.text), f"{field}.text")
            ids = tokenizer(prompt.text, add_special_tokens=True).input_ids
        elif kind == "chat":
            messages = [(m.role, m.content) for m in prompt.chat.messages]
            if not messages:
                raise BadSamplingRequestError("no messages", field=f"{field}.chat.messages")
            self.check_text_length(
                sum(len(role) + len(content) for role, content in messages), f"{field}.chat"
            )
            ids = tokens.chat_prompt_ids(tokenizer, messages)
        else:
            raise BadSamplingRequestError("set one of text, chat or token_ids", field=field)
        if not ids:
            raise BadSamplingRequestError("the prompt has no tokens", field=field)
        return list(ids)

    # ---- generation ------------------------------------------------------------------------------

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: Any
    ) -> rollout_pb2.GenerateResponse:
        sampling = sampling_options(
            request.sampling if request.HasField("sampling") else None, self.sampling_defaults
        )
        prompts = [self.encode_prompt(p, f"prompts[{i}]") for i, p in enumerate(request.prompts)]
        if request.prompt_seeds:
            sampling = dataclasses.replace(sampling, prompt_seeds=tuple(request.prompt_seeds))
        if not prompts:
            return rollout_pb2.GenerateResponse(weight_version=self.version)
        self._queued += 1
        self.metrics.queued.inc()
        entered = False
        try:
            async with self.gate.serving() as version:
                entered = True
                self._check_complete()
                self._queued -= 1
                self.metrics.queued.dec()
                self.metrics.running.inc()
                started = time.perf_counter()
                try:
                    results = await self.engine.generate(prompts, sampling)
                finally:
                    self.metrics.running.dec()
                latency = time.perf_counter() - started
        finally:
            if not entered:
                self._queued -= 1
                self.metrics.queued.dec()
        return self._generate_response(results, version, latency)

    def _generate_response(
        self, results: Sequence[PromptResult], version: int, latency: float
    ) -> rollout_pb2.GenerateResponse:
        generated = sum(len(c.token_ids) for r in results for c in r.completions)
        self._generated_total += generated
        self.metrics.generated_tokens.inc(generated)
        self.metrics.prompt_tokens.inc(sum(len(r.prompt_token_ids) for r in results))
        self.metrics.sequences.inc(sum(len(r.completions) for r in results))
        self.metrics.generate_duration.observe(latency)
        if latency > 0:
            self.metrics.throughput.set(generated / latency)
        return rollout_pb2.GenerateResponse(
            results=[
                rollout_pb2.PromptCompletions(
                    prompt_token_ids=r.prompt_token_ids,
                    completions=[
                        rollout_pb2.Completion(
                            token_ids=c.token_ids,
                            text=c.text,
                            logprobs=c.logprobs,
                            finish_reason=c.finish_reason,
                        )
                        for c in r.completions
                    ],
                )
                for r in results
            ],
            weight_version=version,
            generated_tokens=generated,
            latency_s=latency,
        )

    async def ScoreCandidates(
        self, request: rollout_pb2.ScoreCandidatesRequest, context: Any
    ) -> rollout_pb2.ScoreCandidatesResponse:
        tokenizer = self.engine.tokenizer
        items: list[tuple[list[int], list[list[int]]]] = []
        for i, item in enumerate(request.items):
            prompt = self.encode_prompt(item.prompt, f"items[{i}].prompt")
            if not item.candidates:
                raise BadSamplingRequestError("no candidates", field=f"items[{i}].candidates")
            for j, candidate in enumerate(item.candidates):
                self.check_text_length(len(candidate), f"items[{i}].candidates[{j}]")
            candidates = [tokens.continuation_ids(tokenizer, c) for c in item.candidates]
            for j, ids in enumerate(candidates):
                if not ids:
                    raise BadSamplingRequestError(
                        "empty candidate", field=f"items[{i}].candidates[{j}]"
                    )
                if len(prompt) + len(ids) > self.engine.max_model_len:
                    raise BadSamplingRequestError(
                        f"prompt + candidate exceed {self.engine.max_model_len} tokens",
                        field=f"items[{i}].candidates[{j}]",
                    )
            items.append((prompt, candidates))
        async with self.gate.serving() as version:
            self._check_complete()
            scores = [
                await self.engine.score(prompt, candidates, self.score_temperature)
                for prompt, candidates in items
            ]
        return rollout_pb2.ScoreCandidatesResponse(
            items=[
                rollout_pb2.CandidateScores(
                    prompt_token_ids=prompt,
                    candidate_token_ids=[common_pb2.TokenIds(ids=ids) for ids in candidates],
                    candidate_logprobs=[common_pb2.TokenFloats(values=v) for v in item_scores],
                )
                for (prompt, candidates), item_scores in zip(items, scores, strict=True)
            ],
            weight_version=version,
        )

    # ---- weights ---------------------------------------------------------------------------------

    def _engine_died(self, reason: str) -> None:
        """The engine's on_dead hook (on the event loop): not ready and not alive, for good."""
        self.engine_dead = reason
        if self.on_health is not None:
            report = asyncio.ensure_future(self.on_health(False, False))
            self._health_reports.add(report)
            report.add_done_callback(self._health_reports.discard)

    def _check_complete(self) -> None:
        if self.engine_dead is not None:
            raise EngineUnavailableError(f"the engine is dead ({self.engine_dead})")
        if self.needs_reload:
            raise IncompleteWeightsError(
                f"this replica's weights are incomplete (a broadcast broke off after version "
                f"{self.version}); it serves again once a complete version is loaded"
            )

    async def _set_complete(self, complete: bool) -> None:
        if complete == (not self.needs_reload):
            return
        self.needs_reload = not complete
        self.metrics.weights_incomplete.set(0 if complete else 1)
        if self.on_health is not None and self.engine_dead is None:
            await self.on_health(complete, True)  # readiness only: waiting is not death

    def _floor(self) -> int:
        """Versions above this one are accepted: newer than the serving version, or, while the
        weights are incomplete, the serving version again (a reload)."""
        return self.version - 1 if self.needs_reload else self.version

    def _refused(self, exc: BaseException, *, cancelled: bool = False) -> None:
        reason = "mismatch"
        for kind, name in (
            (StaleWeightsError, "stale"),
            (PartialWeightsError, "partial"),
            (CorruptWeightsError, "corrupt"),
            (NonFiniteWeightsError, "non_finite"),
            (BroadcastBrokenError, "broken"),
        ):
            if isinstance(exc, kind):
                reason = name
        if cancelled or isinstance(exc, asyncio.CancelledError):
            reason = "interrupted"  # the sender went away mid-stream
        self.metrics.weight_updates_refused.labels(reason).inc()
        message = str(exc) or type(exc).__name__
        if "keeps serving" not in message:
            message += f"; version {self.version} keeps serving"
        logger.warning("weight update refused (%s): %s", reason, message)

    async def _to_the_end(self, update: Awaitable[_T]) -> _T:
        """Run a weight operation to its end even if the caller goes away.

        The engine's side of an update runs on (its thread, its workers); were its coroutine
        cancelled midway (a trainer cancels sibling calls on the first failure), the served
        label, the readiness and the engine's weights could disagree, e.g. the new weights
        loaded while the label says the old version. So the update finishes in its own task,
        holding the version gate as ever, and a cancelled call waits for it (keeping its own
        locks and buffers until then) before it ends as cancelled."""
        task: asyncio.Future[_T] = asyncio.ensure_future(update)
        self._updates.add(task)
        task.add_done_callback(self._updates.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                logger.warning("a weight update's caller went away; the update runs to its end")
                await asyncio.wait([task])
            raise

    async def _swap(
        self,
        tensors: Iterable[tuple[str, torch.Tensor]],
        version: int,
        *,
        transport: str,
        nbytes: int,
        staged: Mapping[str, torch.Tensor] | None = None,
    ) -> int:
        """Load a verified stream of tensors as ``version``; returns the engine's pieces.

        ``staged``: the same tensors, views of :attr:`_staging`'s buffer, which an engine on the
        CPU may serve from as they are (:meth:`RolloutEngine.adopt_weights`) instead of copying.
        """
        async with self.gate.swapping():
            weights.check_stale(version, self._floor())
            self.metrics.weight_updates_running.inc()
            try:
                if staged is not None and await self.engine.adopt_weights(staged):
                    self._staging.adopted()
                    # The spare buffer's pages are mapped in the background, not by the next push.
                    self._preparing = asyncio.ensure_future(
                        asyncio.to_thread(self._staging.prepare)
                    )
                    pieces = 1
                else:
                    pieces = await self._load(tensors, version)
            finally:
                self.metrics.weight_updates_running.dec()
            self.gate.version = version
            await self._set_complete(True)
        self.metrics.weight_version.set(version)
        self.metrics.weight_update_bytes.labels(transport).inc(nbytes)
        self.metrics.weight_update_buckets.labels(transport).inc(pieces)
        return pieces

    async def _load(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> int:
        """The engine's load; one that fails midway with the old weights not intact takes the
        replica out of rotation (NOT_SERVING, UNAVAILABLE) until a complete version is loaded.
        The version label is not touched."""
        try:
            return await self.engine.load_weights(tensors)
        except WeightLoadFailedError as exc:
            if not exc.intact:
                await self._set_complete(False)
            failure: WeightLoadFailedError = exc
        except EngineUnavailableError:
            raise
        except Exception as exc:  # noqa: BLE001 - an engine that did not say: assume a mix
            await self._set_complete(False)
            failure = WeightLoadFailedError(f"{type(exc).__name__}: {exc}", intact=False)
            failure.__cause__ = exc
        keeps = f"version {self.version} keeps serving" if failure.intact else "serving nothing"
        self.metrics.weight_updates_refused.labels("load_failed").inc()
        logger.error("loading weights v%d failed midway (%s): %s", version, keeps, failure)
        raise WeightLoadFailedError(
            f"loading weights version {version} failed midway ({failure}); {keeps} until a "
            "complete version is loaded"
            if not failure.intact
            else f"loading weights version {version} failed midway ({failure}); {keeps}",
            intact=failure.intact,
        ) from failure

    async def UpdateWeights(
        self, request_iterator: AsyncIterator[Chunk], context: Any
    ) -> rollout_pb2.UpdateWeightsResponse:
        async with self._update_lock:
            try:
                return await self._receive(request_iterator)
            except (WeightMismatchError, StaleWeightsError) as exc:
                self._refused(exc, cancelled=bool(context.cancelled()))
                # Read the rest of the stream before answering: a status sent while the client
                # is still writing can reach it as INTERNAL instead of the refusal (grpc-python).
                async for _ in request_iterator:
                    pass
                raise
            except asyncio.CancelledError as exc:
                self._refused(exc, cancelled=True)
                raise

    async def _receive(
        self, request_iterator: AsyncIterator[Chunk]
    ) -> rollout_pb2.UpdateWeightsResponse:
        iterator = aiter(request_iterator)
        try:
            first = _message(await anext(iterator))
        except StopAsyncIteration:
            raise PartialWeightsError("empty stream", field="manifest") from None
        if not isinstance(first, common_pb2.WeightChunk) or not first.HasField("manifest"):
            raise WeightMismatchError("the first message must be the manifest", field="manifest")
        started = time.perf_counter()
        manifest = wire.manifest_from_proto(first.manifest)
        weights.check_manifest(
            manifest, self.engine.parameter_shapes(), serving_version=self._floor()
        )
        if self._preparing is not None:
            preparing, self._preparing = self._preparing, None
            try:
                await preparing
            except MemoryError as exc:  # the assembler allocates what it needs itself
                logger.warning("could not map the spare staging buffer ahead: %s", exc)
        assembler = weights.PayloadAssembler(manifest, self._staging)
        try:
            commit: common_pb2.WeightCommit | None = None
            async for item in iterator:
                message = _message(item)
                if isinstance(message, wire.DataChunk):
                    assembler.add(message.offset, message.data)
                elif message.HasField("data"):
                    assembler.add(message.data.offset, message.data.data)
                elif message.HasField("commit"):
                    commit = message.commit
                    break
                else:
                    raise WeightMismatchError(
                        "a second manifest inside the stream", field="manifest"
                    )
            if commit is None:
                raise PartialWeightsError(
                    f"the stream ended before its commit ({assembler.received} of "
                    f"{manifest.total_bytes} bytes received)",
                    field="commit",
                )
            tensors = await asyncio.to_thread(assembler.finish, commit.version, commit.crc32)
        finally:
            assembler.close()
        pieces = await self._to_the_end(
            self._swap(
                tensors.items(),
                manifest.version,
                transport="grpc",
                nbytes=manifest.total_bytes,
                staged=tensors,
            )
        )
        seconds = time.perf_counter() - started
        self.metrics.weight_update_duration.labels("grpc").observe(seconds)
        logger.info(
            "weights v%d received over gRPC (%.1f MB in %.2fs)",
            manifest.version,
            manifest.total_bytes / 1e6,
            seconds,
        )
        return rollout_pb2.UpdateWeightsResponse(
            weight_version=self.version,
            bytes=manifest.total_bytes,
            seconds=seconds,
            buckets=pieces,
        )

    async def LoadWeights(
        self, request: rollout_pb2.LoadWeightsRequest, context: Any
    ) -> rollout_pb2.UpdateWeightsResponse:
        return await self._to_the_end(self._load_directory_locked(request.path, request.version))

    async def _load_directory_locked(
        self, path: str, version: int
    ) -> rollout_pb2.UpdateWeightsResponse:
        async with self._update_lock:
            try:
                return await self.load_directory(path, version)
            except (WeightMismatchError, StaleWeightsError) as exc:
                self._refused(exc)
                raise

    async def load_directory(self, path: str, version: int) -> rollout_pb2.UpdateWeightsResponse:
        """Verify and load a safetensors weights directory of ``version`` (filesystem transport).

        Every file is checked before the first tensor is read; tensors are then read one at a
        time into the engine.
        """
        documents.request_path(path, source="path")
        weights.check_stale(version, self._floor())
        started = time.perf_counter()
        source = await asyncio.to_thread(
            weights.verify_weights_dir,
            path,
            self.engine.parameter_shapes(),
            version=version,
            serving_version=self._floor(),
        )
        nbytes = source.manifest.total_bytes
        pieces = await self._swap(
            weights.iter_weights_dir(source), version, transport="filesystem", nbytes=nbytes
        )
        seconds = time.perf_counter() - started
        self.metrics.weight_update_duration.labels("filesystem").observe(seconds)
        logger.info("weights v%d loaded from %s (%.2fs)", version, path, seconds)
        return rollout_pb2.UpdateWeightsResponse(
            weight_version=self.version, bytes=nbytes, seconds=seconds, buckets=pieces
        )

    # ---- nccl transport ------------------------------------------------------------------------

    async def JoinWeightGroup(
        self, request: rollout_pb2.JoinWeightGroupRequest, context: Any
    ) -> rollout_pb2.JoinWeightGroupResponse:
        checks = (
            (not request.master_address, "master_address", "empty"),
            (not 0 < request.port < 65536, "port", "must be in [1, 65535]"),
            (not request.group, "group", "empty"),
            (request.rank_offset < 1, "rank_offset", "must be >= 1 (rank 0 is the learner)"),
            (
                request.rank_offset + self.engine.weight_group_ranks > request.world_size,
                "world_size",
                f"too small for ranks {request.rank_offset}..{request.rank_offset}"
                f"+{self.engine.weight_group_ranks}",
            ),
        )
        for bad, field, message in checks:
            if bad:
                raise BadSamplingRequestError(message, field=field)
        rendezvous = Rendezvous(
            request.master_address,
            request.port,
            request.group,
            request.rank_offset,
            request.world_size,
            request.timeout_s or 600.0,
        )
        async with self._update_lock:
            self._joined = None  # joining leaves the previous group first
            try:
                await self.engine.join_weight_group(rendezvous)
            except RuntimeError as exc:
                raise BroadcastBrokenError(
                    f"could not join weight group {request.group} at "
                    f"{request.master_address}:{request.port}: {exc}"
                ) from exc
            self._joined = request.group
        logger.info(
            "joined weight group %s as ranks %d..%d of %d",
            request.group,
            request.rank_offset,
            request.rank_offset + self.engine.weight_group_ranks - 1,
            request.world_size,
        )
        return rollout_pb2.JoinWeightGroupResponse(ranks=self.engine.weight_group_ranks)

    async def ReceiveWeights(
        self, request: rollout_pb2.ReceiveWeightsRequest, context: Any
    ) -> rollout_pb2.UpdateWeightsResponse:
        return await self._to_the_end(self._receive_broadcast(request))

    async def _receive_broadcast(
        self, request: rollout_pb2.ReceiveWeightsRequest
    ) -> rollout_pb2.UpdateWeightsResponse:
        async with self._update_lock:
            if self._joined is None or request.group != self._joined:
                # Premature or misdirected: refused before the engine or the weights are touched.
                raise WeightGroupStateError(
                    f"this replica is in weight group {self._joined!r}, not {request.group!r}: "
                    "JoinWeightGroup first",
                    field="group",
                )
            started = time.perf_counter()
            self._landed = 0
            try:
                async with self.gate.swapping():
                    expectation = Expectation(
                        int(request.version), self._floor(), dict(self.engine.parameter_shapes())
                    )
                    self.metrics.weight_updates_running.inc()
                    try:
                        result = await self.engine.receive_weights(
                            expectation, on_bucket=self._bucket_landed
                        )
                    except BroadcastBrokenError as exc:
                        self._joined = None  # the engine left the broken group
                        if exc.intact is False or (exc.intact is None and self._landed):
                            # Some weights may be new: serve none until reloaded.
                            await self._set_complete(False)
                        raise
                    except (WeightMismatchError, StaleWeightsError, EngineUnavailableError):
                        # A refusal (non-finite values, a stale version, another model's
                        # weights) comes before anything is loaded: the previous version keeps
                        # serving, and the group stays joined (the broadcast was drained).
                        raise
                    except Exception as exc:  # an engine that did not say what it left
                        # As _load: assume a mix, serve none until a complete version is
                        # loaded; where the group's stream stands is unknown, so the next push
                        # joins a new group (joining leaves this one).
                        self._joined = None
                        await self._set_complete(False)
                        logger.error("receiving weights v%d failed: %r", request.version, exc)
                        raise BroadcastBrokenError(
                            f"receiving weights version {request.version} failed "
                            f"({type(exc).__name__}: {exc}); serving nothing until a complete "
                            "version is loaded",
                            intact=False,
                        ) from exc
                    finally:
                        self.metrics.weight_updates_running.dec()
                    self.gate.version = result.manifest.version
                    await self._set_complete(True)
            except (WeightMismatchError, StaleWeightsError, BroadcastBrokenError) as exc:
                self._refused(exc)
                raise
        seconds = time.perf_counter() - started
        self.metrics.weight_version.set(self.version)
        self.metrics.weight_update_bytes.labels("nccl").inc(result.bytes)
        self.metrics.weight_update_duration.labels("nccl").observe(seconds)
        logger.info(
            "weights v%d received by broadcast (%.1f MB, %d buckets, %.2fs)",
            self.version,
            result.bytes / 1e6,
            result.buckets,
            seconds,
        )
        return rollout_pb2.UpdateWeightsResponse(
            weight_version=self.version, bytes=result.bytes, seconds=seconds, buckets=result.buckets
        )

    def _bucket_landed(self, nbytes: int) -> None:
        """Called on the engine's thread as each bucket arrives (prometheus is thread-safe)."""
        self._landed += 1
        self.metrics.weight_update_buckets.labels("nccl").inc()

    async def LeaveWeightGroup(
        self, request: rollout_pb2.LeaveWeightGroupRequest, context: Any
    ) -> rollout_pb2.LeaveWeightGroupResponse:
        async with self._update_lock:
            if request.group and request.group != self._joined:
                return rollout_pb2.LeaveWeightGroupResponse()  # not the joined one: nothing
            await self.engine.leave_weight_group()
            self._joined = None
        return rollout_pb2.LeaveWeightGroupResponse()

    async def Status(
        self, request: rollout_pb2.RolloutStatusRequest, context: Any
    ) -> rollout_pb2.RolloutStatusResponse:
        engine_queued, engine_running = self.engine.load_stats()
        return rollout_pb2.RolloutStatusResponse(
            service=common_pb2.ServiceInfo(
                component="rollout",
                version=__version__,
                hostname=envs.AFLOWRL_POD_NAME,
                uptime_s=time.monotonic() - self._started,
            ),
            backend=self.engine.backend,
            model=str(self.engine.model_dir),
            weight_version=self.version,
            queued_requests=self._queued + engine_queued,
            running_requests=max(self.gate.serving_requests, engine_running),
            generated_tokens_total=self._generated_total,
            weight_group_ranks=self.engine.weight_group_ranks,
            needs_reload=self.needs_reload,
            incarnation=self.incarnation,
        )
