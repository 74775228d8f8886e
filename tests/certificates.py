"""Test certificates for gRPC TLS, made with ``cryptography``: a CA, server and client certificates.

:func:`make_pki` writes directories laid out as a ``kubernetes.io/tls`` Secret mounts
(``tls.crt``, ``tls.key``, ``ca.crt``): ``server/`` (SANs localhost, 127.0.0.1 and the names
given), ``client/`` (client-auth usage only, signed by the same CA), ``named/`` (a server
certificate for one DNS name only, for server-name tests) and ``other-ca/`` (a certificate from
an unrelated CA, for wrong-CA tests). Used by the TLS tests.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_Key = ec.EllipticCurvePrivateKey

SERVER_NAME = "aflowrl-grpc.test"


@dataclass(frozen=True)
class Pki:
    """Directories of one test PKI (module docstring)."""

    server: Path
    client: Path
    other_ca: Path
    named: Path
    """A server certificate with one DNS name (:data:`SERVER_NAME`), no IP and no localhost."""

    @property
    def ca(self) -> bytes:
        return (self.server / "ca.crt").read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: x509.Name, issuer: x509.Name, key: _Key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _ca(common_name: str) -> tuple[x509.Certificate, _Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(common_name), _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, _Key],
    common_name: str,
    *,
    dns: list[str],
    ips: list[str],
    usages: list[x509.ObjectIdentifier],
) -> tuple[x509.Certificate, _Key]:
    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _builder(_name(common_name), ca_cert.subject, key)
    builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(directory: Path, cert: x509.Certificate, key: _Key, ca: x509.Certificate) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(_pem_cert(cert))
    (directory / "tls.key").write_bytes(_pem_key(key))
    (directory / "ca.crt").write_bytes(_pem_cert(ca))
    return directory


def make_pki(root: Path, *, server_dns: tuple[str, ...] = ()) -> Pki:
    """A CA with a server and a client certificate, and an unrelated CA (module docstring)."""
    ca = _ca("aflow-rl test CA")
    server = _leaf(
        ca,
        "aflow-rl server",
        dns=["localhost", *server_dns],
        ips=["127.0.0.1"],
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
    )
    client = _leaf(ca, "aflow-rl trainer", dns=[], ips=[], usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
    other = _ca("unrelated CA")
    other_server = _leaf(
        other,
        "impostor",
        dns=["localhost"],
        ips=["127.0.0.1"],
        usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    named = _leaf(
        ca, SERVER_NAME, dns=[SERVER_NAME], ips=[], usages=[ExtendedKeyUsageOID.SERVER_AUTH]
    )
    return Pki(
        server=_write(root / "server", *server, ca[0]),
        client=_write(root / "client", *client, ca[0]),
        other_ca=_write(root / "other-ca", *other_server, other[0]),
        named=_write(root / "named", *named, ca[0]),
    )
