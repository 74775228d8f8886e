"""Weight updates: manifests, chunked payloads, verification, and safetensors directories.

The learner serialises the policy's tensors (Hugging Face names) into one payload, the
concatenation of each tensor's raw little-endian C-contiguous bytes, described by a
:class:`Manifest` (names, dtypes, shapes, sizes, version and the SHA-256 of the payload). The
``grpc`` transport streams it as ``WeightChunk`` messages (manifest, data, commit); the rollout
rebuilds it with a :class:`PayloadAssembler`, which refuses anything that is out of order,
short, long, corrupt or for another model, before a single weight is touched.

The ``filesystem`` transport writes a Hugging Face safetensors directory (loadable by
``from_pretrained`` and vLLM) whose marker file ``aflowrl-weights.json`` is written last and
atomically: a directory without it is partial. The marker records the version and each file's
SHA-256, which the reader checks (:func:`read_weights_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from aflowrl import documents
from aflowrl.models.errors import (
    CorruptWeightsError,
    ModelNotFoundError,
    PartialWeightsError,
    StaleWeightsError,
    WeightMismatchError,
)
from aflowrl.models.loading import DTYPES, dtype_name, torch_dtype

logger = logging.getLogger(__name__)

MARKER = "aflowrl-weights.json"
"""Written last into a weights directory: its version, files and their checksums."""

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
    """What a weight update holds and how to check it (``WeightManifest`` in the proto)."""

    version: int
    tensors: tuple[TensorSpec, ...]
    total_bytes: int
    sha256: str


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


def shapes_from_config(model_dir: Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """:func:`parameter_shapes` of the architecture in ``model_dir``, built on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(
        model_dir, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, trust_remote_code=trust_remote_code
        )
    return parameter_shapes(model)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor (C-contiguous, native little-endian), without a copy."""
    flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
    array: Any = flat.numpy()
    return memoryview(array).cast("B")


def build_manifest(version: int, tensors: Mapping[str, torch.Tensor]) -> Manifest:
    """The manifest of ``tensors`` (CPU, in the order given) with the payload's SHA-256."""
    digest = hashlib.sha256()
    specs = []
    for name, tensor in tensors.items():
        specs.append(TensorSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape)))
        digest.update(tensor_bytes(tensor))
    return Manifest(version, tuple(specs), sum(s.nbytes for s in specs), digest.hexdigest())


def iter_chunks(
    tensors: Iterable[torch.Tensor], chunk_bytes: int
) -> Iterator[tuple[int, memoryview]]:
    """(offset, bytes) slices of the payload, at most ``chunk_bytes`` each, without copying."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    offset = 0
    for tensor in tensors:
        data = tensor_bytes(tensor)
        for start in range(0, len(data), chunk_bytes):
            piece = data[start : start + chunk_bytes]
            yield offset, piece
            offset += len(piece)


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
    if len(manifest.sha256) != 64:
        raise WeightMismatchError("not a SHA-256 hex digest", field=f"{field}.sha256")


class PayloadAssembler:
    """Receives a payload in order into one buffer and hashes it as it arrives.

    :meth:`finish` checks the commit (version, size, checksum) and returns the tensors, views of
    the buffer (no copy). Any error leaves nothing applied; the caller drops the assembler.
    """

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._buffer = bytearray(manifest.total_bytes)
        self._view = memoryview(self._buffer)
        self._hash = hashlib.sha256()
        self.received = 0

    def add(self, offset: int, data: bytes | memoryview) -> None:
        if offset != self.received:
            raise WeightMismatchError(
                f"chunk at offset {offset}, expected {self.received} (chunks must arrive in order)",
                field="data.offset",
            )
        end = offset + len(data)
        if end > self.manifest.total_bytes:
            raise WeightMismatchError(
                f"chunk ends at byte {end}, past the announced {self.manifest.total_bytes}",
                field="data",
            )
        self._view[offset:end] = data
        self._hash.update(data)
        self.received = end

    def finish(self, commit_version: int) -> dict[str, torch.Tensor]:
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
        digest = self._hash.hexdigest()
        if digest != manifest.sha256:
            raise CorruptWeightsError(
                f"checksum mismatch: payload SHA-256 {digest}, manifest says {manifest.sha256}",
                field="manifest.sha256",
            )
        return tensors_from_payload(manifest.tensors, self._buffer)


def tensors_from_payload(
    specs: Iterable[TensorSpec], payload: bytearray | bytes
) -> dict[str, torch.Tensor]:
    """Tensors viewing ``payload`` (a bytearray is shared, bytes are copied once)."""
    buffer = payload if isinstance(payload, bytearray) else bytearray(payload)
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


def write_weights_dir(
    path: str | Path,
    tensors: Mapping[str, torch.Tensor],
    *,
    version: int,
    model_dir: Path | None = None,
) -> int:
    """Write ``tensors`` as a Hugging Face safetensors directory, marker last; returns bytes.

    Config and tokenizer files are copied from ``model_dir`` so the directory is a complete model.
    Shards of at most 2 GiB are indexed by ``model.safetensors.index.json`` as HF does.
    """
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > _SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.detach().contiguous()
        size += nbytes
    files: dict[str, str] = {}
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = (
            "model.safetensors"
            if len(shards) == 1
            else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        save_file(shard, str(out / file), metadata={"format": "pt"})
        files[file] = _file_sha256(out / file)
        weight_map.update(dict.fromkeys(shard, file))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}}
        (out / "model.safetensors.index.json").write_text(
            json.dumps({**index, "weight_map": weight_map}, indent=2)
        )
    if model_dir is not None:
        for name in _COPIED_FILES:
            if (model_dir / name).is_file() and model_dir.resolve() != out.resolve():
                shutil.copyfile(model_dir / name, out / name)
    marker = {
        "version": version,
        "files": files,
        "tensors": {n: [dtype_name(t.dtype), list(t.shape)] for n, t in tensors.items()},
    }
    tmp = out / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, out / MARKER)
    return sum(t.numel() * t.element_size() for t in tensors.values())


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


def read_weights_dir(
    path: str | Path,
    expected: Mapping[str, tuple[int, ...]],
    *,
    version: int,
    serving_version: int,
) -> tuple[dict[str, torch.Tensor], int]:
    """Verify and load a directory written by :func:`write_weights_dir`; (tensors, bytes)."""
    from safetensors.torch import load_file

    marker = read_marker(path)
    if int(marker["version"]) != version:
        raise WeightMismatchError(
            f"{path} holds version {marker['version']}, the request says {version}",
            field="version",
        )
    specs = tuple(
        TensorSpec(name, dtype, tuple(shape)) for name, (dtype, shape) in marker["tensors"].items()
    )
    manifest = Manifest(version, specs, sum(s.nbytes for s in specs), "0" * 64)
    check_manifest(manifest, expected, serving_version=serving_version, field="marker")
    tensors: dict[str, torch.Tensor] = {}
    for file, sha in marker["files"].items():
        actual = _file_sha256(Path(path) / file)
        if actual != sha:
            raise CorruptWeightsError(
                f"{file}: checksum mismatch (file SHA-256 {actual}, marker says {sha})",
                field="path",
            )
        tensors.update(load_file(str(Path(path) / file)))
    for spec in specs:
        got = tensors.get(spec.name)
        if got is None or tuple(got.shape) != spec.shape or dtype_name(got.dtype) != spec.dtype:
            raise WeightMismatchError(f"{spec.name}: file and marker disagree", field="path")
    return tensors, manifest.total_bytes


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
