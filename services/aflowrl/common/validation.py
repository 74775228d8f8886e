"""One validation layer for the fields of every RPC's request, before any handler runs.

:class:`~aflowrl.common.interceptors.RequestDecodingInterceptor` hands every decoded request
message (each message of a request stream too) to :func:`check`, which raises
:class:`~aflowrl.errors.InvalidInputError` naming the field as the request spells it
(``sampling.temperature``, ``samples[3].old_logprobs[0]``); the error interceptor answers it as
INVALID_ARGUMENT. The rules, by the field's full protobuf name:

- every ``float`` / ``double`` field, at any depth, repeated or in a map: finite;
- every enum field: one of the enum's defined values (proto3 keeps an unknown number, which a
  handler would otherwise read as something else, e.g. an unknown ``Objective`` as RL);
- every integer field: within its :data:`RANGES` entry (timeouts, world sizes, chunk and
  bucket sizes, counts, versions, ports), or listed in :data:`CHECKED_BY_THE_SERVICE` with the
  reason (token ids against the model's vocabulary, seeds whose whole range is meaningful);
  ``tests/unit/common/test_validation.py`` fails for a request field in neither, so a field
  added to a .proto is covered from its first day;
- repeated fields: at most :data:`MAX_ITEMS` items where a bound exists.

What needs the served model or the run (vocabulary, positions, one value per token or
candidate, a path on disk) stays with the servicer, raising the same error types. Why not
protovalidate (rules as options in the .proto files): its current Python release validates
``protobuf-py`` messages, not the ``protobuf`` runtime grpcio's generated code uses (its 1.x
line evaluated every rule with the pure-Python ``cel-python``, per element of every repeated
float of a Train batch); its rules cannot see the run's bounds (the largest weight group a run
can form comes from its spec's limits); and every image would carry it for a handful of ranges.
This module is the same idea, kept in one table beside the checks that need the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from aflowrl.config import RolloutSpec
from aflowrl.config.resources import ResourceSpec
from aflowrl.config.transport import NcclTransportSpec
from aflowrl.errors import InvalidInputError

_MIB: Final = 1 << 20
_INT64_MAX: Final = (1 << 63) - 1
_INT32_MAX: Final = (1 << 31) - 1


def _le(model: Any, name: str) -> int:
    """The ``le`` bound of a pydantic field (the run spec's own limit)."""
    for item in model.model_fields[name].metadata:
        bound = getattr(item, "le", None)
        if bound is not None:
            return int(bound)
    raise LookupError(f"{model.__name__}.{name} has no upper bound")


MAX_WEIGHT_GROUP_WORLD: Final = 1 + _le(RolloutSpec, "replicas") * _le(
    RolloutSpec, "nodes_per_replica"
) * _le(ResourceSpec, "gpus")
"""The largest weight group any run can form: learner rank 0 and every engine worker of the
most replicas a spec allows, each spanning the most GPUs a replica may have (every GPU of the
most pods per replica: an engine's tensor x pipeline ranks are at most those)."""
MAX_TIMEOUT_S: Final = float(_le(NcclTransportSpec, "timeout_s"))
"""The longest wait a request may ask for (``weightTransport.timeoutS``'s bound); 0 = default."""
MIN_CHUNK_BYTES: Final = 64 * 1024
"""The smallest weight-push chunk (a smaller one only multiplies messages)."""
MAX_CHUNK_BYTES: Final = 1 << 30
"""The largest weight-push chunk asked for (the learner sends at most its own default)."""
BUCKET_BYTES: Final = (_MIB, _le(NcclTransportSpec, "bucket_mib") * _MIB)
"""Broadcast bucket sizes (``weightTransport.bucketMib``'s range, in bytes)."""


@dataclass(frozen=True)
class Range:
    """Closed range of an integer (or float) field; ``zero_is_default``: 0 means "unset"."""

    low: float
    high: float
    zero_is_default: bool = False

    def refusal(self, value: float) -> str | None:
        if self.zero_is_default and value == 0:
            return None
        if self.low <= value <= self.high:
            return None
        unset = " (0: the server's default)" if self.zero_is_default else ""
        return f"{_shown(value)} is not in [{_shown(self.low)}, {_shown(self.high)}]{unset}"


def _shown(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


_VERSION = Range(0, _INT64_MAX)
_V = "aflowrl.v1."
RANGES: Final[Mapping[str, Range]] = {
    # environment (the service checks its own budgets beyond these)
    f"{_V}ResetRequest.max_steps": Range(0, _INT32_MAX),
    f"{_V}EvaluateRequest.repeats": Range(0, _INT32_MAX),
    # rollout: sampling
    f"{_V}SamplingParams.temperature": Range(0, 100),
    f"{_V}SamplingParams.top_p": Range(0, 1),
    f"{_V}SamplingParams.max_tokens": Range(0, _INT32_MAX),
    f"{_V}SamplingParams.n": Range(0, 1024, zero_is_default=True),
    # rollout: weights
    f"{_V}WeightManifest.version": _VERSION,
    f"{_V}WeightManifest.total_bytes": Range(0, _INT64_MAX),
    f"{_V}TensorMeta.shape": Range(0, _INT64_MAX),
    f"{_V}TensorMeta.nbytes": Range(0, _INT64_MAX),
    f"{_V}WeightData.offset": Range(0, _INT64_MAX),
    f"{_V}WeightCommit.version": _VERSION,
    f"{_V}LoadWeightsRequest.version": Range(1, _INT64_MAX),
    f"{_V}ReceiveWeightsRequest.version": Range(1, _INT64_MAX),
    f"{_V}JoinWeightGroupRequest.port": Range(1, 65535),
    f"{_V}JoinWeightGroupRequest.rank_offset": Range(1, MAX_WEIGHT_GROUP_WORLD - 1),
    f"{_V}JoinWeightGroupRequest.world_size": Range(2, MAX_WEIGHT_GROUP_WORLD),
    f"{_V}JoinWeightGroupRequest.timeout_s": Range(0, MAX_TIMEOUT_S, zero_is_default=True),
    # learner
    f"{_V}ChoiceDecision.chosen": Range(0, _INT32_MAX),
    f"{_V}TrainRequest.iteration": Range(0, _INT64_MAX),
    f"{_V}LoadCheckpointRequest.min_policy_version": _VERSION,
    f"{_V}PushWeightsRequest.chunk_bytes": Range(
        MIN_CHUNK_BYTES, MAX_CHUNK_BYTES, zero_is_default=True
    ),
    f"{_V}OpenWeightGroupRequest.world_size": Range(2, MAX_WEIGHT_GROUP_WORLD),
    f"{_V}OpenWeightGroupRequest.timeout_s": Range(0, MAX_TIMEOUT_S, zero_is_default=True),
    f"{_V}BroadcastWeightsRequest.bucket_bytes": Range(*BUCKET_BYTES, zero_is_default=True),
}
"""Ranges of request fields (integers, and floats that have bounds besides finiteness)."""

CHECKED_BY_THE_SERVICE: Final[Mapping[str, str]] = {
    f"{_V}ResetRequest.seed": "any seed is a seed",
    f"{_V}EvaluateRequest.seed": "any seed is a seed",
    f"{_V}SamplingParams.seed": "any seed is a seed",
    f"{_V}GenerateRequest.prompt_seeds": "any seed is a seed (one per prompt: the service)",
    f"{_V}SamplingParams.top_k": "0 or negative disables it; any positive k is a k",
    f"{_V}TokenIds.ids": "against the served model's vocabulary",
    f"{_V}Sequence.prompt_token_ids": "against the served model's vocabulary",
    f"{_V}Sequence.response_token_ids": "against the served model's vocabulary",
    f"{_V}ChoiceDecision.prompt_token_ids": "against the served model's vocabulary",
    f"{_V}WeightCommit.crc32": "any CRC-32 (compared with the payload's)",
}
"""Integer request fields without a static range, and who checks them."""

MAX_ITEMS: Final[Mapping[str, int]] = {
    f"{_V}SamplingParams.stop": 16,
    f"{_V}GenerateRequest.prompt_seeds": 1 << 20,
    f"{_V}PushWeightsRequest.targets": 4096,
}
"""Most items of a repeated field."""

_FLOATS: Final = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})
_SKIPPED: Final = frozenset(
    {FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_BOOL}
)

