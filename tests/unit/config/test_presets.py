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
