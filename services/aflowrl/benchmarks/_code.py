"""What HumanEval and MBPP share: pass@1 scoring in the sandbox, public example tests.

A code answer scores 1.0 when AFlow's harness (``_harness``) passes it against the problem's
hidden tests in the sandbox (``aflowrl.sandbox.arun_python``, the answer and the tests in
separate processes so that the answer cannot forge the verdict), else 0.0 with the reason (the
failing assertion, the timeout...). Public example tests (``<name>_public_test.jsonl``) are
attached to problems for a workflow's own Test operator; the hidden tests never are.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

from aflowrl import sandbox
from aflowrl.benchmarks import _data, _harness
from aflowrl.benchmarks.base import Benchmark, Problem, Score, TaskType

logger = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 15.0
"""AFlow's limit on one ``check`` call (seconds)."""

STARTUP_TIMEOUT_S = 5.0
"""Time to start the answer's interpreter, sanitise the answer and execute its module-level code
(seconds); the sandbox's wall clock is this plus the check limit plus :data:`_GRACE_S`."""

_GRACE_S = 2.0
"""Wall-clock allowance for the verdict driver itself (start, test code, verdict)."""


class SandboxRunner(Protocol):
    """Runs Python code in isolation: ``aflowrl.sandbox.arun_python`` or a stand-in."""

    def __call__(
        self,
        code: str,
        *,
        stdin: str,
        timeout_s: float,
        memory_mb: int,
        private_main: bool,
    ) -> Awaitable[_harness.SandboxResultLike]: ...


class CodeBenchmark(Benchmark):
    """A benchmark scored by running hidden tests on the answer (pass@1)."""

    task_type: TaskType = "code"
    pass_candidate: bool
    """Whether the tests' ``check`` takes the function (HumanEval) or nothing (MBPP)."""

    def __init__(
        self,
        *,
        check_timeout_s: float = CHECK_TIMEOUT_S,
        memory_mb: int = 2048,
        runner: SandboxRunner | None = None,
    ) -> None:
        self.check_timeout_s = check_timeout_s
        self.memory_mb = memory_mb
        self._runner = runner

    @abc.abstractmethod
    def reference_solution(self, problem: Problem) -> str:
        """The dataset's own solution of ``problem`` (it must score 1.0)."""

    async def score(self, problem: Problem, prediction: str) -> Score:
        entry_point = problem.entry_point
        if entry_point is None:
            return Score(0.0, "", "the problem names no entry point")
        program = _harness.build_program(
            solution=prediction,
            test=problem.gold,
            entry_point=entry_point,
            pass_candidate=self.pass_candidate,
            check_timeout_s=self.check_timeout_s,
            startup_timeout_s=STARTUP_TIMEOUT_S,
        )
        timeout_s = self.check_timeout_s + STARTUP_TIMEOUT_S + _GRACE_S
        runner = self._runner if self._runner is not None else sandbox.arun_python
        result = await runner(
            program.code,
            stdin=program.stdin,
            timeout_s=timeout_s,
            memory_mb=self.memory_mb,
            private_main=True,
        )
        verdict = _harness.read_verdict(result, program.nonce, timeout_s=timeout_s)
        if not verdict.passed:
            logger.debug("%s %s failed: %s", self.name, problem.problem_id, verdict.reason)
        return Score(1.0 if verdict.passed else 0.0, prediction, verdict.reason)

    def _public_tests(self, data_dir: Path | None) -> list[tuple[int, _data.Record]]:
        """Records of ``<name>_public_test.jsonl`` (none when there is no such file)."""
        if data_dir is None:
            return []
        path = data_dir / f"{self.name}_public_test.jsonl"
        if not path.is_file():
            logger.info("no %s: problems get no public tests", path)
            return []
        records = list(_data.read_jsonl(path))
        for line, record in records:
            _data.text_field(path, line, record, "entry_point")
            _data.list_field(path, line, record, "test")
        return records