Checker = Callable[[Message, str], None]

METHOD_PREFIXED_SERVICES: Final = frozenset({f"{_V}EnvironmentService"})
"""Services whose field names start with the call (``reset.max_steps``), as their own checks
name them."""


def prefix_for(method: str) -> str:
    """The field-path prefix of a call's request (``/pkg.Service/Method``)."""
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{name.lower()}." if service in METHOD_PREFIXED_SERVICES else ""


def check(message: Message, *, prefix: str = "") -> None:
    """Raise :class:`InvalidInputError` for the first field of ``message`` that breaks a rule
    (the module docstring); ``prefix`` starts every field path (``reset.``)."""
    _plan(message.DESCRIPTOR)(message, prefix)


@cache
def _plan(descriptor: Descriptor) -> Checker:
    """The checks of one message type, compiled once: fields with nothing to check (strings,
    messages of only token ids...) cost nothing."""
    steps: list[Checker] = []
    for field in descriptor.fields:
        step = _field_step(field)
        if step is not None:
            steps.append(step)

    def run(message: Message, prefix: str) -> None:
        for step in steps:
            step(message, prefix)

    run.empty = not steps  # type: ignore[attr-defined]
    return run


def _field_step(field: FieldDescriptor) -> Checker | None:
    name = field.name
    limit = MAX_ITEMS.get(field.full_name)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        entry = field.message_type
        assert entry is not None  # a message field has its type
        if entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            return _map_step(name, value_field)
        inner = _plan(entry)
        if getattr(inner, "empty", False) and limit is None:
            return None
        return _message_step(field, inner, limit)
    if field.type in _SKIPPED:
        return _size_step(name, limit) if limit is not None and field.is_repeated else None
    value_check = _scalar_check(field)
    if value_check is None:
        return _size_step(name, limit) if limit is not None else None
    if field.is_repeated:

        def repeated(message: Message, prefix: str) -> None:
            values = getattr(message, name)
            if limit is not None and len(values) > limit:
                raise _refused(f"{prefix}{name}", f"{len(values)} items; at most {limit}")
            for index, value in enumerate(values):
                why = value_check(value)
                if why is not None:
                    raise _refused(f"{prefix}{name}[{index}]", why)

        return repeated

    def single(message: Message, prefix: str) -> None:
        why = value_check(getattr(message, name))
        if why is not None:
            raise _refused(f"{prefix}{name}", why)

    return single


