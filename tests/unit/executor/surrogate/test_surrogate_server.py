"""The OpenAI-compatible server, over real HTTP on loopback: our client and raw HTTP get what the
in-process path gives, and what OpenAI's API would refuse (an unknown model, an unknown route, a
parameter the surrogate does not implement) is refused in OpenAI's error shape."""

from __future__ import annotations

import json

import aiohttp
import pytest

from aflowrl.executor.base import Message
from aflowrl.executor.errors import ExecutorRequestError
from aflowrl.executor.openai import OpenAIExecutor
from aflowrl.executor.surrogate.server import SurrogateServer
from aflowrl.workflow import prompts


async def test_the_openai_client_gets_the_in_process_answers(problems, surrogate, all_problems):
    from aflowrl.executor.surrogate import SurrogateExecutor

    reference = SurrogateExecutor(all_problems)
    async with SurrogateServer(surrogate) as server:
        client = OpenAIExecutor(server.base_url, "surrogate", api_key="any")
        try:
            for problem in problems["gsm8k"][:5] + problems["mbpp"][:2]:
                prompt = prompts.custom("Think step by step.", problem.question)
                message = [Message("user", prompt)]
                remote = await client.chat(message, n=2, seed=3, temperature=0.7)
                local = await reference.chat(message, n=2, seed=3, temperature=0.7)
                assert remote.texts == local.texts
                assert remote.usage == local.usage
                assert remote.model == "surrogate"
                assert remote.cost_usd is None  # the price table does not know "surrogate"
        finally:
            await client.aclose()


