"""TLS for the parameter server: a per-fit self-signed certificate, pinned by the workers.

The driver creates a fresh key pair and a self-signed certificate for every fit
(:func:`self_signed`, with the ``cryptography`` package): an ECDSA P-256 key, valid from an hour
before now for two days, whose subject alternative name is :data:`SERVER_NAME`. The certificate
(public) and its SHA-256 fingerprint travel to the workers in the task closure; a worker trusts
that certificate and nothing else (it is its own root: no certificate authority, not the system's
trust store), checks the fingerprint, and verifies the server's name against :data:`SERVER_NAME`
whatever address it dials (``override_hostname``), so the certificate works behind NAT or a
container's port mapping. Nobody on the network sees the token or the weights; a client that does
not pin the certificate cannot complete the handshake. A user's own certificate and key (PEM) can
replace the generated pair (:func:`load_identity`); the workers then pin that certificate.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass

from sparkdl.errors import ConfigError

SERVER_NAME = "sparkdl-parameter-server"


@dataclass(frozen=True)
class TLSIdentity:
    """A server's certificate and key (PEM bytes) and what its clients pin.

    Attributes:
        cert_pem: the certificate (public; travels to the workers).
        key_pem: the private key (stays on the driver; never in a closure).
        server_name: the name clients verify (the certificate's subject alternative name).
    """

    cert_pem: bytes
    key_pem: bytes
    server_name: str = SERVER_NAME

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate's DER bytes, hex."""
        return fingerprint(self.cert_pem)

    def pin(self) -> TLSPin:
        """What a worker needs to trust this server and no other."""
        return TLSPin(self.cert_pem, self.fingerprint, self.server_name)


@dataclass(frozen=True)
class TLSPin:
    """A client's trust: the one certificate it accepts, its fingerprint and the server name."""

    cert_pem: bytes
    fingerprint: str
    server_name: str = SERVER_NAME

    def check(self) -> None:
        """Raise :class:`ConfigError` unless ``cert_pem`` hashes to ``fingerprint``."""
        got = fingerprint(self.cert_pem)
        if got != self.fingerprint:
            raise ConfigError(f"the parameter server's certificate must have the pinned fingerprint {self.fingerprint}. Received: {got}")


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of a PEM certificate's DER bytes, as hex.

    Raises:
        ConfigError: ``cert_pem`` is not a PEM certificate.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"a TLS certificate must be PEM. Received: {len(cert_pem)} bytes ({exc})") from exc
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def self_signed(server_name: str = SERVER_NAME, days: int = 2) -> TLSIdentity:
    """A fresh ECDSA P-256 key and a self-signed certificate for ``server_name`` (its subject and
    only subject alternative name), valid from an hour ago for ``days`` days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(server_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return TLSIdentity(cert.public_bytes(serialization.Encoding.PEM), key_pem, server_name)


def load_identity(cert_path: str, key_path: str) -> TLSIdentity:
    """A user's own certificate and key (PEM files); clients verify the certificate's first DNS
    subject alternative name (else its common name).

    Raises:
        ConfigError: a file cannot be read, or is not a PEM certificate or key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from cryptography.x509.oid import NameOID

    try:
        with open(cert_path, "rb") as f:
            cert_pem = f.read()
        with open(key_path, "rb") as f:
            key_pem = f.read()
    except OSError as exc:
        raise ConfigError(f"serverCertFile and serverKeyFile must be readable PEM files. Received: {exc}") from exc
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"serverCertFile and serverKeyFile must hold a PEM certificate and an unencrypted PEM key. Received: {exc}") from exc
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    server_name = names[0] if names else (common[0].value if common else SERVER_NAME)
    return TLSIdentity(cert_pem, key_pem, str(server_name))


def tls_identity(cert_file: str | None, key_file: str | None, tls: bool) -> TLSIdentity | None:
    """A fit's server certificate and key: the user's own (``serverCertFile``, ``serverKeyFile``), a
    fresh self-signed pair (``serverTls``, the default), or None (plain TCP)."""
    if cert_file is not None:
        return load_identity(cert_file, key_file)
    return self_signed() if tls else None
