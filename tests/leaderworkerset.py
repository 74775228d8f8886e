"""Validation of LeaderWorkerSet objects offline, as an API server with the LWS CRD would do it.

``kubernetes-validate`` knows no custom resources, so the object is checked against the LWS
CRD's own schema (``tests/crds``, trimmed of its embedded pod templates) with ``jsonschema``,
unknown fields refused, and each pod template is checked by ``kubernetes-validate`` (strict) as
the ``PodTemplateSpec`` it is. Used by the operator's unit and emulator tests.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from crd_admission import to_jsonschema

CRD_FILE = Path(__file__).parent / "crds" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


@functools.cache
def crd() -> dict[str, Any]:
    """The (trimmed) LeaderWorkerSet CustomResourceDefinition."""
    return yaml.safe_load(CRD_FILE.read_text())


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    schema = to_jsonschema(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is the server's own
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict[str, Any], k8s_version: str) -> None:
    """Raise ``jsonschema.ValidationError`` or ``kubernetes_validate.ValidationError`` when the
    API server would refuse ``obj``."""
    group, version = obj["apiVersion"].split("/")
    assert (group, version, obj["kind"]) == (
        crd()["spec"]["group"],
        crd()["spec"]["versions"][0]["name"],
        crd()["spec"]["names"]["kind"],
    )
    _validator().validate(obj)
    templates = obj["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        if key in templates:
            pod_template = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": f"{obj['metadata']['name']}-{key}"},
                "template": templates[key],
            }
            kubernetes_validate.validate(pod_template, k8s_version, strict=True)
