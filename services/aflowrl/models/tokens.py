"""How texts become the policy's token ids: chat prompts and reply continuations.

The rollout service (``Generate``, ``ScoreCandidates``) and ``aflowrl optimize --proposer
policy`` tokenise the same way, so the same weights give the same numbers on both paths:

* a chat prompt is rendered to text by the tokenizer's chat template with the generation
  prompt appended, then tokenised without special tokens (the template wrote them);
* a reply continuation (a candidate action or value reply) is tokenised on its own, without
  special tokens, and scored right after the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of ``messages`` ((role, content) turns) through the chat template."""
    turns = [{"role": role, "content": content} for role, content in messages]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return [int(i) for i in tokenizer(text, add_special_tokens=False).input_ids]


def continuation_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a reply scored after a prompt."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False).input_ids]
