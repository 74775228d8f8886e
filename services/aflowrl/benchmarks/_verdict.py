"""The verdict program: two processes in one sandbox run, so that a code answer cannot forge its
verdict. Built and read by :mod:`aflowrl.benchmarks._harness` (which says what it does on
purpose differently from AFlow); this file travels as source and imports only the standard
library.

- The **driver** is the run's main process (``python main.py``, made non-dumpable by the sandbox
  with ``private_main``). It reads the whole payload (answer, hidden tests, nonce) from stdin,
  points its stdout at /dev/null after keeping a private copy of it for the verdict, imports
  everything it will need, sends this program to the answer process and sanitises the answer.
  It runs the dataset's test code itself, with the driver's builtins, AFlow's helpers
  (``encode_cyclic``, ``poly``...) of its own, and with the entry point (and any other name the
  tests take from the answer) bound to a proxy: each call sends its arguments to the answer
  process and waits for a result. The names bound from the answer are exactly those the driver
  asked for (the test's free names that are no builtin, helper or dunder name); an answer
  process that offers any other name (so that the tests would call its ``abs`` or ``set``) ends
  the run as a failure. It prints one JSON line, ``{"nonce", "passed", "reason"}``, and
  exits 0; anything else (killed, late, more output) is no verdict, i.e. a failure.
- The **answer process** is the run's *companion* (``aflowrl.sandbox._zygote``): a second process
  of the run, with the same limits, forked from a template that has never held any run's data
  (as clean as a new interpreter, without its start-up cost). Its stdin, stdout and stderr are
  /dev/null and its only channel is a pair of pipes to the driver (fds 3 and 4); it never sees
  the tests, only each call's arguments. It executes the sanitised answer in AFlow's namespace
  and serves the calls.

Everything crossing from the answer to the driver is a JSON message of *plain values*: None,
bool, int, float (nan and inf included), complex, str, bytes, list, tuple, dict, set, frozenset,
of those exact types, nested at most :data:`MAX_DEPTH` deep, :data:`MAX_NODES` nodes and
:data:`MAX_FRAME_BYTES` bytes. The answer process converts subclasses of these to their base
type (a ``Counter`` is sent as a dict) and numpy scalars to Python ones; any other object crosses
as an :class:`AnswerObject` that keeps only its type name and truth value. The driver parses
strictly, so the test compares values that no answer code can reach: no ``__eq__`` of the
answer's, no frames, builtins or modules of the driver's within its reach (different process;
the driver is non-dumpable, so /proc/<pid>/mem, fd and environ and ptrace are closed to it; the
seccomp filter denies ptrace and process_vm_* besides). An exception raised by the answer
reaches the test as the builtin exception of that name (else :class:`AnswerError`); a
``StopIteration``, a ``SystemExit`` or any ``BaseException`` that is no ``Exception``, a late
reply, a dead answer process or a malformed message ends the run as a failure at once, without
passing through the test code.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import marshal
import math
import os
import re
import select
import signal
import struct
import sys
import time
import types
import typing
from collections.abc import Callable
from typing import Any, NoReturn

MAX_DEPTH = 100
"""Deepest nesting of a value crossing between the processes."""
MAX_NODES = 2_000_000
"""Most values (containers and scalars) in one message."""
MAX_FRAME_BYTES = 16 << 20
"""Largest message the driver accepts from the answer process."""
MAX_REASON_CHARS = 300
"""Longest exception message quoted in a verdict's reason."""

_LENGTH = struct.Struct(">I")
_JSON_INT = 1 << 53
"""Integers smaller than this in magnitude travel as JSON numbers; larger ones as hex text."""
_ANSWER_FDS = (3, 4)
"""Where each process reads the other (3) and writes to it (4): ``aflowrl.sandbox``'s
``COMPANION_FDS``, which this program cannot import."""
COMPANION_ARGV0 = "<companion>"
"""``sys.argv[0]`` of a sandbox run's companion (``aflowrl.sandbox._zygote.COMPANION_ARGV0``)."""
_CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")
"""Exceptions that end an iteration silently: raised into ``map(candidate, ...)`` or a
generator they would cut the test short, so they fail the run instead."""
_UNSAFE_MODULES = ("antigravity", "this")
"""Standard modules whose import does something (opens a browser, prints)."""
SANITIZER: types.CodeType | None = globals().get("SANITIZER")
"""The code of ``aflowrl.benchmarks._sanitize``, which ``main.py`` defines before it runs this
program in the same namespace (``_harness.verdict_main``); None when imported."""
_LOADER = b"""
import marshal, os, struct
def _read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(3, n - len(data))
        if not chunk:
            os._exit(0)
        data += chunk
    return data
exec(marshal.loads(_read(struct.unpack(">I", _read(4))[0])))
"""
"""The answer process's first program: it reads the verdict program's code from the driver."""


