"""The nccl transport into the vllm engine goes through vLLM's weight-transfer API (issue 24).

vLLM 0.32's workers receive trainer weights through a weight-transfer engine built from the
engine's ``weight_transfer_config``; the rollout's engine is built with the project's backend
``aflowrl`` (:mod:`aflowrl.rollout.vllm_transfer`: vLLM's engine protocol over the abortable
weight group of :mod:`aflowrl.models.broadcast`, gloo on a CPU) and reaches it with vLLM's
``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update`` worker calls (the last three in one extension call per update).

1. A push from a real learner (``NcclWeightSync``) reaches a vllm rollout service through the
   weight-transfer engine (vLLM logs that it built ``AflowrlWeightTransferEngine``, the rollout
   logs the engine and backend the workers report), by broadcast (no fallback), and the served
   log-probs match the learner's to 1e-4; in-process and in vLLM's multi-process mode (its GPU
   default: the backend is registered in the engine-core process, where the worker extension
   module is imported).
2. A broadcast that fails midway, on the receiver (the model's ``load_weights`` raises an
   out-of-memory error after the first bucket, inside vLLM's worker, in this process; or vLLM's
   ``finalize_layerwise_reload`` raises at the finish) or on the sender (lost after half of the
   tensors, its group closed), leaves the old version served
   (same greedy tokens and log-probs, label unchanged, SERVING: the old weights were put back,
   ``keepWeightsOnLoad``), or without ``keepWeightsOnLoad`` serves nothing (NOT_SERVING, the
   label unchanged); a retry over a new group completes and serves the new weights with
   log-probs equal to a reference model's to 1e-4. vLLM's worker state shows the ``aflowrl``
   engine was the one in use.
3. A Generate cancelled as a broadcast arrives has no engine request left when the receive
   starts, between the receive and the settle, or at the settle, and the prefix cache serves
   no block computed with the old weights afterwards.

Run with ``make test-vllm`` (skipped where vllm is not installed).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from grpc import aio
from grpc_health.v1 import health_pb2

from aflowrl._proto.v1 import common_pb2, learner_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.models import broadcast
from aflowrl.trainer import weight_sync

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, VLLM_TESTS, metrics_text, nccl_transport, start_service
from test_learner_service import TOL, _max_gap, _sample, _signed_samples, _stubs, agrees
from test_rollout_service import (
    _REFUSED,
    Learner,
    _chat,
    _greedy,
    _perturbed,
    _refused_tensors,
    _version,
    assert_served_with,
    health_status,
    liveness,
    refused_then_accepted,
    serve_engine,
    serves_as_before,
    tiny_vllm_engine,
)

pytestmark = VLLM_TESTS

VLLM = """
rollout:
  engine: vllm
  vllm: {maxModelLen: 4096, gpuMemoryUtilization: 0.05, enforceEager: true}
"""


@pytest.mark.parametrize("multiprocess", ["0", "1"])
async def test_an_nccl_push_reaches_vllm_through_its_weight_transfer_engine(tmp_path, multiprocess):
    spec_text = SPEC + VLLM + nccl_transport(tmp_path)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(spec_text)
    spec = RunSpec.from_document(yaml.safe_load(spec_text))
    started = []
    try:
        started.append(start_service("learner", spec_file, tmp_path, timeout=300))
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocess}
        started.append(start_service("rollout", spec_file, tmp_path, timeout=300, env=env))
        learner_service, rollout_service = started
        channels, learner, rollout = _stubs(learner_service, rollout_service)
        reply, sequences = await _sample(rollout, seed=31)
        scored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences)
        )
        assert _max_gap(reply, scored) < TOL
        trained = await learner.Train(
            learner_pb2.TrainRequest(samples=_signed_samples(sequences, scored), iteration=0)
        )
        sync = weight_sync.make_weight_sync(spec, learner_service.target, [rollout_service.target])
        assert isinstance(sync, weight_sync.NcclWeightSync)
        report = await sync.push()
        await sync.close()
        assert report.ok and report.replicas[0].version == trained.policy_version > 0
        assert not report.replicas[0].fallback  # by broadcast, not the fallback export

        log = rollout_service.log.read_text()
        # vLLM's factory built the project's engine from weight_transfer_config ...
        assert "Creating weight transfer engine: AflowrlWeightTransferEngine" in log
        # ... and the workers reported it as the engine that received this version.
        assert (
            f"weights v{trained.policy_version} received through vLLM's weight-transfer engine "
            "AflowrlWeightTransferEngine (backend 'aflowrl')"
        ) in log
        buckets = metrics_text(rollout_service)
        assert re.search(r'weight_update_buckets_total\{transport="nccl"\} [1-9]', buckets), buckets

        await agrees(learner, rollout, 32, trained.policy_version)
        for channel in channels:
            await channel.close()
    finally:
        for service in reversed(started):
            service.stop()


def _transfer_engines(engine: Any) -> Any:
    """What vLLM's workers hold as their weight-transfer engine (in-process engine)."""

    def look(worker: Any) -> tuple[str, str]:
        transfer = worker.weight_transfer_engine
        return type(transfer).__name__, str(worker.vllm_config.weight_transfer_config.backend)

    return engine._call(lambda core: core.collective_rpc(look))


