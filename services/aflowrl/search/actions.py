"""The edit-action language: one modification of a workflow graph, as one line of text.

Each action changes one detail of the workflow, as AFlow asks of its optimiser. Node ids are
those of the rendered workflow (``generate``, ``ensemble``); operator names are those of
:data:`aflowrl.workflow.OPS`. The grammar (keywords and operator names in any case; one action
per line)::

    add <Op> after <node> [samples=N] [votes=N] [max_attempts=N] [prompt="..."]
        a step that reads <node>'s result; whatever read <node> reads the new step instead.
        An ensemble (ScEnsemble, MdEnsemble) after a generator sets its fan-out to ``samples``
        (default 5, MdEnsemble 3): self-consistency in one edit. Custom, AnswerGenerate and
        CustomCodeGenerate after a node read the problem and that node; Programmer reads it as
        its analysis; Format extracts the final answer (math and QA).
    add <Op> before <node> [prompt="..."]
        a preparatory step on the problem (a plan, an analysis) whose result <node> also reads.
    add <Op> alongside <node> [samples=N] [prompt="..."]
        another generator on <node>'s inputs, pooled into the ensemble that reads <node>.
    remove <node>
        its readers read its input instead (a context step is simply dropped; removing the
        ensemble of a fan-out also sets the fan-out back to one sample).
    set <node> <param>=<N>
        change one parameter: samples, votes, max_rounds or max_attempts.
    set_prompt <node> "<text>"
        set or rewrite the node's instruction prompt (a JSON string literal).
    replace <node> with <Op>
        another generating operator (or the other ensemble) on the same inputs.
    wrap <node> in review_revise [max_rounds=N]
        a bounded review/revise loop after the node (default 3 rounds).
    wrap <node> in test_fix [max_rounds=N]
        run the node's code on the public tests and fix it on failure (code tasks).

Aliases read as their canonical form: ``delete`` = ``remove``; ``rewrite_prompt`` and
``set_instruction`` = ``set_prompt``; ``set <node> prompt="..."`` = ``set_prompt``;
``add ReviseLoop after X`` = ``wrap X in review_revise``; ``add Test after X`` =
``wrap X in test_fix``. :func:`parse_action` reads text into an :data:`EditAction` (raising
:class:`~aflowrl.search.errors.InvalidActionError` with the reason), and each action's
:meth:`text` writes its one canonical form, so equal actions have equal text.
:mod:`aflowrl.search.edits` applies actions to graphs and enumerates the admissible ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, Literal, cast, get_args

from aflowrl.search.errors import InvalidActionError
from aflowrl.workflow import OPS
from aflowrl.workflow.ops import NAME_PATTERN, OpName

Position = Literal["after", "before", "alongside"]
Loop = Literal["review_revise", "test_fix"]

POSITIONS: Final[tuple[str, ...]] = get_args(Position)
LOOPS: Final[tuple[str, ...]] = get_args(Loop)
PARAMS: Final = ("samples", "votes", "max_rounds", "max_attempts")
"""Integer parameters an action can set, in the order canonical text writes them."""

MAX_ACTION_CHARS: Final = 12_000
"""Longest action text read (a prompt may be up to 8,000 characters)."""

_INT_DIGITS: Final = 4
_NODE = re.compile(NAME_PATTERN)
_OPS_BY_LOWER: Final = {name.lower(): name for name in OPS}
_TOKEN = re.compile(
    r'(?P<string>"(?:[^"\\]|\\.)*")|(?P<word>[A-Za-z_][A-Za-z0-9_]*)'
    r"|(?P<int>[+-]?\d+)|(?P<eq>=)|(?P<end>[.;]\s*$)",
    re.DOTALL,
)


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _param_text(params: tuple[tuple[str, int], ...]) -> str:
    return "".join(f" {name}={value}" for name, value in params)


@dataclass(frozen=True)
class AddNode:
    """``add <op> <position> <node> [params] [prompt="..."]``."""

    op: OpName
    position: Position
    node: str
    params: tuple[tuple[str, int], ...] = ()
    """Integer parameters in :data:`PARAMS` order."""
    prompt: str | None = None

    def text(self) -> str:
        prompt = f" prompt={_quote(self.prompt)}" if self.prompt is not None else ""
        return f"add {self.op} {self.position} {self.node}{_param_text(self.params)}{prompt}"

    def param(self, name: str) -> int | None:
        return dict(self.params).get(name)


@dataclass(frozen=True)
class RemoveNode:
    """``remove <node>``."""

    node: str

    def text(self) -> str:
        return f"remove {self.node}"


@dataclass(frozen=True)
class SetParam:
    """``set <node> <param>=<value>``."""

    node: str
    param: str
    value: int

    def text(self) -> str:
        return f"set {self.node} {self.param}={self.value}"


@dataclass(frozen=True)
class SetPrompt:
    """``set_prompt <node> "<text>"``."""

    node: str
    prompt: str

    def text(self) -> str:
        return f"set_prompt {self.node} {_quote(self.prompt)}"


@dataclass(frozen=True)
class ReplaceOp:
    """``replace <node> with <op>``."""

    node: str
    op: OpName

    def text(self) -> str:
        return f"replace {self.node} with {self.op}"


@dataclass(frozen=True)
class WrapLoop:
    """``wrap <node> in <loop> [max_rounds=N]``."""

    node: str
    loop: Loop
    max_rounds: int | None = None

    def text(self) -> str:
        rounds = f" max_rounds={self.max_rounds}" if self.max_rounds is not None else ""
        return f"wrap {self.node} in {self.loop}{rounds}"


EditAction = AddNode | RemoveNode | SetParam | SetPrompt | ReplaceOp | WrapLoop
"""One edit of the action language."""


# ---------------------------------------------------------------------------------- parsing
_TokenKind = Literal["string", "word", "int", "eq"]


@dataclass(frozen=True)
class _Token:
    kind: _TokenKind
    value: str
    position: int


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return tokens
        match = _TOKEN.match(text, position)
        if match is None:
            if text[position] == '"':
                raise InvalidActionError(f"unterminated string starting at character {position}")
            raise InvalidActionError(
                f"unexpected character {text[position]!r} at position {position}"
            )
        kind = match.lastgroup
        if kind == "end":
            return tokens
        assert kind in ("string", "word", "int", "eq")
        tokens.append(_Token(cast(_TokenKind, kind), match.group(kind), position))
        position = match.end()


class _Reader:
    """A cursor over the tokens of one action."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.index = 0

    def done(self) -> bool:
        return self.index >= len(self.tokens)

    def peek(self) -> _Token | None:
        return None if self.done() else self.tokens[self.index]

    def take(self, what: str) -> _Token:
        token = self.peek()
        if token is None:
            raise InvalidActionError(f"the action ends where {what} was expected")
        self.index += 1
        return token

    def word(self, what: str) -> str:
        token = self.take(what)
        if token.kind != "word":
            raise InvalidActionError(f"expected {what}, found {token.value[:40]!r}")
        return token.value

    def keyword(self, expected: str) -> None:
        found = self.word(repr(expected))
        if found.lower() != expected:
            raise InvalidActionError(f"expected {expected!r}, found {found[:40]!r}")

    def node(self) -> str:
        name = self.word("a node id").lower()
        if not _NODE.match(name):
            raise InvalidActionError(f"{name[:40]!r} is not a node id")
        return name

    def op(self) -> OpName:
        name = self.word("an operator name")
        op = _OPS_BY_LOWER.get(name.lower())
        if op is None:
            raise InvalidActionError(f"unknown operator {name[:40]!r} (one of {', '.join(OPS)})")
        return OPS[op].name

    def assignments(self) -> list[tuple[str, _Token]]:
        """``name=value`` pairs until the end."""
        pairs: list[tuple[str, _Token]] = []
        seen: set[str] = set()
        while not self.done():
            name = self.word("a parameter (name=value)").lower()
            if self.take("'='").kind != "eq":
                raise InvalidActionError(f"expected '=' after {name[:40]!r}")
            value = self.take(f"a value for {name}")
            if name in seen:
                raise InvalidActionError(f"{name} is given twice")
            seen.add(name)
            pairs.append((name, value))
        return pairs

    def end(self) -> None:
        token = self.peek()
        if token is not None:
            raise InvalidActionError(f"unexpected {token.value[:40]!r} after the action")


