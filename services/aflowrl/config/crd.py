"""Generate the ``TrainingRun`` CustomResourceDefinition from the pydantic models.

The CRD's OpenAPI v3 schema is derived from :class:`RunSpec` and :class:`TrainingRunStatus`, so
the cluster and ``aflowrl train -f`` / ``aflowrl spec validate`` refuse the same documents and
name the same field. Pydantic's JSON Schema is turned into a *structural* schema as Kubernetes
requires:

- references are inlined; every bound, pattern, length and enum of a field is kept;
- ``Optional`` fields of the spec are plain (the API server prunes a ``null`` as "not set", and
  so does :meth:`SpecModel.validate_document`); the status keeps them ``nullable``;
- a discriminated union becomes one object whose ``type`` is required and an enum of the tags,
  with CEL rules that allow a variant's own fields only with its ``type``
  (``{type: grpc, keepVersions: 3}`` is refused) and its rules only under its ``type``;
- a map's key pattern (``propertyNames``, not allowed in structural schemas) becomes a CEL rule;
- what a pattern cannot state about a string type becomes a CEL rule on every string of it (a
  qualified name's prefix at most 253 characters, a path's size in bytes), the twin of the
  type's Python validator;
- each model's ``cel_rules`` (twins of its Python cross-field checks) become
  ``x-kubernetes-validations``; the spec also gets the cluster-only rules and one transition
  rule per immutable field (:data:`aflowrl.config.run.IMMUTABLE_FIELDS`), which compare each
  field, or its default, with ``oldSelf``'s;
- status ``conditions`` is a list-map keyed by ``type``;
- every field of the spec with a default carries it as ``default:`` (structural defaulting),
  the model's default serialised as a document (a ``default_factory`` called, ``null`` values
  dropped; an object's default leaves out what its fields' own defaults fill in), so the API
  server stores each run with the values it was created under and an
  operator release that changes a default does not change a running run's children. Fields
  of some variants of a union only carry none (the API server would add them to every
  variant); their variant's model fills them in.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

from aflowrl.config import _cel
from aflowrl.config._base import (
    FS_PATH_CEL,
    FS_PATH_PATTERN,
    KEY_PREFIX_CEL,
    MAX_KEY_PREFIX,
    MAX_PATH_BYTES,
    QUALIFIED_NAME_PATTERN,
    CelRule,
    SpecModel,
    json_document,
)
from aflowrl.config.run import (
    API_GROUP,
    API_VERSION,
    CLUSTER_RULES,
    GROUP_NAME_RULES,
    IMMUTABLE_FIELDS,
    KIND,
    MAX_RUN_NAME,
    PLURAL,
    RUN_NAME_PATTERN,
    RunSpec,
)
from aflowrl.config.status import TrainingRunStatus

JsonDict = dict[str, Any]

_DROP_KEYS = {"title", "default", "discriminator", "$defs"}
_VALIDATIONS = "x-kubernetes-validations"
_STRING_RULE_MESSAGES = {
    KEY_PREFIX_CEL: f"a key's prefix (before '/') has at most {MAX_KEY_PREFIX} characters",
    FS_PATH_CEL: f"a path has at most {MAX_PATH_BYTES} bytes",
}


class _FactoryDefaults(GenerateJsonSchema):
    """Pydantic's JSON Schema, with the value of each ``default_factory`` as the default."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()  # type: ignore[call-arg]
        return super().get_default_value(schema)


def _model_index(model: type[BaseModel], found: dict[str, type[BaseModel]]) -> None:
    """Every model class reachable from ``model``, by the name pydantic gives its ``$defs``."""
    found[model.__name__] = model
    for info in model.model_fields.values():
        for inner in _all_models(info.annotation):
            if inner.__name__ not in found:
                _model_index(inner, found)


def _all_models(annotation: Any) -> list[type[BaseModel]]:
    import typing

    direct = _cel.model_classes(annotation)
    if direct:
        return direct
    return [m for arg in typing.get_args(annotation) for m in _all_models(arg)]


