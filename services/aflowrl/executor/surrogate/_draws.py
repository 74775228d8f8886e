"""Deterministic random draws and token counts for the surrogate.

Every random choice of the surrogate is a pure function of named parts (the surrogate's seed,
the request's seed, the choice index, the problem, what is being decided), hashed by the
project's one stable hash (:func:`aflowrl.seeding.stable_hash`): the same request with the same
seed always gets the same answer, in any process, whatever else ran before. Used by the model
and the executor.

Token counts are the usual approximation for English text with OpenAI's tokenisers: one token per
four characters, plus the chat format's overhead of 4 tokens per message and 3 for the reply's
priming (OpenAI cookbook, "How to count tokens with tiktoken"). They are not exact for any
tokenizer; they grow with the text as real counts do, which is what cost accounting needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import NormalDist

from aflowrl.seeding import stable_hash

_STANDARD_NORMAL = NormalDist()
_SCALE = float(2**53)

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
REPLY_PRIMING_TOKENS = 3


def uniform(*parts: object) -> float:
    """A number in [0, 1) fixed by ``parts`` (their reprs, hashed)."""
    return (stable_hash(*parts) >> 11) / _SCALE


def normal(*parts: object) -> float:
    """A standard normal deviate fixed by ``parts``."""
    u = uniform(*parts)
    return _STANDARD_NORMAL.inv_cdf(min(max(u, 1e-12), 1.0 - 1e-12))


def pick(items: int, *parts: object) -> int:
    """An index in ``range(items)`` fixed by ``parts`` (0 when ``items`` <= 1)."""
    return 0 if items <= 1 else int(uniform(*parts) * items)


def count_tokens(text: str) -> int:
    """Approximate tokens of ``text``: ceil(characters / 4)."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def prompt_tokens(contents: Iterable[str]) -> int:
    """Approximate prompt tokens of chat messages with these contents."""
    return REPLY_PRIMING_TOKENS + sum(TOKENS_PER_MESSAGE + count_tokens(c) for c in contents)


def truncate_to_tokens(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """``text`` cut to ``max_tokens`` approximate tokens, and whether it was cut."""
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    return text[: max_tokens * CHARS_PER_TOKEN], True
