"""The engine interface behind the rollout service, and the plain types it speaks.

The gRPC servicer (:mod:`aflowrl.rollout.service`) converts protos into these types and calls one
:class:`RolloutEngine`: :class:`~aflowrl.rollout.hf_engine.HfEngine` (transformers) or
:class:`~aflowrl.rollout.vllm_engine.VllmEngine`. Engines know nothing of versions or requests'
atomicity: the servicer's :class:`~aflowrl.rollout.gate.VersionGate` never lets
:meth:`RolloutEngine.load_weights` or :meth:`RolloutEngine.receive_weights` run while a request
is being served.

Weights arrive as a stream of named tensors, consumed one at a time on the engine's own thread
(the grpc transport's staged payload, a safetensors directory read tensor by tensor) or by a
broadcast the engine's workers receive (the nccl transport): no engine ever needs a second copy
of the model in memory. With LoRA (``policy.lora``) the stream holds the adapters alone.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aflowrl.models.broadcast import BroadcastResult, Expectation, Rendezvous
from aflowrl.rollout.errors import BadSamplingRequestError


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling parameters of one request (``SamplingParams`` in the proto, defaults filled)."""

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]."""
    top_k: int = -1
    """Top-k; <= 0 disables it."""
    max_tokens: int = 16
    """Most generated tokens per completion."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion (removed from the text)."""
    n: int = 1
    """Completions per prompt."""
    seed: int | None = None
    """Seed of the request; None draws one."""
    prompt_seeds: tuple[int, ...] = ()
    """One seed per prompt, or none: when given, prompt i's completions are seeded by
    ``prompt_seeds[i]`` alone (``seed`` is ignored), whatever else the request holds."""
    logprobs: bool = True
    """Return the sampled tokens' log-probabilities."""


@dataclass
class CompletionResult:
    """One completion: generated ids (stop/EOS token included), text (stop removed), log-probs."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str
    """"stop" (a stop string), "eos" or "length"."""


@dataclass
class PromptResult:
    """The n completions of one prompt."""

    prompt_token_ids: list[int]
    completions: list[CompletionResult] = field(default_factory=list)


def settle_threadsafe(
    future: asyncio.Future[Any],
    loop: asyncio.AbstractEventLoop,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Complete ``future`` (owned by ``loop``) from an engine thread, unless already done."""

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    loop.call_soon_threadsafe(settle)


def prompt_seed(sampling: SamplingOptions, request_seed: int, index: int) -> tuple[int, int]:
    """(seed, index) that seed the completions of prompt ``index``: its own seed at index 0 when
    the request gives per-prompt seeds, else the request's seed at the prompt's place."""
    if sampling.prompt_seeds:
        return sampling.prompt_seeds[index], 0
    return request_seed, index


class RolloutEngine(abc.ABC):
    """Generation, candidate scoring and in-place weight loading for one policy model."""

    backend: str
    """"hf" or "vllm"."""
    model_dir: Path
    """The directory the engine was started from."""
    tokenizer: Any
    """The model's tokenizer (for chat templates and candidate tokenisation)."""
    max_model_len: int
    """Longest prompt + completion the engine accepts (tokens)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and warm up (health turns SERVING after this)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the engine and free its memory (idempotent)."""

    @abc.abstractmethod
    async def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions
    ) -> list[PromptResult]:
        """Sample ``sampling.n`` completions of every prompt (results in prompt order)."""

    @abc.abstractmethod
    async def score(
        self, prompt: Sequence[int], candidates: Sequence[Sequence[int]], temperature: float
    ) -> list[list[float]]:
        """Per-token log pi_T of each candidate continuation of ``prompt``."""

    @abc.abstractmethod
    def parameter_shapes(self) -> Mapping[str, tuple[int, ...]]:
        """Names and shapes of the weights a full update must carry (the adapters with LoRA)."""

    @abc.abstractmethod
    async def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Replace every weight in place from a verified stream; returns the pieces it took.

        ``tensors`` is consumed lazily on the engine's thread, in manifest order. A failure
        midway raises :class:`~aflowrl.models.errors.WeightLoadFailedError`, saying whether
        the old weights are intact.
        """

    async def adopt_weights(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Serve from ``tensors`` themselves (a verified full update), without copying them.

        Only an engine whose weights live in host memory, in the same dtypes and shapes, can;
        the caller then never writes into the tensors' memory again while they are served.
        Returns whether the engine did; False (the default) leaves its weights untouched, and
        the caller loads them with :meth:`load_weights` instead.
        """
        return False

    weight_group_ranks: int = 1
    """Members this engine contributes to a weight group (its workers)."""

    on_dead: Callable[[str], None] | None = None
    """Called once, on the event loop, with the reason when the engine dies for good (its
    engine-core process exited, a call overran its deadline): the servicer turns the replica's
    health NOT_SERVING, so the liveness probe restarts the pod. Waiting calls have already failed
    with :class:`~aflowrl.rollout.errors.EngineUnavailableError`."""

    @abc.abstractmethod
    async def join_weight_group(self, rendezvous: Rendezvous) -> None:
        """Join the learner's weight group with every worker (``rendezvous.rank`` is the first)."""

    @abc.abstractmethod
    async def receive_weights(
        self, expectation: Expectation, on_bucket: Callable[[int], None] | None = None
    ) -> BroadcastResult:
        """Take part in one broadcast (:func:`aflowrl.models.broadcast.receive_weights`)."""

    @abc.abstractmethod
    async def leave_weight_group(self) -> None:
        """Leave the weight group, if any (idempotent)."""

    def check_prompts(self, prompts: Sequence[Sequence[int]], sampling: SamplingOptions) -> None:
        """Refuse empty prompts, prompts that cannot fit ``sampling.max_tokens`` more, and per-
        prompt seeds that are not one per prompt."""
        if sampling.prompt_seeds and len(sampling.prompt_seeds) != len(prompts):
            raise BadSamplingRequestError(
                f"{len(sampling.prompt_seeds)} prompt seeds for {len(prompts)} prompts "
                "(give one per prompt, or none)",
                field="prompt_seeds",
            )
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise BadSamplingRequestError("empty prompt", field=f"prompts[{i}]")
            if len(prompt) + sampling.max_tokens > self.max_model_len:
                raise BadSamplingRequestError(
                    f"{len(prompt)} prompt tokens + max_tokens {sampling.max_tokens} exceed the "
                    f"engine's {self.max_model_len} positions",
                    field=f"prompts[{i}]",
                )

    def load_stats(self) -> tuple[int, int]:
        """(queued, running) requests inside the engine."""
        return (0, 0)
