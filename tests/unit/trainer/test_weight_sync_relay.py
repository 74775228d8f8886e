"""The gRPC weight relay when a replica's call ends before the learner's stream does.

A learner double streams a manifest, many data chunks and a commit over real loopback gRPC;
rollout doubles take them. One replica fails after its first chunk; one answers as soon as it
reads the commit, as the real rollout does, while the learner's stream has not ended yet. With
one chunk of queue each, the relay must neither wait for them forever nor leave gRPC's request
task waiting for a chunk that never comes, and the healthy replica gets every chunk.
"""

from __future__ import annotations

import asyncio
import gc

import grpc
from grpc import aio

from aflowrl._proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from aflowrl.trainer.weight_sync import GrpcWeightSync

VERSION = 7
CHUNKS = 40


class Learner(learner_pb2_grpc.LearnerServiceServicer):
    async def Status(self, request, context):
        return learner_pb2.LearnerStatusResponse(policy_version=VERSION)

    async def StreamWeights(self, request, context):
        yield common_pb2.WeightChunk(manifest=common_pb2.WeightManifest(version=VERSION))
        for k in range(CHUNKS):
            yield common_pb2.WeightChunk(data=common_pb2.WeightData(offset=k, data=b"x" * 64))
        yield common_pb2.WeightChunk(commit=common_pb2.WeightCommit(version=VERSION))
        await asyncio.sleep(0.3)  # the stream ends a moment after the commit


class Replica(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.received = 0

    async def Status(self, request, context):
        return rollout_pb2.RolloutStatusResponse(weight_version=0)

    async def UpdateWeights(self, request_iterator, context):
        async for chunk in request_iterator:
            self.received += 1
            if self.behaviour == "fails":
                await context.abort(grpc.StatusCode.INTERNAL, "disk full")
            if self.behaviour == "answers on commit" and chunk.HasField("commit"):
                return rollout_pb2.UpdateWeightsResponse(weight_version=VERSION)
            await asyncio.sleep(0.001)  # slower than the learner: the queues fill up
        return rollout_pb2.UpdateWeightsResponse(weight_version=VERSION, bytes=self.received)


async def _serve(add, servicer) -> tuple[aio.Server, str]:
    server = aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_replicas_that_end_early_neither_block_the_push_nor_leak_its_tasks():
    learner, learner_target = await _serve(
        learner_pb2_grpc.add_LearnerServiceServicer_to_server, Learner()
    )
    replicas = [Replica("fails"), Replica("answers on commit"), Replica("takes everything")]
    servers = [
        await _serve(rollout_pb2_grpc.add_RolloutServiceServicer_to_server, r) for r in replicas
    ]
    loop = asyncio.get_running_loop()
    destroyed: list[str] = []  # "Task was destroyed but it is pending!" comes through here
    loop.set_exception_handler(lambda _loop, context: destroyed.append(context["message"]))
    sync = GrpcWeightSync(learner_target, [t for _, t in servers], queue_chunks=1)
    try:
        report = await asyncio.wait_for(sync.push(), timeout=30)
    finally:
        await sync.close()
        for server, _ in [*servers, (learner, "")]:
            await server.stop(None)
    failed, early, healthy = report.replicas
    assert failed.version is None and "disk full" in (failed.error or "")
    assert early.version == VERSION and early.error is None
    assert healthy.version == VERSION and replicas[2].received == CHUNKS + 2
    assert replicas[0].received == 1 and replicas[1].received == CHUNKS + 2
    await asyncio.sleep(0.1)
    pending = [
        t
        for t in asyncio.all_tasks()
        if "_consume_request_iterator" in repr(t.get_coro()) and not t.done()
    ]
    del report, sync
    gc.collect()
    await asyncio.sleep(0.1)
    assert pending == [] and destroyed == []
