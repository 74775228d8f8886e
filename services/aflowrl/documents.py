"""Bounded JSON and YAML loading of documents from outside the process.

Every parser of outside input goes through here, so one set of bounds holds everywhere: run specs
(``aflowrl spec``, ``aflowrl train -f``, ``RunSpec.from_yaml`` in the operator), workflow JSON
(RPC fields, ``aflowrl eval --workflow FILE``), state blobs, free-form JSON actions and dataset
lines. A document is refused, with a :class:`DocumentError` naming its source and line, when it

- is larger than its caller's limit (checked before parsing; files are read only that far);
- nests deeper than :data:`MAX_DEPTH` (checked before parsing, so no parser recurses on it:
  CPython's ``json`` and PyYAML's composer would otherwise fail with ``RecursionError``);
- holds a key twice in one mapping (JSON and YAML alike, as kubectl refuses them: the CLI and the
  cluster must read a document the same way; the standard parsers keep the last value silently);
- uses YAML aliases (``*name``): expanding shared nodes is how a few hundred bytes become
  billions of values (the "billion laughs"), and nothing here needs them;
- has more than :data:`MAX_YAML_NODES` YAML values, or is not JSON / YAML at all.

Paths given in requests are checked by :func:`request_path` before any system call sees them.

YAML is read in two passes: a streaming pass over the parser's events (no recursion, stops at the
first alias, at the depth or node limit) and then the usual safe construction of what passed.
libyaml's C parser is used when PyYAML has it. The module depends on nothing of aflow-rl but
:mod:`aflowrl.errors`, so ``config/`` (pure) and every service can use it.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import yaml

from aflowrl.errors import InvalidInputError

MAX_DEPTH: Final = 64
"""Deepest nesting of arrays/objects (JSON) or sequences/mappings (YAML) accepted; documents
of this project nest fewer than 10 levels."""
MAX_JSON_CHARS: Final = 8 << 20
"""Default size limit of a JSON document, in characters (callers pass tighter ones)."""
MAX_YAML_CHARS: Final = 1 << 20
"""Default size limit of a YAML document: a run spec travels in a ConfigMap, which holds 1 MiB."""
MAX_YAML_NODES: Final = 50_000
"""Most values (scalars, sequences, mappings) of one YAML document; a run spec has a few hundred."""

_YAML_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


class DocumentError(InvalidInputError):
    """A document that cannot be read. ``field`` is its source (a file or a request field),
    ``line`` the 1-based line at fault when known."""

    def __init__(self, message: str, *, source: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message, field=source)


# ------------------------------------------------------------------------------------------ JSON

# A JSON string (escapes included), then the tokens that give a document its structure.
# Possessive, and an unterminated string runs to the end: one linear pass whatever the text.
_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+\\?+(?:"|\Z)'
_JSON_TOKEN = re.compile(_STRING + r"|[\[\]{}:]", re.DOTALL)
_JSON_STRING = re.compile(_STRING, re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1}


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return obj


def _tokens(text: str) -> Iterator[tuple[str, int]]:
    """(token, 1-based line) of every string and structural character of ``text``."""
    line, last = 1, 0
    for match in _JSON_TOKEN.finditer(text):
        line += text.count("\n", last, match.start())
        last = match.start()
        yield match.group(), line


def _too_deep_line(text: str, max_depth: int) -> int | None:
    depth = 0
    for token, line in _tokens(text):
        depth += _DEPTH_STEP.get(token, 0)
        if depth > max_depth:
            return line
    return None


def _check_json_depth(text: str, max_depth: int, source: str) -> None:
    # Fast path (C speed): strings out, then only brackets left, then the running depth.
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if len(brackets) <= max_depth:
        return
    deepest = max(itertools.accumulate(_DEPTH_STEP[c] for c in brackets))
    if deepest > max_depth:
        raise DocumentError(
            f"nested deeper than {max_depth} levels",
            source=source,
            line=_too_deep_line(text, max_depth),
        )


def _duplicate_lines(text: str, key: str) -> tuple[int, int] | None:
    """(first line, repeated line) of ``key`` repeated in one object of ``text``."""
    # One entry per open container: the keys seen so far (objects) or None (arrays).
    open_containers: list[dict[str, int] | None] = []
    previous: tuple[str, int] | None = None
    for token, line in _tokens(text):
        if token in ("{", "["):
            open_containers.append({} if token == "{" else None)
        elif token in ("}", "]"):
            if open_containers:
                open_containers.pop()
        elif token == ":" and previous is not None and previous[0].startswith('"'):
            keys = open_containers[-1] if open_containers else None
            if keys is not None:
                name = json.loads(previous[0])
                if name == key and name in keys:
                    return keys[name], previous[1]
                keys.setdefault(name, previous[1])
        previous = (token, line)
    return None


def load_json(
    text: str | bytes,
    *,
    source: str,
    max_chars: int = MAX_JSON_CHARS,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Parse a JSON document from outside; :class:`DocumentError` names ``source`` and the line.

    Bytes must be UTF-8. Objects with a repeated key, nesting past ``max_depth`` and documents
    over ``max_chars`` characters are refused (module docstring).
    """
    if len(text) > max_chars:
        raise DocumentError(f"{len(text)} characters; at most {max_chars}", source=source)
    if not isinstance(text, str):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(f"not UTF-8 (byte {exc.start})", source=source) from None
    _check_json_depth(text, max_depth, source)
    try:
        return json.loads(text, object_pairs_hook=_unique_object)
    except _DuplicateKeyError as exc:
        lines = _duplicate_lines(text, exc.key)
        first = f" (first on line {lines[0]})" if lines else ""
        raise DocumentError(
            f"duplicate key {exc.key!r}{first}", source=source, line=lines[1] if lines else None
        ) from None
    except json.JSONDecodeError as exc:
        raise DocumentError(
            f"not JSON: {exc.msg} (column {exc.colno})", source=source, line=exc.lineno
        ) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
        raise DocumentError(f"not JSON: {exc}", source=source) from None