def _rules(model: type[BaseModel], rules: tuple[CelRule, ...]) -> list[JsonDict]:
    out = []
    for rule in rules:
        entry: JsonDict = {"rule": _cel.expand(model, rule.rule), "message": rule.message}
        if rule.field:
            entry["fieldPath"] = "." + rule.field
        out.append(entry)
    return out


def _resolve(node: Any, defs: JsonDict, models: dict[str, type[BaseModel]]) -> Any:
    """Inline ``$ref``s (recursively), attaching each model's CEL rules to its object."""
    if isinstance(node, list):
        return [_resolve(item, defs, models) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**copy.deepcopy(defs[name]), **{k: v for k, v in node.items() if k != "$ref"}}
        model = models.get(name)
        if model is not None and issubclass(model, SpecModel) and model.cel_rules:
            merged[_VALIDATIONS] = _rules(model, model.cel_rules)
        return _resolve(merged, defs, models)
    return {key: _resolve(value, defs, models) for key, value in node.items()}


def _describe_default(schema: JsonDict, default: Any) -> None:
    if default is None or isinstance(default, dict) or default == []:
        return  # an object's default is its fields' (each described)
    text = json.dumps(default) if not isinstance(default, str) else default
    if len(text) <= 120:
        desc = schema.get("description", "").rstrip()
        schema["description"] = f"{desc} Default: {text}.".strip()


def _plain(schema: JsonDict) -> JsonDict:
    return {k: v for k, v in schema.items() if k not in {"description", "default", _VALIDATIONS}}


def _set_default(schema: JsonDict, default: Any, defaults: bool) -> None:
    """Carry a field's default as the API server stores it (``null`` values dropped, as pruned)."""
    if defaults and default is not None:
        schema["default"] = json_document(default)


def _minimal(value: Any, schema: JsonDict) -> Any:
    """An object's default without the fields the API server fills in from their own defaults
    anyway (it defaults inside a defaulted object): the same stored result, a smaller CRD."""
    props = schema.get("properties")
    if not isinstance(value, dict) or not props:
        return value
    return {
        key: _minimal(sub, props.get(key, {}))
        for key, sub in value.items()
        if key not in props or props[key].get("default") != sub
    }


def _minimise_defaults(node: JsonDict, reference: JsonDict) -> None:
    """:func:`_minimal` on every default of ``node``, judged against the full defaults of
    ``reference`` (an untouched copy of it)."""
    if "default" in node:
        node["default"] = _minimal(reference["default"], reference)
    for key, sub in (node.get("properties") or {}).items():
        _minimise_defaults(sub, reference["properties"][key])
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _minimise_defaults(node[key], reference[key])


def _guarded(tag: str, rule: JsonDict) -> JsonDict:
    return {**rule, "rule": f"self.type != {_cel.literal(tag)} || ({rule['rule']})"}


