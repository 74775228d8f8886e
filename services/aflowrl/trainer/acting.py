"""The policy's decisions for a batch of observations: one rollout call for all active episodes.

- **choice mode** (:class:`ChoiceActor`): one ``ScoreCandidates`` call scores, after the
  observation, the reply of every admissible action, ``<action>{action}</action>``, and (when
  ``policy.value`` is on) the value replies ``<value>0`` ... ``<value>9``
  (:mod:`aflowrl.search.encoding`: the one encoding training, ``aflowrl optimize --proposer
  policy`` and the learning bench share). The action is sampled from the softmax over the
  actions' length-normalised log-likelihoods (Carta et al., 2023, arXiv 2302.02662;
  :func:`aflowrl.rl.candidates.choice_log_probs`), and log pi(chosen) is the behaviour
  log-probability the learner's ``rl.choice`` recomputes. The score follows an action's text,
  not its place in the list. V(s) is the bins' expected value
  (:func:`aflowrl.rl.candidates.expected_value`); the environment gets the chosen reply.
- **text mode** (:class:`TextActor`): one ``Generate`` call samples a reply per observation,
  each seeded by its decision's own seed (``GenerateRequest.prompt_seeds``); with
  ``policy.value`` on, one ``ScoreCandidates`` call reads the values.
- :class:`UniformActor`: uniform over the admissible actions, no model (the random baseline of
  ``bench/learning.py``); :class:`IndexActor`: always the k-th listed action (a state-blind
  constant policy). Their decisions are not trainable.

The prompt is the system message ``aflowrl optimize``'s proposers use plus the observation
text, rendered by the rollout with the policy's chat template. Batches are split over the
rollout replicas (:class:`aflowrl.trainer.clients.RolloutClient`).

Every decision brings its own randomness (:class:`Draw`: a choice generator and a generation
seed, derived from the names of the decision, e.g. run seed, iteration, episode and step): a
decision does not depend on which other decisions share its call or on their order. Scoring is
per item (the rollout scores each candidate set on its own), and each prompt of a Generate call
is seeded on its own, so a batch's composition changes no decision's randomness (with the hf
engine on CPU, a generated prompt shares padded forward passes with the others of its batch:
reproducible for the same batches, equal up to floating-point rounding for others). Called by
:mod:`aflowrl.trainer.collect` and :mod:`aflowrl.trainer.warmstart`.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aflowrl._proto.v1 import common_pb2, rollout_pb2
from aflowrl.config import RunSpec
from aflowrl.rl import candidates as scoring
from aflowrl.search import encoding
from aflowrl.seeding import derive_seed, stable_hash
from aflowrl.trainer.clients import RolloutClient
from aflowrl.trainer.rows import Decision, Observed

logger = logging.getLogger(__name__)


def prompt_of(observation: str) -> common_pb2.Prompt:
    """The chat prompt of an observation (:func:`aflowrl.search.encoding.prompt_messages`)."""
    return common_pb2.Prompt(
        chat=common_pb2.ChatMessages(
            messages=[
                common_pb2.ChatMessage(role=role, content=content)
                for role, content in encoding.prompt_messages(observation)
            ]
        )
    )


def action_log_probs(scores: rollout_pb2.CandidateScores, count: int) -> np.ndarray:
    """log pi over the first ``count`` scored candidates (the actions' replies)."""
    token_logprobs = [list(c.values) for c in scores.candidate_logprobs[:count]]
    return scoring.choice_log_probs(
        token_logprobs, length_normalised=encoding.ACTIONS_LENGTH_NORMALISED
    )


@dataclass(frozen=True)
class Draw:
    """One decision's randomness: ``rng`` samples a choice, ``seed`` seeds its generation."""

    rng: np.random.Generator
    seed: int

    @staticmethod
    def of(*parts: int | str) -> Draw:
        """The draw named by ``parts`` (e.g. run seed, iteration, episode, step): the same
        parts give the same draw in any process (:mod:`aflowrl.seeding`)."""
        return Draw(
            np.random.default_rng(stable_hash("choose", *parts)), derive_seed("generate", *parts)
        )


@dataclass(frozen=True)
class ValueReader:
    """Reads V(s) from the value replies' scores (``policy.value``)."""

    centres: tuple[float, ...]

    @staticmethod
    def of(spec: RunSpec) -> ValueReader | None:
        value = spec.policy.value
        if not value.enabled:
            return None
        bins = scoring.bin_centres(value.min, value.max, encoding.VALUE_BINS)
        return ValueReader(tuple(float(c) for c in bins))

    def read(self, bin_logprobs: Sequence[Sequence[float]]) -> float:
        scores = scoring.candidate_scores(bin_logprobs, length_normalised=False)
        return scoring.expected_value(scores.tolist(), self.centres)


class Actor(abc.ABC):
    """Turns observations into decisions."""

    @abc.abstractmethod
    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        """One decision per observation, the i-th drawing on ``draws[i]`` alone."""


class ChoiceActor(Actor):
    """Scores the admissible actions (and the value) with the policy; samples an action."""

    def __init__(self, rollout: RolloutClient, values: ValueReader | None = None) -> None:
        self.rollout = rollout
        self.values = values

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        scorable = [i for i, o in enumerate(observed) if o.admissible]
        value_replies = encoding.value_replies() if self.values is not None else []
        items = [
            rollout_pb2.CandidateSet(
                prompt=prompt_of(observed[i].text),
                candidates=encoding.action_replies(observed[i].admissible) + value_replies,
            )
            for i in scorable
        ]
        scored = dict(zip(scorable, await self.rollout.score(items) if items else [], strict=True))
        decisions: list[Decision] = []
        for i, o in enumerate(observed):
            if i not in scored:  # nothing to choose from: the environment will call it invalid
                decisions.append(Decision(action=encoding.action_reply("none")))
                continue
            scores, version = scored[i]
            count = len(o.admissible)
            token_logprobs = [list(c.values) for c in scores.candidate_logprobs]
            log_pi = action_log_probs(scores, count)
            probabilities = np.exp(log_pi)
            chosen = int(draws[i].rng.choice(count, p=probabilities / probabilities.sum()))
            ids = tuple(tuple(c.ids) for c in scores.candidate_token_ids)
            value = self.values.read(token_logprobs[count:]) if self.values is not None else None
            decisions.append(
                Decision(
                    action=encoding.action_reply(o.admissible[chosen]),
                    prompt_ids=tuple(scores.prompt_token_ids),
                    candidate_ids=ids[:count],
                    chosen=chosen,
                    logprobs=(float(log_pi[chosen]),),
                    candidate_logprobs=tuple(float(v) for v in log_pi),
                    version=version,
                    value=value,
                    value_ids=ids[count:],
                )
            )
        return decisions


class TextActor(Actor):
    """Samples a reply per observation with ``rollout.sampling`` (module docstring)."""

    def __init__(
        self, rollout: RolloutClient, spec: RunSpec, values: ValueReader | None = None
    ) -> None:
        self.rollout = rollout
        self.sampling = spec.rollout.sampling
        self.values = values

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        sampling = rollout_pb2.SamplingParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            max_tokens=self.sampling.max_tokens,
            stop=list(self.sampling.stop),
            n=1,
            logprobs=True,
        )
        prompts = [prompt_of(o.text) for o in observed]
        results = await self.rollout.generate(prompts, sampling, seeds=[d.seed for d in draws])
        values: list[tuple[float | None, tuple[tuple[int, ...], ...]]] = [(None, ())] * len(
            observed
        )
        if self.values is not None:
            items = [
                rollout_pb2.CandidateSet(prompt=p, candidates=encoding.value_replies())
                for p in prompts
            ]
            values = [
                (
                    self.values.read([list(c.values) for c in scores.candidate_logprobs]),
                    tuple(tuple(c.ids) for c in scores.candidate_token_ids),
                )
                for scores, _ in await self.rollout.score(items)
            ]
        decisions = []
        for (result, version), (value, value_ids) in zip(results, values, strict=True):
            completion = result.completions[0]
            decisions.append(
                Decision(
                    action=completion.text,
                    prompt_ids=tuple(result.prompt_token_ids),
                    response_ids=tuple(completion.token_ids),
                    logprobs=tuple(completion.logprobs),
                    version=version,
                    value=value,
                    value_ids=value_ids,
                )
            )
        return decisions


class UniformActor(Actor):
    """Uniform over the admissible actions; no model, nothing to train."""

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        decisions = []
        for o, draw in zip(observed, draws, strict=True):
            if not o.admissible:
                decisions.append(Decision(action=encoding.action_reply("none")))
                continue
            k = int(draw.rng.integers(len(o.admissible)))
            decisions.append(Decision(action=encoding.action_reply(o.admissible[k])))
        return decisions


class IndexActor(Actor):
    """Always the ``index``-th listed action (the last one when fewer are listed): a
    state-blind constant policy, no model, nothing to train."""

    def __init__(self, index: int) -> None:
        if index < 0:
            raise ValueError(f"index {index} is negative")
        self.index = index

    async def act(self, observed: Sequence[Observed], *, draws: Sequence[Draw]) -> list[Decision]:
        return [
            Decision(
                action=encoding.action_reply(
                    o.admissible[min(self.index, len(o.admissible) - 1)] if o.admissible else "none"
                )
            )
            for o in observed
        ]
