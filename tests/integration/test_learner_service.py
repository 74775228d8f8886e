"""The learner and rollout services as real processes: log-prob agreement, train, push, resume.

Done-when of issue 7: rollout (hf, fp32 CPU) and learner log-probs agree to 1e-4 on sampled
sequences; after Train and a push the rollout generates with the new version and its log-probs
match the learner's recomputation; a killed learner resumes from its checkpoint to the same next
loss as an uninterrupted run; the filesystem transport moves the same weights.
"""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

import grpc
import pytest
from grpc import aio

from aflowrl._proto.v1 import (
    common_pb2,
    learner_pb2,
    learner_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.trainer import weight_sync

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, Service, learner_and_rollout, metrics_text, start_service

TOL = 1e-4


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("services")
    spec = tmp / "spec.yaml"
    spec.write_text(SPEC + f"trainer: {{checkpointDir: {tmp / 'checkpoints'}}}\n")
    with learner_and_rollout(spec, tmp) as pair:
        yield pair


def _stubs(learner: Service, rollout: Service):
    options = ChannelOptions(max_attempts=1, timeout_s=120)
    lc, rc = make_channel(learner.target, options), make_channel(rollout.target, options)
    return (
        (lc, rc),
        learner_pb2_grpc.LearnerServiceStub(lc),
        rollout_pb2_grpc.RolloutServiceStub(rc),
    )


def _chat(text: str) -> common_pb2.Prompt:
    return common_pb2.Prompt(
        chat=common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content=text)])
    )


async def _sample(
    rollout, seed: int
) -> tuple[rollout_pb2.GenerateResponse, list[learner_pb2.Sequence]]:
    reply = await rollout.Generate(
        rollout_pb2.GenerateRequest(
            prompts=[_chat(f"improve workflow {i}") for i in range(3)],
            sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=20, n=2, seed=seed),
        )
    )
    sequences = [
        learner_pb2.Sequence(prompt_token_ids=r.prompt_token_ids, response_token_ids=c.token_ids)
        for r in reply.results
        for c in r.completions
    ]
    return reply, sequences


def _signed_samples(
    sequences: list[learner_pb2.Sequence],
    scored: learner_pb2.ComputeLogProbsResponse,
    negative: float = -1.0,
) -> list[learner_pb2.TrainSample]:
    """Training rows of ``sequences`` at their scored log-probs, advantages alternating
    ``negative`` and +1 (so one update moves the policy both ways)."""
    return [
        learner_pb2.TrainSample(
            sequence=seq,
            old_logprobs=lp.values,
            advantages=[1.0 if i % 2 else negative] * len(lp.values),
        )
        for i, (seq, lp) in enumerate(zip(sequences, scored.logprobs, strict=False))
    ]


def _max_gap(
    reply: rollout_pb2.GenerateResponse, scored: learner_pb2.ComputeLogProbsResponse
) -> float:
    rollout_lps = [list(c.logprobs) for r in reply.results for c in r.completions]
    learner_lps = [list(x.values) for x in scored.logprobs]
    assert [len(x) for x in rollout_lps] == [len(x) for x in learner_lps]
    return max(
        abs(a - b)
        for xs, ys in zip(rollout_lps, learner_lps, strict=False)
        for a, b in zip(xs, ys, strict=False)
    )


async def agrees(learner, rollout, seed: int, version: int) -> None:
    """The rollout serves ``version`` and its log-probs are the learner's (same version) within
    ``TOL``, on completions sampled with ``seed``."""
    reply, sequences = await _sample(rollout, seed=seed)
    assert reply.weight_version == version
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert scored.policy_version == version
    assert _max_gap(reply, scored) < TOL


