"""The log-probability semantics the rollout reports and the learner reproduces.

A sampled token's log-probability is taken under the **temperature-scaled distribution over the
whole vocabulary**, in float32::

    log pi_T(a | s) = log_softmax(z(s) / T)[a],   T = the sampling temperature (T = 1 if greedy)

where z are the model's logits. Top-p and top-k truncation shape which tokens are drawn but are
not part of the reported probability (as in verl and OpenRLHF): the policy the learner optimises
is pi_T, and pi_T is differentiable everywhere, whereas a truncated distribution gives -inf to
tokens outside the nucleus of a later policy. The learner therefore recomputes
``log_softmax(logits / T)`` with T = ``rollout.sampling.temperature`` of the run spec; the trainer
samples with that temperature. Candidate scores (choice mode) use the same T.

Sequences are scored in one causal forward pass over prompt + response, right-padded: the
log-probability of response token t comes from the logits at position t - 1.

Several responses to one prompt (choice mode's candidates) share its forward pass
(:func:`pack_prompt_branches`): one row holds the prompt once and then every response, each
response at the positions it would have right after the prompt and attending to the prompt and
to itself only (a 4-D attention mask). Every log-probability is that of the prompt + response
row, without the prompt's cost once per response.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def effective_temperature(temperature: float) -> float:
    """The T of pi_T: the sampling temperature, or 1 for greedy decoding (T = 0)."""
    return temperature if temperature > 0 else 1.0


def tempered_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> torch.Tensor:
    """log pi_T(tokens) = log_softmax(logits / T)[tokens], float32; logits [..., V]."""
    scaled = logits.float() / effective_temperature(temperature)
    logp = torch.log_softmax(scaled, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1).long()).squeeze(-1)


def chunked_token_stats(
    project: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    *,
    chunk_tokens: int,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi_T(tokens) [N], entropy of pi_T [N] or None) from hidden states [N, H].

    ``project`` maps hidden states to logits (the LM head). At most ``chunk_tokens`` rows of
    logits exist at once, and when gradients flow each chunk is recomputed in the backward pass
    (activation checkpointing of the head), so the saved tensors are the hidden states alone,
    never tokens x vocabulary. Values equal :func:`tempered_logprobs` and
    ``ppo.entropy_from_logits`` on the whole logits; the entropy carries gradient only with
    ``entropy_grad``.
    """
    from torch.utils.checkpoint import checkpoint

    scale = effective_temperature(temperature)

    def stats(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = project(h).float() / scale
        logp_all = torch.log_softmax(scaled, dim=-1)
        logp = logp_all.gather(-1, t.unsqueeze(-1).long()).squeeze(-1)
        if not entropy:
            return logp, logp.new_zeros(0)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            # H = -sum_v p_v log p_v (= logsumexp(z) - sum_v p_v z_v)
            ent = -(logp_all.exp() * logp_all).sum(-1)
        return logp, ent

    grad = torch.is_grad_enabled()
    logps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, t = hidden[start : start + chunk_tokens], tokens[start : start + chunk_tokens]
        if grad and (h.requires_grad or any(p.requires_grad for p in _parameters(project))):
            logp, ent = checkpoint(stats, h, t, use_reentrant=False)
        else:
            logp, ent = stats(h, t)
        logps.append(logp)
        ents.append(ent)
    if not logps:  # no tokens: keep the graph connected to the head for FSDP's hooks
        empty = project(hidden[:0]).float().sum(-1)
        return empty, (empty if entropy else None)
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


def _parameters(project: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.nn.Parameter]:
    return list(project.parameters()) if isinstance(project, torch.nn.Module) else []


@dataclass(frozen=True)
class PackedSequences:
    """Prompt + response rows, right-padded, with the positions that predict response tokens."""

    input_ids: torch.Tensor
    """[B, L] token ids (pad after each row)."""
    attention_mask: torch.Tensor
    """[B, L] 1 on real tokens; or [B, 1, L, L] bool, True where a query may attend a key."""
    position_ids: torch.Tensor
    """[B, L] each token's position in its own prompt + response sequence."""
    predict_rows: torch.Tensor
    """[N] row of each response token (N = total response tokens)."""
    predict_cols: torch.Tensor
    """[N] position whose logits predict that token (its own position - 1)."""
    targets: torch.Tensor
    """[N] the response tokens."""
    response_lengths: tuple[int, ...]
    """Tokens of each response, in order (to split the flat [N] results per response)."""

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-row views of a flat [N, ...] result."""
        return list(torch.split(flat, list(self.response_lengths)))

    def to(self, device: torch.device) -> PackedSequences:
        """The same batch on ``device``."""
        return PackedSequences(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            predict_rows=self.predict_rows.to(device),
            predict_cols=self.predict_cols.to(device),
            targets=self.targets.to(device),
            response_lengths=self.response_lengths,
        )


def pack_sequences(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: torch.device | None = None,
) -> PackedSequences:
    """Right-pad prompt + response rows; every prompt must have at least one token."""
    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    pred_rows: list[int] = []
    pred_cols: list[int] = []
    targets: list[int] = []
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if not prompt:
            raise ValueError(f"row {i}: empty prompt (nothing to condition the response on)")
        row = rows[i]
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
        start = len(prompt)
        pred_rows.extend([i] * len(response))
        pred_cols.extend(range(start - 1, start - 1 + len(response)))
        targets.extend(int(t) for t in response)
    position_ids = torch.arange(width, dtype=torch.long).expand(len(rows), width).contiguous()
    packed = PackedSequences(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        predict_rows=torch.tensor(pred_rows, dtype=torch.long),
        predict_cols=torch.tensor(pred_cols, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        response_lengths=tuple(len(r) for r in responses),
    )
    return packed.to(device) if device is not None else packed


def pack_prompt_branches(
    prompts: Sequence[Sequence[int]],
    branches: Sequence[Sequence[Sequence[int]]],
    *,
    pad_id: int,
    device: torch.device | None = None,
) -> PackedSequences:
    """One row per prompt followed by its responses (``branches[i]``), sharing the prompt.

    Scores exactly what :func:`pack_sequences` of every (prompt, response) pair scores, in the
    same order (module docstring). Rows with a single response are plain causal rows; with
    several, the attention mask is 4-D. Padding attends to itself only (no empty softmax).
    """
    if len(prompts) != len(branches):
        raise ValueError(f"{len(prompts)} prompts but {len(branches)} branch lists")
    if all(len(b) == 1 for b in branches):
        return pack_sequences(prompts, [b[0] for b in branches], pad_id=pad_id, device=device)
    widths = [len(p) + sum(len(r) for r in b) for p, b in zip(prompts, branches, strict=True)]
    width = max(widths)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(prompts), width), dtype=torch.long)
    # segment 0 = the prompt, k = the k-th response, -1 = padding
    segments = torch.full((len(prompts), width), -1, dtype=torch.long)
    pred_rows: list[int] = []
    pred_cols: list[int] = []
    targets: list[int] = []
    lengths: list[int] = []
    for i, (prompt, responses) in enumerate(zip(prompts, branches, strict=True)):
        if not prompt:
            raise ValueError(f"row {i}: empty prompt (nothing to condition the response on)")
        if not responses:
            raise ValueError(f"row {i}: no response to score")
        start = len(prompt)
        tokens = list(prompt)
        position_ids[i, :start] = torch.arange(start)
        segments[i, :start] = 0
        for k, response in enumerate(responses, 1):
            if not response:
                raise ValueError(f"row {i}: response {k - 1} is empty")
            at = len(tokens)
            tokens.extend(response)
            position_ids[i, at : at + len(response)] = torch.arange(start, start + len(response))
            segments[i, at : at + len(response)] = k
            pred_rows.extend([i] * len(response))
            # token 0 is predicted by the prompt's last position, token t by the token before
            pred_cols.extend([start - 1, *range(at, at + len(response) - 1)])
            targets.extend(int(t) for t in response)
            lengths.append(len(response))
        input_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    index = torch.arange(width)
    causal = index[None, :] <= index[:, None]  # [L, L]: key <= query
    query, key = segments[:, :, None], segments[:, None, :]
    visible = (key == 0) | (key == query)  # the prompt, or the same response
    mask = causal[None] & visible & (key >= 0) & (query >= 0)
    mask |= torch.eye(width, dtype=torch.bool)[None] & (query < 0)  # padding: itself
    packed = PackedSequences(
        input_ids=input_ids,
        attention_mask=mask[:, None],
        position_ids=position_ids,
        predict_rows=torch.tensor(pred_rows, dtype=torch.long),
        predict_cols=torch.tensor(pred_cols, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        response_lengths=tuple(lengths),
    )
    return packed.to(device) if device is not None else packed


def selected_hidden_states(model: Any, packed: PackedSequences) -> torch.Tensor:
    """Last hidden states [N, H] at the positions predicting response tokens (HF causal LM)."""
    hidden = model.get_decoder()(
        input_ids=packed.input_ids,
        attention_mask=packed.attention_mask,
        position_ids=packed.position_ids,
        use_cache=False,
    ).last_hidden_state
    selected: torch.Tensor = hidden[packed.predict_rows, packed.predict_cols]
    return selected


def selected_hidden_logits(model: Any, packed: PackedSequences) -> torch.Tensor:
    """Logits [N, V] at the positions predicting response tokens, for a plain HF causal LM.

    The LM head runs only on those positions (a vocabulary of 150k makes full logits costly).
    """
    logits: torch.Tensor = model.get_output_embeddings()(selected_hidden_states(model, packed))
    return logits


def score_branches(
    model: Any,
    prompt: Sequence[int],
    candidates: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float,
    device: torch.device,
    max_batch: int,
) -> list[list[float]]:
    """Per-token log pi_T of every candidate continuation of ``prompt`` (no grad).

    Up to ``max_batch`` candidates share one pass over the prompt (:func:`pack_prompt_branches`).
    What the rollout's ``ScoreCandidates`` returns and ``aflowrl optimize --proposer policy``
    scores: one function, so both give the same numbers for the same weights.
    """
    scores: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, len(candidates), max_batch):
            chunk = candidates[start : start + max_batch]
            packed = pack_prompt_branches([prompt], [chunk], pad_id=pad_id, device=device)
            logits = selected_hidden_logits(model, packed)
            flat = tempered_logprobs(logits, packed.targets, temperature)
            scores.extend(part.tolist() for part in packed.split(flat.cpu()))
    return scores
