"""The doors of the rollout and learner services that a caller can push on: fields out of range or
not finite, enums with undefined values, calls made before their precondition, weights that are
well formed but not numbers, checkpoints that are complete but corrupt. Each gets
INVALID_ARGUMENT naming the field, or FAILED_PRECONDITION for what can never succeed, within a
deadline (a hang would fail), and the service goes on serving as before: same weight version,
same policy version, Generate and ComputeLogProbs still answer. Real processes on loopback
(the tiny model), as the local launcher starts them; their logs hold no traceback at the end.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest
import torch
from grpc import aio
from safetensors.torch import load_file

from aflowrl._proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.models import builtin, weights, wire

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, Service, learner_and_rollout

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("doors")
    spec = tmp / "spec.yaml"
    spec.write_text(SPEC + f"trainer: {{checkpointDir: {tmp / 'checkpoints'}}}\n")
    with learner_and_rollout(spec, tmp) as pair:
        yield pair
    for service in pair:
        log = service.log.read_text()
        assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:4000]


def _channel(service: Service) -> aio.Channel:
    return make_channel(service.target, ChannelOptions(max_attempts=1, timeout_s=DEADLINE_S))


async def _status(call: Awaitable[object]) -> tuple[grpc.StatusCode, str]:
    try:
        await asyncio.wait_for(call, DEADLINE_S)
    except aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _chat(text: str) -> common_pb2.Prompt:
    message = common_pb2.ChatMessage(role="user", content=text)
    return common_pb2.Prompt(chat=common_pb2.ChatMessages(messages=[message]))


async def _still_serving(stub: rollout_pb2_grpc.RolloutServiceStub, version: int) -> None:
    status = await stub.Status(rollout_pb2.RolloutStatusRequest())
    assert status.weight_version == version and not status.needs_reload
    reply = await stub.Generate(
        rollout_pb2.GenerateRequest(
            prompts=[_chat("hello")], sampling=rollout_pb2.SamplingParams(max_tokens=4, seed=1)
        )
    )
    assert reply.weight_version == version and reply.results[0].completions


def _base_weights() -> dict[str, torch.Tensor]:
    return load_file(str(builtin.ensure("tiny") / "model.safetensors"))


def _poisoned(value: float) -> dict[str, torch.Tensor]:
    tensors = {name: t.clone() for name, t in _base_weights().items()}
    last = sorted(tensors)[-1]  # the last tensor of the payload: everything before is fine
    tensors[last].view(-1)[-1] = value
    return tensors


async def _stream(messages: list[common_pb2.WeightChunk]) -> AsyncIterator[common_pb2.WeightChunk]:
    for message in messages:
        yield message


# ---------------------------------------------------------------------------------- rollout

JOIN = {
    "master_address": "127.0.0.1",
    "port": 29999,
    "group": "g",
    "rank_offset": 1,
    "world_size": 2,
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": 1e300}, "timeout_s"),
        ({"world_size": 2**31 - 1}, "world_size"),
        ({"rank_offset": 0}, "rank_offset"),
        ({"port": 70000}, "port"),
    ],
    ids=["nan", "inf", "negative", "1e300", "world", "rank0", "port"],
)
async def test_a_join_with_a_field_out_of_range_is_invalid_argument_naming_it(
    services, change, field
):
    _, rollout = services
    async with _channel(rollout) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        version = (await stub.Status(rollout_pb2.RolloutStatusRequest())).weight_version
        request = rollout_pb2.JoinWeightGroupRequest(**{**JOIN, **change})
        code, details = await _status(stub.JoinWeightGroup(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, details
        await _still_serving(stub, version)


async def test_a_weight_call_before_any_group_leaves_the_replica_serving(services):
    _, rollout = services
    async with _channel(rollout) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        version = (await stub.Status(rollout_pb2.RolloutStatusRequest())).weight_version
        for group in ("", "never-joined"):
            request = rollout_pb2.ReceiveWeightsRequest(group=group, version=version + 1)
            code, details = await _status(stub.ReceiveWeights(request))
            assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
            assert "JoinWeightGroup" in details
        leave = rollout_pb2.LeaveWeightGroupRequest(group="never-joined")
        assert (await _status(stub.LeaveWeightGroup(leave)))[0] == grpc.StatusCode.OK
        await _still_serving(stub, version)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
async def test_a_push_of_non_finite_weights_is_refused_and_the_old_ones_serve(services, value):
    _, rollout = services
    async with _channel(rollout) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        version = (await stub.Status(rollout_pb2.RolloutStatusRequest())).weight_version
        tensors = _poisoned(value)
        manifest = weights.build_manifest(version + 1, tensors)
        messages = list(wire.weight_stream(manifest, tensors, chunk_bytes=64 * 1024))
        code, details = await _status(stub.UpdateWeights(_stream(messages)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in details, details
        await _still_serving(stub, version)


async def test_a_directory_of_non_finite_weights_is_refused_before_loading(services, tmp_path):
    _, rollout = services
    async with _channel(rollout) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        version = (await stub.Status(rollout_pb2.RolloutStatusRequest())).weight_version
        directory = tmp_path / "poisoned"
        weights.write_weights_dir(directory, _poisoned(math.nan).items(), version=version + 1)
        request = rollout_pb2.LoadWeightsRequest(path=str(directory), version=version + 1)
        code, details = await _status(stub.LoadWeights(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in details, details
        await _still_serving(stub, version)


# ---------------------------------------------------------------------------------- learner


def _sample() -> learner_pb2.TrainSample:
    return learner_pb2.TrainSample(
        sequence=learner_pb2.Sequence(prompt_token_ids=[5, 6, 7], response_token_ids=[8, 9]),
        old_logprobs=[-7.0, -7.1],
        advantages=[0.5, 0.5],
    )


def _choice(**fields: object) -> learner_pb2.TrainSample:
    choice = learner_pb2.ChoiceDecision(
        prompt_token_ids=[5, 6, 7],
        candidate_token_ids=[common_pb2.TokenIds(ids=[8, 9]), common_pb2.TokenIds(ids=[10])],
        chosen=0,
    )
    return learner_pb2.TrainSample(choice=choice, old_logprobs=[-0.7], advantages=[0.8], **fields)


async def _policy_version(stub: learner_pb2_grpc.LearnerServiceStub) -> int:
    return int((await stub.Status(learner_pb2.LearnerStatusRequest())).policy_version)


LEARNER_REFUSALS = [
    ("Train", learner_pb2.TrainRequest(samples=[_sample()], objective=7), "objective"),
    ("Train", learner_pb2.TrainRequest(samples=[_sample()], iteration=2**64 - 1), "iteration"),
    (
        "Train",
        learner_pb2.TrainRequest(samples=[_choice(candidate_old_logprobs=[-0.5, math.nan])]),
        "samples[0].candidate_old_logprobs[1]",
    ),
    (
        "Train",
        learner_pb2.TrainRequest(samples=[_choice(candidate_advantages=[0.1])]),
        "samples[0].candidate_advantages",
    ),
    (
        "Train",
        learner_pb2.TrainRequest(
            samples=[
                learner_pb2.TrainSample(
                    sequence=_sample().sequence,
                    old_logprobs=[-7.0, -7.1],
                    advantages=[0.5, 0.5],
                    candidate_advantages=[1.0],
                )
            ]
        ),
        "samples[0].candidate_advantages",
    ),
    (
        "OpenWeightGroup",
        learner_pb2.OpenWeightGroupRequest(group="g", world_size=2**31 - 1),
        "world_size",
    ),
    (
        "OpenWeightGroup",
        learner_pb2.OpenWeightGroupRequest(group="g", world_size=2, timeout_s=math.inf),
        "timeout_s",
    ),
    (
        "OpenWeightGroup",
        learner_pb2.OpenWeightGroupRequest(group="g", world_size=2, timeout_s=-5),
        "timeout_s",
    ),
    (
        "PushWeights",
        learner_pb2.PushWeightsRequest(targets=["127.0.0.1:1"], chunk_bytes=1),
        "chunk_bytes",
    ),
    (
        "BroadcastWeights",
        learner_pb2.BroadcastWeightsRequest(groups=["g"], bucket_bytes=1),
        "bucket_bytes",
    ),
    (
        "LoadCheckpoint",
        learner_pb2.LoadCheckpointRequest(path="/tmp/x", min_policy_version=2**64 - 1),
        "min_policy_version",
    ),
]


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    LEARNER_REFUSALS,
    ids=[f"{m}-{f}" for m, _, f in LEARNER_REFUSALS],
)
async def test_a_learner_field_out_of_range_is_invalid_argument_and_nothing_trains(
    services, method, request_, field
):
    learner, _ = services
    async with _channel(learner) as channel:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        before = await _policy_version(stub)
        code, details = await _status(getattr(stub, method)(request_))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, (code, details)
        assert await _policy_version(stub) == before


async def test_permanent_conditions_are_failed_precondition_not_unavailable(services):
    learner, _ = services
    async with _channel(learner) as channel:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        # The run's transport is grpc: a weight group can never be opened on it.
        code, details = await _status(
            stub.OpenWeightGroup(learner_pb2.OpenWeightGroupRequest(group="g", world_size=2))
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        code, details = await _status(
            stub.BroadcastWeights(learner_pb2.BroadcastWeightsRequest(groups=["g"]))
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)


def _truncate_a_shard(path: Path) -> None:
    shard = next((path / "dcp").glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])


def _remove_the_metadata(path: Path) -> None:
    (path / "dcp" / ".metadata").unlink()


def _garble_the_metadata(path: Path) -> None:
    (path / "dcp" / ".metadata").write_bytes(b"\x80\x04not a pickle")


def _garble_the_state(path: Path) -> None:
    (path / "learner_state.json").write_text("[1, 2")


def _remove_a_shard(path: Path) -> None:
    next((path / "dcp").glob("*.distcp")).unlink()


@pytest.mark.parametrize(
    "corrupt",
    [
        _truncate_a_shard,
        _remove_the_metadata,
        _garble_the_metadata,
        _garble_the_state,
        _remove_a_shard,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
async def test_a_corrupt_checkpoint_is_refused_at_once_and_the_learner_goes_on(
    services, tmp_path, corrupt
):
    learner, _ = services
    async with _channel(learner) as channel:
        stub = learner_pb2_grpc.LearnerServiceStub(channel)
        path = tmp_path / "checkpoint"
        saved = await stub.SaveCheckpoint(learner_pb2.SaveCheckpointRequest(path=str(path)))
        corrupt(path)
        code, details = await _status(
            stub.LoadCheckpoint(learner_pb2.LoadCheckpointRequest(path=str(path)))
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "path" in details, (code, details)
        assert "corrupt" in details
        assert await _policy_version(stub) == saved.policy_version
        reply = await stub.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=[_sample().sequence])
        )
        assert all(math.isfinite(v) for v in reply.logprobs[0].values)