# ------------------------------------------------------------------------------------------ YAML

_BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateYamlKeyError(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        self.key, self.first, self.line = key, first, line


class _StrictLoader(_BaseLoader):  # type: ignore[misc,valid-type]
    """The safe loader, refusing a mapping that holds a key twice."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            # Before the merge keys (``<<``) are flattened: a key may override a merged one.
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _YAML_MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateYamlKeyError(key, seen[key], line)
                    seen[key] = line
                except TypeError:  # an unhashable key: the safe constructor refuses it
                    continue
        result: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return result


# YAML 1.2 (what kubectl's reader follows) reads ``1e-08`` as a number; PyYAML's YAML 1.1
# resolver needs a dot (``1.0e-08``) and would read a string, which the spec then refuses.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _yaml_line(exc: yaml.YAMLError) -> int | None:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return mark.line + 1 if mark is not None else None


def _check_yaml_events(text: str, *, source: str, max_depth: int, max_nodes: int) -> None:
    depth = nodes = 0
    for event in yaml.parse(text, Loader=_StrictLoader):
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.AliasEvent):
            raise DocumentError(
                f"YAML aliases are not accepted (*{event.anchor}): write the value out",
                source=source,
                line=line,
            )
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > max_nodes:
                raise DocumentError(f"more than {max_nodes} values", source=source, line=line)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise DocumentError(
                    f"nested deeper than {max_depth} levels", source=source, line=line
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load_yaml(
    text: str,
    *,
    source: str,
    max_chars: int = MAX_YAML_CHARS,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_YAML_NODES,
) -> Any:
    """Parse one YAML document from outside (safe types only); :class:`DocumentError` names
    ``source`` and the line. Aliases, repeated keys and documents past the limits are refused
    (module docstring)."""
    if len(text) > max_chars:
        raise DocumentError(f"{len(text)} characters; at most {max_chars}", source=source)
    try:
        _check_yaml_events(text, source=source, max_depth=max_depth, max_nodes=max_nodes)
        loader = _StrictLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except _DuplicateYamlKeyError as exc:
        raise DocumentError(
            f"duplicate key {exc.key!r} (first on line {exc.first})", source=source, line=exc.line
        ) from None
    except yaml.MarkedYAMLError as exc:
        problem = " ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
        raise DocumentError(
            f"not valid YAML: {problem}", source=source, line=_yaml_line(exc)
        ) from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {exc}", source=source) from None


# ----------------------------------------------------------------------------------------- files


def read_text(path: str | Path, *, source: str, max_bytes: int) -> str:
    """The UTF-8 text of file ``path`` ("-": standard input), read no further than ``max_bytes``.

    ``source`` names what the file is (a command-line flag, say) in errors.
    """
    if str(path) == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
        where = "<stdin>"
    else:
        file = Path(path)
        where = str(file)
        try:
            with file.open("rb") as stream:
                data = stream.read(max_bytes + 1)
        except FileNotFoundError:
            raise DocumentError(f"no such file: {file}", source=source) from None
        except IsADirectoryError:
            raise DocumentError(f"{file} is a directory, not a file", source=source) from None
        except OSError as exc:
            raise DocumentError(f"cannot read {file}: {exc.strerror}", source=source) from None
    if len(data) > max_bytes:
        raise DocumentError(f"{where} is larger than {max_bytes} bytes", source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{where} is not UTF-8 text (byte {exc.start})", source=source
        ) from None


# ----------------------------------------------------------------------------------------- paths

MAX_PATH_BYTES: Final = 4096
"""Longest path accepted (Linux's PATH_MAX)."""
MAX_NAME_BYTES: Final = 255
"""Longest path component accepted (NAME_MAX)."""


def request_path(text: str, *, source: str) -> Path:
    """A file-system path given in a request, checked before any system call sees it.

    Refused (naming ``source``): empty, holding a NUL character, longer than PATH_MAX or with a
    component longer than NAME_MAX; the operating system would fail on them with an ``OSError``
    or ``ValueError`` deep inside whatever uses the path.
    """
    if not text:
        raise DocumentError("empty path", source=source)
    if "\0" in text:
        raise DocumentError("the path holds a NUL character", source=source)
    encoded = text.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES:
        raise DocumentError(f"{len(encoded)} bytes; at most {MAX_PATH_BYTES}", source=source)
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > MAX_NAME_BYTES:
        raise DocumentError(
            f"a component of {longest} bytes; at most {MAX_NAME_BYTES}", source=source
        )
    return Path(text)
