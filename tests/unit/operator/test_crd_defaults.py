"""The CRD's structural defaults: they are the models' defaults, the API server stores them with
each run, and so an operator release that changes a default leaves a stored run's children
alone (the emulator test ``test_operator_upgrade`` shows it end to end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aflowrl.config import RunSpec
from aflowrl.config.monitoring import GrpcSpec
from aflowrl_operator import children
from crd_admission import changed_default, defaulted, root_schema

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "examples").glob("*.yaml"))


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "aflowrl.io/v1alpha1", "kind": "TrainingRun", "spec": spec}


def _unions(schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of the discriminated unions in a CRD schema (objects with a ``type`` variant)."""
    props = schema.get("properties") or {}
    found = [path] if "Variant:" in (props.get("type") or {}).get("description", "") else []
    for key, sub in props.items():
        found += _unions(sub, f"{path}.{key}")
    return found


def _leaves(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        return {k: v for key, sub in node.items() for k, v in _leaves(sub, f"{path}.{key}").items()}
    return {path: node}


@pytest.mark.parametrize(
    "doc",
    [{}, *(yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES)],
    ids=["empty", *(p.stem for p in EXAMPLES)],
)
def test_the_crd_defaults_are_the_models_defaults(doc):
    stored = defaulted(_run(doc))["spec"]
    spec = RunSpec.validate_document(doc)
    assert RunSpec.validate_document(stored) == spec
    resolved = _leaves(spec.to_document())
    for path, value in _leaves(stored).items():
        assert resolved.get(path) == value, path
    # Every resolved field is stored but those of some variants of a union only (a CRD default
    # would add them to every variant): their variant's model fills them in.
    unions = tuple(f"{path}." for path in _unions(root_schema()["properties"]["spec"]))
    assert unions
    for path in resolved.keys() - _leaves(stored).keys():
        assert path.startswith(unions), path
    assert stored["grpc"] == spec.grpc.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_a_stored_run_keeps_its_children_when_a_default_changes():
    user_doc = {"environment": {"replicas": {"min": 2, "max": 4}}}
    stored = defaulted(_run(user_doc))["spec"]
    before = children.spec_hash(RunSpec.validate_document(stored))
    with changed_default(GrpcSpec, "max_message_mib", 65):
        assert RunSpec.validate_document(user_doc).grpc.max_message_mib == 65
        # The run the API server stored keeps the value it was created with ...
        assert children.spec_hash(RunSpec.validate_document(stored)) == before
        # ... where a spec without the defaults would roll every pod,
        assert children.spec_hash(RunSpec.validate_document(user_doc)) != before
        # and a run created after the upgrade gets the new default.
        assert defaulted(_run(user_doc))["spec"]["grpc"]["maxMessageMib"] == 65
    assert RunSpec.validate_document(user_doc).grpc.max_message_mib == 64
