"""``LearnerService`` (protos/aflowrl/v1/learner.proto) on rank 0: protos in, commands out.

Each call is validated here (so every rank agrees to run it), converted to a
:class:`~aflowrl.learner.worker.Command` and run by one command thread, which broadcasts it to
the other ranks and runs it locally (collectives need one caller at a time; the asyncio loop stays
free for health checks). Train is never retried by clients (it would train twice).

If a collective command fails with an unexpected error while several ranks run, the ranks may
disagree about where they are: the learner then refuses every further call and stops serving, so
Kubernetes (or the local launcher) restarts it from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from aflowrl import __version__, documents, envs
from aflowrl._proto.v1 import common_pb2, learner_pb2, learner_pb2_grpc
from aflowrl.common.client import ChannelOptions
from aflowrl.errors import AflowRLError
from aflowrl.learner import checkpoint
from aflowrl.learner.batching import ChoiceItem, Item, SequenceItem, TrainRow
from aflowrl.learner.errors import (
    BadBatchError,
    LearnerBrokenError,
    NoReferenceError,
    UnusablePathError,
    WeightGroupError,
)
from aflowrl.learner.metrics import LearnerMetrics
from aflowrl.learner.push import PushSink, ReplicaChannels, ReplicaFanout
from aflowrl.learner.worker import (
    BroadcastWeightsCommand,
    Command,
    ComputeLogProbsCommand,
    ExportCommand,
    HeartbeatCommand,
    LoadCommand,
    SaveCommand,
    Scores,
    StreamWeightsCommand,
    TrainCommand,
    lead,
)
from aflowrl.models import loading

logger = logging.getLogger(__name__)

SERVICE_NAME = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"].full_name
_MIB = 1024 * 1024


class CommandThread:
    """One daemon thread running commands in order (a stuck collective cannot block exit).

    ``idle``: called on the thread after ``idle_s`` without a command (the learner's heartbeat
    to its other ranks, :data:`~aflowrl.learner.distributed.HEARTBEAT_FRACTION`).
    """

    def __init__(self, idle: Callable[[], Any] | None = None, idle_s: float = 0.0) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._idle = idle
        self._idle_s = idle_s if idle is not None and idle_s > 0 else None
        self._thread = threading.Thread(target=self._loop, name="learner-commands", daemon=True)
        self._thread.start()

    def _next(self) -> tuple[Callable[[], Any], Future[Any]] | None:
        while True:
            try:
                return self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                assert self._idle is not None
                try:
                    self._idle()
                except Exception as exc:  # noqa: BLE001 - the next command meets it too
                    logger.warning("idle heartbeat to the other ranks failed: %s", exc)

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(exc)

    async def run(self, fn: Callable[[], Any]) -> Any:
        future: Future[Any] = Future()
        self._queue.put((fn, future))
        return await asyncio.wrap_future(future)

    def close(self, timeout_s: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)


async def _on_own_thread(fn: Callable[[], Any], name: str) -> Any:
    """``fn()`` on a new daemon thread: unlike the event loop's shared executor, whose few
    workers could all be held by groups whose members never come, nothing queues behind it."""
    future: Future[Any] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await asyncio.wrap_future(future)


def _ids(
    values: Sequence[int], vocab: int, field: str, *, allow_empty: bool = False
) -> tuple[int, ...]:
    ids = tuple(int(v) for v in values)
    if not ids and not allow_empty:
        raise BadBatchError("no tokens", field=field)
    if any(v < 0 or v >= vocab for v in ids):
        raise BadBatchError(f"token ids must be in [0, {vocab})", field=field)
    return ids


def _floats(
    values: Sequence[float], width: int, field: str, *, optional: bool = False
) -> tuple[float, ...] | None:
    if optional and not values:
        return None
    if len(values) != width:
        raise BadBatchError(f"{len(values)} values for a row of {width}", field=field)
    out = tuple(float(v) for v in values)
    if not all(math.isfinite(v) for v in out):
        raise BadBatchError("values must be finite", field=field)
    return out


async def _writable_dir(text: str, field: str) -> str:
    """The directory a request names, created here: a path the ranks cannot write is refused
    before the collective command starts (a failure inside it would stop the learner)."""
    path = documents.request_path(text, source=field)
    try:
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
    except OSError as exc:
        raise UnusablePathError(
            f"cannot create directory {text[:200]}: {exc.strerror or exc}", field=field
        ) from None
    return text


class LearnerServicer(learner_pb2_grpc.LearnerServiceServicer):
    """The LearnerService over the rank-0 :class:`~aflowrl.learner.worker.Learner`."""

    def __init__(
        self,
        learner: Any,
        metrics: LearnerMetrics,
        *,
        on_broken: Callable[[], None] | None = None,
        default_chunk_bytes: int = 4 * _MIB,
        push_options: ChannelOptions | None = None,
        heartbeat_s: float = 0.0,
    ) -> None:
        """``heartbeat_s``: how long the command thread may stay idle before it sends the other
        ranks a heartbeat (0: never; a learner of one rank has no one to tell)."""
        self.learner = learner
        self.metrics = metrics
        ctx = learner.ctx
        self.commands = (
            CommandThread(lambda: lead(learner, HeartbeatCommand()), heartbeat_s)
            if ctx.world_size > 1 and heartbeat_s > 0
            else CommandThread()
        )
        self.on_broken = on_broken
        self._broken = False
        self._started = time.monotonic()
        self.default_chunk_bytes = default_chunk_bytes
        self.push_options = push_options or ChannelOptions(timeout_s=3600.0, max_attempts=1)
        """How rank 0 dials the rollout replicas it pushes to (grpc transport)."""
        self.push_channels = ReplicaChannels(self.push_options)
        """Those channels, kept from one push to the next."""
        config = learner.policy.module.lm.config
        self.vocab = int(config.vocab_size)
        self.max_len = int(getattr(config, "max_position_embeddings", 1 << 30))

    async def _run(self, command: Command) -> Any:
        if self._broken:
            raise LearnerBrokenError("a previous collective step failed; the learner is stopping")
        try:
            return await self.commands.run(lambda: lead(self.learner, command))
        except AflowRLError:
            raise
        except Exception:
            if self.learner.ctx.world_size > 1:
                self._broken = True
                logger.exception(
                    "collective %s failed: stopping the learner", type(command).__name__
                )
                if self.on_broken is not None:
                    self.on_broken()
            raise

    # ---- requests to rows ------------------------------------------------------------------------

    def _value_bins(
        self, bins: Sequence[common_pb2.TokenIds], prompt: int, field: str
    ) -> tuple[tuple[int, ...], ...]:
        out = tuple(
            _ids(b.ids, self.vocab, f"{field}.value_token_ids[{k}]") for k, b in enumerate(bins)
        )
        if len(out) == 1:
            raise BadBatchError(
                "one value reply: at least 2 bins", field=f"{field}.value_token_ids"
            )
        if out and prompt + max(len(b) for b in out) > self.max_len:
            raise BadBatchError(f"longer than the model's {self.max_len} positions", field=field)
        return out

    def _sequence(self, message: learner_pb2.Sequence, field: str) -> SequenceItem:
        prompt = _ids(message.prompt_token_ids, self.vocab, f"{field}.prompt_token_ids")
        item = SequenceItem(
            prompt,
            _ids(message.response_token_ids, self.vocab, f"{field}.response_token_ids"),
            self._value_bins(message.value_token_ids, len(prompt), field),
        )
        if len(item.prompt) + len(item.response) > self.max_len:
            raise BadBatchError(f"longer than the model's {self.max_len} positions", field=field)
        return item

    def _choice(self, message: learner_pb2.ChoiceDecision, field: str) -> ChoiceItem:
        prompt = _ids(message.prompt_token_ids, self.vocab, f"{field}.prompt_token_ids")
        candidates = tuple(
            _ids(c.ids, self.vocab, f"{field}.candidate_token_ids[{k}]")
            for k, c in enumerate(message.candidate_token_ids)
        )
        if not candidates:
            raise BadBatchError("no candidates", field=f"{field}.candidate_token_ids")
        if not 0 <= message.chosen < len(candidates):
            raise BadBatchError(
                f"{message.chosen} is not a candidate index (0..{len(candidates) - 1})",
                field=f"{field}.chosen",
            )
        if len(prompt) + max(len(c) for c in candidates) > self.max_len:
            raise BadBatchError(f"longer than the model's {self.max_len} positions", field=field)
        return ChoiceItem(
            prompt,
            candidates,
            int(message.chosen),
            length_normalised=bool(message.length_normalised),
            value_bins=self._value_bins(message.value_token_ids, len(prompt), field),
        )

    def _train_row(
        self, sample: learner_pb2.TrainSample, field: str, *, supervised: bool = False
    ) -> TrainRow:
        kind = sample.WhichOneof("kind")
        item: Item
        if kind == "sequence":
            item = self._sequence(sample.sequence, f"{field}.sequence")
        elif kind == "choice":
            item = self._choice(sample.choice, f"{field}.choice")
        else:
            raise BadBatchError("set sequence or choice", field=field)
        width = item.width
        critic = self.learner.critic and not supervised
        old = _floats(sample.old_logprobs, width, f"{field}.old_logprobs", optional=supervised)
        advantages = _floats(sample.advantages, width, f"{field}.advantages", optional=supervised)
        target_weights = self._target_weights(sample, item, field) if supervised else None
        candidates = len(item.candidates) if isinstance(item, ChoiceItem) else 0
        for name in ("candidate_old_logprobs", "candidate_advantages"):
            if getattr(sample, name) and not candidates:
                raise BadBatchError("only choice samples take them", field=f"{field}.{name}")
        candidate_old = _floats(
            sample.candidate_old_logprobs,
            candidates,
            f"{field}.candidate_old_logprobs",
            optional=True,
        )
        candidate_advantages = _floats(
            sample.candidate_advantages, candidates, f"{field}.candidate_advantages", optional=True
        )
        if candidate_advantages is not None and candidate_old is None and not supervised:
            raise BadBatchError(
                "candidate_advantages need candidate_old_logprobs (pi_old weighs each candidate)",
                field=f"{field}.candidate_old_logprobs",
            )
        value_target: float | None = None
        if sample.HasField("value_target"):
            value_target = float(sample.value_target)
            if not math.isfinite(value_target):
                raise BadBatchError(f"{value_target} is not finite", field=f"{field}.value_target")
        return TrainRow(
            item,
            old or (0.0,) * width,
            advantages or (0.0,) * width,
            _floats(sample.ref_logprobs, width, f"{field}.ref_logprobs", optional=True),
            _floats(sample.returns, width, f"{field}.returns", optional=not critic),
            _floats(sample.old_values, width, f"{field}.old_values", optional=not critic),
            value_target if item.value_bins else None,
            target_weights,
            candidate_old,
            None if supervised else candidate_advantages,
        )

    @staticmethod
    def _target_weights(
        sample: learner_pb2.TrainSample, item: Item, field: str
    ) -> tuple[float, ...] | None:
        """A choice row's target distribution (the supervised warm start)."""
        if not isinstance(item, ChoiceItem):
            if sample.target_weights:
                raise BadBatchError(
                    "only choice samples take them", field=f"{field}.target_weights"
                )
            return None
        weights = tuple(float(w) for w in sample.target_weights)
        if len(weights) != len(item.candidates):
            raise BadBatchError(
                f"{len(weights)} weights for {len(item.candidates)} candidates",
                field=f"{field}.target_weights",
            )
        if not all(math.isfinite(w) and w >= 0 for w in weights) or abs(sum(weights) - 1) > 1e-3:
            raise BadBatchError(
                "weights must be non-negative and sum to 1", field=f"{field}.target_weights"
            )
        return weights

    # ---- RPCs ------------------------------------------------------------------------------------

    async def ComputeLogProbs(
        self, request: learner_pb2.ComputeLogProbsRequest, context: Any
    ) -> learner_pb2.ComputeLogProbsResponse:
        items: list[Item] = [
            self._sequence(s, f"sequences[{i}]") for i, s in enumerate(request.sequences)
        ]
        items += [self._choice(c, f"choices[{j}]") for j, c in enumerate(request.choices)]
        if request.reference and not self.learner.policy.has_reference:
            raise NoReferenceError(
                "reference: the learner keeps no reference model (learner.loss.klCoef is 0)"
            )
        if request.values and (request.reference or not self.learner.critic):
            raise BadBatchError(
                "values need the critic of the policy (learner.algorithm.type 'ppo')",
                field="values",
            )
        if not items:
            return learner_pb2.ComputeLogProbsResponse(
                policy_version=0 if request.reference else self.learner.state.policy_version
            )
        started = time.perf_counter()
        scores: list[Scores]
        scores, version = await self._run(
            ComputeLogProbsCommand(items, request.reference, request.entropies, request.values)
        )
        self.metrics.logprob_duration.labels(
            "reference" if request.reference else "policy"
        ).observe(time.perf_counter() - started)
        return learner_pb2.ComputeLogProbsResponse(
            logprobs=[common_pb2.TokenFloats(values=s.logprobs) for s in scores],
            entropies=[common_pb2.TokenFloats(values=s.entropies or []) for s in scores]
            if request.entropies
            else [],
            values=[common_pb2.TokenFloats(values=s.values or []) for s in scores]
            if request.values
            else [],
            policy_version=version,
            candidate_logprobs=[
                common_pb2.TokenFloats(values=s.candidates or [])
                for s in scores
                if s.candidates is not None
            ],
        )

    async def Train(
        self, request: learner_pb2.TrainRequest, context: Any
    ) -> learner_pb2.TrainResponse:
        supervised = request.objective == learner_pb2.OBJECTIVE_SFT
        rows = [
            self._train_row(s, f"samples[{i}]", supervised=supervised)
            for i, s in enumerate(request.samples)
        ]
        if not rows:
            raise BadBatchError("empty batch", field="samples")
        kl = self.learner.spec.learner.loss.kl_coef > 0
        if kl and not supervised and not self.learner.policy.has_reference:
            raise NoReferenceError("the KL term needs a reference model")
        started = time.perf_counter()
        metrics: dict[str, float]
        metrics, version = await self._run(TrainCommand(rows, int(request.iteration), supervised))
        self._record_train(metrics, version, time.perf_counter() - started)
        return learner_pb2.TrainResponse(
            metrics=common_pb2.Metrics(values=metrics), policy_version=version
        )

    def _record_train(self, values: dict[str, float], version: int, seconds: float) -> None:
        m = self.metrics
        m.policy_loss.set(values["losses/policy"])
        m.value_loss.set(values["losses/value"])
        m.kl.set(values["losses/kl"])
        m.approx_kl.set(values["charts/approx_kl"])
        m.entropy.set(values["losses/entropy"])
        m.clipfrac.set(values["charts/clipfrac"])
        for gauge, name in (
            (m.update_kl, "policy/update_kl"),
            (m.update_tv, "policy/update_tv"),
            (m.start_kl, "policy/start_kl"),
            (m.start_tv, "policy/start_tv"),
            (m.param_distance, "policy/param_distance"),
        ):
            value = values.get(name, math.nan)
            if math.isfinite(value):
                gauge.set(value)
        if math.isfinite(values["charts/grad_norm"]):
            m.grad_norm.set(values["charts/grad_norm"])
        m.learning_rate.set(values["charts/lr"])
        m.train_duration.observe(seconds)
        m.tokens_per_second.set(values["perf/tokens_per_s"])
        m.trained_tokens.inc(values["perf/tokens"])
        m.policy_version.set(version)

    async def SaveCheckpoint(
        self, request: learner_pb2.SaveCheckpointRequest, context: Any
    ) -> learner_pb2.CheckpointResponse:
        path = await _writable_dir(request.path, "path")
        seconds: float = await self._run(SaveCommand(path, bytes(request.client_state)))
        self.metrics.checkpoint_duration.labels("save").observe(seconds)
        state = self.learner.state
        logger.info(
            "checkpoint saved to %s (step %d, v%d)", request.path, state.step, state.policy_version
        )
        return learner_pb2.CheckpointResponse(
            path=request.path, policy_version=state.policy_version, step=state.step, seconds=seconds
        )

    async def LoadCheckpoint(
        self, request: learner_pb2.LoadCheckpointRequest, context: Any
    ) -> learner_pb2.CheckpointResponse:
        path = str(documents.request_path(request.path, source="path"))
        # Refused here, before the ranks start a load that cannot succeed.
        await asyncio.to_thread(checkpoint.verify, Path(path))
        client_state, seconds = await self._run(LoadCommand(path, int(request.min_policy_version)))
        self.metrics.checkpoint_duration.labels("load").observe(seconds)
        state = self.learner.state
        self.metrics.policy_version.set(state.policy_version)
        logger.info(
            "checkpoint %s loaded (step %d, v%d)", request.path, state.step, state.policy_version
        )
        return learner_pb2.CheckpointResponse(
            path=request.path,
            policy_version=state.policy_version,
            step=state.step,
            client_state=client_state,
            seconds=seconds,
        )

    def _dtype(self, name: str) -> str | None:
        if name and name not in loading.DTYPES:
            raise BadBatchError(f"{name!r} is not one of {loading.DTYPES}", field="dtype")
        return name or None

    async def PushWeights(
        self, request: learner_pb2.PushWeightsRequest, context: Any
    ) -> learner_pb2.PushWeightsResponse:
        targets = list(request.targets)
        if not targets:
            raise BadBatchError("no rollout replicas to push to", field="targets")
        for i, target in enumerate(targets):
            host, _, port = target.rpartition(":")
            if not host or not port.isdigit():
                raise BadBatchError(f"{target!r} is not host:port", field=f"targets[{i}]")
        if request.chunk_bytes < 0:
            raise BadBatchError("must be >= 0", field="chunk_bytes")
        dtype = self._dtype(request.dtype)
        chunk = min(request.chunk_bytes or self.default_chunk_bytes, self.default_chunk_bytes)
        started = time.perf_counter()
        server_name = request.server_name or None
        fanout = ReplicaFanout(
            targets,
            self.push_options,
            server_name=server_name,
            channels=await self.push_channels.get(targets, server_name),
        )
        version = self.learner.state.policy_version
        try:
            await fanout.versions()
            if fanout.behind(version):
                sink = PushSink(fanout, asyncio.get_running_loop(), chunk)
                version = await self._run(StreamWeightsCommand(dtype, sink))
            fanout.mark_skipped(version)
        finally:
            await fanout.close()
            for outcome in fanout.outcomes:
                if outcome.error is not None:
                    await self.push_channels.forget(outcome.target, server_name)
        seconds = time.perf_counter() - started
        sent = [o for o in fanout.outcomes if o.bytes]
        nbytes = sent[0].bytes if sent else 0
        if sent:
            self.metrics.weight_push_duration.labels("grpc").observe(seconds)
            logger.info(
                "pushed weights v%d (%.1f MB) to %d/%d replicas in %.2fs",
                version,
                nbytes / 1e6,
                sum(1 for o in fanout.outcomes if o.error is None),
                len(targets),
                seconds,
            )
        return learner_pb2.PushWeightsResponse(
            policy_version=version,
            replicas=[
                learner_pb2.ReplicaPush(
                    target=o.target,
                    weight_version=o.version or 0,
                    error=o.error or "",
                    skipped=o.skipped,
                    bytes=o.bytes,
                    seconds=o.seconds,
                )
                for o in fanout.outcomes
            ],
            bytes=nbytes,
            seconds=seconds,
        )

    async def ExportWeights(
        self, request: learner_pb2.ExportWeightsRequest, context: Any
    ) -> learner_pb2.ExportWeightsResponse:
        target = await _writable_dir(request.path, "path") if request.path else None
        started = time.perf_counter()
        path, nbytes, version = await self._run(ExportCommand(target, self._dtype(request.dtype)))
        self.metrics.weight_push_duration.labels("filesystem").observe(
            time.perf_counter() - started
        )
        return learner_pb2.ExportWeightsResponse(path=path, policy_version=version, bytes=nbytes)

    # ---- nccl transport -------------------------------------------------------------------------

    async def OpenWeightGroup(
        self, request: learner_pb2.OpenWeightGroupRequest, context: Any
    ) -> learner_pb2.OpenWeightGroupResponse:
        if not request.group:
            raise BadBatchError("empty group name", field="group")
        if request.world_size < 2:
            raise BadBatchError(
                "a weight group needs rank 0 and one rollout rank", field="world_size"
            )
        timeout = request.timeout_s or 600.0
        # Rank 0 alone (the other learner ranks are not members of the weight group), on a
        # thread of its own, never the command thread: a member that never arrives costs this
        # group's deadline, while Train, broadcasts and CloseWeightGroup go on.
        backend: str = await _on_own_thread(
            lambda: self.learner.open_weight_group(
                request.group, request.world_size, timeout, request.replica
            ),
            f"open-{request.group}",
        )
        transport = self.learner.spec.weight_transport
        return learner_pb2.OpenWeightGroupResponse(backend=backend, port=transport.port)

    async def BroadcastWeights(
        self, request: learner_pb2.BroadcastWeightsRequest, context: Any
    ) -> learner_pb2.BroadcastWeightsResponse:
        names = tuple(request.groups)
        if not names:
            raise BadBatchError("name at least one weight group", field="groups")
        if not any(self.learner.weight_group(name) for name in names):
            raise WeightGroupError(
                f"none of the weight groups {list(names)} is open on the learner "
                f"(open: {self.learner.weight_group_names() or 'none'})"
            )
        if request.bucket_bytes < 0:
            raise BadBatchError("must be >= 0", field="bucket_bytes")
        transport = self.learner.spec.weight_transport
        default = transport.bucket_mib * _MIB if transport.type == "nccl" else 256 * _MIB
        started = time.perf_counter()
        result = await self._run(
            BroadcastWeightsCommand(
                names, request.bucket_bytes or default, self._dtype(request.dtype)
            )
        )
        seconds = time.perf_counter() - started
        self.metrics.weight_push_duration.labels("nccl").observe(seconds)
        logger.info(
            "broadcast weights v%d (%.1f MB, %d buckets) to %d/%d groups in %.2fs",
            result.manifest.version,
            result.bytes / 1e6,
            result.buckets,
            len(names) - len(result.broken),
            len(names),
            seconds,
        )
        return learner_pb2.BroadcastWeightsResponse(
            policy_version=result.manifest.version,
            bytes=result.bytes,
            buckets=result.buckets,
            seconds=seconds,
            broken=result.broken,
        )

    async def CloseWeightGroup(
        self, request: learner_pb2.CloseWeightGroupRequest, context: Any
    ) -> learner_pb2.CloseWeightGroupResponse:
        if not request.group:
            raise BadBatchError("empty group name", field="group")
        # A group still forming is given up at once (its OpenWeightGroup fails); a formed one
        # is left on the command thread, after any broadcast on it.
        self.learner.close_weight_group(request.group, forming_only=True)
        await self.commands.run(lambda: self.learner.close_weight_group(request.group))
        return learner_pb2.CloseWeightGroupResponse()

    async def Status(
        self, request: learner_pb2.LearnerStatusRequest, context: Any
    ) -> learner_pb2.LearnerStatusResponse:
        learner = self.learner
        return learner_pb2.LearnerStatusResponse(
            service=common_pb2.ServiceInfo(
                component="learner",
                version=__version__,
                hostname=envs.AFLOWRL_POD_NAME,
                uptime_s=time.monotonic() - self._started,
            ),
            model=str(learner.policy.model_dir),
            policy_version=learner.state.policy_version,
            step=learner.state.step,
            world_size=learner.ctx.world_size,
            backend=learner.ctx.backend,
            has_critic=learner.critic,
            has_reference=learner.policy.has_reference,
        )
