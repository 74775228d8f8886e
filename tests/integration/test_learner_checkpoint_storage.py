"""Learner checkpoints on two gloo ranks: what they hold, and resuming them consistently.

Issue 24, items 5 and 6. Each rank is a spawned process of its own (gloo, FSDP2, the tiny
Qwen2-shaped model with LoRA adapters on a bfloat16 base), so a rank can be given a working
directory of its own: a checkpoint path relative to it then plays a learner pod's own emptyDir.

- A LoRA checkpoint holds the adapters (and the PPO critic's value head) and nothing of the
  frozen base, which stays bfloat16 in memory while the adapters train in float32; a learner
  resumed from it (the base rebuilt from the model source) holds bit-identical weights, gives
  identical log-probabilities and values, and its next update equals the uninterrupted run's
  (the optimiser state came back too).
- Whether a checkpoint can be loaded is rank 0's decision, the same on every rank: a rank that
  cannot see the directory rank 0 verified (its own volume) fails the load on every rank alike,
  and the ranks stay in step for the next command instead of hanging in a collective.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
from policy_services import free_port

SPEC = """
policy:
  model: tiny
  dtype: float32
  lora: {rank: 4, alpha: 8, baseDtype: bfloat16}
learner:
  algorithm: {type: ppo}
  fsdp: {mixedPrecision: none}
  optimizer: {lr: 0.01}
  loss: {miniBatchSize: 4, microBatchSize: 2, klCoef: 0.0}
