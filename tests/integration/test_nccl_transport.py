"""The nccl weight transport on gloo: two learner ranks, two rollout replicas, real processes.

The same code a GPU cluster runs with NCCL (:mod:`aflowrl.models.broadcast`), on CPUs:

1. A push forms one weight group per replica (learner rank 0 + that replica's worker) and
   broadcasts the weights to both groups at once in buckets of 1 MiB (a ~14 MB model: many
   buckets; both learner ranks gather); both replicas then sample with log-probs equal to the
   learner's.
2. A replica killed mid-broadcast costs that replica only: replica B is frozen (SIGSTOP) after
   it answered the push's status check, so its group's broadcast cannot complete; once replica A
   is inside the broadcast (its weight update running, requests held at its gate), B is killed
   (SIGKILL). The learner aborts B's group and goes on with A's: A receives the whole version
   over its own group (no fallback reload), a Generate sent to A mid-broadcast is served by the
   new version, and B is reported failed; both learner ranks finish their gathers.
3. The learner's next iteration proceeds: it trains, and the next push reuses A's group (same
   group, no new rendezvous) while B, unreachable, is reported failed.
4. B is restarted at the same address (as a restarted container is) with a new incarnation: the
   next push forms a new group for B alone, A's group is reused, and both take the version by
   broadcast.
5. A replica that still answers but whose group broke (its engine left the group) is reloaded
   from the fallback export; the other keeps its group and takes the version by broadcast.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import grpc
import pytest
import torch
import yaml

from aflowrl._proto.v1 import learner_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.trainer import weight_sync

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import (
    SPEC,
    build_model,
    metrics_text,
    nccl_transport,
    start_service,
)
from test_learner_service import _chat, _sample, _stubs, agrees

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="two NCCL ranks need two GPUs (hide the GPU, CUDA_VISIBLE_DEVICES='', to use gloo)",
)


def _metric(service, pattern: str) -> float:
    match = re.search(r"^" + pattern + r" (\S+)$", metrics_text(service), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _buckets(service) -> float:
    return _metric(service, r'aflowrl_rollout_weight_update_buckets_total\{transport="nccl"\}')


def _receiving(service) -> bool:
    return _metric(service, "aflowrl_rollout_weight_updates_running_requests") > 0


async def _train(learner, rollout, iteration: int) -> int:
    _, sequences = await _sample(rollout, seed=100 + iteration)
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    samples = [
        learner_pb2.TrainSample(
            sequence=s, old_logprobs=lp.values, advantages=[0.5 - i % 2] * len(lp.values)
        )
        for i, (s, lp) in enumerate(zip(sequences, scored.logprobs, strict=True))
    ]
    trained = await learner.Train(learner_pb2.TrainRequest(samples=samples, iteration=iteration))
    return int(trained.policy_version)


async def _wait_for(condition, what: str) -> None:
    """Poll ``condition`` (an event the services report), failing after two minutes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120.0
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_one_group_per_replica_and_a_replica_killed_midway_costs_only_itself(tmp_path):
    model = tmp_path / "model"
    nbytes = build_model(model, hidden=256, layers=4)
    spec_text = SPEC.replace(
        "policy: {dtype: float32}", f"policy: {{model: {model}, dtype: float32}}"
    ) + nccl_transport(tmp_path, timeout_s=60)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec_text)
    spec = RunSpec.from_document(yaml.safe_load(spec_text))
    learner_service = start_service("learner", spec_file, tmp_path, ranks=2, timeout=300)
    replicas = []
    try:
        for name in ("rollout-a", "rollout-b"):
            replicas.append(start_service("rollout", spec_file, tmp_path, name=name, timeout=300))
        a, b = replicas
        channels, learner, rollout_a = _stubs(learner_service, a)
        more, _, rollout_b = _stubs(learner_service, b)
        sync = weight_sync.make_weight_sync(spec, learner_service.target, [a.target, b.target])
        assert isinstance(sync, weight_sync.NcclWeightSync)

        # 1. Buckets: both replicas get version 1 by one broadcast of many 1 MiB buckets.
        version = await _train(learner, rollout_a, 0)
        report = await sync.push()
        assert report.ok and [r.version for r in report.replicas] == [version, version]
        assert not any(r.fallback for r in report.replicas)
        buckets = _buckets(a)
        assert buckets == _buckets(b) >= nbytes // (1024 * 1024)
        log = learner_service.log.read_text()
        assert f"broadcast weights v{version}" in log and f"{int(buckets)} buckets" in log
        await agrees(learner, rollout_a, 11, version)
        await agrees(learner, rollout_b, 12, version)
        again = await sync.push()  # nothing new: no broadcast
        assert again.ok and all(r.skipped for r in again.replicas) and _buckets(a) == buckets

        # 2. B frozen after the status check, killed once A is inside the broadcast.
        groups = {i: g.name for i, g in sync._groups.items()}
        assert sorted(groups) == [0, 1] and groups[0] != groups[1]
        version = await _train(learner, rollout_a, 1)
        statuses = sync._replicas.statuses

        async def freeze_b_after_statuses():
            answers = await statuses()
            os.killpg(b.process.pid, signal.SIGSTOP)
            return answers

        sync._replicas.statuses = freeze_b_after_statuses
        push = asyncio.ensure_future(sync.push())
        await _wait_for(lambda: _receiving(a), "replica A inside the broadcast")
        during = asyncio.ensure_future(
            rollout_a.Generate(
                rollout_pb2.GenerateRequest(
                    prompts=[_chat("mid-broadcast")],
                    sampling=rollout_pb2.SamplingParams(temperature=0.0, max_tokens=8),
                )
            )
        )
        b.stop(signal.SIGKILL)
        report = await asyncio.wait_for(push, 300)
        sync._replicas.statuses = statuses
        result_a, result_b = report.replicas
        assert result_a.error is None and not result_a.fallback and result_a.version == version
        assert result_b.error is not None and result_b.version is None
        assert _buckets(a) >= 2 * buckets  # the whole version again, over A's own group
        served = await during  # held at A's gate, then served by the new version
        assert served.weight_version == version
        assert sync._groups[0].name == groups[0] and 1 not in sync._groups
        log = learner_service.log.read_text()
        assert f"broadcast weights v{version}" in log and "to 1/2 groups" in log
        status = await rollout_a.Status(rollout_pb2.RolloutStatusRequest())
        assert not status.needs_reload and status.weight_version == version
        await agrees(learner, rollout_a, 13, version)

        # 3. The next iteration: train, push; A's group is reused, B is unreachable.
        version = await _train(learner, rollout_a, 2)
        before = _buckets(a)
        report = await sync.push()
        result_a, result_b = report.replicas
        assert result_a.error is None and not result_a.fallback and result_a.version == version
        assert result_b.error is not None
        assert _buckets(a) > before and sync._groups[0].name == groups[0]
        await agrees(learner, rollout_a, 14, version)

        # 4. B restarted at the same address: a new incarnation, a new group for B alone.
        replicas[1] = b = start_service(
            "rollout", spec_file, tmp_path, name="rollout-b2", timeout=300, port=b.port
        )
        version = await _train(learner, rollout_a, 3)
        report = await sync.push()
        assert report.ok and [r.version for r in report.replicas] == [version, version]
        assert not any(r.fallback for r in report.replicas)
        assert sync._groups[0].name == groups[0]  # A's group untouched
        assert sync._groups[1].name != groups[1]  # B's formed anew
        assert _buckets(b) > 0
        await agrees(learner, rollout_a, 15, version)
        await agrees(learner, rollout_b, 16, version)

        # 5. A's engine left its group behind the trainer's back: the learner finds the group
        # broken, A alone is reloaded from the fallback export, B takes it over its own group.
        await rollout_a.LeaveWeightGroup(
            rollout_pb2.LeaveWeightGroupRequest(group=sync._groups[0].name)
        )
        b_group = sync._groups[1].name
        version = await _train(learner, rollout_a, 4)
        report = await sync.push()
        result_a, result_b = report.replicas
        assert result_a.error is None and result_a.fallback and result_a.version == version
        assert result_b.error is None and not result_b.fallback and result_b.version == version
        assert sync._groups[1].name == b_group and 0 not in sync._groups
        await agrees(learner, rollout_a, 17, version)
        await agrees(learner, rollout_b, 18, version)
        await sync.close()
        for channel in (*channels, *more):
            await channel.close()
    finally:
        for service in reversed(replicas):
            service.stop(signal.SIGKILL)
        learner_service.stop()
    assert "Exception in thread" not in learner_service.log.read_text()


