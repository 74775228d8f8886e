"""The service bootstrap over real gRPC on loopback: health, SIGTERM, errors, metrics, clients."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from aflowrl._proto.v1 import rollout_pb2, rollout_pb2_grpc
from aflowrl.common.client import ChannelOptions, error_from_rpc, make_channel, wait_until_serving
from aflowrl.common.server import GrpcServer, ServerOptions
from aflowrl.errors import InvalidInputError, UnavailableError

sys.path.insert(0, str(Path(__file__).parent))
import fake_rollout_server

HERE = Path(__file__).parent
SERVICE = fake_rollout_server.SERVICE
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


def _start_server(*args: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_rollout_server.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"server did not start: {proc.stderr.read()}")
    return proc, json.loads(line)


async def _scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, by name and labels."""
    return {
        (sample.name, _key(sample.labels)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_health_sigterm_grace_errors_and_metrics():
    proc, ports = _start_server("--warmup-s", "1.0", "--grace-s", "5")
    try:
        channel = make_channel(f"127.0.0.1:{ports['port']}", ChannelOptions(max_attempts=1))
        health = health_pb2_grpc.HealthStub(channel)
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)

        # Warming up: NOT_SERVING, for the server and for the service.
        seen: list[int] = []
        watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE))

        async def record() -> None:
            async for reply in watch:
                seen.append(reply.status)

        watcher = asyncio.create_task(record())
        first = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert first.status == NOT_SERVING
        await wait_until_serving(channel, SERVICE, timeout_s=10)

        # Bad input -> INVALID_ARGUMENT naming the field; the request id comes back.
        call = stub.Generate(
            rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(temperature=-1)),
            metadata=(("x-request-id", "req-42"),),
        )
        with pytest.raises(aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.temperature" in info.value.details()
        assert ("x-request-id", "req-42") in tuple(info.value.trailing_metadata())
        assert isinstance(error_from_rpc(info.value, "Generate"), InvalidInputError)

        ok = await stub.Generate(
            rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(max_tokens=5))
        )
        assert ok.weight_version == 7

        samples = _samples(await _scrape(ports["metrics_port"]))
        generate = {"grpc_type": "unary", "grpc_service": SERVICE, "grpc_method": "Generate"}
        assert samples[("grpc_server_started_total", _key(generate))] == 2
        assert samples[("grpc_server_msg_received_total", _key(generate))] == 2
        assert samples[("grpc_server_msg_sent_total", _key(generate))] == 1  # the OK reply
        for code, count in (("OK", 1), ("INVALID_ARGUMENT", 1), ("INTERNAL", 0)):
            handled = _key({**generate, "grpc_code": code})
            assert samples[("grpc_server_handled_total", handled)] == count, code
        assert samples[("grpc_server_handling_seconds_count", _key(generate))] == 2
        assert samples[("process_resident_memory_bytes", ())] > 0

        # An in-flight call (1.5 s) survives SIGTERM; the health flips to NOT_SERVING at once.
        slow = asyncio.ensure_future(
            stub.Generate(
                rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(max_tokens=1500))
            )
        )
        # SIGTERM once the server is handling it (its third Generate has started).
        started = ("grpc_server_started_total", _key(generate))
        deadline = time.monotonic() + 120
        while _samples(await _scrape(ports["metrics_port"]))[started] < 3:
            assert time.monotonic() < deadline and not slow.done(), "the call never started"
            await asyncio.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        reply = await slow
        assert reply.weight_version == 7
        assert time.monotonic() - sent < 5  # finished within the grace
        for _ in range(50):
            if seen and seen[-1] == NOT_SERVING:
                break
            await asyncio.sleep(0.05)
        assert seen[:2] == [NOT_SERVING, SERVING] and seen[-1] == NOT_SERVING, seen

        # New calls are refused while stopping, then the process exits cleanly.
        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Generate(rollout_pb2.GenerateRequest(), timeout=2)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert proc.wait(timeout=10) == 0
        watcher.cancel()
        await channel.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


async def test_client_retries_idempotent_calls_only():
    servicer = fake_rollout_server.FakeRollout(flaky=2)
    options = ServerOptions(component="rollout", host="127.0.0.1", port=0)
    async with GrpcServer(options, [fake_rollout_server.registration(servicer)]) as server:
        channel = make_channel(
            f"127.0.0.1:{server.port}", ChannelOptions(initial_backoff_s=0.01, max_backoff_s=0.05)
        )
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        status = await stub.Status(rollout_pb2.RolloutStatusRequest())  # idempotent: retried
        assert status.backend == "fake" and servicer.status_calls == 3
        with pytest.raises(aio.AioRpcError) as info:  # not idempotent: one attempt
            await stub.LoadWeights(rollout_pb2.LoadWeightsRequest(path="/x", version=1))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert isinstance(error_from_rpc(info.value, "LoadWeights"), UnavailableError)
        await channel.close()


async def test_auth_token_is_required_except_for_health():
    servicer = fake_rollout_server.FakeRollout()
    options = ServerOptions(component="rollout", host="127.0.0.1", port=0, auth_token="s3cret")
    async with GrpcServer(options, [fake_rollout_server.registration(servicer)]) as server:
        target = f"127.0.0.1:{server.port}"
        anonymous = make_channel(target, ChannelOptions(max_attempts=1))
        await wait_until_serving(anonymous, SERVICE, timeout_s=5)  # probes need no token
        with pytest.raises(aio.AioRpcError) as info:
            await rollout_pb2_grpc.RolloutServiceStub(anonymous).Status(
                rollout_pb2.RolloutStatusRequest()
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        trusted = make_channel(target, ChannelOptions(auth_token="s3cret"))
        reply = await rollout_pb2_grpc.RolloutServiceStub(trusted).Status(
            rollout_pb2.RolloutStatusRequest()
        )
        assert reply.weight_version == 7
        await anonymous.close()
        await trusted.close()


async def test_overload_is_resource_exhausted():
    servicer = fake_rollout_server.FakeRollout()
    options = ServerOptions(component="rollout", host="127.0.0.1", port=0, max_concurrent_rpcs=1)
    async with GrpcServer(options, [fake_rollout_server.registration(servicer)]) as server:
        channel = make_channel(f"127.0.0.1:{server.port}", ChannelOptions(max_attempts=1))
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        request = rollout_pb2.GenerateRequest(sampling=rollout_pb2.SamplingParams(max_tokens=300))
        results = await asyncio.gather(
            stub.Generate(request), stub.Generate(request), return_exceptions=True
        )
        codes = sorted(r.code().name if isinstance(r, aio.AioRpcError) else "OK" for r in results)
        assert codes == ["OK", "RESOURCE_EXHAUSTED"]
        await channel.close()


async def test_reflection_lists_the_services():
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    options = ServerOptions(component="rollout", host="127.0.0.1", port=0)
    async with GrpcServer(
        options, [fake_rollout_server.registration(fake_rollout_server.FakeRollout())]
    ) as server:
        channel = make_channel(f"127.0.0.1:{server.port}")
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def requests():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = set()
        async for reply in stub.ServerReflectionInfo(requests()):
            names |= {s.name for s in reply.list_services_response.service}
        assert {SERVICE, "grpc.health.v1.Health"} <= names
        await channel.close()
