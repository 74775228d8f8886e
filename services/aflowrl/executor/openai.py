"""Executor client for any OpenAI-compatible chat endpoint (OpenAI, a gateway, a vLLM server).

``POST {base_url}/chat/completions`` over aiohttp, with:

- a concurrency limit (calls in flight, retries included, so a throttled endpoint sees less
  load, not more);
- a timeout per HTTP attempt;
- retries of 429, 5xx, connection failures and timeouts, at most ``max_retries`` times, after
  the endpoint's ``Retry-After`` when it sends one, else after exponential backoff with "equal
  jitter": d = min(cap, base * 2^attempt), sleep = d/2 + U(0, d/2) (AWS Architecture Blog,
  "Exponential Backoff And Jitter", 2015). Other 4xx answers are never retried;
- one-line errors that name the cause and the fix (:func:`connection_error`,
  :func:`http_error`, :func:`timeout_error`: refused, DNS, a model the server does not serve, a
  base URL without ``/v1``, a refused API key), typed by retryability (``errors``);
- token usage and cost from the price table (``pricing``); an unknown price or a missing usage
  gives cost None;
- the API key from the argument, else ``aflowrl.envs`` ($AFLOWRL_EXECUTOR_API_KEY_FILE, then
  $AFLOWRL_EXECUTOR_API_KEY, then $OPENAI_API_KEY). It is sent only in the Authorization header
  and appears in no log line, error or repr.

Built directly or from ``aflowrl.config.OpenAIExecutorSpec`` (:meth:`OpenAIExecutor.from_spec`).
Workflow operators call it through the ``Executor`` protocol (``aflowrl.executor.base``).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from aflowrl import documents, envs
from aflowrl.config import OpenAIExecutorSpec
from aflowrl.errors import InvalidInputError
from aflowrl.executor.base import ChatResult, Message, Usage
from aflowrl.executor.errors import (
    ExecutorError,
    ExecutorRateLimitedError,
    ExecutorRequestError,
    ExecutorResponseError,
    ExecutorTimeoutError,
    ExecutorUnavailableError,
)
from aflowrl.executor.pricing import Price, lookup_price

logger = logging.getLogger(__name__)

_RETRYABLE = (ExecutorRateLimitedError, ExecutorUnavailableError, ExecutorTimeoutError)
_BODY_EXCERPT = 300


class _Secret:
    """A string that never shows itself in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


@dataclass
class ExecutorStats:
    """Running totals of one client, for the service's metrics exporter."""

    calls: int = 0
    """``chat`` calls that returned."""
    failed_calls: int = 0
    """``chat`` calls that raised."""
    http_requests: int = 0
    """HTTP attempts, retries included."""
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    """Summed cost of the calls whose cost is known."""
    unpriced_calls: int = 0
    """Calls whose cost is unknown (model not in the price table, or no usage reported)."""
    latency_s: float = 0.0
    """Summed wall time of returned calls."""


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def public_endpoint(base_url: str) -> str:
    """``base_url`` without credentials, query or fragment, and without a trailing slash."""
    parts = urlsplit(base_url.strip())
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