class AnswerError(Exception):
    """An exception of the answer's whose type is no builtin exception (named in the message)."""


class AnswerObject:
    """A result of the answer's that is no plain value (a regex match, a generator...): only its
    type name and truth value cross over. It equals nothing but itself."""

    __slots__ = ("truth", "type_name")

    def __init__(self, type_name: str, truth: bool | None) -> None:
        self.type_name = type_name
        self.truth = truth

    def __bool__(self) -> bool:
        if self.truth is None:
            raise TypeError(f"the answer's {self.type_name} object has no truth value")
        return self.truth

    def __repr__(self) -> str:
        return f"<the answer's {self.type_name} object>"


# -- plain values --------------------------------------------------------------------------------

_TAGS: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "F"}
_BUILDERS: dict[str, Callable[[list[Any]], Any]] = {
    "l": list,
    "t": tuple,
    "s": set,
    "F": frozenset,
}


def to_tree(value: Any, *, lenient: bool = False) -> Any:
    """``value`` as a JSON-able tree (see the module docstring). Strict (the driver's
    arguments): anything but an exact plain type raises TypeError. Lenient (the answer's
    results): subclasses become their base type, numpy scalars Python ones, anything else an
    :class:`AnswerObject`."""
    budget = [MAX_NODES - 1]

    def walk(v: Any, depth: int) -> Any:
        kind = type(v)
        if v is None or kind is bool or kind is str:
            return v
        if kind is int:
            return v if -_JSON_INT < v < _JSON_INT else ["i", hex(v)]
        if kind is float:
            return ["f", v.hex()]
        if kind is complex:
            return ["c", v.real.hex(), v.imag.hex()]
        if kind is bytes:
            return ["b", v.hex()]
        tag = "d" if kind is dict else _TAGS.get(kind)
        if tag is None:
            if lenient and kind is AnswerObject:
                return ["o", v.type_name, v.truth]
            if not lenient:
                raise TypeError(f"only plain values cross to the answer, not {kind.__name__}")
            return walk(_as_plain(v), depth + 1)
        if depth >= MAX_DEPTH:
            raise ValueError(f"a value nested deeper than {MAX_DEPTH}")
        items = [x for pair in v.items() for x in pair] if tag == "d" else v
        budget[0] -= len(items)
        if budget[0] < 0:
            raise ValueError(f"a value of more than {MAX_NODES} parts")
        tree = [tag]
        append = tree.append
        for item in items:  # scalars inline: a long list costs no call per item
            k = type(item)
            if (
                k is str
                or k is bool
                or item is None
                or (k is int and -_JSON_INT < item < _JSON_INT)
            ):
                append(item)
            else:
                append(walk(item, depth + 1))
        return tree

    return walk(value, 0)


def _as_plain(v: Any) -> Any:
    """The answer process's honest reading of a non-plain result (see :func:`to_tree`)."""
    if isinstance(v, bool | int):
        return int.__int__(v)
    if isinstance(v, float):
        return float.__float__(v)
    if isinstance(v, complex):
        return complex(float.__float__(v.real), float.__float__(v.imag))
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    if isinstance(v, dict):
        return dict(dict.items(v))
    for base in (list, tuple, set, frozenset):
        if isinstance(v, base):
            return base(base.__iter__(v))  # type: ignore[arg-type]  # the base's own items
    kind = type(v)
    if kind.__module__ == "numpy" and kind.__name__ != "ndarray" and hasattr(v, "item"):
        item = v.item()
        if type(item) in (bool, int, float, complex, str, bytes):
            return item
    try:
        truth: bool | None = bool(v)
    except Exception:  # noqa: BLE001  # an object whose truth cannot be told
        truth = None
    return AnswerObject(f"{kind.__module__}.{kind.__qualname__}"[:200], truth)


