"""The Kubernetes quick start of docs/getting-started/kubernetes.md, as written: its Helm values
render a valid chart, its example is admitted by the CRD, and the operator that chart installs
runs the example's pods on the CPU image built and loaded by the same block, with no GPU."""

from __future__ import annotations

import copy
import itertools
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from aflowrl_operator import children
from aflowrl_operator.cli import build_parser, operator_config
from aflowrl_operator.names import RunRef
from aflowrl_operator.validation import validate, with_default_images
from crd_admission import admit, defaulted

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "getting-started" / "kubernetes.md"
K8S_VERSION = "1.30.0"
CUSTOM_KINDS = {"ServiceMonitor", "ClusterKopfPeering", "KopfPeering"}

sys.path.insert(0, str(ROOT / "charts"))
import build_manifests  # noqa: E402


def _quick_start() -> list[list[str]]:
    """The commands of the page's quick-start block, continuation lines joined, split as a
    shell would."""
    text = PAGE.read_text()
    section = text.split("## The quick start", 1)[1]
    (block,) = re.findall(r"```bash\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    return [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _command(commands: list[list[str]], *prefix: str) -> list[str]:
    (found,) = [c for c in commands if c[: len(prefix)] == list(prefix)]
    return found


def _make_vars(command: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in command[2:] if "=" in arg)


def _helm_values(command: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for flag, setting in itertools.pairwise(command):
        if flag == "--set":
            key, value = setting.split("=", 1)
            *parents, leaf = key.split(".")
            node = values
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    return values


def _containers(obj: Any) -> list[dict]:
    if isinstance(obj, dict):
        found = list(obj.get("containers") or [])
        return found + [c for value in obj.values() for c in _containers(value)]
    if isinstance(obj, list):
        return [c for value in obj for c in _containers(value)]
    return []


def test_the_quick_start_is_the_documented_sequence():
    commands = _quick_start()
    assert [c[:2] for c in commands] == [
        ["make", "images"],
        ["kind", "create"],
        ["make", "kind-load"],
        ["helm", "install"],
        ["kubectl", "apply"],
        ["kubectl", "get"],
    ]
    built = _make_vars(_command(commands, "make", "images"))
    loaded = _make_vars(_command(commands, "make", "kind-load"))
    assert loaded["REGISTRY"] == built["REGISTRY"] and loaded["TAG"] == built["TAG"]
    assert loaded["KIND_CLUSTER"] == _command(commands, "kind", "create")[-1]
    values = _helm_values(_command(commands, "helm", "install"))
    # the operator and the runs use the images the block built and loaded
    assert values["image"] == {
        "repository": f"{built['REGISTRY']}/aflow-rl-operator",
        "tag": built["TAG"],
    }
    assert values["runDefaults"] == {"imageRegistry": built["REGISTRY"], "imageTag": built["TAG"]}
    assert (ROOT / _command(commands, "kubectl", "apply")[-1]).is_file()


def test_the_quick_start_installs_an_operator_that_runs_tiny_cpu_on_the_loaded_cpu_image():
    commands = _quick_start()
    built = _make_vars(_command(commands, "make", "images"))
    helm = _command(commands, "helm", "install")
    namespace = helm[helm.index("--namespace") + 1]
    rendered = [
        yaml.safe_load(body)
        for _, body in build_manifests.rendered_documents(_helm_values(helm), hooks=False)
    ]
    for doc in rendered:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(copy.deepcopy(doc), K8S_VERSION, strict=True)
    (deployment,) = [d for d in rendered if d["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == namespace
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    assert operator["image"] == f"{built['REGISTRY']}/aflow-rl-operator:{built['TAG']}"
    config = operator_config(build_parser().parse_args(operator["args"]))

    # kubectl apply: the API server admits the example and fills in the CRD's defaults
    example = ROOT / _command(commands, "kubectl", "apply")[-1]
    doc = yaml.safe_load(example.read_text())
    assert admit(doc) == set()
    stored = defaulted(doc)
    assert not {"env", "gpu", "cpu"} & set(stored["spec"].get("images") or {})

    # the operator: its defaults for runs, then the children
    spec, rejection = validate(doc["metadata"]["name"], stored["spec"])
    assert rejection is None and spec is not None
    spec = with_default_images(spec, config.run_images)
    run = RunRef(name=doc["metadata"]["name"], namespace="default", uid="uid")
    scale = children.Scale(
        services=True, environment_replicas=spec.environment.replicas.min, trainer_suspended=False
    )
    images: dict[str, str] = {}
    for manifest in children.full_manifests(run, spec, scale, monitoring_api=True):
        if manifest["kind"] not in {"PodMonitor", "PodGroup"}:
            kubernetes_validate.validate(copy.deepcopy(manifest), K8S_VERSION, strict=True)
        for container in _containers(manifest.get("spec")):
            images[container["name"]] = container["image"]
            for amounts in (container.get("resources") or {}).values():
                assert not any("gpu" in name for name in amounts), container["name"]
    registry, tag = built["REGISTRY"], built["TAG"]
    assert images["rollout"] == images["learner"] == f"{registry}/aflow-rl-cpu:{tag}"
    assert images["environment"] == images["trainer"] == f"{registry}/aflow-rl-env:{tag}"
    assert set(images.values()) <= {f"{registry}/aflow-rl-{k}:{tag}" for k in ("cpu", "env")}


def _bash_blocks(path: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S)


def test_the_readme_and_the_kubernetes_guide_show_this_quick_start_as_tested():
    """README's cluster quick start and the guide's copy are the block tested here, verbatim."""
    (section_block,) = re.findall(
        r"```bash\n(.*?)```",
        PAGE.read_text().split("## The quick start", 1)[1].split("\n## ", 1)[0],
        flags=re.S,
    )
    for copy_at in (ROOT / "README.md", ROOT / "docs" / "guides" / "train-kubernetes.md"):
        assert section_block in _bash_blocks(copy_at), copy_at
