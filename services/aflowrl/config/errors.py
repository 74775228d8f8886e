"""Configuration errors with messages that name the offending field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

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
        cls, exc: ValidationError, *, prefix: str, source: str = ""
    ) -> ConfigError:
        """Turn pydantic's errors into ``[source: ]spec.a.b: message (got value)`` lines."""
        found = []
        for err in exc.errors(include_url=False):
            msg = err["msg"].removeprefix("Value error, ")
            got = ""
            if err["type"] not in {"missing", "value_error", "assertion_error"} and "input" in err:
                shown = repr(err["input"])
                got = f" (got {shown[:80]}{'...' if len(shown) > 80 else ''})"
            if err["type"] == "extra_forbidden":
                msg = "unknown field (check its spelling; keys are camelCase)"
            found += error_paths(prefix, err, f"{msg}{got}")
        return cls.from_problems(found, source=source)
