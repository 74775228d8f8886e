"""Typed calls to the LearnerService: step rows in, log-probs and training metrics out.

A row's decision becomes a ``Sequence`` (text mode: prompt and response tokens) or a
``ChoiceDecision`` (choice mode: prompt, every candidate's tokens, the chosen index), so the
learner scores exactly what the rollout scored. ``Train`` is never retried (it would train
twice); the idempotent calls are retried by the channel. Used by :mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from grpc import aio

from aflowrl._proto.v1 import common_pb2, learner_pb2, learner_pb2_grpc
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel
from aflowrl.trainer.rows import Decision

T = TypeVar("T")


@dataclass(frozen=True)
class Scored:
    """ComputeLogProbs results, one list per row."""

    logprobs: list[list[float]]
    values: list[list[float]] | None
    policy_version: int


@dataclass(frozen=True)
class TrainRow:
    """One training sample, everything as wide as its decision."""

    decision: Decision
    old_logprobs: Sequence[float]
    advantages: Sequence[float]
    ref_logprobs: Sequence[float] = ()
    returns: Sequence[float] = ()
    old_values: Sequence[float] = ()


def _sequence(decision: Decision) -> learner_pb2.Sequence:
    return learner_pb2.Sequence(
        prompt_token_ids=decision.prompt_ids, response_token_ids=decision.response_ids
    )


def _choice(decision: Decision) -> learner_pb2.ChoiceDecision:
    return learner_pb2.ChoiceDecision(
        prompt_token_ids=decision.prompt_ids,
        candidate_token_ids=[common_pb2.TokenIds(ids=c) for c in decision.candidate_ids],
        chosen=decision.chosen,
    )


class LearnerClient:
    """The learner's rank 0 (module docstring)."""

    def __init__(self, target: str, *, options: ChannelOptions | None = None) -> None:
        self.target = target
        self.channel = make_channel(target, options or ChannelOptions(timeout_s=1800.0))
        self._stub: Any = learner_pb2_grpc.LearnerServiceStub(self.channel)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        """Await ``call``; a failure becomes the domain error of its status (``what`` failed)."""
        try:
            return await call
        except aio.AioRpcError as exc:
            raise error_from_rpc(exc, f"learner {what} ({self.target})") from exc

    async def status(self) -> learner_pb2.LearnerStatusResponse:
        request = learner_pb2.LearnerStatusRequest()
        return await self._call("Status", self._stub.Status(request, timeout=60.0))

    async def compute_logprobs(
        self, decisions: Sequence[Decision], *, reference: bool = False, values: bool = False
    ) -> Scored:
        """Log-probs (and critic values) of every decision; choice rows get one value each."""
        request = learner_pb2.ComputeLogProbsRequest(reference=reference, values=values)
        request.sequences.extend(_sequence(d) for d in decisions if not d.is_choice)
        request.choices.extend(_choice(d) for d in decisions if d.is_choice)
        kind = "reference" if reference else "policy"
        reply: learner_pb2.ComputeLogProbsResponse = await self._call(
            f"ComputeLogProbs of the {kind}", self._stub.ComputeLogProbs(request)
        )
        # Replies come sequences first, then choices: put them back in the decisions' order.
        order = [i for i, d in enumerate(decisions) if not d.is_choice] + [
            i for i, d in enumerate(decisions) if d.is_choice
        ]
        logprobs: list[list[float]] = [[] for _ in decisions]
        out_values: list[list[float]] | None = [[] for _ in decisions] if values else None
        for k, i in enumerate(order):
            logprobs[i] = list(reply.logprobs[k].values)
            if out_values is not None:
                out_values[i] = list(reply.values[k].values)
        return Scored(logprobs, out_values, int(reply.policy_version))

    async def train(self, rows: Sequence[TrainRow], iteration: int) -> tuple[dict[str, float], int]:
        """One policy update; returns (namespaced metrics, the new policy version)."""
        request = learner_pb2.TrainRequest(iteration=iteration)
        for row in rows:
            sample = request.samples.add()
            if row.decision.is_choice:
                sample.choice.CopyFrom(_choice(row.decision))
            else:
                sample.sequence.CopyFrom(_sequence(row.decision))
            sample.old_logprobs.extend(row.old_logprobs)
            sample.advantages.extend(row.advantages)
            sample.ref_logprobs.extend(row.ref_logprobs)
            sample.returns.extend(row.returns)
            sample.old_values.extend(row.old_values)
        reply: learner_pb2.TrainResponse = await self._call(
            f"Train of iteration {iteration}", self._stub.Train(request)
        )
        return dict(reply.metrics.values), int(reply.policy_version)

    async def save(self, path: str, client_state: bytes) -> learner_pb2.CheckpointResponse:
        request = learner_pb2.SaveCheckpointRequest(path=path, client_state=client_state)
        return await self._call(f"SaveCheckpoint {path}", self._stub.SaveCheckpoint(request))

    async def load(
        self, path: str, *, min_policy_version: int = 0
    ) -> learner_pb2.CheckpointResponse:
        request = learner_pb2.LoadCheckpointRequest(
            path=path, min_policy_version=min_policy_version
        )
        return await self._call(f"LoadCheckpoint {path}", self._stub.LoadCheckpoint(request))

    async def close(self) -> None:
        await self.channel.close()
