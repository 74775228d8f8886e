"""Learner checkpoints with torch.distributed.checkpoint, and full-weight gathering.

A checkpoint directory holds::

    dcp/                 sharded state of the trained parameters and the optimiser, and the
                         reference once it is the policy RL started from (DCP; reloads on
                         another world size). Frozen weights (a LoRA base) are not saved: a
                         resumed learner rebuilds them from policy.model, as at its start.
    learner_state.json   step, policy version, schedule position (rank 0)
    client_state.bin     opaque bytes the trainer stored with it (rank 0)
    rng-rank{r}.pt       each rank's torch (and CUDA), Python and numpy RNG states
    complete.json        written last by rank 0: a directory without it is partial

Saving and loading are collective: every rank calls them. Exact resume: weights, Adam moments,
step counters and RNG are restored bit-identically, so the next step equals an uninterrupted run.
Whether a directory can be loaded is decided once, by rank 0, and broadcast: ranks that judged
it each on their own could part ways (one loading, another refusing) and hang the collectives.
Every rank must see the directory rank 0 wrote (one volume shared by every learner pod); a rank
that does not fails the load on every rank alike.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from aflowrl.learner.distributed import DistContext, barrier, broadcast_object, gather_all
from aflowrl.learner.errors import CheckpointNotFoundError, CorruptCheckpointError

logger = logging.getLogger(__name__)

COMPLETE = "complete.json"

TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True, strict=False)
"""The model's state in a checkpoint: the parameters that train (every one without LoRA, the
adapters and a value head with it); frozen ones come from the model directory. Not strict on
load, since the frozen weights are missing on purpose."""


def _trained_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model and optimiser state a checkpoint holds (:data:`TRAINED_ONLY`).

    ``ignore_frozen_params`` drops a frozen parameter under one name only: a tied one (the LM
    head of a model with tied embeddings) would stay under its other name, so every name of a
    frozen parameter is dropped here."""
    model_sd, optim_sd = get_state_dict(module, optimizer, options=TRAINED_ONLY)
    for name, param in module.named_parameters(remove_duplicate=False):
        if not param.requires_grad:
            model_sd.pop(name, None)
    return {"model": model_sd, "optim": optim_sd}


@dataclass
class LearnerState:
    """Counters saved with the weights."""

    step: int = 0
    """Optimiser steps taken."""
    policy_version: int = 0
    """Train calls so far (plus the restored version)."""
    iteration: int = 0
    """Last trainer iteration trained on (the schedule's position)."""
    objective: str = ""
    """Objective of the last update: "sft" (warm start), "rl", or "" before any."""
    phase_step: int = 0
    """Optimiser steps since the optimiser started afresh (the warm-up counts these)."""
    reference_anchored: bool = False
    """The reference is the policy RL started from (saved in the checkpoint), not the one the
    spec names."""


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.random.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.random.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    ctx: DistContext,
    path: Path,
    *,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: LearnerState,
    client_state: bytes,
    reference: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write a checkpoint of this learner to ``path`` (collective); ``reference``: the anchored
    reference's tensors, saved beside the model."""
    if ctx.is_main:
        path.mkdir(parents=True, exist_ok=True)
        (path / COMPLETE).unlink(missing_ok=True)
    barrier(ctx)
    bundle = _trained_state(module, optimizer)
    if reference:
        bundle["reference"] = reference
    dcp.save(bundle, checkpoint_id=str(path / "dcp"))  # type: ignore[attr-defined]
    torch.save(_rng_state(), path / f"rng-rank{ctx.rank}.pt")
    if ctx.is_main:
        (path / "learner_state.json").write_text(json.dumps(state.__dict__))
        (path / "client_state.bin").write_bytes(client_state)
    barrier(ctx)
    if ctx.is_main:
        tmp = path / f".{COMPLETE}.tmp"
        tmp.write_text(json.dumps({"world_size": ctx.world_size, **state.__dict__}))
        os.replace(tmp, path / COMPLETE)


