"""Weight manifests, chunked payloads and safetensors directories: what is accepted and refused."""

from __future__ import annotations

import itertools
import platform
import zlib

import pytest
import torch

from aflowrl._proto.v1 import common_pb2
from aflowrl.models import weights, wire
from aflowrl.models.errors import (
    CorruptWeightsError,
    PartialWeightsError,
    StaleWeightsError,
    WeightMismatchError,
)


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(3, 5, generator=generator),
        "b.bias": torch.randn(7, generator=generator).to(torch.bfloat16),
        "c.weight": torch.randn(2, 2, 2, generator=generator).to(torch.float16),
    }


SHAPES = {"a.weight": (3, 5), "b.bias": (7,), "c.weight": (2, 2, 2)}


def test_round_trip_through_chunks_and_protos():
    tensors = _tensors()
    manifest = weights.build_manifest(4, tensors)
    assert manifest.total_bytes == 3 * 5 * 4 + 7 * 2 + 8 * 2
    messages = list(wire.weight_stream(manifest, tensors, chunk_bytes=7))
    received = wire.manifest_from_proto(messages[0].manifest)
    assert received == manifest
    weights.check_manifest(received, SHAPES, serving_version=3)
    assembler = weights.PayloadAssembler(received)
    for message in messages[1:-1]:
        assembler.add(message.data.offset, message.data.data)
        assert len(message.data.data) <= 7
    commit = messages[-1].commit
    out = assembler.finish(commit.version, commit.crc32)
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_the_payload_checksum_is_zlibs_crc32_whatever_computes_it():
    """``weights.crc32`` (ISA-L where installed) gives zlib's CRC-32 (the oracle): whole or fed
    in pieces of odd sizes, from bytes, bytearrays and views, empty or large."""
    generator = torch.Generator().manual_seed(3)
    size = 5 * 1024 * 1024 + 7
    payload = bytes(torch.randint(0, 256, (size,), generator=generator, dtype=torch.uint8))
    assert weights.crc32(b"") == zlib.crc32(b"") == 0
    assert weights.crc32(payload) == zlib.crc32(payload)
    assert weights.crc32(bytearray(payload[:1001]), 12345) == zlib.crc32(payload[:1001], 12345)
    value, view, start = 0, memoryview(payload), 0
    for step in itertools.cycle((1, 65_537, 3, 999_983)):
        if start >= size:
            break
        value = weights.crc32(view[start : start + step], value)
        start += step
    assert value == zlib.crc32(payload)
    checksum = weights.PayloadChecksum()
    for start in range(0, size, 999_983):
        checksum.update(view[start : start + 999_983])
    assert checksum.value == zlib.crc32(payload)


def test_the_fast_checksum_is_the_one_in_use():
    """isal is a dependency of the learner and rollout extras: a missing or broken install falls
    back to zlib silently (same values, five times slower), so the suite checks it is in use."""
    assert weights._crc32.__module__ == "isal.isal_zlib"


def test_the_payload_is_staged_and_hashed_off_the_caller_in_order():
    """Chunks are copied and hashed on a worker thread, at most ``backlog`` behind the caller;
    the sender hashes its messages on a thread of its own too. Both give the payload's CRC-32."""
    tensors = {f"t{i}": torch.arange(1000 * (i + 1), dtype=torch.float32) for i in range(6)}
    manifest = weights.build_manifest(2, tensors)
    payload = b"".join(bytes(weights.tensor_bytes(t)) for t in tensors.values())
    messages = list(wire.encoded_weight_stream(manifest, tensors.values(), chunk_bytes=3000))
    commit = common_pb2.WeightChunk.FromString(messages[-1]).commit
    assert commit.crc32 == zlib.crc32(payload)
    assembler = weights.PayloadAssembler(manifest, backlog=1)
    try:
        for raw in messages[1:-1]:
            chunk = wire.decode_chunk(raw)
            assert isinstance(chunk, wire.DataChunk)
            half = len(chunk.data) // 2  # in two parts, as several tensors' bytes may come
            assembler.add(chunk.offset, [chunk.data[:half], chunk.data[half:]])
        out = assembler.finish(commit.version, commit.crc32)
    finally:
        assembler.close()
    for name, tensor in tensors.items():
        assert torch.equal(out[name], tensor)

    checksum = weights.BackgroundChecksum(backlog=2)
    for start in range(0, len(payload), 1000):
        checksum.update(payload[start : start + 1000])
    assert checksum.value() == zlib.crc32(payload)
    checksum.close()
    checksum.close()  # idempotent