def _int(name: str, token: _Token) -> int:
    if token.kind != "int" or len(token.value.lstrip("+-")) > _INT_DIGITS:
        raise InvalidActionError(f"{name} takes a whole number, not {token.value[:40]!r}")
    return int(token.value)


def _string(name: str, token: _Token) -> str:
    if token.kind != "string":
        raise InvalidActionError(f'{name} takes a quoted string ("..."), not {token.value[:40]!r}')
    try:
        value = json.loads(token.value, strict=False)
    except json.JSONDecodeError as exc:
        raise InvalidActionError(f"{name}: bad string escape ({exc.msg})") from None
    if not isinstance(value, str):  # pragma: no cover - a JSON string literal is a str
        raise InvalidActionError(f"{name} takes a string")
    return value


def _check_prompt(text: str) -> str:
    if not text.strip():
        raise InvalidActionError("the prompt is empty")
    bad = next((c for c in text if ord(c) < 32 and c not in "\n\t\r"), None)
    if bad is not None:
        raise InvalidActionError(f"the prompt contains the control character {bad!r}")
    return text.strip()


def _params(pairs: list[tuple[str, _Token]], allowed: tuple[str, ...]) -> None:
    """Raises unless every name is ``allowed``."""
    for name, _ in pairs:
        if name not in allowed:
            raise InvalidActionError(
                f"unknown parameter {name[:40]!r} here (allowed: {', '.join(allowed)})"
            )