def verify(path: Path) -> LearnerState:
    """Check a checkpoint directory before anything is loaded from it; its learner state.

    Raises :class:`CheckpointNotFoundError` (no complete checkpoint there) or
    :class:`CorruptCheckpointError` (a file missing, unreadable or shorter than the DCP metadata
    says: a truncated shard, a missing ``.metadata``), so a load that cannot succeed is refused
    before it touches the model (a failure inside the collective load would leave the ranks'
    weights half overwritten). Reads only metadata and file sizes.
    """
    if not (path / COMPLETE).is_file():
        what = "is partial (no complete.json)" if path.is_dir() else "does not exist"
        raise CheckpointNotFoundError(f"path: checkpoint {path} {what}")

    def corrupt(why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint {path} is corrupt: {why}", field="path")

    try:
        fields = json.loads((path / "learner_state.json").read_text())
        state = LearnerState(**fields) if isinstance(fields, dict) else None
    except (OSError, ValueError, TypeError) as exc:
        raise corrupt(f"learner_state.json: {exc}") from None
    if state is None:
        raise corrupt("learner_state.json is not an object")
    if not (path / "client_state.bin").is_file():
        raise corrupt("client_state.bin is missing")
    shards = path / "dcp"
    try:
        metadata = dcp.FileSystemReader(str(shards)).read_metadata()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata is a corrupt checkpoint
        raise corrupt(f"dcp/.metadata cannot be read ({type(exc).__name__}: {exc})") from None
    ends: dict[str, int] = {}
    for info in getattr(metadata, "storage_data", {}).values():
        name = str(info.relative_path)
        ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    for name, end in sorted(ends.items()):
        try:
            size = (shards / name).stat().st_size
        except OSError as exc:
            raise corrupt(f"dcp/{name}: {exc.strerror or exc}") from None
        if size < end:
            raise corrupt(f"dcp/{name} holds {size} bytes, its metadata needs {end} (truncated)")
    return state


def load(
    ctx: DistContext,
    path: Path,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    reference: Callable[[LearnerState], dict[str, torch.Tensor]] | None = None,
) -> tuple[LearnerState, bytes]:
    """Restore a checkpoint written by :func:`save` (collective); returns (state, client_state).

    ``reference(state)`` gives the tensors to fill with a saved reference (empty: none saved).
    Rank 0 decides whether ``path`` can be loaded (:func:`verify`) and every rank follows
    (:func:`_agree`), so either every rank loads or every rank raises the same error.
    """
    state = _agree(ctx, path)
    bundle = _trained_state(module, optimizer)
    if state.reference_anchored and reference is not None:
        bundle["reference"] = reference(state)
    try:
        dcp.load(bundle, checkpoint_id=str(path / "dcp"))  # type: ignore[attr-defined]
    except CheckpointException as exc:  # a BaseException: made an Exception the service answers
        raise RuntimeError(f"loading checkpoint {path} failed: {exc}") from None
    set_state_dict(
        module,
        optimizer,
        model_state_dict=bundle["model"],
        optim_state_dict=bundle["optim"],
        options=TRAINED_ONLY,
    )
    rng_file = path / f"rng-rank{ctx.rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        logger.warning("%s missing (saved with another world size): RNG not restored", rng_file)
    client_state = (path / "client_state.bin").read_bytes()
    barrier(ctx)
    return state, client_state


def _agree(ctx: DistContext, path: Path) -> LearnerState:
    """Rank 0's verdict on ``path`` (:func:`verify`), the same on every rank (collective).

    Then every rank checks that it sees the ``complete.json`` rank 0 saw: a learner whose
    pods checkpoint to volumes of their own (an emptyDir each) would otherwise load rank 0's
    shards on rank 0 and nothing, or an older checkpoint, elsewhere. Raises the same
    :class:`CheckpointNotFoundError` / :class:`CorruptCheckpointError` on every rank.
    """
    verdict: LearnerState | Exception
    if ctx.is_main:
        try:
            verdict = verify(path)
        except (CheckpointNotFoundError, CorruptCheckpointError) as exc:
            verdict = exc
    else:
        verdict = CheckpointNotFoundError("")  # replaced by rank 0's
    verdict = broadcast_object(ctx, verdict)
    if isinstance(verdict, Exception):
        raise verdict
    seen = (path / COMPLETE).is_file()
    blind = [rank for rank, ok in enumerate(gather_all(ctx, seen)) if not ok]
    if blind:
        raise CorruptCheckpointError(
            f"checkpoint {path} is complete on rank 0 but learner rank(s) "
            f"{', '.join(map(str, blind))} cannot see it: every learner pod must mount the same "
            "volume at trainer.checkpointDir (storage.size, accessMode ReadWriteMany)",
            field="path",
        )
    return verdict


def gather_full_state(ctx: DistContext, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on rank 0, in host memory (empty elsewhere; collective).

    Tensors are private copies: training may go on while they are streamed.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = get_model_state_dict(module, options=options)
    if not ctx.is_main:
        return {}
    shares_params = ctx.device.type == "cpu" and ctx.world_size == 1
    return {k: (v.clone() if shares_params else v) for k, v in state.items()}
