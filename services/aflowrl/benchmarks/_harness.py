"""Code verdicts out of the answer's reach: AFlow's HumanEval / MBPP harness in two processes.

AFlow (``metagpt/ext/aflow/benchmark/humaneval.py``, ``mbpp.py``) sanitises the answer
(``_sanitize``), prepends the helper a few HumanEval tests call (``encode_cyclic``,
``encode_shift``, ``poly``), executes it in a namespace preloaded with ``math``, ``hashlib``,
``re`` and the ``typing`` names ``List, Dict, Tuple, Optional, Any``, requires the entry point to
be defined, executes the test code in the same namespace and calls ``check(<entry point>)``
(HumanEval) or ``check()`` (MBPP) with a 15-second limit; the answer passes when ``check``
returns None.

Here the same happens in one sandbox run of :mod:`._verdict`, but the answer and the tests live
in different processes: a trusted driver (the run's main process, non-dumpable) runs the tests,
and the answer runs in the run's companion process (``aflowrl.sandbox``'s ``private_main``),
which sees only the arguments of each call, over a pipe, and sends back plain values (see
:mod:`._verdict`). The payload (answer, tests, a nonce) travels on the run's stdin, which only the
driver holds; the verdict is the driver's one line on stdout, which no other process holds; a
run that ends any other way fails. So nothing the answer does to its own interpreter (frames,
builtins, modules, ``__eq__``, exit codes, fds, threads, children) can make a wrong answer pass.

Why this design: a second sandbox per verdict would double the sandbox cost and still need a
trusted channel between them; two processes of one run share its limits and cleanup, and the
only things the answer could reach the driver through (its memory, fds, ptrace, signals) are
closed by non-dumpability and the seccomp filter or end in no verdict (a killed or stopped
driver). The answer process is forked from a per-worker template that never held a run's data
rather than started as a new interpreter (which cost a third of a verdict's time in AFlow's
namespace imports alone), and the verdict program is compiled once by the host
(:func:`verdict_main`).

Differences from AFlow, all on purpose (forge-proofness wins over faithfulness):

- The tests see the answer's results as plain values (exact ``int``, ``float``, ``str``, ``list``,
  ``dict``... , with subclasses read as their base type: a ``Counter`` is a dict, a namedtuple a
  tuple), numpy scalars as Python ones, and any other object as an opaque value that keeps only
  its truth value and equals nothing else (MBPP 737, 787 and 794 test a regex match only for
  truth). A generator, an ndarray, a ``Decimal`` or an object with its own ``__eq__`` compares
  unequal to everything, where in AFlow its own methods decide.
- Arguments are copies: an answer that mutates its argument in place is not seen doing so by
  the test. (No canonical solution of HumanEval or MBPP, nor any of their tests, relies on it:
  every one scores the same with deep-copied arguments.) A test that passes the answer anything
  but a plain value fails with a TypeError (none does).
- The helpers the tests call (``poly``, ``encode_cyclic``, ``encode_shift``) are the harness's
  own: an answer that redefines ``poly`` changes its own copy only (in AFlow it would change the
  test's check of HumanEval/32). The answer still gets them prepended, as in AFlow.
- Other names the tests take from the answer's namespace (MBPP 596 uses the answer's ``import
  sys``; HumanEval/33 calls ``sort_third`` by name) are bound to proxies (functions), to the same
  standard module imported by the driver (modules; not third-party ones), or to plain values.
- An exception from the answer reaches the test as the builtin exception of that name with its
  message (else ``AnswerError``); ``StopIteration``, ``SystemExit`` and other ``BaseException``
  that are not ``Exception`` fail the run at once, and so does ``sys.exit()`` in ``check`` (AFlow's
  thread swallows it and passes).
- The 15-second limit covers the time ``check`` waits for the answer; loading the answer gets
  ``startup_timeout_s``; the sandbox's wall clock bounds the whole run.
"""

from __future__ import annotations

import functools
import json
import marshal
import secrets
from dataclasses import dataclass
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Protocol

_HERE = Path(__file__).parent
_SANITIZER_SOURCE = (_HERE / "_sanitize.py").read_text(encoding="utf-8")
_VERDICT_SOURCE = (_HERE / "_verdict.py").read_text(encoding="utf-8")

_LOADER = """\
from importlib._bootstrap_external import MAGIC_NUMBER
if MAGIC_NUMBER == {magic!r}:
    import marshal
    SANITIZER, _program = marshal.loads({code!r})
else:  # another Python runs the sandbox: its own bytecode
    SANITIZER = compile({sanitizer!r}, "<sanitizer>", "exec")
    _program = compile({source!r}, "<verdict>", "exec")
exec(_program)
"""


