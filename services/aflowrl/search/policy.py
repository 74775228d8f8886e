"""The ``policy`` proposer: a local Hugging Face checkpoint proposes edits (needs torch).

This module is imported only when ``aflowrl optimize --proposer policy`` (or the learning bench)
asks for it; the rest of :mod:`aflowrl.search` stays torch-free. The checkpoint is a causal LM
directory, or ``tiny``, loaded as the rollout service loads the policy
(:mod:`aflowrl.models.loading`; nothing is downloaded); its tokenizer must have a chat template.

It acts exactly as the trainer's rollout calls do (one acting path):

* the prompt is :func:`aflowrl.search.encoding.prompt_messages` through the chat template
  (:func:`aflowrl.models.tokens.chat_prompt_ids`);
* choice mode: every admissible action's reply and the value replies are scored after the
  prompt by :func:`aflowrl.models.logprobs.score_branches` (the rollout's ``ScoreCandidates``
  runs the same function) under the temperature-scaled distribution; the action distribution
  and the value come from :mod:`aflowrl.rl.candidates`; the action is sampled from it;
* text mode (and free-form): the model samples a reply of at most ``max_new_tokens``; replies
  that do not project onto an admissible action are sampled again, at most ``max_retries``
  times.

:class:`PolicyValues` is the value source of ``--selection fused --value-source policy``: the
value the policy read at each workflow it was shown, as the trainer's table keeps it.
Sampling is seeded by (seed, round, attempt), so a resumed run proposes the same edits.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aflowrl.errors import InvalidInputError
from aflowrl.models import loading, logprobs, tokens
from aflowrl.rl import candidates as scoring
from aflowrl.search import encoding
from aflowrl.search.episode import Observation
from aflowrl.search.proposers import Check, Proposal
from aflowrl.search.values import StaticValues, ValueQuery
from aflowrl.seeding import derive_seed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scored:
    """The policy's reading of one observation."""

    log_pi: tuple[float, ...]
    """log pi over the admissible actions, in the observation's order."""
    value: float | None
    """V(s) of the observation (None: the proposer reads no value)."""


class PolicyValues:
    """V(s) for fused selection: the latest value the policy read at each workflow (anchor);
    workflows it was not shown take their nearest shown ancestor's (the trainer's semantics,
    :mod:`aflowrl.trainer.values`)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def observe(self, anchor: str, value: float | None) -> None:
        if value is not None:
            self.values[anchor] = value

    async def __call__(self, queries: Sequence[ValueQuery]) -> Sequence[float]:
        known = list(self.values.values())
        default = sum(known) / len(known) if known else 0.0
        return await StaticValues(self.values, default)(queries)


class PolicyProposer:
    """Proposes edits with a local causal LM (choice: scores candidates; text: samples)."""

    name = "policy"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        seed: int = 0,
        max_new_tokens: int = 256,
        max_retries: int = 2,
        batch_size: int = 32,
        temperature: float = 1.0,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        if not temperature > 0:
            raise InvalidInputError(f"{temperature} is not positive", field="temperature")
        self.model = model
        self.temperature = temperature
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.max_retries = max_retries
        self.batch_size = batch_size
        self.centres: tuple[float, ...] | None = None
        if value_range is not None:
            bins = scoring.bin_centres(value_range[0], value_range[1], encoding.VALUE_BINS)
            self.centres = tuple(float(c) for c in bins)
        self.values = PolicyValues()
        self._pad = int(tokenizer.pad_token_id or 0)

    @staticmethod
    def load(path: str | Path, *, seed: int = 0, **options: Any) -> PolicyProposer:
        """Load a checkpoint directory, or ``tiny`` (the built-in tiny model), float32."""
        directory = loading.resolve_model_path(str(path), field="--policy")
        tokenizer = loading.load_tokenizer(directory)
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidInputError(f"{directory} has no chat template", field="--policy")
        device = loading.default_device()
        model = loading.load_causal_lm(
            directory, dtype=loading.torch_dtype("float32"), device=device
        )
        return PolicyProposer(model, tokenizer, seed=seed, **options)

    def _prompt_ids(self, observation: Observation) -> list[int]:
        ids = tokens.chat_prompt_ids(self.tokenizer, encoding.prompt_messages(observation.text))
        limit = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        if len(ids) >= limit:
            raise InvalidInputError(
                f"the observation is {len(ids)} tokens; the model takes {limit}: lower "
                "environment.search.maxObservationChars",
                field="search.maxObservationChars",
            )
        return ids

    def read(self, observation: Observation) -> Scored:
        """log pi over the admissible actions and V(s), as the trainer's rollout calls read them."""
        actions = encoding.action_replies(observation.admissible_actions)
        values = encoding.value_replies() if self.centres is not None else []
        replies = [tokens.continuation_ids(self.tokenizer, r) for r in actions + values]
        scores = logprobs.score_branches(
            self.model,
            self._prompt_ids(observation),
            replies,
            pad_id=self._pad,
            temperature=self.temperature,
            device=self.model.device,
            max_batch=self.batch_size,
        )
        count = len(actions)
        log_pi = scoring.choice_log_probs(
            scores[:count], length_normalised=encoding.ACTIONS_LENGTH_NORMALISED
        )
        value = None
        if self.centres is not None:
            bins = scoring.candidate_scores(scores[count:], length_normalised=False)
            value = scoring.expected_value(bins.tolist(), self.centres)
        return Scored(tuple(float(v) for v in log_pi), value)

    def score_candidates(self, observation: Observation) -> list[float]:
        """log pi_k over the admissible actions (choice mode)."""
        return list(self.read(observation).log_pi)

    def _choose(self, observation: Observation, round: int) -> Proposal:
        scored = self.read(observation)
        self.values.observe(observation.anchor, scored.value)
        rng = random.Random(derive_seed(self.seed, "policy-choice", round))
        weights = np.exp(np.array(scored.log_pi))
        index = rng.choices(range(len(weights)), weights=weights.tolist(), k=1)[0]
        return Proposal(encoding.action_reply(observation.admissible_actions[index]))

    def _sample(self, observation: Observation, round: int, attempt: int) -> str:
        prompt = self._prompt_ids(observation)
        torch.manual_seed(derive_seed(self.seed, "policy-text", round, attempt))
        device = self.model.device
        with torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([prompt], device=device),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=device),
                max_new_tokens=self.max_new_tokens,
                do_sample=True,
                temperature=self.temperature,
                top_p=1.0,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        return str(self.tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True))

    def _propose(self, observation: Observation, round: int, check: Check) -> Proposal:
        if observation.mode == "choice":
            if not observation.admissible_actions:
                return Proposal(encoding.action_reply("no admissible action"))
            return self._choose(observation, round)
        if self.centres is not None and observation.admissible_actions:
            self.values.observe(observation.anchor, self.read(observation).value)
        reply = ""
        for attempt in range(self.max_retries + 1):
            reply = self._sample(observation, round, attempt)
            if check(reply).valid:
                return Proposal(reply, attempt + 1)
        return Proposal(reply, self.max_retries + 1)

    async def propose(self, observation: Observation, *, round: int, check: Check) -> Proposal:
        # The forward passes are CPU-bound: run them off the event loop.
        return await asyncio.to_thread(self._propose, observation, round, check)

    async def aclose(self) -> None:
        return None
