"""CEL text for the CRD, written from the models (no CEL library: only strings and defaults).

:func:`expand` turns a :class:`~aflowrl.config._base.CelRule` template into CEL, replacing
``{a.b}`` with "``self.a.b``, or the default it has when it (or a parent) is absent", which the
API server does not fill in (the CRD declares no defaults: a union's variants have different
ones). The default of a field is the value the model would give it: the parent's default when
the parent is absent (``environment.resources.cpu`` is ``'2'``, not ResourceSpec's ``'1'``).

:func:`leaves` lists the scalar (or list) fields under a path, which the immutable-field
transition rules compare one by one, and :func:`read` reads a field of a document with the same
defaults in Python, so the operator's own immutability check means what the CRD's does.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

_TOKEN = re.compile(r"\{(old:)?([?!])?([A-Za-z0-9_.]+)\}")
MISSING: Any = object()
"""The value of a field that is absent and has no default (an unset optional field)."""
REQUIRED: Any = object()
"""The "default" of a required field: it is always there when its parent is."""


def model_classes(annotation: Any) -> list[type[BaseModel]]:
    """The model classes an annotation admits (``X``, ``X | None``, a union of variants)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return model_classes(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [cls for arg in typing.get_args(annotation) for cls in model_classes(arg)]
    return []


def _field(classes: list[type[BaseModel]], alias: str) -> tuple[FieldInfo, type[BaseModel]]:
    for cls in classes:
        for name, info in cls.model_fields.items():
            if (info.alias or name) == alias:
                return info, cls
    raise KeyError(f"no field {alias!r} in {[c.__name__ for c in classes]}")


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def _lookup(doc: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or doc.get(key) is None:
            return MISSING
        doc = doc[key]
    return MISSING if doc is None else doc


@dataclasses.dataclass(frozen=True)
class Chain:
    """How to read ``path`` below a model: ``defaults[i]`` is its value when ``path[i]`` is the
    first absent key; ``leaf`` says whether the field holds a model (False) or a value."""

    path: tuple[str, ...]
    defaults: tuple[Any, ...]
    leaf_classes: tuple[type[BaseModel], ...]


def chain(model: type[BaseModel], dotted: str) -> Chain:
    """The defaults of ``dotted`` under ``model`` (see :class:`Chain`)."""
    path = dotted.split(".")
    classes: list[type[BaseModel]] = [model]
    defaults = []
    leaf_default: Any = MISSING
    for i, key in enumerate(path):
        info, _ = _field(classes, key)
        if info.is_required():
            defaults.append(REQUIRED)
            leaf_default = MISSING
            classes = model_classes(info.annotation)
            continue
        default = _json(info.get_default(call_default_factory=True, validated_data={}))
        defaults.append(_lookup(default, path[i + 1 :]) if default is not None else MISSING)
        leaf_default = default if default is not None else MISSING
        classes = model_classes(info.annotation)
    # A value missing from a parent's default (a field of another union variant) falls back
    # to the field's own default: the union's type rule decides whether it may be set at all.
    filled = tuple(d if d is REQUIRED else leaf_default if d is MISSING else d for d in defaults)
    return Chain(tuple(path), filled, tuple(classes))


def literal(value: Any) -> str:
    """A JSON value as a CEL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        return text if any(c in text for c in ".e") else text + ".0"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"no CEL literal for {value!r}")


def _access(root: str, path: tuple[str, ...] | list[str]) -> str:
    return ".".join([root, *path])


def presence(root: str, path: tuple[str, ...] | list[str]) -> str:
    """CEL: every key of ``path`` is set."""
    checks = [f"has({_access(root, path[: i + 1])})" for i in range(len(path))]
    return checks[0] if len(checks) == 1 else "(" + " && ".join(checks) + ")"


def value(model: type[BaseModel], root: str, dotted: str) -> str:
    """CEL: the field at ``dotted``, or its default (see :func:`chain`)."""
    found = chain(model, dotted)
    if any(d is MISSING for d in found.defaults):
        raise ValueError(
            f"{model.__name__}.{dotted} has no default: write {{?{dotted}}} / {{!{dotted}}}"
        )
    expr = _access(root, found.path)
    for i in range(len(found.path) - 1, -1, -1):
        if found.defaults[i] is REQUIRED:
            continue
        expr = (
            f"(has({_access(root, found.path[: i + 1])}) ? {expr} : {literal(found.defaults[i])})"
        )
    return expr


def expand(model: type[BaseModel], template: str) -> str:
    """The CEL of a rule template written for ``model`` (see ``CelRule``)."""

    def replace(match: re.Match[str]) -> str:
        root = "oldSelf" if match.group(1) else "self"
        mode, dotted = match.group(2), match.group(3)
        if mode == "?":
            return presence(root, dotted.split("."))
        if mode == "!":
            return _access(root, dotted.split("."))
        return value(model, root, dotted)

    return _TOKEN.sub(replace, template)


def read(model: type[BaseModel], doc: dict[str, Any], dotted: str) -> Any:
    """Python twin of :func:`value` over a document: the field, or its default, or MISSING."""
    found = chain(model, dotted)
    node: Any = doc
    for i, key in enumerate(found.path):
        if not isinstance(node, dict) or node.get(key) is None:
            return MISSING if found.defaults[i] is REQUIRED else found.defaults[i]
        node = node[key]
    return node


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A field compared on its own by a transition rule; ``guards`` are optional objects above
    it (compared only when set on both sides) and ``optional`` says it has no default."""

    path: str
    guards: tuple[str, ...]
    optional: bool
    presence_only: bool = False
    """An optional object: only whether it is set is compared (its fields are leaves too)."""


def leaves(model: type[BaseModel], dotted: str, guards: tuple[str, ...] = ()) -> list[Leaf]:
    """Every leaf field at or below ``dotted`` (one object of a single model class recurses; a
    union, a list or a scalar is one leaf; an optional object is a leaf and guards its own)."""
    found = chain(model, dotted)
    optional = any(d is MISSING for d in found.defaults)
    classes = found.leaf_classes
    if len(classes) != 1:
        return [Leaf(dotted, guards, optional)]
    out = [Leaf(dotted, guards, True, presence_only=True)] if optional else []
    inner = (*guards, dotted) if optional else guards
    for name, info in classes[0].model_fields.items():
        out += leaves(model, f"{dotted}.{info.alias or name}", inner)
    return out


def same_json(a: Any, b: Any) -> bool:
    """Equality of two JSON values as CEL sees it (1 == 1.0)."""
    return bool(json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)) or a == b
