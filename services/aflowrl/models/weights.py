"""Weight updates: manifests, buckets, chunked payloads, verification, safetensors directories.

Every transport moves the policy's tensors (Hugging Face names) in the order of a
:class:`Manifest` (names, dtypes, shapes, sizes, version), which is known before any tensor is
gathered, so senders stream one tensor at a time and never hold the whole model:

- ``grpc``: the payload (each tensor's raw little-endian C-contiguous bytes, concatenated) goes
  out as ``WeightChunk`` messages (manifest, data, commit); the sender hashes as it streams and
  the commit carries the CRC-32. The rollout stages the payload with a
  :class:`PayloadAssembler`, which refuses anything out of order, short, long, corrupt or for
  another model before a single weight is touched.
- ``nccl``: the tensors are packed into buckets (:func:`plan_buckets`, the same cut on both
  sides) and broadcast (:mod:`aflowrl.models.broadcast`).
- ``filesystem``: a Hugging Face safetensors directory (loadable by ``from_pretrained`` and vLLM)
  whose marker file ``aflowrl-weights.json`` is written last and atomically: a directory without
  it is partial. The marker records the version and each file's SHA-256, checked by
  :func:`verify_weights_dir` before :func:`iter_weights_dir` reads a tensor.

Engines load an update as a stream of buckets (:func:`iter_buckets`): at most one bucket is in
flight, whatever the model's size.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from aflowrl import documents
from aflowrl.config.policy import LoraSpec
from aflowrl.models.errors import (
    CorruptWeightsError,
    ModelNotFoundError,
    NonFiniteWeightsError,
    PartialWeightsError,
    StaleWeightsError,
    WeightMismatchError,
)
from aflowrl.models.loading import DTYPES, adapter_shapes, dtype_name, lora_config, torch_dtype

logger = logging.getLogger(__name__)

try:  # ISA-L's CRC-32: zlib's polynomial and values, about 5x faster (PCLMULQDQ folding)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - a dependency of the learner and rollout extras
    from zlib import crc32 as _crc32


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """``zlib.crc32(data, value)``: the weight push's checksum, computed by ISA-L."""
    return _crc32(data, value)


MARKER = "aflowrl-weights.json"
"""Written last into a weights directory: its version, files and their checksums."""

ADAPTER_CONFIG = "adapter_config.json"
"""PEFT's adapter configuration, beside the adapter weights of a LoRA update."""

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_SHARD_BYTES = 2 * 1024**3
_MAX_MARKER_BYTES = 16 << 20
"""Largest marker read (one line per tensor: a 70B model's holds about a thousand)."""
_COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)

NamedTensors = Iterable[tuple[str, torch.Tensor]]
"""(Hugging Face name, tensor) pairs, possibly produced lazily one at a time."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, dtype and shape of one tensor of an update."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * _ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Manifest:
    """What a weight update holds (``WeightManifest`` in the proto)."""

    version: int
    tensors: tuple[TensorSpec, ...]
    total_bytes: int

    @classmethod
    def of(cls, version: int, specs: Iterable[TensorSpec]) -> Manifest:
        specs = tuple(specs)
        return cls(version, specs, sum(s.nbytes for s in specs))

    def to_json(self) -> bytes:
        """A compact encoding (the broadcast header carries it)."""
        doc = {
            "version": self.version,
            "tensors": [[t.name, t.dtype, list(t.shape)] for t in self.tensors],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, *, field: str = "manifest") -> Manifest:
        try:
            doc = json.loads(data)
            specs = [
                TensorSpec(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in doc["tensors"]
            ]
            for i, spec in enumerate(specs):
                if spec.dtype not in _ITEMSIZE:
                    raise WeightMismatchError(
                        f"unsupported dtype {spec.dtype!r}", field=f"{field}.tensors[{i}]"
                    )
            return cls.of(int(doc["version"]), specs)
        except (ValueError, KeyError, TypeError) as exc:
            raise WeightMismatchError(f"unreadable manifest: {exc}", field=field) from exc


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape))


def parameter_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a Hugging Face model's weights as its checkpoints store them.

    Parameters once each (tied weights under their first name, as ``save_pretrained`` writes
    them) plus persistent buffers.
    """
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    persistent = set(model.state_dict().keys())
    for name, buffer in model.named_buffers():
        if name in persistent:
            shapes[name] = tuple(buffer.shape)
    return shapes