def from_tree(tree: Any) -> Any:
    """The plain value a tree stands for, built from scratch; raises ValueError (or TypeError
    for an unhashable key) on anything that is not a well-formed tree."""
    budget = [MAX_NODES - 1]

    def build(node: Any, depth: int) -> Any:
        kind = type(node)
        if node is None or kind is bool or kind is str or kind is int:
            return node
        if kind is not list or not node or type(node[0]) is not str:
            raise ValueError(f"malformed value {str(node)[:80]}")
        tag = node[0]
        if tag in _BUILDERS or tag == "d":
            if depth >= MAX_DEPTH:
                raise ValueError(f"a value nested deeper than {MAX_DEPTH}")
            budget[0] -= len(node) - 1
            if budget[0] < 0:
                raise ValueError(f"a value of more than {MAX_NODES} parts")
            items: list[Any] = []
            append = items.append
            for item in node[1:]:
                k = type(item)
                append(
                    item
                    if k is str or k is int or k is bool or item is None
                    else build(item, depth + 1)
                )
            if tag != "d":
                return _BUILDERS[tag](items)
            if len(items) % 2:
                raise ValueError("a dict with an odd number of parts")
            return dict(zip(items[::2], items[1::2], strict=True))
        rest = node[1:]
        if tag == "o" and len(rest) == 2 and type(rest[0]) is str and _is_truth(rest[1]):
            return AnswerObject(rest[0][:200], rest[1])
        if not all(type(item) is str for item in rest):
            raise ValueError(f"malformed {tag!r} value")
        if tag == "i" and len(rest) == 1:
            return int(rest[0], 16)
        if tag == "f" and len(rest) == 1:
            return float.fromhex(rest[0])
        if tag == "c" and len(rest) == 2:
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "b" and len(rest) == 1:
            return bytes.fromhex(rest[0])
        raise ValueError(f"malformed {tag!r} value")

    return build(tree, 0)


def _is_truth(value: Any) -> bool:
    """A truth value: True, False, or None for an object whose truth cannot be told."""
    return value is None or type(value) is bool


# -- messages: a 4-byte length, then a JSON array; never a JSON object, float or constant ---------


def encode_message(*fields: Any) -> bytes:
    """One message (the trees inside must come from :func:`to_tree`)."""
    body = json.dumps(list(fields), separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def decode_message(body: bytes) -> list[Any]:
    """Parse a message strictly: a JSON array of arrays, strings, integers, booleans and null."""
    message = json.loads(
        body.decode("utf-8"),
        parse_float=_refuse,
        parse_constant=_refuse,
        object_pairs_hook=_refuse,
    )
    if type(message) is not list or not message or type(message[0]) is not str:
        raise ValueError("a message is not an array that starts with its kind")
    return message


def _refuse(_value: Any) -> NoReturn:
    raise ValueError("floats, constants and objects are not part of a message")


class ChannelError(Exception):
    """The answer process is gone, late, or broke the protocol; ``reason`` says which."""


class Channel:
    """The driver's end of the pipes to the answer process: frames with a deadline each."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)

    def send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.write_fd, select.POLLOUT, deadline)
            try:
                view = view[os.write(self.write_fd, view[: 1 << 16]) :]
            except BlockingIOError:
                continue
            except OSError as exc:  # EPIPE: the answer process is gone
                raise ChannelError(f"the answer process is gone ({exc.strerror})") from None

    def receive(self, deadline: float) -> list[Any]:
        length = _LENGTH.unpack(self._read(_LENGTH.size, deadline))[0]
        if length > MAX_FRAME_BYTES:
            raise ChannelError(f"the answer sent {length} bytes, over {MAX_FRAME_BYTES}")
        try:
            return decode_message(self._read(length, deadline))
        except (ValueError, RecursionError, MemoryError) as exc:
            raise ChannelError(f"the answer sent a malformed message ({exc})") from None

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            self._wait(self.read_fd, select.POLLIN, deadline)
            try:
                chunk = os.read(self.read_fd, min(left, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise ChannelError("the answer process exited")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    @staticmethod
    def _wait(fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("late")
            if poller.poll(left * 1000):
                return


# -- the driver ------------------------------------------------------------------------------------


def aflow_namespace() -> dict[str, Any]:
    """What AFlow's harness puts in the namespace of the answer and the tests."""
    return {
        "math": math,
        "hashlib": hashlib,
        "re": re,
        "List": typing.List,  # noqa: UP006  # AFlow's names, as the answers use them
        "Dict": typing.Dict,  # noqa: UP006
        "Tuple": typing.Tuple,  # noqa: UP006
        "Optional": typing.Optional,
        "Any": typing.Any,
    }


def free_names(test: str, bound: set[str]) -> list[str]:
    """Names the test code reads but binds nowhere (nor ``bound`` nor builtins nor dunder
    names): the ones it takes from the answer's namespace in AFlow, and the only ones the driver
    binds from the answer (so the tests' builtins stay the driver's)."""
    tree = ast.parse(test)
    stored: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else stored).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stored.add(node.name)
        elif isinstance(node, ast.alias):
            stored.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            stored.add(node.name)
    return sorted(
        name
        for name in loaded - stored - bound - set(dir(builtins))
        if not (
            name.startswith("__") and name.endswith("__")
        )  # the interpreter's, never the answer's
    )


