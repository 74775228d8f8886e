"""gRPC TLS over loopback with real certificates: who gets in, who is refused, and why.

A CA, a server certificate (SANs localhost and 127.0.0.1) and a client certificate are made with
``cryptography`` (tests/certificates.py). The server is the project's ``GrpcServer`` around a fake
RolloutService; clients are the project's ``make_channel`` and the trainer's clients.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from aflowrl._proto.v1 import rollout_pb2, rollout_pb2_grpc
from aflowrl.common import tls
from aflowrl.common.client import ChannelOptions, make_channel, wait_until_serving
from aflowrl.common.server import GrpcServer, ServerOptions
from aflowrl.config import RunSpec
from aflowrl.errors import DeadlineExceededError, InvalidInputError, PermanentError
from aflowrl.trainer.clients import RolloutClient

sys.path.insert(0, str(Path(__file__).parent))
import fake_rollout_server

from certificates import SERVER_NAME, Pki, make_pki

SERVICE = fake_rollout_server.SERVICE


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server(directory: Path, *, mtls: bool) -> GrpcServer:
    options = ServerOptions(
        component="rollout",
        host="127.0.0.1",
        tls=tls.load_server_tls(str(directory), mtls=mtls),
        health_port=0,
    )
    return GrpcServer(
        options, [fake_rollout_server.registration(fake_rollout_server.FakeRollout())]
    )


async def _status(target: str, options: ChannelOptions, **kwargs) -> str:
    """The weight version a Status call returns, or the error's status and details."""
    channel = make_channel(target, options, **kwargs)
    try:
        reply = await rollout_pb2_grpc.RolloutServiceStub(channel).Status(
            rollout_pb2.RolloutStatusRequest(), timeout=10
        )
        return f"OK {reply.weight_version}"
    except aio.AioRpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        await channel.close()


def _client(
    ca_dir: Path, *, mtls: bool = False, client_dir: Path | None = None, **kw
) -> ChannelOptions:
    client = tls.load_client_tls(
        str(ca_dir), mtls=mtls, client_dir=str(client_dir) if client_dir else None, **kw
    )
    return ChannelOptions(max_attempts=1, tls=client)


async def test_a_client_with_the_ca_gets_in_and_a_ca_file_alone_does_not_demand_certificates(pki):
    # ca.crt sits beside the server's certificate (as in every cert-manager Secret), yet
    # without grpc.mtls the server asks clients for no certificate.
    async with _server(pki.server, mtls=False) as server:
        target = f"127.0.0.1:{server.port}"
        assert await _status(target, _client(pki.server)) == "OK 7"
        assert await _status(f"localhost:{server.port}", _client(pki.server)) == "OK 7"


async def test_a_plaintext_client_is_refused_and_told_why(pki):
    async with _server(pki.server, mtls=False) as server:
        target = f"127.0.0.1:{server.port}"
        assert (await _status(target, ChannelOptions(max_attempts=1))).startswith("UNAVAILABLE")
        channel = make_channel(target, ChannelOptions(max_attempts=1))
        with pytest.raises(DeadlineExceededError, match="set AFLOWRL_TLS_DIR here too"):
            await wait_until_serving(channel, timeout_s=1.5)
        await channel.close()


async def test_a_client_trusting_another_ca_is_refused_at_once(pki):
    async with _server(pki.server, mtls=False) as server:
        target = f"127.0.0.1:{server.port}"
        options = _client(pki.other_ca)
        assert "CERTIFICATE_VERIFY_FAILED" in await _status(target, options)
        channel = make_channel(target, options)
        # Not a server still starting: no waiting out the whole timeout.
        with pytest.raises(PermanentError, match="not signed by the CA this client trusts"):
            await wait_until_serving(channel, timeout_s=600, tls=options.tls)
        await channel.close()


async def test_a_tls_client_of_a_plaintext_server_is_told_so(pki):
    options = ServerOptions(component="rollout", host="127.0.0.1")
    registration = fake_rollout_server.registration(fake_rollout_server.FakeRollout())
    async with GrpcServer(options, [registration]) as server:
        client = _client(pki.server)
        channel = make_channel(f"127.0.0.1:{server.port}", client)
        with pytest.raises(PermanentError, match="the server plaintext"):
            await wait_until_serving(channel, timeout_s=600, tls=client.tls)
        await channel.close()