async def test_logprobs_agree_before_and_after_train_and_push(services):
    learner_service, rollout_service = services
    channels, learner, rollout = _stubs(learner_service, rollout_service)
    reply, sequences = await _sample(rollout, seed=1)
    assert reply.weight_version == 0
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert scored.policy_version == 0
    assert _max_gap(reply, scored) < TOL

    # Choice mode: the learner's log pi(chosen) is the softmax over the rollout's candidate sums.
    candidates = ["<action>remove review</action>", "<action>add Format after ensemble</action>"]
    scores = await rollout.ScoreCandidates(
        rollout_pb2.ScoreCandidatesRequest(
            items=[rollout_pb2.CandidateSet(prompt=_chat("choose"), candidates=candidates)]
        )
    )
    item = scores.items[0]
    choice = learner_pb2.ChoiceDecision(
        prompt_token_ids=item.prompt_token_ids,
        candidate_token_ids=item.candidate_token_ids,
        chosen=1,
    )
    chosen = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(choices=[choice]))
    import math

    sums = [sum(c.values) for c in item.candidate_logprobs]
    expected = sums[1] - math.log(sum(math.exp(s) for s in sums))
    assert abs(chosen.logprobs[0].values[0] - expected) < TOL

    # Train on the sampled rows (and the choice), push over gRPC, sample again.
    samples = _signed_samples(sequences, scored, negative=-0.5)
    samples.append(
        learner_pb2.TrainSample(
            choice=choice, old_logprobs=[chosen.logprobs[0].values[0]], advantages=[1.0]
        )
    )
    trained = await learner.Train(learner_pb2.TrainRequest(samples=samples, iteration=0))
    assert trained.policy_version == 1
    metrics = dict(trained.metrics.values)
    for name in (
        "losses/policy",
        "losses/kl",
        "charts/clipfrac",
        "charts/approx_kl",
        "losses/entropy",
    ):
        assert math.isfinite(metrics[name]), name
    assert metrics["charts/grad_norm"] > 0 and metrics["perf/tokens_per_s"] > 0
    exported = metrics_text(learner_service)
    assert "aflowrl_learner_policy_version 1.0" in exported
    assert "aflowrl_learner_train_step_duration_seconds_count 1.0" in exported

    sync = weight_sync.GrpcWeightSync(
        learner_service.target, [rollout_service.target], chunk_bytes=65536
    )
    report = await sync.push()
    assert report.ok and report.version == 1 and report.replicas[0].version == 1
    again = await sync.push()  # idempotent: the replica is up to date
    assert again.ok and again.replicas[0].skipped
    await sync.close()

    reply, sequences = await _sample(rollout, seed=2)
    assert reply.weight_version == 1
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert scored.policy_version == 1
    assert _max_gap(reply, scored) < TOL
    reference = await learner.ComputeLogProbs(
        learner_pb2.ComputeLogProbsRequest(sequences=sequences, reference=True)
    )
    assert reference.policy_version == 0
    assert _max_gap(reply, reference) > 1e-3  # the weights did change

    with pytest.raises(aio.AioRpcError) as info:
        await learner.Train(
            learner_pb2.TrainRequest(
                samples=[
                    learner_pb2.TrainSample(
                        sequence=sequences[0], old_logprobs=[0.0], advantages=[1.0]
                    )
                ]
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "samples[0].old_logprobs" in info.value.details()
    for channel in channels:
        await channel.close()


async def test_filesystem_transport(services):
    learner_service, rollout_service = services
    channels, learner, rollout = _stubs(learner_service, rollout_service)
    reply, sequences = await _sample(rollout, seed=3)
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    samples = [
        learner_pb2.TrainSample(
            sequence=s, old_logprobs=lp.values, advantages=[0.5] * len(lp.values)
        )
        for s, lp in zip(sequences, scored.logprobs, strict=False)
    ]
    trained = await learner.Train(learner_pb2.TrainRequest(samples=samples, iteration=1))
    sync = weight_sync.FilesystemWeightSync(learner_service.target, [rollout_service.target])
    report = await sync.push()
    await sync.close()
    assert report.ok and report.replicas[0].version == trained.policy_version
    reply, sequences = await _sample(rollout, seed=4)
    assert reply.weight_version == trained.policy_version
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert _max_gap(reply, scored) < TOL
    for channel in channels:
        await channel.close()


def _batch() -> list[learner_pb2.TrainSample]:
    """Eight fixed rows of uneven lengths (and a choice), with made-up behaviour log-probs."""
    rows = []
    for i in range(7):
        prompt = [(7 * i + k) % 300 + 3 for k in range(4 + i)]
        response = [(11 * i + 3 * k) % 400 + 5 for k in range(3 + 2 * i)]
        rows.append(
            learner_pb2.TrainSample(
                sequence=learner_pb2.Sequence(prompt_token_ids=prompt, response_token_ids=response),
                old_logprobs=[-7.2 + 0.01 * k for k in range(len(response))],
                advantages=[(-1.0) ** i * (0.5 + 0.1 * i)] * len(response),
            )
        )
    choice = learner_pb2.ChoiceDecision(
        prompt_token_ids=[5, 6, 7],
        candidate_token_ids=[common_pb2.TokenIds(ids=[8, 9]), common_pb2.TokenIds(ids=[10])],
        chosen=0,
    )
    rows.append(learner_pb2.TrainSample(choice=choice, old_logprobs=[-0.7], advantages=[0.8]))
    return rows


async def _train_steps(learner, first: int, last: int) -> list[dict[str, float]]:
    out = []
    for iteration in range(first, last):
        reply = await learner.Train(learner_pb2.TrainRequest(samples=_batch(), iteration=iteration))
        out.append(dict(reply.metrics.values))
    return out


LOSSES = ("losses/total", "losses/policy", "losses/kl", "losses/entropy")


async def test_killed_learner_resumes_to_the_same_next_loss(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    first = start_service("learner", spec, tmp_path, name="learner-1")
    options = ChannelOptions(max_attempts=1, timeout_s=120)
    try:
        channel = make_channel(first.target, options)
        learner = learner_pb2_grpc.LearnerServiceStub(channel)
        await _train_steps(learner, 0, 2)
        saved = await learner.SaveCheckpoint(
            learner_pb2.SaveCheckpointRequest(path=str(tmp_path / "ckpt"), client_state=b"trainer")
        )
        assert saved.policy_version == 2 and saved.step == 4
        uninterrupted = await _train_steps(learner, 2, 4)
        await channel.close()
    finally:
        first.stop(signal.SIGKILL)

    second = start_service("learner", spec, tmp_path, name="learner-2")
    try:
        channel = make_channel(second.target, options)
        learner = learner_pb2_grpc.LearnerServiceStub(channel)
        with pytest.raises(aio.AioRpcError) as info:
            await learner.LoadCheckpoint(
                learner_pb2.LoadCheckpointRequest(path=str(tmp_path / "nope"))
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        loaded = await learner.LoadCheckpoint(
            learner_pb2.LoadCheckpointRequest(path=str(tmp_path / "ckpt"))
        )
        assert (loaded.policy_version, loaded.step, loaded.client_state) == (2, 4, b"trainer")
        resumed = await _train_steps(learner, 2, 4)
        status = await learner.Status(learner_pb2.LearnerStatusRequest())
        assert status.policy_version == 4 and status.step == 8 and status.world_size == 1
        # A resumed trainer lifts the version above what rollout replicas served since.
        bumped = await learner.LoadCheckpoint(
            learner_pb2.LoadCheckpointRequest(path=str(tmp_path / "ckpt"), min_policy_version=9)
        )
        assert (bumped.policy_version, bumped.step) == (9, 4)
        await channel.close()
    finally:
        assert second.stop() == 0
    for expected, got in zip(uninterrupted, resumed, strict=False):
        for name in LOSSES:
            assert got[name] == pytest.approx(expected[name], abs=1e-6), name


async def test_lora_learner_pushes_adapters_alone_and_exports_merged_weights(tmp_path):
    """LoRA + value head + gradient checkpointing: values, training; a push carries the adapters
    alone to an hf rollout running the same peft adapters, whose log-probs then match the
    learner's; an explicit export is the full model with the adapters merged."""
    import torch

    from aflowrl.models import builtin, loading, logprobs, weights

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "policy: {dtype: float32, lora: {rank: 4, alpha: 8}}\n"
        "learner:\n"
        "  algorithm: {type: ppo}\n"
        "  fsdp: {gradientCheckpointing: true, mixedPrecision: none}\n"
        "  loss: {miniBatchSize: 4, microBatchSize: 2, klCoef: 0.01}\n"
        "  optimizer: {lr: 0.01}\n"
    )
    service = start_service("learner", spec, tmp_path, name="lora-learner")
    try:
        rollout_service = start_service("rollout", spec, tmp_path, name="lora-rollout")
    except BaseException:
        service.stop()
        raise
    merged = tmp_path / "merged"
    try:
        channels, learner, rollout = _stubs(service, rollout_service)
        status = await learner.Status(learner_pb2.LearnerStatusRequest())
        assert status.has_critic and status.has_reference
        sequences = [s.sequence for s in _batch() if s.HasField("sequence")][:4]
        scored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences, values=True, entropies=True)
        )
        assert [len(v.values) for v in scored.values] == [
            len(s.response_token_ids) for s in sequences
        ]
        samples = [
            learner_pb2.TrainSample(
                sequence=s,
                old_logprobs=lp.values,
                advantages=[1.0] * len(lp.values),
                returns=[0.5] * len(lp.values),
                old_values=v.values,
            )
            for s, lp, v in zip(sequences, scored.logprobs, scored.values, strict=False)
        ]
        for iteration in range(2):
            reply = await learner.Train(
                learner_pb2.TrainRequest(samples=samples, iteration=iteration)
            )
        assert dict(reply.metrics.values)["losses/value"] > 0
        after = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences)
        )
        reference = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences, reference=True)
        )
        assert (
            max(
                abs(a - b)
                for x, y in zip(scored.logprobs, reference.logprobs, strict=False)
                for a, b in zip(x.values, y.values, strict=False)
            )
            < 1e-5
        )  # the reference is the base model (adapters off)

        sync = weight_sync.GrpcWeightSync(service.target, [rollout_service.target])
        report = await sync.push()
        await sync.close()
        assert report.ok and report.replicas[0].version == 2
        model_bytes = 4 * sum(
            math.prod(shape)
            for shape in weights.shapes_from_config(builtin.ensure("tiny")).values()
        )
        assert 0 < report.replicas[0].bytes < model_bytes / 4  # the adapters, not the model
        reply, pushed = await _sample(rollout, seed=5)
        assert reply.weight_version == 2
        rescored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=pushed)
        )
        assert _max_gap(reply, rescored) < TOL

        export = await learner.ExportWeights(learner_pb2.ExportWeightsRequest(path=str(merged)))
        assert export.policy_version == 2 and export.path == str(merged)
        for channel in channels:
            await channel.close()
    finally:
        assert rollout_service.stop() == 0
        assert service.stop() == 0
    assert (merged / "model.safetensors").is_file() and not (
        merged / "adapter_config.json"
    ).exists()
    model = loading.load_causal_lm(merged, dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        packed = logprobs.pack_sequences(
            [list(s.prompt_token_ids) for s in sequences],
            [list(s.response_token_ids) for s in sequences],
            pad_id=0,
        )
        local = logprobs.tempered_logprobs(
            logprobs.selected_hidden_logits(model, packed), packed.targets, 1.0
        ).tolist()
    remote = [x for lp in after.logprobs for x in lp.values]
    assert max(abs(a - b) for a, b in zip(local, remote, strict=False)) < TOL