@pytest.mark.filterwarnings("default")  # vLLM warns as it starts, in this process
@pytest.mark.parametrize(
    ("fault", "keep"),
    [
        ("load", True),
        ("sender", True),
        ("load", False),
        ("finalize", True),
        ("finalize", False),
        ("finalize_midway", True),
    ],
)
async def test_an_nccl_push_failing_midway_never_serves_a_mix_and_a_retry_completes(
    tmp_path, monkeypatch, fault, keep
):
    """``load``: the model's own ``load_weights``, called by the weight-transfer engine inside
    vLLM's worker, runs out of memory on the second bucket (the broadcast is drained to its
    end). ``finalize``: vLLM's ``finalize_layerwise_reload`` at the finish raises after the
    whole version was loaded (vLLM's worker would keep its session open if the finish raised).
    ``sender``: the learner is lost after half of the tensors (its group closes).
    ``finalize_midway``: the second bucket's load fails and the finalize then raises before it
    put back the layers that got nothing (they stay on the meta device, where a restore's copy
    writes nothing). With ``keepWeightsOnLoad`` the old version serves on, except after
    ``finalize_midway``, whose model cannot be restored; otherwise the replica serves nothing
    (not ready, UNAVAILABLE, yet alive) until the retry completes; the version label is
    unchanged."""
    from vllm.model_executor.model_loader import reload
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM

    engine, model_dir, base = tiny_vllm_engine(monkeypatch, keep_weights_on_load=keep)
    new = _perturbed(base, seed=99)
    sender = Learner(new)
    async with serve_engine(engine) as (servicer, stub, health):
        assert await _transfer_engines(engine) == [("AflowrlWeightTransferEngine", "aflowrl")]
        before = await _greedy(stub)

        real = Qwen2ForCausalLM.load_weights
        calls = [0]

        def counted(self: Any, tensors: Any) -> Any:
            calls[0] += 1
            if fault in ("load", "finalize_midway") and calls[0] == 2:
                raise torch.OutOfMemoryError("injected: out of memory in the second bucket")
            return real(self, tensors)

        real_finalize = reload.finalize_layerwise_reload

        def finalize(*args: Any, **kwargs: Any) -> None:
            if fault == "finalize_midway":
                raise torch.OutOfMemoryError("injected: out of memory while finalizing")
            real_finalize(*args, **kwargs)
            if fault == "finalize":
                raise torch.OutOfMemoryError("injected: out of memory while finalizing")

        monkeypatch.setattr(Qwen2ForCausalLM, "load_weights", counted)
        monkeypatch.setattr(reload, "finalize_layerwise_reload", finalize)
        lost_after = len(new) // 2 if fault == "sender" else None
        error, sent = await sender.push(stub, "g1", 1, lost_after=lost_after)
        monkeypatch.setattr(Qwen2ForCausalLM, "load_weights", real)
        monkeypatch.setattr(reload, "finalize_layerwise_reload", real_finalize)
        assert calls[0] >= 2  # buckets were loaded into the model before the fault
        assert isinstance(error, aio.AioRpcError), error
        assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
        if fault == "sender":
            assert isinstance(sent, ConnectionError)
        else:
            assert isinstance(sent, broadcast.BroadcastResult) and not sent.broken  # drained
            failed = {
                "load": "failed midway",
                "finalize": "finalizing the update failed",
                "finalize_midway": "finalizing the update failed",
            }
            assert failed[fault] in error.details(), error.details()
        assert await _version(stub) == 0
        if keep and fault != "finalize_midway":
            # "put back": the workers loaded buckets, then restored the served weights.
            assert "old weights were put back" in error.details(), error.details()
            assert not servicer.needs_reload
            assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
            await serves_as_before(stub, before)
        else:
            assert "put back" not in error.details() and servicer.needs_reload
            assert await health_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(aio.AioRpcError) as info:
                await _greedy(stub)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        # The retry: a new group (the replica left the failed one), the whole version.
        reply, sent = await sender.push(stub, "g2", 1)
        assert isinstance(reply, rollout_pb2.UpdateWeightsResponse), reply
        assert reply.weight_version == 1 and reply.buckets == sent.buckets > 1
        assert not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        served = await stub.Generate(
            rollout_pb2.GenerateRequest(
                prompts=[_chat("say something")],
                sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=12, seed=3),
            )
        )
        assert served.weight_version == 1
        assert_served_with(served, model_dir, new)


