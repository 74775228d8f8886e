"""A client that hangs up on a streamed completion is normal: the surrogate server logs no error
and no traceback for it, and goes on serving."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from aflowrl.executor.surrogate.server import SurrogateServer


def _request(question: str, port: int) -> bytes:
    body = json.dumps(
        {
            "model": "surrogate",
            "messages": [{"role": "user", "content": question}],
            "n": 8,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _hang_up(port: int, question: str, *, read_bytes: int) -> None:
    """Send a streamed completion request, read ``read_bytes`` of the answer, close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(question, port))
    await writer.drain()
    if read_bytes:
        await reader.readexactly(read_bytes)
    writer.close()
    await writer.wait_closed()


async def test_a_client_hanging_up_on_a_stream_logs_no_error_and_no_traceback(
    problems, all_problems, caplog
):
    from aflowrl.executor.surrogate import SurrogateExecutor

    # The delay makes the server answer after the first client has gone: its writes then meet
    # a closed connection every time.
    surrogate = SurrogateExecutor(all_problems, latency_ms=300)
    question = problems["gsm8k"][0].question
    caplog.set_level(logging.DEBUG, logger="aflowrl")
    async with SurrogateServer(surrogate) as server:
        await _hang_up(server.port, question, read_bytes=0)
        await _hang_up(server.port, question, read_bytes=200)
        await asyncio.sleep(1.0)  # the server's writes after the hang-ups happen meanwhile
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{server.base_url}/chat/completions",
                json={"model": "surrogate", "messages": [{"role": "user", "content": question}]},
            ) as response,
        ):
            assert response.status == 200  # still serving
    records = caplog.records  # the server's and aiohttp's own
    assert not [r for r in records if r.levelno >= logging.WARNING], records
    assert not [r for r in records if r.exc_info], records
    assert len([r for r in records if "hung up" in r.getMessage()]) <= 2
