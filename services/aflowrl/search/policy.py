"""The ``policy`` proposer: a local Hugging Face checkpoint proposes edits (needs torch).

This module is imported only when ``aflowrl optimize --proposer policy`` asks for it; the rest of
:mod:`aflowrl.search` stays torch-free. The checkpoint is a causal LM directory, or ``tiny``, loaded
as the rollout service loads the policy (:mod:`aflowrl.models.loading`; nothing is downloaded);
its tokenizer must have a chat template. The prompt is the proposers' system message plus the
observation, rendered with that template.

* choice mode: each admissible action k is scored by the log-likelihood of its continuation
  :func:`choice_continuation` (``<action>{text}</action>``) after the prompt, under the
  temperature-scaled distribution of :mod:`aflowrl.models.logprobs` (the rollout's candidate
  scores), and the action is sampled from the softmax over candidates (Carta et al., 2023,
  arXiv 2302.02662, as :mod:`aflowrl.rl.choice` trains it): log pi_k = ll_k - logsumexp_j ll_j.
* text mode (and free-form): the model samples a reply of at most ``max_new_tokens``; replies that
  do not project onto an admissible action are sampled again, at most ``max_retries`` times.

Sampling is seeded by (seed, round, attempt), so a resumed run proposes the same edits.
"""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any

from aflowrl.errors import InvalidInputError
from aflowrl.search.episode import Observation
from aflowrl.search.proposers import SYSTEM_PROMPT, Check, Proposal
from aflowrl.seeding import derive_seed

logger = logging.getLogger(__name__)


def choice_continuation(action: str) -> str:
    """The text whose likelihood scores admissible action ``action`` in choice mode."""
    return f"<action>{action}</action>"


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
        batch_size: int = 8,
        temperature: float = 1.0,
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

    @staticmethod
    def load(path: str | Path, *, seed: int = 0, **options: Any) -> PolicyProposer:
        """Load a checkpoint directory, or ``tiny`` (the built-in tiny model), float32."""
        from aflowrl.models import loading

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
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": observation.text},
        ]
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        limit = int(getattr(self.model.config, "max_position_embeddings", 4096)) // 2
        return [int(i) for i in ids][-limit:]

    def score_candidates(self, observation: Observation) -> list[float]:
        """log pi_k over the admissible actions (choice mode).

        The prompt runs once; its key/value cache is shared by every candidate continuation
        (copied per batch), so the cost is one prompt plus the candidates' own tokens.
        """
        import copy

        import torch

        from aflowrl.models.logprobs import tempered_logprobs

        prompt = self._prompt_ids(observation)
        conts = [
            [
                int(i)
                for i in self.tokenizer.encode(choice_continuation(a), add_special_tokens=False)
            ]
            for a in observation.admissible_actions
        ]
        pad = int(self.tokenizer.pad_token_id or 0)
        device = self.model.device
        lls: list[float] = []
        with torch.no_grad():
            head = self.model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
            last = head.logits[:, -1:]  # predicts each candidate's first token
            for start in range(0, len(conts), self.batch_size):
                chunk = conts[start : start + self.batch_size]
                width = max(len(c) for c in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
                mask = torch.zeros(
                    (len(chunk), len(prompt) + width), dtype=torch.long, device=device
                )
                mask[:, : len(prompt)] = 1
                for row, cont in enumerate(chunk):
                    ids[row, : len(cont)] = torch.tensor(cont, device=device)
                    mask[row, len(prompt) : len(prompt) + len(cont)] = 1
                cache = copy.deepcopy(head.past_key_values)
                cache.batch_repeat_interleave(len(chunk))
                logits = self.model(
                    input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True
                ).logits
                # Position t's logits predict token t + 1; the prompt's last predicts token 0.
                predicting = torch.cat([last.expand(len(chunk), 1, -1), logits[:, :-1]], dim=1)
                token_lp = tempered_logprobs(predicting, ids, self.temperature)
                for row, cont in enumerate(chunk):
                    lls.append(float(token_lp[row, : len(cont)].sum()))
        top = max(lls)
        log_total = top + math.log(math.fsum(math.exp(ll - top) for ll in lls))
        return [ll - log_total for ll in lls]

    def _choose(self, observation: Observation, round: int) -> Proposal:
        import random

        log_pi = self.score_candidates(observation)
        rng = random.Random(derive_seed(self.seed, "policy-choice", round))
        index = rng.choices(range(len(log_pi)), weights=[math.exp(v) for v in log_pi], k=1)[0]
        return Proposal(f"<action>{index + 1}</action>")

    def _sample(self, observation: Observation, round: int, attempt: int) -> str:
        import torch

        prompt = self._prompt_ids(observation)
        torch.manual_seed(derive_seed(self.seed, "policy-text", round, attempt))
        with torch.no_grad():
            out = self.model.generate(
                input_ids=torch.tensor([prompt], device=self.model.device),
                attention_mask=torch.ones(
                    (1, len(prompt)), dtype=torch.long, device=self.model.device
                ),
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
                return Proposal("<action>no admissible action</action>")
            return self._choose(observation, round)
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
