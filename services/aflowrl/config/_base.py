"""Base class and shared field types of every configuration model.

Models use camelCase keys (the Kubernetes convention, so a `TrainingRun` and a local run file are
the same document). A *document* (a run file, a TrainingRun's spec) is read by
:meth:`SpecModel.validate_document` exactly as the Kubernetes API server reads a custom resource
under the generated CRD: one spelling per field (camelCase only), strict JSON types (``'5'`` and
``true`` are not integers), unknown keys refused, ``null`` meaning "not set" and ``5.0`` the
integer 5 (JSON has one number type). Python code may still construct models with snake_case
keyword arguments. Each field is documented by the docstring under it, which becomes its
description in the CRD's OpenAPI schema.

Rules a field's type cannot state (cross-field checks) are written twice, on purpose: once in
Python (a ``model_validator`` raising :class:`FieldRuleError`, which names the field) and once
in CEL (:class:`CelRule` in ``cel_rules``), which the CRD carries as ``x-kubernetes-validations``.
``tests/unit/config/test_validator_agreement.py`` checks that both refuse the same documents.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class FieldRuleError(ValueError):
    """Cross-field rules broken by a model; each of ``broken`` is (the camelCase path, relative
    to the model, of the field the error is reported on, as a CEL rule's ``fieldPath`` names
    it; the message). A model checks all its rules and raises them together, as the API server
    reports every CEL rule that fails."""

    def __init__(self, field: str, message: str, *more: tuple[str, str]) -> None:
        self.broken = [(field, message), *more]
        super().__init__("; ".join(msg for _, msg in self.broken))

    @staticmethod
    def raise_any(broken: list[tuple[str, str]]) -> None:
        """Raise the rules in ``broken`` together, if there are any."""
        if broken:
            raise FieldRuleError(*broken[0], *broken[1:])


@dataclasses.dataclass(frozen=True)
class CelRule:
    """A CEL validation rule of a model, for the CRD's ``x-kubernetes-validations``.

    ``rule`` is a CEL expression over ``self`` (the model's object) in which ``{a.b}`` stands for
    the value of field ``a.b`` *or its default* when absent, ``{?a.b}`` for "``a.b`` is set" and
    ``{!a.b}`` for the field itself (use it only where it is known to be set); ``old:`` after the
    brace (``{old:a.b}``) reads ``oldSelf``, which makes it a transition rule (updates only).
    ``field`` is the camelCase path the error names (the rule's ``fieldPath``).
    """

    rule: str
    message: str
    field: str = ""


class SpecModel(BaseModel):
    """Immutable, strict pydantic model with camelCase aliases."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = ()
    """The CEL twins of this model's ``model_validator`` rules (see the module docstring)."""

    @classmethod
    def validate_document(cls, doc: Any) -> Self:
        """Validate a JSON/YAML document as the API server reads it (module docstring).

        Raises pydantic's ``ValidationError``; :class:`aflowrl.config.ConfigError` formats it.
        """
        return cls.model_validate(json_document(doc), strict=True, by_alias=True, by_name=False)


def json_document(node: Any) -> Any:
    """A document as the API server stores it: ``null`` mapping values dropped (the server
    prunes nulls of non-nullable fields) and integral floats made integers (JSON has one number
    type: ``5.0`` is a valid integer to the API server)."""
    if isinstance(node, dict):
        return {key: json_document(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [json_document(item) for item in node]
    if isinstance(node, float) and node.is_integer():
        return int(node)
    return node


QUANTITY_PATTERN = (
    r"^(\+)?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A non-negative Kubernetes resource quantity (the API server's own grammar, sign '-' left out)."""

Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]
"""A non-negative Kubernetes resource quantity such as ``"500m"``, ``"4"`` or ``"16Gi"``."""

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, min_length=1, max_length=63)]
"""A Kubernetes object name usable as a DNS label."""

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DnsSubdomain = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, min_length=1, max_length=253)]
"""A Kubernetes object name (DNS-1123 subdomain: Secrets, PriorityClasses, RuntimeClasses)."""

QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label or annotation key: an optional DNS-subdomain prefix and ``/``, then a name."""

MAX_KEY_PREFIX = 253
"""Longest prefix of a qualified name (a DNS subdomain), as the API server allows."""
KEY_PREFIX_CEL = f"!self.contains('/') || self.matches('^[^/]{{1,{MAX_KEY_PREFIX}}}/')"
"""The CEL twin of :func:`_key_prefix` (the CRD adds it to every qualified-name string and map
key: a JSON-Schema pattern cannot bound the prefix's length and keep its structure)."""


def _key_prefix(key: str) -> str:
    prefix, slash, _ = key.partition("/")
    if slash and len(prefix) > MAX_KEY_PREFIX:
        raise ValueError(
            f"the prefix of {key[:40]!r}... has {len(prefix)} characters; the API server allows "
            f"{MAX_KEY_PREFIX}"
        )
    return key


LabelKey = Annotated[
    str,
    Field(pattern=QUALIFIED_NAME_PATTERN, min_length=1, max_length=317),
    AfterValidator(_key_prefix),
]
"""A label, annotation or node-label key (``[prefix/]name``, the prefix at most 253
characters)."""

MAX_PATH_BYTES = 4096 - 256
"""Longest file-system path a spec may name (bytes): PATH_MAX less room for the files a run
writes beneath it (checkpoint shards, weight versions)."""
FS_PATH_PATTERN = r"^(/+|/*[^/\x00]{1,255}(/+[^/\x00]{1,255})*/*)$"
"""A path every Linux file system accepts: no NUL, every component at most 255 characters
(NAME_MAX; the total in bytes is bounded by :data:`MAX_PATH_BYTES`)."""
FS_PATH_CEL = f"size(bytes(self)) <= {MAX_PATH_BYTES}"
"""The CEL twin of :func:`_path_bytes` (the CRD adds it to every path)."""


def _path_bytes(path: str) -> str:
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_BYTES:
        raise ValueError(f"the path has {size} bytes; at most {MAX_PATH_BYTES}")
    return path


FsPath = Annotated[
    str,
    Field(pattern=FS_PATH_PATTERN, min_length=1, max_length=MAX_PATH_BYTES),
    AfterValidator(_path_bytes),
]
"""A file-system path in a spec, checked when the spec is applied rather than at the first
checkpoint: no NUL, components of at most 255 characters, at most :data:`MAX_PATH_BYTES`."""

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]
"""A label value (at most 63 characters; may be empty)."""

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port number."""

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
"""A number in [0, 1]."""

ShortText = Annotated[str, Field(max_length=1024)]
"""A string of at most 1024 characters (list items, map values)."""
