"""Weights reach vLLM's workers in pieces: no message grows with the model (issue 16, item 1).

vLLM 0.32's ``collective_rpc`` sends its arguments through msgspec's msgpack, which refuses any
byte string over 2**32 - 1 bytes; the old reload packed the whole model into one (a 7B bf16
policy is 15 GB). Here a model of 4.5 GiB (tensors produced lazily, views of one buffer, so the
test allocates little) is reloaded through :func:`reload_in_pieces` into an engine that records
what crosses the ``collective_rpc`` boundary: every call stays within one 64 MiB bucket, every
byte string within the bucket, the pieces decode (on the worker's side) to the tensors sent, the
reload is started once and finished once, and a tensor above the RPC part size travels in parts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aflowrl.models import weights
from aflowrl.models.errors import WeightLoadFailedError
from aflowrl.rollout import vllm_engine, vllm_model, vllm_worker

MIB = 1024 * 1024
GIB = 1024 * MIB
MSGPACK_LIMIT = 2**32 - 1


class RecordingEngine:
    """The ``LLMEngine`` surface the reload uses; records each call's payload."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.largest_message = 0
        self.largest_string = 0
        self.pieces: list[tuple[Any, Any]] = []
        self.prefix_cache_resets = 0
        self.names: set[str] = set()
        self.reset_succeeds = True
        self.reset_running_requests = False

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        # By name: the worker extension's method (vllm_worker.AflowrlWorkerExtension).
        assert callable(getattr(vllm_worker.AflowrlWorkerExtension, method))
        self.calls.append(method.removeprefix("aflowrl_"))
        strings = _byte_strings(args)
        self.largest_string = max([self.largest_string, *(len(b) for b in strings)])
        self.largest_message = max(self.largest_message, sum(len(b) for b in strings))
        if method == "aflowrl_load_piece":
            specs, parts, _tied = args
            if len(self.pieces) < 3:
                self.pieces.append((specs, parts))
            self.names.update(str(name) for name, _dtype, _shape in specs)
        if method == "aflowrl_finish_update":  # one rank that loaded every name it was sent
            return [vllm_model.loaded_report(self.names)]
        return [None]

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        # vLLM refuses (False) while a request holds KV blocks, unless told to preempt them.
        self.prefix_cache_resets += 1
        self.reset_running_requests = reset_running_requests
        return self.reset_succeeds


