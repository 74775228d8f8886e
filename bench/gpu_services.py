"""The rollout and learner services on one accelerator: throughput, agreement, train, push.

Builds a Qwen2-architecture policy with random weights (Qwen2.5-0.5B shapes by default, the tiny
model's tokenizer, so nothing is downloaded), starts ``aflowrl serve learner`` and
``aflowrl serve rollout`` as real processes on loopback, and measures one RL update end to end:

1. Generate: a batch of prompts through the rollout service (tokens/s, second round);
2. ComputeLogProbs on the learner: max |rollout - learner| log-prob gap (bf16 on GPU: loose);
3. twice: Train (one update on those rows: seconds, the learner's metrics), a weight push over
   gRPC learner -> rollout (MB/s), and Generate again: the response carries the new version and
   the gap is recomputed under the new weights.

``--dtype float32 --policy-dtype float32`` serves and pushes float32 weights (Qwen2.5-1.5B
shapes are then over 4 GiB). Prints one table. On a CPU it runs too (use small
``--hidden/--layers/--vocab`` there).

    python bench/gpu_services.py [--hidden 896 --layers 24 --heads 14 --kv-heads 2
                                  --intermediate 4864 --batch 32 --max-tokens 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def build_model(out: Path, args: argparse.Namespace) -> int:
    """A random Qwen2 model with the tiny tokenizer; returns its parameter count."""
    from qwen_shapes import build_random_qwen

    return build_random_qwen(
        out,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate,
        vocab=args.vocab,
        tied=True,
        dtype=args.dtype,
    )


def spec_text(model: Path, checkpoints: Path, args: argparse.Namespace) -> str:
    return f"""
policy: {{model: {model}, dtype: {args.policy_dtype}, maxResponseTokens: {args.max_tokens}}}
rollout: {{maxBatchSize: {args.batch}, sampling: {{maxTokens: {args.max_tokens}}}}}
learner:
  fsdp: {{mixedPrecision: {args.mixed_precision}}}
  loss: {{miniBatchSize: {args.batch}, microBatchSize: {args.micro}, klCoef: 0.001}}
  optimizer: {{lr: 1.0e-6}}
