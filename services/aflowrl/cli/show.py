"""``aflowrl show WORKFLOW.json``: a workflow file as a picture and as readable text.

Validates the workflow, prints its text form (one line per node, the prompts;
:func:`aflowrl.workflow.render_text`) and draws it (:func:`aflowrl.workflow.save_png`) to
``--out`` (default: the file's name with ``.png``), then prints the picture's path. The
``workflow.json`` of a run's ``best/`` folders, of ``aflowrl optimize`` and the library's files
all work. A missing or invalid file is one line naming it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "show"
HELP = "Draw a workflow JSON file to a PNG and print it as readable text."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", metavar="WORKFLOW.json", help="workflow file (JSON)")
    parser.add_argument(
        "--out", default=None, metavar="PATH", help="PNG file to write; default: WORKFLOW with .png"
    )
    parser.add_argument(
        "--prompt-chars",
        type=int,
        default=300,
        metavar="N",
        help="characters of each prompt shown in the text (0: all; default: 300)",
    )


def run(args: argparse.Namespace) -> int:
    from aflowrl import documents
    from aflowrl.errors import InvalidInputError
    from aflowrl.workflow import Graph, render_text, save_png
    from aflowrl.workflow.graph import MAX_JSON_CHARS

    path = Path(args.workflow)
    if args.prompt_chars < 0:
        raise InvalidInputError("must be 0 or more", field="--prompt-chars")
    text = documents.read_text(path, source="WORKFLOW.json", max_bytes=MAX_JSON_CHARS)
    try:
        graph = Graph.from_json(text, source=str(path))
    except InvalidInputError as exc:
        if str(path) in str(exc):
            raise
        raise InvalidInputError(f"{path}: {exc}") from None
    target = Path(args.out) if args.out else path.with_suffix(".png")
    print(render_text(graph, prompt_chars=args.prompt_chars or None).rstrip("\n"))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        save_png(graph, target)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {target}: {exc.strerror}", field="--out") from None
    print(f"picture: {target}")
    return 0
