"""Configuration errors with messages that name the offending field."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from aflowrl.config._base import FieldRuleError
from aflowrl.errors import InvalidInputError

# Fields holding discriminated unions: pydantic adds the variant's tag to error locations
# after them, which is not a key of the document.
_UNION_FIELDS = frozenset({"algorithm", "executor", "weightTransport"})
# Errors about a union's discriminator: reported on its ``type`` key, as the CRD reports them.
_TAG_ERRORS = frozenset({"union_tag_invalid", "union_tag_not_found"})


def _format_loc(prefix: str, loc: Sequence[int | str]) -> str:
    path = prefix
    previous: int | str | None = None
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.startswith("function-") or previous in _UNION_FIELDS:
            pass
        else:
            path += f".{part}"
        previous = part
    return path


def error_paths(prefix: str, err: Any, message: str) -> list[tuple[str, str]]:
    """(document path such as ``spec.a.b[2].c``, message) of one pydantic error; a broken
    cross-field rule (:class:`FieldRuleError`) may name several fields."""
    loc = err["loc"]
    if loc and loc[-1] == "[key]":  # a bad key of a map: the map is the field at fault
        loc = loc[:-2]
    path = _format_loc(prefix, loc)
    rule = (err.get("ctx") or {}).get("error")
    if isinstance(rule, FieldRuleError):
        return [(f"{path}.{field}" if field else path, msg) for field, msg in rule.broken]
    if err["type"] in _TAG_ERRORS:
        path += ".type"
    return [(path, message)]


class ConfigError(InvalidInputError, ValueError):
    """An invalid configuration document. ``problems`` holds one readable line per error and
    ``fields`` the document path each line is about (``spec.trainer.iterations``)."""

    def __init__(self, problems: list[str], fields: list[str] | None = None) -> None:
        self.problems = problems
        self.fields = fields if fields is not None else []
        super().__init__("\n".join(problems))

    @classmethod
    def from_problems(cls, found: list[tuple[str, str]], *, source: str = "") -> ConfigError:
        """From (field path, message) pairs: ``[source: ]path: message`` lines."""
        lead = f"{source}: " if source else ""
        return cls([f"{lead}{path}: {msg}" for path, msg in found], [path for path, _ in found])

    @classmethod
    def from_validation_error(
        cls,
        exc: ValidationError,
        *,
        prefix: str,
        source: str = "",
        model: type[BaseModel] | None = None,
    ) -> ConfigError:
        """Turn pydantic's errors into ``[source: ]spec.a.b: message (got value)`` lines; with
        the validated ``model``, an unknown field gets the nearest known one ("did you mean")."""
        found = []
        for err in exc.errors(include_url=False):
            msg = err["msg"].removeprefix("Value error, ")
            got = ""
            if err["type"] not in {"missing", "value_error", "assertion_error"} and "input" in err:
                shown = repr(err["input"])
                got = f" (got {shown[:80]}{'...' if len(shown) > 80 else ''})"
            if err["type"] == "extra_forbidden":
                near = did_you_mean(model, err["loc"]) if model is not None else None
                msg = (
                    f"unknown field; did you mean {near!r}?"
                    if near
                    else "unknown field (check its spelling; keys are camelCase)"
                )
            found += error_paths(prefix, err, f"{msg}{got}")
        return cls.from_problems(found, source=source)


def _normal(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, unions, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("type")
    return field.default if field is not None else None


def _keys(model: type[BaseModel]) -> dict[str, str]:
    """Document key (alias, else name) by field name."""
    return {name: f.alias or name for name, f in model.model_fields.items()}


def did_you_mean(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """The known key nearest to the unknown one at ``loc`` (a pydantic error location, the
    unknown key last), or None: a snake_case or differently cased spelling of a key first,
    then the closest by :func:`difflib.get_close_matches`."""
    if not loc or not isinstance(loc[-1], str):
        return None
    current = [model]
    for part in loc[:-1]:
        if isinstance(part, int) or part == "[key]":
            continue
        inner = [
            m
            for c in current
            for name, key in _keys(c).items()
            if part in (name, key)
            for m in _models_in(c.model_fields[name].annotation)
        ]
        tagged = [c for c in current if _tag(c) == part]  # a discriminated union's tag
        current = inner or tagged
        if not current:
            return None
    known = sorted({key for c in current for key in _keys(c).values()})
    unknown = loc[-1]
    exact = [key for key in known if _normal(key) == _normal(unknown)]
    if exact:
        return exact[0]
    by_normal = {_normal(key): key for key in known}
    near = difflib.get_close_matches(_normal(unknown), list(by_normal), n=1, cutoff=0.75)
    return by_normal[near[0]] if near else None
