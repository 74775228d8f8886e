"""The grpc weight stream on the wire: ``WeightManifest`` and ``WeightChunk`` messages.

Used by the learner (sender, :func:`encoded_weight_stream`) and the rollout (receiver,
:func:`manifest_from_proto`). Data chunks are the bulk of a push, so they are encoded here
directly in protobuf's wire format (:func:`encode_data_chunk`): the tensor's bytes are copied
once, into the message, where building a ``WeightData`` message copies them twice (into the
message, then into its serialisation). The encoding is exactly protobuf's (tested against it),
so the receiver parses it with the generated code.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from google.protobuf.message import DecodeError

from aflowrl import envs
from aflowrl._proto.v1 import common_pb2
from aflowrl.models.errors import WeightMismatchError
from aflowrl.models.weights import BackgroundChecksum, Manifest, TensorSpec, iter_chunks

logger = logging.getLogger(__name__)

# protobuf tags: (field number << 3) | wire type (0 = varint, 2 = length-delimited)
_CHUNK_DATA = 0x12  # WeightChunk.data = 2
_DATA_OFFSET = 0x08  # WeightData.offset = 1
_DATA_BYTES = 0x12  # WeightData.data = 2


_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_HEAP_BELOW = 32 * 1024 * 1024
"""Allocations below this come from the heap, not from mmap (a chunk is a few MiB)."""
_KEEP_FREE = 256 * 1024 * 1024
"""Free heap kept rather than handed back to the kernel."""


def keep_message_memory() -> bool:
    """Let glibc's malloc reuse the memory of a push's messages instead of mapping it afresh.

    Each message of a push is a new ``bytes`` of a few MiB, several times over: on the learner
    (the encoded chunk, grpc-python's copy into a slice) and on the rollout (grpc-python builds
    every received message by appending the transport's slices to a bytearray, then copies that
    into ``bytes``). With glibc's defaults each of them is mapped fresh (or its heap trimmed back
    as soon as it is freed), so every page is faulted in and zeroed again, message after message:
    that cost the rollout about a third of its CPU per push (0.08 s instead of 0.05 s for the
    100 MB of ``bench/weight_push.py``). Serving allocations under 32 MiB from the heap and
    keeping up to 256 MiB of it free lets the next message reuse the last one's pages. Only the
    processes that push or receive the grpc transport call this (learner rank 0, the rollout);
    a glibc setting of the user's (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
    ``glibc.malloc`` tunables) is kept, and where the C library is not glibc nothing changes.
    Returns whether it applied.
    """
    if envs.GLIBC_MALLOC_SET:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    applied = bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_BELOW)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _KEEP_FREE)
    )
    if applied:
        logger.info(
            "malloc: heap allocations below %d MiB, %d MiB of free heap kept (grpc weight pushes)",
            _HEAP_BELOW >> 20,
            _KEEP_FREE >> 20,
        )
    return applied


def manifest_to_proto(manifest: Manifest) -> common_pb2.WeightManifest:
    return common_pb2.WeightManifest(
        version=manifest.version,
        tensors=[
            common_pb2.TensorMeta(name=t.name, dtype=t.dtype, shape=list(t.shape), nbytes=t.nbytes)
            for t in manifest.tensors
        ],
        total_bytes=manifest.total_bytes,
    )


def manifest_from_proto(message: common_pb2.WeightManifest) -> Manifest:
    """The manifest, refusing a tensor whose ``nbytes`` disagrees with its dtype and shape."""
    specs = []
    for i, meta in enumerate(message.tensors):
        spec = TensorSpec(meta.name, meta.dtype, tuple(int(d) for d in meta.shape))
        try:
            expected = spec.nbytes
        except KeyError:
            raise WeightMismatchError(
                f"unsupported dtype {meta.dtype!r}", field=f"manifest.tensors[{i}].dtype"
            ) from None
        if meta.nbytes != expected:
            raise WeightMismatchError(
                f"{meta.nbytes} bytes for a {meta.dtype} tensor of shape {list(spec.shape)} "
                f"(needs {expected})",
                field=f"manifest.tensors[{i}].nbytes",
            )
        specs.append(spec)
    return Manifest(message.version, tuple(specs), message.total_bytes)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_data_chunk(
    offset: int, data: bytes | memoryview | Sequence[bytes | memoryview]
) -> bytes:
    """``WeightChunk(data=WeightData(offset=offset, data=data)).SerializeToString()``, one copy.

    ``data`` may come in parts (the bytes of several tensors), joined into the message.
    """
    parts = [data] if isinstance(data, bytes | memoryview) else list(data)
    size = sum(len(p) for p in parts)
    # proto3 leaves out fields at their default (offset 0, empty data); so does this.
    inner = (bytes([_DATA_OFFSET]) + _varint(offset) if offset else b"") + (
        bytes([_DATA_BYTES]) + _varint(size) if size else b""
    )
    header = bytes([_CHUNK_DATA]) + _varint(len(inner) + size) + inner
    return b"".join((header, *parts))


@dataclass(frozen=True)
class DataChunk:
    """A decoded ``WeightData``: its bytes are a view of the message (no copy)."""

    offset: int
    data: memoryview


@dataclass(frozen=True)
class MalformedChunk:
    """A message that is not a well-formed ``WeightChunk`` (the servicer refuses it)."""

    reason: str


def _read_varint(raw: memoryview, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _decode_data(raw: memoryview) -> DataChunk:
    """The fields of a ``WeightData`` (any order, unknown ones skipped, as protobuf reads)."""
    offset, data, pos = 0, raw[:0], 0
    while pos < len(raw):
        key, pos = _read_varint(raw, pos)
        field, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _read_varint(raw, pos)
            if field == 1:
                offset = value
        elif kind == 2:
            size, pos = _read_varint(raw, pos)
            if pos + size > len(raw):
                raise ValueError("a field runs past the message")
            if field == 2:
                data = raw[pos : pos + size]
            pos += size
        elif kind in (1, 5):
            pos += 8 if kind == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {kind}")
    if pos != len(raw):
        raise ValueError("a field runs past the message")
    return DataChunk(offset, data)


def decode_chunk(raw: bytes) -> common_pb2.WeightChunk | DataChunk | MalformedChunk:
    """A serialised ``WeightChunk``: data chunks as :class:`DataChunk` views, the rest as protos.

    The rollout's request deserialiser for ``UpdateWeights``: protobuf's parser copies a
    chunk's bytes twice (into the message, then into a ``bytes`` object), this not at all.
    It never raises (a deserialiser that raises becomes an INTERNAL error): a message that is
    not a ``WeightChunk`` comes back as :class:`MalformedChunk`.
    """
    view = memoryview(raw)
    try:
        if view[:1] == bytes([_CHUNK_DATA]):
            size, pos = _read_varint(view, 1)
            if pos + size == len(view):  # one data field and nothing else
                return _decode_data(view[pos:])
        return common_pb2.WeightChunk.FromString(raw)
    except (ValueError, DecodeError) as exc:
        return MalformedChunk(str(exc) or type(exc).__name__)


def encoded_weight_stream(
    manifest: Manifest,
    tensors: Iterable[torch.Tensor],
    chunk_bytes: int,
) -> Iterator[bytes]:
    """The serialised messages of one update: manifest, data chunks in order, commit.

    ``tensors`` (CPU, in manifest order) may be produced lazily. Each data chunk is hashed as it
    goes out, on a thread of its own (:class:`BackgroundChecksum`) from the message's own bytes,
    so hashing chunk k overlaps encoding and sending chunk k + 1; the commit carries the CRC-32
    of the whole payload.
    """
    yield common_pb2.WeightChunk(manifest=manifest_to_proto(manifest)).SerializeToString()
    checksum = BackgroundChecksum()
    try:
        for offset, parts in iter_chunks(tensors, chunk_bytes):
            message = encode_data_chunk(offset, parts)
            size = sum(len(p) for p in parts)
            checksum.update(memoryview(message)[len(message) - size :])
            yield message
        commit = common_pb2.WeightCommit(version=manifest.version, crc32=checksum.value())
    finally:
        checksum.close()
    yield common_pb2.WeightChunk(commit=commit).SerializeToString()


def weight_stream(
    manifest: Manifest, tensors: Mapping[str, torch.Tensor], chunk_bytes: int
) -> list[common_pb2.WeightChunk]:
    """The messages of one update as protos (for tests and tools that edit them)."""
    ordered = (tensors[spec.name] for spec in manifest.tensors)
    return [
        common_pb2.WeightChunk.FromString(m)
        for m in encoded_weight_stream(manifest, ordered, chunk_bytes)
    ]
