"""The example TrainingRuns: accepted by the model, the CRD schema and the operator, and every
object the operator builds from them is valid Kubernetes."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from aflowrl.config import RunSpec
from aflowrl.config.crd import training_run_crd
from aflowrl_operator import children
from aflowrl_operator.names import RunRef
from aflowrl_operator.validation import validate

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "examples").glob("*.yaml"))
K8S_VERSION = "1.30.0"


def _jsonschema(node):
    """OpenAPI v3.0 (nullable, boolean exclusive bounds) -> JSON Schema, unknown keys refused."""
    if isinstance(node, list):
        return [_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if out.get(bound) is True:
            out[bound] = out.pop(plain)
    if out.get("type") == "object" and isinstance(out.get("properties"), dict):
        out.setdefault("additionalProperties", False)
    return out


def test_there_are_the_four_examples():
    assert [p.name for p in EXAMPLES] == [
        "multi-node.yaml",
        "qwen2.5-7b-gsm8k-8gpu.yaml",
        "qwen2.5-7b-mixed-transfer-8gpu.yaml",
        "tiny-cpu.yaml",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_is_accepted_everywhere(path):
    doc = yaml.safe_load(path.read_text())
    spec = RunSpec.from_yaml(path.read_text(), source=path.name)
    crd = training_run_crd()
    schema = _jsonschema(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    )
    jsonschema.validate(doc["spec"], schema)
    accepted, rejection = validate(doc["metadata"]["name"], doc["spec"])
    assert rejection is None and accepted == spec
    run = RunRef(name=doc["metadata"]["name"], namespace="default", uid="uid")
    scale = children.Scale(
        services=True, environment_replicas=spec.environment.replicas.min, trainer_suspended=False
    )
    for manifest in children.full_manifests(run, spec, scale, monitoring_api=True):
        if manifest["kind"] != "PodMonitor":
            kubernetes_validate.validate(copy.deepcopy(manifest), K8S_VERSION, strict=True)


def test_the_gsm8k_example_fits_one_8_gpu_node():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "gsm8k" in p.name).read_text())
    gpus = spec.rollout.replicas * spec.rollout.resources.gpus
    gpus += spec.learner.nodes * spec.learner.resources.gpus
    assert gpus == 8 and spec.policy.model.startswith("/models/Qwen2.5-7B")


def test_the_multi_node_example_spans_nodes():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "multi" in p.name).read_text())
    assert spec.learner.nodes > 1 and spec.storage.access_mode == "ReadWriteMany"


def test_the_tiny_example_needs_no_gpu():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "tiny" in p.name).read_text())
    assert spec.policy.model == "tiny" and spec.environment.executor.type == "surrogate"
    assert spec.rollout.resources.gpus == spec.learner.resources.gpus == 0
