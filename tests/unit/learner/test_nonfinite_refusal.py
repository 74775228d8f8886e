"""A learner whose own weights hold NaN refuses to let them leave, on every transport.

One rank on the tiny model (a fresh spawned process: the one-rank process group belongs to it).
A NaN in one weight: the export writes nothing, a push never reaches its sink, and a broadcast
sends its weight group a header that says "refused" (the receiver raises NonFiniteWeightsError
before loading anything); each raises PolicyDivergedError (DATA_LOSS on the wire, a permanent
error the trainer stops on). Once the weights are finite again, the same group takes a whole
version: the refusal left it usable. A write after a passing check is seen by the next push.
"""

from __future__ import annotations

import socket
from typing import Any

from spawned_case import in_fresh_process

SPEC = """
policy: {{model: tiny, dtype: float32}}
learner:
  fsdp: {{mixedPrecision: none}}
weightTransport: {{type: nccl, port: {port}, fallbackPath: {path}}}
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _case(tmp: str, port: int) -> dict[str, Any]:
    import threading
    from pathlib import Path

    import torch

    from aflowrl.config import RunSpec
    from aflowrl.learner.distributed import init_distributed
    from aflowrl.learner.errors import PolicyDivergedError
    from aflowrl.learner.worker import Learner
    from aflowrl.models import broadcast

    torch.set_num_threads(1)
    spec = RunSpec.from_yaml(SPEC.format(port=port, path=f"{tmp}/weights"), source="test")
    learner = Learner(spec, init_distributed())
    out: dict[str, Any] = {}
    param = next(p for n, p in learner.policy.module.named_parameters() if "mlp" in n)
    kept = param.detach().clone()
    with torch.no_grad():
        param.view(-1)[3] = float("nan")

    try:
        learner.export(f"{tmp}/explicit", None)
    except PolicyDivergedError as exc:
        out["export"] = str(exc)
    out["export_files"] = sorted(p.name for p in Path(tmp).rglob("*") if p.is_file())

    class Sink:
        called = False

        def stream(self, manifest: Any, tensors: Any) -> None:
            Sink.called = True

    try:
        learner.stream_weights(None, Sink())
    except PolicyDivergedError as exc:
        out["push"] = str(exc)
    out["sink_called"] = Sink.called

    # A receiver (one replica's engine) in a thread of this process.
    events: list[str] = []
    received: list[Any] = []
    joined = threading.Event()
    go = threading.Semaphore(0)

    def replica() -> None:
        rendezvous = broadcast.Rendezvous("127.0.0.1", port, "g1", 1, 2, timeout_s=60)
        group = broadcast.WeightGroup.join(rendezvous, torch.device("cpu"))
        joined.set()
        try:
            for _ in range(2):
                go.acquire()
                try:
                    received.append(
                        broadcast.receive_weights(
                            group,
                            accept=lambda manifest: None,
                            start=lambda: events.append("start"),
                            load=lambda bucket: events.append("load"),
                            finish=lambda: events.append("finish"),
                        )
                    )
                except Exception as exc:
                    received.append(exc)
        finally:
            group.close()

    thread = threading.Thread(target=replica)
    thread.start()
    learner.open_weight_group("g1", 2, 60.0, "replica-a")
    joined.wait(60)
    go.release()
    try:
        learner.broadcast_weights(("g1",), 1 << 20, None)
    except PolicyDivergedError as exc:
        out["broadcast"] = str(exc)
    with torch.no_grad():
        param.copy_(kept)
    go.release()
    result = learner.broadcast_weights(("g1",), 1 << 20, None)
    thread.join(60)
    learner.close_weight_group(None)
    out["refused_as"] = type(received[0]).__name__ if received else None
    out["refusal"] = str(received[0]) if received else None
    out["after"] = type(received[1]).__name__ if len(received) > 1 else None
    out["broken"] = dict(result.broken)
    out["events"] = events

    # The check is made once per state of the weights: a write after a passing check (no
    # training step, no new version) is still seen by the next push.
    Sink.called = False
    learner.stream_weights(None, Sink())
    out["clean_push_sent"] = Sink.called
    Sink.called = False
    with torch.no_grad():
        param.view(-1)[5] = float("inf")
    try:
        learner.stream_weights(None, Sink())
    except PolicyDivergedError as exc:
        out["push_after_write"] = str(exc)
    out["sink_called_after_write"] = Sink.called
    return out


def test_a_learner_with_nan_weights_refuses_to_export_push_or_broadcast_them(tmp_path):
    out = in_fresh_process(_case, tmp=str(tmp_path), port=_port())
    for what in ("export", "push", "broadcast"):
        assert f"refusing to {what} them (PolicyDiverged)" in out[what], out
        assert "mlp" in out[what]  # the message names a tensor
    assert not [f for f in out["export_files"] if f.endswith(".safetensors")]
    assert out["sink_called"] is False
    assert out["refused_as"] == "NonFiniteWeightsError"
    assert "refused to send version" in out["refusal"]
    # Nothing loaded on the refusal; the next version came whole over the same group.
    assert out["after"] == "BroadcastResult"
    assert out["broken"] == {}
    assert out["events"][0] == "start" and out["events"][-1] == "finish"
    assert "load" in out["events"]
    assert out["clean_push_sent"] is True
    assert "refusing to push them (PolicyDiverged)" in out["push_after_write"], out
    assert out["sink_called_after_write"] is False


def test_a_diverged_policy_is_data_loss_on_the_wire_and_permanent_for_the_trainer():
    import grpc
    from grpc import aio

    from aflowrl.common.client import error_from_rpc
    from aflowrl.common.interceptors import status_for
    from aflowrl.errors import CorruptStateError
    from aflowrl.learner.errors import PolicyDivergedError

    assert status_for(PolicyDivergedError("nan")) == grpc.StatusCode.DATA_LOSS
    reply = aio.AioRpcError(grpc.StatusCode.DATA_LOSS, aio.Metadata(), aio.Metadata(), "nan")
    error = error_from_rpc(reply, "learner PushWeights")
    assert isinstance(error, CorruptStateError)
    assert not error.retryable
