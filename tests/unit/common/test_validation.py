"""The one validation layer for request fields (``aflowrl.common.validation``), and the error
interceptor's promise that every handler's failure reaches the client as a status.

The rules are checked as classes, over every request message of the three services found from
their descriptors (a field added to a .proto is covered, or this file fails): every float is
finite, every enum value defined, every integer in its range or named as checked by the service.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from grpc import aio

from aflowrl._proto.v1 import environment_pb2, learner_pb2, rollout_pb2, rollout_pb2_grpc
from aflowrl.common import validation
from aflowrl.common.server import GrpcServer, ServerOptions, ServiceRegistration
from aflowrl.errors import InvalidInputError

SERVICES = [
    service
    for module in (environment_pb2, rollout_pb2, learner_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
]
REQUESTS: list[Descriptor] = [m.input_type for s in SERVICES for m in s.methods]
FIELDS = validation.request_fields(REQUESTS)
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)
_INTEGERS = (
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_FIXED64,
)


def _is_map_entry(field: FieldDescriptor) -> bool:
    return field.containing_type.GetOptions().map_entry


def test_every_integer_request_field_has_a_range_or_a_named_checker():
    integers = {f.full_name for f in FIELDS if f.type in _INTEGERS and not _is_map_entry(f)}
    missing = integers - set(validation.RANGES) - set(validation.CHECKED_BY_THE_SERVICE)
    assert not missing, f"request fields with no rule: {sorted(missing)}"


def test_every_rule_names_a_request_field():
    names = {f.full_name for f in FIELDS}
    for table in (validation.RANGES, validation.CHECKED_BY_THE_SERVICE, validation.MAX_ITEMS):
        assert not set(table) - names, sorted(set(table) - names)


def _paths(
    descriptor: Descriptor, depth: int = 0
) -> Iterator[tuple[list[FieldDescriptor], FieldDescriptor]]:
    """(message fields leading there, the field) for every scalar field under ``descriptor``."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                yield [], field
            elif depth < 4:
                for trail, leaf in _paths(field.message_type, depth + 1):
                    yield [field, *trail], leaf
        else:
            yield [], field


def _valid_defaults(message: Message) -> None:
    """Set the scalar fields whose default (0) is out of range to their lower bound, so that
    only the field under test breaks a rule."""
    for field in message.DESCRIPTOR.fields:
        rule = validation.RANGES.get(field.full_name)
        if rule is None or field.is_repeated or rule.zero_is_default or rule.low <= 0:
            continue
        low = rule.low if field.type in _FLOATS else int(rule.low)
        setattr(message, field.name, low)


def _with(request: Descriptor, trail: list[FieldDescriptor], leaf: FieldDescriptor, value):
    """A ``request`` message with ``leaf`` (reached through ``trail``) set to ``value``; the
    field path the layer must name."""
    from google.protobuf import message_factory

    message: Message = message_factory.GetMessageClass(request)()
    _valid_defaults(message)
    node, path = message, ""
    for field in trail:
        if field.is_repeated:
            node = getattr(node, field.name).add()
            path += f"{field.name}[0]."
        else:
            node = getattr(node, field.name)
            path += f"{field.name}."
        _valid_defaults(node)
    if leaf.type == FieldDescriptor.TYPE_MESSAGE:  # a map
        getattr(node, leaf.name)["k"] = value
        return message, f"{path}{leaf.name}[k]"
    if leaf.is_repeated:
        getattr(node, leaf.name).append(value)
        return message, f"{path}{leaf.name}[0]"
    setattr(node, leaf.name, value)
    return message, f"{path}{leaf.name}"


def _cases(
    kinds: tuple[int, ...],
) -> list[tuple[Descriptor, list[FieldDescriptor], FieldDescriptor]]:
    cases = []
    for request in {r.full_name: r for r in REQUESTS}.values():
        for trail, leaf in _paths(request):
            target = leaf.message_type.fields_by_name["value"] if leaf.type == 11 else leaf
            if target.type in kinds:
                cases.append((request, trail, leaf))
    return cases


FLOAT_CASES = _cases(_FLOATS)
ENUM_CASES = _cases((FieldDescriptor.TYPE_ENUM,))


def test_the_cases_reach_every_float_and_enum_of_the_requests():
    assert len(FLOAT_CASES) >= 15 and len(ENUM_CASES) >= 3
    reached = {leaf.full_name for _, _, leaf in FLOAT_CASES + ENUM_CASES}
    assert "aflowrl.v1.TrainSample.candidate_advantages" in reached
    assert "aflowrl.v1.TrainRequest.objective" in reached
    assert "aflowrl.v1.JoinWeightGroupRequest.timeout_s" in reached


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_float_anywhere_in_a_request_is_refused_naming_it(value):
    for request, trail, leaf in FLOAT_CASES:
        message, path = _with(request, trail, leaf, value)
        with pytest.raises(InvalidInputError) as raised:
            validation.check(message)
        assert raised.value.field == path, (request.full_name, path, raised.value)
        assert "not finite" in str(raised.value)