@functools.cache
def verdict_main() -> str:
    """``main.py`` of every verdict run: :mod:`._verdict` and the sanitiser (``SANITIZER``, which
    the driver executes) compiled once here and marshalled (compiling them in each run cost more
    than the rest of a verdict), with their sources for a sandbox interpreter of another
    bytecode version."""
    sanitizer = compile(_SANITIZER_SOURCE, "<sanitizer>", "exec")
    program = compile(_VERDICT_SOURCE, "<verdict>", "exec")
    return _LOADER.format(
        magic=MAGIC_NUMBER,
        code=marshal.dumps((sanitizer, program)),
        sanitizer=_SANITIZER_SOURCE,
        source=_VERDICT_SOURCE,
    )


HELPERS: dict[str, str] = {
    # HumanEval/38: the tests encode with encode_cyclic, which decode_cyclic must invert.
    "decode_cyclic": (
        "\n\ndef encode_cyclic(s: str):\n"
        "    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]\n"
        "    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]\n"
        '    return "".join(groups)\n\n'
    ),
    # HumanEval/50: the tests encode with encode_shift.
    "decode_shift": (
        "\n\ndef encode_shift(s: str):\n"
        '    return "".join([chr(((ord(ch) + 5 - ord("a")) % 26) + ord("a")) for ch in s])\n\n\n'
    ),
    # HumanEval/32: the tests evaluate the polynomial with poly (AFlow's version uses x ** i).
    "find_zero": (
        "\n\ndef poly(xs: list, x: float):\n"
        "    return sum(coeff * (x ** i) for i, coeff in enumerate(xs))\n\n"
    ),
}
"""Helpers AFlow puts before the (sanitised) answer, by entry point (the answer's own definitions
of the same names win there); the driver defines its own copy for the tests."""


class SandboxResultLike(Protocol):
    """What the harness reads of ``aflowrl.sandbox.SandboxResult``."""

    @property
    def status(self) -> str: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


@dataclass(frozen=True)
class Program:
    """A verdict program: its code (``main.py``), its stdin (the payload), its verdict's nonce."""

    code: str
    stdin: str
    nonce: str


@dataclass(frozen=True)
class Verdict:
    """The outcome of one run."""

    passed: bool
    reason: str


def build_program(
    *,
    solution: str,
    test: str,
    entry_point: str,
    pass_candidate: bool,
    check_timeout_s: float,
    startup_timeout_s: float,
) -> Program:
    """The sandbox program scoring ``solution`` against ``test`` (see the module docstring).

    It must run with ``private_main=True`` (the driver non-dumpable) and ``stdin=program.stdin``.
    """
    nonce = secrets.token_hex(16)
    payload = {
        "nonce": nonce,
        "solution": solution,
        "test": test,
        "entry_point": entry_point,
        "helper": HELPERS.get(entry_point, ""),
        "pass_candidate": pass_candidate,
        "check_timeout_s": float(check_timeout_s),
        "startup_timeout_s": float(startup_timeout_s),
    }
    return Program(verdict_main(), json.dumps(payload), nonce)


def read_verdict(result: SandboxResultLike, nonce: str, *, timeout_s: float) -> Verdict:
    """The driver's verdict: exit status 0 and exactly one JSON line on stdout, with the nonce.
    Anything else is a failure, with what the run said about why."""
    if result.status == "ok" and result.returncode == 0:
        lines = result.stdout.splitlines()
        value = None
        if len(lines) == 1:
            try:
                value = json.loads(lines[0])
            except json.JSONDecodeError:
                value = None
        if (
            isinstance(value, dict)
            and value.keys() == {"nonce", "passed", "reason"}
            and value["nonce"] == nonce
            and isinstance(value["passed"], bool)
            and isinstance(value["reason"], str)
        ):
            return Verdict(value["passed"], value["reason"])
        return Verdict(False, "No verdict: the verdict program printed something else.")
    why = getattr(result, "reason", None)  # aflowrl.sandbox.SandboxResult says why it ended
    if result.status == "timeout":
        return Verdict(
            False, f"Execution timed out after {timeout_s:g} s ({why or 'sandbox wall clock'})."
        )
    if result.status == "killed":
        return Verdict(False, f"Killed by the sandbox ({why or 'a resource limit'}).")
    tail = result.stderr.strip().splitlines()[-3:]
    return Verdict(
        False,
        f"No verdict (sandbox status {result.status}){': ' + ' | '.join(tail) if tail else ''}",
    )
