"""When the webhook's CA and serving certificate are renewed, and which CAs its caBundle trusts (pure).

The stored material (a Secret or four files) is `Material`: the trusted CAs (``ca.crt``, a PEM bundle,
the signing CA first), the signing CA's key (``ca.key``) and the serving pair (``tls.crt``/``tls.key``).
`reconcile` looks at it and returns the material as it should be, with the reasons. The rules (the
Kubewarden / cert-controller model; defaults in `Policy`):

- nothing usable stored: a new CA and a serving certificate from it;
- the serving certificate is renewed ``serving_renew_before`` ahead of its expiry (default 60 days of
  a 1-year certificate), or at once when it is missing, expired, does not match its key, does not
  cover the hosts, or was signed by no CA we trust;
- the CA is renewed ``ca_renew_before`` ahead of its expiry (default 1 year of 10). A CA rotation has
  two steps so that no client ever sees a certificate it does not trust yet: first the new CA joins
  the bundle beside the old one (the caller injects the bundle into the webhook configurations)
  while the old serving certificate stays; then, once every client bundle holds the new CA and
  ``ca_propagation`` has passed since it was issued, the serving certificate is re-issued from it;
- a CA leaves the bundle only once it has expired (so a replica still serving the old certificate
  stays trusted until that certificate could not be valid anyway).

Nothing here reads a clock or a file: the caller passes ``now`` and the client bundles.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from cryptography import exceptions, x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs import authority

SERVING_RENEW_BEFORE = datetime.timedelta(days=60)
CA_RENEW_BEFORE = datetime.timedelta(days=365)
# How long a new CA sits in the bundle before a serving certificate signed by it is served: every
# kube-apiserver must have re-read the webhook configurations (their informers take well under a
# second; a minute covers a slow or restarting apiserver).
CA_PROPAGATION = datetime.timedelta(seconds=60)

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
KEYS = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)


class InvalidPolicy(ValueError):
    """Validity and renewal periods that cannot work together; the message names them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """How long certificates live and how early they are renewed."""

    serving_validity: datetime.timedelta = authority.SERVING_VALIDITY
    serving_renew_before: datetime.timedelta = SERVING_RENEW_BEFORE
    ca_validity: datetime.timedelta = authority.CA_VALIDITY
    ca_renew_before: datetime.timedelta = CA_RENEW_BEFORE
    ca_propagation: datetime.timedelta = CA_PROPAGATION

    def __post_init__(self) -> None:
        zero = datetime.timedelta(0)
        if self.serving_validity <= zero or self.ca_validity <= zero:
            raise InvalidPolicy("certificate validity must be positive")
        if not zero <= self.serving_renew_before < self.serving_validity:
            raise InvalidPolicy("renew-before must be shorter than the serving certificate's validity")
        if not zero <= self.ca_renew_before < self.ca_validity:
            raise InvalidPolicy("the CA's renew-before must be shorter than its validity")
        if self.ca_propagation < zero:
            raise InvalidPolicy("the CA propagation delay must not be negative")
        # A serving certificate never outlives its CA; were the CA renewed later than this, a fresh
        # serving certificate would already be due when issued, and be re-issued on every pass.
        if self.ca_renew_before < self.serving_renew_before + self.ca_propagation:
            raise InvalidPolicy("the CA's renew-before must exceed the serving renew-before plus the CA propagation delay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Material:
    """What is stored, parsed; unusable parts are None and explained in ``problems``."""

    trusted: tuple[x509.Certificate, ...] = ()
    ca: authority.KeyPair | None = None
    serving: authority.KeyPair | None = None
    problems: tuple[str, ...] = ()

    def bundle_pem(self) -> bytes:
        """``ca.crt``: every trusted CA, the signing one first (what goes into caBundle)."""
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.trusted)

    def files(self) -> dict[str, bytes]:
        """The four stored entries; only for complete material."""
        if self.ca is None or self.serving is None:
            raise ValueError("incomplete material has no files")
        return {
            CA_CERT: self.bundle_pem(),
            CA_KEY: self.ca.key_pem,
            TLS_CERT: self.serving.certificate_pem,
            TLS_KEY: self.serving.key_pem,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The material as it should be, why it changed, and what (if anything) is waiting."""

    material: Material
    reasons: tuple[str, ...] = ()
    waiting: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.reasons)


def parse(entries: dict[str, bytes]) -> Material:
    """Read stored entries (missing keys are fine); never raises for bad content."""
    problems: list[str] = []
    trusted: tuple[x509.Certificate, ...] = ()
    if entries.get(CA_CERT):
        try:
            trusted = tuple(x509.load_pem_x509_certificates(entries[CA_CERT]))
        except ValueError as error:
            problems.append(f"{CA_CERT}: not a PEM certificate bundle ({_first_line(error)})")
    ca: authority.KeyPair | None = None
    if entries.get(CA_KEY) and trusted:
        ca, problem = _signing_ca(trusted, entries[CA_KEY])
        if problem:
            problems.append(problem)
    serving: authority.KeyPair | None = None
    if entries.get(TLS_CERT) and entries.get(TLS_KEY):
        serving, problem = _pair(entries[TLS_CERT], entries[TLS_KEY])
        if problem:
            problems.append(problem)
    if ca is not None:  # the signing CA first, so `ca.crt`'s first certificate is the current one
        trusted = (ca.certificate, *(c for c in trusted if c != ca.certificate))
    return Material(trusted=trusted, ca=ca, serving=serving, problems=tuple(problems))


def parse_bundle(pem: bytes) -> tuple[x509.Certificate, ...]:
    """The certificates of a caBundle (empty for an empty or unparsable one)."""
    if not pem.strip():
        return ()
    try:
        return tuple(x509.load_pem_x509_certificates(pem))
    except ValueError:
        return ()


def renew_at(certificate: x509.Certificate, *, renew_before: datetime.timedelta) -> datetime.datetime:
    """When ``certificate`` is due for renewal."""
    return certificate.not_valid_after_utc - renew_before


def expired(certificate: x509.Certificate, *, now: datetime.datetime) -> bool:
    return not certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc


def issued_at(certificate: x509.Certificate) -> datetime.datetime:
    """When a certificate of ours was issued (they start `authority.CLOCK_SKEW` in the past)."""
    return certificate.not_valid_before_utc + authority.CLOCK_SKEW


def signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether ``ca`` issued ``certificate`` (names and signature)."""
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, exceptions.InvalidSignature):
        return False
    return True


