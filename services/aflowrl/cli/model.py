"""``aflowrl model``: build a built-in policy model, or show where a policy model resolves to."""

from __future__ import annotations

import argparse

NAME = "model"
HELP = "Policy models: build a built-in Qwen2 model, or resolve a model name to its directory."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aflowrl.cli._help import HelpFormatter

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = sub.add_parser(
        "init",
        formatter_class=HelpFormatter,
        help="write a deterministic built-in Qwen2-architecture model and its tokenizer to DIR",
    )
    init.add_argument("--preset", default="tiny", help="tiny, small or base")
    init.add_argument("--out", required=True, help="output directory (created)")
    init.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    path = sub.add_parser(
        "path",
        formatter_class=HelpFormatter,
        help="print the local directory a policy.model name resolves to",
    )
    path.add_argument("name", help="a model directory, or tiny, small or base (built on first use)")


def run(args: argparse.Namespace) -> int:
    from aflowrl.errors import InvalidInputError
    from aflowrl.models import builtin, loading

    if args.action == "init":
        if args.preset not in builtin.PRESETS:
            raise InvalidInputError(
                f"no built-in model {args.preset!r} (one of {', '.join(builtin.PRESETS)})",
                field="--preset",
            )
        print(builtin.build(args.out, preset=args.preset, seed=args.seed))
    else:
        print(loading.resolve_model_path(args.name, field="name"))
    return 0