def test_an_undefined_enum_value_anywhere_in_a_request_is_refused_naming_it():
    for request, trail, leaf in ENUM_CASES:
        message, path = _with(request, trail, leaf, 57)
        with pytest.raises(InvalidInputError) as raised:
            validation.check(message)
        assert raised.value.field == path and leaf.enum_type.name in str(raised.value)
        for defined in leaf.enum_type.values:  # every defined value passes
            message, _ = _with(request, trail, leaf, defined.number)
            validation.check(message)


def _message_with(full_name: str, value) -> tuple[Message, str]:
    for request, trail, leaf in _cases((*_INTEGERS, *_FLOATS)):
        if leaf.full_name == full_name:
            return _with(request, trail, leaf, value)
    raise LookupError(full_name)


@pytest.mark.parametrize("name", sorted(validation.RANGES))
def test_each_range_admits_its_bounds_and_refuses_beyond_them(name):
    rule = validation.RANGES[name]
    leaf_type = next(f for f in FIELDS if f.full_name == name).type
    unsigned = leaf_type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64)
    floating = leaf_type in _FLOATS
    step = 1e-6 * max(1.0, abs(rule.high)) if floating else 1
    for good in (rule.low, rule.high, *([0] if rule.zero_is_default else [])):
        message, _ = _message_with(name, good if floating else int(good))
        validation.check(message)
    widths = {FieldDescriptor.TYPE_INT32: 31, FieldDescriptor.TYPE_UINT64: 64}
    top = (1 << widths.get(leaf_type, 63)) - 1
    for bad in (rule.low - step, rule.high + step):
        if (unsigned and bad < 0) or (not floating and not -top - 1 <= bad <= top):
            continue  # the wire cannot carry it
        if rule.zero_is_default and bad == 0:
            continue
        message, path = _message_with(name, bad if floating else int(bad))
        with pytest.raises(InvalidInputError) as raised:
            validation.check(message)
        assert raised.value.field == path


def test_the_largest_weight_group_is_the_largest_a_run_spec_allows():
    assert validation.MAX_WEIGHT_GROUP_WORLD == 1 + 64 * 16 * 16  # replicas x pods x GPUs
    with pytest.raises(InvalidInputError, match="world_size"):
        validation.check(learner_pb2.OpenWeightGroupRequest(group="g", world_size=2**31 - 1))
    with pytest.raises(InvalidInputError, match="chunk_bytes"):
        validation.check(learner_pb2.PushWeightsRequest(targets=["h:1"], chunk_bytes=1))


def test_environment_fields_are_named_after_the_call():
    request = environment_pb2.ResetRequest(
        values=environment_pb2.StateValues(default_value=math.nan)
    )
    prefix = validation.prefix_for("/aflowrl.v1.EnvironmentService/Reset")
    with pytest.raises(InvalidInputError) as raised:
        validation.check(request, prefix=prefix)
    assert raised.value.field == "reset.values.default_value"
    assert validation.prefix_for("/aflowrl.v1.LearnerService/Train") == ""


# -- the interceptors: no failure escapes as a hang --------------------------------------------


class _LibraryAbort(BaseException):
    """What torch.distributed.checkpoint raises (CheckpointException is a BaseException)."""


class _Failing(rollout_pb2_grpc.RolloutServiceServicer):
    async def Status(self, request, context):
        raise _LibraryAbort("a truncated shard")

    async def LoadWeights(self, request, context):
        return rollout_pb2.UpdateWeightsResponse(weight_version=request.version)


async def test_a_base_exception_from_a_handler_is_answered_internal_not_left_hanging():
    options = ServerOptions(component="rollout", host="127.0.0.1", port=0)
    registration = ServiceRegistration(
        _Failing(),
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name,
    )
    async with (
        GrpcServer(options, [registration]) as server,
        aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(aio.AioRpcError) as raised:
            await asyncio.wait_for(stub.Status(rollout_pb2.RolloutStatusRequest()), 30)
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        # A request the layer refuses never reaches the handler.
        with pytest.raises(aio.AioRpcError) as raised:
            await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path="/x", version=0))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "version" in (raised.value.details() or "")
        reply = await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path="/x", version=3))
        assert reply.weight_version == 3