def imported_modules(test: str) -> list[str]:
    """Modules the test code imports (the driver imports them before the answer exists)."""
    names = []
    for node in ast.walk(ast.parse(test)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


class _Driver:
    """The run's main process: starts the answer process, runs the tests, prints the verdict."""

    def __init__(self, payload: dict[str, Any], report_fd: int) -> None:
        self.payload = payload
        self.report_fd = report_fd
        self.deadline = time.monotonic() + float(payload["startup_timeout_s"])
        self.sources: dict[str, str] = {"<test>": payload["test"]}
        self.channel: Channel | None = None
        self.checking = False

    def finish(self, passed: bool, reason: str) -> NoReturn:
        line = json.dumps({"nonce": self.payload["nonce"], "passed": passed, "reason": reason})
        data = memoryview((line + "\n").encode())
        while data:
            data = data[os.write(self.report_fd, data) :]
        os._exit(0)

    def start_answer(self, program: types.CodeType) -> None:
        """Send the answer process (the run's companion, on fds 3 and 4) its program: a loader,
        then this program's own code, marshalled (the same interpreter reads it)."""
        self.channel = Channel(*_ANSWER_FDS)
        code = marshal.dumps(program)
        data = b"".join([_LENGTH.pack(len(_LOADER)), _LOADER, _LENGTH.pack(len(code)), code])
        try:
            self.channel.send(data, self.deadline)
        except ChannelError as exc:
            self.no_answer(str(exc))

    def send(self, *fields: Any) -> None:
        assert self.channel is not None
        try:
            self.channel.send(encode_message(*fields), self.deadline)
        except ChannelError as exc:
            self.no_answer(str(exc))

    def receive(self) -> list[Any]:
        assert self.channel is not None
        try:
            return self.channel.receive(self.deadline)
        except ChannelError as exc:
            self.no_answer(str(exc))

    def no_answer(self, why: str) -> NoReturn:
        if why == "late":
            if self.checking:
                limit = float(self.payload["check_timeout_s"])
                self.finish(False, f"Execution timed out after {limit:g} s.")
            limit = float(self.payload["startup_timeout_s"])
            self.finish(False, f"The answer did not load within {limit:g} s.")
        self.finish(False, f"No verdict from the answer: {why}.")

    def proxy(self, name: str) -> Callable[..., Any]:
        """A stand-in for the answer's ``name``: each call is a round trip of plain values."""

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                sent = [to_tree(a) for a in args], [[k, to_tree(v)] for k, v in kwargs.items()]
            except (TypeError, ValueError) as exc:
                raise TypeError(f"the harness cannot pass this argument to {name}: {exc}") from None
            self.send("call", name, *sent)
            reply = self.receive()
            if reply[0] == "return" and len(reply) == 2:
                try:
                    return from_tree(reply[1])
                except (ValueError, TypeError, RecursionError, MemoryError) as exc:
                    self.finish(False, f"The answer returned a malformed value ({exc}).")
            if reply[0] == "raised" and len(reply) == 5:
                raise self.answer_exception(*reply[1:])
            if reply[0] == "failed" and len(reply) == 2:
                self.finish(False, str(reply[1])[:MAX_REASON_CHARS])
            self.finish(False, f"The answer broke the protocol ({str(reply)[:80]}).")

        call.__name__ = call.__qualname__ = name
        return call

    def answer_exception(self, name: Any, message: Any, where: Any, is_exception: Any) -> Exception:
        name, message, where = str(name)[:100], str(message)[:MAX_REASON_CHARS], str(where)[:200]
        kind = getattr(builtins, name, None)
        if is_exception is not True or name in _CONTROL_FLOW:
            self.finish(False, f"The answer raised {name}{where} (this ends the run).")
        exc: Exception
        if isinstance(kind, type) and issubclass(kind, Exception):
            try:
                exc = kind(message)
            except Exception:  # noqa: BLE001  # a constructor that wants more arguments
                exc = AnswerError(f"{name}: {message}")
        else:
            exc = AnswerError(f"{name}: {message}" if message else name)
        exc.aflowrl_where = where  # type: ignore[attr-defined]
        return exc

    def bind_answer_names(self, namespace: dict[str, Any], names: Any, wanted: list[str]) -> None:
        """Bind what the tests take from the answer: modules (the driver imports standard ones
        itself), callables (proxies) and plain values; only names in ``wanted``, the driver's
        own list. The answer process cannot widen it: an entry naming anything else (a builtin
        the tests call, ``__builtins__``, a helper), however it came to be sent (a frame of the
        answer process edited, the ``ready`` message written by the answer itself), ends the
        run as a failure."""
        if not isinstance(names, list):
            self.finish(False, "The answer broke the protocol (names).")
        asked = set(wanted)
        for entry in names:
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
                self.finish(False, "The answer broke the protocol (names).")
            name, kind, data = entry
            if name not in asked:
                self.finish(
                    False,
                    f"The answer broke the protocol: it offered {name[:60]!r}, which the tests "
                    "did not ask for.",
                )
            if kind == "callable":
                namespace[name] = self.proxy(name)
            elif kind == "module" and isinstance(data, str):
                top = data.partition(".")[0]
                if top in sys.stdlib_module_names and top not in _UNSAFE_MODULES:
                    with contextlib.suppress(ImportError):
                        namespace[name] = __import__(data, fromlist=["_"])
            elif kind == "value":
                with contextlib.suppress(ValueError, TypeError, RecursionError, MemoryError):
                    namespace[name] = from_tree(data)

    def describe(self, exc: BaseException) -> str:
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename in self.sources:
                lines = self.sources[code.co_filename].splitlines()
                number = tb.tb_lineno
                text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
                where = f" at {code.co_filename} line {number}: {text}"
            tb = tb.tb_next
        where = getattr(exc, "aflowrl_where", "") + where
        message = str(exc)
        if len(message) > MAX_REASON_CHARS:
            message = message[:MAX_REASON_CHARS] + "..."
        name = type(exc).__name__
        return f"{name}: {message}{where}" if message else f"{name}{where}"

    def run(self, program: types.CodeType) -> NoReturn:
        p = self.payload
        entry_point: str = p["entry_point"]
        self.start_answer(program)  # it loads while the answer is sanitised
        tools: dict[str, Any] = {}
        if SANITIZER is None:
            self.finish(False, "The verdict program was started without the sanitiser.")
        exec(SANITIZER, tools)
        try:
            solution = tools["sanitize"](p["solution"], entry_point)
        except Exception as exc:  # noqa: BLE001
            self.finish(False, "the answer could not be sanitised: " + self.describe(exc))
        helpers: dict[str, Any] = {}
        exec(compile(p["helper"], "<helper>", "exec"), helpers)
        own = {k: v for k, v in helpers.items() if not k.startswith("__")}
        wanted = free_names(p["test"], set(aflow_namespace()) | set(own) | {entry_point})
        self.send("answer", p["helper"] + solution, entry_point, wanted)
        ready = self.receive()
        if ready[0] == "failed" and len(ready) == 2:
            self.finish(False, str(ready[1])[:MAX_REASON_CHARS])
        if ready[0] != "ready" or len(ready) != 2:
            self.finish(False, "The answer broke the protocol (ready).")
        namespace = aflow_namespace()
        namespace["__builtins__"] = builtins  # the driver's, whatever the answer offers
        self.bind_answer_names(namespace, ready[1], wanted)
        namespace.update(own)  # the tests' helpers are the driver's, whatever the answer defines
        namespace[entry_point] = self.proxy(entry_point)
        try:
            exec(compile(p["test"], "<test>", "exec"), namespace)
            check = namespace["check"]
            self.checking = True
            self.deadline = time.monotonic() + float(p["check_timeout_s"])
            result = check(namespace[entry_point]) if p["pass_candidate"] else check()
        except BaseException as exc:  # noqa: BLE001  # the test failed: that is the verdict
            self.finish(False, self.describe(exc))
        if result is not None:
            self.finish(False, f"check() returned {str(result)[:80]} instead of None")
        self.finish(True, "The solution passed all test cases.")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _driver_main(program: types.CodeType) -> NoReturn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # no KeyboardInterrupt from the answer's kill()
    # The verdict's channel: a copy of stdout, not inheritable; what the tests print goes to
    # /dev/null. (stderr stays: only the driver writes there, and it tells why a run broke.)
    report_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    payload = json.loads(_read_all(0))
    for fd in (0, 1):
        os.dup2(null, fd)
    run_dir = os.getcwd()
    # From here on the driver imports only installed code, never the run directory's.
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != run_dir]
    os.chdir("/")
    for module in imported_modules(payload["test"]):
        with contextlib.suppress(ImportError):  # the test fails on it later, as in AFlow
            __import__(module)
    _Driver(payload, report_fd).run(program)


