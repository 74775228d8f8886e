"""Small helpers shared by commands: reading run documents, printing documents, checking an
executor endpoint. Imported inside ``run`` (it imports pydantic); argument conventions that
``add_arguments`` needs are in :mod:`aflowrl.cli._help`."""

from __future__ import annotations

from typing import Any

import yaml

from aflowrl import documents, presets
from aflowrl.config import RunSpec


def print_document(doc: Any, output: str) -> None:
    """``doc`` on stdout as YAML (:func:`dump_yaml`) or indented JSON."""
    import json

    if output == "json":
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(dump_yaml(doc), end="")


def load_spec(path: str | None, *, flag: str = "-f/--file") -> RunSpec:
    """The RunSpec in ``path`` ("-" for stdin; None for the embedded default, the ``default``
    preset that ``aflowrl train`` runs without ``-f``); ``flag`` names the option that gave the
    path, in errors.

    The file is read no further than a run spec can be (:data:`aflowrl.documents.MAX_YAML_CHARS`
    bytes), and parsed with the bounded loader."""
    if path is None:
        return presets.load(presets.DEFAULT)
    text = documents.read_text(path, source=flag, max_bytes=documents.MAX_YAML_CHARS)
    return RunSpec.from_yaml(text, source="<stdin>" if path == "-" else path)


async def executor_model(
    url: str, model: str | None, *, flag: str = "--model", url_flag: str = "--executor"
) -> str:
    """The model to call at the OpenAI-compatible endpoint ``url`` after a preflight check
    (:func:`aflowrl.executor.preflight.preflight`): ``model``, or the only one it serves (said
    on stderr). Fails at once, in one line, when the endpoint is unusable; ``flag`` and
    ``url_flag`` name the options that gave the model and the URL."""
    import sys
    from urllib.parse import urlsplit

    from aflowrl.errors import InvalidInputError
    from aflowrl.executor.preflight import preflight

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(
            f"{url!r} is no http(s) URL (e.g. http://localhost:8000/v1)", field=url_flag
        )

    chosen = await preflight(url, model, flag=flag)
    if model is None:
        print(f"{flag} {chosen} (the one model {url} serves)", file=sys.stderr)
    return chosen


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(doc: Any) -> str:
    """Stable YAML: keys in insertion order, 100 columns."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
