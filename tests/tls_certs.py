"""Real certificates for the TLS tests, made with `cryptography`: a certificate authority, a
server certificate for 127.0.0.1 and localhost signed by it, and client certificates."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str, organization: str = "maitred tests") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return pair


class Authority:
    """A certificate authority that signs server and client certificates into `directory`."""

    def __init__(self, directory: Path, name: str = "maitred test CA", crl_url: str | None = None) -> None:
        self.directory = directory
        # Where the certificates it issues say its revocation list is (scanners look for one).
        self.crl_url = crl_url
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(name)
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{name.replace(' ', '-')}.crt"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _issue(
        self, subject: x509.Name, usage: x509.ObjectIdentifier, names: list[x509.GeneralName], days: int = 2
    ) -> tuple:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            # What strict validators (sslyze's) require of a certificate an authority issued.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        if self.crl_url is not None:
            point = x509.DistributionPoint([x509.UniformResourceIdentifier(self.crl_url)], None, None, None)
            builder = builder.add_extension(x509.CRLDistributionPoints([point]), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    def server(self, stem: str = "server", common_name: str = "localhost", days: int = 2) -> Pair:
        """A server certificate for localhost and 127.0.0.1, valid for `days`; the file holds it
        and then the CA's certificate, as a chain does."""
        cert, key = self._issue(
            _name(common_name),
            ExtendedKeyUsageOID.SERVER_AUTH,
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))],
            days,
        )
        pair = _write(self.directory, stem, cert, key)
        pair.cert.write_bytes(pair.cert.read_bytes() + self.pem.read_bytes())
        return pair

    def client(self, common_name: str, stem: str | None = None) -> Pair:
        cert, key = self._issue(_name(common_name), ExtendedKeyUsageOID.CLIENT_AUTH, [])
        return _write(self.directory, stem or common_name, cert, key)


def client_context(authority: Authority, client: Pair | None = None) -> ssl.SSLContext:
    """A client's TLS context that trusts `authority` (and presents `client`)."""
    context = ssl.create_default_context(cafile=str(authority.pem))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def serial_of(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def peer_serial(sock: ssl.SSLSocket) -> int:
    """The serial number of the certificate the server presented."""
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def spki_sha256(pair: Pair) -> str:
    """The base64 SHA-256 of the server certificate's public key (its SubjectPublicKeyInfo), as
    chromium's --ignore-certificate-errors-spki-list names a certificate to trust."""
    leaf = x509.load_pem_x509_certificates(pair.cert.read_bytes())[0]
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode("ascii")
