"""GPU memory of one learner update for Qwen2.5 shapes, measured beside the README's formula.

For each preset it writes random weights with Qwen2.5's shapes (``qwen_shapes``, the tiny
model's tokenizer: nothing is downloaded), builds the project's learner on one rank
(:class:`aflowrl.learner.worker.Learner`: FSDP2, bf16 mixed precision, gradient checkpointing
from 1B parameters, chunked log-probs, sharded gradient accumulation) and runs one ``Train`` on
synthetic sequences. It prints ``torch.cuda.max_memory_allocated`` after the build and over the
update, the update's seconds, and the formula's estimate of the same peak:

- ``1.5b-full``: Qwen2.5-1.5B, every weight trained (AdamW), the KL reference a frozen copy;
- ``7b-lora``: Qwen2.5-7B, LoRA r=64 on every linear layer, the reference the adapters switched
  off (what a 7B run on few GPUs uses);
- ``7b-full``: Qwen2.5-7B, every weight trained (one GPU cannot hold it: the estimate says why;
  it is for 8 ranks);
- ``smoke``, ``smoke-lora``: a CPU-sized model, to check the script itself.

Per GPU with N ranks, P parameters, T of them trained, the formula (bytes) is
``4P/N`` (float32 weights; with LoRA ``(2P + 4T)/N``: the frozen base in bfloat16,
``policy.lora.baseDtype`` "auto" on a GPU, the adapters in float32) ``+ 12T/N`` (float32
gradients and AdamW's two moments) ``+ 4P/N``
(reference copy, full fine-tuning with a KL term) ``+ 2(P_layer * 2 + P_root)`` (bf16 gathered
layers, one prefetched, and the root's embedding/head) ``+ activations``, where activations are
``2 * L * tokens * H`` (each layer's bf16 input kept for recomputation) ``+ tokens * (16H + 6I)``
(one layer's working set when it is recomputed) ``+ 12 * chunk * V`` (one chunk of logits:
bf16, float32, log-softmax), with tokens = micro-batch rows x sequence length.

    python bench/learner_memory.py [--presets 1.5b-full 7b-lora] [--rows 16 --micro 4
                                    --prompt-tokens 1536 --response-tokens 512]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from qwen_shapes import QWEN25, build_random_qwen  # noqa: E402

PRESETS: dict[str, tuple[str, bool]] = {
    "1.5b-full": ("1.5b", False),
    "7b-lora": ("7b", True),
    "7b-full": ("7b", False),
    "smoke": ("smoke", False),
    "smoke-lora": ("smoke", True),
}
"""preset -> (shapes, LoRA)."""

LORA_RANK = 64
GIB = 1 << 30


def layer_parameters(s: dict[str, int | bool]) -> int:
    """Parameters of one Qwen2 decoder layer."""
    h, i = int(s["hidden"]), int(s["intermediate"])
    kv = h // int(s["heads"]) * int(s["kv_heads"])
    attention = h * h + 2 * h * kv + h * h + h + 2 * kv  # q, k, v, o weights; q, k, v biases
    return attention + 3 * h * i + 2 * h


def lora_parameters(s: dict[str, int | bool], rank: int) -> int:
    """LoRA A and B of every linear layer of every decoder layer."""
    h, i = int(s["hidden"]), int(s["intermediate"])
    kv = h // int(s["heads"]) * int(s["kv_heads"])
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
    return int(s["layers"]) * sum(rank * (a + b) for a, b in shapes)


def estimate(
    s: dict[str, int | bool],
    *,
    lora: bool,
    ranks: int,
    micro: int,
    seq: int,
    chunk: int,
    base_bytes: int = 2,
) -> dict[str, float]:
    """The formula of the module docstring, in GiB per GPU (``base_bytes``: bytes per frozen
    base parameter under LoRA, 2 for ``baseDtype`` bfloat16, 4 for float32)."""
    h, i, v, n = int(s["hidden"]), int(s["intermediate"]), int(s["vocab"]), int(s["layers"])
    root = v * h * (1 if s["tied"] else 2) + h
    params = n * layer_parameters(s) + root
    trained = lora_parameters(s, LORA_RANK) if lora else params
    tokens = micro * seq
    parts = {
        "weights": (base_bytes * params + 4 * trained if lora else 4 * params) / ranks,
        "grads+adam": 12 * trained / ranks,
        "reference": 0 if lora else 4 * params / ranks,
        "gathered": 2 * (2 * layer_parameters(s) + root),
        "activations": 2 * n * tokens * h + tokens * (16 * h + 6 * i) + 12 * chunk * v,
    }
    out = {k: val / GIB for k, val in parts.items()}
    out["total"] = sum(out.values())
    out["parameters_b"] = params / 1e9
    return out


def measure(
    preset: str, args: argparse.Namespace, work: Path, base_dtype: str = "auto"
) -> dict[str, object]:
    import torch

    from aflowrl.config import RunSpec
    from aflowrl.learner.batching import SequenceItem, TrainRow
    from aflowrl.learner.distributed import init_distributed
    from aflowrl.learner.worker import Learner

    shapes_name, lora = PRESETS[preset]
    shapes = QWEN25[shapes_name]
    model = work / preset
    t0 = time.perf_counter()
    if not (model / "parameters.json").exists():  # one build per preset, whatever the base dtype
        count = build_random_qwen(model, **shapes)  # type: ignore[arg-type]
        (model / "parameters.json").write_text(json.dumps(count))
    params = int(json.loads((model / "parameters.json").read_text()))
    built_s = time.perf_counter() - t0
    lora_yaml = (
        f", lora: {{rank: {LORA_RANK}, alpha: {2 * LORA_RANK}, baseDtype: {base_dtype}}}"
        if lora
        else ""
    )
    spec = RunSpec.from_yaml(
        f"""
