"""What the operator accepts (validation, immutable fields) and how it writes (merge patches)."""

from __future__ import annotations

import copy
import random

import pytest

from aflowrl.config import RunSpec
from aflowrl_operator.apply import merge_patch
from aflowrl_operator.names import MAX_RUN_NAME
from aflowrl.config.run import IMMUTABLE_FIELDS
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
        ({"environment": {"benchmark": "gsm8k"}}, "spec.environment.data.dir"),
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
    ],
)
def test_cluster_only_rules(doc, field):
    spec, rejection = validate("demo", doc)
    assert spec is None and rejection is not None
    assert rejection.message.startswith(field), rejection.message


def test_humaneval_needs_no_data_directory():
    assert validate("demo", {"environment": {"benchmark": "humaneval"}})[1] is None


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


# ---- merge patches -------------------------------------------------------------------------


def _apply(target, patch):
    """RFC 7386 MergePatch, written from the RFC's pseudocode (the oracle)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply(result.get(key), value)
    return result


def _random_doc(rng: random.Random, depth: int = 0) -> dict:
    doc = {}
    for key in rng.sample("abcdefgh", rng.randint(0, 5)):
        roll = rng.random()
        if roll < 0.3 and depth < 3:
            doc[key] = _random_doc(rng, depth + 1)
        elif roll < 0.5:
            doc[key] = [rng.randint(0, 3) for _ in range(rng.randint(0, 3))]
        else:
            doc[key] = rng.choice([0, 1, "x", "y", True, False])
    return doc


def _foreign(rng: random.Random, doc: dict) -> dict:
    """``doc`` plus keys someone else owns (names no generated doc uses)."""
    out = copy.deepcopy(doc)
    out["zz-foreign"] = rng.randint(0, 9)
    for value in out.values():
        if isinstance(value, dict):
            value["zz-default"] = "set by the server"
    return out


def test_merge_patch_turns_last_applied_into_desired_and_keeps_foreign_fields():
    rng = random.Random(0)
    for _ in range(500):
        before, after = _random_doc(rng), _random_doc(rng)
        patch = merge_patch(before, after)
        assert _apply(before, patch) == after
        live = _foreign(rng, before)
        patched = _apply(live, patch)
        assert patched["zz-foreign"] == live["zz-foreign"]
        for key, value in after.items():
            if isinstance(value, dict) and isinstance(before.get(key), dict):
                assert {k: v for k, v in patched[key].items() if k != "zz-default"} == value
            else:
                assert patched[key] == value


def test_merge_patch_of_equal_documents_is_empty():
    doc = {"a": {"b": [1, 2]}, "c": "d"}
    assert merge_patch(doc, copy.deepcopy(doc)) == {}
    assert merge_patch({"a": 1, "b": 2}, {"a": 1}) == {"b": None}
