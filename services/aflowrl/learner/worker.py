"""The learner on one rank: scoring, PPO updates, checkpoints and weight export.

:class:`Learner` methods are collective: rank 0 broadcasts a :class:`Command` and every rank runs
it (:func:`follow` is the loop of ranks other than 0). Inputs are validated on rank 0 before the
broadcast, so ranks never disagree about whether to run a command.

Train (per call = one trainer iteration)::

    for epoch in 1..E:                          learner.loss.epochs (1 for a supervised call)
        shuffle rows (seeded by trainer.seed, iteration, epoch: the same on every rank)
        for each mini-batch of M rows:          learner.loss.miniBatchSize
            rank r takes rows[r::world]; micro-batches of m rows each (gradient accumulation)
            loss of each micro-batch weighted by its share of the mini-batch (objective.py)
            clip the global gradient norm, AdamW step at lr(step, iteration)    optim.py
    policy_version += 1
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from aflowrl.config import RunSpec
from aflowrl.errors import AflowRLError
from aflowrl.learner import checkpoint, export
from aflowrl.learner.batching import (
    DUMMY,
    ChoiceItem,
    Item,
    RowOutput,
    SequenceItem,
    TrainRow,
    forward_rows,
    micro_steps,
    rank_share,
)
from aflowrl.learner.distributed import DistContext, all_reduce_sum, broadcast_object
from aflowrl.learner.errors import NoReferenceError, PolicyDivergedError, WeightGroupError
from aflowrl.learner.objective import STAT_NAMES, micro_loss, sft_micro_loss, unit_weight
from aflowrl.learner.optim import learning_rate, make_optimizer
from aflowrl.learner.policy import PolicyModule, build_policy
from aflowrl.models import broadcast, loading, weights
from aflowrl.models.errors import BroadcastBrokenError, TransportUnavailableError
from aflowrl.rl import choice, kl

logger = logging.getLogger(__name__)

_N_LOSS_STATS = 7  # the first STAT_NAMES are losses (weighted like the loss); the rest per token


@dataclass
class Scores:
    """ComputeLogProbs results of one row (lists of floats)."""

    logprobs: list[float]
    entropies: list[float] | None
    values: list[float] | None
    candidates: list[float] | None = None
    """Choice rows: log pi of every candidate."""


class Learner:
    """Policy, optimiser and counters of one rank (see module docstring)."""

    def __init__(self, spec: RunSpec, ctx: DistContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.policy = build_policy(spec, ctx)
        self.optimizer = make_optimizer(self.policy.trainable_parameters(), spec.learner.optimizer)
        self.state = checkpoint.LearnerState()
        self.temperature = spec.rollout.sampling.temperature
        self.critic = spec.learner.algorithm.type == "ppo"
        value = spec.policy.value
        self.value_range = (value.min, value.max) if value.enabled else None
        self.group_store: broadcast.GroupStore | None = None
        """Rank 0: the store weight groups rendezvous on (nccl transport), opened on first use."""
        self.weight_groups: dict[str, broadcast.WeightGroup] = {}
        """Rank 0: the weight groups formed with the rollout replicas (nccl transport), one per
        replica, by replica."""
        self.forming: dict[str, broadcast.Formation] = {}
        """Rank 0: the groups forming now (off the command thread), by replica."""
        self._groups_lock = threading.Lock()
        """Guards ``group_store``, ``weight_groups`` and ``forming``: groups form on threads of
        their own while the command thread broadcasts on (and closes) the formed ones."""
        self._finite_memo: tuple[tuple[tuple[int, int, int], ...], list[str]] | None = None
        """The weights' state (storage and in-place versions per tensor) and its non-finite names
        (:meth:`_nonfinite_local`)."""

    # ---- scoring ---------------------------------------------------------------------------------

    def _micro(self) -> int:
        return self.spec.learner.loss.micro_batch_size

    def score(
        self, module: PolicyModule, items: list[Item], *, entropies: bool, values: bool
    ) -> list[Scores]:
        """Log-probs of every item under ``module``, split over ranks; every rank gets all."""
        ctx = self.ctx
        mine = rank_share(list(range(len(items))), ctx.rank, ctx.world_size)
        results: dict[int, Scores] = {}
        micro = self._micro()
        with torch.no_grad():
            for k in range(micro_steps(len(items), ctx.world_size, micro)):
                index = mine[k * micro : (k + 1) * micro]
                outputs = forward_rows(
                    module,
                    [items[i] for i in index] or [DUMMY],
                    pad_id=self.policy.pad_id,
                    temperature=self.temperature,
                    device=ctx.device,
                    entropy=entropies,
                    values=values,
                )
                for i, out in zip(index, outputs, strict=False):
                    results[i] = _scores(out)
        if ctx.world_size > 1:
            parts: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(parts, results, group=ctx.control)
            for part in parts:
                results.update(part)
        return [results[i] for i in range(len(items))]

    def compute_logprobs(
        self, items: list[Item], *, reference: bool, entropies: bool, values: bool
    ) -> list[Scores]:
        if reference:
            if not self.policy.has_reference:
                raise NoReferenceError(
                    "reference: the learner keeps no reference model (learner.loss.klCoef is 0)"
                )
            with self.policy.reference_mode() as module:
                return self.score(module, items, entropies=entropies, values=False)
        return self.score(self.policy.module, items, entropies=entropies, values=values)

    # ---- training --------------------------------------------------------------------------------

    def _with_reference(self, rows: list[TrainRow]) -> list[TrainRow]:
        """Rows with reference log-probs filled in where the trainer sent none (and, for choice
        rows, the reference's log-probs of every candidate)."""
        missing = [
            i
            for i, r in enumerate(rows)
            if r.ref_logprobs is None
            or (isinstance(r.item, ChoiceItem) and r.ref_candidates is None)
        ]
        if not missing:
            return rows
        scores = self.compute_logprobs(
            [rows[i].item for i in missing], reference=True, entropies=False, values=False
        )
        out = list(rows)
        for i, s in zip(missing, scores, strict=True):
            out[i] = dataclasses.replace(
                rows[i],
                ref_logprobs=rows[i].ref_logprobs or tuple(s.logprobs),
                ref_candidates=tuple(s.candidates) if s.candidates is not None else None,
            )
        return out

    # ---- the start of RL after a supervised phase ------------------------------------------

    def _begin_objective(self, supervised: bool) -> dict[str, float]:
        """Record the objective; at the first RL update after supervised ones, start RL anew.

        Unless ``trainer.warmStart.keepOptimizerState``, the optimiser starts fresh (zero
        moments; the warm-up counts from this update), and a reference that stands for "the
        policy RL starts from" (``policy.referenceModel`` unset) becomes the current weights.
        """
        state = self.state
        objective = "sft" if supervised else "rl"
        events: dict[str, float] = {}
        if objective == "rl" and state.objective == "sft":
            if not self.spec.trainer.warm_start.keep_optimizer_state:
                self.optimizer = make_optimizer(
                    self.policy.trainable_parameters(), self.spec.learner.optimizer
                )
                state.phase_step = 0
                events["charts/optimizer_reset"] = 1.0
            if self.policy.has_reference and self.spec.policy.reference_model is None:
                self.policy.anchor_reference()
                state.reference_anchored = True
                events["charts/reference_anchored"] = 1.0
            logger.info(
                "RL starts after the warm start: %s, reference %s",
                "fresh optimiser" if "charts/optimizer_reset" in events else "optimiser kept",
                "= the warm start" if state.reference_anchored else "unchanged",
            )
        elif objective == "sft" and state.objective == "rl":
            state.phase_step = 0
        state.objective = objective
        return events

    def _order(self, rows: int, iteration: int, epoch: int) -> list[int]:
        seed = (self.spec.trainer.seed * 1_000_003 + iteration * 8191 + epoch) % (2**63 - 1)
        generator = torch.Generator().manual_seed(seed)
        return torch.randperm(rows, generator=generator).tolist()

    def train(
        self, rows: list[TrainRow], iteration: int, *, supervised: bool = False
    ) -> dict[str, float]:
        """One policy update on ``rows`` (module docstring); returns namespaced metrics.

        ``supervised``: the warm start's objective (:func:`objective.sft_micro_loss`).
        """
        started = time.perf_counter()
        ctx, spec = self.ctx, self.spec.learner
        loss_spec = spec.loss
        events = self._begin_objective(supervised)
        if loss_spec.kl_coef > 0 and not supervised:
            rows = self._with_reference(rows)
        module = self.policy.module
        module.train()
        params = self.policy.trainable_parameters()
        value_coef = spec.algorithm.value_loss_coef if spec.algorithm.type == "ppo" else None
        value_clip = spec.algorithm.value_clip if spec.algorithm.type == "ppo" else 0.0
        warm = self.spec.trainer.warm_start
        warm_lr = warm.lr
        warm_value_coef = (
            self.spec.policy.value.loss_coef
            if warm.value_loss_coef is None
            else warm.value_loss_coef
        )
        optimizer_spec = (
            spec.optimizer.model_copy(update={"lr": warm_lr})
            if supervised and warm_lr is not None
            else spec.optimizer
        )
        stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
        grad_norms: list[float] = []
        skipped = 0
        lr = 0.0
        micro = self._micro()
        # A supervised call is one pass (the warm start calls once per trainer.warmStart.epochs).
        epochs = 1 if supervised else loss_spec.epochs
        for epoch in range(epochs):
            order = self._order(len(rows), iteration, epoch)
            for start in range(0, len(rows), loss_spec.mini_batch_size):
                minibatch = [rows[i] for i in order[start : start + loss_spec.mini_batch_size]]
                mb_tokens = sum(r.item.width for r in minibatch)
                width = max(r.item.width for r in minibatch)
                mine = rank_share(minibatch, ctx.rank, ctx.world_size)
                steps = micro_steps(len(minibatch), ctx.world_size, micro)
                for k in range(steps):
                    chunk = mine[k * micro : (k + 1) * micro]
                    # Reduce-scatter after every micro-batch keeps gradients sharded; skipping it
                    # until the last holds the full float32 gradients (accumulateUnsharded...).
                    module.set_requires_gradient_sync(  # type: ignore[operator]
                        k == steps - 1 or not spec.fsdp.accumulate_unsharded_gradients
                    )
                    outputs = forward_rows(
                        module,
                        [r.item for r in chunk] or [DUMMY],
                        pad_id=self.policy.pad_id,
                        temperature=self.temperature,
                        device=ctx.device,
                        entropy=True,
                        values=self.critic and not supervised,
                        entropy_grad=loss_spec.entropy_coef > 0 and not supervised,
                    )
                    if not chunk:  # keeps the collectives of this rank in step, adds nothing
                        torch.autograd.backward(outputs[0].logprobs.sum() * 0.0)
                        continue
                    if supervised:
                        result = sft_micro_loss(
                            outputs,
                            chunk,
                            device=ctx.device,
                            value_range=self.value_range,
                            bins_coef=warm_value_coef,
                        )
                        weight = len(chunk) / len(minibatch)
                    else:
                        result = micro_loss(
                            outputs,
                            chunk,
                            loss_spec,
                            width=width,
                            device=ctx.device,
                            value_coef=value_coef,
                            value_clip=value_clip,
                            value_range=self.value_range,
                            bins_coef=self.spec.policy.value.loss_coef,
                        )
                        weight = unit_weight(
                            loss_spec.loss_agg_mode, chunk, len(minibatch), mb_tokens
                        )
                    torch.autograd.backward(result.loss * (weight * ctx.world_size))
                    token_share = sum(r.item.width for r in chunk) / mb_tokens
                    shares = torch.full((len(STAT_NAMES),), token_share, dtype=torch.float64)
                    shares[:_N_LOSS_STATS] = weight
                    stats += result.stats.cpu() * shares
                grad_norm = _total_norm(
                    torch.nn.utils.clip_grad_norm_(params, spec.optimizer.max_grad_norm)
                )
                lr = learning_rate(
                    optimizer_spec, self.state.phase_step, iteration, self.spec.trainer.iterations
                )
                if math.isfinite(grad_norm):
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    self.optimizer.step()
                    grad_norms.append(grad_norm)
                else:
                    skipped += 1
                    logger.warning(
                        "non-finite gradient norm at step %d: update skipped", self.state.step
                    )
                self.optimizer.zero_grad(set_to_none=True)
                self.state.step += 1
                self.state.phase_step += 1
        steps_taken = len(grad_norms) + skipped
        totals = all_reduce_sum(ctx, stats.to(ctx.device)).cpu() / max(1, steps_taken)
        self.state.policy_version += 1
        self.state.iteration = iteration
        self._nonfinite_local()  # the next push / broadcast / export finds it done
        seconds = time.perf_counter() - started
        tokens = epochs * sum(_forward_tokens(r.item) for r in rows)
        metrics = {name: float(v) for name, v in zip(STAT_NAMES, totals.tolist(), strict=True)}
        metrics.update(events)
        if not supervised and loss_spec.update_diagnostics:
            metrics.update(self._update_diagnostics(rows))
        metrics.update(
            {
                "charts/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else math.nan,
                "charts/lr": lr,
                "charts/skipped_steps": float(skipped),
                "perf/optimizer_steps": float(steps_taken),
                "perf/tokens": float(tokens),
                "perf/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "perf/step_seconds": seconds,
            }
        )
        return metrics

    def _update_diagnostics(self, rows: list[TrainRow]) -> dict[str, float]:
        """What the update did, from one more forward pass over the batch (no gradient).

        Choice rows: the exact KL(pi_old || pi) and TV over their candidates from the behaviour
        policy (``policy/update_*``; rows that carry every candidate's old log-prob) and from the
        reference, the policy RL started from (``policy/start_*``; with a reference), and the
        entropy over candidates; text rows: the k3 estimate on their response tokens. Means over
        rows; ``policy/param_distance`` is ||theta - theta_ref|| / ||theta_ref|| (a reference
        copy or anchored adapters only).
        """
        items = [r.item for r in rows]
        now = self.score(self.policy.module, items, entropies=True, values=False)
        reference: list[Scores] | None = None
        if self.policy.has_reference:
            reference = self.compute_logprobs(items, reference=True, entropies=False, values=False)
        update_kl: list[float] = []
        update_tv: list[float] = []
        start_kl: list[float] = []
        start_tv: list[float] = []
        entropy: list[float] = []
        for k, (row, score) in enumerate(zip(rows, now, strict=True)):
            new = torch.tensor(score.candidates or score.logprobs, dtype=torch.float64)
            if score.entropies:
                entropy.append(float(sum(score.entropies) / len(score.entropies)))
            if score.candidates is not None:
                if row.candidate_old_logprobs:
                    old = torch.tensor(row.candidate_old_logprobs, dtype=torch.float64)
                    update_kl.append(float(choice.categorical_kl(old, new)))
                    update_tv.append(float(choice.total_variation(old, new)))
                if reference is not None and reference[k].candidates is not None:
                    ref = torch.tensor(reference[k].candidates, dtype=torch.float64)
                    start_kl.append(float(choice.categorical_kl(new, ref)))
                    start_tv.append(float(choice.total_variation(new, ref)))
            else:
                old = torch.tensor(row.old_logprobs, dtype=torch.float64)
                update_kl.append(float(kl.kl_penalty(new, old, "low_var_kl").mean()))
                if reference is not None:
                    ref = torch.tensor(reference[k].logprobs, dtype=torch.float64)
                    start_kl.append(float(kl.kl_penalty(new, ref, "low_var_kl").mean()))
        out = {
            "policy/update_kl": _mean(update_kl),
            "policy/update_tv": _mean(update_tv),
            "policy/start_kl": _mean(start_kl),
            "policy/start_tv": _mean(start_tv),
            "policy/entropy": _mean(entropy),
        }
        distance = self._reference_distance()
        if distance is not None:
            out["policy/param_distance"] = distance
        return out

    def _reference_distance(self) -> float | None:
        """||theta - theta_ref|| / ||theta_ref|| over the weights with a reference copy
        (collective: each rank sums its shards)."""
        pairs = self.policy.reference_pairs()
        if not pairs:
            return None
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        with torch.no_grad():
            for param, ref in pairs:
                p, r = _local(param).double(), _local(ref).double()
                sums[0] += (p - r).square().sum()
                sums[1] += r.square().sum()
        sums = all_reduce_sum(self.ctx, sums)
        return float(sums[0].sqrt() / sums[1].sqrt().clamp(min=1e-12))

    # ---- checkpoints and weights -----------------------------------------------------------------

    def save_checkpoint(self, path: str, client_state: bytes) -> float:
        started = time.perf_counter()
        checkpoint.save(
            self.ctx,
            Path(path),
            module=self.policy.module,
            optimizer=self.optimizer,
            state=self.state,
            client_state=client_state,
            reference=self.policy.reference_state() if self.state.reference_anchored else None,
        )
        return time.perf_counter() - started

    def load_checkpoint(self, path: str, min_policy_version: int = 0) -> tuple[bytes, float]:
        """Restore ``path``; the policy version becomes at least ``min_policy_version``.

        The reference comes back as the checkpoint had it: the policy its RL started from when
        it was anchored, else the one the spec names (rebuilt if this learner had anchored its
        own since).
        """
        started = time.perf_counter()
        anchored_here = self.state.reference_anchored
        policy = self.policy

        def reference_slots(_: checkpoint.LearnerState) -> dict[str, torch.Tensor]:
            if policy.reference is None and policy.reference_adapters is None and policy.lora_scale:
                policy.reference_adapters = [
                    p.detach().clone() for p in policy.trainable_parameters()
                ]
            return policy.reference_state()

        state, client_state = checkpoint.load(
            self.ctx,
            Path(path),
            policy.module,
            self.optimizer,
            reference=reference_slots if policy.has_reference else None,
        )
        if anchored_here and not state.reference_anchored and policy.has_reference:
            policy.restore_reference()
        self.state = state
        self.state.policy_version = max(self.state.policy_version, min_policy_version)
        return client_state, time.perf_counter() - started

    # ---- weights leaving the learner (every transport) -----------------------------------------

    @property
    def adapters_only(self) -> bool:
        """With LoRA, updates carry the adapters alone (the rollout applies them)."""
        return bool(self.policy.lora_scale)

    def _named(self) -> Iterator[tuple[str, torch.Tensor]]:
        module = self.policy.module
        yield from module.named_parameters()
        yield from module.named_buffers()

    def weight_specs(self, dtype: str | None, *, merged: bool = False) -> list[weights.TensorSpec]:
        """The manifest entries of :meth:`iter_weights` (no collective)."""
        wire = loading.torch_dtype(dtype) if dtype else None
        if self.adapters_only and not merged:
            return export.adapter_specs(self._named(), wire)
        return export.hf_specs(self._named(), self.policy.hf_shapes, wire)

    def iter_weights(
        self, dtype: str | None, *, merged: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights one tensor at a time (collective: every rank iterates them)."""
        wire = loading.torch_dtype(dtype) if dtype else None
        if self.adapters_only and not merged:
            return export.iter_adapter_tensors(self._named(), dtype=wire)
        return export.iter_hf_tensors(
            self._named(), self.policy.hf_shapes, lora_scale=self.policy.lora_scale, dtype=wire
        )

    def check_finite(self, what: str) -> None:
        """Raise :class:`PolicyDivergedError` on every rank when any rank's weights hold NaN or
        infinity (collective): before any byte of a push, broadcast or export leaves, so no
        replica and no export is ever poisoned. One fused pass over this rank's shards on
        their own device (:func:`~aflowrl.models.weights.nonfinite_names`), one sum over the
        ranks."""
        bad = self._nonfinite_local()
        count = torch.tensor([float(len(bad))], dtype=torch.float64, device=self.ctx.device)
        if int(all_reduce_sum(self.ctx, count).item()) == 0:
            return
        where = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "") if bad else "another rank"
        raise PolicyDivergedError(
            f"the learner's weights (version {self.state.policy_version}) hold NaN or infinity "
            f"({where}): refusing to {what} them (PolicyDiverged); the replicas keep their "
            "previous weights. Restart the run from a checkpoint taken before it diverged, "
            "with a lower learning rate or tighter clipping"
        )

    def _nonfinite_local(self) -> list[str]:
        """This rank's non-finite tensors (:meth:`check_finite`'s local half), computed once per
        state of the weights: a push, a broadcast and an export of one version share one pass,
        and the pass :meth:`train` makes after its optimizer steps takes it off every transfer's
        critical path. The state is each local tensor's storage and in-place version counter
        (bumped by every in-place write, the optimizer's and a checkpoint load's included), so
        a write that changes no policy version is still seen."""
        named = list(self._named())
        with torch.no_grad():  # to_local() outside autograd: the shard itself, no view Function
            local = [(n, _local(t)) for n, t in named]
        # A DTensor counts the writes made through it, its local shard those made to it.
        key = tuple(
            (s.data_ptr(), t._version, s._version)
            for (_, t), (_, s) in zip(named, local, strict=True)
        )
        if self._finite_memo is None or self._finite_memo[0] != key:
            self._finite_memo = (key, weights.nonfinite_names(local))
        return self._finite_memo[1]

    def export(self, path: str | None, dtype: str | None) -> tuple[str, int]:
        """Write the policy as an HF safetensors directory; "" or None = the transport's path.

        The transport's export holds what the rollout loads (the adapters alone with LoRA); an
        explicit ``path`` gets the full model, adapters merged. One shard at a time is held.
        """
        self.check_finite("export")
        transport = self.spec.weight_transport
        version = self.state.policy_version
        target = path or ""
        keep = 0
        if not target:
            if transport.type == "filesystem":
                root, keep = transport.path, transport.keep_versions
            elif transport.type == "nccl":
                root, keep = transport.fallback_path, transport.keep_versions
            else:
                root = str(Path(self.spec.trainer.checkpoint_dir) / "weights")
            target = str(weights.version_dir(root, version))
        merged = bool(path)
        stream = self.iter_weights(dtype, merged=merged)
        nbytes = 0
        try:
            if self.ctx.is_main:
                adapter = self.policy.lora_config if self.adapters_only and not merged else None
                nbytes = weights.write_weights_dir(
                    target,
                    ((n, t.cpu()) for n, t in stream),
                    version=version,
                    model_dir=self.policy.model_dir,
                    adapter_config=adapter,
                )
                if keep:
                    weights.prune_versions(Path(target).parent, keep)
        finally:
            broadcast.drain(stream)  # the other ranks gather to the end, whatever rank 0 did
        return target, nbytes

    def stream_weights(self, dtype: str | None, sink: WeightSink | None) -> int:
        """Feed the current weights to ``sink`` (rank 0); returns the version (collective)."""
        self.check_finite("push")
        version = self.state.policy_version
        stream = self.iter_weights(dtype)
        try:
            if sink is not None:
                manifest = weights.Manifest.of(version, self.weight_specs(dtype))
                sink.stream(manifest, (t.cpu() for _, t in stream))
        finally:
            broadcast.drain(stream)
        return version

    # ---- the nccl transport's group (rank 0) ---------------------------------------------------

    def open_weight_group(
        self, name: str, world_size: int, timeout_s: float, replica: str = ""
    ) -> str:
        """Rank 0: form weight group ``name`` with ``world_size - 1`` workers of ``replica``
        (empty: the group's name), closing that replica's previous group (formed or forming);
        the other replicas' groups are untouched.

        Not a collective of the learner's ranks: it runs on the caller's thread, never the
        command thread, and ends within ``timeout_s`` (:class:`~aflowrl.models.broadcast.
        Formation`): a member that never arrives costs this group's deadline, while Train,
        broadcasts on the other groups and CloseWeightGroup go on.
        """
        transport = self.spec.weight_transport
        if transport.type != "nccl":
            raise TransportUnavailableError("weightTransport.type is not 'nccl'")
        replica = replica or name
        with self._groups_lock:
            previous = self.weight_groups.pop(replica, None)
            superseded = self.forming.pop(replica, None)
            if self.group_store is None:
                self.group_store = broadcast.GroupStore(transport.port, transport.timeout_s)
            # A store client of its own (no store= here): a client's blocking wait for this
            # group's members would hold up every other group's rendezvous on a shared one.
            rendezvous = broadcast.Rendezvous(
                "127.0.0.1", transport.port, name, 0, world_size, timeout_s
            )
            formation = broadcast.Formation(rendezvous, self.ctx.device)
            self.forming[replica] = formation
        if superseded is not None:
            superseded.cancel()
        if previous is not None:
            previous.close()
        try:
            group = formation.wait()
        finally:
            with self._groups_lock:
                if self.forming.get(replica) is formation:
                    del self.forming[replica]
        with self._groups_lock:
            cancelled = formation.cancelled
            if not cancelled:
                self.weight_groups[replica] = group
        if cancelled:  # closed or re-formed while it formed
            group.close()
            raise BroadcastBrokenError(f"weight group {name} was closed while it formed")
        logger.info(
            "weight group %s of %s formed: %d members (%s)",
            name,
            replica,
            world_size,
            group.backend,
        )
        return group.backend

    def close_weight_group(self, name: str | None, *, forming_only: bool = False) -> None:
        """Rank 0: leave group ``name`` (None: every group), formed or still forming
        (``forming_only``: give up a forming one only)."""
        closing: list[broadcast.WeightGroup | broadcast.Formation] = []
        with self._groups_lock:
            for replica, group in list(self.weight_groups.items()):
                if not forming_only and (name is None or group.name == name):
                    closing.append(self.weight_groups.pop(replica))
            for replica, formation in list(self.forming.items()):
                if name is None or formation.name == name:
                    closing.append(self.forming.pop(replica))
        for item in closing:
            if isinstance(item, broadcast.Formation):
                item.cancel()
            else:
                item.close()

    def weight_group(self, name: str) -> broadcast.WeightGroup | None:
        """Rank 0: the open (formed) group ``name``, if any."""
        with self._groups_lock:
            return next((g for g in self.weight_groups.values() if g.name == name), None)

    def weight_group_names(self) -> list[str]:
        """Rank 0: the names of the formed groups."""
        with self._groups_lock:
            return sorted(g.name for g in self.weight_groups.values())

    def broadcast_weights(
        self, names: tuple[str, ...], bucket_bytes: int, dtype: str | None
    ) -> broadcast.BroadcastResult:
        """Every rank gathers; rank 0 broadcasts to the weight groups ``names`` at once
        (collective). A group that breaks off (or is not open) is closed and named in the
        result's ``broken``; the others get the whole version."""
        version = self.state.policy_version
        try:
            self.check_finite("broadcast")
        except PolicyDivergedError:
            if self.ctx.is_main:  # the receivers wait for a header: it says "refused"
                named = [g for g in map(self.weight_group, names) if g is not None]
                if named:
                    broadcast.send_refusal(named, version)
            raise
        stream = self.iter_weights(dtype)
        try:
            if not self.ctx.is_main:
                return broadcast.BroadcastResult(weights.Manifest.of(version, []), 0, 0)
            groups: list[broadcast.WeightGroup] = []
            missing: dict[str, str] = {}
            for name in names:
                group = self.weight_group(name)
                if group is None:
                    missing[name] = f"weight group {name!r} is not open on the learner"
                else:
                    groups.append(group)
            if not groups:
                raise WeightGroupError(
                    "; ".join(missing.values()) or "no weight group named to broadcast on"
                )
            try:
                result = broadcast.send_weights(
                    groups, version, stream, self.weight_specs(dtype), bucket_bytes
                )
            except (RuntimeError, BroadcastBrokenError) as exc:
                # Closing makes every member still waiting on a group fail at once.
                for group in groups:
                    self.close_weight_group(group.name)
                raise BroadcastBrokenError(
                    f"the broadcast of version {version} broke off: {exc}"
                ) from exc
            for name in result.broken:
                self.close_weight_group(name)  # aborted already: forget it
            return dataclasses.replace(result, broken={**result.broken, **missing})
        finally:
            broadcast.drain(stream)


class WeightSink(Protocol):
    """Where rank 0 streams the weights of a push (:class:`~aflowrl.learner.push.PushSink`)."""

    def stream(self, manifest: weights.Manifest, tensors: Iterator[torch.Tensor]) -> None:
        """Consume ``tensors`` (CPU, manifest order) as far as anyone wants them."""


def _scores(out: RowOutput) -> Scores:
    return Scores(
        out.logprobs.float().cpu().tolist(),
        out.entropy.float().cpu().tolist() if out.entropy is not None else None,
        out.values.float().cpu().tolist() if out.values is not None else None,
        out.candidates.float().cpu().tolist() if out.candidates is not None else None,
    )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (possibly sharded) tensor."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _forward_tokens(item: Item) -> int:
    branches = (item.response,) if isinstance(item, SequenceItem) else item.candidates
    return sum(len(item.prompt) + len(c) for c in (*branches, *item.value_bins))


def _total_norm(norm: torch.Tensor) -> float:
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)


# ---- commands rank 0 broadcasts -----------------------------------------------------------------


class Command(abc.ABC):
    """A collective call: rank 0 broadcasts it, every rank runs it; rank 0's result is kept."""

    @abc.abstractmethod
    def run(self, learner: Learner) -> Any: ...


@dataclass(frozen=True)
class ComputeLogProbsCommand(Command):
    items: list[Item]
    reference: bool
    entropies: bool
    values: bool

    def run(self, learner: Learner) -> tuple[list[Scores], int]:
        """(scores, the policy version they were computed with; 0 for the reference)."""
        scores = learner.compute_logprobs(
            self.items, reference=self.reference, entropies=self.entropies, values=self.values
        )
        return scores, 0 if self.reference else learner.state.policy_version


@dataclass(frozen=True)
class TrainCommand(Command):
    rows: list[TrainRow]
    iteration: int
    supervised: bool = False

    def run(self, learner: Learner) -> tuple[dict[str, float], int]:
        """(metrics, the policy version after the update)."""
        metrics = learner.train(self.rows, self.iteration, supervised=self.supervised)
        return metrics, learner.state.policy_version


@dataclass(frozen=True)
class SaveCommand(Command):
    path: str
    client_state: bytes

    def run(self, learner: Learner) -> float:
        return learner.save_checkpoint(self.path, self.client_state)


@dataclass(frozen=True)
class LoadCommand(Command):
    path: str
    min_policy_version: int = 0

    def run(self, learner: Learner) -> tuple[bytes, float]:
        return learner.load_checkpoint(self.path, self.min_policy_version)


@dataclass(frozen=True)
class StreamWeightsCommand(Command):
    """Every rank gathers the weights; rank 0 feeds them to its local ``sink`` (grpc push)."""

    dtype: str | None
    sink: WeightSink | None = field(default=None, compare=False)
    """Rank 0's consumer; never sent to the other ranks."""

    def __getstate__(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "sink": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    def run(self, learner: Learner) -> int:
        """The version streamed."""
        return learner.stream_weights(self.dtype, self.sink)


@dataclass(frozen=True)
class BroadcastWeightsCommand(Command):
    groups: tuple[str, ...]
    bucket_bytes: int
    dtype: str | None

    def run(self, learner: Learner) -> broadcast.BroadcastResult:
        return learner.broadcast_weights(self.groups, self.bucket_bytes, self.dtype)


@dataclass(frozen=True)
class ExportCommand(Command):
    path: str | None
    dtype: str | None

    def run(self, learner: Learner) -> tuple[str, int, int]:
        """(directory, bytes written, policy version exported)."""
        path, nbytes = learner.export(self.path, self.dtype)
        return path, nbytes, learner.state.policy_version


@dataclass(frozen=True)
class HeartbeatCommand(Command):
    """Sent by an idle rank 0 (:data:`~aflowrl.learner.distributed.HEARTBEAT_FRACTION`): the
    other ranks' wait on the control group ends before its timeout."""

    def run(self, learner: Learner) -> None:
        return None


@dataclass(frozen=True)
class StopCommand(Command):
    """Ends :func:`follow` on the other ranks."""

    def run(self, learner: Learner) -> None:
        return None


def lead(learner: Learner, command: Command) -> Any:
    """Rank 0: broadcast ``command`` and run it here too."""
    broadcast_object(learner.ctx, command)
    return command.run(learner)


def follow(learner: Learner) -> None:
    """Ranks > 0: run rank 0's commands until it sends :class:`StopCommand`.

    A domain error (bad input found by every rank alike, before any collective) is logged and the
    loop goes on, as rank 0 answers it to its caller; anything else ends this rank, and torchrun
    then stops the others.
    """
    while True:
        command = broadcast_object(learner.ctx)
        if isinstance(command, StopCommand):
            return
        try:
            command.run(learner)
        except AflowRLError as exc:
            logger.info("%s refused on rank %d: %s", type(command).__name__, learner.ctx.rank, exc)
