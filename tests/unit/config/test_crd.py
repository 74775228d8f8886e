"""The TrainingRun CRD: generated from the models, structural, and in step with manifests/."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from aflowrl.cli._io import dump_yaml
from aflowrl.config import CONDITION_TYPES, RunSpec, TrainingRunStatus
from aflowrl.config.crd import training_run_crd
from crd_admission import to_jsonschema

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "manifests" / "crds" / "trainingruns.aflowrl.io.yaml"


def test_committed_crd_matches_the_model():
    committed = CRD_FILE.read_text()
    assert committed == dump_yaml(training_run_crd()), (
        "manifests/crds is stale: run `make crd` and commit the result"
    )


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _schema(crd):
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural():
    schema = _schema(training_run_crd())
    for path, node in _walk(schema):
        if not isinstance(node, dict):
            continue
        for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "const", "$defs", "prefixItems"):
            assert forbidden not in node, f"{path} has {forbidden}"
        if path.endswith((".properties", ".additionalProperties")) or "type" not in node:
            continue
        if node["type"] == "object" and path != "$.properties.metadata":
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), f"{path}: object without a schema for its fields"


def test_default_and_example_specs_validate_against_the_crd_schema():
    schema = to_jsonschema(_schema(training_run_crd())["properties"]["spec"])
    jsonschema.validate(RunSpec().to_document(), schema)
    spec = RunSpec.from_yaml(
        """
        learner: {algorithm: {type: ppo, lam: 0.9}, resources: {gpus: 8}, procsPerNode: 8}
        environment:
          benchmarks: [gsm8k]
          executor: {type: openai, baseUrl: "https://api.openai.com/v1",
                     apiKeySecret: {name: openai, key: api-key}}
          search: {selection: fused, valueSource: critic}
        weightTransport: {type: filesystem}
        storage: {size: 50Gi}
        """
    )
    jsonschema.validate(spec.to_document(), schema)
    bad = RunSpec().to_document()
    bad["trainer"]["iterations"] = -1
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("the CRD schema must carry the model's bounds")


def test_status_schema_declares_every_status_field_and_printer_columns():
    crd = training_run_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    status_props = _schema(crd)["properties"]["status"]["properties"]
    for field in TrainingRunStatus.model_fields.values():
        assert field.alias in status_props
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Best"] == ".status.bestScore"
    assert "Ready" in columns and "Age" in columns
    assert "Ready" in CONDITION_TYPES


def test_crd_file_is_valid_yaml_with_one_document():
    docs = list(yaml.safe_load_all(CRD_FILE.read_text()))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