@pytest.mark.filterwarnings("default")  # vLLM warns as it starts, in this process
async def test_a_refused_update_leaves_a_vllm_replica_serving_its_version(tmp_path, monkeypatch):
    """The vllm engine: an update the replica refuses (non-finite values, in the last bucket of
    a broadcast after others were loaded; a stale version; another model's weights) over grpc,
    filesystem and nccl is answered with the refusal, and the previous version serves on (label
    2, the same greedy tokens and log-probs, ready and alive); over nccl the group stands, and
    the next broadcast over it is taken."""
    engine, model_dir, base = tiny_vllm_engine(monkeypatch)
    good = _perturbed(base, seed=12)
    async with serve_engine(engine) as (servicer, stub, health):
        servicer.gate.version = 2  # serving the base weights as version 2 (so 1 is stale)
        before = await _greedy(stub)
        for transport in ("grpc", "filesystem", "nccl"):
            for fault in sorted(_REFUSED):
                bad, bad_version = _refused_tensors(base, fault)
                error, again = await refused_then_accepted(
                    transport, stub, bad, bad_version, good, tmp_path / transport / fault, model_dir
                )
                assert isinstance(error, aio.AioRpcError), (transport, fault, error)
                assert error.code() == _REFUSED[fault], (transport, fault, error.details())
                assert await _version(stub) == 2 and not servicer.needs_reload, (transport, fault)
                assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
                assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING
                await serves_as_before(stub, before)
        reply = await again()  # the last nccl group still stands
        assert reply.weight_version == 4


@pytest.mark.filterwarnings("default")  # vLLM warns as it starts, in this process
async def test_a_call_cancelled_into_a_broadcast_never_runs_between_its_receive_and_settle(
    tmp_path, monkeypatch
):
    """A Generate whose requests are running in vLLM is cancelled by its caller (the trainer
    cancels sibling calls on a failure) as a broadcast arrives. The broadcast's two worker
    calls, the receive (buckets loaded: the model holds the new weights, not yet settled) and
    the settle (the kept copy dropped), find no unfinished engine request at either end, so
    none is stepped on the mix between them (vLLM's multi-process engine core steps on its own
    between two calls); the cancelled call never answers. A prompt whose KV blocks were cached
    with the old weights is then served with the new ones (log-probs of a reference model with
    the new weights, to 1e-4): no block of the old weights serves the new version."""
    engine, model_dir, base = tiny_vllm_engine(monkeypatch)
    new = _perturbed(base, seed=41)
    sender = Learner(new)
    cached = rollout_pb2.GenerateRequest(
        prompts=[
            common_pb2.Prompt(
                token_ids=common_pb2.TokenIds(ids=[(11 * i) % 1500 + 10 for i in range(300)])
            )
        ],
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=4, seed=3),
    )
    async with serve_engine(engine) as (_, stub, health):
        first = await stub.Generate(cached)  # its prompt's blocks are now cached
        core = engine._engine
        real_rpc = core.collective_rpc
        unfinished: dict[str, bool] = {}

        def rpc(method: Any, *args: Any, **kwargs: Any) -> Any:
            if method in ("aflowrl_receive_weights", "aflowrl_settle_weights"):
                unfinished[f"{method} starts"] = bool(core.has_unfinished_requests())
            answer = real_rpc(method, *args, **kwargs)
            if method == "aflowrl_receive_weights":  # received, not settled: the mix
                unfinished["between receive and settle"] = bool(core.has_unfinished_requests())
            return answer

        monkeypatch.setattr(core, "collective_rpc", rpc)
        running = stub.Generate(
            rollout_pb2.GenerateRequest(
                prompts=[_chat("go on")],
                sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=400, n=8, seed=1),
            )
        )
        deadline = time.monotonic() + 120
        while not engine._state.owners:  # its requests are in vLLM
            assert time.monotonic() < deadline, "the long Generate never reached the engine"
            await asyncio.sleep(0.05)
        running.cancel()
        reply, sent = await sender.push(stub, "g1", 1)
        assert isinstance(reply, rollout_pb2.UpdateWeightsResponse), reply
        assert reply.weight_version == 1 and sent.buckets > 1
        assert unfinished == {
            "aflowrl_receive_weights starts": False,
            "between receive and settle": False,
            "aflowrl_settle_weights starts": False,
        }
        with pytest.raises(asyncio.CancelledError):
            await running
        assert not engine._state.owners and not core.has_unfinished_requests()
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING

        served = await stub.Generate(cached)
        assert served.weight_version == 1
        assert_served_with(served, model_dir, new)
        completion = served.results[0].completions[0]
        assert list(completion.logprobs) != list(first.results[0].completions[0].logprobs)
