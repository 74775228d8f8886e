"""The grpc transport's sender: learner rank 0 streams its weights straight to every replica.

``PushWeights`` (:mod:`aflowrl.learner.service`) runs a collective command that gathers one
tensor at a time on every rank; rank 0 chunks and encodes each tensor
(:func:`aflowrl.models.wire.encoded_weight_stream`, which hashes every chunk on a thread of its
own while the next is encoded and sent) on the command thread and hands every message to a
:class:`ReplicaFanout` on the event loop, which sends it to one ``UpdateWeights`` call per
replica behind the pushed version. Each replica has a bounded queue (a few chunks): the stream
runs at the pace of the slowest replica, the learner holds a few chunks beyond the tensor being
sent, and a replica that fails is dropped without stopping the others. If the stream breaks off
(a rank fails mid-gather), every call is cancelled before its commit, so every replica keeps its
previous weights.

The channels to the replicas outlive a push (:class:`ReplicaChannels`): every iteration's push
reuses the connections (and, with TLS, the handshakes) of the last one. A replica that failed a
push gets a fresh channel next time, so a restarted replica is dialled at once instead of after
the failed channel's reconnect back-off.

Sending from the learner itself, rather than through a relay in the trainer, spares every byte
one more hop and one more process (``bench/weight_push.py`` measures the push against a raw
socket copy).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import torch
from grpc import aio

from aflowrl._proto.v1 import rollout_pb2
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel
from aflowrl.models import wire
from aflowrl.models.weights import Manifest

logger = logging.getLogger(__name__)

_UPDATE_WEIGHTS = "/aflowrl.v1.RolloutService/UpdateWeights"
_STATUS = "/aflowrl.v1.RolloutService/Status"
INTERRUPTED = "cancelled (the learner's stream broke off; previous weights kept)"


def _raw(message: bytes) -> bytes:
    """Identity serialiser: messages are encoded once, on the command thread."""
    return message


@dataclass
class ReplicaOutcome:
    """What one replica did with a push (``ReplicaPush`` in the proto)."""

    target: str
    version: int | None = None
    """The version it serves after the push (None if it could not be asked)."""
    error: str | None = None
    skipped: bool = False
    bytes: int = 0
    seconds: float = 0.0


class ReplicaChannels:
    """Channels to the rollout replicas, kept from one push to the next (module docstring)."""

    def __init__(self, options: ChannelOptions) -> None:
        self.options = options
        self._open: dict[tuple[str, str | None], aio.Channel] = {}

    async def get(self, targets: Sequence[str], server_name: str | None) -> list[aio.Channel]:
        """A channel per target; channels to targets no longer pushed to are closed."""
        wanted = {(t, server_name) for t in targets}
        for key in [k for k in self._open if k not in wanted]:
            await self._open.pop(key).close()
        for key in wanted:
            if key not in self._open:
                self._open[key] = make_channel(key[0], self.options, server_name=server_name)
        return [self._open[(t, server_name)] for t in targets]

    async def forget(self, target: str, server_name: str | None) -> None:
        """Close ``target``'s channel: the next push dials it afresh."""
        channel = self._open.pop((target, server_name), None)
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        for channel in self._open.values():
            await channel.close()
        self._open.clear()