class OpenAIExecutor:
    """An :class:`~aflowrl.executor.base.Executor` for an OpenAI-compatible chat endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_concurrency: int = 32,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 300.0,
        price: Price | None = None,
        rng: random.Random | None = None,
    ) -> None:
        parts = urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInputError(f"{base_url!r} is no http(s) URL", field="baseUrl")
        if not model.strip():
            raise InvalidInputError("empty model name", field="model")
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise InvalidInputError(
                "need maxConcurrency >= 1, maxRetries >= 0 and timeoutS > 0", field="executor"
            )
        self._url = base_url.strip().rstrip("/") + "/chat/completions"
        self._endpoint = public_endpoint(base_url)
        self.model = model
        key = api_key if api_key is not None else envs.AFLOWRL_EXECUTOR_API_KEY
        self._api_key = _Secret(key) if key else None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.retry_after_max_s = retry_after_max_s
        self.price = price if price is not None else lookup_price(model)
        if self.price is None:
            logger.info("no price known for model %r: executor costs are reported unknown", model)
        self.stats = ExecutorStats()
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_spec(cls, spec: OpenAIExecutorSpec, *, api_key: str | None = None) -> OpenAIExecutor:
        """The client a run spec describes. With ``serve`` the endpoint is the one the operator
        serves ($AFLOWRL_EXECUTOR_BASE_URL in the pods)."""
        base_url = spec.base_url or envs.AFLOWRL_EXECUTOR_BASE_URL
        if not base_url:
            raise InvalidInputError(
                "no endpoint: set baseUrl, or AFLOWRL_EXECUTOR_BASE_URL for a served executor",
                field="environment.executor.baseUrl",
            )
        price = (
            Price(spec.price.input_per_mtok, spec.price.output_per_mtok)
            if spec.price is not None
            else None
        )
        return cls(
            base_url,
            spec.model,
            api_key=api_key,
            temperature=spec.temperature,
            max_tokens=spec.max_tokens,
            max_concurrency=spec.max_concurrency,
            timeout_s=spec.timeout_s,
            max_retries=spec.max_retries,
            price=price,
        )

    @property
    def executor_id(self) -> str:
        """``openai:<model>@<endpoint>``, plus the default sampling settings that change answers."""
        settings = [
            f"{name}={value}"
            for name, value in (("temperature", self.temperature), ("max_tokens", self.max_tokens))
            if value is not None
        ]
        suffix = "?" + "&".join(settings) if settings else ""
        return f"openai:{self.model}@{self._endpoint}{suffix}"

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else "none"
        return f"OpenAIExecutor({self.executor_id!r}, api_key={key})"

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> ChatResult:
        """Sample ``n`` completions. Endpoints that return fewer choices than asked are asked
        again for the rest (with the seed shifted, so the extra samples differ)."""
        if n < 1:
            raise InvalidInputError(f"n={n} must be at least 1", field="n")
        if not messages:
            raise InvalidInputError("no messages", field="messages")
        started = time.monotonic()
        texts: list[str] = []
        usage = Usage()
        usage_known = True
        model = self.model
        try:
            async with self._semaphore:
                for round_index in range(n):
                    body = self._request_body(
                        messages,
                        n=n - len(texts),
                        temperature=temperature,
                        max_tokens=max_tokens,
                        seed=None if seed is None else seed + round_index,
                    )
                    answer = await self._post_with_retries(body)
                    choices, call_usage, model = self._read_answer(answer)
                    texts.extend(choices[: n - len(texts)])
                    usage = usage + (call_usage or Usage())
                    usage_known = usage_known and call_usage is not None
                    if len(texts) >= n:
                        break
        except BaseException:
            self.stats.failed_calls += 1
            raise
        latency_s = time.monotonic() - started
        cost = self.price.cost(usage) if self.price is not None and usage_known else None
        self._record(usage, cost, latency_s)
        return ChatResult(tuple(texts), usage, cost, model, latency_s)

    def _request_body(
        self,
        messages: Sequence[Message],
        *,
        n: int,
        temperature: float | None,
        max_tokens: int | None,
        seed: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "n": n,
        }
        options = {
            "temperature": temperature if temperature is not None else self.temperature,
            "max_tokens": max_tokens if max_tokens is not None else self.max_tokens,
            "seed": seed,
        }
        body.update({name: value for name, value in options.items() if value is not None})
        return body

    async def _post_with_retries(self, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.max_retries + 1):
            try:
                return await self._post(body)
            except _RETRYABLE as exc:
                if attempt == self.max_retries:
                    raise
                delay = self._retry_delay(attempt, exc.delay_s)
                self.stats.retries += 1
                logger.warning(
                    "executor %s: %s; retry %d of %d in %.2f s",
                    self.executor_id,
                    exc,
                    attempt + 1,
                    self.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def _retry_delay(self, attempt: int, retry_after_s: float | None) -> float:
        """Retry-After when the endpoint sent one, else d/2 + U(0, d/2), d = min(cap, b 2^a)."""
        if retry_after_s is not None:
            return min(retry_after_s, self.retry_after_max_s)
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2.0**attempt)
        return ceiling / 2 + self._rng.uniform(0.0, ceiling / 2)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        session = self._client_session()
        headers = {"Content-Type": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key.reveal()}"
        self.stats.http_requests += 1
        try:
            async with session.post(
                self._url,
                data=json.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                status = response.status
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                text = await response.text(errors="replace")
        except TimeoutError:
            raise timeout_error(self._endpoint, self.timeout_s) from None
        except aiohttp.InvalidURL as exc:
            raise ExecutorRequestError(f"invalid URL {exc.url}", status=0) from None
        except aiohttp.ClientError as exc:
            raise connection_error(exc, self._endpoint) from None
        if status >= 400:
            raise http_error(
                status,
                text,
                endpoint=self._endpoint,
                path="/chat/completions",
                model=self.model,
                key_sent=self._api_key is not None,
                retry_after_s=retry_after,
            )
        if not 200 <= status < 300:
            raise ExecutorResponseError(f"unexpected HTTP {status} from {self._endpoint}")
        try:
            answer = documents.load_json(text, source=self._endpoint)
        except documents.DocumentError as exc:
            raise ExecutorResponseError(
                f"not accepted JSON from {self._endpoint} ({exc.reason}): {_excerpt(text)}"
            ) from None
        if not isinstance(answer, dict):
            raise ExecutorResponseError(f"not a JSON object from {self._endpoint}")
        return answer

    def _read_answer(self, answer: dict[str, Any]) -> tuple[list[str], Usage | None, str]:
        """(choice texts in index order, usage or None when absent, model name)."""
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ExecutorResponseError(f"no choices in the answer of {self._endpoint}")
        ordered = sorted(
            (c for c in choices if isinstance(c, dict)),
            key=lambda c: c.get("index", 0) if isinstance(c.get("index"), int) else 0,
        )
        texts: list[str] = []
        for choice in ordered:
            message = choice.get("message")
            content = message.get("content") if isinstance(message, dict) else choice.get("text")
            texts.append(content if isinstance(content, str) else "")
        if not texts:
            raise ExecutorResponseError(f"no readable choice in the answer of {self._endpoint}")
        usage: Usage | None = None
        raw_usage = answer.get("usage")
        if isinstance(raw_usage, dict):
            prompt = raw_usage.get("prompt_tokens")
            completion = raw_usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                usage = Usage(prompt, completion)
        model = answer.get("model")
        return texts, usage, model if isinstance(model, str) and model else self.model

    def _record(self, usage: Usage, cost: float | None, latency_s: float) -> None:
        self.stats.calls += 1
        self.stats.prompt_tokens += usage.prompt_tokens
        self.stats.completion_tokens += usage.completion_tokens
        self.stats.latency_s += latency_s
        if cost is None:
            self.stats.unpriced_calls += 1
        else:
            self.stats.cost_usd += cost

    def _client_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_concurrency)
            )
        return self._session

    async def aclose(self) -> None:
        """Close the HTTP connections (the client opens new ones if used again)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> OpenAIExecutor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