def _merge_union(variants: list[JsonDict], description: str | None) -> JsonDict:
    """Merge the object variants of a discriminated union into one structural object.

    A key several variants share must have the same schema in each (descriptions aside); a key
    of some variants only is allowed with their tags (a CEL rule); each variant's rules apply
    under its tag, and its required keys are required under its tag.
    """
    merged: dict[str, JsonDict] = {}
    owners: dict[str, list[str]] = {}
    unequal: set[str] = set()
    tags: list[str] = []
    rules: list[JsonDict] = []
    for variant in variants:
        props = variant.get("properties", {})
        tag = props.get("type", {}).get("enum", ["?"])[0]
        tags.append(tag)
        rules += [_guarded(tag, rule) for rule in variant.get(_VALIDATIONS, [])]
        for key in variant.get("required", []):
            if key != "type":
                rules.append(
                    {
                        "rule": f"self.type != {_cel.literal(tag)} || has(self.{key})",
                        "message": f"{key} is required with type {tag}",
                        "fieldPath": f".{key}",
                    }
                )
        for key, prop in props.items():
            if key == "type":
                continue
            owners.setdefault(key, []).append(tag)
            tagged = {**prop, "description": f"[{tag}] {prop.get('description', '')}".strip()}
            if key not in merged:
                merged[key] = tagged
            elif _plain(merged[key]) != _plain(tagged):
                raise ValueError(f"union variants disagree on the schema of {key!r}")
            else:
                merged[key]["description"] += f" | {tagged['description']}"
                if merged[key].get("default") != tagged.get("default"):
                    unequal.add(key)
    for key, key_tags in owners.items():
        # A default of some variants only (or different in each) would be added to every
        # variant by the API server: the variant's model fills it in instead.
        if key in unequal or len(key_tags) < len(tags):
            merged[key].pop("default", None)
        if len(key_tags) < len(tags):
            rules.append(
                {
                    "rule": f"!has(self.{key}) || self.type in {_cel.literal(key_tags)}",
                    "message": f"{key} is a field of type {' or '.join(key_tags)} only",
                    "fieldPath": f".{key}",
                }
            )
    out: JsonDict = {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {
                "type": "string",
                "enum": tags,
                "description": "Variant: " + ", ".join(tags) + ".",
            },
            **merged,
        },
    }
    if rules:
        out[_VALIDATIONS] = rules
    if description:
        out["description"] = description
    return out


def _structural(node: JsonDict, *, nullable: bool, defaults: bool) -> JsonDict:
    """Convert one (resolved) pydantic JSON-Schema node to a structural OpenAPI v3.0 node."""
    node = dict(node)
    default = node.get("default")
    description = node.get("description")

    if "anyOf" in node:
        options = [opt for opt in node["anyOf"] if opt.get("type") != "null"]
        has_null = len(options) < len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            inner = _structural({**options[0], **rest}, nullable=nullable, defaults=defaults)
            if has_null and nullable:
                inner["nullable"] = True
            return inner
        node = {**rest, "oneOf": options}
    if "oneOf" in node:
        variants = [_structural(v, nullable=nullable, defaults=defaults) for v in node["oneOf"]]
        if not all(v.get("type") == "object" for v in variants):
            raise ValueError("only unions of objects are supported in the CRD schema")
        merged = _merge_union(variants, description)
        _describe_default(merged, default)
        _set_default(merged, default, defaults)
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
        patterns = out.pop("patternProperties", None)
        if patterns:
            ((key_pattern, value_schema),) = patterns.items()
            out["additionalProperties"] = value_schema
            names = out.setdefault("propertyNames", {})
            names["pattern"] = key_pattern
        if "properties" in out:
            out["properties"] = {
                k: _structural(v, nullable=nullable, defaults=defaults)
                for k, v in out["properties"].items()
            }
            out.pop("additionalProperties", None)
        elif isinstance(out.get("additionalProperties"), dict):
            out["additionalProperties"] = _structural(
                out["additionalProperties"], nullable=nullable, defaults=defaults
            )
        else:
            out.pop("additionalProperties", None)
            out["x-kubernetes-preserve-unknown-fields"] = True
        names = out.pop("propertyNames", None)
        if names:
            checks = []
            if "pattern" in names:
                checks.append(f"k.matches({_cel.literal(names['pattern'])})")
            if "maxLength" in names:
                checks.append(f"size(k) <= {names['maxLength']}")
            if "minLength" in names:
                checks.append(f"size(k) >= {names['minLength']}")
            if names.get("pattern") == QUALIFIED_NAME_PATTERN:
                checks.append("(" + KEY_PREFIX_CEL.replace("self", "k") + ")")
            out.setdefault(_VALIDATIONS, []).append(
                {
                    "rule": "self.all(k, " + " && ".join(checks) + ")",
                    "message": "every key must be a valid name"
                    + (f" ({names['pattern']})" if "pattern" in names else ""),
                }
            )
    elif kind == "array":
        if "prefixItems" in out:
            items = [
                _structural(item, nullable=nullable, defaults=defaults)
                for item in out.pop("prefixItems")
            ]
            if any(item != items[0] for item in items):
                raise ValueError("tuples of mixed types are not supported in the CRD schema")
            out["items"] = items[0]
        elif "items" in out:
            out["items"] = _structural(out["items"], nullable=nullable, defaults=defaults)
    elif kind == "string":
        # Rules a pattern cannot state, on every string of these types (the CEL twins of the
        # types' Python validators): a qualified name's prefix length, a path's bytes.
        twin = {QUALIFIED_NAME_PATTERN: KEY_PREFIX_CEL, FS_PATH_PATTERN: FS_PATH_CEL}.get(
            out.get("pattern", "")
        )
        if twin is not None:
            out.setdefault(_VALIDATIONS, []).append(
                {"rule": twin, "message": _STRING_RULE_MESSAGES[twin]}
            )
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    _describe_default(out, default)
    _set_default(out, default, defaults)
    return out