# -- the answer process ----------------------------------------------------------------------------


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            os._exit(0)  # the driver is done
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _answer_main() -> NoReturn:
    read_fd, write_fd = _ANSWER_FDS

    def receive() -> list[Any]:
        length = _LENGTH.unpack(_read_exact(read_fd, _LENGTH.size))[0]
        return list(json.loads(_read_exact(read_fd, length)))

    def reply(*fields: Any) -> None:
        data = memoryview(encode_message(*fields))
        while data:
            data = data[os.write(write_fd, data) :]

    _, solution, entry_point, wanted = receive()
    namespace = aflow_namespace()
    try:
        exec(compile(solution, "<solution>", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001  # the answer's own failure
        reply("failed", _describe_answer_error(exc, solution, at_load=True))
        os._exit(0)
    if entry_point not in namespace:
        reply("failed", f"Function {entry_point} is not defined in the solution.")
        os._exit(0)
    reply("ready", [_name_entry(name, namespace[name]) for name in wanted if name in namespace])
    while True:
        _, name, args, kwargs = receive()
        try:
            target = namespace[name]
            value = target(*map(from_tree, args), **{k: from_tree(v) for k, v in kwargs})
        except BaseException as exc:  # noqa: BLE001  # reported; the driver decides
            where = _describe_answer_error(exc, solution, at_load=False)
            reply("raised", type(exc).__name__, _message(exc), where, isinstance(exc, Exception))
            continue
        try:
            tree = to_tree(value, lenient=True)
        except Exception as exc:  # noqa: BLE001
            reply("failed", f"The answer's result cannot be passed back: {_message(exc)}")
            continue
        reply("return", tree)


def _name_entry(name: str, value: Any) -> list[Any]:
    if isinstance(value, types.ModuleType):
        return [name, "module", value.__name__]
    if callable(value):
        return [name, "callable", None]
    try:
        return [name, "value", to_tree(value, lenient=True)]
    except Exception:  # noqa: BLE001
        return [name, "none", None]


def _message(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_REASON_CHARS]
    except Exception:  # noqa: BLE001
        return ""


def _describe_answer_error(exc: BaseException, solution: str, *, at_load: bool) -> str:
    """Where in the answer ``exc`` was raised (``at <solution> line N: text``); at load, the
    whole reason."""
    where = ""
    tb = exc.__traceback__
    lines = solution.splitlines()
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<solution>":
            number = tb.tb_lineno
            text = lines[number - 1].strip() if 0 < number <= len(lines) else ""
            where = f" at <solution> line {number}: {text}"
        tb = tb.tb_next
    if not at_load:
        return where
    message = _message(exc)
    name = type(exc).__name__
    return f"{name}: {message}{where}" if message else f"{name}{where}"


def main() -> None:
    """The driver (``python main.py``), or the answer process (the run's companion). Called
    from this program's top level, whose code the driver passes on to the answer process."""
    if sys.argv == [COMPANION_ARGV0]:
        _answer_main()
    _driver_main(sys._getframe(1).f_code)


if __name__ == "__main__":
    main()
