"""Pushing the learner's new weights to every rollout replica; the trainer calls it each iteration.

Three transports behind one interface (:class:`WeightSync`, chosen by ``weightTransport.type``):

- ``grpc`` (:class:`GrpcWeightSync`): one ``StreamWeights`` call to the learner is relayed, chunk by
  chunk, into one ``UpdateWeights`` call per replica. Each replica has a bounded queue (a few
  chunks): the relay never holds the model, the stream runs at the pace of the slowest replica,
  and a replica that fails is dropped without stopping the others. If the learner's stream breaks,
  every replica call is cancelled before its commit, so every replica keeps its previous weights.
- ``filesystem`` (:class:`FilesystemWeightSync`): the learner exports a safetensors directory on the
  shared volume (``ExportWeights``), then every replica is told to load it (``LoadWeights``).
- ``nccl`` (:class:`NcclWeightSync`): designed in, not implemented; it fails with a clear error.

Replicas already at (or past) the learner's version are skipped, so a push can be repeated after a
partial failure. This module is torch-free (it only forwards protobuf messages).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from aflowrl._proto.v1 import (
    common_pb2,
    learner_pb2,
    rollout_pb2,
)
from aflowrl.common.client import ChannelOptions, error_from_rpc
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.trainer.clients import LearnerClient, RolloutClient

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_STREAM_WEIGHTS = "/aflowrl.v1.LearnerService/StreamWeights"
_UPDATE_WEIGHTS = "/aflowrl.v1.RolloutService/UpdateWeights"


def _raw(message: bytes) -> bytes:
    """Identity (de)serialiser: relayed chunks stay the bytes they were sent as."""
    return message


NCCL_NOT_IMPLEMENTED = (
    "weightTransport.type='nccl' is designed in but not implemented yet (it needs CUDA GPUs, "
    "NCCL and the vllm engine); use 'grpc' or 'filesystem'"
)


@dataclass(frozen=True)
class ReplicaResult:
    """What one rollout replica did with a push."""

    target: str
    version: int | None
    """The version it serves after the push (None if it could not be asked)."""
    error: str | None = None
    """Why it did not take the new weights; None when it did or was already up to date."""
    skipped: bool = False
    """Already at (or past) the pushed version."""
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class PushReport:
    """The outcome of one push."""

    version: int
    """The learner's policy version that was pushed."""
    replicas: list[ReplicaResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.replicas)

    @property
    def failed(self) -> list[ReplicaResult]:
        return [r for r in self.replicas if r.error is not None]


class WeightSync(abc.ABC):
    """Moves the learner's current weights to the rollout replicas."""

    @abc.abstractmethod
    async def push(self) -> PushReport:
        """Push the learner's current version to every replica that is behind."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release channels (idempotent)."""


class _Replicas:
    """The learner and every rollout replica, through the trainer's clients."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        options: ChannelOptions,
        rollout_server_name: str | None = None,
    ) -> None:
        self.learner = LearnerClient(learner, options=options)
        self.rollout = RolloutClient(
            list(rollouts), options=options, server_name=rollout_server_name
        )
        self.targets = list(rollouts)

    async def versions(self) -> list[int | str]:
        """Each replica's serving version, or the error that prevented asking it."""
        return await self.rollout.versions_or_errors(self.targets)

    async def close(self) -> None:
        await self.learner.close()
        await self.rollout.close()


