"""An offline stand-in for the API server's admission of a TrainingRun under the generated CRD.

Three steps, as the API server takes them: structural defaulting (:func:`defaulted`, the
schema's ``default:`` values filled in), the OpenAPI structural schema (checked with
``jsonschema``, after the server's own normalisation: ``null`` values of non-nullable fields
pruned), then the ``x-kubernetes-validations`` CEL rules, evaluated with the
``common-expression-language`` library on values typed by the schema (``number`` as double,
``integer`` as int). Transition rules (those reading ``oldSelf``) run on updates only, where
the old object has the node. Errors are reported as the API server reports them: the path of
the offending field (``spec.a.b[1].c``), a rule's own path plus its ``fieldPath``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from typing import Any

import cel
import jsonschema
from pydantic import BaseModel

from aflowrl.config import RunSpec
from aflowrl.config.crd import training_run_crd

Json = Any


@functools.cache
def root_schema() -> dict:
    return training_run_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def to_jsonschema(node: Json) -> Json:
    """OpenAPI v3.0 as Kubernetes reads it -> JSON Schema for ``jsonschema``."""
    if isinstance(node, list):
        return [to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if "properties" in node and isinstance(node["properties"], dict):
        out["properties"] = {k: to_jsonschema(v) for k, v in node["properties"].items()}
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"] if "type" in out else None
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if out.get(bound) is True:
            out[bound] = out.pop(plain)
    if out.get("type") == "object" and isinstance(out.get("properties"), dict):
        # Unknown fields: kubectl's default (server-side field validation Strict) refuses them.
        out.setdefault("additionalProperties", False)
    return out


def _prune_nulls(obj: Json, schema: dict) -> Json:
    """The server drops a ``null`` where the schema does not say ``nullable``."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else {})
            if value is None and not sub.get("nullable"):
                continue
            out[key] = _prune_nulls(value, sub)
        return out
    if isinstance(obj, list):
        return [_prune_nulls(item, schema.get("items", {})) for item in obj]
    return obj


def _default(obj: Json, schema: dict) -> None:
    """The API server's structural defaulting, in place (apiextensions-apiserver
    ``schema/defaulting/algorithm.go``): a missing property with a ``default`` gets a copy of
    it, then every property (defaulted or not), item and map value is defaulted in turn, so a
    defaulted object gets its own fields' defaults too."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in props:
                _default(value, props[key])
            elif isinstance(extra, dict):
                _default(value, extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _default(item, schema["items"])


def defaulted(obj: Json) -> Json:
    """A TrainingRun (or any object of the CRD's shape) as the API server stores it: ``null`` values
    of non-nullable fields pruned, then the schema's defaults filled in."""
    schema = root_schema()
    out = _prune_nulls(copy.deepcopy(obj), schema)
    _default(out, schema)
    return out


def _path(parts) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    schema = to_jsonschema(root_schema())
    # ObjectMeta is the server's own: the CRD may only constrain name and generateName.
    schema["properties"]["metadata"]["additionalProperties"] = True
    return jsonschema.Draft7Validator(schema)


def _schema_errors(obj: Json) -> set[str]:
    validator = _validator()
    found = set()
    for error in validator.iter_errors(obj):
        path = _path(error.absolute_path)
        if error.validator == "required":
            missing = error.message.split("'")[1]
            path = f"{path}.{missing}" if path else missing
        elif error.validator == "additionalProperties":
            for key in error.message.split("(")[1].split(" was")[0].split(", "):
                found.add(f"{path}.{key.strip(chr(39))}" if path else key.strip("'"))
            continue
        found.add(path)
    return found


def _typed(value: Json, schema: dict) -> Json:
    """A value as CEL sees it under its schema: ``number`` is a double, ``integer`` an int."""
    kind = schema.get("type")
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {
            k: _typed(v, props.get(k, extra if isinstance(extra, dict) else {}))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_typed(v, schema.get("items", {})) for v in value]
    return value


@functools.cache
def _program(rule: str) -> Any:
    return cel.compile(rule)


def _context(variables: dict[str, Json]) -> Any:
    """The rule's variables, and the Kubernetes CEL library functions the API server has and
    this CEL library lacks (the list library's ``sum``)."""
    context = cel.Context()
    for name, value in variables.items():
        context.add_variable(name, value)
    context.add_function("sum", sum)
    return context


def _cel_errors(obj: Json, old: Json, schema: dict, path: str) -> set[str]:
    found = set()
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue
        context = {"self": _typed(obj, schema)}
        if transition:
            context["oldSelf"] = _typed(old, schema)
        try:
            ok = _program(rule["rule"]).execute(_context(context))
        except Exception as exc:  # an evaluation error refuses the object, as on the server
            ok = f"error: {exc}"
        if ok is not True:
            where = (path + rule.get("fieldPath", "")).lstrip(".")  # a root rule's: ".a.b"
            found.add(where)
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is None:
                continue
            old_value = old.get(key) if isinstance(old, dict) else None
            found |= _cel_errors(value, old_value, sub, f"{path}.{key}" if path else key)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            # Items of lists without a map key have no old counterpart (no transition rules).
            found |= _cel_errors(item, None, schema.get("items", {}), f"{path}[{i}]")
    return found


def admit(obj: Json, old: Json = None) -> set[str]:
    """The fields the API server would name in refusing ``obj`` (an update of ``old`` if
    given); empty when it is admitted."""
    schema = root_schema()
    obj = defaulted(obj)
    errors = _schema_errors(obj)
    if errors:
        return errors
    if old is not None:
        old = defaulted(old)
    return _cel_errors(obj, old, schema, "")


@contextlib.contextmanager
def changed_default(model: type[BaseModel], field: str, value: Any) -> Iterator[None]:
    """An operator release that changes one default: ``model.field`` defaults to ``value``,
    in the models (so :class:`RunSpec` fills it in) and in the CRD this module admits with;
    both are restored on exit."""
    info = model.model_fields[field]
    old = info.default

    def rebuild() -> None:
        model.model_rebuild(force=True)
        RunSpec.model_rebuild(force=True)  # it holds a copy of its fields' validators
        root_schema.cache_clear()

    info.default = value
    rebuild()
    try:
        yield
    finally:
        info.default = old
        rebuild()
