"""``aflowrl plot RUN_DIR``: redraw a run's curves, or draw a search tree it recorded.

Reads the run directory's ``metrics.jsonl`` and writes the curves (``curves.png``: return,
validation score and the update diagnostics, :mod:`aflowrl.trainer.plots`); with ``--tree``,
reads ``trees.jsonl`` and draws the search tree of one iteration's best episode
(``tree-<iteration>.png``). ``--out PATH`` writes elsewhere (a run directory on a read-only
volume, say). Prints the path written. A missing or malformed file is one line naming it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

NAME = "plot"
HELP = "Redraw a run's curves from its metrics.jsonl, or (--tree) a search tree it recorded."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (--run-dir)")
    parser.add_argument(
        "--tree",
        action="store_true",
        help="draw the search tree of an iteration's best episode (trees.jsonl) instead",
    )
    parser.add_argument(
        "--iteration",
        type=int,
        default=None,
        metavar="N",
        help="with --tree: the iteration (0-based, as in metrics.jsonl); default: the last",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="PNG file to write; default: RUN_DIR/curves.png, or RUN_DIR/tree-<iteration>.png",
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file of a run; a torn last line (a run writing it) is
    skipped, any other bad line is an error naming the file and line."""
    from aflowrl.errors import InvalidInputError, NotFoundError

    if not path.is_file():
        raise NotFoundError(f"{path}: no such file")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                continue  # torn by a crash, or being written right now
            raise InvalidInputError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InvalidInputError(f"{path}:{number}: not a JSON object")
        records.append(record)
    if not records:
        raise InvalidInputError(f"{path}: no records")
    return records


def _write(path: Path, data: bytes) -> Path:
    from aflowrl.errors import InvalidInputError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path}: {exc.strerror}", field="--out") from None
    return path


def run(args: argparse.Namespace) -> int:
    from aflowrl.errors import InvalidInputError, NotFoundError
    from aflowrl.trainer import plots, records, trees

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise NotFoundError(f"{run_dir}: no such run directory")
    if not args.tree:
        if args.iteration is not None:
            raise InvalidInputError("--iteration needs --tree", field="--iteration")
        metrics = read_jsonl(run_dir / records.METRICS_FILE)
        for number, record in enumerate(metrics, 1):
            if not isinstance(record.get("iteration"), int):
                raise InvalidInputError(
                    f"{run_dir / records.METRICS_FILE}: record {number} has no integer iteration"
                )
        target = Path(args.out) if args.out else run_dir / records.CURVES_FILE
        print(_write(target, plots.curves_png(metrics)))
        return 0
    source = run_dir / records.TREES_FILE
    recorded = read_jsonl(source)
    if args.iteration is None:
        tree = recorded[-1]
    else:
        found = [t for t in recorded if t.get("iteration") == args.iteration]
        if not found:
            have = [t.get("iteration") for t in recorded]
            raise NotFoundError(
                f"{source}: no tree of iteration {args.iteration} (it has {have[0]}..{have[-1]})"
            )
        tree = found[-1]
    trees.check_tree(tree, source=str(source))
    target = Path(args.out) if args.out else run_dir / f"tree-{tree.get('iteration', 0)}.png"
    print(_write(target, plots.tree_png(tree)))
    return 0
