"""Reading AFlow's split files: the data directory, JSON lines with line numbers, typed fields.

Split files are ``<benchmark>_<split>.jsonl`` in a data directory given by argument or by
$AFLOWRL_DATA_DIR (``aflowrl.envs``), else the default directory that ``aflowrl data download``
fills (:func:`default_data_dir`). Every error names the file and the line, and the field when one
is at fault. Used by every benchmark's ``load``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

from aflowrl import documents, envs
from aflowrl.benchmarks.base import Benchmark, Problem, Split
from aflowrl.benchmarks.errors import DataNotFoundError, DatasetLineError

logger = logging.getLogger(__name__)

Record = dict[str, Any]

MAX_LINE_BYTES: Final = 8 << 20
"""Longest line of a split file (AFlow's longest, a HotpotQA record, is about 14 kB)."""


def default_data_dir() -> Path:
    """Where ``aflowrl data download`` puts the splits by default and where they are looked
    for when no directory is given: ``$AFLOWRL_CACHE_DIR/data``."""
    return envs.AFLOWRL_CACHE_DIR / "data"


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """The data directory: the argument, else $AFLOWRL_DATA_DIR, else :func:`default_data_dir`
    when it exists, else None."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    from_env = envs.AFLOWRL_DATA_DIR
    if from_env:
        return Path(from_env).expanduser()
    default = default_data_dir()
    return default if default.is_dir() else None


def split_file(data_dir: Path, benchmark: str, split: str) -> Path:
    """Path of one split file, which must exist."""
    if not data_dir.is_dir():
        raise DataNotFoundError(f"data directory {data_dir} does not exist (or is no directory)")
    path = data_dir / f"{benchmark}_{split}.jsonl"
    if not path.is_file():
        present = sorted(p.name for p in data_dir.glob(f"{benchmark}_*.jsonl"))
        raise DataNotFoundError(
            f"{path} does not exist; files of {benchmark} in {data_dir}: {present or 'none'}"
        )
    return path


def read_jsonl(path: Path) -> Iterator[tuple[int, Record]]:
    """(line number, object) for each non-blank line; malformed lines raise with file and line.

    Lines are read no longer than :data:`MAX_LINE_BYTES` and parsed with the bounded loader
    (:func:`aflowrl.documents.load_json`: depth, repeated keys)."""
    with path.open("rb") as lines:
        for number, raw in enumerate(_bounded_lines(lines, path), start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetLineError(path, number, f"not UTF-8 ({exc.reason})") from exc
            if not text.strip():
                continue
            try:
                value = documents.load_json(text, source=f"{path}:{number}")
            except documents.DocumentError as exc:
                raise DatasetLineError(path, number, f"not valid JSON: {exc.reason}") from None
            if not isinstance(value, dict):
                raise DatasetLineError(
                    path, number, f"expected a JSON object, got {type(value).__name__}"
                )
            yield number, value


def _bounded_lines(stream: BinaryIO, path: Path) -> Iterator[bytes]:
    """The lines of ``stream``, refusing one longer than :data:`MAX_LINE_BYTES`."""
    number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise DatasetLineError(path, number, f"longer than {MAX_LINE_BYTES} bytes")
        yield raw


def text_field(path: Path, line: int, record: Record, name: str, *, numbers: bool = False) -> str:
    """A required string field (numbers accepted and written as text when ``numbers``)."""
    if name not in record:
        raise DatasetLineError(path, line, "missing", field=name)
    value = record[name]
    if isinstance(value, str):
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise DatasetLineError(
        path,
        line,
        f"expected {'text or a number' if numbers else 'text'}, got {type(value).__name__}",
        field=name,
    )


def list_field(path: Path, line: int, record: Record, name: str) -> list[str]:
    """A required list-of-strings field."""
    if name not in record:
        raise DatasetLineError(path, line, "missing", field=name)
    value = record[name]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise DatasetLineError(path, line, "expected a list of strings", field=name)
    return value


ProblemBuilder = Callable[[Path, int, Record, int], Problem]
"""Builds a problem from (file, line number, record, index among the split's records)."""


def load_split(
    benchmark: Benchmark, split: Split, data_dir: Path, build: ProblemBuilder
) -> list[Problem]:
    """Every problem of ``<data_dir>/<benchmark>_<split>.jsonl``; problem ids must be unique."""
    path = split_file(data_dir, benchmark.name, split)
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for index, (line, record) in enumerate(read_jsonl(path)):
        problem = build(path, line, record, index)
        if problem.problem_id in first_line:
            raise DatasetLineError(
                path,
                line,
                f"duplicate problem id {problem.problem_id!r} (first on line "
                f"{first_line[problem.problem_id]})",
            )
        first_line[problem.problem_id] = line
        problems.append(problem)
    logger.debug("loaded %d %s %s problems from %s", len(problems), benchmark.name, split, path)
    return problems


def require_data_dir(benchmark: str, data_dir: str | Path | None) -> Path:
    """The data directory, or a clear error saying how to give one."""
    resolved = resolve_data_dir(data_dir)
    if resolved is None:
        raise DataNotFoundError(
            f"{benchmark} needs a data directory with {benchmark}_<split>.jsonl files (AFlow's "
            "splits): run 'aflowrl data download', or pass data_dir (--data-dir) or set "
            "AFLOWRL_DATA_DIR"
        )
    return resolved
