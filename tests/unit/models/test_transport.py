"""Which weight transports a process accepts, and how the trainer's side of each is configured."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from aflowrl.config import RunSpec
from aflowrl.models import transport
from aflowrl.trainer import clients, weight_sync

MIB = 1024 * 1024


async def test_nccl_runs_where_learner_and_rollout_share_a_kind_of_device():
    spec = RunSpec.model_validate({"weightTransport": {"type": "nccl", "bucketMib": 8}})
    transport.check_weight_transport(spec)  # both on CPU: gloo
    with pytest.raises(ValidationError, match="same kind of device"):
        RunSpec.model_validate(
            {"weightTransport": {"type": "nccl"}, "rollout": {"resources": {"gpus": 1}}}
        )
    sync = weight_sync.make_weight_sync(
        spec, "dns:///run-learner-0.run-learner.ns.svc:50053", ["10.0.0.1:50052"]
    )
    assert isinstance(sync, weight_sync.NcclWeightSync)
    assert sync.master == "run-learner-0.run-learner.ns.svc" and sync.port == 29600
    assert sync.bucket_bytes == 8 * MIB and sync.dtype == "float32"
    await sync.close()
    assert weight_sync.learner_host("127.0.0.1:5") == "127.0.0.1"
    assert weight_sync.learner_host("[::1]:5") == "::1"


def test_serve_with_an_impossible_transport_exits_with_the_field(tmp_path):
    file = tmp_path / "spec.yaml"
    file.write_text(
        "weightTransport: {type: nccl}\n"
        "rollout: {engine: vllm, resources: {gpus: 1}, vllm: {maxModelLen: 4096}}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "aflowrl", "serve", "rollout", "-f", str(file), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "same kind of device" in result.stderr and "learner.resources.gpus" in result.stderr


def test_grpc_and_filesystem_need_nothing_special():
    transport.check_weight_transport(RunSpec())
    assert weight_sync.wire_dtype(RunSpec()) == "float32"
    gpu = RunSpec.model_validate({"rollout": {"resources": {"gpus": 1}}})
    assert weight_sync.wire_dtype(gpu) == "bfloat16"
    assert clients.replica_targets("ipv4:10.0.0.1:5,10.0.0.2:5") == ["10.0.0.1:5", "10.0.0.2:5"]
    assert clients.replica_targets("dns:///localhost:50052") == ["127.0.0.1:50052"]
