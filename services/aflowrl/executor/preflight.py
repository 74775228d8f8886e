"""One cheap check of an OpenAI-compatible endpoint before a command starts its work.

Called by ``aflowrl eval`` and ``aflowrl optimize`` (:mod:`aflowrl.cli`) with the URL and the
``--model`` the user gave, before any problem runs: ``GET {base_url}/models`` (free on every
OpenAI-compatible server) says whether the server is reachable, takes the API key, sits at that
URL and serves that model. A server that does not list its models gets one chat completion of one
token instead. Nothing is retried, so a wrong URL fails in a second with one line
(:func:`aflowrl.executor.openai.connection_error` / :func:`~aflowrl.executor.openai.http_error`),
not after the client's retries and a traceback.
"""

from __future__ import annotations

import logging

import aiohttp

from aflowrl import documents
from aflowrl.errors import InvalidInputError
from aflowrl.executor.base import Message
from aflowrl.executor.errors import ExecutorRequestError
from aflowrl.executor.openai import (
    OpenAIExecutor,
    connection_error,
    http_error,
    public_endpoint,
    timeout_error,
)

logger = logging.getLogger(__name__)

__all__ = ["preflight", "served_models"]


async def served_models(
    base_url: str, *, api_key: str | None = None, timeout_s: float = 30.0
) -> list[str] | None:
    """The model ids ``GET {base_url}/models`` lists; None when the server lists none there
    (404, or an answer that is not an OpenAI model list). Unreachable, timed out, 401/403 and
    5xx raise the executor's typed errors."""
    from aflowrl import envs

    endpoint = public_endpoint(base_url)
    key = api_key if api_key is not None else envs.AFLOWRL_EXECUTOR_API_KEY
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                base_url.strip().rstrip("/") + "/models",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response,
        ):
            status = response.status
            text = await response.text(errors="replace")
    except TimeoutError:
        raise timeout_error(endpoint, timeout_s) from None
    except aiohttp.ClientError as exc:
        raise connection_error(exc, endpoint) from None
    if status in (401, 403) or status >= 429:
        raise http_error(
            status, text, endpoint=endpoint, path="/models", model="", key_sent=bool(key)
        )
    if status != 200:
        return None
    try:
        body = documents.load_json(text, source=f"{endpoint}/models")
    except documents.DocumentError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def preflight(
    base_url: str,
    model: str | None,
    *,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    flag: str = "--model",
) -> str:
    """Check the endpoint; returns the model to use: ``model``, or the one model the server
    serves when ``model`` is None. ``flag`` names the option that gives the model, in errors."""
    endpoint = public_endpoint(base_url)
    models = await served_models(base_url, api_key=api_key, timeout_s=timeout_s)
    if model is None:
        if models is not None and len(models) == 1:
            logger.info("model %r: the one model %s serves", models[0], endpoint)
            return models[0]
        served = f"{endpoint} serves {', '.join(models)}" if models else "it lists no models"
        raise InvalidInputError(
            f"name the executor model for an OpenAI-compatible endpoint ({served})", field=flag
        )
    if models:
        if model not in models:
            raise ExecutorRequestError(
                f"model {model!r} is not served at {endpoint} (it serves "
                f"{', '.join(models[:10])}{', ...' if len(models) > 10 else ''}); pass one of "
                f"them with {flag}",
                status=404,
            )
        return model
    # The server lists no models here: one completion of one token says the rest.
    async with OpenAIExecutor(
        base_url, model, api_key=api_key, max_retries=0, timeout_s=timeout_s, max_concurrency=1
    ) as probe:
        await probe.chat([Message("user", "Say OK.")], max_tokens=1)
    return model