_KEY_FIX = (
    "set AFLOWRL_EXECUTOR_API_KEY or AFLOWRL_EXECUTOR_API_KEY_FILE (OPENAI_API_KEY also works)"
)


def timeout_error(endpoint: str, timeout_s: float) -> ExecutorTimeoutError:
    """A request to ``endpoint`` that got no answer in ``timeout_s``: cause and fix."""
    return ExecutorTimeoutError(
        f"no answer from {endpoint} within {timeout_s:g} s: the server may be overloaded or "
        "still loading the model; check it, or raise the executor's timeoutS"
    )


def connection_error(exc: aiohttp.ClientError, endpoint: str) -> ExecutorUnavailableError:
    """A request that reached no server (DNS, refused, reset...): cause and fix, one line."""
    host = urlsplit(endpoint).netloc
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        cause = f"host name {urlsplit(endpoint).hostname!r} not found (DNS)"
        fix = "check the host in the executor URL"
    elif isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, ConnectionRefusedError
    ):
        cause = f"connection refused by {host}"
        fix = "is the server running, and is the executor URL's port right?"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        cause = f"cannot connect to {host} ({exc.os_error.strerror or exc.os_error})"
        fix = "check the executor URL and the network"
    else:
        cause = f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'connection failed'}"
        fix = "check that the server is up"
    return ExecutorUnavailableError(f"cannot reach {endpoint}: {cause}; {fix}")


def _model_unknown(status: int, text: str) -> bool:
    """Whether an error answer says the model does not exist: vLLM answers 404 "The model `x`
    does not exist.", OpenAI 404 ``model_not_found``; some gateways use 400."""
    lowered = text.lower()
    if "model_not_found" in lowered:
        return True
    if "model" not in lowered:
        return False
    return "does not exist" in lowered or (status == 404 and "not found" in lowered)


def http_error(
    status: int,
    text: str,
    *,
    endpoint: str,
    path: str,
    model: str,
    key_sent: bool,
    retry_after_s: float | None = None,
) -> ExecutorError:
    """The typed error of an HTTP error answer (status >= 400), one line with cause and fix:
    429 and 5xx are retryable, the rest permanent."""
    excerpt = _excerpt(text)
    where = f"HTTP {status} from {endpoint}{path}"
    if status == 429:
        return ExecutorRateLimitedError(f"{where}: {excerpt}", delay_s=retry_after_s)
    if status >= 500:
        return ExecutorUnavailableError(f"{where}: {excerpt}", status=status, delay_s=retry_after_s)
    if status in (401, 403):
        sent = "refused the API key" if key_sent else "needs an API key and none was set"
        return ExecutorRequestError(
            f"{where}: the endpoint {sent} ({excerpt}); {_KEY_FIX}", status=status
        )
    if status in (400, 404) and _model_unknown(status, text):
        return ExecutorRequestError(
            f"{where}: model {model!r} is not served there ({excerpt}); pass a model it serves "
            f"(--model, or environment.executor.model in a run; GET {endpoint}/models lists "
            "them)",
            status=status,
        )
    if status == 404 and not urlsplit(endpoint).path.rstrip("/").endswith("/v1"):
        return ExecutorRequestError(
            f"{where}: no such path; an OpenAI-compatible base URL usually ends in /v1: "
            f"try {endpoint}/v1",
            status=status,
        )
    return ExecutorRequestError(f"{where}: {excerpt}", status=status)


def _excerpt(text: str) -> str:
    """The error message of an OpenAI-style error body, else the body's start."""
    try:
        body = documents.load_json(text, source="error body")
    except documents.DocumentError:
        body = None  # not an OpenAI-style error: the body's start is shown instead
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            text = str(message)
    text = " ".join(text.split())
    return text[:_BODY_EXCERPT] + ("..." if len(text) > _BODY_EXCERPT else "")
