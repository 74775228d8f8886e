"""How the policy's replies are written: the one encoding of actions and values for the policy.

Every path that asks a policy model (or an LLM proposer) for a decision builds its prompt and
candidate replies here: the trainer's rollout calls, the learner's training rows, ``aflowrl
optimize --proposer policy`` and the learning bench, so training, deployment and evaluation
score exactly the same texts:

* **the prompt**: the system message :data:`SYSTEM_PROMPT`, then the observation text as the
  user turn (:func:`prompt_messages`), rendered with the model's chat template;
* **actions** (choice mode): admissible action ``a`` is scored as the reply
  ``<action>{a}</action>`` after the observation prompt, *length normalised* (its mean token
  log-probability), and the policy is the softmax over the admissible actions
  (:mod:`aflowrl.rl.candidates`). The score follows the action's *text*, never its position in
  the list: permuting the candidates permutes the distribution.
* **value**: the policy's estimate V(s) of the state is read from the same model after the same
  prompt, from the replies ``<value>0`` ... ``<value>9`` (ten bins, one digit each, summed log
  probabilities; their shared ``<value>`` prefix cancels): V(s) = sum_b p_b c_b with the bin
  centres of ``policy.value`` (:func:`aflowrl.rl.candidates.bin_centres`). No extra head: a
  Hugging Face checkpoint (Qwen2.5) and vLLM serve it as they are.

The reply format is also what the environment's projection reads
(:mod:`aflowrl.search.projection`): an action reply is a valid text-mode reply too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

Role = Literal["system", "user", "assistant"]

SYSTEM_PROMPT: Final = (
    "You optimise agentic workflows: graphs of LLM operators that solve benchmark problems. "
    "Each turn you see one workflow, its validation score, what was already tried on it and "
    "problems it got wrong, and you propose exactly one modification that changes one detail, "
    "aiming for a higher score. Follow the reply format you are given exactly."
)
"""The system message of every proposer (policy model or LLM)."""

ACTIONS_LENGTH_NORMALISED: Final = True
"""Action candidates are scored by their mean token log-probability (not the sum)."""
VALUE_BINS: Final = 10
"""Value bins: the digits 0-9 (one token each in every byte-level BPE vocabulary)."""


def prompt_messages(observation: str) -> list[tuple[Role, str]]:
    """The chat turns (role, content) the policy reads: the system message and the observation."""
    return [("system", SYSTEM_PROMPT), ("user", observation)]


def action_reply(action: str) -> str:
    """The reply choosing ``action`` (canonical action text): scored, then sent to Step."""
    return f"<action>{action}</action>"


def action_replies(actions: Sequence[str]) -> list[str]:
    """The replies of every admissible action, in the order given."""
    return [action_reply(a) for a in actions]


def value_replies() -> list[str]:
    """The value-bin replies ``<value>0`` ... ``<value>9`` (bin b is the b-th)."""
    return [f"<value>{b}" for b in range(VALUE_BINS)]