def shapes_from_config(
    model_dir: Path, *, trust_remote_code: bool = False, lora: LoraSpec | None = None
) -> dict[str, Any]:
    """:func:`parameter_shapes` of the architecture in ``model_dir``, built on the meta device.

    With ``lora``: the shapes of the LoRA adapters alone (what an update then carries).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(
        model_dir, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, trust_remote_code=trust_remote_code
        )
        if lora is not None:
            from peft import get_peft_model

            return adapter_shapes(get_peft_model(model, lora_config(lora)))
    return parameter_shapes(model)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor (C-contiguous, native little-endian), without a copy."""
    flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
    array: Any = flat.numpy()
    return memoryview(array).cast("B")


def build_manifest(version: int, tensors: Mapping[str, torch.Tensor]) -> Manifest:
    """The manifest of ``tensors`` (in the order given)."""
    return Manifest.of(version, (spec_of(n, t) for n, t in tensors.items()))


def iter_chunks(
    tensors: Iterable[torch.Tensor], chunk_bytes: int
) -> Iterator[tuple[int, list[memoryview]]]:
    """(offset, parts) of the payload: chunks of ``chunk_bytes`` (the last may be shorter).

    A chunk is a list of views of the tensors' bytes (no copy): a large tensor spans several
    chunks, and small ones (norms, biases) share one, so a chunk goes out as soon as it is full
    or the tensors end. ``tensors`` may be produced lazily (gathered one at a time).
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    offset, size = 0, 0
    parts: list[memoryview] = []
    for tensor in tensors:
        data = tensor_bytes(tensor)
        start = 0
        while start < len(data):
            take = min(chunk_bytes - size, len(data) - start)
            parts.append(data[start : start + take])
            size += take
            start += take
            if size == chunk_bytes:
                yield offset, parts
                offset, size, parts = offset + size, 0, []
    if parts:
        yield offset, parts


# ---- buckets ----------------------------------------------------------------------------------


def plan_buckets(
    specs: Iterable[TensorSpec], bucket_bytes: int, *, solo_bytes: int | None = None
) -> list[range]:
    """Consecutive runs of whole tensors of at most ``bucket_bytes`` each (as indices).

    A tensor larger than a bucket is a bucket of its own, and so is every tensor of at least
    ``solo_bytes`` when given (a broadcast sends it as it is, without packing it). Sender and
    receiver of a broadcast cut the same buckets from the same manifest, so neither needs to
    tell the other.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[range] = []
    start, size, count = 0, 0, 0
    for i, spec in enumerate(specs):
        alone = solo_bytes is not None and spec.nbytes >= solo_bytes
        if i > start and (alone or size + spec.nbytes > bucket_bytes):
            buckets.append(range(start, i))
            start, size = i, 0
        size += spec.nbytes
        count = i + 1
        if alone:
            buckets.append(range(i, i + 1))
            start, size = i + 1, 0
    if start < count:
        buckets.append(range(start, count))
    return buckets


def iter_buckets(
    items: NamedTensors, bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream of named tensors into buckets as :func:`plan_buckets` cuts them."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def unpack_bucket(
    specs: Iterable[TensorSpec], packed: torch.Tensor
) -> list[tuple[str, torch.Tensor]]:
    """Named views of a packed uint8 bucket (the tensors' bytes concatenated, in order)."""
    out: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for spec in specs:
        raw = packed[offset : offset + spec.nbytes]
        out.append((spec.name, raw.view(torch_dtype(spec.dtype)).view(spec.shape)))
        offset += spec.nbytes
    return out


# ---- verification -----------------------------------------------------------------------------


