"""Issuing a private CA and TLS serving certificates as PEM bytes; files are written elsewhere.

Choices, deliberately:
- ECDSA P-256 for both keys: small, fast handshakes, accepted by Go's TLS stack (kube-apiserver) and
  by every OpenSSL the webhook runs on. No RSA option is offered because nothing here needs one.
- The CA lives 10 years and the serving certificate 1 year (the cert-controller / Kubewarden model):
  the caBundle in the webhook configurations rarely changes, the serving key is rotated often by
  issuing a new leaf from the kept CA key.
- Every host becomes a SAN (IP address or DNS name); the common name is informational only.
- Certificates start 5 minutes in the past so a slightly slow clock on a peer does not reject them.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import re

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=3650)
SERVING_VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(minutes=5)
CA_COMMON_NAME = "gpu-admission CA"

# RFC 1123 labels; a leading "*." wildcard is allowed for the whole name.
_DNS_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_MAX_COMMON_NAME = 64  # X.520 ub-common-name


class InvalidHost(ValueError):
    """A host given for a SAN is neither an IP address nor a valid DNS name."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyPair:
    """A certificate with its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bundle:
    """Everything a webhook deployment needs: the CA (for caBundle and rotation) and the serving pair."""

    ca: KeyPair
    serving: KeyPair


def subject_alternative_names(hosts: list[str] | tuple[str, ...]) -> list[x509.GeneralName]:
    """Turn host strings into SAN entries: IP literals as IPAddress, everything else as DNSName."""
    if not hosts:
        raise InvalidHost("at least one host is needed")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        names.append(x509.DNSName(_checked_dns_name(host)))
    return names


def issue_ca(*, now: datetime.datetime, common_name: str = CA_COMMON_NAME, validity: datetime.timedelta = CA_VALIDITY) -> KeyPair:
    """Create a self-signed CA that may sign serving certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(certificate=certificate, key=key)


def issue_serving(
    ca: KeyPair,
    *,
    hosts: list[str] | tuple[str, ...],
    now: datetime.datetime,
    validity: datetime.timedelta = SERVING_VALIDITY,
) -> KeyPair:
    """Create a TLS server certificate for every host, signed by ``ca`` (never outliving it)."""
    sans = subject_alternative_names(hosts)
    subject_attributes = []
    if len(hosts[0]) <= _MAX_COMMON_NAME:
        subject_attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, hosts[0]))
    return _issue_leaf(
        ca,
        subject=x509.Name(subject_attributes),
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        # An empty subject makes the SAN extension critical (RFC 5280 4.2.1.6).
        sans=x509.SubjectAlternativeName(sans),
        sans_critical=not subject_attributes,
        now=now,
        validity=validity,
    )


def issue_client(ca: KeyPair, *, common_name: str, organizations: tuple[str, ...] = (), now: datetime.datetime) -> KeyPair:
    """Create a TLS client certificate (Kubernetes reads CN as the user, O as the groups)."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return _issue_leaf(
        ca, subject=x509.Name(attributes), usage=ExtendedKeyUsageOID.CLIENT_AUTH, now=now, validity=SERVING_VALIDITY
    )


def _issue_leaf(
    ca: KeyPair,
    *,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    now: datetime.datetime,
    validity: datetime.timedelta,
    sans: x509.SubjectAlternativeName | None = None,
    sans_critical: bool = False,
) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(min(now + validity, ca.certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,  # ECDSA keys sign; they never encipher a key
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=sans_critical)
    return KeyPair(certificate=builder.sign(ca.key, hashes.SHA256()), key=key)


def issue_bundle(*, hosts: list[str] | tuple[str, ...], now: datetime.datetime, ca: KeyPair | None = None) -> Bundle:
    """Issue a serving certificate for ``hosts``, from ``ca`` when given (rotation) or a new CA."""
    authority = ca if ca is not None else issue_ca(now=now)
    return Bundle(ca=authority, serving=issue_serving(authority, hosts=hosts, now=now))


def load_ca(*, certificate_pem: bytes, key_pem: bytes) -> KeyPair:
    """Parse a kept CA (``ca.crt`` + ``ca.key``) so it can sign a new serving certificate."""
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as error:
        raise InvalidCA(f"cannot parse the CA: {error}") from error
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidCA("the CA key is not an ECDSA key")
    public = certificate.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.public_numbers() != key.public_key().public_numbers():
        raise InvalidCA("the CA key does not match the CA certificate")
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound as error:
        raise InvalidCA(f"the CA certificate lacks an extension: {error}") from error
    if not constraints.ca:
        raise InvalidCA("the CA certificate is not a CA (basicConstraints CA:FALSE)")
    return KeyPair(certificate=certificate, key=key)


class InvalidCA(ValueError):
    """A kept CA cannot be used: unparsable, mismatched key, or not a CA."""


def _checked_dns_name(host: str) -> str:
    name = host.lower().rstrip(".")
    labels = name.split(".")
    if labels and labels[0] == "*":
        labels = labels[1:]
    if not name or len(name) > 253 or not labels or not all(_DNS_LABEL.match(label) for label in labels):
        raise InvalidHost(f"not an IP address or DNS name: {host!r}")
    return name
