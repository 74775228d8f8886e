"""The policy's decisions for a batch of observations: one rollout call for all active episodes.

- **choice mode** (:class:`ChoiceActor`): one ``ScoreCandidates`` call scores, after the
  observation, every reply the observation allows: ``<action>{k}</action>`` for each numbered
  admissible action k; the action is sampled from the softmax over the candidates' summed token
  log-probabilities (Carta et al., 2023, arXiv 2302.02662), log pi_k = ll_k - logsumexp_j ll_j,
  and log pi(chosen) is the behaviour log-probability the learner's ``rl.choice`` recomputes.
  The environment gets that same reply. Scoring the numbered replies rather than the actions'
  texts keeps the candidates the same length (up to 9 actions: one digit each), so a summed
  log-likelihood is not a length penalty: a fresh small model starts near uniform over the
  actions (it explores) instead of always taking the shortest text. The numbering follows the
  environment's enumeration order, which groups actions by family, so a number carries meaning.
- **text mode** (:class:`TextActor`): one ``Generate`` call samples a reply per observation,
  seeded by (run seed, iteration, step).
- :class:`UniformActor`: uniform over the admissible actions, no model (the random baseline of
  ``bench/learning.py``); its decisions are not trainable.

The prompt is the system message ``aflowrl optimize``'s proposers use plus the observation
text, rendered by the rollout with the policy's chat template. Batches are split over the
rollout replicas (contiguous shares, in parallel); a replica that is unavailable hands its
share to the next. Sampling uses the trainer's generator, so a run is reproducible. Called by
:mod:`aflowrl.trainer.loop`.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
from grpc import aio

from aflowrl._proto.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel
from aflowrl.config import RunSpec
from aflowrl.search.proposers import SYSTEM_PROMPT
from aflowrl.trainer.errors import NoReplicaError
from aflowrl.trainer.rows import Decision
from aflowrl.trainer.weight_sync import replica_targets

logger = logging.getLogger(__name__)

T = TypeVar("T")


def choice_response(index: int) -> str:
    """The reply choosing listed action ``index`` (0-based): scored, then sent to Step."""
    return f"<action>{index + 1}</action>"


def text_response(action: str) -> str:
    """A text-mode reply writing ``action`` out."""
    return f"<action>{action}</action>"


def prompt_of(observation: str) -> common_pb2.Prompt:
    """The chat prompt of an observation."""
    return common_pb2.Prompt(
        chat=common_pb2.ChatMessages(
            messages=[
                common_pb2.ChatMessage(role="system", content=SYSTEM_PROMPT),
                common_pb2.ChatMessage(role="user", content=observation),
            ]
        )
    )


def choice_distribution(candidate_logprobs: Sequence[Sequence[float]]) -> np.ndarray:
    """log pi_k = ll_k - logsumexp_j ll_j, with ll_k the sum of candidate k's token log-probs."""
    ll = np.array([math.fsum(values) for values in candidate_logprobs], dtype=np.float64)
    top = float(ll.max())
    return ll - (top + math.log(float(np.exp(ll - top).sum())))


@dataclass(frozen=True)
class Observed:
    """What an actor needs of an active episode."""

    text: str
    admissible: tuple[str, ...]


