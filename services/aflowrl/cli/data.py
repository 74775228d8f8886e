"""``aflowrl data download``: fetch AFlow's benchmark splits into the data directory, verified.

The work is :func:`aflowrl.benchmarks.download.download`; this module parses flags and reports.
Without ``--dir`` the files go where every other command looks when ``--data-dir`` is not given
(``$AFLOWRL_DATA_DIR``, else ``$AFLOWRL_CACHE_DIR/data``). Failures exit with
:attr:`aflowrl.cli.exitcodes.ExitCode.DOWNLOAD` and one line.
"""

from __future__ import annotations

import argparse

NAME = "data"
HELP = "Benchmark data: download AFlow's validation/test splits (checksums verified)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from aflowrl.cli._help import HelpFormatter

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    down = sub.add_parser(
        "download",
        help="fetch the split files into DIR (files already there and verified are kept)",
        description="Fetch AFlow's published validation/test splits (GSM8K, MATH, HumanEval, "
        "MBPP, HotpotQA, DROP) into DIR, verifying each file's SHA-256. Running it again "
        "downloads nothing once every file is verified.",
        formatter_class=HelpFormatter,
    )
    down.add_argument(
        "--dir",
        help="where to put the files (default: $AFLOWRL_DATA_DIR, else $AFLOWRL_CACHE_DIR/data, "
        "where the other commands look without --data-dir)",
    )
    down.add_argument(
        "--benchmarks",
        help="only these benchmarks, comma-separated (default: all six)",
    )
    down.add_argument(
        "--url",
        help="fetch the archive from this http(s):// or file:// URL, e.g. a mirror (default: "
        "$AFLOWRL_DATA_URL, else AFlow's published archive)",
    )
    down.add_argument(
        "--manifest",
        metavar="FILE",
        help="JSON manifest naming the archive URL and each file's SHA-256 (default: the one "
        "shipped with aflow-rl)",
    )
    down.add_argument(
        "--retries", type=int, default=3, help="further attempts after a network failure"
    )
    down.add_argument("--timeout", type=float, default=60.0, help="seconds without an answer")
    down.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from aflowrl import envs
    from aflowrl.benchmarks import default_data_dir, download
    from aflowrl.common.progress import progress_bar
    from aflowrl.errors import InvalidInputError

    if args.retries < 0:
        raise InvalidInputError("must be 0 or more", field="--retries")
    if args.timeout <= 0:
        raise InvalidInputError("must be positive", field="--timeout")
    manifest = download.Manifest.load(Path(args.manifest) if args.manifest else download.MANIFEST)
    directory = Path(args.dir or envs.AFLOWRL_DATA_DIR or default_data_dir())
    benchmarks = (
        [b.strip() for b in args.benchmarks.split(",") if b.strip()] if args.benchmarks else None
    )
    bar = progress_bar(None, unit="B", enabled=False if args.no_progress else None, unit_scale=True)

    def progress(done: int, total: int | None) -> None:
        if total is not None and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        outcome = download.download(
            directory,
            manifest=manifest,
            url=args.url or envs.AFLOWRL_DATA_URL,
            benchmarks=benchmarks,
            retries=args.retries,
            timeout_s=args.timeout,
            progress=progress,
        )
    finally:
        bar.close()
    if outcome.fetched:
        print(
            f"{len(outcome.fetched)} files downloaded and verified into {outcome.directory}"
            + (f" ({len(outcome.kept)} already there)" if outcome.kept else ""),
            file=sys.stderr,
        )
    else:
        print(
            f"all {len(outcome.kept)} files already in {outcome.directory}, verified",
            file=sys.stderr,
        )
    if args.dir and Path(args.dir).resolve() != default_data_dir().resolve():
        print(f"use them with --data-dir {outcome.directory}", file=sys.stderr)
    return 0
