"""The presets shipped with aflow-rl: each one valid, and each example run's spec a preset."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aflowrl import presets
from aflowrl.config import RunSpec

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_is_a_valid_run_spec(name):
    assert isinstance(presets.load(name), RunSpec)


def test_the_default_preset_comes_first():
    assert presets.names()[0] == presets.DEFAULT == "default"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_run_is_the_preset_of_its_name(path):
    example = RunSpec.from_document(yaml.safe_load(path.read_text())["spec"])
    assert example.to_document() == presets.load(path.stem).to_document()


def test_every_preset_but_the_default_has_its_example():
    assert sorted(presets.names()[1:]) == sorted(p.stem for p in EXAMPLES)


PRESETS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "presets.md"


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _differences(base: object, preset: object, path: str = "") -> list[tuple[str, str, str]]:
    if isinstance(base, dict) and isinstance(preset, dict):
        return [
            found
            for key in preset
            for found in _differences(base.get(key), preset[key], f"{path}.{key}".lstrip("."))
        ]
    return [] if base == preset else [(path, _shown(base), _shown(preset))]


def test_the_presets_page_lists_every_field_the_default_run_changes():
    section = PRESETS_PAGE.read_text().split("## The default run against RunSpec's defaults")[1]
    section = section.split("\n## ")[0]
    rows = [
        tuple(cell.strip().strip("`") for cell in line.strip("|").split("|"))
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    expected = _differences(RunSpec().to_document(), presets.load().to_document())
    assert sorted(rows) == sorted(expected)


def test_the_default_run_says_where_its_settings_came_from():
    text = presets.text()
    assert "bench/learning.py" in text and "tuning" in text and "docs/guides/presets.md" in text
