"""Generate the ``TrainingRun`` CustomResourceDefinition from the pydantic models.

The CRD's OpenAPI v3 schema is derived from :class:`RunSpec` and :class:`TrainingRunStatus`, so the
cluster and ``aflowrl train -f`` accept the same documents. Pydantic's JSON Schema is turned into
a *structural* schema as Kubernetes requires: references are inlined, ``Optional`` becomes
``nullable``, discriminated unions become one object whose ``type`` is an enum of the variants'
tags (the pydantic model checks the variant's own rules; the operator runs it on every change),
and JSON-Schema-2020 numeric bounds become OpenAPI v3.0 ones.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from aflowrl.config.run import API_GROUP, API_VERSION, KIND, PLURAL, RunSpec
from aflowrl.config.status import TrainingRunStatus

JsonDict = dict[str, Any]

_DROP_KEYS = {"title", "default", "discriminator", "$defs"}


def _resolve(node: Any, defs: JsonDict) -> Any:
    """Inline ``$ref``s (recursively)."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**copy.deepcopy(defs[name]), **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {key: _resolve(value, defs) for key, value in node.items()}


def _describe_default(schema: JsonDict, default: Any) -> None:
    if default is None or (isinstance(default, dict | list) and not default):
        return
    text = json.dumps(default) if not isinstance(default, str) else default
    if len(text) <= 120:
        desc = schema.get("description", "").rstrip()
        schema["description"] = f"{desc} Default: {text}.".strip()


def _widen(key: str, a: JsonDict, b: JsonDict) -> JsonDict:
    """One schema admitting what two variants' schemas for the same key admit."""
    plain_a = {k: v for k, v in a.items() if k != "description"}
    plain_b = {k: v for k, v in b.items() if k != "description"}
    if plain_a.get("type") != plain_b.get("type"):
        raise ValueError(f"union variants disagree on the type of {key!r}")
    out = dict(plain_a)
    for bound, pick in (("minimum", min), ("maximum", max)):
        if bound in plain_a and bound in plain_b:
            out[bound] = pick(plain_a[bound], plain_b[bound])
        else:
            out.pop(bound, None)
    if plain_a.get("exclusiveMinimum") != plain_b.get("exclusiveMinimum"):
        out.pop("exclusiveMinimum", None)
    if plain_a.get("exclusiveMaximum") != plain_b.get("exclusiveMaximum"):
        out.pop("exclusiveMaximum", None)
    if a.get("description") == b.get("description"):
        out["description"] = a.get("description", "")
    else:
        out["description"] = f"{a.get('description', '')} | {b.get('description', '')}"
    return out


def _merge_union(variants: list[JsonDict], description: str | None) -> JsonDict:
    """Merge the object variants of a discriminated union into one structural object.

    A key several variants share keeps its type; bounds widen to admit every variant and the
    descriptions are joined with the variant's tag. The pydantic model checks the exact rules.
    """
    merged: dict[str, JsonDict] = {}
    tags: list[str] = []
    for variant in variants:
        props = variant.get("properties", {})
        tag = props.get("type", {}).get("enum", ["?"])[0]
        tags.append(tag)
        for key, prop in props.items():
            if key == "type":
                continue
            tagged = {**prop, "description": f"[{tag}] {prop.get('description', '')}".strip()}
            merged[key] = _widen(key, merged[key], tagged) if key in merged else tagged
    out: JsonDict = {
        "type": "object",
        "properties": {
            "type": {
                "type": "string",
                "enum": tags,
                "description": "Variant: " + ", ".join(tags) + ".",
            },
            **merged,
        },
    }
    if description:
        out["description"] = description
    return out


def _structural(node: JsonDict) -> JsonDict:
    """Convert one (resolved) pydantic JSON-Schema node to a structural OpenAPI v3.0 node."""
    node = dict(node)
    default = node.get("default")
    description = node.get("description")

    if "anyOf" in node:
        options = [opt for opt in node["anyOf"] if opt.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) == 1:
            inner = _structural({**options[0], **{k: v for k, v in node.items() if k != "anyOf"}})
            if nullable:
                inner["nullable"] = True
            return inner
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, "oneOf": options}
    if "oneOf" in node:
        variants = [_structural(v) for v in node["oneOf"]]
        if not all(v.get("type") == "object" for v in variants):
            raise ValueError("only unions of objects are supported in the CRD schema")
        merged = _merge_union(variants, description)
        _describe_default(merged, default)
        return merged

    out: JsonDict = {k: v for k, v in node.items() if k not in _DROP_KEYS}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out and not isinstance(out[bound], bool):
            out[plain] = out.pop(bound)
            out[bound] = True
    kind = out.get("type")
    if kind == "object":
        if "properties" in out:
            out["properties"] = {k: _structural(v) for k, v in out["properties"].items()}
            out.pop("additionalProperties", None)
        elif isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = _structural(out["additionalProperties"])
        else:
            out.pop("additionalProperties", None)
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        if "prefixItems" in out:
            items = [_structural(item) for item in out.pop("prefixItems")]
            if any(item != items[0] for item in items):
                raise ValueError("tuples of mixed types are not supported in the CRD schema")
            out["items"] = items[0]
        elif "items" in out:
            out["items"] = _structural(out["items"])
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    _describe_default(out, default)
    return out


def model_openapi_schema(model: type[RunSpec] | type[TrainingRunStatus]) -> JsonDict:
    """The structural OpenAPI v3 schema of a configuration model (camelCase keys)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _structural(_resolve(raw, defs))


PRINTER_COLUMNS: list[JsonDict] = [
    {"name": "Benchmarks", "type": "string", "jsonPath": ".spec.environment.benchmarks"},
    {"name": "Iteration", "type": "integer", "jsonPath": ".status.iteration"},
    {"name": "Of", "type": "integer", "jsonPath": ".status.totalIterations", "priority": 1},
    {"name": "Best", "type": "number", "jsonPath": ".status.bestScore"},
    {"name": "Reward", "type": "number", "jsonPath": ".status.meanReward", "priority": 1},
    {"name": "Version", "type": "integer", "jsonPath": ".status.policyVersion"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def training_run_crd() -> JsonDict:
    """The TrainingRun CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    spec_schema = model_openapi_schema(RunSpec)
    spec_schema["description"] = (
        "A training run of a workflow-optimizer policy; see aflowrl.config.RunSpec."
    )
    status_schema = model_openapi_schema(TrainingRunStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{API_GROUP}",
            "labels": {
                "app.kubernetes.io/name": "aflow-rl",
                "app.kubernetes.io/part-of": "aflow-rl",
            },
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["tr", "trun"],
                "categories": ["aflowrl"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "TrainingRun trains an LLM with RL to design agentic workflows."
                            ),
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
