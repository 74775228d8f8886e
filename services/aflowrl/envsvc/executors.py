"""The executor an environment replica runs workflows with, built from the run spec.

``spec.environment.executor`` picks it:

* ``surrogate`` (the default): the calibrated offline stand-in, in-process
  (:class:`aflowrl.executor.surrogate.SurrogateExecutor`), indexing the problems this replica
  serves;
* ``openai``: any OpenAI-compatible endpoint (:class:`aflowrl.executor.openai.OpenAIExecutor`),
  at ``baseUrl`` or, for an executor the run serves itself (``serve``), at
  $AFLOWRL_EXECUTOR_BASE_URL; the API key comes from ``aflowrl.envs``
  ($AFLOWRL_EXECUTOR_API_KEY[_FILE], mounted from ``apiKeySecret`` in pods).

:func:`check_executor` runs before the server binds (a missing endpoint fails at once);
:func:`probe_openai` runs during warm-up and waits for the endpoint to answer (a served executor
may still be loading its model) or fails with the reason (unreachable, key refused).
:class:`MeteredExecutor` counts failed executor calls by kind in the service's metrics (the
evaluator counts the successful ones from its traces). Used by :mod:`aflowrl.envsvc.server`.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp

from aflowrl import envs
from aflowrl.benchmarks.base import Problem
from aflowrl.config.environment import EnvironmentSpec, OpenAIExecutorSpec
from aflowrl.envsvc.errors import ExecutorUnreachableError
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.errors import InvalidInputError
from aflowrl.executor import errors as executor_errors
from aflowrl.executor.base import ChatResult, Executor, Message

logger = logging.getLogger(__name__)

SURROGATE_MODULE: Final = "aflowrl.executor.surrogate"

PROBE_WAIT_S: Final = 20.0
"""How long warm-up waits for an endpoint given by ``baseUrl`` to answer."""
SERVED_PROBE_WAIT_S: Final = 900.0
"""How long it waits for an executor the run serves itself (vLLM loading a model)."""

_OUTCOMES: Final[tuple[tuple[type[BaseException], str], ...]] = (
    (executor_errors.ExecutorRateLimitedError, "rate_limited"),
    (executor_errors.ExecutorUnavailableError, "unavailable"),
    (executor_errors.ExecutorTimeoutError, "timeout"),
    (executor_errors.ExecutorRequestError, "rejected"),
    (executor_errors.ExecutorResponseError, "bad_response"),
)


def openai_base_url(spec: OpenAIExecutorSpec) -> str:
    """``baseUrl``, else $AFLOWRL_EXECUTOR_BASE_URL (a served executor); raises when neither."""
    base_url = spec.base_url or envs.AFLOWRL_EXECUTOR_BASE_URL
    if not base_url:
        raise InvalidInputError(
            "no endpoint: set environment.executor.baseUrl, or AFLOWRL_EXECUTOR_BASE_URL for an "
            "executor the run serves (environment.executor.serve)",
            field="environment.executor.baseUrl",
        )
    return base_url


def check_executor(spec: EnvironmentSpec) -> None:
    """What can be checked before any loading: the endpoint is known, the surrogate exists."""
    executor = spec.executor
    if executor.type == "openai":
        openai_base_url(executor)
        return
    try:
        importlib.import_module(SURROGATE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is None or not SURROGATE_MODULE.startswith(exc.name):
            raise
        raise InvalidInputError(
            f"the surrogate executor is not in this installation ({SURROGATE_MODULE} is "
            "missing); use an OpenAI-compatible endpoint (type: openai)",
            field="environment.executor.type",
        ) from None


def build_executor(
    spec: EnvironmentSpec, problems: Sequence[Problem], data_dir: str | Path | None
) -> Executor:
    """The executor ``spec.executor`` describes (``problems``: what the surrogate indexes)."""
    executor = spec.executor
    if executor.type == "openai":
        from aflowrl.executor.openai import OpenAIExecutor

        if executor.base_url is None:
            executor = executor.model_copy(update={"base_url": openai_base_url(executor)})
        return OpenAIExecutor.from_spec(executor)
    surrogate: Any = importlib.import_module(SURROGATE_MODULE)
    built: Executor = surrogate.SurrogateExecutor.from_spec(
        executor, data_dir=data_dir, problems=problems
    )
    return built


async def probe_openai(spec: OpenAIExecutorSpec, *, wait_s: float | None = None) -> None:
    """Wait until the endpoint answers ``GET /models`` (any answer but 401/403 will do).

    Connection failures and 5xx answers are retried with backoff until ``wait_s`` (default:
    :data:`PROBE_WAIT_S`, or :data:`SERVED_PROBE_WAIT_S` for a served executor) has passed;
    a refused API key fails at once. Raises :class:`ExecutorUnreachableError`.
    """
    base_url = openai_base_url(spec).rstrip("/")
    if wait_s is None:
        wait_s = PROBE_WAIT_S if spec.base_url else SERVED_PROBE_WAIT_S
    url = f"{base_url}/models"
    key = envs.AFLOWRL_EXECUTOR_API_KEY
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + wait_s
    delay = 0.25
    last = ""
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(
                    url, headers=headers, timeout=aiohttp.ClientTimeout(total=10.0)
                ) as response:
                    status = response.status
                if status in (401, 403):
                    raise ExecutorUnreachableError(
                        f"executor endpoint {base_url} refused the API key (HTTP {status}); "
                        "check AFLOWRL_EXECUTOR_API_KEY or environment.executor.apiKeySecret"
                    )
                if status < 500:
                    logger.info("executor endpoint %s answers (HTTP %d)", base_url, status)
                    return
                last = f"HTTP {status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + delay > deadline:
                raise ExecutorUnreachableError(
                    f"executor endpoint {base_url} did not answer within {wait_s:g} s ({last}); "
                    "check environment.executor.baseUrl"
                )
            logger.info("waiting for executor endpoint %s (%s)", base_url, last)
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)


class MeteredExecutor:
    """An :class:`Executor` that counts its failed calls by kind (``executor_requests_total``)."""

    def __init__(self, inner: Executor, metrics: EnvironmentMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    @property
    def executor_id(self) -> str:
        return self.inner.executor_id

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> ChatResult:
        try:
            return await self.inner.chat(
                messages, n=n, temperature=temperature, max_tokens=max_tokens, seed=seed
            )
        except executor_errors.ExecutorError as exc:
            outcome = next((name for kind, name in _OUTCOMES if isinstance(exc, kind)), "error")
            self.metrics.executor_requests.labels(outcome).inc()
            raise

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"MeteredExecutor({self.inner!r})"
