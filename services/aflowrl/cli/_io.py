"""Small helpers shared by commands: reading spec files and dumping YAML."""

from __future__ import annotations

from typing import Any

import yaml

from aflowrl import documents, presets
from aflowrl.config import RunSpec


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


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(doc: Any) -> str:
    """Stable YAML: keys in insertion order, 100 columns."""
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