async def test_a_member_that_never_arrives_costs_its_group_its_deadline_while_the_learner_goes_on(
    tmp_path,
):
    """OpenWeightGroup for a replica whose engine never joins (its group's deadline 60 s), on
    a two-rank learner: while it waits, a Train (a collective of both ranks) runs, another
    replica's group forms with a member that arrives late, and CloseWeightGroup closes it; the
    lonely group then fails UNAVAILABLE at its own deadline, not the process group's (wait_s +
    BACKEND_SLACK_S)."""
    import threading
    import time

    from policy_services import free_port

    from aflowrl.models import broadcast

    model = tmp_path / "model"
    build_model(model, hidden=64, layers=2)
    port = free_port()
    spec_text = SPEC.replace(
        "policy: {dtype: float32}", f"policy: {{model: {model}, dtype: float32}}"
    ) + nccl_transport(tmp_path, timeout_s=60, port=port)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec_text)
    learner_service = start_service("learner", spec_file, tmp_path, ranks=2, timeout=300)
    rollout = start_service("rollout", spec_file, tmp_path, timeout=300)
    try:
        channels, learner, rollout_stub = _stubs(learner_service, rollout)
        order: list[str] = []
        began = time.monotonic()
        lonely = asyncio.ensure_future(
            learner.OpenWeightGroup(
                learner_pb2.OpenWeightGroupRequest(
                    group="lonely", world_size=2, timeout_s=60, replica="gone"
                )
            )
        )
        lonely.add_done_callback(lambda _: order.append("lonely ended"))
        await asyncio.sleep(0.5)  # the lonely group is forming

        await _train(learner, rollout_stub, 0)
        order.append("trained")

        late = asyncio.ensure_future(
            learner.OpenWeightGroup(
                learner_pb2.OpenWeightGroupRequest(
                    group="late", world_size=2, timeout_s=60, replica="here"
                )
            )
        )
        await asyncio.sleep(1.0)  # rank 0 waits a while for its member
        member: list[object] = []

        def arrive() -> None:
            rendezvous = broadcast.Rendezvous("127.0.0.1", port, "late", 1, 2, timeout_s=60)
            try:
                member.append(broadcast.WeightGroup.join(rendezvous, torch.device("cpu")))
            except Exception as exc:
                member.append(exc)

        joiner = threading.Thread(target=arrive)
        joiner.start()
        opened = await late
        await asyncio.to_thread(joiner.join, 60)
        assert isinstance(member[0], broadcast.WeightGroup), member
        assert opened.backend == "gloo"
        order.append("late formed")
        await learner.CloseWeightGroup(learner_pb2.CloseWeightGroupRequest(group="late"))
        member[0].close()
        order.append("closed")

        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await lonely
        seconds = time.monotonic() - began
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not every one of 2 members joined within 60s" in failed.value.details()
        assert order == ["trained", "late formed", "closed", "lonely ended"], order
        # The group's own deadline (60 s) and some slack, not the process group's (60 + 60 s).
        assert seconds < 60 + broadcast.BACKEND_SLACK_S / 2, seconds
        # The learner is whole: it trains on.
        await _train(learner, rollout_stub, 1)
        for channel in channels:
            await channel.close()
    finally:
        rollout.stop()
        learner_service.stop()