class GrpcWeightSync(WeightSync):
    """Relay of the learner's weight stream to every replica (module docstring)."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        *,
        chunk_bytes: int = 4 * _MIB,
        dtype: str = "",
        queue_chunks: int = 4,
        options: ChannelOptions | None = None,
        rollout_server_name: str | None = None,
    ) -> None:
        self._replicas = _Replicas(
            learner, rollouts, options or ChannelOptions(timeout_s=600.0), rollout_server_name
        )
        self.chunk_bytes = chunk_bytes
        self.dtype = dtype
        self.queue_chunks = queue_chunks

    async def push(self) -> PushReport:
        started = time.perf_counter()
        replicas = self._replicas
        version = await replicas.learner.version()
        before = await replicas.versions()
        results: dict[int, ReplicaResult] = {}
        todo: list[int] = []
        for i, (target, seen) in enumerate(zip(replicas.targets, before, strict=True)):
            if isinstance(seen, str):
                results[i] = ReplicaResult(target, None, error=seen)
            elif seen >= version:
                results[i] = ReplicaResult(target, seen, skipped=True)
            else:
                todo.append(i)
        if todo:
            results.update(await self._relay(version, todo))
        report = PushReport(
            version,
            [results[i] for i in range(len(replicas.targets))],
            time.perf_counter() - started,
        )
        _log(report, "grpc")
        return report

    async def _relay(self, version: int, todo: list[int]) -> dict[int, ReplicaResult]:
        replicas = self._replicas
        # Chunks are relayed as the serialised bytes they arrive in: no parse, no re-encoding.
        queues: dict[int, asyncio.Queue[bytes | None]] = {
            i: asyncio.Queue(maxsize=self.queue_chunks) for i in todo
        }

        async def chunks(i: int) -> AsyncIterator[bytes]:
            while (message := await queues[i].get()) is not None:
                yield message

        started = time.perf_counter()
        calls = {
            i: replicas.rollout.channel(replicas.targets[i]).stream_unary(
                _UPDATE_WEIGHTS,
                request_serializer=_raw,
                response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
            )(chunks(i))
            for i in todo
        }
        waits = {i: asyncio.ensure_future(_await_call(calls[i])) for i in todo}
        source_error: str | None = None
        stream = replicas.learner.channel.unary_stream(
            _STREAM_WEIGHTS,
            request_serializer=learner_pb2.StreamWeightsRequest.SerializeToString,
            response_deserializer=_raw,
        )(learner_pb2.StreamWeightsRequest(chunk_bytes=self.chunk_bytes, dtype=self.dtype))
        first = True
        try:
            async for message in stream:
                if first:
                    first = False
                    manifest = common_pb2.WeightChunk.FromString(message).manifest
                    if manifest.version != version:
                        logger.info("learner moved on to v%d while pushing", manifest.version)
                alive = [i for i in todo if not waits[i].done()]
                if not alive:
                    break
                await asyncio.gather(*(_put(queues[i], message, waits[i]) for i in alive))
        except aio.AioRpcError as exc:
            source_error = str(error_from_rpc(exc, "learner StreamWeights"))
        finally:
            stream.cancel()  # no-op once finished; stops the learner if every replica failed
        if source_error is not None:
            for call in calls.values():  # never commit a partial update
                call.cancel()
        for i in todo:
            if source_error is None:
                await _put(queues[i], None, waits[i])  # after every chunk: the stream's end
            else:
                _end_now(queues[i])
        results: dict[int, ReplicaResult] = {}
        for i in todo:
            target = replicas.targets[i]
            outcome = await waits[i]
            seconds = time.perf_counter() - started
            if isinstance(outcome, rollout_pb2.UpdateWeightsResponse):
                results[i] = ReplicaResult(
                    target, int(outcome.weight_version), bytes=outcome.bytes, seconds=seconds
                )
            else:
                results[i] = ReplicaResult(
                    target, None, error=source_error or outcome, seconds=seconds
                )
        return results

    async def close(self) -> None:
        await self._replicas.close()


def _end_now(queue: asyncio.Queue[bytes | None]) -> None:
    """Drop what ``queue`` holds and end it (its reader gets None at once)."""
    while not queue.empty():
        queue.get_nowait()
    queue.put_nowait(None)


async def _put(
    queue: asyncio.Queue[bytes | None], item: bytes | None, call: asyncio.Future[Any]
) -> None:
    """Queue ``item`` for a replica's stream, unless its call ends first.

    A call can end while its queue is full (the replica failed, or answered on the commit chunk
    before the stream's end): then nobody reads the queue, so the put would wait forever. The
    queue is ended instead, which also ends the request iterator gRPC's task still waits on.
    """
    if call.done():
        _end_now(queue)
        return
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({put, call}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
    if call.done():
        _end_now(queue)


async def _await_call(
    call: aio.StreamUnaryCall[Any, Any],
) -> rollout_pb2.UpdateWeightsResponse | str:
    """The response, or the error as text (a failed replica does not stop the others)."""
    try:
        response: rollout_pb2.UpdateWeightsResponse = await call
    except asyncio.CancelledError:
        return "cancelled (the learner's stream broke off; previous weights kept)"
    except aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return "cancelled (the learner's stream broke off; previous weights kept)"
        return str(error_from_rpc(exc, "UpdateWeights"))
    return response


class FilesystemWeightSync(WeightSync):
    """Export on the shared volume, then ``LoadWeights`` on every replica."""

    def __init__(
        self,
        learner: str,
        rollouts: Sequence[str],
        *,
        options: ChannelOptions | None = None,
        rollout_server_name: str | None = None,
    ) -> None:
        self._replicas = _Replicas(
            learner, rollouts, options or ChannelOptions(timeout_s=600.0), rollout_server_name
        )

    async def push(self) -> PushReport:
        started = time.perf_counter()
        replicas = self._replicas
        try:
            export = await replicas.learner.stub.ExportWeights(learner_pb2.ExportWeightsRequest())
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, "learner ExportWeights") from exc
        version = int(export.policy_version)
        before = await replicas.versions()

        async def one(i: int) -> ReplicaResult:
            target, seen = replicas.targets[i], before[i]
            if isinstance(seen, str):
                return ReplicaResult(target, None, error=seen)
            if seen >= version:
                return ReplicaResult(target, seen, skipped=True)
            begun = time.perf_counter()
            try:
                reply = await replicas.rollout.stub(target).LoadWeights(
                    rollout_pb2.LoadWeightsRequest(path=export.path, version=version)
                )
            except aio.AioRpcError as exc:
                return ReplicaResult(target, None, error=str(error_from_rpc(exc, "LoadWeights")))
            return ReplicaResult(
                target,
                int(reply.weight_version),
                bytes=reply.bytes,
                seconds=time.perf_counter() - begun,
            )

        results = await asyncio.gather(*(one(i) for i in range(len(replicas.targets))))
        report = PushReport(version, list(results), time.perf_counter() - started)
        _log(report, "filesystem")
        return report

    async def close(self) -> None:
        await self._replicas.close()


class NcclWeightSync(WeightSync):
    """Broadcast over NCCL (GPU clusters): not implemented yet, fails clearly."""

    async def push(self) -> PushReport:
        raise FailedPreconditionError(NCCL_NOT_IMPLEMENTED)

    async def close(self) -> None:
        return None


def wire_dtype(spec: RunSpec) -> str:
    """The dtype the grpc transport sends: "auto" is the rollout's own parameter dtype."""
    transport = spec.weight_transport
    if transport.type == "grpc" and transport.dtype != "auto":
        return transport.dtype
    if spec.policy.dtype != "auto":
        return spec.policy.dtype
    return "bfloat16" if spec.rollout.resources.gpus > 0 else "float32"


def make_weight_sync(
    spec: RunSpec,
    learner: str,
    rollouts: Sequence[str],
    *,
    rollout_server_name: str | None = None,
) -> WeightSync:
    """The :class:`WeightSync` of ``spec.weightTransport`` between ``learner`` and ``rollouts``.

    ``rollouts`` lists every replica (see :func:`aflowrl.trainer.clients.replica_targets` for a
    headless Service); with TLS their certificates are verified against
    ``rollout_server_name`` (that Service's DNS name). Channels carry the run's TLS and token.
    """
    transport = spec.weight_transport
    max_message = spec.grpc.max_message_mib * _MIB
    options = ChannelOptions.from_spec(spec.grpc, timeout_s=600.0)
    if transport.type == "grpc":
        return GrpcWeightSync(
            learner,
            rollouts,
            chunk_bytes=min(transport.chunk_mib * _MIB, max_message - 64 * 1024),
            dtype=wire_dtype(spec),
            options=options,
            rollout_server_name=rollout_server_name,
        )
    if transport.type == "filesystem":
        return FilesystemWeightSync(
            learner, rollouts, options=options, rollout_server_name=rollout_server_name
        )
    return NcclWeightSync()


def _log(report: PushReport, transport: str) -> None:
    for failure in report.failed:
        logger.warning(
            "weights v%d not taken by %s: %s", report.version, failure.target, failure.error
        )
    logger.info(
        "pushed weights v%d over %s to %d/%d replicas in %.2fs",
        report.version,
        transport,
        sum(1 for r in report.replicas if r.error is None),
        len(report.replicas),
        report.seconds,
    )
