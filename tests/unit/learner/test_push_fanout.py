"""The learner's grpc push when a replica's call ends early, or the learner's own stream breaks.

Rollout doubles take the stream over real loopback gRPC; the push is driven as the learner drives
it, from a command thread (``PushSink.stream``) while the event loop runs the calls. One replica
fails after its first chunk; one answers as soon as it reads the commit, as the real rollout
does, while the stream has not ended yet. With one chunk of queue each, the push must neither
wait for them forever nor leave gRPC's request task waiting for a chunk that never comes, and
the healthy replica gets every chunk. When the learner's gather fails midway, no replica sees a
commit.
"""

from __future__ import annotations

import asyncio
import gc

import grpc
import pytest
import torch
from grpc import aio

from aflowrl._proto.v1 import rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions
from aflowrl.learner.push import PushSink, ReplicaChannels, ReplicaFanout
from aflowrl.models import weights

VERSION = 7
TENSORS = 40


class Replica(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, behaviour: str, version: int = 0) -> None:
        self.behaviour = behaviour
        self.version = version
        self.received = 0
        self.commits = 0

    async def Status(self, request, context):
        return rollout_pb2.RolloutStatusResponse(weight_version=self.version)

    async def UpdateWeights(self, request_iterator, context):
        async for chunk in request_iterator:
            self.received += 1
            if self.behaviour == "fails":
                await context.abort(grpc.StatusCode.INTERNAL, "disk full")
            if chunk.HasField("commit"):
                self.commits += 1
                if self.behaviour == "answers on commit":
                    return rollout_pb2.UpdateWeightsResponse(weight_version=VERSION)
            await asyncio.sleep(0.001)  # slower than the learner: the queues fill up
        return rollout_pb2.UpdateWeightsResponse(weight_version=VERSION, bytes=self.received)


async def _serve(servicer) -> tuple[aio.Server, str]:
    server = aio.server()
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _tensors(fail_at: int | None = None):
    tensors = {f"t{i}": torch.full((16,), float(i)) for i in range(TENSORS)}
    manifest = weights.build_manifest(VERSION, tensors)

    def stream():
        for i, tensor in enumerate(tensors.values()):
            if i == fail_at:
                raise RuntimeError("a learner rank died mid-gather")
            yield tensor

    return manifest, stream()


async def _push(replicas, fail_at: int | None = None):
    servers = [await _serve(r) for r in replicas]
    fanout = ReplicaFanout(
        [t for _, t in servers], ChannelOptions(timeout_s=30, max_attempts=1), queue_chunks=1
    )
    error: BaseException | None = None
    try:
        await fanout.versions()
        manifest, tensors = _tensors(fail_at)
        sink = PushSink(fanout, asyncio.get_running_loop(), chunk_bytes=1024)
        try:
            await asyncio.wait_for(asyncio.to_thread(sink.stream, manifest, tensors), 30)
        except RuntimeError as exc:
            error = exc
        fanout.mark_skipped(VERSION)
    finally:
        await fanout.close()
        for server, _ in servers:
            await server.stop(None)
    return fanout.outcomes, error


async def test_replicas_that_end_early_neither_block_the_push_nor_leak_its_tasks():
    loop = asyncio.get_running_loop()
    destroyed: list[str] = []  # "Task was destroyed but it is pending!" comes through here
    loop.set_exception_handler(lambda _loop, context: destroyed.append(context["message"]))
    replicas = [
        Replica("fails"),
        Replica("answers on commit"),
        Replica("takes everything"),
        Replica("takes everything", version=VERSION),
    ]
    outcomes, error = await _push(replicas)
    assert error is None
    failed, early, healthy, current = outcomes
    # The replica's own reason, or gRPC's INTERNAL when the next chunk's write loses the race
    # with its abort (grpc aio then reports "Internal error from Core"): failed either way.
    assert failed.version == 0 and failed.error is not None
    assert "disk full" in failed.error or "INTERNAL" in failed.error, failed.error
    assert early.version == VERSION and early.error is None
    assert healthy.version == VERSION and healthy.error is None
    assert current.skipped and current.error is None and replicas[3].received == 0
    # manifest + the tensors coalesced into 1 KiB chunks (16 tensors of 64 bytes each) + commit
    messages = 2 + -(-TENSORS * 64 // 1024)
    assert replicas[2].received == messages and replicas[2].commits == 1
    assert replicas[0].received == 1 and replicas[1].received == messages
    await asyncio.sleep(0.1)
    pending = [
        t
        for t in asyncio.all_tasks()
        if "_consume_request_iterator" in repr(t.get_coro()) and not t.done()
    ]
    gc.collect()
    await asyncio.sleep(0.1)
    assert pending == [] and destroyed == []


async def test_a_stream_that_breaks_off_commits_nowhere():
    replicas = [Replica("takes everything"), Replica("takes everything")]
    outcomes, error = await _push(replicas, fail_at=TENSORS // 2)
    assert isinstance(error, RuntimeError)
    for replica, outcome in zip(replicas, outcomes, strict=True):
        assert replica.commits == 0
        assert outcome.error is not None and "broke off" in outcome.error


@pytest.mark.parametrize("target", ["nowhere:1"])
async def test_an_unreachable_replica_is_reported_and_nothing_is_sent(target):
    fanout = ReplicaFanout([target], ChannelOptions(timeout_s=5, max_attempts=1))
    try:
        await fanout.versions()
    finally:
        await fanout.close()
    assert fanout.behind(VERSION) == [] and fanout.outcomes[0].error


async def test_channels_outlive_a_push_until_their_replica_fails_or_leaves():
    replicas = [Replica("takes everything"), Replica("takes everything")]
    servers = [await _serve(r) for r in replicas]
    targets = [t for _, t in servers]
    channels = ReplicaChannels(ChannelOptions(timeout_s=30, max_attempts=1))
    try:
        first = await channels.get(targets, None)
        for _ in range(2):  # two pushes
            fanout = ReplicaFanout(targets, channels.options, channels=first, queue_chunks=1)
            await fanout.versions()
            assert fanout.behind(VERSION) == [0, 1]
            await fanout.close()  # not the channels: they belong to ``channels``
        again = await channels.get(targets, None)
        assert again[0] is first[0] and again[1] is first[1]
        assert first[0].get_state() != grpc.ChannelConnectivity.SHUTDOWN
        # A replica that failed is dialled afresh; one no longer pushed to is closed.
        await channels.forget(targets[0], None)
        assert first[0].get_state() == grpc.ChannelConnectivity.SHUTDOWN
        fresh = await channels.get(targets[:1], None)
        assert fresh[0] is not first[0]
        assert first[1].get_state() == grpc.ChannelConnectivity.SHUTDOWN
    finally:
        await channels.close()
        for server, _ in servers:
            await server.stop(None)