async def test_raw_http_models_errors_stop_and_metrics(problems, surrogate):
    problem = problems["drop"][0]
    async with (
        SurrogateServer(surrogate, models=["surrogate-x"]) as server,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{server.base_url}/models") as response:
            models = await response.json()
        assert [m["id"] for m in models["data"]] == ["surrogate-x"]
        body = {
            "model": "surrogate-x",
            "messages": [
                {"role": "system", "content": "You answer questions."},
                {"role": "user", "content": [{"type": "text", "text": problem.question}]},
            ],
            "seed": 1,
            "max_completion_tokens": 3,
        }
        async with http.post(f"{server.base_url}/chat/completions", json=body) as response:
            answer = await response.json()
        assert answer["object"] == "chat.completion" and answer["model"] == "surrogate-x"
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert len(answer["choices"][0]["message"]["content"]) <= 12
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        usage = answer["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        for bad, param in (
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
            ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
            (
                {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
                "temperature",
            ),
        ):
            request = {"model": "surrogate-x", **bad}
            async with http.post(f"{server.base_url}/chat/completions", json=request) as response:
                error = await response.json()
            assert response.status == 400 and error["error"]["param"] == param
        async with http.post(f"{server.base_url}/chat/completions", data=b"{oops") as response:
            assert response.status == 400
        stop = {
            **body,
            "max_completion_tokens": None,
            "stop": ["\n"],
            "messages": [
                {
                    "role": "user",
                    "content": prompts.custom(
                        "Explain step by step.", problems["gsm8k"][0].question
                    ),
                }
            ],
        }
        async with http.post(f"{server.base_url}/chat/completions", json=stop) as response:
            text = (await response.json())["choices"][0]["message"]["content"]
        assert "\n" not in text
        async with http.get(f"http://{server.host}:{server.port}/metrics") as response:
            metrics = await response.text()
        assert 'aflowrl_executor_surrogate_requests_total{status="ok"}' in metrics
        assert 'status="bad_request"' in metrics


async def test_streaming_gives_the_same_text_in_chunks(problems, surrogate):
    prompt = prompts.custom("Solve step by step.", problems["math"][1].question)
    body = {"model": "surrogate", "messages": [{"role": "user", "content": prompt}], "seed": 4}
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:
        async with http.post(f"{server.base_url}/chat/completions", json=body) as response:
            whole = (await response.json())["choices"][0]["message"]["content"]
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(f"{server.base_url}/chat/completions", json=streamed) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            events = [
                line[len("data: ") :]
                for line in (await response.text()).splitlines()
                if line.startswith("data: ")
            ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert any(c["choices"] and c["choices"][0].get("finish_reason") == "stop" for c in chunks)


_HELLO = [{"role": "user", "content": "Say hello."}]


async def _post(http: aiohttp.ClientSession, url: str, body: object) -> tuple[int, dict]:
    async with http.post(f"{url}/chat/completions", json=body) as response:
        return response.status, await response.json()


def _is_openai_error(answer: dict) -> bool:
    error = answer.get("error")
    return isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}


async def test_a_model_it_does_not_serve_is_404_model_not_found(surrogate):
    async with (
        SurrogateServer(surrogate, models=["surrogate", "gpt-4o-mini"]) as server,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(f"{server.base_url}/models") as response:
            assert [m["id"] for m in (await response.json())["data"]] == [
                "surrogate",
                "gpt-4o-mini",
            ]
        status, answer = await _post(http, server.base_url, {"model": "gpt-4o", "messages": _HELLO})
        assert status == 404 and _is_openai_error(answer)
        assert answer["error"]["code"] == "model_not_found"
        assert answer["error"]["type"] == "invalid_request_error"
        assert "`gpt-4o`" in answer["error"]["message"]
        async with http.get(f"{server.base_url}/models/gpt-4o") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "model_not_found"
        async with http.get(f"{server.base_url}/models/gpt-4o-mini") as response:
            assert (await response.json())["id"] == "gpt-4o-mini"
        # Each served name answers, and the reply names the model asked for.
        status, answer = await _post(
            http, server.base_url, {"model": "gpt-4o-mini", "messages": _HELLO, "seed": 1}
        )
        assert status == 200 and answer["model"] == "gpt-4o-mini"
        status, answer = await _post(http, server.base_url, {"messages": _HELLO})
        assert status == 400 and answer["error"]["param"] == "model"
        # Our own client treats it as permanent (no retries).
        client = OpenAIExecutor(server.base_url, "gpt-4o", api_key="any")
        try:
            with pytest.raises(ExecutorRequestError) as raised:
                await client.chat([Message("user", "Say hello.")])
            assert raised.value.status == 404
        finally:
            await client.aclose()


async def test_unknown_routes_and_methods_get_json_errors(surrogate):
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:
        root = f"http://{server.host}:{server.port}"
        for method, path, status in (
            ("GET", "/v1/nothing", 404),
            ("POST", "/v1/completions", 404),
            ("POST", "/v1/embeddings", 404),
            ("GET", "/", 404),
            ("GET", "/v1/chat/completions", 405),
            ("DELETE", "/v1/models", 405),
        ):
            async with http.request(method, root + path) as response:
                assert response.status == status, (method, path)
                assert response.content_type == "application/json", (method, path)
                answer = await response.json()
            assert _is_openai_error(answer), (method, path)
            assert path in answer["error"]["message"] and method in answer["error"]["message"]
        async with http.post(
            f"{server.base_url}/chat/completions", data=b"{oops", headers={"Content-Type": "x"}
        ) as response:
            assert response.status == 400 and _is_openai_error(await response.json())


@pytest.mark.parametrize(
    ("parameter", "value", "code"),
    [
        ("logprobs", True, "unsupported_value"),
        ("top_logprobs", 3, "unsupported_parameter"),
        ("tools", [{"type": "function", "function": {"name": "f"}}], "unsupported_value"),
        ("tool_choice", "auto", "unsupported_value"),
        ("functions", [{"name": "f"}], "unsupported_value"),
        ("response_format", {"type": "json_object"}, "unsupported_value"),
        ("logit_bias", {"50256": -100}, "unsupported_value"),
        ("top_p", 0.5, "unsupported_value"),
        ("frequency_penalty", 0.5, "unsupported_value"),
        ("presence_penalty", -1, "unsupported_value"),
        ("audio", {"voice": "alloy", "format": "wav"}, "unsupported_parameter"),
        ("modalities", ["text", "audio"], "unsupported_value"),
        ("reasoning_effort", "high", "unsupported_parameter"),
        ("prediction", {"type": "content", "content": "x"}, "unsupported_parameter"),
        ("store", True, "unsupported_value"),
        ("top_k", 5, None),
        ("best_of", 2, None),
    ],
)
async def test_a_parameter_it_does_not_implement_is_a_400_naming_it(
    surrogate, parameter, value, code
):
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:
        body = {"model": "surrogate", "messages": _HELLO, parameter: value}
        status, answer = await _post(http, server.base_url, body)
    assert status == 400 and _is_openai_error(answer)
    assert answer["error"]["param"] == parameter
    assert answer["error"]["code"] == code
    assert parameter in answer["error"]["message"]


async def test_values_that_change_nothing_are_accepted_and_change_nothing(surrogate):
    neutral = {
        "logprobs": False,
        "top_p": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "logit_bias": {},
        "modalities": ["text"],
        "store": False,
        "user": "someone",
        "metadata": {"run": "x"},
        "service_tier": "auto",
        "top_logprobs": None,
        "audio": None,
    }
    base = {"model": "surrogate", "messages": _HELLO, "seed": 5, "n": 2}
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:
        status, plain = await _post(http, server.base_url, base)
        assert status == 200
        status, answer = await _post(http, server.base_url, {**base, **neutral})
    assert status == 200
    assert [c["message"] for c in answer["choices"]] == [c["message"] for c in plain["choices"]]


async def test_request_shapes_openai_refuses_are_refused(surrogate):
    cases = [
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": "yes"}, "stream"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
            "messages[0].tool_calls",
        ),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": float("inf")}, None),
    ]
    async with SurrogateServer(surrogate) as server, aiohttp.ClientSession() as http:
        for extra, param in cases:
            body = {"model": "surrogate", "messages": _HELLO, **extra}
            if param is None:  # not JSON-serialisable as OpenAI reads it: send the raw text
                raw = json.dumps(body)
                async with http.post(
                    f"{server.base_url}/chat/completions",
                    data=raw,
                    headers={"Content-Type": "application/json"},
                ) as response:
                    assert response.status == 400, raw
                continue
            status, answer = await _post(http, server.base_url, body)
            assert status == 400 and _is_openai_error(answer), extra
            assert answer["error"]["param"] == param, (extra, answer)