policy: {{model: {model}, dtype: auto, maxPromptTokens: {max(64, args.prompt_tokens)},
          maxResponseTokens: {args.response_tokens}{lora_yaml}}}
rollout: {{sampling: {{maxTokens: {args.response_tokens}}}}}
learner:
  fsdp: {{mixedPrecision: bf16, logprobChunkTokens: {args.chunk}}}
  loss: {{miniBatchSize: {args.rows}, microBatchSize: {args.micro}, klCoef: 0.001}}
  optimizer: {{lr: 1.0e-6}}
"""
    )
    ctx = init_distributed()
    cuda = ctx.device.type == "cuda"
    gc.collect()  # an earlier measurement's learner (reference cycles) is gone before this one
    held = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    learner = Learner(spec, ctx)
    load_s = time.perf_counter() - t0
    after_build = torch.cuda.memory_allocated() if cuda else 0
    generator = torch.Generator().manual_seed(0)
    vocab = 4096  # token ids of the tiny tokenizer's range (any id is valid for the model)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(0, vocab, (n,), generator=generator).tolist())

    rows = [
        TrainRow(
            item=SequenceItem(prompt=ids(args.prompt_tokens), response=ids(args.response_tokens)),
            old_logprobs=(-8.3,) * args.response_tokens,
            advantages=((1.0 if k % 2 else -1.0),) * args.response_tokens,
        )
        for k in range(args.rows)
    ]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = learner.train(rows, iteration=1)
    if cuda:
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    seq = args.prompt_tokens + args.response_tokens
    predicted = estimate(
        shapes,
        lora=lora,
        ranks=ctx.world_size,
        micro=args.micro,
        seq=seq,
        chunk=args.chunk,
        base_bytes=4 if base_dtype == "float32" else 2,
    )
    del learner
    if cuda:
        torch.cuda.empty_cache()
    return {
        "preset": preset,
        "lora_base_dtype": base_dtype if lora else None,
        "parameters": params,
        "build_s": round(built_s, 1),
        "load_s": round(load_s, 1),
        "step_s": round(step_s, 2),
        "held_before_gib": round(held / GIB, 2),
        "after_build_gib": round(after_build / GIB, 2),
        "peak_gib": round(peak / GIB, 2),
        "estimate_gib": {k: round(v, 2) for k, v in predicted.items()},
        "tokens": args.rows * seq,
        "metrics": {k: round(v, 4) for k, v in metrics.items() if "loss" in k or "norm" in k},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["1.5b-full", "7b-lora"])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1536)
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=1024, help="learner.fsdp.logprobChunkTokens")
    parser.add_argument(
        "--lora-base-dtypes",
        nargs="+",
        default=["auto"],
        help="policy.lora.baseDtype values to measure LoRA presets with (e.g. auto float32)",
    )
    parser.add_argument("--estimate-only", action="store_true", help="print the formula only")
    parser.add_argument("--json", type=Path, help="also append the results here (JSON lines)")
    args = parser.parse_args()
    seq = args.prompt_tokens + args.response_tokens
    for preset in args.presets:
        shapes_name, lora = PRESETS[preset]
        for ranks in (1, 8):
            est = estimate(
                QWEN25[shapes_name], lora=lora, ranks=ranks, micro=args.micro, seq=seq,
                chunk=args.chunk,
            )  # fmt: skip
            print(f"estimate {preset} on {ranks} GPU(s): " + json.dumps(
                {k: round(v, 2) for k, v in est.items()}))  # fmt: skip
    if args.estimate_only:
        return
    import torch

    print(f"device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            for base_dtype in args.lora_base_dtypes if PRESETS[preset][1] else ["auto"]:
                result = measure(preset, args, Path(tmp), base_dtype)
                print("measured " + json.dumps(result))
                if args.json:
                    with args.json.open("a") as fh:
                        fh.write(json.dumps(result) + "\n")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