def _scalar_check(field: FieldDescriptor) -> Callable[[Any], str | None] | None:
    rule = RANGES.get(field.full_name)
    if field.type in _FLOATS:

        def finite(value: float) -> str | None:
            if not math.isfinite(value):
                return f"{value} is not finite"
            return rule.refusal(value) if rule is not None else None

        return finite
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        assert enum is not None  # an enum field has its type
        known = frozenset(v.number for v in enum.values)
        names = ", ".join(v.name for v in enum.values)

        def defined(value: int) -> str | None:
            return (
                None if value in known else f"{value} is not one of {enum.name}'s values ({names})"
            )

        return defined
    if rule is None:
        return None
    return rule.refusal


def _message_step(field: FieldDescriptor, inner: Checker, limit: int | None) -> Checker:
    name = field.name
    if field.is_repeated:

        def repeated(message: Message, prefix: str) -> None:
            items = getattr(message, name)
            if limit is not None and len(items) > limit:
                raise _refused(f"{prefix}{name}", f"{len(items)} items; at most {limit}")
            for index, item in enumerate(items):
                inner(item, f"{prefix}{name}[{index}].")

        return repeated

    def single(message: Message, prefix: str) -> None:
        if message.HasField(name):
            inner(getattr(message, name), f"{prefix}{name}.")

    return single


def _map_step(name: str, value_field: FieldDescriptor) -> Checker | None:
    if value_field.type == FieldDescriptor.TYPE_MESSAGE and value_field.message_type is not None:
        inner = _plan(value_field.message_type)
        if getattr(inner, "empty", False):
            return None

        def messages(message: Message, prefix: str) -> None:
            for key, item in getattr(message, name).items():
                inner(item, f"{prefix}{name}[{_key(key)}].")

        return messages
    value_check = _scalar_check(value_field)
    if value_check is None:
        return None

    def scalars(message: Message, prefix: str) -> None:
        for key, value in getattr(message, name).items():
            why = value_check(value)
            if why is not None:
                raise _refused(f"{prefix}{name}[{_key(key)}]", why)

    return scalars


def _size_step(name: str, limit: int) -> Checker:
    def sized(message: Message, prefix: str) -> None:
        count = len(getattr(message, name))
        if count > limit:
            raise _refused(f"{prefix}{name}", f"{count} items; at most {limit}")

    return sized


def _key(key: object) -> str:
    text = str(key)
    return text if len(text) <= 80 else text[:80] + "..."


def _refused(field: str, why: str) -> InvalidInputError:
    return InvalidInputError(why, field=field)


def request_fields(messages: Iterable[Descriptor]) -> list[FieldDescriptor]:
    """Every field of these messages and of the messages inside them (the agreement test's
    list of what a request can carry)."""
    seen: set[str] = set()
    fields: list[FieldDescriptor] = []
    stack = list(messages)
    while stack:
        descriptor = stack.pop()
        if descriptor.full_name in seen:
            continue
        seen.add(descriptor.full_name)
        for field in descriptor.fields:
            fields.append(field)
            if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
                stack.append(field.message_type)
    return fields