def _sum_probe(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor, on ``tensor``'s device, finite whenever every element of ``tensor`` is:
    its sum (a NaN propagates; an infinity makes the sum infinite or NaN), accumulated in
    float32 at least so that half-precision weights do not overflow it.

    The converse does not hold (finite elements can overflow a sum), so a non-finite probe is
    settled by :func:`_exactly_finite`. A sum reads the tensor once with one accumulator
    (about 2.5x faster than ``aminmax`` on a CPU, memory-bound on a GPU).
    """
    wide = tensor.dtype if tensor.element_size() > 4 else torch.float32
    try:
        return tensor.detach().sum(dtype=wide)
    except (RuntimeError, NotImplementedError):  # a dtype sum lacks (float8)
        return tensor.detach().float().sum()


def _exactly_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN and no infinity, element by element: ``aminmax``
    propagates a NaN, and an infinity is an extreme (no temporary the tensor's size, unlike
    ``isfinite(t).all()``)."""
    data = tensor.detach()
    try:
        low, high = torch.aminmax(data)
    except (RuntimeError, NotImplementedError):  # a dtype aminmax lacks (float8)
        return bool(torch.isfinite(data.float()).all())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds no NaN and no infinity (True for integer tensors).

    One sum on the tensor's own device (:func:`_sum_probe`), and the exact check only when the
    sum is not finite: this runs on every bucket a learner sends and every tensor a replica
    receives.
    """
    if not tensor.is_floating_point() or not tensor.numel():
        return True
    return math.isfinite(float(_sum_probe(tensor))) or _exactly_finite(tensor)


def nonfinite_names(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating tensors holding a NaN or an infinity.

    Fused: one sum per tensor on its own device (:func:`_sum_probe`), the sums stacked, and one
    transfer to the host per device for all of them (a learner checks its whole model before
    any byte leaves it; checked one by one, a GPU would synchronise once per tensor); a tensor
    whose sum is not finite is then checked exactly.
    """
    by_device: dict[torch.device, tuple[list[tuple[str, torch.Tensor]], list[torch.Tensor]]] = {}
    for name, tensor in tensors:
        if not tensor.is_floating_point() or not tensor.numel():
            continue
        probe = _sum_probe(tensor).float()
        named, probes = by_device.setdefault(probe.device, ([], []))
        named.append((name, tensor))
        probes.append(probe)
    bad: list[str] = []
    for named, probes in by_device.values():
        finite = torch.isfinite(torch.stack(probes)).cpu().tolist()
        bad += [
            n for (n, t), ok in zip(named, finite, strict=True) if not ok and not _exactly_finite(t)
        ]
    return bad


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], *, field: str = "weights") -> None:
    """Raise :class:`NonFiniteWeightsError` naming the first floating tensor holding a NaN or
    an infinity (a checksum proves the bytes arrived, not that they are weights)."""
    for name, tensor in tensors:
        if not all_finite(tensor):
            raise NonFiniteWeightsError(_nonfinite_message(name), field=field)


def _nonfinite_message(name: str) -> str:
    return f"{name} holds non-finite values (NaN or infinity); the update is refused"


def _extents(specs: Iterable[TensorSpec]) -> list[tuple[TensorSpec, int, int]]:
    """(spec, first byte, end byte) of each floating tensor of a payload, in order."""
    out = []
    offset = 0
    for spec in specs:
        if spec.nbytes and torch_dtype(spec.dtype).is_floating_point:
            out.append((spec, offset, offset + spec.nbytes))
        offset += spec.nbytes
    return out


def check_manifest(
    manifest: Manifest,
    expected: Mapping[str, tuple[int, ...]],
    *,
    serving_version: int,
    field: str = "manifest",
) -> None:
    """Refuse a manifest that is stale or does not describe the whole model exactly."""
    check_stale(manifest.version, serving_version, field=f"{field}.version")
    names = [t.name for t in manifest.tensors]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise WeightMismatchError(f"duplicate tensors {duplicates[:5]}", field=f"{field}.tensors")
    missing = sorted(set(expected) - set(names))
    unexpected = sorted(set(names) - set(expected))
    if missing or unexpected:
        raise WeightMismatchError(
            f"names differ from the model's: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}",
            field=f"{field}.tensors",
        )
    for i, spec in enumerate(manifest.tensors):
        where = f"{field}.tensors[{i}] ({spec.name})"
        if spec.dtype not in DTYPES:
            raise WeightMismatchError(f"dtype {spec.dtype!r} is not one of {DTYPES}", field=where)
        if tuple(spec.shape) != tuple(expected[spec.name]):
            raise WeightMismatchError(
                f"shape {list(spec.shape)} differs from the model's {list(expected[spec.name])}",
                field=where,
            )
    total = sum(t.nbytes for t in manifest.tensors)
    if manifest.total_bytes != total:
        raise WeightMismatchError(
            f"{manifest.total_bytes} bytes announced, the tensors need {total}",
            field=f"{field}.total_bytes",
        )


