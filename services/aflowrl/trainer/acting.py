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
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from aflowrl._proto.v1 import common_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.search.proposers import SYSTEM_PROMPT
from aflowrl.trainer.clients import RolloutClient
from aflowrl.trainer.rows import Decision

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