def test_malloc_is_tuned_for_pushes_unless_the_user_tuned_it(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert not wire.keep_message_memory()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=1048576")
    assert not wire.keep_message_memory()
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert wire.keep_message_memory() == (platform.libc_ver()[0] == "glibc")


def test_data_chunks_are_encoded_exactly_as_protobuf_encodes_them():
    for offset, size in ((0, 0), (0, 5), (1, 127), (300, 128), (2**40 + 3, 70_000)):
        data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        expected = common_pb2.WeightChunk(
            data=common_pb2.WeightData(offset=offset, data=data)
        ).SerializeToString()
        assert wire.encode_data_chunk(offset, memoryview(data)) == expected
        parsed = common_pb2.WeightChunk.FromString(wire.encode_data_chunk(offset, data))
        assert parsed.data.offset == offset and parsed.data.data == data


def test_decoded_chunks_equal_what_protobuf_reads():
    cases = [
        common_pb2.WeightChunk(data=common_pb2.WeightData(offset=9, data=b"abc" * 1000)),
        common_pb2.WeightChunk(data=common_pb2.WeightData(offset=0, data=b"")),
        common_pb2.WeightChunk(commit=common_pb2.WeightCommit(version=3, crc32=0xDEADBEEF)),
        common_pb2.WeightChunk(manifest=common_pb2.WeightManifest(version=2, total_bytes=5)),
    ]
    for message in cases:
        decoded = wire.decode_chunk(message.SerializeToString())
        if isinstance(decoded, wire.DataChunk):
            assert decoded.offset == message.data.offset
            assert bytes(decoded.data) == message.data.data
        else:
            assert decoded == message
    # Fields in another order and an unknown field (what another sender may write): as protobuf.
    data = b"\x12\x03xyz" + b"\x08\x07" + b"\x18\x05"
    raw = b"\x12" + bytes([len(data)]) + data
    parsed = common_pb2.WeightChunk.FromString(raw)
    decoded = wire.decode_chunk(raw)
    assert isinstance(decoded, wire.DataChunk)
    assert (decoded.offset, bytes(decoded.data)) == (parsed.data.offset, parsed.data.data)
    for garbage in (b"\x12\x05ab", b"\x12\xff", b"\xff\xff\xff", b"\x12\x02\x12\x09"):
        assert isinstance(wire.decode_chunk(garbage), wire.MalformedChunk), garbage


def test_buckets_hold_whole_tensors_up_to_the_size_and_both_sides_cut_alike():
    sizes = [10, 30, 5, 100, 1, 1, 60, 0, 40]  # float32: 4 bytes each
    specs = [weights.TensorSpec(f"t{i}", "float32", (n,)) for i, n in enumerate(sizes)]
    plan = weights.plan_buckets(specs, bucket_bytes=160)
    assert [list(r) for r in plan] == [[0, 1], [2], [3], [4, 5], [6], [7, 8]]
    assert all(sum(specs[i].nbytes for i in r) <= 160 for r in plan if len(r) > 1)
    stream = [(s.name, torch.zeros(s.shape)) for s in specs]
    cut = [[n for n, _ in b] for b in weights.iter_buckets(iter(stream), 160)]
    assert cut == [[specs[i].name for i in r] for r in plan]
    assert [list(r) for r in weights.plan_buckets(specs, bucket_bytes=1)] == [
        [i] for i in range(len(specs))
    ]
    # Large tensors alone (a broadcast sends them unpacked), small ones still packed.
    solo = weights.plan_buckets(specs, bucket_bytes=160, solo_bytes=100)
    assert [list(r) for r in solo] == [[0], [1], [2], [3], [4, 5], [6], [7], [8]]
    packed = torch.cat([t.view(-1).view(torch.uint8) for _, t in stream[:3]])
    views = weights.unpack_bucket(specs[:3], packed)
    assert [n for n, _ in views] == ["t0", "t1", "t2"] and views[1][1].shape == (30,)


def test_refusals():
    tensors = _tensors()
    manifest = weights.build_manifest(4, tensors)
    with pytest.raises(StaleWeightsError, match="not newer"):
        weights.check_manifest(manifest, SHAPES, serving_version=4)
    with pytest.raises(WeightMismatchError, match=r"missing \['d'\]"):
        weights.check_manifest(manifest, {**SHAPES, "d": (1,)}, serving_version=0)
    with pytest.raises(WeightMismatchError, match=r"tensors\[0\] \(a.weight\).*shape"):
        weights.check_manifest(manifest, {**SHAPES, "a.weight": (5, 3)}, serving_version=0)
    payload = b"".join(bytes(weights.tensor_bytes(t)) for t in tensors.values())

    assembler = weights.PayloadAssembler(manifest)
    with pytest.raises(WeightMismatchError, match="in order"):
        assembler.add(8, payload[8:16])
    assembler.add(0, payload[:10])
    with pytest.raises(PartialWeightsError, match="10 of"):
        assembler.finish(4, 0)
    with pytest.raises(WeightMismatchError, match="past the announced"):
        assembler.add(10, payload[10:] + b"x")

    crc = zlib.crc32(payload)
    corrupt = weights.PayloadAssembler(manifest)
    corrupt.add(0, payload[:-1] + bytes([payload[-1] ^ 1]))
    with pytest.raises(CorruptWeightsError, match="checksum"):
        corrupt.finish(4, crc)
    good = weights.PayloadAssembler(manifest)
    good.add(0, payload)
    with pytest.raises(WeightMismatchError, match=r"commit\.version"):
        good.finish(5, crc)
    with pytest.raises(CorruptWeightsError, match="commit says"):
        good.finish(4, crc ^ 1)

    bad_size = wire.manifest_to_proto(manifest)
    bad_size.tensors[1].nbytes += 2
    with pytest.raises(WeightMismatchError, match=r"tensors\[1\].nbytes"):
        wire.manifest_from_proto(bad_size)


def test_weights_directory_marker_versions_and_pruning(tmp_path):
    tensors = _tensors()
    for version in (1, 2, 3):
        weights.write_weights_dir(weights.version_dir(tmp_path, version), tensors, version=version)
    (weights.version_dir(tmp_path, 4)).mkdir()  # being written: no marker yet
    assert weights.latest_weights_dir(tmp_path) == (weights.version_dir(tmp_path, 3), 3)
    loaded, nbytes = weights.read_weights_dir(
        weights.version_dir(tmp_path, 3), SHAPES, version=3, serving_version=2
    )
    assert nbytes == 90 and all(torch.equal(loaded[n], t) for n, t in tensors.items())
    with pytest.raises(PartialWeightsError):
        weights.read_weights_dir(
            weights.version_dir(tmp_path, 4), SHAPES, version=4, serving_version=0
        )
    with pytest.raises(WeightMismatchError, match="holds version 3"):
        weights.read_weights_dir(
            weights.version_dir(tmp_path, 3), SHAPES, version=9, serving_version=0
        )
    deleted = weights.prune_versions(tmp_path, keep=2)
    assert [p.name for p in deleted] == ["v00000001", "v00000002"]


def test_a_streamed_directory_is_written_in_shards_and_read_back_one_tensor_at_a_time(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(weights, "_SHARD_BYTES", 64)  # several shards from a few tensors
    tensors = _tensors()
    produced: list[str] = []

    def lazily():
        for name, tensor in tensors.items():
            produced.append(name)
            yield name, tensor

    nbytes = weights.write_weights_dir(tmp_path / "v", lazily(), version=7)
    assert nbytes == 90 and produced == list(tensors)
    files = sorted(p.name for p in (tmp_path / "v").glob("*.safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert (tmp_path / "v" / "model.safetensors.index.json").is_file()
    source = weights.verify_weights_dir(tmp_path / "v", SHAPES, version=7, serving_version=0)
    stream = weights.iter_weights_dir(source)
    name, first = next(stream)
    assert name == "a.weight" and torch.equal(first, tensors["a.weight"])
    assert all(torch.equal(t, tensors[n]) for n, t in stream)


def test_the_staging_buffer_never_hands_out_the_weights_an_engine_serves_from():
    """After an engine adopts the staged tensors, the next update is staged in the buffer the
    engine served from before (none the first time), never in the one it serves from now."""
    staging = weights.StagingBuffer()
    first = staging.take(64)
    assert staging.take(64) is first  # reused while nobody adopts it
    staging.adopted()  # the engine serves from `first`
    second = staging.take(64)
    assert second is not first
    staging.adopted()  # now from `second`; `first` is free again
    assert staging.take(64) is first
    staging.adopted()
    assert staging.take(64) is second
    staging.adopted()  # serving from `second`, `first` is spare
    other = staging.take(32)  # another model size: a new buffer, the served one untouched
    assert len(other) == 32 and other is not second
    staging.release()
    assert staging.take(64) is not second


def test_the_spare_buffer_is_prepared_ahead_after_the_first_adoption():
    """After the first adoption there is no spare (the engine served from its own weights):
    ``prepare`` allocates it ahead of the next update (its pages mapped), and does nothing when
    a spare exists or nothing was adopted."""
    staging = weights.StagingBuffer()
    staging.prepare()  # nothing adopted: nothing to prepare
    first = staging.take(3 * 4096 + 5)
    staging.prepare()
    assert staging.take(3 * 4096 + 5) is first
    staging.adopted()
    staging.prepare()
    spare = staging.take(3 * 4096 + 5)
    assert spare is not first and spare.nbytes == first.nbytes
    staging.adopted()  # serving from `spare`, `first` is the spare now
    staging.prepare()
    assert staging.take(3 * 4096 + 5) is first


# ---- the finiteness checks (a sum first, the exact check only when the sum is not finite) --------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_all_finite_and_nonfinite_names_agree_with_isfinite_element_by_element(dtype):
    gen = torch.Generator().manual_seed(0)
    big = torch.finfo(dtype).max
    cases = {
        "plain": torch.randn(1000, generator=gen).to(dtype),
        # Finite elements whose sum overflows: the sum alone would call them non-finite.
        "overflowing_sum": torch.full((64,), big, dtype=dtype),
        "opposite_extremes": torch.tensor([big, -big, big, big], dtype=dtype),
        "nan": torch.tensor([1.0, float("nan"), 2.0]).to(dtype),
        "pos_inf": torch.tensor([1.0, float("inf")]).to(dtype),
        "neg_inf_last": torch.cat([torch.zeros(999), torch.tensor([float("-inf")])]).to(dtype),
        "inf_minus_inf": torch.tensor([float("inf"), float("-inf")]).to(dtype),
        "empty": torch.zeros(0, dtype=dtype),
    }
    for name, tensor in cases.items():
        oracle = bool(torch.isfinite(tensor.double()).all())
        assert weights.all_finite(tensor) is oracle, name
    bad = weights.nonfinite_names(cases.items())
    assert bad == [n for n, t in cases.items() if not bool(torch.isfinite(t.double()).all())]
    assert weights.all_finite(torch.arange(5))  # integer tensors hold no NaN