def _parse_add(reader: _Reader) -> EditAction:
    op = reader.op()
    position_word = reader.word("a position (after, before, alongside)").lower()
    if position_word not in POSITIONS:
        raise InvalidActionError(
            f"unknown position {position_word[:40]!r} (after, before or alongside)"
        )
    node = reader.node()
    pairs = reader.assignments()
    if op in ("ReviseLoop", "Test"):
        if position_word != "after":
            raise InvalidActionError(f"{op} can only be added after a node")
        _params(pairs, ("max_rounds",))
        rounds = _int("max_rounds", pairs[0][1]) if pairs else None
        return WrapLoop(node, "review_revise" if op == "ReviseLoop" else "test_fix", rounds)
    _params(pairs, ("samples", "votes", "max_attempts", "prompt"))
    values = dict(pairs)
    params = tuple((name, _int(name, values[name])) for name in PARAMS if name in values)
    prompt = _check_prompt(_string("prompt", values["prompt"])) if "prompt" in values else None
    return AddNode(op, cast(Position, position_word), node, params, prompt)


def _parse_set(reader: _Reader) -> EditAction:
    node = reader.node()
    pairs = reader.assignments()
    if not pairs:
        raise InvalidActionError(f"set {node} needs one parameter=value")
    if len(pairs) > 1:
        raise InvalidActionError("one change per action: set one parameter")
    name, value = pairs[0]
    if name in ("prompt", "instruction"):
        return SetPrompt(node, _check_prompt(_string(name, value)))
    if name not in PARAMS:
        raise InvalidActionError(
            f"unknown parameter {name[:40]!r} (one of {', '.join(PARAMS)}, or prompt)"
        )
    return SetParam(node, name, _int(name, value))


def _parse_set_prompt(reader: _Reader) -> EditAction:
    node = reader.node()
    token = reader.take("the prompt text")
    if token.kind == "eq":
        token = reader.take("the prompt text")
    action = SetPrompt(node, _check_prompt(_string("the prompt", token)))
    reader.end()
    return action


def _parse_replace(reader: _Reader) -> EditAction:
    node = reader.node()
    reader.keyword("with")
    action = ReplaceOp(node, reader.op())
    reader.end()
    return action


def _parse_wrap(reader: _Reader) -> EditAction:
    node = reader.node()
    reader.keyword("in")
    loop = reader.word("a loop (review_revise or test_fix)").lower()
    if loop not in LOOPS:
        raise InvalidActionError(f"unknown loop {loop[:40]!r} (review_revise or test_fix)")
    pairs = reader.assignments()
    _params(pairs, ("max_rounds",))
    rounds = _int("max_rounds", pairs[0][1]) if pairs else None
    return WrapLoop(node, cast(Loop, loop), rounds)


def _parse_remove(reader: _Reader) -> EditAction:
    action = RemoveNode(reader.node())
    reader.end()
    return action


_VERBS = {
    "add": _parse_add,
    "remove": _parse_remove,
    "delete": _parse_remove,
    "set": _parse_set,
    "set_prompt": _parse_set_prompt,
    "rewrite_prompt": _parse_set_prompt,
    "set_instruction": _parse_set_prompt,
    "replace": _parse_replace,
    "wrap": _parse_wrap,
}


def parse_action(text: str) -> EditAction:
    """The action ``text`` writes; raises :class:`InvalidActionError` saying what is wrong."""
    if len(text) > MAX_ACTION_CHARS:
        raise InvalidActionError(
            f"the action is {len(text)} characters long; at most {MAX_ACTION_CHARS}"
        )
    tokens = _tokens(text)
    if not tokens:
        raise InvalidActionError("the action is empty")
    reader = _Reader(tokens)
    verb = reader.word("a verb (add, remove, set, set_prompt, replace, wrap)").lower()
    parse = _VERBS.get(verb)
    if parse is None:
        raise InvalidActionError(
            f"unknown verb {verb[:40]!r} (add, remove, set, set_prompt, replace or wrap)"
        )
    return parse(reader)


GRAMMAR: Final = """\
add <Op> after <node> [samples=N] [votes=N] [max_attempts=N] [prompt="..."]
add <Op> before <node> [prompt="..."]
add <Op> alongside <node> [samples=N] [prompt="..."]
remove <node>
set <node> <samples|votes|max_rounds|max_attempts>=N
set_prompt <node> "<instruction text>"
replace <node> with <Op>
wrap <node> in review_revise [max_rounds=N]
wrap <node> in test_fix [max_rounds=N]"""
"""The grammar in brief, as the policy's observation shows it."""
