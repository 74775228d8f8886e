"""The example TrainingRuns: accepted by the model, the CRD schema and the operator, and every
object the operator builds from them is valid Kubernetes."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import leaderworkerset
from aflowrl.config import RunSpec
from aflowrl_operator import children, kueue
from aflowrl_operator.names import RunRef
from aflowrl_operator.validation import validate
from crd_admission import admit

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "examples").glob("*.yaml"))
K8S_VERSION = "1.30.0"


def test_there_are_the_seven_examples():
    assert [p.name for p in EXAMPLES] == [
        "gang-multi-node.yaml",
        "kueue-gsm8k.yaml",
        "multi-node-70b.yaml",
        "multi-node.yaml",
        "qwen2.5-7b-gsm8k-8gpu.yaml",
        "qwen2.5-7b-mixed-transfer-8gpu.yaml",
        "tiny-cpu.yaml",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_is_accepted_everywhere(path):
    doc = yaml.safe_load(path.read_text())
    spec = RunSpec.from_yaml(path.read_text(), source=path.name)
    assert admit(doc) == set()  # the CRD's schema and CEL rules
    accepted, rejection = validate(doc["metadata"]["name"], doc["spec"])
    assert rejection is None and accepted == spec
    run = RunRef(name=doc["metadata"]["name"], namespace="default", uid="uid")
    scale = children.Scale(
        services=True, environment_replicas=spec.environment.replicas.min, trainer_suspended=False
    )
    for manifest in children.full_manifests(run, spec, scale, monitoring_api=True):
        if manifest["kind"] == "LeaderWorkerSet":  # its CRD's schema, pod templates strict
            leaderworkerset.validate(copy.deepcopy(manifest), K8S_VERSION)
        elif manifest["kind"] not in {"PodMonitor", "PodGroup"}:  # CRDs: no schema ships
            kubernetes_validate.validate(copy.deepcopy(manifest), K8S_VERSION, strict=True)


def test_the_gsm8k_example_fits_one_8_gpu_node():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "8gpu" in p.name).read_text())
    gpus = spec.rollout.replicas * spec.rollout.resources.gpus
    gpus += spec.learner.nodes * spec.learner.resources.gpus
    assert gpus == 8 and spec.policy.model.startswith("/models/Qwen2.5-7B")


def test_the_multi_node_example_spans_nodes():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if p.name == "multi-node.yaml").read_text())
    assert spec.learner.nodes > 1 and spec.storage.access_mode == "ReadWriteMany"


def test_the_tiny_example_needs_no_gpu():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "tiny" in p.name).read_text())
    assert spec.policy.model == "tiny" and spec.environment.executor.type == "surrogate"
    assert spec.rollout.resources.gpus == spec.learner.resources.gpus == 0


def test_the_kueue_example_queues_the_whole_run():
    doc = yaml.safe_load(next(p for p in EXAMPLES if "kueue" in p.name).read_text())
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    spec = RunSpec.from_document(doc)
    run = RunRef(name=doc["metadata"]["name"], namespace="default", uid="uid")
    scale = children.Scale(services=False, environment_replicas=0, trainer_suspended=True)
    desired = children.build(run, spec, scale, monitoring_api=False)
    workload = children.kueue_workload(
        run,
        spec,
        desired,
        queue="gpu-queue",
        priority=kueue.Priority(
            doc["metadata"]["labels"]["kueue.x-k8s.io/priority-class"],
            kueue.WORKLOAD_PRIORITY_CLASS,
            None,
        ),
    )
    counts = {ps["name"]: ps["count"] for ps in workload["spec"]["podSets"]}
    assert counts == {"rollout": 4, "learner": 1, "environment": 8, "trainer": 1}
    assert len(workload["spec"]["podSets"]) <= 8  # Kueue's limit


def test_the_gang_example_groups_every_gpu_pod():
    spec = RunSpec.from_yaml(next(p for p in EXAMPLES if "gang" in p.name).read_text())
    assert spec.scheduling.gang is not None
    assert children.gpu_pods(spec) == {"rollout": 16, "learner": 2, "executor": 2}
    assert spec.learner.resources.rdma == 1 and spec.environment.pod.runtime_class_name


def _documented_runs() -> list[dict]:
    """Every TrainingRun written out whole in README.md and the docs' pages."""
    root = Path(__file__).resolve().parents[3]
    runs = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S):
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and doc.get("kind") == "TrainingRun":
                    runs.append(doc)
    return runs


def test_the_docs_show_kueue_and_gang_runs_that_validate():
    documented = _documented_runs()
    assert any("kueue.x-k8s.io/queue-name" in r["metadata"].get("labels", {}) for r in documented)
    runs = [r for r in documented if isinstance(r.get("spec"), dict)]  # not "spec: ..." excerpts
    assert any("gang" in r["spec"].get("scheduling", {}) for r in runs)
    for doc in runs:
        assert admit(doc) == set()
        accepted, rejection = validate(doc["metadata"]["name"], doc["spec"])
        assert rejection is None and accepted is not None
        run = RunRef(name=doc["metadata"]["name"], namespace="default", uid="uid")
        scale = children.Scale(services=True, environment_replicas=1, trainer_suspended=False)
        for manifest in children.full_manifests(run, accepted, scale, monitoring_api=False):
            if manifest["kind"] == "LeaderWorkerSet":
                leaderworkerset.validate(copy.deepcopy(manifest), K8S_VERSION)
            elif manifest["kind"] != "PodGroup":
                kubernetes_validate.validate(copy.deepcopy(manifest), K8S_VERSION, strict=True)