class RolloutClient:
    """The rollout replicas behind a target; batches split over them."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: ChannelOptions | None = None,
        resolve: Callable[[str], list[str]] = replica_targets,
    ) -> None:
        self.target = target
        self.options = options or ChannelOptions(timeout_s=600.0)
        self._resolve = resolve
        self._stubs: dict[str, Any] = {}
        self._channels: dict[str, aio.Channel] = {}

    def refresh(self) -> list[str]:
        """Re-resolve the replicas (a headless Service's pods)."""
        targets = self._resolve(self.target) if isinstance(self.target, str) else self.target
        addresses = sorted(set(targets))
        for address in addresses:
            if address not in self._stubs:
                channel = make_channel(address, self.options)
                self._channels[address] = channel
                self._stubs[address] = rollout_pb2_grpc.RolloutServiceStub(channel)
        return addresses

    @property
    def addresses(self) -> list[str]:
        return sorted(self._stubs) if self._stubs else self.refresh()

    async def _on_replicas(
        self, shares: int, invoke: Callable[[Any, int], Awaitable[T]], what: str
    ) -> list[T]:
        """``invoke(stub, share)`` for every share, share k first on replica k (mod n)."""
        addresses = self.addresses

        async def one(share: int) -> T:
            errors = []
            for attempt in range(len(addresses)):
                address = addresses[(share + attempt) % len(addresses)]
                try:
                    return await invoke(self._stubs[address], share)
                except aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise error_from_rpc(exc, f"rollout {what} on {address}") from exc
                    errors.append(f"{address}: {exc.details()}")
                    logger.warning("rollout replica %s unavailable: %s", address, exc.details())
            raise NoReplicaError(f"rollout {what}: no replica answered ({'; '.join(errors)})")

        return list(await asyncio.gather(*(one(k) for k in range(shares))))

    def _split(self, count: int) -> list[range]:
        shares = max(1, min(count, len(self.addresses)))
        bounds = np.linspace(0, count, shares + 1).round().astype(int)
        return [range(int(a), int(b)) for a, b in itertools.pairwise(bounds)]

    async def score(
        self, items: Sequence[rollout_pb2.CandidateSet]
    ) -> list[tuple[rollout_pb2.CandidateScores, int]]:
        """Candidate scores of every item, with the weight version that scored it."""
        parts = self._split(len(items))

        async def invoke(stub: Any, share: int) -> rollout_pb2.ScoreCandidatesResponse:
            request = rollout_pb2.ScoreCandidatesRequest(items=[items[i] for i in parts[share]])
            response: rollout_pb2.ScoreCandidatesResponse = await stub.ScoreCandidates(request)
            return response

        responses = await self._on_replicas(len(parts), invoke, "ScoreCandidates")
        return [(item, int(r.weight_version)) for r in responses for item in r.items]

    async def generate(
        self, prompts: Sequence[common_pb2.Prompt], sampling: rollout_pb2.SamplingParams
    ) -> list[tuple[rollout_pb2.PromptCompletions, int]]:
        """One completion list per prompt, with the weight version that generated it."""
        parts = self._split(len(prompts))

        async def invoke(stub: Any, share: int) -> rollout_pb2.GenerateResponse:
            request = rollout_pb2.GenerateRequest(
                prompts=[prompts[i] for i in parts[share]], sampling=sampling
            )
            response: rollout_pb2.GenerateResponse = await stub.Generate(request)
            return response

        responses = await self._on_replicas(len(parts), invoke, "Generate")
        return [(result, int(r.weight_version)) for r in responses for result in r.results]

    async def versions(self) -> dict[str, int]:
        """The weight version each replica serves."""

        async def one(address: str) -> int:
            try:
                reply = await self._stubs[address].Status(
                    rollout_pb2.RolloutStatusRequest(), timeout=30.0
                )
            except aio.AioRpcError as exc:
                raise error_from_rpc(exc, f"rollout Status on {address}") from exc
            return int(reply.weight_version)

        addresses = self.addresses
        return dict(zip(addresses, await asyncio.gather(*(one(a) for a in addresses)), strict=True))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()


class Actor(abc.ABC):
    """Turns observations into decisions."""

    @abc.abstractmethod
    async def act(
        self, observed: Sequence[Observed], *, rng: np.random.Generator, seed: int
    ) -> list[Decision]:
        """One decision per observation; ``rng`` samples choices, ``seed`` seeds generation."""


class ChoiceActor(Actor):
    """Scores the admissible actions with the policy and samples one (module docstring)."""

    def __init__(self, rollout: RolloutClient) -> None:
        self.rollout = rollout

    async def act(
        self, observed: Sequence[Observed], *, rng: np.random.Generator, seed: int
    ) -> list[Decision]:
        scorable = [i for i, o in enumerate(observed) if o.admissible]
        items = [
            rollout_pb2.CandidateSet(
                prompt=prompt_of(observed[i].text),
                candidates=[choice_response(k) for k in range(len(observed[i].admissible))],
            )
            for i in scorable
        ]
        scored = dict(zip(scorable, await self.rollout.score(items) if items else [], strict=True))
        decisions: list[Decision] = []
        for i in range(len(observed)):
            if i not in scored:  # nothing to choose from: the environment will call it invalid
                decisions.append(Decision(action=choice_response(0)))
                continue
            scores, version = scored[i]
            log_pi = choice_distribution([list(c.values) for c in scores.candidate_logprobs])
            probabilities = np.exp(log_pi)
            chosen = int(rng.choice(len(probabilities), p=probabilities / probabilities.sum()))
            decisions.append(
                Decision(
                    action=choice_response(chosen),
                    prompt_ids=tuple(scores.prompt_token_ids),
                    candidate_ids=tuple(tuple(c.ids) for c in scores.candidate_token_ids),
                    chosen=chosen,
                    logprobs=(float(log_pi[chosen]),),
                    version=version,
                )
            )
        return decisions


class TextActor(Actor):
    """Samples a reply per observation with ``rollout.sampling`` (module docstring)."""

    def __init__(self, rollout: RolloutClient, spec: RunSpec) -> None:
        self.rollout = rollout
        self.sampling = spec.rollout.sampling

    async def act(
        self, observed: Sequence[Observed], *, rng: np.random.Generator, seed: int
    ) -> list[Decision]:
        sampling = rollout_pb2.SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            max_tokens=self.sampling.max_tokens,
            stop=list(self.sampling.stop),
            n=1,
            seed=seed,
            logprobs=True,
        )
        results = await self.rollout.generate([prompt_of(o.text) for o in observed], sampling)
        decisions = []
        for result, version in results:
            completion = result.completions[0]
            decisions.append(
                Decision(
                    action=completion.text,
                    prompt_ids=tuple(result.prompt_token_ids),
                    response_ids=tuple(completion.token_ids),
                    logprobs=tuple(completion.logprobs),
                    version=version,
                )
            )
        return decisions


class UniformActor(Actor):
    """Uniform over the admissible actions; no model, nothing to train."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def act(
        self, observed: Sequence[Observed], *, rng: np.random.Generator, seed: int
    ) -> list[Decision]:
        decisions = []
        for o in observed:
            k = int(rng.integers(len(o.admissible))) if o.admissible else 0
            if self.mode == "choice" or not o.admissible:
                action = choice_response(k)
            else:
                action = text_response(o.admissible[k])
            decisions.append(Decision(action=action))
        return decisions