def _byte_strings(value: Any) -> list[bytes]:
    """Every byte string in an RPC's arguments (what msgpack would encode as bin)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return [value]
    if isinstance(value, list | tuple):
        return [b for item in value for b in _byte_strings(item)]
    return []


def test_a_model_larger_than_4_gib_is_reloaded_in_bucket_sized_messages():
    base = torch.arange(16 * MIB // 4, dtype=torch.float32)  # one 16 MiB buffer
    count = (4 * GIB + GIB // 2) // (16 * MIB)  # 4.5 GiB of weights in all
    produced = []

    def lazily():
        for i in range(count):
            produced.append(i)
            yield f"model.layers.{i}.mlp.weight", (base + i).view(1024, -1)

    engine = RecordingEngine()
    pieces = vllm_engine.reload_in_pieces(engine, lazily(), bucket_bytes=64 * MIB, tied=False)
    total = count * 16 * MIB
    assert total > MSGPACK_LIMIT and len(produced) == count
    assert pieces == total // (64 * MIB)
    assert engine.calls[0] == "start_update" and engine.calls[-1] == "finish_update"
    assert engine.calls.count("load_piece") == pieces and engine.prefix_cache_resets == 1
    assert engine.largest_message <= 64 * MIB < MSGPACK_LIMIT
    assert engine.largest_string <= 16 * MIB
    specs, parts = engine.pieces[1]
    for (name, dtype, shape), data in zip(specs, parts, strict=True):
        spec = weights.TensorSpec(name, dtype, tuple(shape))
        index = int(name.split(".")[2])
        assert torch.equal(vllm_worker._tensor(spec, data), (base + index).view(1024, -1))


def test_a_tensor_above_the_part_size_travels_in_parts(monkeypatch):
    monkeypatch.setattr(vllm_engine, "_MAX_PART", 3 * MIB)
    big = torch.randn(10 * MIB // 4)
    engine = RecordingEngine()
    vllm_engine.reload_in_pieces(engine, [("embed.weight", big)], bucket_bytes=4 * MIB, tied=True)
    (specs, parts), *_ = engine.pieces
    assert [len(p) for p in parts[0]] == [3 * MIB, 3 * MIB, 3 * MIB, MIB]
    spec = weights.TensorSpec(*specs[0][:2], tuple(specs[0][2]))
    assert torch.equal(vllm_worker._tensor(spec, parts[0]), big)


def test_a_failed_piece_still_finishes_the_reload():
    class Failing(RecordingEngine):
        def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
            result = super().collective_rpc(method, args)
            if method == "aflowrl_load_piece":
                raise RuntimeError("worker died")
            return result

    engine = Failing()
    tensors = [(f"t{i}", torch.zeros(MIB // 4)) for i in range(4)]
    with pytest.raises(WeightLoadFailedError, match="worker died") as info:
        vllm_engine.reload_in_pieces(engine, tensors, bucket_bytes=MIB, tied=False)
    assert not info.value.intact  # layers may be half-written: the replica must not serve
    assert engine.calls == ["start_update", "load_piece", "finish_update"]
    assert engine.prefix_cache_resets == 1  # cached KV of the old weights is dropped too


def test_a_restore_puts_back_each_layer_s_kernel_as_well_as_its_tensors():
    """keepWeightsOnLoad: vLLM's processing may hold a layer's weights outside its tensors (on a
    CPU, a linear layer's prepacked weight in its ``cpu_linear`` closure), and a reload replaces
    that kernel rather than writing into it: the restore puts the old kernel back with the
    tensors. A model whose tensors no longer match the kept ones is not restored."""
    layer = torch.nn.Linear(4, 4)
    served = layer.weight.detach().clone()
    layer.cpu_linear = lambda x: x @ served.T
    model = torch.nn.Sequential(layer)
    kept = vllm_model.keep_weights(model)
    assert kept.nbytes == 4 * (16 + 4)

    with torch.no_grad():  # a reload that failed midway: new values, a new kernel
        layer.weight.add_(1.0)
    reloaded = layer.weight.detach().clone()
    layer.cpu_linear = lambda x: x @ reloaded.T
    assert vllm_model.restore_weights(model, kept)
    x = torch.randn(2, 4)
    assert torch.equal(layer.weight, served) and torch.equal(layer.cpu_linear(x), x @ served.T)

    other = torch.nn.Sequential(torch.nn.Linear(4, 3))
    assert not vllm_model.restore_weights(other, vllm_model.keep_weights(model))


def test_a_rank_reports_the_decoder_layers_of_the_parameters_it_loaded():
    # What a second pipeline stage of a 4-layer model loads (vLLM's parameter names).
    stage = [
        "model.layers.2.self_attn.qkv_proj.weight",
        "model.layers.2.mlp.gate_up_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]
    assert vllm_model.loaded_report(stage) == {"parameters": 5, "layers": [2, 3]}
    assert vllm_model.loaded_report([]) == {"parameters": 0, "layers": []}


def test_a_restore_into_a_model_a_reload_left_on_the_meta_device_is_refused():
    """vLLM's layer-wise reload moves a layer's tensors to the meta device until its weights
    arrive; after a finalize that raised midway some stay there, and ``copy_`` into a meta tensor
    writes nothing. The restore says False (the replica must not serve), rather than "put back"
    on a broken model; the same model with storage again is restored and verified."""
    layer = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(layer)
    served = layer.weight.detach().clone()
    kept = vllm_model.keep_weights(model)
    storage = layer.weight
    layer.weight = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    assert vllm_model.meta_tensors(model) == ["0.weight"]
    assert not vllm_model.restore_weights(model, kept)
    layer.weight = storage
    with torch.no_grad():
        layer.weight.add_(1.0)
    assert vllm_model.meta_tensors(model) == []
    assert vllm_model.restore_weights(model, kept)
    assert torch.equal(layer.weight, served)


def test_the_kept_copy_is_made_once_per_served_version_into_the_same_buffers():
    """keepWeightsOnLoad: a second update of the same served weights (the first was refused or
    put back) copies nothing; once an update changed them, the copy is made again into the same
    host buffers (no new allocation)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    kept = vllm_model.keep_weights(model)
    buffers = {n: t.data_ptr() for n, t in kept.tensors.items()}
    with torch.no_grad():
        model[0].weight.add_(1.0)  # changed behind the copy's back: a current copy is reused
    assert vllm_model.keep_weights(model, kept) is kept
    assert not torch.equal(kept.tensors["0.weight"], model[0].weight)

    kept.current = False  # an update started changing the served weights, and completed
    again = vllm_model.keep_weights(model, kept)
    assert {n: t.data_ptr() for n, t in again.tensors.items()} == buffers
    assert torch.equal(again.tensors["0.weight"], model[0].weight.detach())
    assert again.current


def test_a_prefix_cache_vllm_did_not_reset_fails_the_update():
    """vLLM's ``reset_prefix_cache`` returns False when it could not drop the cached KV blocks:
    the reload asks it to preempt running requests first, and a False is a failed update (the
    new weights are in, but blocks computed with the old ones could serve), never ignored."""
    engine = RecordingEngine()
    tensors = [(f"w{i}", torch.full((256,), float(i))) for i in range(4)]
    vllm_engine.reload_in_pieces(engine, iter(tensors), bucket_bytes=MIB, tied=False)
    assert engine.reset_running_requests

    engine = RecordingEngine()
    engine.reset_succeeds = False
    with pytest.raises(WeightLoadFailedError, match="prefix cache") as info:
        vllm_engine.reload_in_pieces(engine, iter(tensors), bucket_bytes=MIB, tied=False)
    assert not info.value.intact


def test_every_host_of_a_replica_gets_the_adapter_config_and_weights_and_drops_old_ones(
    tmp_path,
):
    """LoRA on a replica spanning nodes: vLLM's ``add_lora`` reads ``adapter_config.json`` and
    the weights on every worker, so the first worker of each host (local rank 0) writes both
    there, and no other worker writes; older versions' directories beside it are removed, except
    the newest one (it serves until the swap). Two hosts are two directories here."""
    from safetensors.torch import load_file

    from aflowrl.models.weights import ADAPTER_CONFIG

    class Worker:
        def __init__(self, local_rank: int) -> None:
            self.local_rank = local_rank

    adapters = {"base_model.model.q.lora_A.weight": torch.randn(2, 8)}
    specs, parts = vllm_engine._rpc_piece(list(adapters.items()))
    config = '{"r": 2, "peft_type": "LORA"}'
    for host in ("leader-host", "worker-host"):
        for old in ("a000001", "a000002"):
            (tmp_path / host / old).mkdir(parents=True)
    for host in ("leader-host", "worker-host"):
        path = str(tmp_path / host / "a000003")
        assert not vllm_worker.write_adapter_files(Worker(1), path, config, specs, parts)
        assert vllm_worker.write_adapter_files(Worker(0), path, config, specs, parts)
    for host in ("leader-host", "worker-host"):
        written = tmp_path / host / "a000003"
        assert (written / ADAPTER_CONFIG).read_text() == config
        loaded = load_file(str(written / vllm_model.ADAPTER_WEIGHTS))
        assert torch.equal(
            loaded["base_model.model.q.lora_A.weight"], next(iter(adapters.values()))
        )
        assert sorted(p.name for p in (tmp_path / host).iterdir()) == ["a000002", "a000003"]
