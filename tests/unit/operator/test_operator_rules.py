"""What the operator accepts: validation (cluster rules, the run name) and immutable fields."""

from __future__ import annotations

import pytest

from aflowrl.config import RunSpec
from aflowrl.config.run import IMMUTABLE_FIELDS
from aflowrl_operator.names import MAX_RUN_NAME
from aflowrl_operator.validation import immutable_changes, validate


def test_a_valid_spec_passes_and_an_invalid_one_names_every_field():
    spec, rejection = validate("demo", {"trainer": {"iterations": 3}})
    assert rejection is None and spec is not None and spec.trainer.iterations == 3
    spec, rejection = validate(
        "x" * (MAX_RUN_NAME + 1), {"learner": {"optimizer": {"lr": -1}}, "rolout": {}}
    )
    assert spec is None and rejection is not None
    assert rejection.reason == "InvalidSpec"
    text = rejection.message
    assert f"at most {MAX_RUN_NAME}" in text
    assert "spec.learner.optimizer.lr" in text
    assert "spec.rolout: unknown field" in text


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"environment": {"benchmarks": ["gsm8k"]}}, "spec.environment.data.dir"),
        ({"weightTransport": {"type": "filesystem"}}, "spec.storage.size"),
        (
            {
                "weightTransport": {"type": "filesystem", "path": "/elsewhere/w"},
                "storage": {"size": "10Gi"},
            },
            "spec.weightTransport.path",
        ),
        (
            {"learner": {"nodes": 2}, "storage": {"size": "10Gi"}},
            "spec.storage.accessMode",
        ),
        ({"weightTransport": {"type": "nccl"}}, "spec.storage.size"),
        (
            {
                "weightTransport": {"type": "nccl", "fallbackPath": "/elsewhere/w"},
                "storage": {"size": "10Gi"},
            },
            "spec.weightTransport.fallbackPath",
        ),
        ({"learner": {"nodes": 2}}, "spec.storage.size"),
    ],
)
def test_cluster_only_rules(doc, field):
    spec, rejection = validate("demo", doc)
    assert spec is None and rejection is not None
    assert rejection.message.startswith(field), rejection.message


def test_humaneval_needs_no_data_directory():
    assert validate("demo", {"environment": {"benchmarks": ["humaneval"]}})[1] is None


def test_immutable_changes_name_each_changed_leaf():
    accepted = RunSpec()
    changed = RunSpec.from_document(
        {
            "policy": {"model": "/models/b", "lora": {"rank": 8}},
            "trainer": {"seed": 7, "iterations": 99},
            "environment": {"replicas": {"min": 3, "max": 3}},
        }
    )
    rejection = immutable_changes(accepted, changed)
    assert rejection is not None and rejection.reason == "ImmutableFieldChanged"
    lines = rejection.problems
    assert any(line.startswith("spec.policy.model cannot change") for line in lines)
    assert any(line.startswith("spec.policy.lora cannot change") for line in lines)
    assert any(
        "spec.trainer.seed" in line and "it is 0, the new spec says 7" in line for line in lines
    )
    assert not any("iterations" in line or "replicas" in line for line in lines)


def test_allowed_changes_are_not_immutable():
    accepted = RunSpec()
    allowed = RunSpec.from_document(
        {
            "suspend": True,
            "environment": {"replicas": {"min": 1, "max": 8}, "resources": {"cpu": "4"}},
            "rollout": {"replicas": 3, "sampling": {"temperature": 0.8}},
            "trainer": {"iterations": 100, "checkpointEvery": 2},
            "images": {"env": "registry.local/aflow-rl-env:0.2.0"},
            "monitoring": {"logLevel": "DEBUG"},
        }
    )
    assert immutable_changes(accepted, allowed) is None


def test_every_immutable_path_exists_in_the_spec():
    from aflowrl.config import _cel

    for path, why in IMMUTABLE_FIELDS:
        assert _cel.leaves(RunSpec, path), path  # KeyError when it is not a RunSpec field
        assert why
