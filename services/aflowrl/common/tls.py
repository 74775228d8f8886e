"""TLS of the gRPC links: certificate files, reloaded when they change; credentials for servers
and clients.

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

A rotated certificate is picked up without a restart. The kubelet updates a mounted Secret by
swapping a symlink (``..data``) to a new directory, so the files change all at once. A server
checks its directory at every new connection's handshake (:class:`CertificateReloader`, behind
``grpc.dynamic_ssl_server_credentials``) and presents the new certificate, and with mTLS trusts
the new ``ca.crt``, from then on; connections already open keep theirs. A set of files that does
not read back whole and the same twice running (a rotation under way, a malformed PEM) is not
taken: the last good one stays. A client reads the files again for each new channel
(:meth:`ClientTls.current`); a channel already open keeps the CA it was made with, so a rotation
that changes the CA should put both CAs in ``ca.crt`` until every server has the new
certificate (as trust-manager bundles do).

Used by :mod:`aflowrl.common.server` and :mod:`aflowrl.common.client`.
"""

from __future__ import annotations

import logging
import threading
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
    directory: str | None = None
    """Where the files were read: reloaded from there when they change; None: fixed."""

    @property
    def mtls(self) -> bool:
        return self.client_ca is not None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.private_key, self.certificate_chain)], root_certificates=self.client_ca
        )

    def credentials(self) -> grpc.ServerCredentials:
        if self.directory is None:
            return grpc.ssl_server_credentials(
                [(self.private_key, self.certificate_chain)],
                root_certificates=self.client_ca,
                require_client_auth=self.client_ca is not None,
            )
        return grpc.dynamic_ssl_server_credentials(
            self.configuration(),
            # grpc's stub leaves out the None a fetcher returns to keep the current one.
            CertificateReloader(self),  # type: ignore[arg-type]
            require_client_authentication=self.mtls,
        )


class CertificateReloader:
    """grpc's certificate-configuration fetcher: called at each new handshake (from grpc's own
    threads), returns a new configuration when the files of the directory changed, else None
    (grpc keeps the one it has)."""

    def __init__(self, loaded: ServerTls) -> None:
        assert loaded.directory is not None
        self._directory = loaded.directory
        self._mtls = loaded.mtls
        self._current = replace(loaded, directory=None)  # compared with files read afresh
        self._lock = threading.Lock()
        self.reloads = 0
        """Certificates taken since the start (for tests and logs)."""

    def _read(self) -> ServerTls | None:
        try:
            first = load_server_tls(self._directory, mtls=self._mtls, reload=False)
            second = load_server_tls(self._directory, mtls=self._mtls, reload=False)
        except InvalidInputError as exc:
            logger.warning("keeping the current TLS certificate: %s", exc)
            return None
        return first if first == second else None  # changing under us: next handshake

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            found = self._read()
            if found is None or found == self._current:
                return None
            self._current = found
            self.reloads += 1
        logger.info("TLS certificate of %s changed: presenting the new one", self._directory)
        return found.configuration()


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
    directory: str | None = None
    """``AFLOWRL_TLS_DIR`` the files were read from (None: fixed); see :meth:`current`."""
    client_dir: str | None = None
    """``AFLOWRL_TLS_CLIENT_DIR`` the client certificate was read from, if not ``directory``."""

    def current(self) -> ClientTls:
        """These settings with the files as they are now (a rotated Secret); unchanged when
        they were not read from a directory or cannot be read whole now."""
        if self.directory is None:
            return self
        try:
            return load_client_tls(
                self.directory,
                mtls=self.certificate_chain is not None,
                client_dir=self.client_dir,
                server_name=self.server_name,
            )
        except InvalidInputError as exc:
            logger.warning("keeping the current TLS files: %s", exc)
            return self

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


def load_server_tls(tls_dir: str, *, mtls: bool, reload: bool = True) -> ServerTls:
    """A server's TLS from ``tls_dir`` (module docstring); errors name the file. With
    ``reload`` its credentials take a rotated certificate at the next handshake."""
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
    return ServerTls(cert, key, client_ca, directory=tls_dir if reload else None)


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
        return ClientTls(roots, server_name=server_name, directory=tls_dir)
    variable = "AFLOWRL_TLS_CLIENT_DIR" if client_dir else "AFLOWRL_TLS_DIR"
    own = _directory(client_dir, variable) if client_dir else directory
    return ClientTls(
        roots,
        _read_pem(own, CERT_FILE, "CERTIFICATE", variable),
        _read_pem(own, KEY_FILE, "PRIVATE KEY", variable),
        server_name,
        directory=tls_dir,
        client_dir=client_dir,
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