class ReplicaFanout:
    """One push to several replicas (module docstring). Create, :meth:`open`, send, close."""

    def __init__(
        self,
        targets: Sequence[str],
        options: ChannelOptions,
        *,
        queue_chunks: int = 4,
        server_name: str | None = None,
        channels: Sequence[aio.Channel] | None = None,
    ) -> None:
        """``server_name``: with TLS, the name each replica's certificate is verified against
        (the Service the targets were resolved from). ``channels``: one per target, kept open
        by their owner (:class:`ReplicaChannels`); by default the fanout dials its own and
        closes them in :meth:`close`."""
        self.targets = list(targets)
        self.queue_chunks = queue_chunks
        self.outcomes = [ReplicaOutcome(t) for t in self.targets]
        self._owns_channels = channels is None
        self._channels = (
            [make_channel(t, options, server_name=server_name) for t in self.targets]
            if channels is None
            else list(channels)
        )
        self._queues: dict[int, asyncio.Queue[bytes | None]] = {}
        self._waits: dict[int, asyncio.Future[Any]] = {}
        self._calls: dict[int, Any] = {}
        self._started = 0.0

    async def versions(self) -> None:
        """Ask every replica its serving version; unreachable ones get their error."""

        async def one(i: int) -> None:
            status = self._channels[i].unary_unary(
                _STATUS,
                request_serializer=rollout_pb2.RolloutStatusRequest.SerializeToString,
                response_deserializer=rollout_pb2.RolloutStatusResponse.FromString,
            )
            try:
                reply = await status(rollout_pb2.RolloutStatusRequest(), timeout=30.0)
            except aio.AioRpcError as exc:
                self.outcomes[i].error = str(error_from_rpc(exc, f"Status of {self.targets[i]}"))
                return
            self.outcomes[i].version = int(reply.weight_version)

        await asyncio.gather(*(one(i) for i in range(len(self.targets))))

    def behind(self, version: int) -> list[int]:
        """Replicas that answered :meth:`versions` with a version older than ``version``."""
        return [
            i
            for i, o in enumerate(self.outcomes)
            if o.error is None and o.version is not None and o.version < version
        ]

    def mark_skipped(self, version: int) -> None:
        """Replicas that serve ``version`` or later were skipped (nothing was sent to them)."""
        for i, outcome in enumerate(self.outcomes):
            if outcome.error is None and i not in self._waits and outcome.version is not None:
                outcome.skipped = outcome.version >= version

    async def open(self, todo: Sequence[int], manifest: bytes) -> None:
        """Start one UpdateWeights call per replica in ``todo`` and queue the manifest."""
        self._started = time.perf_counter()
        for i in todo:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=self.queue_chunks)
            self._queues[i] = queue
            call = self._channels[i].stream_unary(
                _UPDATE_WEIGHTS,
                request_serializer=_raw,
                response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
            )(_drain(queue))
            self._calls[i] = call
            self._waits[i] = asyncio.ensure_future(_await_call(call))
        await self.send(manifest)

    @property
    def alive(self) -> bool:
        """Whether any replica still takes messages."""
        return any(not wait.done() for wait in self._waits.values())

    async def send(self, message: bytes) -> None:
        """Queue ``message`` for every replica still taking the stream."""
        alive = [i for i, wait in self._waits.items() if not wait.done()]
        await asyncio.gather(*(_put(self._queues[i], message, self._waits[i]) for i in alive))

    async def finish(self, commit: bytes) -> None:
        """Queue the commit and end every stream, then wait for every answer."""
        for i in self._waits:
            await _put(self._queues[i], commit, self._waits[i])
            await _put(self._queues[i], None, self._waits[i])
        await self._collect(None)

    async def abort(self, reason: str) -> None:
        """Cancel every call before its commit (each replica keeps its weights)."""
        for i, call in self._calls.items():
            call.cancel()
            _end_now(self._queues[i])
        await self._collect(reason)

    async def _collect(self, reason: str | None) -> None:
        for i, wait in self._waits.items():
            answer = await wait
            outcome = self.outcomes[i]
            outcome.seconds = time.perf_counter() - self._started
            if isinstance(answer, rollout_pb2.UpdateWeightsResponse):
                outcome.version = int(answer.weight_version)
                outcome.bytes = int(answer.bytes)
            else:
                outcome.error = reason if reason and answer == INTERRUPTED else answer

    async def close(self) -> None:
        if self._owns_channels:
            for channel in self._channels:
                await channel.close()


class PushSink:
    """Rank 0's end of a push: encodes on the command thread, sends on the event loop.

    :meth:`stream` is called by :meth:`aflowrl.learner.worker.Learner.stream_weights` with the
    tensors as they are gathered; it blocks while the replicas' queues are full (so the learner
    holds a few chunks at most), and returns early once no replica takes the stream any more
    (the command then finishes the gathers of the other ranks without sending).
    """

    def __init__(
        self, fanout: ReplicaFanout, loop: asyncio.AbstractEventLoop, chunk_bytes: int
    ) -> None:
        self.fanout = fanout
        self.loop = loop
        self.chunk_bytes = chunk_bytes

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stream(self, manifest: Manifest, tensors: Iterator[torch.Tensor]) -> None:
        todo = self.fanout.behind(manifest.version)
        if not todo:
            return
        messages = wire.encoded_weight_stream(manifest, tensors, self.chunk_bytes)
        try:
            self._run(self.fanout.open(todo, next(messages)))
            pending = next(messages)
            for message in messages:
                if not self.fanout.alive:
                    self._run(self.fanout.abort("every replica failed"))
                    return
                self._run(self.fanout.send(pending))
                pending = message
            self._run(self.fanout.finish(pending))  # the last message is the commit
        except BaseException as exc:
            self._run(self.fanout.abort(f"the learner's stream broke off: {exc}"))
            raise


async def _drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while (message := await queue.get()) is not None:
        yield message


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


async def _await_call(call: Any) -> rollout_pb2.UpdateWeightsResponse | str:
    """The response, or the error as text (a failed replica does not stop the others)."""
    try:
        response: rollout_pb2.UpdateWeightsResponse = await call
    except asyncio.CancelledError:
        return INTERRUPTED
    except aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:
            return INTERRUPTED
        return str(error_from_rpc(exc, "UpdateWeights"))
    return response
