"""Fixtures of the search tests: an executor LLM whose accuracy depends on the workflow.

``ArithmeticExecutor`` fakes an executor model on "What is a + b?" problems: a plain answer is
right with probability 0.6 (decided by a hash of the problem and the call's seed, so runs are
deterministic), one asked to work "step by step" with 0.85; ensembles pick the majority answer,
reviews judge exactly and revisions fix. So edits really change scores, in both directions, and
the search has something to find. ``ScriptedChat`` fakes the LLM proposer's chat model (replies
from a list). The integration tests run the real OpenAI client against HTTP servers instead.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from aflowrl.benchmarks import Problem, get_benchmark
from aflowrl.config import SearchSpec
from aflowrl.config.environment import EvaluationSpec
from aflowrl.executor.base import ChatResult, Message, Usage
from aflowrl.search import SearchContext
from aflowrl.workflow import Evaluator

PROBLEMS = [
    Problem("gsm8k", f"q{i}", f"What is {i} + {3 * i + 1}?", str(4 * i + 1)) for i in range(12)
]
_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class FakeExecutor:
    """An executor whose reply is ``reply(messages, seed)``; records every request."""

    executor_id: str = "fake"
    requests: list[tuple[list[Message], int | None]] = field(default_factory=list)

    @property
    def calls(self) -> list[str]:
        """The last message of every request."""
        return [messages[-1].content for messages, _ in self.requests]

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> ChatResult:
        self.requests.append((list(messages), seed))
        text = self.reply(messages, seed)
        prompt = messages[-1].content
        return ChatResult((text,) * n, Usage(len(prompt.split()), len(text.split())), 0.001, "f", 0)

    def reply(self, messages: Sequence[Message], seed: int | None) -> str:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


@dataclass
class ScriptedChat(FakeExecutor):
    """A chat model replying from a list (the LLM proposer's endpoint)."""

    replies: list[str] = field(default_factory=list)

    def reply(self, messages: Sequence[Message], seed: int | None) -> str:
        return self.replies.pop(0)


@dataclass
class ArithmeticExecutor(FakeExecutor):
    """A fake executor LLM for arithmetic problems (see the module docstring)."""

    executor_id: str = "arithmetic"

    def reply(self, messages: Sequence[Message], seed: int | None) -> str:
        return self.answer(messages[-1].content, seed or 0)

    def answer(self, prompt: str, seed: int) -> str:
        match = _QUESTION.search(prompt)
        if match is None:
            return "I cannot tell which problem this is."
        a, b = int(match.group(1)), int(match.group(2))
        right = a + b
        if "<solution_letter>" in prompt:
            shown = re.findall(
                r"^([A-Z]):\n(.*?)(?=^[A-Z]:\n|\n\nReply in|\Z)", prompt, re.M | re.S
            )
            answers = Counter(re.findall(r"-?\d+", body)[-1] for _, body in shown if body.strip())
            top = answers.most_common(1)[0][0] if answers else ""
            letter = next((label for label, body in shown if body.strip().endswith(top)), "A")
            return f"<thought>majority</thought><solution_letter>{letter}</solution_letter>"
        if "<review_result>" in prompt:
            proposed = prompt.split("Proposed", 1)[-1].split("Reply in exactly", 1)[0]
            ok = str(right) in re.findall(r"-?\d+", proposed)[-1:]
            return f"<review_result>{str(ok).lower()}</review_result><feedback>check</feedback>"
        if "inside <solution></solution>" in prompt:
            return f"<solution>The answer is {right}</solution>"
        skill = 0.85 if "step by step" in prompt.lower() else 0.6
        value = right if _uniform(a, b, seed) < skill else right + 1
        if "<answer>" in prompt:
            return f"<thought>adding</thought><answer>{value}</answer>"
        return f"Adding the numbers gives {value}"


@pytest.fixture
def executor() -> ArithmeticExecutor:
    return ArithmeticExecutor()


@pytest.fixture
def scripted_chat() -> type[ScriptedChat]:
    return ScriptedChat


@pytest.fixture
def make_context(executor):
    """``make_context(**search_fields)``: a search context over :data:`PROBLEMS` (AFlow's
    selection rule unless ``selection`` says otherwise)."""

    def make(values=None, evaluation: EvaluationSpec | None = None, **search) -> SearchContext:
        search.setdefault("selection", "aflow")
        return SearchContext(
            Evaluator(executor, get_benchmark("gsm8k")),
            PROBLEMS,
            search=SearchSpec(**search),
            evaluation=evaluation or EvaluationSpec(),
            values=values,
        )

    return make