class StagingBuffer:
    """Host memory a replica stages a grpc update in, kept for the next update of the same size.

    Fresh memory costs a page fault per 4 KiB page on first touch (on the order of the copy
    itself), so reusing it makes every update after the first one cheaper. It is the "model" in
    the bound "one model plus one chunk" of a replica's host memory during a grpc push. A new
    buffer is not zero-filled: its pages are mapped as the update is copied in, on the
    assembler's worker thread, not on the event loop (filling 15 GB would hold the GIL there
    for seconds).

    An engine on the CPU may serve from the staged tensors themselves instead of copying them
    into its own (:meth:`adopted`): the buffer then holds the served weights, and the next update
    is staged in the one that held the weights before, which nothing serves from any more. Two
    buffers alternate, and the bound stays one model plus one buffer.
    """

    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None
        self._serving: np.ndarray | None = None

    def take(self, nbytes: int) -> np.ndarray:
        """The buffer to stage the next update in (never the one an engine serves from)."""
        if self._buffer is None or self._buffer.nbytes != nbytes:
            self._buffer = None  # free the old one before allocating the new one
            self._buffer = np.empty(nbytes, dtype=np.uint8)
        return self._buffer

    def adopted(self) -> None:
        """The engine now serves from the buffer last taken; the one it served from before (if
        any) is free, and the next :meth:`take` reuses it."""
        self._serving, self._buffer = self._buffer, self._serving

    def prepare(self) -> None:
        """After the first adoption: allocate the spare buffer and map its pages now (call it on
        a worker thread; numpy releases the GIL), so that the next update is staged into memory
        that is already there instead of faulting it in during the push."""
        if self._buffer is None and self._serving is not None:
            buffer = np.empty(self._serving.nbytes, dtype=np.uint8)
            buffer[:: mmap.PAGESIZE] = 0
            self._buffer = buffer

    def release(self) -> None:
        """Drop the staging buffer (not the weights an engine serves from)."""
        self._buffer = None


class PayloadChecksum:
    """CRC-32 of a payload fed in order (:func:`crc32`; it releases the GIL on large buffers).

    The checksum travels in the same stream as the data and is not keyed, so it guards against
    accidents (a truncated, misordered or damaged stream, a sender with a bug), not against a
    party that can rewrite the stream: that is TLS's and the bearer token's job. For accidents
    CRC-32 is the usual tool (it catches every burst of up to 32 bits and all but 2^-32 of other
    damage). It is paid on both ends of every push: ISA-L computes it at about 35 GB/s on a
    2-core x86 machine with AVX-512, zlib at about 7 GB/s, SHA-256 slower still.
    """

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes | memoryview) -> None:
        self.value = crc32(data, self.value)