def covers(certificate: x509.Certificate, hosts: Sequence[str]) -> bool:
    """Whether every host is among the certificate's SANs."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(authority.subject_alternative_names(tuple(hosts))) <= set(names)


def sans(certificate: x509.Certificate) -> tuple[str, ...]:
    """The SANs of a certificate as host strings (DNS names and IP addresses)."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return (*names.get_values_for_type(x509.DNSName), *(str(ip) for ip in names.get_values_for_type(x509.IPAddress)))


def merge_bundle(
    trusted: Sequence[x509.Certificate], *, current: x509.Certificate, now: datetime.datetime
) -> tuple[x509.Certificate, ...]:
    """``current`` first, then the other CAs that are still valid, each once, in their order."""
    merged = [current]
    seen = {_fingerprint(current)}
    for certificate in trusted:
        fingerprint = _fingerprint(certificate)
        if fingerprint in seen or certificate.not_valid_after_utc <= now:
            continue
        seen.add(fingerprint)
        merged.append(certificate)
    return tuple(merged)


def bundle_trusts(bundle: Sequence[x509.Certificate], ca: x509.Certificate) -> bool:
    return _fingerprint(ca) in {_fingerprint(c) for c in bundle}


def reconcile(
    material: Material,
    *,
    hosts: Sequence[str],
    now: datetime.datetime,
    policy: Policy = Policy(),
    client_bundles: Sequence[bytes] | None = (),
    rotate_ca: bool = False,
    rotate_serving: bool = False,
) -> Plan:
    """The material as it should be at ``now`` for ``hosts``.

    ``client_bundles`` are the caBundles the clients use now (one per webhook entry; empty when there
    are none to keep in step). ``None`` means they cannot be known (files without a cluster): a
    serving certificate from a new CA is then issued only when asked (``rotate_serving``).
    ``rotate_ca``/``rotate_serving`` force the first step of a CA rotation / a new serving pair.
    """
    reasons: list[str] = [f"replaced: {problem}" for problem in material.problems]
    ca = material.ca
    new_ca = False
    if ca is None:
        reasons.append("no CA stored: issued a new CA")
        new_ca = True
    elif expired(ca.certificate, now=now):
        reasons.append("the CA has expired: issued a new CA")
        new_ca = True
    elif rotate_ca:
        reasons.append("CA rotation requested: issued a new CA, the old one stays trusted")
        new_ca = True
    elif now >= renew_at(ca.certificate, renew_before=policy.ca_renew_before):
        reasons.append(f"the CA expires {_when(ca.certificate)}: issued a new CA, the old one stays trusted")
        new_ca = True
    if new_ca:
        ca = authority.issue_ca(
            now=now, validity=policy.ca_validity, common_name=f"{authority.CA_COMMON_NAME} {now:%Y-%m-%dT%H:%M:%SZ}"
        )
    assert ca is not None  # for mypy: set above in every branch
    trusted = merge_bundle(material.trusted, current=ca.certificate, now=now)
    if trusted != material.trusted and not new_ca and not material.problems:
        reasons.append("dropped expired CAs from the bundle")

    serving, waiting, why = _serving(
        material.serving,
        ca=ca,
        trusted=trusted,
        hosts=hosts,
        now=now,
        policy=policy,
        client_bundles=client_bundles,
        rotate_serving=rotate_serving,
    )
    if why:
        reasons.append(why)
    return Plan(material=Material(trusted=trusted, ca=ca, serving=serving), reasons=tuple(reasons), waiting=waiting)


