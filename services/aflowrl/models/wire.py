"""The grpc weight stream on the wire: ``WeightManifest`` and ``WeightChunk`` messages.

Used by the learner (sender, :func:`encoded_weight_stream`) and the rollout (receiver,
:func:`manifest_from_proto`). Data chunks are the bulk of a push, so they are encoded here
directly in protobuf's wire format (:func:`encode_data_chunk`): the tensor's bytes are copied
once, into the message, where building a ``WeightData`` message copies them twice (into the
message, then into its serialisation). The encoding is exactly protobuf's (tested against it),
so the receiver parses it with the generated code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping

import torch

from aflowrl._proto.v1 import common_pb2
from aflowrl.models.errors import WeightMismatchError
from aflowrl.models.weights import Manifest, TensorSpec, iter_chunks

# protobuf tags: (field number << 3) | wire type (0 = varint, 2 = length-delimited)
_CHUNK_DATA = 0x12  # WeightChunk.data = 2
_DATA_OFFSET = 0x08  # WeightData.offset = 1
_DATA_BYTES = 0x12  # WeightData.data = 2


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


def encode_data_chunk(offset: int, data: bytes | memoryview) -> bytes:
    """``WeightChunk(data=WeightData(offset=offset, data=data)).SerializeToString()``, one copy."""
    size = len(data)
    # proto3 leaves out fields at their default (offset 0, empty data); so does this.
    inner = (bytes([_DATA_OFFSET]) + _varint(offset) if offset else b"") + (
        bytes([_DATA_BYTES]) + _varint(size) if size else b""
    )
    header = bytes([_CHUNK_DATA]) + _varint(len(inner) + size) + inner
    return b"".join((header, data))


def encoded_weight_stream(
    manifest: Manifest,
    tensors: Iterable[torch.Tensor],
    chunk_bytes: int,
) -> Iterator[bytes]:
    """The serialised messages of one update: manifest, data chunks in order, commit.

    ``tensors`` (CPU, in manifest order) may be produced lazily; each is hashed as it is
    chunked, and the commit carries the SHA-256 of the whole payload.
    """
    yield common_pb2.WeightChunk(manifest=manifest_to_proto(manifest)).SerializeToString()
    digest = hashlib.sha256()
    for offset, data in iter_chunks(tensors, chunk_bytes):
        digest.update(data)
        yield encode_data_chunk(offset, data)
    commit = common_pb2.WeightCommit(version=manifest.version, sha256=digest.hexdigest())
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