trainer: {{tasksPerIteration: {args.batch}, groupSize: 2, checkpointDir: {checkpoints}}}
grpc: {{maxMessageMib: 256}}
weightTransport: {{type: grpc, chunkMib: 16}}
"""


async def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    from policy_services import start_service

    from aflowrl._proto.v1 import (
        common_pb2,
        learner_pb2,
        learner_pb2_grpc,
        rollout_pb2,
        rollout_pb2_grpc,
    )
    from aflowrl.common.client import ChannelOptions, make_channel
    from aflowrl.config import RunSpec
    from aflowrl.trainer import weight_sync

    model = work / "model"
    model.mkdir()
    started = time.perf_counter()
    params = build_model(model, args)
    spec_file = work / "spec.yaml"
    spec_file.write_text(spec_text(model, work / "checkpoints", args))
    spec = RunSpec.from_yaml(spec_file.read_text())
    learner_svc = start_service("learner", spec_file, work, timeout=600)
    rollout_svc = start_service("rollout", spec_file, work, timeout=600)
    result: dict[str, object] = {"parameters": params, "startup_s": time.perf_counter() - started}
    options = ChannelOptions(max_attempts=1, timeout_s=1200, max_message_bytes=256 << 20)
    lc, rc = make_channel(learner_svc.target, options), make_channel(rollout_svc.target, options)
    learner = learner_pb2_grpc.LearnerServiceStub(lc)
    rollout = rollout_pb2_grpc.RolloutServiceStub(rc)

    def prompt(i: int) -> common_pb2.Prompt:
        text = f"Improve workflow {i}: the parent scores 0.{i % 10}; choose one edit."
        msgs = [common_pb2.ChatMessage(role="user", content=text)]
        return common_pb2.Prompt(chat=common_pb2.ChatMessages(messages=msgs))

    async def generate(seed: int) -> tuple[rollout_pb2.GenerateResponse, float]:
        sampling = rollout_pb2.SamplingParams(
            temperature=1.0, max_tokens=args.max_tokens, seed=seed, stop=[]
        )
        t0 = time.perf_counter()
        reply = await rollout.Generate(
            rollout_pb2.GenerateRequest(
                prompts=[prompt(i) for i in range(args.batch)], sampling=sampling
            )
        )
        return reply, time.perf_counter() - t0

    def rows(reply: rollout_pb2.GenerateResponse) -> list[learner_pb2.Sequence]:
        return [
            learner_pb2.Sequence(
                prompt_token_ids=r.prompt_token_ids, response_token_ids=c.token_ids
            )
            for r in reply.results
            for c in r.completions
        ]

    def gap(
        reply: rollout_pb2.GenerateResponse, scored: learner_pb2.ComputeLogProbsResponse
    ) -> float:
        mine = [v for r in reply.results for c in r.completions for v in c.logprobs]
        theirs = [v for x in scored.logprobs for v in x.values]
        return max(abs(a - b) for a, b in zip(mine, theirs, strict=True))

    async def train(reply: rollout_pb2.GenerateResponse, iteration: int) -> None:
        sequences = rows(reply)
        ref = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=sequences, reference=True)
        )
        rng = random.Random(iteration)
        samples = [
            learner_pb2.TrainSample(
                sequence=seq,
                old_logprobs=list(completion.logprobs),
                ref_logprobs=list(ref_lp.values),
                advantages=[rng.choice([-1.0, 1.0])] * len(seq.response_token_ids),
            )
            for seq, ref_lp, completion in zip(
                sequences,
                ref.logprobs,
                [c for r in reply.results for c in r.completions],
                strict=True,
            )
        ]
        t0 = time.perf_counter()
        trained = await learner.Train(
            learner_pb2.TrainRequest(samples=samples, iteration=iteration)
        )
        result[f"train{iteration}_seconds"] = time.perf_counter() - t0
        result[f"train{iteration}_metrics"] = dict(trained.metrics.values)
        result[f"policy_version{iteration}"] = trained.policy_version

    try:
        await generate(seed=0)  # warm-up (CUDA kernels, allocator)
        reply, seconds = await generate(seed=1)
        tokens = reply.generated_tokens
        result["rollout_tokens_per_s"] = tokens / seconds
        result["rollout_batch_seconds"] = seconds
        result["rollout_generated_tokens"] = tokens
        t0 = time.perf_counter()
        scored = await learner.ComputeLogProbs(
            learner_pb2.ComputeLogProbsRequest(sequences=rows(reply))
        )
        result["logprob_seconds"] = time.perf_counter() - t0
        result["logprob_gap_v0"] = gap(reply, scored)
        sync = weight_sync.make_weight_sync(spec, learner_svc.target, [rollout_svc.target])
        wire_bytes = params * (4 if args.policy_dtype == "float32" else 2)
        result["push_bytes"] = wire_bytes
        # Two rounds of Train -> push -> Generate: the served version follows each push and the
        # rollout's log-probs still agree with the learner's under the new weights.
        for iteration in (1, 2):
            await train(reply, iteration)
            report = await sync.push()
            result[f"push{iteration}_seconds"] = report.seconds
            result[f"push{iteration}_mb_per_s"] = wire_bytes / 1e6 / report.seconds
            result[f"push{iteration}_ok"] = report.ok
            reply, _ = await generate(seed=1 + iteration)
            result[f"served_version{iteration}"] = reply.weight_version
            scored = await learner.ComputeLogProbs(
                learner_pb2.ComputeLogProbsRequest(sequences=rows(reply))
            )
            result[f"logprob_gap_v{iteration}"] = gap(reply, scored)
        await sync.close()
    finally:
        await lc.close()
        await rc.close()
        rollout_svc.stop()
        learner_svc.stop()
        for svc in (learner_svc, rollout_svc):
            tail = svc.log.read_text().splitlines()[-5:]
            result[f"{svc.name}_log_tail"] = tail
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=4864)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="bfloat16", help="dtype of the model files")
    parser.add_argument(
        "--policy-dtype", default="auto", help="policy.dtype (float32: an fp32 rollout and push)"
    )
    parser.add_argument("--mixed-precision", default="bf16", help="learner.fsdp.mixedPrecision")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    result["device"] = device
    result["torch"] = torch.__version__
    for key, value in result.items():
        if key.endswith(("_log_tail", "_metrics")):
            continue
        print(f"{key:28s} {value:.4g}" if isinstance(value, float) else f"{key:28s} {value}")
    for key in ("train1_metrics", "train2_metrics"):
        if key in result:
            print(key, json.dumps(result[key], indent=None))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