def model_openapi_schema(model: type[RunSpec] | type[TrainingRunStatus]) -> JsonDict:
    """The structural OpenAPI v3 schema of a configuration model (camelCase keys); the spec's
    carries its defaults, the status's none (the operator writes every field it means)."""
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_FactoryDefaults
    )
    models: dict[str, type[BaseModel]] = {}
    _model_index(model, models)
    resolved = _resolve(raw, raw.get("$defs", {}), models)
    if model.cel_rules:
        resolved[_VALIDATIONS] = _rules(model, model.cel_rules)
    status = model is TrainingRunStatus
    schema = _structural(resolved, nullable=status, defaults=not status)
    _minimise_defaults(schema, copy.deepcopy(schema))
    return schema


def immutable_rules() -> list[JsonDict]:
    """One transition rule per immutable leaf field of the spec (``self`` is the spec)."""
    out = []
    for field, why in IMMUTABLE_FIELDS:
        for leaf in _cel.leaves(RunSpec, field):
            guards = [f"({{?{g}}} && {{old:?{g}}})" for g in leaf.guards]
            if leaf.presence_only:
                same = f"{{?{leaf.path}}} == {{old:?{leaf.path}}}"
            elif leaf.optional:
                p = leaf.path
                same = f"{{?{p}}} == {{old:?{p}}} && (!{{?{p}}} || {{!{p}}} == {{old:!{p}}})"
            else:
                same = f"{{{leaf.path}}} == {{old:{leaf.path}}}"
            template = f"!({' && '.join(guards)}) || ({same})" if guards else same
            out.append(
                {
                    "rule": _cel.expand(RunSpec, template),
                    "message": f"{leaf.path} cannot change once the run exists ({why})",
                    "fieldPath": f".{leaf.path}",
                }
            )
    return out


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


def spec_schema() -> JsonDict:
    """The CRD's ``spec`` schema: the model's, its rules, the cluster rules, immutability."""
    schema = model_openapi_schema(RunSpec)
    schema["description"] = (
        "A training run of a workflow-optimizer policy; see aflowrl.config.RunSpec."
    )
    schema[_VALIDATIONS] = [
        *schema.get(_VALIDATIONS, []),
        *_rules(RunSpec, CLUSTER_RULES),
        *immutable_rules(),
    ]
    return schema


def training_run_crd() -> JsonDict:
    """The TrainingRun CustomResourceDefinition (apiextensions.k8s.io/v1)."""
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
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {
                                    "type": "object",
                                    "properties": {
                                        "name": {
                                            "type": "string",
                                            "maxLength": MAX_RUN_NAME,
                                            "pattern": RUN_NAME_PATTERN,
                                        }
                                    },
                                },
                                "spec": spec_schema(),
                                "status": status_schema,
                            },
                            _VALIDATIONS: [dict(rule) for rule in GROUP_NAME_RULES],
                        }
                    },
                }
            ],
        },
    }
