"""What a LoRA learner holds and checkpoints, before and after issue 24 (item 6), on a CPU.

Before: the frozen base was held in float32 beside the adapters, and every checkpoint saved the
whole model state (base included) with the optimiser. After: the base is held in
``policy.lora.baseDtype`` (bfloat16 here; "auto" picks it on a GPU) and a checkpoint holds the
trained parameters only (:data:`aflowrl.learner.checkpoint.TRAINED_ONLY`); resume rebuilds the
base from the model directory.

It builds the project's learner on one rank for each setting, runs one update (so AdamW has its
moments), and prints this rank's parameter bytes (trainable, frozen) and the bytes on disk of a
checkpoint's ``dcp/`` directory: the "before" one written as the old code did (the full model
state dict), the "after" one by :func:`aflowrl.learner.checkpoint.save`. It also prints the same
accounting for Qwen2.5-7B with LoRA r=64 on every linear layer (arithmetic, from its shapes).

    python bench/lora_checkpoint.py [--model tiny|small|DIR] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from learner_memory import layer_parameters, lora_parameters  # noqa: E402
from qwen_shapes import QWEN25  # noqa: E402

GB = 1e9


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(model: str, rank: int, base_dtype: str, ctx: Any, work: Path) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from aflowrl.config import RunSpec
    from aflowrl.learner import checkpoint
    from aflowrl.learner.batching import SequenceItem, TrainRow
    from aflowrl.learner.policy import parameter_bytes
    from aflowrl.learner.worker import Learner

    spec = RunSpec.from_yaml(
        f"""
policy: {{model: {model}, dtype: float32, lora: {{rank: {rank}, alpha: {2 * rank},
          baseDtype: {base_dtype}}}}}
learner:
  fsdp: {{mixedPrecision: none}}
  loss: {{miniBatchSize: 2, microBatchSize: 2, klCoef: 0.0}}
"""
    )
    learner = Learner(spec, ctx)
    rows = [
        TrainRow(SequenceItem(prompt=tuple(range(40, 60)), response=(70, 71, 72)),
                 (-8.0,) * 3, (1.0 if k else -1.0,) * 3)
        for k in range(2)
    ]  # fmt: skip
    learner.train(rows, iteration=0)
    module, optimizer = learner.policy.module, learner.optimizer
    held = parameter_bytes(module)
    full = work / f"{base_dtype}-full"
    model_sd, optim_sd = get_state_dict(module, optimizer)  # the old checkpoint's contents
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(full / "dcp"))
    trained = work / f"{base_dtype}-trained"
    checkpoint.save(
        ctx, trained, module=module, optimizer=optimizer, state=learner.state, client_state=b""
    )
    del learner
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {
        "base_dtype": base_dtype,
        "trainable_bytes": held["trainable"],
        "frozen_bytes": held["frozen"],
        "full_checkpoint_bytes": _dir_bytes(full / "dcp"),
        "trained_only_checkpoint_bytes": _dir_bytes(trained / "dcp"),
    }


def qwen7b(rank: int) -> dict[str, float]:
    """The same accounting for Qwen2.5-7B with LoRA r on every linear layer (GB)."""
    s = QWEN25["7b"]
    h, v = int(s["hidden"]), int(s["vocab"])
    params = int(s["layers"]) * layer_parameters(s) + v * h * (1 if s["tied"] else 2) + h
    trained = lora_parameters(s, rank)
    return {
        "parameters_b": params / 1e9,
        "trained_m": trained / 1e6,
        "base_float32_gb": 4 * params / GB,
        "base_bfloat16_gb": 2 * params / GB,
        # old: model (float32 base + adapters) + AdamW's two moments of the adapters
        "checkpoint_before_gb": (4 * params + 4 * trained + 8 * trained) / GB,
        "checkpoint_after_gb": (4 * trained + 8 * trained) / GB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="policy.model (a preset or a directory)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    args = parser.parse_args()
    import torch

    from aflowrl.learner.distributed import init_distributed

    torch.set_num_threads(1)
    ctx = init_distributed()
    with tempfile.TemporaryDirectory() as tmp:
        before = measure(args.model, args.rank, "float32", ctx, Path(tmp))
        after = measure(args.model, args.rank, "bfloat16", ctx, Path(tmp))
    print("before (float32 base, full checkpoint): " + json.dumps(before))
    print("after (bfloat16 base, trained-only checkpoint): " + json.dumps(after))
    print(
        "ratios: frozen bytes after/before "
        f"{after['frozen_bytes'] / before['frozen_bytes']:.3f}; checkpoint bytes after/before "
        f"{after['trained_only_checkpoint_bytes'] / before['full_checkpoint_bytes']:.3f}"
    )
    print(f"Qwen2.5-7B, LoRA r=64: {json.dumps({k: round(x, 2) for k, x in qwen7b(64).items()})}")


if __name__ == "__main__":
    main()