async def test_mutual_tls_refuses_a_client_without_a_certificate(pki):
    async with _server(pki.server, mtls=True) as server:
        target = f"127.0.0.1:{server.port}"
        assert (await _status(target, _client(pki.server))).startswith("UNAVAILABLE")
        no_cert = _client(pki.server)
        channel = make_channel(target, no_cert)
        with pytest.raises(DeadlineExceededError, match=r"set grpc\.mtls here too"):
            await wait_until_serving(channel, timeout_s=1.5, tls=no_cert.tls)
        await channel.close()
        # A certificate of another CA is refused too; the client's own certificate gets in.
        impostor = _client(pki.server, mtls=True, client_dir=pki.other_ca)
        assert (await _status(target, impostor)).startswith("UNAVAILABLE")
        assert await _status(target, _client(pki.server, mtls=True, client_dir=pki.client)) == (
            "OK 7"
        )


async def test_the_health_port_is_plaintext_and_serves_only_health(pki):
    async with _server(pki.server, mtls=True) as server:
        assert server.health_port not in (None, 0, server.port)
        channel = aio.insecure_channel(f"127.0.0.1:{server.health_port}")
        # What a kubelet grpc probe does: plaintext, no certificate, the empty service name.
        await wait_until_serving(channel, timeout_s=10)
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE)
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(aio.AioRpcError) as info:
            await rollout_pb2_grpc.RolloutServiceStub(channel).Status(
                rollout_pb2.RolloutStatusRequest()
            )
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED

        async def list_services():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        with pytest.raises(aio.AioRpcError) as info:
            async for _ in reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                list_services()
            ):
                pass
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # It follows the server's status: NOT_SERVING once shutdown begins.
        await server.health.enter_graceful_shutdown()
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        await channel.close()


async def test_a_plaintext_server_opens_no_health_port():
    options = ServerOptions(component="rollout", host="127.0.0.1", health_port=0)
    registration = fake_rollout_server.registration(fake_rollout_server.FakeRollout())
    async with GrpcServer(options, [registration]) as server:
        assert server._health_server is None


async def test_the_server_name_verified_is_the_service_name_or_the_override(pki):
    # The certificate names only SERVER_NAME (no IP): what a cluster's Secret holds, while
    # the trainer dials pod IPs.
    async with _server(pki.named, mtls=False) as server:
        target = f"127.0.0.1:{server.port}"
        refused = await _status(target, _client(pki.server))
        assert "Hostname Verification" in refused
        assert await _status(target, _client(pki.server), server_name=SERVER_NAME) == "OK 7"
        fixed = _client(pki.server, server_name=SERVER_NAME)  # grpc.tlsServerName
        assert await _status(target, fixed) == "OK 7"
        # The override wins over a Service name the address was resolved from.
        assert await _status(target, fixed, server_name="other.svc") == "OK 7"


async def test_trainer_clients_verify_replicas_against_the_name_they_resolved(pki, monkeypatch):
    # "localhost:PORT" plays a headless Service: the client resolves it to 127.0.0.1 and
    # dials the IP, verifying the certificate against "localhost".
    async with _server(pki.server, mtls=False) as server:
        monkeypatch.setenv("AFLOWRL_TLS_DIR", str(pki.server))
        spec = RunSpec.from_document({})
        options = ChannelOptions.from_spec(spec.grpc, timeout_s=10)
        assert options.tls is not None and options.tls.certificate_chain is None
        client = RolloutClient(f"dns:///localhost:{server.port}", options=options)
        assert client.addresses == [f"127.0.0.1:{server.port}"]
        assert client.server_name == "localhost"
        assert await client.versions() == {f"127.0.0.1:{server.port}": 7}
        await client.close()


