"""Proposers: who writes the next edit when the search runs on its own (``aflowrl optimize``).

A proposer reads the :class:`~aflowrl.search.episode.Observation` and returns the response
text a policy would have written (``<action>...</action>``), which the episode then projects.

* :class:`RandomProposer`: uniform over the admissible actions, seeded per round; the baseline
  every learned proposer must beat.
* :class:`LLMProposer`: any OpenAI-compatible chat endpoint (through
  :class:`~aflowrl.executor.openai.OpenAIExecutor`, which retries transport failures) writes the
  action, in choice, text or free-form mode. A reply that does not project onto an admissible
  action is answered with the reason and asked again, at most ``max_retries`` times; the last
  reply is returned either way (the step then records it as invalid).
* ``policy``: a local Hugging Face checkpoint (:mod:`aflowrl.search.policy`, imported only when
  asked for, as it needs torch).

Every request carries a seed derived from (proposer seed, round, attempt), so a resumed run asks
the same questions again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aflowrl.errors import InvalidInputError
from aflowrl.executor.base import Executor, Message
from aflowrl.search import encoding
from aflowrl.search.episode import Observation
from aflowrl.search.projection import Projection
from aflowrl.seeding import derive_seed

logger = logging.getLogger(__name__)

Check = Callable[[str], Projection]
"""Projects a response onto the current parent (the episode's projection)."""


@dataclass(frozen=True)
class Proposal:
    """A proposer's response, and what it cost to get."""

    response: str
    attempts: int = 1
    """Replies asked for (1 + retries)."""
    cost_usd: float | None = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Proposer(Protocol):
    """Writes one response per round."""

    name: str

    async def propose(self, observation: Observation, *, round: int, check: Check) -> Proposal:
        """The response for ``observation`` at round ``round`` (0-based)."""
        ...

    async def aclose(self) -> None: ...


def action_response(observation: Observation, index: int) -> str:
    """The response choosing listed action ``index`` (0-based), as the policy writes it."""
    return encoding.action_reply(observation.admissible_actions[index])


class RandomProposer:
    """Uniform over the admissible actions of each observation."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    async def propose(self, observation: Observation, *, round: int, check: Check) -> Proposal:
        actions = observation.admissible_actions
        if not actions:
            return Proposal("<action>no admissible action</action>")
        rng = random.Random(derive_seed(self.seed, "random-proposer", round))
        return Proposal(action_response(observation, rng.randrange(len(actions))))

    async def aclose(self) -> None:
        return None


class LLMProposer:
    """An OpenAI-compatible chat model proposes the edit; unusable replies are retried."""

    name = "llm"

    def __init__(
        self,
        client: Executor,
        *,
        seed: int = 0,
        temperature: float | None = 0.7,
        max_tokens: int | None = 2048,
        max_retries: int = 2,
    ) -> None:
        if not 0 <= max_retries <= 10:
            raise InvalidInputError(f"{max_retries} is not in 0..10", field="max_retries")
        self.client = client
        self.seed = seed
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries

    async def propose(self, observation: Observation, *, round: int, check: Check) -> Proposal:
        turns = encoding.prompt_messages(observation.text)
        messages = [Message(role, text) for role, text in turns]
        cost: float | None = 0.0
        prompt_tokens = completion_tokens = 0
        reply = ""
        for attempt in range(self.max_retries + 1):
            result = await self.client.chat(
                messages,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                seed=derive_seed(self.seed, "llm-proposer", round, attempt),
            )
            reply = result.texts[0] if result.texts else ""
            prompt_tokens += result.usage.prompt_tokens
            completion_tokens += result.usage.completion_tokens
            cost = None if cost is None or result.cost_usd is None else cost + result.cost_usd
            projection = check(reply)
            if projection.valid:
                return Proposal(reply, attempt + 1, cost, prompt_tokens, completion_tokens)
            logger.info(
                "round %d: proposer reply %d unusable: %s", round, attempt + 1, projection.reason
            )
            messages += [
                Message("assistant", reply[-4000:]),
                Message(
                    "user",
                    f"That reply cannot be used: {projection.reason}. Reply again, following "
                    "the reply format exactly, with exactly one <action>...</action>.",
                ),
            ]
        return Proposal(reply, self.max_retries + 1, cost, prompt_tokens, completion_tokens)

    async def aclose(self) -> None:
        await self.client.aclose()
