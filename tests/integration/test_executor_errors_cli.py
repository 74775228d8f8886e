"""A real executor's failures end ``aflowrl eval`` / ``optimize`` with one line and exit 3.

Each case runs the real command in a child process against a real aiohttp server on loopback
(or a closed port) and reads its stderr: exactly one line naming the cause and the fix, no
traceback, and the exit status of :mod:`aflowrl.cli.exitcodes`. The endpoint is checked before
any problem runs (:mod:`aflowrl.executor.preflight`), so nothing waits on the client's retries.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from aflowrl.cli.exitcodes import ExitCode
from aflowrl.errors import InvalidInputError
from aflowrl.executor.errors import ExecutorTimeoutError
from aflowrl.executor.preflight import preflight

KEY = "sk-the-right-key"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "data"
    directory.mkdir()
    rows = [
        {"id": f"p{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    for split in ("validate", "test"):
        (directory / f"gsm8k_{split}.jsonl").write_text(text)
    return directory


def _vllm_like_app(
    models: list[str], *, list_models: bool = True, key: str | None = None, delay_s: float = 0.0
) -> web.Application:
    """An OpenAI-compatible server under /v1 that answers like vLLM: 404 for an unknown model,
    401 without the right key."""

    def refused(request: web.Request) -> web.Response | None:
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": {"message": "Invalid API key"}}, status=401)
        return None

    async def list_(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        answer = refused(request)
        if answer is not None:
            return answer
        return web.json_response({"object": "list", "data": [{"id": m} for m in models]})

    async def chat(request: web.Request) -> web.Response:
        answer = refused(request)
        if answer is not None:
            return answer
        body = await request.json()
        if body["model"] not in models:
            message = f"The model `{body['model']}` does not exist."
            error = {"message": message, "type": "NotFoundError", "code": 404}
            return web.json_response({"error": error}, status=404)
        choice = {"index": 0, "message": {"role": "assistant", "content": "\\boxed{0}"}}
        return web.json_response({"model": body["model"], "choices": [choice]})

    app = web.Application()
    if list_models:
        app.router.add_get("/v1/models", list_)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``http://127.0.0.1:PORT`` of ``app`` (no /v1)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def aflowrl(*argv: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``aflowrl ARGV`` in a child process."""
    import os

    child_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AFLOWRL_EXECUTOR_API_KEY", "AFLOWRL_EXECUTOR_API_KEY_FILE", "OPENAI_API_KEY")
    }
    child_env.update(env or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aflowrl",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=child_env,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


def _eval(url: str, data_dir: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--workflow",
        "io",
        "--benchmark",
        "gsm8k",
        "--executor",
        url,
        "--data-dir",
        str(data_dir),
        "--no-progress",
        *extra,
    ]


def assert_one_line(lines: list[str], *words: str) -> None:
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


async def test_an_unreachable_endpoint_is_one_line_and_exit_3(data_dir):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code, lines = await aflowrl(*_eval(url, data_dir, "--model", "m"))
    assert code == ExitCode.EXECUTOR
    assert_one_line(lines, "connection refused", "is the server running")


async def test_a_wrong_model_name_is_one_line_naming_the_served_ones(data_dir):
    async with serving(_vllm_like_app(["qwen-7b"])) as root:
        code, lines = await aflowrl(*_eval(f"{root}/v1", data_dir, "--model", "gpt-4o-mini"))
    assert code == ExitCode.EXECUTOR
    assert_one_line(lines, "'gpt-4o-mini' is not served", "qwen-7b", "--model")


async def test_a_wrong_model_on_a_server_without_a_model_list_is_one_line(data_dir):
    async with serving(_vllm_like_app(["qwen-7b"], list_models=False)) as root:
        code, lines = await aflowrl(*_eval(f"{root}/v1", data_dir, "--model", "gpt-4o-mini"))
    assert code == ExitCode.EXECUTOR
    assert_one_line(lines, "HTTP 404", "'gpt-4o-mini' is not served", "--model")


async def test_a_base_url_without_v1_suggests_adding_it(data_dir):
    async with serving(_vllm_like_app(["qwen-7b"])) as root:
        code, lines = await aflowrl(*_eval(root, data_dir, "--model", "qwen-7b"))
    assert code == ExitCode.EXECUTOR
    assert_one_line(lines, "HTTP 404", f"try {root}/v1")


async def test_a_refused_api_key_names_the_variables_to_set(data_dir):
    async with serving(_vllm_like_app(["qwen-7b"], key=KEY)) as root:
        url = f"{root}/v1"
        code, lines = await aflowrl(*_eval(url, data_dir, "--model", "qwen-7b"))
        assert code == ExitCode.EXECUTOR
        assert_one_line(lines, "HTTP 401", "AFLOWRL_EXECUTOR_API_KEY")
        assert KEY not in lines[0]
        env = {"AFLOWRL_EXECUTOR_API_KEY": "sk-wrong"}
        code, lines = await aflowrl(*_eval(url, data_dir, "--model", "qwen-7b"), env=env)
        assert code == ExitCode.EXECUTOR
        assert_one_line(lines, "refused the API key", "AFLOWRL_EXECUTOR_API_KEY")
        env = {"AFLOWRL_EXECUTOR_API_KEY": KEY}
        code, _ = await aflowrl(*_eval(url, data_dir, "--model", "qwen-7b"), env=env)
        assert code == ExitCode.OK


async def test_no_model_flag_takes_the_only_served_model_and_says_so(data_dir):
    async with serving(_vllm_like_app(["qwen-7b"])) as root:
        code, lines = await aflowrl(*_eval(f"{root}/v1", data_dir))
    assert code == ExitCode.OK
    assert any("--model qwen-7b" in line for line in lines), lines


async def test_no_model_flag_with_several_served_models_is_a_usage_error(data_dir):
    async with serving(_vllm_like_app(["a-model", "b-model"])) as root:
        code, lines = await aflowrl(*_eval(f"{root}/v1", data_dir))
    assert code == ExitCode.USAGE
    assert_one_line(lines, "--model", "a-model, b-model")


async def test_optimize_checks_its_endpoint_before_the_search(data_dir, tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    code, lines = await aflowrl(
        "optimize",
        "--benchmark",
        "gsm8k",
        "--executor",
        url,
        "--model",
        "m",
        "--data-dir",
        str(data_dir),
        "--run-dir",
        str(tmp_path / "run"),
        "--rounds",
        "1",
        "--no-progress",
    )
    assert code == ExitCode.EXECUTOR
    assert_one_line(lines, "connection refused")


async def test_a_silent_endpoint_times_out_with_a_retryable_error_naming_the_fix():
    async with serving(_vllm_like_app(["m"], delay_s=30)) as root:
        with pytest.raises(ExecutorTimeoutError, match=r"within 0\.5 s.*timeoutS"):
            await preflight(f"{root}/v1", "m", timeout_s=0.5)


async def test_preflight_without_a_model_on_a_server_that_lists_none_asks_for_one():
    async with serving(_vllm_like_app(["m"], list_models=False)) as root:
        with pytest.raises(InvalidInputError, match=r"--model.*lists no models"):
            await preflight(f"{root}/v1", None)


async def test_a_host_name_that_does_not_resolve_is_named_as_dns():
    """aiohttp's own DNS failure (from a resolver that finds nothing, so no lookup leaves the
    machine) is classified as such."""
    import socket as sockets

    import aiohttp
    from aiohttp.abc import AbstractResolver

    from aflowrl.executor.openai import connection_error

    class NoSuchHost(AbstractResolver):
        async def resolve(self, host, port=0, family=sockets.AF_INET):
            raise OSError(sockets.EAI_NONAME, "Name or service not known")

        async def close(self):
            pass

    connector = aiohttp.TCPConnector(resolver=NoSuchHost())
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientError) as caught:
            await session.get("http://executor.example/v1/models")
    error = connection_error(caught.value, "http://executor.example/v1")
    assert error.retryable
    assert "host name 'executor.example' not found (DNS)" in str(error)
    assert "check the host" in str(error)


async def test_an_executor_that_is_no_url_is_bad_input_not_a_network_error(data_dir):
    code, lines = await aflowrl(*_eval("localhost:8000", data_dir, "--model", "m"))
    assert code == ExitCode.USAGE
    assert_one_line(lines, "--executor", "no http(s) URL")