def test_tls_settings_from_the_spec_and_the_environment(pki, monkeypatch, tmp_path):
    spec = RunSpec.from_document({"grpc": {"mtls": True, "tlsServerName": SERVER_NAME}})
    with pytest.raises(InvalidInputError, match="mutual TLS needs TLS") as info:
        tls.client_tls_from_spec(spec.grpc)
    assert info.value.field == "grpc.mtls"
    monkeypatch.setenv("AFLOWRL_TLS_DIR", str(pki.server))
    client = tls.client_tls_from_spec(spec.grpc)
    assert client is not None and client.server_name == SERVER_NAME
    assert client.certificate_chain == (pki.server / "tls.crt").read_bytes()
    monkeypatch.setenv("AFLOWRL_TLS_CLIENT_DIR", str(pki.client))
    client = tls.client_tls_from_spec(spec.grpc)
    assert client is not None and client.certificate_chain == (pki.client / "tls.crt").read_bytes()
    server = tls.server_tls_from_spec(spec.grpc)
    assert server is not None and server.mtls and server.client_ca == pki.ca
    plain = tls.server_tls_from_spec(RunSpec.from_document({}).grpc)
    assert plain is not None and not plain.mtls  # ca.crt present, no client certificates asked
    # Broken directories are named, file by file.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tls.crt").write_bytes((pki.server / "tls.crt").read_bytes())
    with pytest.raises(InvalidInputError, match=r"broken/tls.key is missing"):
        tls.load_server_tls(str(broken), mtls=False)
    (broken / "tls.key").write_text("not a key")
    with pytest.raises(InvalidInputError, match=r"broken/tls.key is not a PEM PRIVATE KEY"):
        tls.load_server_tls(str(broken), mtls=False)
    (broken / "tls.key").write_bytes((pki.server / "tls.key").read_bytes())
    with pytest.raises(InvalidInputError, match=r"broken/ca.crt is missing: servers verify"):
        tls.load_server_tls(str(broken), mtls=True)
    with pytest.raises(InvalidInputError, match="is not a directory") as info:
        tls.load_client_tls(str(tmp_path / "nowhere"), mtls=False)
    assert info.value.field == "AFLOWRL_TLS_DIR"


async def test_concurrent_tls_clients_share_one_server(pki):
    async with _server(pki.server, mtls=True) as server:
        options = _client(pki.server, mtls=True, client_dir=pki.client)
        target = f"127.0.0.1:{server.port}"
        replies = await asyncio.gather(*(_status(target, options) for _ in range(8)))
        assert replies == ["OK 7"] * 8


def _mount(secret: Path, files: Path, version: str) -> None:
    """Write ``files`` (tls.crt, tls.key, ca.crt) into ``secret`` as the kubelet updates a
    mounted Secret: a new timestamped directory, then an atomic rename of the ``..data``
    symlink onto it; the keys are symlinks through ``..data``."""
    target = secret / f"..{version}"
    target.mkdir(parents=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (target / name).write_bytes((files / name).read_bytes())
    staging = secret / "..data_tmp"
    staging.symlink_to(target.name)
    staging.rename(secret / "..data")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        if not (secret / name).is_symlink():
            (secret / name).symlink_to(f"..data/{name}")


async def test_a_rotated_secret_is_picked_up_by_new_connections_without_a_restart(tmp_path):
    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")  # two unrelated CAs
    secret = tmp_path / "secret"
    _mount(secret, old.server, "2026_11_27_01")
    trusts_old, trusts_new = _client(old.server), _client(new.server)
    # Server and client mount the same Secret, as a run's pods do.
    mounted = ChannelOptions(max_attempts=1, tls=tls.load_client_tls(str(secret), mtls=False))
    async with _server(secret, mtls=False) as server:
        target = f"127.0.0.1:{server.port}"
        assert (await _status(target, mounted)).startswith("OK ")
        assert (await _status(target, trusts_old)).startswith("OK ")
        assert "handshake failed" in await _status(target, trusts_new)

        _mount(secret, new.server, "2026_11_27_02")  # a new CA and certificate
        # The same server, the same client settings: new connections see the new certificate.
        assert (await _status(target, mounted)).startswith("OK ")
        assert (await _status(target, trusts_new)).startswith("OK ")
        assert "handshake failed" in await _status(target, trusts_old)

        # A rotation that leaves a broken certificate is not taken: the last good one stays.
        broken = tmp_path / "broken"
        broken.mkdir()
        for name in ("tls.key", "ca.crt"):
            (broken / name).write_bytes((new.server / name).read_bytes())
        (broken / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\ntruncated")
        _mount(secret, broken, "2026_11_27_03")
        assert (await _status(target, trusts_new)).startswith("OK ")


async def test_a_rotated_ca_changes_which_client_certificates_an_mtls_server_accepts(tmp_path):
    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")
    secret = tmp_path / "secret"
    _mount(secret, old.server, "2026_11_27_01")
    # Both clients trust the server's new certificate; one presents a certificate of the old CA.
    old_cert = _client(new.server, mtls=True, client_dir=old.client)
    new_cert = _client(new.server, mtls=True, client_dir=new.client)
    async with _server(secret, mtls=True) as server:
        target = f"127.0.0.1:{server.port}"
        assert (
            await _status(target, _client(old.server, mtls=True, client_dir=old.client))
        ).startswith("OK ")
        _mount(secret, new.server, "2026_11_27_02")
        assert (await _status(target, new_cert)).startswith("OK ")
        assert not (await _status(target, old_cert)).startswith("OK ")