class _OrderedWorker:
    """Runs calls one after another on a thread of its own, at most ``backlog`` queued.

    :meth:`submit` waits for the oldest call beyond the backlog, so a worker that falls behind
    keeps a bounded number of buffers alive; :meth:`wait` raises what a call raised.
    """

    def __init__(self, backlog: int) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checksum")
        self._pending: collections.deque[concurrent.futures.Future[None]] = collections.deque()
        self._backlog = max(1, backlog)

    def submit(self, fn: Any, *args: Any) -> None:
        while len(self._pending) >= self._backlog:
            self._pending.popleft().result()
        self._pending.append(self._thread.submit(fn, *args))

    def wait(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        """Stop the thread, dropping the calls not started yet (idempotent)."""
        self._pending.clear()
        self._thread.shutdown(wait=True, cancel_futures=True)


class BackgroundChecksum:
    """A :class:`PayloadChecksum` fed on a thread of its own, in order.

    :func:`crc32` releases the GIL, so the sender hashes chunk k while it encodes and sends
    chunk k + 1. At most ``backlog`` buffers wait to be hashed (:meth:`update` waits beyond
    that). A buffer must not change until it is hashed: give it bytes.
    """

    def __init__(self, backlog: int = 4) -> None:
        self._checksum = PayloadChecksum()
        self._worker = _OrderedWorker(backlog)

    def update(self, data: bytes | memoryview) -> None:
        self._worker.submit(self._checksum.update, data)

    def value(self) -> int:
        """The CRC-32 of everything fed (waits for the thread)."""
        self._worker.wait()
        return self._checksum.value

    def close(self) -> None:
        self._worker.close()


class PayloadAssembler:
    """Receives a payload in order into one buffer and hashes it as it arrives.

    :meth:`add` checks a chunk's place at once and hands the rest to a thread of its own: the
    copy into the staging buffer (numpy releases the GIL for it) and the hashing of that region
    (so does :func:`crc32`). The event loop goes back to receiving while chunk k is staged and
    hashed; the received messages are held until then (a few at most: :meth:`add` waits beyond
    that). :meth:`finish` waits for the thread, checks the commit (version, size, checksum) and
    returns the tensors, views of the buffer (no copy). Any error leaves nothing applied; the
    caller drops the assembler (:meth:`close` stops its thread).
    """

    def __init__(
        self, manifest: Manifest, staging: StagingBuffer | None = None, *, backlog: int = 4
    ) -> None:
        self.manifest = manifest
        self._array = (staging or StagingBuffer()).take(manifest.total_bytes)
        self._view = self._array.data
        self._checksum = PayloadChecksum()
        self._worker = _OrderedWorker(backlog)
        self.received = 0
        self._unchecked = collections.deque(_extents(manifest.tensors))
        """The floating tensors not yet checked for NaN / infinity, in payload order."""
        self._nonfinite: str | None = None

    def add(self, offset: int, data: bytes | memoryview | Sequence[bytes | memoryview]) -> None:
        """Stage the bytes of payload ``[offset, offset + len)`` (one buffer or several parts).

        The parts must not change until they are staged (they are a received message's bytes).
        """
        if offset != self.received:
            raise WeightMismatchError(
                f"chunk at offset {offset}, expected {self.received} (chunks must arrive in order)",
                field="data.offset",
            )
        parts = [data] if isinstance(data, bytes | memoryview) else list(data)
        end = offset + sum(len(p) for p in parts)
        if end > self.manifest.total_bytes:
            raise WeightMismatchError(
                f"chunk ends at byte {end}, past the announced {self.manifest.total_bytes}",
                field="data",
            )
        self._worker.submit(self._stage, offset, parts)
        self.received = end

    def _stage(self, offset: int, parts: list[bytes | memoryview]) -> None:
        """On the worker: copy ``parts`` into the buffer at ``offset`` and hash that region."""
        at = offset
        for part in parts:
            size = len(part)
            if size:
                np.copyto(self._array[at : at + size], np.frombuffer(part, dtype=np.uint8))
            at += size
        # Hashed from the staging buffer, which no later chunk overwrites.
        self._checksum.update(self._view[offset:at])
        # Each tensor checked for NaN / infinity once its bytes are all here, while the next
        # chunks arrive (at the end, the check alone would hold the commit up).
        while self._unchecked and self._unchecked[0][2] <= at:
            spec, start, _ = self._unchecked.popleft()
            if self._nonfinite is None:
                raw = torch.frombuffer(
                    self._array, dtype=torch.uint8, count=spec.nbytes, offset=start
                )
                if not all_finite(raw.view(torch_dtype(spec.dtype))):
                    self._nonfinite = spec.name

    def checksum(self) -> int:
        """CRC-32 of what was received (waits for the worker)."""
        self._worker.wait()
        return self._checksum.value

    def close(self) -> None:
        self._worker.close()

    def finish(self, commit_version: int, commit_crc32: int) -> dict[str, torch.Tensor]:
        manifest = self.manifest
        if commit_version != manifest.version:
            raise WeightMismatchError(
                f"{commit_version} differs from the manifest's {manifest.version}",
                field="commit.version",
            )
        if self.received != manifest.total_bytes:
            raise PartialWeightsError(
                f"partial update: {self.received} of {manifest.total_bytes} bytes received",
                field="commit",
            )
        checksum = self.checksum()
        if checksum != commit_crc32:
            raise CorruptWeightsError(
                f"checksum mismatch: payload CRC-32 {checksum:08x}, the commit says "
                f"{commit_crc32:08x}",
                field="commit.crc32",
            )
        if self._nonfinite is not None:  # found while the payload arrived (_stage)
            raise NonFiniteWeightsError(_nonfinite_message(self._nonfinite), field="data")
        return tensors_from_payload(manifest.tensors, self._array)


def tensors_from_payload(
    specs: Iterable[TensorSpec], payload: np.ndarray | bytearray | bytes
) -> dict[str, torch.Tensor]:
    """Tensors viewing ``payload`` (an array or a bytearray is shared, bytes are copied once)."""
    buffer = payload if isinstance(payload, np.ndarray | bytearray) else bytearray(payload)
    tensors: dict[str, torch.Tensor] = {}
    offset = 0
    for spec in specs:
        if spec.nbytes == 0:
            tensors[spec.name] = torch.empty(spec.shape, dtype=torch_dtype(spec.dtype))
            continue
        raw = torch.frombuffer(buffer, dtype=torch.uint8, count=spec.nbytes, offset=offset)
        tensors[spec.name] = raw.view(torch_dtype(spec.dtype)).view(spec.shape)
        offset += spec.nbytes
    return tensors


# ---- safetensors directories (filesystem transport, HF export) ------------------------------


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


def _shards(items: NamedTensors) -> Iterator[dict[str, torch.Tensor]]:
    """Runs of tensors of at most 2 GiB (as Hugging Face shards them)."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > _SHARD_BYTES:
            yield shard
            shard, size = {}, 0
        shard[name] = tensor.detach().contiguous()
        size += nbytes
    yield shard


def write_weights_dir(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor] | NamedTensors,
    *,
    version: int,
    model_dir: Path | None = None,
    adapter_config: Mapping[str, Any] | None = None,
) -> int:
    """Write ``tensors`` as a Hugging Face safetensors directory, marker last; returns bytes.

    ``tensors`` may be a lazy stream: one shard (at most 2 GiB) is held at a time. Config and
    tokenizer files are copied from ``model_dir`` so the directory is a complete model. Shards
    are named and indexed by ``model.safetensors.index.json`` as HF does. With
    ``adapter_config`` the directory is a PEFT LoRA adapter instead (``adapter_config.json`` and
    ``adapter_model.safetensors``, which vLLM and peft load).
    """
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    written: list[tuple[str, list[str]]] = []
    specs: list[TensorSpec] = []
    for i, shard in enumerate(_shards(items)):
        # Shard i is written as a temporary name, renamed once the count is known.
        file = f".shard-{i:05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        written.append((file, list(shard)))
        specs.extend(spec_of(n, t) for n, t in shard.items())
    count = len(written)
    files: dict[str, str] = {}
    weight_map: dict[str, str] = {}
    for i, (tmp_name, names) in enumerate(written):
        file = (
            "model.safetensors" if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        )
        os.replace(out / tmp_name, out / file)
        files[file] = _file_sha256(out / file)
        weight_map.update(dict.fromkeys(names, file))
    total = sum(s.nbytes for s in specs)
    if count > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if adapter_config is not None:
        (out / ADAPTER_CONFIG).write_text(json.dumps(dict(adapter_config), indent=1))
    elif model_dir is not None:
        for name in _COPIED_FILES:
            if (model_dir / name).is_file() and model_dir.resolve() != out.resolve():
                shutil.copyfile(model_dir / name, out / name)
    marker = {
        "version": version,
        "files": files,
        "tensors": {s.name: [s.dtype, list(s.shape)] for s in specs},
    }
    tmp = out / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, out / MARKER)
    return total


def read_marker(path: str | Path) -> dict[str, Any]:
    """The marker of a complete weights directory (refuses a partial one)."""
    marker = Path(path) / MARKER
    if not Path(path).is_dir():
        raise ModelNotFoundError(f"path: no weights directory at {path}")
    if not marker.is_file():
        raise PartialWeightsError(
            f"{path} has no {MARKER}: the directory is partial (still being written, or an "
            "interrupted export)",
            field="path",
        )
    source = str(marker)
    text = documents.read_text(marker, source=source, max_bytes=_MAX_MARKER_BYTES)
    data = documents.load_json(text, source=source)
    tensors = data.get("tensors") if isinstance(data, dict) else None
    files = data.get("files") if isinstance(data, dict) else None
    well_formed = (
        isinstance(data, dict)
        and isinstance(data.get("version"), int)
        and isinstance(files, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
        and isinstance(tensors, dict)
        and all(
            isinstance(spec, list)
            and len(spec) == 2
            and isinstance(spec[0], str)
            and isinstance(spec[1], list)
            and all(isinstance(n, int) and n >= 0 for n in spec[1])
            for spec in tensors.values()
        )
    )
    if not well_formed:
        raise CorruptWeightsError(
            f"{marker} is not a weights marker ({{version, files, tensors}})", field="path"
        )
    return cast(dict[str, Any], data)


@dataclass(frozen=True)
class WeightsDir:
    """A verified weights directory: its manifest and where each tensor lives."""

    path: Path
    manifest: Manifest
    files: dict[str, str]
    """tensor name -> file name."""


def verify_weights_dir(
    path: str | Path,
    expected: Mapping[str, tuple[int, ...]],
    *,
    version: int,
    serving_version: int,
) -> WeightsDir:
    """Check a directory written by :func:`write_weights_dir` without loading a tensor.

    The marker must be there and name ``version``; its tensors must be the model's; every file's
    SHA-256 must match (read in 8 MiB blocks); every file's own header must agree with the
    marker.
    """
    from safetensors import safe_open

    marker = read_marker(path)
    if int(marker["version"]) != version:
        raise WeightMismatchError(
            f"{path} holds version {marker['version']}, the request says {version}",
            field="version",
        )
    specs = tuple(
        TensorSpec(name, dtype, tuple(shape)) for name, (dtype, shape) in marker["tensors"].items()
    )
    manifest = Manifest.of(version, specs)
    check_manifest(manifest, expected, serving_version=serving_version, field="marker")
    located: dict[str, str] = {}
    for file, sha in marker["files"].items():
        actual = _file_sha256(Path(path) / file)
        if actual != sha:
            raise CorruptWeightsError(
                f"{file}: checksum mismatch (file SHA-256 {actual}, marker says {sha})",
                field="path",
            )
        with safe_open(str(Path(path) / file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                located[name] = file
                # One tensor at a time, before the first reaches the engine.
                check_finite([(name, handle.get_tensor(name))], field="path")
    for spec in specs:
        if spec.name not in located:
            raise WeightMismatchError(f"{spec.name}: in the marker, in no file", field="path")
    return WeightsDir(Path(path), manifest, located)


def iter_weights_dir(source: WeightsDir) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a verified directory in manifest order, read one at a time."""
    from safetensors import safe_open

    handles: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for spec in source.manifest.tensors:
            file = source.files[spec.name]
            if file not in handles:
                handles[file] = stack.enter_context(
                    safe_open(str(source.path / file), framework="pt")
                )
            tensor = handles[file].get_tensor(spec.name)
            if tuple(tensor.shape) != spec.shape or dtype_name(tensor.dtype) != spec.dtype:
                raise WeightMismatchError(f"{spec.name}: file and marker disagree", field="path")
            yield spec.name, tensor


def read_weights_dir(
    path: str | Path,
    expected: Mapping[str, tuple[int, ...]],
    *,
    version: int,
    serving_version: int,
) -> tuple[dict[str, torch.Tensor], int]:
    """Verify and load a whole directory into memory; (tensors, bytes). For small models/tests."""
    source = verify_weights_dir(path, expected, version=version, serving_version=serving_version)
    return dict(iter_weights_dir(source)), source.manifest.total_bytes


def latest_weights_dir(root: str | Path) -> tuple[Path, int] | None:
    """The complete weights directory of highest version under ``root`` (``v00000012``...)."""
    best: tuple[Path, int] | None = None
    base = Path(root)
    if not base.is_dir():
        return None
    for child in base.iterdir():
        if not child.name.startswith("v") or not (child / MARKER).is_file():
            continue
        try:
            version = int(json.loads((child / MARKER).read_text())["version"])
        except (ValueError, KeyError, json.JSONDecodeError):
            logger.warning("ignoring %s: unreadable %s", child, MARKER)
            continue
        if best is None or version > best[1]:
            best = (child, version)
    return best


def version_dir(root: str | Path, version: int) -> Path:
    """``root/v00000012``: where the filesystem transport writes a version."""
    return Path(root) / f"v{version:08d}"


def prune_versions(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest version directories under ``root``; returns deleted."""
    base = Path(root)
    dirs = sorted(
        (
            p
            for p in base.iterdir()
            if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit()
        ),
        key=lambda p: int(p.name[1:]),
    )
    doomed = dirs[: max(0, len(dirs) - keep)]
    for old in doomed:
        shutil.rmtree(old, ignore_errors=True)
    return doomed


def check_stale(version: int, serving_version: int, *, field: str = "version") -> None:
    """Refuse a version that is not newer than the serving one."""
    if version <= serving_version:
        raise StaleWeightsError(
            f"{field}: {version} is not newer than the serving version {serving_version}; "
            f"version {serving_version} keeps serving"
        )