"""
CKPT = "checkpoints/iter-000002"
"""Relative: each rank resolves it in its own working directory."""
CANDIDATES = ((11, 12, 13), (14, 15), (16, 17, 18, 19))


def _items() -> list[Any]:
    from aflowrl.learner.batching import ChoiceItem, SequenceItem

    choices = [
        ChoiceItem(prompt=tuple(30 + (7 * i + j) % 40 for j in range(10)), candidates=CANDIDATES,
                   chosen=i % 3)
        for i in range(4)
    ]  # fmt: skip
    sequences = [
        SequenceItem(prompt=tuple(40 + j for j in range(6 + i)), response=(50 + i, 60, 70 + i))
        for i in range(4)
    ]
    return [*choices, *sequences]


def _rows(learner: Any, items: list[Any], sign: float) -> list[Any]:
    from aflowrl.learner.batching import ChoiceItem, TrainRow

    scores = learner.compute_logprobs(items, reference=False, entropies=False, values=True)
    rows = []
    for k, (item, score) in enumerate(zip(items, scores, strict=True)):
        advantage = sign * (1.0 if k % 2 else -1.0)
        rows.append(
            TrainRow(
                item,
                tuple(score.logprobs),
                (advantage,) * len(score.logprobs),
                returns=(0.5 * sign,) * len(score.logprobs),
                old_values=tuple(score.values),
                candidate_old_logprobs=tuple(score.candidates)
                if isinstance(item, ChoiceItem)
                else None,
            )
        )
    return rows


def _fingerprint(learner: Any) -> dict[str, Any]:
    """Log-probs of the probe items, and (rank 0) a digest of every unsharded weight."""
    from aflowrl.learner import checkpoint

    items = _items()
    scores = learner.compute_logprobs(items, reference=False, entropies=False, values=True)
    full = checkpoint.gather_full_state(learner.ctx, learner.policy.module)
    digests = {
        name: hashlib.sha256(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy()
                             .tobytes()).hexdigest()
        for name, t in full.items()
    }  # fmt: skip
    return {
        "logprobs": [list(s.logprobs) for s in scores],
        "candidates": [list(s.candidates) if s.candidates else None for s in scores],
        "values": [list(s.values) for s in scores],
        "weights": digests,
    }


def _load_outcome(learner: Any, path: str) -> str:
    """The error class and message a load raised on this rank, or "loaded"."""
    from aflowrl.errors import AflowRLError

    try:
        learner.load_checkpoint(path)
    except AflowRLError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "loaded"


def _rank(rank: int, port: int, plan: str, dirs: dict[str, str], queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE="2", OMP_NUM_THREADS="1",
    )  # fmt: skip
    try:
        import torch

        from aflowrl.config import RunSpec
        from aflowrl.learner.distributed import init_distributed
        from aflowrl.learner.policy import parameter_bytes
        from aflowrl.learner.worker import Learner

        torch.set_num_threads(1)
        learner = Learner(RunSpec.from_yaml(SPEC, source="test"), init_distributed())
        out: dict[str, Any] = {}
        if plan == "train":
            os.chdir(dirs["shared"])
            params = list(learner.policy.module.named_parameters())
            out["dtypes"] = {
                "trainable": sorted({str(p.dtype) for _, p in params if p.requires_grad}),
                "frozen": sorted({str(p.dtype) for _, p in params if not p.requires_grad}),
            }
            out["trainable"] = sorted(n for n, p in params if p.requires_grad)
            out["bytes"] = parameter_bytes(learner.policy.module)
            items = _items()
            for iteration in range(2):
                learner.train(_rows(learner, items, 1.0), iteration)
            learner.save_checkpoint(CKPT, b"client")
            out["saved"] = _fingerprint(learner)
            learner.train(_rows(learner, items, -1.0), 2)
            out["next"] = _fingerprint(learner)
        else:
            out["fresh"] = _fingerprint(learner)
            # Rank 1's pod has a volume of its own (an emptyDir): rank 0 sees the checkpoint.
            os.chdir(dirs["shared"] if rank == 0 else dirs["own"])
            out["rank1_blind"] = _load_outcome(learner, CKPT)
            # Now rank 0 cannot see it, rank 1 can.
            os.chdir(dirs["own"] if rank == 0 else dirs["shared"])
            out["rank0_blind"] = _load_outcome(learner, CKPT)
            out["after_refusals"] = _fingerprint(learner)  # the ranks are still in step
            os.chdir(dirs["shared"])
            out["shared"] = _load_outcome(learner, CKPT)
            out["resumed"] = _fingerprint(learner)
            learner.train(_rows(learner, _items(), -1.0), 2)
            out["next"] = _fingerprint(learner)
        queue.put((rank, True, out))
    except BaseException:  # the parent reports it
        queue.put((rank, False, traceback.format_exc()))


def _two_ranks(plan: str, dirs: dict[str, str]) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank, args=(rank, port, plan, dirs, queue)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    results: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, ok, result = queue.get(timeout=400)
            if not ok:
                pytest.fail(f"learner rank {rank} failed ({plan}):\n{result}")
            results[rank] = result
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    return [results[0], results[1]]


def _dcp_model_tensors(path: Path) -> dict[str, int]:
    """Name and bytes of every model tensor a DCP checkpoint holds (from its metadata)."""
    import math

    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(path / "dcp")).read_metadata()
    return {
        key.removeprefix("model."): math.prod(meta.size) * meta.properties.dtype.itemsize
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.")
    }


@pytest.mark.timeout(900)
def test_a_lora_checkpoint_holds_the_adapters_and_resumes_exactly_on_two_ranks(tmp_path):
    dirs = {"shared": str(tmp_path / "shared"), "own": str(tmp_path / "rank-own")}
    for path in dirs.values():
        Path(path).mkdir()
    trained = _two_ranks("train", dirs)
    first = trained[0]
    # Frozen base in bfloat16, the adapters in float32; the base is most of the bytes.
    assert first["dtypes"] == {"trainable": ["torch.float32"], "frozen": ["torch.bfloat16"]}
    # The adapters and the critic's value head (on bfloat16 hidden states) are what trains.
    assert {name.split(".")[0] for name in first["trainable"]} == {"lm", "value_head"}
    assert all("lora_" in name for name in first["trainable"] if name.startswith("lm."))
    ckpt = Path(dirs["shared"]) / CKPT
    assert (ckpt / "complete.json").is_file()
    # The checkpoint holds exactly the trained parameters: no frozen weight was saved (not even
    # the tied LM head under its second name), and the adapters' bytes are all it holds.
    saved = _dcp_model_tensors(ckpt)
    assert set(saved) == set(first["trainable"])
    frozen_bytes = sum(rank["bytes"]["frozen"] for rank in trained)
    trained_bytes = sum(rank["bytes"]["trainable"] for rank in trained)
    assert sum(saved.values()) == trained_bytes < frozen_bytes / 10

    resumed = _two_ranks("resume", dirs)
    for rank in resumed:
        assert rank["rank1_blind"].startswith("CorruptCheckpointError"), rank["rank1_blind"]
        assert "rank(s) 1 cannot see it" in rank["rank1_blind"]
        assert rank["rank0_blind"].startswith("CheckpointNotFoundError"), rank["rank0_blind"]
        assert rank["shared"] == "loaded"
    # Both ranks refused alike, and nothing was loaded by a refused attempt.
    assert resumed[0]["rank1_blind"] == resumed[1]["rank1_blind"]
    assert resumed[0]["rank0_blind"] == resumed[1]["rank0_blind"]
    assert resumed[0]["after_refusals"] == resumed[0]["fresh"]
    assert resumed[0]["fresh"]["logprobs"] != first["saved"]["logprobs"]  # training did move it
    # The base rebuilt from the model source plus the saved adapters: the trained policy, exactly.
    assert resumed[0]["resumed"] == first["saved"]
    # And the next update equals the uninterrupted run's (Adam moments and counters restored).
    assert resumed[0]["next"] == first["next"]