def _serving(
    current: authority.KeyPair | None,
    *,
    ca: authority.KeyPair,
    trusted: tuple[x509.Certificate, ...],
    hosts: Sequence[str],
    now: datetime.datetime,
    policy: Policy,
    client_bundles: Sequence[bytes] | None,
    rotate_serving: bool,
) -> tuple[authority.KeyPair, str, str]:
    """The serving pair to store, what waits, and why a new one was issued ("" when kept)."""

    def issue(why: str) -> tuple[authority.KeyPair, str, str]:
        pair = authority.issue_serving(ca, hosts=tuple(hosts), now=now, validity=policy.serving_validity)
        return pair, "", why

    if current is None:
        return issue("no serving certificate stored: issued one")
    certificate = current.certificate
    if expired(certificate, now=now):
        return issue("the serving certificate has expired: issued a new one")
    if not any(signed_by(certificate, c) for c in trusted):
        return issue("the serving certificate is signed by no trusted CA: issued a new one")
    if not covers(certificate, hosts):
        return issue("the serving certificate does not cover every host: issued a new one")
    from_current = signed_by(certificate, ca.certificate)
    due = now >= renew_at(certificate, renew_before=policy.serving_renew_before)
    if from_current:
        if rotate_serving:
            return issue("serving certificate rotation requested: issued a new one")
        if due:
            return issue(f"the serving certificate expires {_when(certificate)}: issued a new one")
        return current, "", ""
    # Signed by an older CA that is still trusted: move to the current CA once clients trust it.
    if client_bundles is None:
        if rotate_serving:
            return issue("serving certificate rotation requested: issued a new one from the current CA")
        return current, "the serving certificate is from the previous CA: rotate it once every client trusts the new bundle", ""
    untrusting = sum(1 for pem in client_bundles if not bundle_trusts(parse_bundle(pem), ca.certificate))
    if untrusting:
        return current, f"{untrusting} webhook caBundle(s) do not trust the new CA yet: the serving certificate waits", ""
    ready_at = issued_at(ca.certificate) + policy.ca_propagation
    if now < ready_at:
        return current, f"the new CA propagates until {ready_at:%Y-%m-%dT%H:%M:%SZ}: the serving certificate waits", ""
    return issue("every client trusts the new CA: issued the serving certificate from it")


def _signing_ca(trusted: Sequence[x509.Certificate], key_pem: bytes) -> tuple[authority.KeyPair | None, str]:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        return None, f"{CA_KEY}: not a PEM private key ({_first_line(error)})"
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None, f"{CA_KEY}: not an ECDSA key"
    numbers = key.public_key().public_numbers()
    for certificate in trusted:
        public = certificate.public_key()
        if isinstance(public, ec.EllipticCurvePublicKey) and public.public_numbers() == numbers:
            try:
                return authority.load_ca(
                    certificate_pem=certificate.public_bytes(serialization.Encoding.PEM), key_pem=key_pem
                ), ""
            except authority.InvalidCA as error:
                return None, f"{CA_CERT}: {error}"
    return None, f"{CA_KEY} matches no certificate in {CA_CERT}"


def _pair(certificate_pem: bytes, key_pem: bytes) -> tuple[authority.KeyPair | None, str]:
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as error:
        return None, f"{TLS_CERT}: not a PEM certificate ({_first_line(error)})"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as error:
        return None, f"{TLS_KEY}: not a PEM private key ({_first_line(error)})"
    public = certificate.public_key()
    if (
        not isinstance(key, ec.EllipticCurvePrivateKey)
        or not isinstance(public, ec.EllipticCurvePublicKey)
        or public.public_numbers() != key.public_key().public_numbers()
    ):
        return None, f"{TLS_KEY} does not match {TLS_CERT}"
    return authority.KeyPair(certificate=certificate, key=key), ""


def _fingerprint(certificate: x509.Certificate) -> bytes:
    return certificate.fingerprint(hashes.SHA256())


def _when(certificate: x509.Certificate) -> str:
    return f"at {certificate.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
