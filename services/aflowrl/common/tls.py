"""TLS of the gRPC links: certificate files loaded once, credentials for servers and clients.

TLS is on when ``AFLOWRL_TLS_DIR`` names a directory (the operator mounts ``grpc.tlsSecret``
there and sets it; set it yourself for a local run). The directory has a ``kubernetes.io/tls``
Secret's keys:

| file | a server | a client |
|---|---|---|
| ``tls.crt``, ``tls.key`` | its certificate and key | presented with ``grpc.mtls`` |
| ``ca.crt`` | verifies client certificates (mTLS) | verifies servers (absent: system roots) |

Mutual TLS is the RunSpec's ``grpc.mtls``, never a side effect of ``ca.crt`` existing
(cert-manager Secrets always carry one). A client presents ``tls.crt`` of
``AFLOWRL_TLS_CLIENT_DIR`` when set (a certificate of its own), else that of ``AFLOWRL_TLS_DIR``
(one certificate for both roles: issue it with both the server-auth and client-auth usages).

Clients verify the server's certificate against the name they dial, or against
``grpc.tlsServerName`` when set. The trainer dials the pod IPs behind a headless Service; for
those channels the name verified is the Service's DNS name (see
:func:`aflowrl.common.client.target_host`), so certificates need DNS names, never pod IPs.
Used by :mod:`aflowrl.common.server` and :mod:`aflowrl.common.client`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from aflowrl import envs
from aflowrl.config.monitoring import GrpcSpec
from aflowrl.errors import InvalidInputError

logger = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"


def _read_pem(directory: Path, name: str, kind: str, variable: str) -> bytes:
    path = directory / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidInputError(
            f"{path} is missing: the directory must hold tls.crt, tls.key and ca.crt (the keys "
            "of a kubernetes.io/tls Secret)",
            field=variable,
        ) from None
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror}", field=variable) from None
    # grpc reports a malformed PEM only at the first handshake, and obscurely: check the armour.
    if b"-----BEGIN " not in data or f"{kind}-----".encode() not in data:
        raise InvalidInputError(f"{path} is not a PEM {kind}", field=variable)
    return data


def _directory(path: str, variable: str) -> Path:
    directory = Path(path)
    if not directory.is_dir():
        raise InvalidInputError(f"{path} is not a directory", field=variable)
    return directory


@dataclass(frozen=True)
class ServerTls:
    """What a server presents, and the CA its clients' certificates must chain to (mTLS)."""

    certificate_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = field(default=None, repr=False)
    """With mutual TLS: the CA bundle verifying client certificates (which are then required)."""

    @property
    def mtls(self) -> bool:
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True)
class ClientTls:
    """How a client verifies servers (and, with mTLS, proves who it is)."""

    root_certificates: bytes | None = field(default=None, repr=False)
    """CA bundle verifying server certificates; None: the system's trusted roots."""
    certificate_chain: bytes | None = field(default=None, repr=False)
    """Client certificate (mutual TLS); None: the client presents none."""
    private_key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None
    """Name verified on server certificates; None: the host of the dialled target."""

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def for_server(self, name: str | None) -> ClientTls:
        """This configuration verifying ``name`` unless a server name is already fixed."""
        if self.server_name is not None or name is None:
            return self
        return replace(self, server_name=name)


def load_server_tls(tls_dir: str, *, mtls: bool) -> ServerTls:
    """A server's TLS from ``tls_dir`` (module docstring); errors name the file."""
    directory = _directory(tls_dir, "AFLOWRL_TLS_DIR")
    cert = _read_pem(directory, CERT_FILE, "CERTIFICATE", "AFLOWRL_TLS_DIR")
    key = _read_pem(directory, KEY_FILE, "PRIVATE KEY", "AFLOWRL_TLS_DIR")
    client_ca = None
    if mtls:
        if not (directory / CA_FILE).exists():
            raise InvalidInputError(
                f"grpc.mtls is on but {directory / CA_FILE} is missing: servers verify client "
                "certificates with it",
                field="AFLOWRL_TLS_DIR",
            )
        client_ca = _read_pem(directory, CA_FILE, "CERTIFICATE", "AFLOWRL_TLS_DIR")
    return ServerTls(cert, key, client_ca)


def load_client_tls(
    tls_dir: str, *, mtls: bool, client_dir: str | None = None, server_name: str | None = None
) -> ClientTls:
    """A client's TLS: the CA of ``tls_dir``; with ``mtls`` the certificate of ``client_dir``
    (default ``tls_dir``)."""
    directory = _directory(tls_dir, "AFLOWRL_TLS_DIR")
    roots = None
    if (directory / CA_FILE).exists():
        roots = _read_pem(directory, CA_FILE, "CERTIFICATE", "AFLOWRL_TLS_DIR")
    else:
        logger.info(
            "%s has no %s: servers are verified against the system's roots", directory, CA_FILE
        )
    if not mtls:
        return ClientTls(roots, server_name=server_name)
    variable = "AFLOWRL_TLS_CLIENT_DIR" if client_dir else "AFLOWRL_TLS_DIR"
    own = _directory(client_dir, variable) if client_dir else directory
    return ClientTls(
        roots,
        _read_pem(own, CERT_FILE, "CERTIFICATE", variable),
        _read_pem(own, KEY_FILE, "PRIVATE KEY", variable),
        server_name,
    )


def _check_mtls(grpc_spec: GrpcSpec, tls_dir: str | None) -> None:
    if grpc_spec.mtls and tls_dir is None:
        raise InvalidInputError(
            "mutual TLS needs TLS: set grpc.tlsSecret (in a cluster) or AFLOWRL_TLS_DIR to a "
            "directory with tls.crt, tls.key and ca.crt (a local run)",
            field="grpc.mtls",
        )


def server_tls_from_spec(grpc_spec: GrpcSpec) -> ServerTls | None:
    """This process's server TLS (``AFLOWRL_TLS_DIR`` and ``grpc.mtls``); None: plaintext."""
    tls_dir = envs.AFLOWRL_TLS_DIR
    _check_mtls(grpc_spec, tls_dir)
    if tls_dir is None:
        return None
    return load_server_tls(tls_dir, mtls=grpc_spec.mtls)


def client_tls_from_spec(grpc_spec: GrpcSpec) -> ClientTls | None:
    """This process's client TLS (``AFLOWRL_TLS_DIR``, ``AFLOWRL_TLS_CLIENT_DIR``,
    ``grpc.mtls``, ``grpc.tlsServerName``); None: plaintext."""
    tls_dir = envs.AFLOWRL_TLS_DIR
    _check_mtls(grpc_spec, tls_dir)
    if tls_dir is None:
        return None
    return load_client_tls(
        tls_dir,
        mtls=grpc_spec.mtls,
        client_dir=envs.AFLOWRL_TLS_CLIENT_DIR,
        server_name=grpc_spec.tls_server_name,
    )
