"""A small deterministic OpenAI-compatible server that answers from the problems it is given.

For end-to-end tests and the evaluator benchmark: it speaks ``POST /v1/chat/completions`` (with
``n``, ``seed``, ``max_tokens``, usage counts) and ``GET /v1/models`` over real HTTP, finds which
of its problems a prompt is about, reads which operator is asking (the prompts' own words), and
replies in that operator's format with the reference answer. With ``wrong_rate`` > 0 a
deterministic share of (problem, seed) pairs gets a wrong answer, which reviews then reject and
revisions fix, so loops and ensembles are exercised. The calibrated surrogate executor (issue 4)
is the realistic stand-in; this one only has to be predictable.

Run as a script (``python oracle_openai_server.py --data-dir DIR --benchmark gsm8k``) it prints
``{"port": P}`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aflowrl.benchmarks.base import Problem


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


@dataclass(frozen=True)
class _Known:
    problem: Problem
    key: str
    answer: str
    """The short right answer (number, expression, span) or the reference code."""


def _answer(problem: Problem) -> str:
    record = problem.record
    if problem.benchmark == "math":
        return last_boxed(str(record.get("solution", problem.gold))) or problem.gold
    if problem.benchmark == "drop":
        return str(record.get("ref_text", problem.gold)).split("|")[0].strip()
    if problem.benchmark == "humaneval":
        return str(record["prompt"]) + str(record["canonical_solution"])
    if problem.benchmark == "mbpp":
        return str(record["code"])
    return str(record.get("answer", problem.gold))


def _key(question: str) -> str:
    """A distinctive piece of the question: its last 160 non-blank characters."""
    return " ".join(question.split())[-160:]


class OracleServer:
    """``async with OracleServer(problems) as server:`` then ``server.base_url``."""

    def __init__(
        self, problems: Iterable[Problem], *, wrong_rate: float = 0.0, model: str = "oracle"
    ) -> None:
        self.known = [_Known(p, _key(p.question), _answer(p)) for p in problems]
        self.wrong_rate = wrong_rate
        self.model = model
        self.requests = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> OracleServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]}
        )

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return web.json_response({"error": {"message": "messages required"}}, status=400)
        self.requests += 1
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        seed = body.get("seed")
        n = int(body.get("n") or 1)
        texts = [self.reply(prompt, None if seed is None else int(seed) + i) for i in range(n)]
        completion_tokens = sum(len(t.split()) for t in texts)
        prompt_tokens = len(prompt.split())
        return web.json_response(
            {
                "id": f"chatcmpl-{self.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                    for i, text in enumerate(texts)
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    # ------------------------------------------------------------------ answers
    def _find(self, prompt: str) -> _Known | None:
        flat = " ".join(prompt.split())
        return next((k for k in self.known if k.key in flat), None)

    def _wrong(self, known: _Known, seed: int | None) -> bool:
        if self.wrong_rate <= 0:
            return False
        digest = hashlib.sha256(f"{known.problem.problem_id}|{seed}".encode()).digest()
        return digest[0] / 256 < self.wrong_rate

    def _text(self, known: _Known, right: bool) -> str:
        """The answer as a short text (code for code benchmarks)."""
        if known.problem.benchmark in ("humaneval", "mbpp"):
            if right:
                return known.answer
            entry = known.problem.entry_point or "solution"
            return f"def {entry}(*args, **kwargs):\n    return None\n"
        if right:
            return known.answer
        if known.problem.benchmark == "gsm8k":
            try:
                return str(int(float(known.answer.replace(",", ""))) + 1)
            except ValueError:
                return "-1"
        return "no idea"

    def _is_right(self, known: _Known, shown: str) -> bool:
        if known.problem.benchmark in ("humaneval", "mbpp"):
            return "return None" not in shown
        return known.answer in shown and "no idea" not in shown

    def _solution(self, known: _Known, text: str) -> str:
        """A full solution carrying ``text`` as its final answer, in the benchmark's style."""
        benchmark = known.problem.benchmark
        if benchmark in ("humaneval", "mbpp"):
            return f"```python\n{text}\n```"
        if benchmark in ("gsm8k", "math"):
            return f"Working through the problem step by step gives \\boxed{{{text}}}."
        return text

    def reply(self, prompt: str, seed: int | None) -> str:
        known = self._find(prompt)
        if known is None:
            return "I do not know which problem this is."
        right = not self._wrong(known, seed)
        text = self._text(known, right)
        if "<solution_letter>" in prompt:
            shown = re.findall(
                r"^([A-Z]):\n(.*?)(?=^[A-Z]:\n|\nReply in exactly|\Z)",
                prompt,
                re.MULTILINE | re.DOTALL,
            )
            good = [label for label, body in shown if self._is_right(known, body)]
            letter = good[0] if good else (shown[0][0] if shown else "A")
            return f"<thought>Comparing.</thought>\n<solution_letter>{letter}</solution_letter>"
        if "<review_result>" in prompt:
            proposed = prompt.split("Proposed", 1)[-1].split("Reply in exactly", 1)[0]
            ok = self._is_right(known, proposed)
            feedback = "It is correct." if ok else "The final answer is wrong; recompute it."
            return (
                f"<review_result>{str(ok).lower()}</review_result>\n<feedback>{feedback}</feedback>"
            )
        if "inside <solution></solution>" in prompt:
            return f"<solution>{self._solution(known, self._text(known, True))}</solution>"
        if "fails some of the problem's public tests" in prompt:
            return self._solution(known, self._text(known, True))
        if "<thought>" in prompt and "<answer>" in prompt:
            return f"<thought>Reasoning about it.</thought>\n<answer>{text}</answer>"
        if "<answer>the final answer</answer>" in prompt:
            solution = prompt.split("Solution:", 1)[-1]
            final = text if self._is_right(known, solution) else self._text(known, False)
            return f"<answer>{final}</answer>"
        if "`solve()`" in prompt:
            return f"```python\ndef solve():\n    return {text!r}\n```"
        return self._solution(known, text)


@contextmanager
def serve_in_thread(server: Any) -> Iterator[Any]:
    """Run an ``async with``-style server (this one, or any) on its own loop in a thread, so
    that other processes and other event loops can reach it while a test runs."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.__aenter__())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.__aexit__(None, None, None))
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30), "the server did not start within 30 s"
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


async def _main(args: argparse.Namespace) -> None:
    from aflowrl.benchmarks import get_benchmark

    benchmark = get_benchmark(args.benchmark)
    problems = benchmark.load(args.split, args.data_dir)
    async with OracleServer(problems, wrong_rate=args.wrong_rate) as server:
        print(json.dumps({"port": server.port}), flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--benchmark", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--data-dir")
    parser.add_argument("--wrong-rate", type=float, default=0.0)
    asyncio.run(_main(parser.parse_args()))
