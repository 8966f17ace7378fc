"""Certificates and keys for one test control plane (a fresh CA per cluster)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=7)


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the PEM files of one cluster, all under one directory."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def serving_cert(self, name: str) -> Path:
        return self.directory / f"{name}-serving.crt"

    def serving_key(self, name: str) -> Path:
        return self.directory / f"{name}-serving.key"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"


# Client identities: file stem -> (common name, organisations).
CLIENTS = {
    "admin": ("vpc-attach-e2e-admin", ["system:masters"]),
    "controller-manager": ("system:kube-controller-manager", []),
}


def create_pki(directory: Path) -> Pki:
    """Write a CA, the API server's serving cert, client certs and the SA signing key."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pki = Pki(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vpc-attach-e2e-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    serving_names = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
    ]
    _issue(
        pki.apiserver_cert,
        pki.apiserver_key,
        "kube-apiserver",
        [],
        ca_cert,
        ca_key,
        ExtendedKeyUsageOID.SERVER_AUTH,
        serving_names,
    )
    _issue(
        pki.serving_cert("controller-manager"),
        pki.serving_key("controller-manager"),
        "kube-controller-manager",
        [],
        ca_cert,
        ca_key,
        ExtendedKeyUsageOID.SERVER_AUTH,
        serving_names[:1] + serving_names[-1:],
    )
    for stem, (common_name, organisations) in CLIENTS.items():
        _issue(
            pki.client_cert(stem),
            pki.client_key(stem),
            common_name,
            organisations,
            ca_cert,
            ca_key,
            ExtendedKeyUsageOID.CLIENT_AUTH,
            [],
        )

    # kube-apiserver verifies and kube-controller-manager signs SA tokens with an RSA key.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue_serving_cert(pki: Pki, name: str) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 and localhost, signed by the cluster's CA (e.g. for
    a test's own HTTPS endpoint that clients of the cluster must trust); (cert, key) paths."""
    ca_cert, ca_key = _load_ca(pki)
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
    cert_path, key_path = pki.serving_cert(name), pki.serving_key(name)
    _issue(cert_path, key_path, name, [], ca_cert, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, names)
    return cert_path, key_path


def issue_client_cert(pki: Pki, stem: str, common_name: str, organisations: list[str]) -> None:
    """A client certificate signed by the cluster's CA, written as ``pki.client_cert(stem)``
    and ``pki.client_key(stem)`` (e.g. a kubelet's ``system:node:NAME`` in ``system:nodes``)."""
    ca_cert, ca_key = _load_ca(pki)
    _issue(pki.client_cert(stem), pki.client_key(stem), common_name, organisations, ca_cert,
           ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, [])


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key}: expected the EC key create_pki writes")
    return ca_cert, ca_key


def _issue(
    cert_path: Path,
    key_path: Path,
    common_name: str,
    organisations: list[str],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    subject_alt_names: list[x509.GeneralName],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organisations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if subject_alt_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(subject_alt_names), critical=False
        )
    _write_key(key_path, key)
    _write_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + VALIDITY)
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.touch(mode=0o600)
    path.write_bytes(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
