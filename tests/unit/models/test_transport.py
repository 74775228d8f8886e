"""The nccl weight transport is designed in and fails clearly where it cannot run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError
from aflowrl.models import transport
from aflowrl.models.errors import TransportUnavailableError
from aflowrl.trainer import clients, weight_sync

NCCL_SPEC = {
    "weightTransport": {"type": "nccl"},
    "rollout": {"engine": "vllm", "resources": {"gpus": 1}, "vllm": {"maxModelLen": 4096}},
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path of a CPU machine")
async def test_nccl_is_refused_before_anything_loads():
    spec = RunSpec.model_validate(NCCL_SPEC)
    with pytest.raises(TransportUnavailableError, match="not available on this machine"):
        transport.check_weight_transport(spec)
    sync = weight_sync.make_weight_sync(spec, "127.0.0.1:1", ["127.0.0.1:2"])
    with pytest.raises(FailedPreconditionError, match="not implemented yet"):
        await sync.push()
    await sync.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error path of a CPU machine")
def test_serve_with_nccl_exits_with_the_reason(tmp_path):
    file = tmp_path / "spec.yaml"
    file.write_text(
        "weightTransport: {type: nccl}\n"
        "rollout: {engine: vllm, resources: {gpus: 1}, vllm: {maxModelLen: 4096}}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "aflowrl", "serve", "rollout", "--spec", str(file), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "not available on this machine" in result.stderr


def test_grpc_and_filesystem_need_nothing_special():
    transport.check_weight_transport(RunSpec())
    assert weight_sync.wire_dtype(RunSpec()) == "float32"
    gpu = RunSpec.model_validate({"rollout": {"resources": {"gpus": 1}}})
    assert weight_sync.wire_dtype(gpu) == "bfloat16"
    assert clients.replica_targets("ipv4:10.0.0.1:5,10.0.0.2:5") == ["10.0.0.1:5", "10.0.0.2:5"]
    assert clients.replica_targets("dns:///localhost:50052") == ["127.0.0.1:50052"]
