"""Rollout tokens/s through the gRPC service against the engine called directly (ratio).

Both run in this process on the same engine, alternately, so they see the same machine load:
``direct`` awaits ``engine.generate``; ``service`` sends the same prompts (as token ids) through a
``RolloutService`` on loopback (GrpcServer, interceptors, proto conversion, version gate). The
ratio service / direct is the cost of the service layer; the target is >= 0.9.

    python bench/rollout_throughput.py [--engine hf|vllm] [--batch 16] [--max-tokens 128]

``--score``: candidate scoring instead (``engine.score``, the ScoreCandidates path): per round a
new observation of ``--observation`` tokens and ``--batch`` candidates of 16 tokens, scored
twice (the second time as the search re-scores an observation); prints candidates per second,
the median over rounds, which is what prefix caching changes (each candidate re-prefilling the
whole observation, or sharing its prefill).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from aflowrl._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions, make_channel
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.config import RunSpec
from aflowrl.rollout.engine import RolloutEngine, SamplingOptions
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.rollout.server import build_engine, build_servicer
from aflowrl.rollout.service import SERVICE_NAME


async def score(args: argparse.Namespace, engine: RolloutEngine) -> None:
    vocab = len(engine.tokenizer)
    rates: list[float] = []
    for round_ in range(args.warmup + args.rounds):
        rng = random.Random(round_)
        observation = [rng.randrange(10, vocab) for _ in range(args.observation)]
        candidates = [[rng.randrange(10, vocab) for _ in range(16)] for _ in range(args.batch)]
        started = time.perf_counter()
        first = await engine.score(observation, candidates, 1.0)
        again = await engine.score(observation, candidates, 1.0)
        seconds = time.perf_counter() - started
        gap = max(
            abs(a - b) for x, y in zip(first, again, strict=True) for a, b in zip(x, y, strict=True)
        )
        assert gap < 1e-4, f"scores differ between the two passes by {gap}"
        if round_ >= args.warmup:
            rates.append(2 * len(candidates) / seconds)
    print(
        f"engine={args.engine} score: observation={args.observation} tokens, "
        f"{args.batch} candidates x 16 tokens, rounds={args.rounds}"
    )
    print(f"scoring {statistics.median(rates):10.1f} candidates/s (median)")


async def main(args: argparse.Namespace) -> None:
    spec = RunSpec.model_validate(
        {
            "rollout": {
                "engine": args.engine,
                "maxBatchSize": args.batch,
                "vllm": {"maxModelLen": 4096, "gpuMemoryUtilization": 0.05},
            }
        }
    )
    engine = build_engine(spec)
    await engine.start()
    if args.score:
        try:
            await score(args, engine)
        finally:
            await engine.close()
        return
    metrics = RolloutMetrics()
    servicer = build_servicer(spec, engine, metrics)
    options = ServerOptions(component="rollout", host="127.0.0.1", port=0)
    registration = ServiceRegistration(
        servicer, rollout_pb2_grpc.add_RolloutServiceServicer_to_server, SERVICE_NAME
    )
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer(
            f"Improve workflow {i}: add ScEnsemble after generate", add_special_tokens=False
        ).input_ids
        for i in range(args.batch)
    ]
    # Temperature 1 with a seed per round: both paths generate the very same tokens.
    async with GrpcServer(options, [registration], metrics=metrics) as server:
        channel = make_channel(f"127.0.0.1:{server.port}", ChannelOptions(timeout_s=600))
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        direct: list[float] = []
        service: list[float] = []
        for round_ in range(args.warmup + args.rounds):
            sampling = SamplingOptions(temperature=1.0, max_tokens=args.max_tokens, seed=round_)
            request = rollout_pb2.GenerateRequest(
                prompts=[common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=p)) for p in prompts],
                sampling=rollout_pb2.SamplingParams(
                    temperature=1.0, max_tokens=args.max_tokens, seed=round_
                ),
            )

            async def run_direct(sampling: SamplingOptions = sampling) -> tuple[int, float]:
                started = time.perf_counter()
                results = await engine.generate(prompts, sampling)
                tokens = sum(len(c.token_ids) for r in results for c in r.completions)
                return tokens, time.perf_counter() - started

            async def run_service(
                request: rollout_pb2.GenerateRequest = request,
            ) -> tuple[int, float]:
                started = time.perf_counter()
                reply = await stub.Generate(request)
                return int(reply.generated_tokens), time.perf_counter() - started

            # Alternate which path goes first, so neither always meets the same machine state.
            if round_ % 2:
                (service_tokens, service_s), (tokens, direct_s) = (
                    await run_service(),
                    await run_direct(),
                )
            else:
                (tokens, direct_s), (service_tokens, service_s) = (
                    await run_direct(),
                    await run_service(),
                )
            assert service_tokens == tokens, "both paths must generate the same tokens"
            if round_ >= args.warmup:
                direct.append(tokens / direct_s)
                service.append(tokens / service_s)
        await channel.close()
    await engine.close()
    d, s = statistics.median(direct), statistics.median(service)
    print(
        f"engine={args.engine} batch={args.batch} max_tokens={args.max_tokens} rounds={args.rounds}"
    )
    print(f"direct  {d:10.0f} tokens/s (median)")
    print(f"service {s:10.0f} tokens/s (median, gRPC on loopback)")
    print(f"ratio service/direct = {s / d:.3f} (target >= 0.9)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--score", action="store_true", help="candidate scoring instead")
    parser.add_argument("--observation", type=int, default=1500, help="with --score: tokens")
    asyncio.run(main(parser.parse_args()))
