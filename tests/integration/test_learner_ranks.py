"""Two learner ranks (torchrun, gloo, FSDP2) train exactly like one.

Done-when of issue 7: on the same data, the losses of 5 Train steps agree within 1e-4 between a
learner of two ranks and a learner of one, and so do the resulting weights (their log-probs).
The batch has rows of uneven lengths and a choice decision, so the ranks get unequal shares and
one of them runs a zero-weight dummy micro-batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from aflowrl._proto.v1 import learner_pb2, learner_pb2_grpc
from aflowrl.common.client import ChannelOptions, make_channel

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, start_service
from test_learner_service import LOSSES, _batch, _train_steps

STEPS = 5


async def _run(service) -> tuple[list[dict[str, float]], list[list[float]], int]:
    channel = make_channel(service.target, ChannelOptions(max_attempts=1, timeout_s=120))
    learner = learner_pb2_grpc.LearnerServiceStub(channel)
    metrics = await _train_steps(learner, 0, STEPS)
    sequences = [s.sequence for s in _batch() if s.HasField("sequence")]
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    status = await learner.Status(learner_pb2.LearnerStatusRequest())
    await channel.close()
    return metrics, [list(x.values) for x in scored.logprobs], status.world_size


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="two NCCL ranks need two GPUs (hide the GPU, CUDA_VISIBLE_DEVICES='', to use gloo)",
)
async def test_two_gloo_ranks_match_one_rank(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    one = start_service("learner", spec, tmp_path, name="one-rank")
    try:
        single, single_lps, world = await _run(one)
        assert world == 1
    finally:
        assert one.stop() == 0
    two = start_service("learner", spec, tmp_path, ranks=2, name="two-ranks", timeout=180)
    try:
        double, double_lps, world = await _run(two)
        assert world == 2
    finally:
        two.stop()  # torchrun itself exits 1 on SIGTERM; the ranks stop cleanly
    log = two.log.read_text()
    assert "learner stopped" in log and "Exception in thread" not in log, log
    assert "rank 1: " in log and "built on the meta device" in log, log  # one copy read
    for step, (a, b) in enumerate(zip(single, double, strict=False)):
        for name in LOSSES:
            assert b[name] == pytest.approx(a[name], abs=1e-4), (step, name)
    assert single[-1]["losses/policy"] != single[0]["losses/policy"]  # it did learn something
    gap = max(
        abs(x - y)
        for xs, ys in zip(single_lps, double_lps, strict=False)
        for x, y in zip(xs, ys, strict=False)
    )
    assert gap < 1e-4
